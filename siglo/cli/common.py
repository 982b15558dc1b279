"""What the commands that operate a store share: opening it, and printing results as a
table on a terminal or as JSON for scripts."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, ParamSpec, TypeVar

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from siglo.adapter import Capability
from siglo.backend import Backend
from siglo.cli.errors import CliError, cli_settings, display_url
from siglo.connect import connect

__all__ = [
    "format_ms",
    "interruptible",
    "interrupted",
    "missing_storage",
    "open_store",
    "print_json",
    "print_table",
    "require",
    "require_storage",
    "stoppable",
    "stopped_by_signals",
]


_READS: Final = "this command reads (or deletes) what is stored, and creates nothing"


@asynccontextmanager
async def open_store(url: str, *, existing: bool = False, **options: Any) -> AsyncIterator[Backend]:
    """The backend at ``url`` with the settings every command takes (:func:`cli_settings`:
    timeouts, backend options, the pipeline), closed afterwards.

    ``existing``: the command only reads or deletes, so storage that is not there (an
    SQLite file that does not exist, often a typo in the path) is an error, and nothing
    is created; a backend whose storage is always there (a server) is not asked.
    """
    backend = connect(url, settings=cli_settings(), **options)
    try:
        if existing:
            await require_storage(backend)
        yield backend
    finally:
        await backend.aclose()


async def require_storage(backend: Backend) -> None:
    """Refuse a backend whose storage is not there for a command that reads or deletes,
    and so creates nothing (:func:`missing_storage`)."""
    missing = await missing_storage(backend)
    if missing is not None:
        raise missing


async def missing_storage(backend: Backend, *, doing: str = _READS) -> CliError | None:
    """Why the backend's storage is not there, asked without creating it (``None``: it
    is): an SQLite file that does not exist (often a typo in the path), or a database (a
    PostgreSQL schema) without siglo's tables (a typo in ``schema=``). A backend
    without a schema (Redis) is not asked. ``doing`` says why the command creates
    nothing."""
    adapter = backend.raw_adapter
    storage_exists = getattr(adapter, "storage_exists", None)
    if callable(storage_exists) and not storage_exists():
        return CliError(
            f"there is no database at {display_url(backend.url)}: {doing}",
            "check the path (sqlite:///relative.db, sqlite:////absolute.db); "
            "`siglo migrate URL` creates a database",
        )
    schema_version = getattr(adapter, "schema_version", None)
    if callable(schema_version) and await schema_version() == 0:
        return CliError(
            f"there are no siglo tables at {display_url(backend.url)}: {doing}",
            "check the URL (its database, its schema=); `siglo migrate URL` creates them",
        )
    return None


def require(backend: Backend, *capabilities: Capability) -> None:
    """Refuse, naming the capability, when the backend lacks one."""
    for capability in capabilities:
        if not backend.adapter.supports(capability):
            raise CliError(
                f"backend {backend.name!r} at {display_url(backend.url)} does not support "
                f"{capability.value}",
                "`siglo backends` lists what each backend supports",
            )


def print_json(value: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


_WHOLE = frozenset({"status", "rev", "removed", "kind", "field", "namespace"})


_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``), line breaks and tabs
    kept: a stored id or value printed on a terminal cannot move the cursor, retitle
    the window, recolour or hide what follows."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table (on a terminal rich draws it; piped, it stays plain text). The title and
    the cells are what is stored, as text: never read as rich's markup (an id
    ``[bold]evil[/bold]`` shown as ``evil``, one holding ``[/]`` failing the whole
    listing), their control characters written out (:func:`visible`)."""
    table = Table(title=None if title is None else Text(visible(title)))
    for column in columns:
        # Ids may fold over lines; short values and times never do.
        table.add_column(column, overflow="fold", no_wrap=column in _WHOLE or "UTC" in column)
    for row in rows:
        table.add_row(*(Text("-" if v is None else visible(str(v))) for v in row))
    Console().print(table)


def format_ms(ms: int | None) -> str | None:
    """A millisecond timestamp as UTC ``YYYY-MM-DD HH:MM`` (``None`` stays ``None``);
    ``--json`` output keeps the milliseconds themselves."""
    if ms is None:
        return None
    try:
        moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.strftime("%Y-%m-%d %H:%M")


T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

STOPPED_BY: list[int] = []
"""The signals a :func:`stopped_by_signals` handler (or :func:`stoppable`) stopped the
command with, the last one last."""


def stopped_by_signals(*, as_interrupt: bool = False) -> Callable[[], None]:
    """SIGTERM and SIGHUP (a supervisor's stop, a closed terminal, a cancelled CI job)
    end the command as Ctrl-C does, through its clean-up (an export's temporary file, a
    check's isolated storage): by ``SystemExit(128 + signum)``, or with ``as_interrupt``
    by the very ``KeyboardInterrupt`` Ctrl-C raises — and then Ctrl-C itself is noted
    too — the signal noted in :data:`STOPPED_BY` (code that lets Ctrl-C through then
    lets it through too); returns what puts the handlers back."""

    STOPPED_BY.clear()  # this command's signals, not an earlier one's in this process
    if threading.current_thread() is not threading.main_thread():
        # Signals go to the main thread alone (a command invoked from another, as a
        # test's CliRunner in a thread does): there is nothing to catch.
        return lambda: None

    def stopped(signum: int, _frame: object) -> None:
        STOPPED_BY.append(signum)
        if as_interrupt:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    # With ``as_interrupt``, Ctrl-C too, raising what Python's own handler raises: noted
    # like the others, a Ctrl-C whose interrupt is lost where it lands (raised in a
    # finalizer) still decides the status, where the run went on and exited 0.
    signals = (signal.SIGTERM, signal.SIGHUP, *((signal.SIGINT,) if as_interrupt else ()))
    previous = {sig: signal.signal(sig, stopped) for sig in signals}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


async def stoppable(work: Awaitable[T]) -> T:
    """``work`` as the command's main task, which SIGINT, SIGTERM and SIGHUP cancel where
    it waits: Python's own Ctrl-C is not raised in a process that inherited SIGINT
    ignored (a command started from a background job), and an interrupt raised in a
    finalizer is lost — the erase then slept out its settle and went on. The signal is
    noted in :data:`STOPPED_BY`; the cancellation ends ``asyncio.run`` with
    ``CancelledError`` after the store is closed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop(signum: int) -> None:
        STOPPED_BY.append(signum)
        task.cancel()

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    if threading.current_thread() is not threading.main_thread():
        return await work  # signals reach the main thread alone
    for signum in stops:
        loop.add_signal_handler(signum, stop, signum)
    try:
        return await work
    finally:
        for signum in stops:
            loop.remove_signal_handler(signum)


def interrupted(command: str, hint: str) -> CliError:
    """The error of a command stopped by Ctrl-C, SIGTERM or SIGHUP, exiting with the
    status the signal ends a process with (128 + its number)."""
    signum = STOPPED_BY[-1] if STOPPED_BY else signal.SIGINT
    error = CliError(f"{command} was interrupted ({signal.Signals(signum).name})", hint)
    error.exit_code = 128 + signum
    return error


def interruptible(command: str, hint: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A command that, stopped by Ctrl-C, SIGTERM or SIGHUP, says so — ``command`` was
    interrupted, and ``hint`` — and exits with 128 + the signal's number, as ``export``,
    ``import``, ``rekey`` and ``erase`` do; not click's bare "Aborted!" with status 1,
    nor (SIGTERM, SIGHUP) a silent end."""

    def wrap(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            restore_signals = stopped_by_signals(as_interrupt=True)
            try:
                return function(*args, **kwargs)
            except (KeyboardInterrupt, asyncio.CancelledError):
                raise interrupted(command, hint) from None
            finally:
                restore_signals()

        return run

    return wrap
