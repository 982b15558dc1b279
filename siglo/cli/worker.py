"""``siglo worker URL --flows module:attr``: fire durable timers, recover crashed runs."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterable
from typing import IO, Any, Final

import click

from siglo.backend import Backend
from siglo.cli.common import missing_storage
from siglo.cli.errors import (
    CliError,
    FiniteRange,
    cli_settings,
    debug_enabled,
    display_url,
    resolve_url,
)
from siglo.config import Settings
from siglo.connect import connect
from siglo.manager import StorageManager
from siglo.workflow.flow import Flow
from siglo.workflow.worker import (
    DEFAULT_INTERVAL_S,
    RETRYABLE,
    WORKER_LOG,
    RetryPolicy,
    Worker,
    WorkerPass,
)

__all__ = [
    "EXIT_ERROR",
    "EXIT_GAVE_UP",
    "EXIT_OK",
    "EXIT_USAGE",
    "load_flows",
    "worker",
]


def load_flows(specs: Iterable[str]) -> list[Flow]:
    """The flows named by ``module:attr`` specs (an attribute may hold one flow, or a
    list or tuple of them). The current directory is importable, as for ``python -m``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    flows: list[Flow] = []
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise CliError(f"--flows {spec!r} is not module:attr", "e.g. --flows myapp.jobs:flow")
        try:
            value: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise CliError(f"cannot import {module_name!r}: {exc}", "check PYTHONPATH") from exc
        except Exception as exc:
            # The module itself failed (a SyntaxError, an error at import): the
            # application's, not siglo's — said as such, not as a bug to report.
            raise CliError(
                f"cannot import {module_name!r}: {type(exc).__name__}: {exc}",
                "fix the module (`python -c 'import MODULE'` shows the traceback)",
            ) from exc
        for part in attr.split("."):
            try:
                value = getattr(value, part)
            except AttributeError:
                raise CliError(f"{module_name!r} has no attribute {attr!r}") from None
        found = list(value) if isinstance(value, list | tuple) else [value]
        for item in found:
            if not isinstance(item, Flow):
                raise CliError(f"{spec!r} is {type(item).__name__}, not a siglo.workflow.Flow")
        flows.extend(found)
    if not flows:
        raise CliError("no flows to work on", "pass --flows module:attr")
    return flows


EXIT_OK: Final = 0
"""Stopped cleanly: ``--once`` done, or stopped by SIGTERM / SIGINT."""
EXIT_ERROR: Final = 1
"""Could not start (settings, URL, flows) or failed unexpectedly: nothing to retry."""
EXIT_USAGE: Final = 2
"""Bad command-line options (click's usage error)."""
EXIT_GAVE_UP: Final = 3
"""The storage kept failing for longer than ``--retry-for``."""


async def _work(
    url: str,
    settings: Settings,
    flows: list[Flow],
    batch: int,
    interval: float,
    once: bool,
    retry: RetryPolicy,
) -> None:
    backend = connect(url, settings=settings)
    # The application's settings (its file, its environment, what its module passed to
    # siglo.configure): a worker stores what the application would, redacted the same.
    manager = StorageManager(backend, settings=settings)
    if not debug_enabled() and not logging.getLogger().handlers:
        # What the worker logs (a run's failure, what it waits for) is printed below,
        # once; without a handler, Python's last-resort one would print each again, a
        # failure with its traceback (`siglo --debug worker` keeps them).
        quiet = logging.getLogger(WORKER_LOG)
        quiet.propagate = False
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
    try:
        runner = Worker(manager, flows, batch=batch, notify=lambda line: click.echo(line, err=True))
        # A backend that can do neither job is refused by Worker itself.
        for what in runner.missing():
            click.echo(f"this backend cannot {what}: the worker does not", err=True)
        names = ", ".join(sorted(runner.flows))
        click.echo(f"siglo worker {runner.worker_id} on {display_url(url)}: flows {names}")
        click.echo(
            f"settings from {settings.source}: error mode {manager.error_mode}, "
            f"{len(manager.redact_fields)} redacted field(s)"
        )
        stop = asyncio.Event()
        signalled = False
        main = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_signal(name: str) -> None:
            nonlocal signalled
            if signalled:
                # A second signal: stop now. The run in progress is cut off; it stays
                # `running`, and its lease lapses for a worker to recover it.
                click.echo(f"{name} again: stopping now", err=True)
                if main is not None:
                    main.cancel()
                return
            signalled = True
            stop.set()
            click.echo(
                f"{name}: stopping after the run in progress (again to stop at once)", err=True
            )

        def on_pass(done: WorkerPass) -> None:
            if done.busy:
                click.echo(
                    f"fired {done.timers_fired} timer(s), recovered {done.runs_recovered} run(s)"
                )
            for line in done.failures:
                click.echo(line, err=True)
            if once:
                stop.set()  # one successful pass (retried as the loop retries)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            if not await _storage_found(backend, interval, once, stop):
                click.echo("siglo worker stopped")
                return
            await runner.run(interval_s=interval, stop=stop, retry=retry, on_pass=on_pass)
        except asyncio.CancelledError:
            click.echo("siglo worker stopped (the run in progress is left for recovery)")
            return
        except RETRYABLE as exc:
            raise _GaveUp(exc, retry) from exc
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        click.echo("siglo worker stopped")
    finally:
        await backend.aclose()


_CREATES_NOTHING: Final = (
    "a worker creates nothing (the application's first write, or `siglo migrate`, does)"
)


async def _storage_found(
    backend: Backend, interval: float, once: bool, stop: asyncio.Event
) -> bool:
    """Wait, ``interval`` seconds between looks, until the backend's storage is there —
    an SQLite file, a PostgreSQL schema with siglo's tables — without creating it: a
    worker started before the application's first write waits for it, and one given a
    mistyped path says so and waits instead of creating an empty store of its own.
    ``False``: stopped by a signal first. With ``once``, storage that is not there is an
    error (exit status 1). A storage failure meanwhile is left to the worker's own
    retries (``True``)."""
    try:
        missing = await missing_storage(backend, doing=_CREATES_NOTHING)
    except RETRYABLE:
        return True
    if missing is None:
        return True
    if once:
        raise missing
    click.echo(f"waiting: {missing.format_message()}; hint: {missing.hint}", err=True)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            break
        try:
            if await missing_storage(backend, doing=_CREATES_NOTHING) is None:
                click.echo(f"found the storage at {display_url(backend.url)}", err=True)
                return True
        except RETRYABLE:
            return True
    return False


class _GaveUp(click.ClickException):
    """The storage failed for longer than ``--retry-for``: exit status 3."""

    exit_code = EXIT_GAVE_UP

    def __init__(self, exc: BaseException, retry: RetryPolicy) -> None:
        bound = retry.give_up_after_s
        super().__init__(
            f"gave up: the storage kept failing (retries bounded by --retry-for {bound:g} s): "
            f"{type(exc).__name__}: {exc}".replace("\n", " ")
        )

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"Error: {self.format_message()}", file=file, err=True)
        click.echo(
            "Hint: check that the backend is reachable; a supervisor (systemd, Kubernetes) "
            "restarts the worker, or raise --retry-for",
            file=file,
            err=True,
        )


@click.command(
    epilog="""\b
Exit status:
  0  stopped cleanly (--once done, or SIGTERM / SIGINT)
  1  could not start (settings, URL, flows) or an unexpected failure
  2  bad command-line options
  3  gave up: the storage kept failing for longer than --retry-for
"""
)
@click.argument("url", required=False, default=None)
@click.option(
    "--flows",
    "flow_specs",
    multiple=True,
    required=True,
    metavar="MODULE:ATTR",
    help="A flow (or list of flows) to work for. Repeatable.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1, max=10_000),
    default=100,
    show_default=True,
    help="At most this many timers and runs per pass.",
)
@click.option(
    "--interval",
    type=FiniteRange(min=0.01),
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds to wait after a pass that found nothing.",
)
@click.option(
    "--retry-for",
    type=FiniteRange(min=0),
    default=RetryPolicy().give_up_after_s,
    show_default=True,
    metavar="SECONDS",
    help="While the storage fails (unreachable, timed out, outcome unknown), retry with "
    "backoff (0.5 s doubling to 30 s, with jitter) for this long, then exit with status 3. "
    "0: no retry.",
)
@click.option(
    "--once",
    is_flag=True,
    help="One pass, then exit (retried like the loop while the storage fails).",
)
def worker(
    url: str | None,
    flow_specs: tuple[str, ...],
    batch: int,
    interval: float,
    retry_for: float,
    once: bool,
) -> None:
    """Fire due timers and recover crashed runs of the given flows, until SIGTERM.

    Several workers may run side by side: each timer fires once and each run is
    executed by one process at a time. SIGTERM or Ctrl-C stops after the run in
    progress: no run starts after the signal; a second signal stops at once (the run
    in progress is then left for another worker to recover). A storage failure does
    not stop the worker: it says what it waits for and retries with backoff for
    --retry-for seconds. Calls are bounded by the settings' command_timeout_ms.
    """
    # The flows' modules first: an application that decides its settings in code
    # (siglo.configure at import) has them in effect before the worker reads them.
    flows = load_flows(flow_specs)
    settings = cli_settings()
    target = resolve_url(url)
    retry = RetryPolicy(give_up_after_s=retry_for)
    asyncio.run(_work(target, settings, flows, batch, interval, once, retry))
