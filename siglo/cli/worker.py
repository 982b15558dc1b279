"""``siglo worker URL --flows module:attr``: fire durable timers, recover crashed runs."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

import click

from siglo.cli.errors import CliError, cli_settings, display_url, resolve_url
from siglo.config import Settings
from siglo.connect import connect
from siglo.manager import StorageManager
from siglo.workflow.flow import Flow
from siglo.workflow.worker import DEFAULT_INTERVAL_S, Worker

__all__ = ["load_flows", "worker"]


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


async def _work(
    url: str, settings: Settings, flows: list[Flow], batch: int, interval: float, once: bool
) -> None:
    backend = connect(url, settings=settings)
    # The application's settings (its file, its environment, what its module passed to
    # siglo.configure): a worker stores what the application would, redacted the same.
    manager = StorageManager(backend, settings=settings)
    try:
        runner = Worker(manager, flows, batch=batch)
        names = ", ".join(sorted(runner.flows))
        click.echo(f"siglo worker {runner.worker_id} on {display_url(url)}: flows {names}")
        click.echo(
            f"settings from {settings.source}: error mode {manager.error_mode}, "
            f"{len(manager.redact_fields)} redacted field(s)"
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Graceful: the run in progress finishes and is checkpointed, then we exit.
            loop.add_signal_handler(sig, stop.set)
        try:
            while not stop.is_set():
                done = await runner.run_once()
                if done.busy:
                    click.echo(
                        f"fired {done.timers_fired} timer(s), recovered "
                        f"{done.runs_recovered} run(s)"
                    )
                for line in done.failures:
                    click.echo(line, err=True)
                if once:
                    break
                if done.busy:
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        click.echo("siglo worker stopped")
    finally:
        await backend.aclose()


@click.command()
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
    type=click.FloatRange(min=0.01),
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds to wait after a pass that found nothing.",
)
@click.option("--once", is_flag=True, help="One pass, then exit.")
def worker(
    url: str | None, flow_specs: tuple[str, ...], batch: int, interval: float, once: bool
) -> None:
    """Fire due timers and recover crashed runs of the given flows, until SIGTERM.

    Several workers may run side by side: each timer fires once and each run is
    executed by one process at a time. SIGTERM or Ctrl-C stops after the run in
    progress.
    """
    # The flows' modules first: an application that decides its settings in code
    # (siglo.configure at import) has them in effect before the worker reads them.
    flows = load_flows(flow_specs)
    settings = cli_settings()
    target = resolve_url(url)
    asyncio.run(_work(target, settings, flows, batch, interval, once))
