"""``siglo drill URL``: run the accounting workload of :mod:`siglo.drill` against a
topology of your own while you fail it over, then report what an acknowledgement was
worth (docs/deploying.md, "Drilling your own topology")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import Literal

import click

from siglo.cli.common import open_store, print_json, print_table
from siglo.cli.errors import CliError, FiniteRange, display_url, resolve_url
from siglo.drill import Drill, DrillReport, Expectation, detect_setting

__all__ = ["drill"]

_EXIT_FAILED = 3
"""The exit status of a drill whose verdict is ``fail`` (1 is a command that failed)."""


async def _drill(
    url: str,
    *,
    rate: float,
    duration_s: float | None,
    workers: int,
    expect: Literal["auto", "nothing-lost", "may-lose"],
    quiet: bool,
) -> DrillReport:
    async with open_store(url) as backend:
        setting = await detect_setting(backend)
        expectation: Expectation | None = None if expect == "auto" else expect
        runner = Drill(
            backend,
            rate=rate,
            workers=workers,
            setting=setting,
            expectation=expectation,
            # Said as the verdict's source: the table's promise for the setting is
            # reported beside it, not replaced by it.
            expectation_source="--expect",
            # Claims and nonces must outlive the run and its sweep (a run past an hour
            # sweeps only its last hour), and go soon after.
            window_s=(duration_s or 3600.0) + 300.0,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        handled = []
        # SIGHUP too (a closed terminal, an ssh session dropped): killed by it, the drill
        # left its records behind and printed nothing.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            # Only the main thread takes signals (a drill run from a thread has
            # --duration to stop it).
            with contextlib.suppress(RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
        if not quiet:
            until = f"for {duration_s:g} s" if duration_s else "until Ctrl-C, SIGTERM or SIGHUP"
            click.echo(
                f"siglo drill {runner.id} on {display_url(url)} ({setting}): {rate:g} calls/s "
                f"{until}; fail the primary over now",
                err=True,
            )
        try:
            return await runner.run(stop, duration_s=duration_s)
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)


@click.command()
@click.argument("url", required=False, default=None)
@click.option(
    "--rate",
    type=FiniteRange(min=1, max=10_000),
    default=100.0,
    show_default=True,
    help="Calls per second, all workers together (the sweep and cleanup come on top).",
)
@click.option(
    "--duration",
    "duration_s",
    type=FiniteRange(min=0.5),
    default=None,
    help="Stop after this many seconds (default: run until Ctrl-C, SIGTERM or SIGHUP).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=2, max=256),
    default=8,
    show_default=True,
    help="Concurrent workers (two contend on each lock key).",
)
@click.option(
    "--expect",
    type=click.Choice(["auto", "nothing-lost", "may-lose"]),
    default="auto",
    show_default=True,
    help="What the verdict expects instead of the table's promise for the detected setting "
    "(auto: the table's; the setting is read from the connected client and the server); a "
    "managed service that replicates where the server cannot see it needs it said.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document, for CI.")
def drill(
    url: str | None,
    rate: float,
    duration_s: float | None,
    workers: int,
    expect: Literal["auto", "nothing-lost", "may-lose"],
    as_json: bool,
) -> None:
    """Account for every acknowledged operation through a failover you trigger.

    Start it against your topology (managed Redis, Sentinel, Cluster, Patroni, RDS …),
    fail the primary over by whatever means you have, then stop it (Ctrl-C, SIGTERM,
    SIGHUP or --duration). It saves checkpoints with compare-and-set, takes locks, claims wait
    records, idempotency keys and nonces, then checks each acknowledgement against the
    store and reports calls, failures, time to recover, acknowledged saves lost, double
    lock holders, fencing-token regressions and double claims, each traced to its
    operation, with a verdict against the table of docs/deploying.md.

    Everything it writes is under its own id (siglo-drill-<hex>) and removed afterwards.
    Exit status 3 when something the setting promises to keep was lost.
    """
    target = resolve_url(url)
    if not logging.getLogger().handlers:
        # The drill reports every failed call itself; without this, psycopg's pool
        # would print a warning for each connection it fails to make mid-failover.
        logging.getLogger("psycopg").addHandler(logging.NullHandler())
    report = asyncio.run(
        _drill(
            target,
            rate=rate,
            duration_s=duration_s,
            workers=workers,
            expect=expect,
            quiet=as_json,
        )
    )
    if as_json:
        print_json(report.as_json())
    else:
        print_table("siglo drill", ("", "measured"), report.summary())
        for violation in report.violations[:20]:
            click.echo(
                f"{violation.kind}: {violation.key}: {violation.detail} "
                f"(found at {violation.at_s:.2f} s)"
            )
        if len(report.violations) > 20:
            click.echo(f"… and {report.total_violations - 20} more (--json lists them)")
        for failure in report.sample_failures:
            click.echo(f"failed call: {failure}", err=True)
        for error in report.sample_unexpected_errors:
            click.echo(f"unexpected error (not a store failing): {error}", err=True)
    # A new drill writes under a new id and never removes this one's data: what is left
    # and the command that removes it are said whichever way the drill ends.
    left = (
        ""
        if report.cleaned_up
        else f"; the drill's data under {report.drill_id} could not all be removed"
    )
    leftover = (
        ""
        if report.cleaned_up
        else (
            "; once the store is reachable, `siglo prune URL -n "
            f"{report.drill_id} --older-than 1ms --status running,waiting,completed,failed,"
            "cancelled` removes its runs with their wait records; its locks and idempotency "
            "keys expire by themselves"
        )
    )
    if report.verdict == "fail":
        if not as_json:
            # The expectation the verdict applied, and where it came from (--expect or
            # the table): --json carries the same sentence as verdict_reason.
            click.echo(f"verdict: FAIL: {report.verdict_reason}" + left + leftover, err=True)
        sys.exit(_EXIT_FAILED)
    if report.verdict == "incomplete" and not report.rechecked:
        raise CliError(
            "the drill could not check every acknowledgement after the run: "
            f"{report.recheck_failure}" + left,
            "let the store recover (a replica back for wait_replicas, a master restarted) "
            "and run the drill again; the report above holds what the run measured" + leftover,
        )
    if report.verdict == "incomplete":
        raise CliError(
            f"{report.unexpected_errors} call(s) raised an error that is not a store "
            "failing (the first: "
            f"{(report.sample_unexpected_errors or ['?'])[0]}): their operations are not "
            "accounted for" + left,
            "fix what they say (a setting such as max_document_bytes, a plugin's defect) "
            "and run the drill again" + leftover,
        )
    if not report.cleaned_up:
        raise CliError(
            f"the drill's data under {report.drill_id} could not all be removed",
            leftover.removeprefix("; "),
        )
