"""How every ``siglo`` command reports a failure: one line ``Error: …``, a hint, exit 1.

Commands raise :class:`CliError` (or let a :class:`~siglo.errors.SigloError` or any other
exception escape); :class:`SigloGroup` turns what escapes into a :class:`CliError`, so no
user ever sees a traceback unless they ask for it with ``siglo --debug``. A new command
needs nothing of its own: register it on the group and raise.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable
from typing import IO, Any, Final, TypeVar

import click

from siglo.config import Settings, current_settings
from siglo.connect import URL_ENV, is_settings_store, options_for
from siglo.errors import (
    BackendNotFoundError,
    CapabilityNotSupportedError,
    DamagedBlobError,
    DanglingReferenceError,
    DocumentTooLargeError,
    DriverNotInstalledError,
    InvalidArgumentError,
    MalformedRecordError,
    SchemaVersionError,
    SigloError,
    StorageAdapterError,
)
from siglo.masking import scrub
from siglo.urls import mask_credentials, picks_store, refuse_fragment

__all__ = [
    "DEBUG_ENV",
    "URL_ENV",
    "cli_settings",
    "CliError",
    "SigloGroup",
    "as_cli_error",
    "display_url",
    "hint_for",
    "left_out",
    "resolve_url",
]

DEBUG_ENV: Final = "SIGLO_DEBUG"
"""Set to ``1`` for tracebacks, like ``siglo --debug``."""

F = TypeVar("F", bound=Callable[..., Any])


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or "failed"


class CliError(click.ClickException):
    """A failure shown as ``Error: <message>`` and, on the next line, ``Hint: <hint>``.

    The message is folded onto one line. ``exit_code`` is 1.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(_one_line(message))
        self.hint = hint

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"Error: {self.format_message()}", file=file, err=True)
        if self.hint:
            click.echo(f"Hint: {self.hint}", file=file, err=True)


class FiniteRange(click.FloatRange):
    """click's ``FloatRange``, refusing ``nan`` and the infinities, which its bounds let
    through (``nan`` compares as in any range): a usage error naming the option."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def hint_for(exc: BaseException) -> str:
    """What to try next for a failure of this kind."""
    if isinstance(exc, DriverNotInstalledError):
        return "install the extra named above; `siglo backends` shows every driver's status"
    if isinstance(exc, BackendNotFoundError):
        return "`siglo backends` lists the installed backends and their URL schemes"
    if isinstance(exc, SchemaVersionError):
        if exc.newer:
            return "a newer siglo wrote this database: upgrade siglo (`pip install -U`) to use it"
        return "`siglo migrate URL --status` shows the schema version; `siglo migrate URL` upgrades"
    if isinstance(exc, DocumentTooLargeError):
        return (
            "offload large values (offload_min_bytes and blob_url) or raise "
            "max_document_bytes: docs/large-state.md"
        )
    if isinstance(exc, StorageAdapterError):
        return (
            "check that the backend is reachable: the server running, the URL's host, "
            "port and database (or file path) right"
        )
    if isinstance(exc, CapabilityNotSupportedError):
        return "`siglo backends` lists what each backend supports"
    if isinstance(exc, DamagedBlobError):
        return (
            "the blob's bytes were changed in the blob store (altered, truncated or "
            "replaced): restore it from a backup of the blob store"
        )
    if isinstance(exc, DanglingReferenceError):
        return (
            "run it with the blob store the application offloads to (blob_url); if that "
            "is the one, the value is gone from it (a restore, a collector run elsewhere)"
        )
    # A stored record named by siglo.errors.naming_stack / naming_wait: what removes it.
    stack_id = getattr(exc, "stack_id", None)
    what = "wait record" if getattr(exc, "correlation_key", None) else "stack"
    if isinstance(exc, MalformedRecordError) and stack_id is not None:
        namespace = getattr(exc, "namespace", None)
        option = f" --namespace {namespace}" if namespace is not None else ""
        return (
            f"siglo cannot read that {what} as stored; `siglo rm URL {stack_id}{option}` "
            "removes the stack (its checkpoint, wait records and context streams), and "
            "nothing else"
        )
    if isinstance(exc, MalformedRecordError) and what == "wait record":
        return (
            "siglo cannot read that wait record as stored; `siglo rm URL STACK_ID` of its "
            "run removes it with the run, or remove the record from the store by hand"
        )
    if isinstance(exc, InvalidArgumentError) and "blob_url and offload_min_bytes" in str(exc):
        # A reference to an offloaded value, met by a command without the blob store.
        return "run it with the application's blob store settings (blob_url, offload_min_bytes)"
    if isinstance(exc, InvalidArgumentError) and "pip install 'siglo[" in str(exc):
        # Settings that need an extra not installed (encryption, compression, S3).
        return "install the extra named above, or take the setting that needs it out"
    if isinstance(exc, InvalidArgumentError | MalformedRecordError):
        if "url" in str(exc).lower() or "://" in str(exc):
            return "fix the value named above (URL forms: see `siglo backends` and docs/backends/)"
        return "fix the value named above"
    if isinstance(exc, SigloError):
        return "see the siglo documentation for this error"
    return f"rerun with `siglo --debug` (or {DEBUG_ENV}=1) for the traceback, and report it"


def left_out(found: list[Exception]) -> None:
    """After a listing's output: each record it left out because it cannot be read
    (:mod:`siglo.unreadable`), named on standard error with its hint, and exit status 1
    — the output holds every other record, as ``ls`` of a missing file lists the rest."""
    if not found:
        return
    for exc in found:
        click.echo(f"Left out: {type(exc).__name__}: {_one_line(str(exc))}", err=True)
        click.echo(f"Hint: {hint_for(exc)}", err=True)
    raise click.exceptions.Exit(1)


def as_cli_error(exc: BaseException) -> CliError:
    """``exc`` as the one-line error users see."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, SigloError):
        return CliError(str(exc), hint_for(exc))
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return CliError(f"{exc.strerror}{where}", "check the path and its permissions")
    detail = str(exc) or "(no message)"
    return CliError(f"unexpected {type(exc).__name__}: {detail}", hint_for(exc))


def debug_enabled(ctx: click.Context | None = None) -> bool:
    """Whether ``--debug`` was given (on the root command) or ``SIGLO_DEBUG`` is set."""
    if os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes"}:
        return True
    ctx = ctx or click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return bool(root is not None and root.meta.get("siglo.debug"))


class SigloGroup(click.Group):
    """The ``siglo`` group: any exception a command lets escape becomes a :class:`CliError`.

    Every argument that holds a URL has its secrets remembered before click parses it
    (:func:`siglo.urls.mask_credentials`), and click's own errors are scrubbed of them: a
    usage error quotes the arguments it refuses (``siglo config URL``: "Got unexpected
    extra argument (…)"), and must say ``***`` where the URL has a password.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            if "://" in arg:
                mask_credentials(arg)  # remembers its password and secret options
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:
            _scrub_click_error(exc)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):
            raise
        except click.ClickException as exc:
            _scrub_click_error(exc)
            if debug_enabled(ctx) and exc.__cause__ is not None:
                # An error line made of another failure (a driver's, a file's): with
                # --debug, that failure's traceback too, its secrets masked.
                click.echo(scrub("".join(traceback.format_exception(exc.__cause__))), err=True)
            raise
        except KeyboardInterrupt:
            raise click.Abort() from None
        except BrokenPipeError:
            # The reader of the output went away (`siglo ls | head`): click exits
            # quietly, as a command in a pipe does, not with an error about a path.
            raise
        except Exception as exc:
            if debug_enabled(ctx):
                raise
            raise as_cli_error(exc) from exc


def _scrub_click_error(exc: click.ClickException) -> None:
    """Mask the remembered secrets in what click prints of ``exc`` (its message; a bad
    parameter's hint names the parameter, not its value)."""
    exc.message = scrub(exc.message)


def cli_settings() -> Settings:
    """The settings every command takes: the process's (``--config`` / ``$SIGLO_CONFIG``,
    else the nearest ``siglo.toml`` or ``[tool.siglo]``, then ``SIGLO_*`` variables, or
    what the application's code passed to :func:`siglo.configure`). A bad settings file
    or variable is one ``Error:`` line."""
    try:
        return current_settings()
    except InvalidArgumentError as exc:
        raise CliError(str(exc), "fix the setting, or see `siglo config --help`") from exc


def settings_store(url: str, settings: Settings) -> bool:
    """Whether a command's connection to ``url`` (:func:`siglo.connect` with the
    settings, no options of the command's own) opens the store the settings name: the
    one their blob store goes with (:func:`siglo.connect.is_settings_store`)."""
    return is_settings_store(url, options_for(url, settings, {})[0], settings)


def store_options_named(settings: Settings) -> str:
    """The settings' options that pick their store on their URL, as a message names
    them (`` with the table_prefix of its [options]``), or nothing."""
    picked = sorted(k for k in settings.options if picks_store(k))
    return f" with the {', '.join(picked)} of its [options]" if picked else ""


def resolve_url(url: str | None, *, default: str | Callable[[], str] | None = None) -> str:
    """The backend URL a command works on: ``url`` if given, else the settings' (``url`` in
    the settings file, ``$SIGLO_URL``), else ``default`` (a callable is asked only then).
    An empty or malformed URL is an error, never a silent fallback."""
    if url is None:
        configured = cli_settings().url
        if configured is not None:
            url, source = configured, f"URL of the settings ({cli_settings().source})"
        elif default is not None:
            return default() if callable(default) else default
        else:
            raise CliError(
                "no backend URL given",
                f"pass one (e.g. sqlite:///siglo.db), set {URL_ENV}, or set url in siglo.toml",
            )
    else:
        source = "URL"
        # Refused before the notes below print the URL (what follows a `#` may be the
        # rest of a password), as connecting would refuse it.
        refuse_fragment(url)
        settings = cli_settings()
        offloads = settings.blob_url is not None and settings.offload_min_bytes is not None
        if offloads and settings.url is not None and not settings_store(url, settings):
            # siglo.connect gives the settings' blob store to their own store only: the
            # collector of that store walks that store alone.
            click.echo(
                f"note: the blob store of {settings.source} (blob_url) goes with its store "
                f"(url {mask_credentials(settings.url)}{store_options_named(settings)}), "
                f"not with {mask_credentials(url.strip())}: "
                "values are stored there inline (give that backend a blob store of its own "
                "in its own settings to offload them)",
                err=True,
            )
        if settings.options and settings.url is not None and url.strip() != settings.url:
            # siglo.connect gives the settings' [options] to their own URL only: say so
            # rather than let `schema=`/`prefix=` silently not apply.
            shown = ", ".join(f"{name}=…" for name in sorted(settings.options))
            click.echo(
                f"note: the options of {settings.source} ({shown}) go with its url "
                f"{mask_credentials(settings.url)}, not with {mask_credentials(url.strip())}: "
                "pass them in this URL's query if they apply to it",
                err=True,
            )
    if not url.strip():
        raise CliError(
            f"the {source} is empty",
            "pass a backend URL such as sqlite:///siglo.db or redis://localhost:6379/0",
        )
    if "://" not in url:
        raise CliError(
            f"{mask_credentials(url)!r} is not a backend URL (expected scheme://…)",
            "for example sqlite:///siglo.db, redis://localhost:6379/0, postgresql://host/db",
        )
    return url.strip()


def display_url(url: str) -> str:
    """``url`` as siglo prints it: any password masked."""
    return mask_credentials(url)
