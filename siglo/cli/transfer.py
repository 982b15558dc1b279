"""``siglo export URL > dump.jsonl`` and ``siglo import URL < dump.jsonl`` (see
:mod:`siglo.transfer`): move a store to any other backend, revisions preserved."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from siglo.adapter import Capability
from siglo.cli.common import (
    STOPPED_BY,
    interrupted,
    open_store,
    print_json,
    require,
    stoppable,
    stopped_by_signals,
)
from siglo.cli.errors import CliError, cli_settings, display_url, resolve_url
from siglo.offload import resolving
from siglo.pipeline import PipelineAdapter
from siglo.sentinel import MISSING
from siglo.transfer import DumpError, ImportReport, export_lines, import_lines

__all__ = ["export", "import_"]


def _progress() -> Progress:
    # On stderr, and only on a terminal: stdout carries the dump.
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),
    )


@click.command()
@click.argument("url", required=False, default=None)
@click.option("--namespace", "-n", default=None, help="Only this namespace (default: all).")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    default="-",
    help="Write here instead of stdout (a file is replaced only once the dump is complete).",
)
@click.option(
    "--decrypt",
    is_flag=True,
    help="Write payloads decrypted (default: as stored, encrypted when encryption is on).",
)
def export(url: str | None, namespace: str | None, output: Path, decrypt: bool) -> None:
    """Write every live checkpoint (and the waits of waiting runs) as JSON Lines.

    A header comes first and a trailer last, with the counts and SHA-256 of what came
    before it: `siglo import` refuses a dump whose trailer is missing (this export
    failed or was cut) or does not match. Payloads are written as stored (encrypted
    when encryption is on) unless --decrypt.
    """

    async def run(output: IO[bytes]) -> int:
        count = 0
        with _progress() as progress:
            task = progress.add_task("exporting", total=None)
            async with open_store(resolve_url(url), existing=True) as backend:
                require(backend, Capability.LISTING)
                if decrypt and not cli_settings().encrypts:
                    raise CliError(
                        "--decrypt needs the keys: no encryption_keys or master_key is set",
                        "docs/encryption.md says where keys come from",
                    )
                # A safe backup by default: the documents as stored (sealed when
                # encryption is on), offloaded values inline; decrypted only when asked.
                source = backend.adapter if decrypt else resolving(backend.adapter)
                # Under require_encryption, a dump "as stored" is taken for a protected
                # backup: each record is read through the codecs first, as every other
                # path reads it, and one stored in clear stops the export, naming it.
                codecs = None
                piped = backend.adapter
                if not decrypt and cli_settings().require_encryption:
                    assert isinstance(piped, PipelineAdapter)  # keys are set: a pipeline
                    codecs = piped.codecs
                lines = export_lines(
                    source,
                    namespace=MISSING if namespace is None else namespace,
                    codecs=codecs,
                    redact_fields=cli_settings().redact_fields,
                )
                async for line in lines:
                    output.write(line + b"\n")
                    if line.startswith(b'{"kind":"checkpoint"'):
                        count += 1
                        progress.update(task, description=f"exported {count} checkpoints")
        output.flush()
        return count

    def write(file: IO[bytes]) -> int:
        return asyncio.run(stoppable(run(file)))

    # Ctrl-C, SIGTERM and SIGHUP are said, with the exit status the signal gives (as
    # rekey and erase say theirs): SIGTERM ended it silently, Ctrl-C with a bare
    # "Aborted!" and status 1 (a black-box auditor).
    restore_signals = stopped_by_signals(as_interrupt=True)
    try:
        if str(output) == "-":
            count = write(sys.stdout.buffer)
        elif (fd := _descriptor(output)) is not None:
            # A descriptor the shell gave (/dev/stdout, /dev/fd/N): written through it, as
            # it was opened (appending, say), whatever it is redirected to — never reopened.
            with os.fdopen(os.dup(fd), "wb") as given:
                count = write(given)
        elif output.exists() and not output.is_file():
            # /dev/null, a named pipe, a device: written as it is.
            with _opened(output) as opened:
                count = write(opened)
        else:
            target = Path(os.path.realpath(output))
            # Through a symlink, to the file it names: a link is not replaced by a file.
            count = _replacing(target, write)
    except (KeyboardInterrupt, asyncio.CancelledError, SystemExit) as exc:
        if isinstance(exc, SystemExit) and not (STOPPED_BY and exc.code == 128 + STOPPED_BY[-1]):
            raise  # not a stop by a signal
        # (A stop while the file beside the target is made or renamed, outside the
        # export's loop, is _replacing's SystemExit: said alike.)
        replaced = (
            str(output) != "-"
            and _descriptor(output) is None
            and not (output.exists() and not output.is_file())
        )
        raise interrupted(
            "siglo export",
            "the file is as it was before: run the export again"
            if replaced
            else "what was written has no trailer, and siglo import refuses it: run the "
            "export again",
        ) from None
    finally:
        restore_signals()
    click.echo(f"exported {count} checkpoint(s)", err=True)


def _descriptor(path: Path) -> int | None:
    """The number of this process's open descriptor that ``path`` names, if it names
    one (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``)."""
    text = os.path.normpath(str(path))
    named = {"/dev/stdout": 1, "/dev/stderr": 2}
    if text in named:
        return named[text]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if text.startswith(prefix) and text[len(prefix) :].isdigit():
            return int(text[len(prefix) :])
    return None


def _opened(path: Path) -> IO[bytes]:
    try:
        return path.open("wb")
    except OSError as exc:
        raise CliError(
            f"cannot write {str(path)!r}: {exc.strerror or exc}",
            "pass --output a path you can write",
        ) from None


def _replacing(path: Path, write: Callable[[IO[bytes]], int]) -> int:
    """``write`` into a temporary file beside ``path``, then rename it over ``path``: a
    failed export (a server gone mid-way, a record stored in clear under
    ``require_encryption``) leaves the file there — last night's backup — as it was.

    SIGTERM and SIGHUP are turned into an exit before the temporary file exists and are
    held while it is made, so a stop at any moment removes it."""
    stop = stopped_by_signals()
    name: str | None = None
    try:
        with _signals_held():
            try:
                fd, name = tempfile.mkstemp(
                    prefix=f".{path.name[:200]}.", suffix=".part", dir=path.parent
                )
            except OSError as exc:
                raise CliError(
                    f"cannot write {str(path)!r}: {exc.strerror or exc} (the dump is written "
                    "beside it, then renamed over it: its directory must be writable)",
                    "pass --output a path in a directory that exists and that you can write",
                ) from None
        _like(fd, path)
        with os.fdopen(fd, "wb") as file:
            count = write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(name, path)
        name = None
        _sync_directory(path.parent)  # the rename itself, made durable
    except BaseException:
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)
        raise
    finally:
        stop()
    return count


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGTERM and SIGHUP meanwhile (where the platform can): one that arrives is
    delivered when the block ends, after the caller knows what it made."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGTERM, signal.SIGHUP}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _sync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # a file system that cannot sync a directory: the rename stands as made
    finally:
        os.close(fd)


def _like(fd: int, path: Path) -> None:
    """Give the temporary file the mode (and, where allowed, the owner) of the file it
    replaces, or a new file's mode under the umask: not ``mkstemp``'s 0600."""
    try:
        existing = path.stat()
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        return
    os.fchmod(fd, existing.st_mode & 0o7777)
    with contextlib.suppress(OSError):
        os.fchown(fd, existing.st_uid, existing.st_gid)


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    yield from source


@click.command(name="import")
@click.argument("url", required=False, default=None)
@click.option(
    "--input",
    "-i",
    "source",
    type=click.File("rb"),
    default="-",
    help="Read here instead of stdin.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was imported as JSON.")
def import_(url: str | None, source: IO[bytes], as_json: bool) -> None:
    """Import a dump of `siglo export`: revisions preserved, never over newer data.

    The whole dump is checked first: one that is cut short (an export that failed),
    altered (counts or SHA-256 do not match its trailer) or malformed is refused, naming
    the line, and nothing is written. An interrupted import is completed by running it
    again: what an earlier run wrote is kept, what it had not reached is written.
    """

    async def run() -> ImportReport:
        with _progress() as progress:
            task = progress.add_task("importing", total=None)

            def advance(report: ImportReport) -> None:
                progress.update(
                    task,
                    description=f"imported {report.imported}, skipped {report.skipped}",
                )

            async with open_store(resolve_url(url)) as backend:
                require(backend, Capability.CHECKPOINTS)
                if not backend.url_shares_storage:
                    # sqlite:// (or sqlite:/// with its path forgotten), memory://: what
                    # the import wrote would go with this command, reported as imported.
                    raise CliError(
                        f"{display_url(backend.url)} is storage private to this command: "
                        "an import there is gone when it ends",
                        "name the file or server to import into (sqlite:///path.db, …)",
                    )
                return await import_lines(backend.adapter, _lines(source), progress=advance)

    restore_signals = stopped_by_signals(as_interrupt=True)
    try:
        report = asyncio.run(stoppable(run()))
    except DumpError as exc:
        raise CliError(str(exc), exc.hint) from exc
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise interrupted(
            "siglo import",
            "run it again to finish: what this run wrote is kept, and the rest is written",
        ) from None
    finally:
        restore_signals()
    summary = report.summary
    if as_json:
        print_json(
            {
                "format": None if summary is None else summary.format,
                "verified": summary is not None and summary.verified,
                "dump": {
                    "checkpoints": None if summary is None else summary.checkpoints,
                    "waits": None if summary is None else summary.waits,
                },
                "imported": report.imported,
                "present": report.present,
                "skipped": report.skipped,
                "waits": report.waits,
                "waitsPresent": report.waits_present,
                "waitsTaken": [
                    {"correlationKey": w.correlation_key, "stackId": w.stack_id}
                    for w in report.waits_taken
                ],
            }
        )
    if summary is not None and not summary.verified:
        click.echo(
            f"warning: a dump of format {summary.format} has no trailer, so a cut one "
            "cannot be told from a whole one; export again with this siglo to have it "
            "checked",
            err=True,
        )
    if not as_json:
        click.echo(
            f"imported {report.imported} checkpoint(s) and {report.waits} wait record(s); "
            f"{report.present} checkpoint(s) and {report.waits_present} wait record(s) "
            "already there from an earlier run; "
            f"skipped {report.skipped} newer in the store"
        )
    for wait in report.waits_taken:
        where = "" if wait.namespace is None else f" (namespace {wait.namespace!r})"
        click.echo(
            f"error: the wait of run {wait.stack_id!r}{where} for {wait.correlation_key!r} "
            "was not imported: another run of the store waits on that key, and would "
            "never resume; the imported run waits for a key it does not hold",
            err=True,
        )
    if report.waits_taken:
        sys.exit(1)
