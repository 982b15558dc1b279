"""``siglo rekey URL`` and ``siglo erase URL --namespace T`` (see :mod:`siglo.rekeying`)."""

from __future__ import annotations

import asyncio
import sys
from typing import TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from siglo.adapter import Capability
from siglo.cli.common import interrupted, open_store, require, stoppable, stopped_by_signals
from siglo.cli.errors import CliError, resolve_url
from siglo.errors import SigloError
from siglo.rekeying import EraseReport, RekeyReport, erase, rekey
from siglo.sentinel import MISSING
from siglo.validation import ms_as_seconds

__all__ = ["erase_command", "rekey_command"]

T = TypeVar("T")


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),
    )


@click.command(name="rekey")
@click.argument("url", required=False, default=None)
@click.option("--namespace", "-n", default=None, help="Only this namespace (default: all).")
@click.option(
    "--rotate",
    is_flag=True,
    help="First make a new data key current for each namespace (envelope keys).",
)
def rekey_command(url: str | None, namespace: str | None, rotate: bool) -> None:
    """Re-encrypt every checkpoint, stand-alone wait record, cached step, context-change
    stream value and idempotency result under its namespace's current key
    (compare-and-set; run it again to finish after an interruption: what is current is
    skipped)."""

    report = RekeyReport()

    async def run() -> RekeyReport:
        with _progress() as progress:
            task = progress.add_task("rekeying", total=None)

            def advance(report: RekeyReport) -> None:
                progress.update(
                    task,
                    total=report.total,
                    completed=report.rekeyed
                    + report.current
                    + report.left
                    + report.running
                    + len(report.refused),
                )

            async with open_store(resolve_url(url), existing=True) as backend:
                require(backend, Capability.LISTING, Capability.CHECKPOINTS)
                return await rekey(
                    backend,
                    namespace=MISSING if namespace is None else namespace,
                    rotate=rotate,
                    progress=advance,
                    report=report,
                )

    restore_signals = stopped_by_signals(as_interrupt=True)
    try:
        asyncio.run(stoppable(run()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl-C, SIGTERM or SIGHUP: said, with what is left to do (never a bare
        # "Aborted!", which left a rotation's operator rotating again).
        if report.rotated:
            raise interrupted(
                "siglo rekey --rotate",
                f"the rotation was made and stays in effect (new data keys "
                f"{_made(report)}): finish with `siglo rekey` without --rotate (rotating "
                "again would add another key)",
            ) from None
        raise interrupted(
            "siglo rekey", "run it again to finish: what is under the current key is skipped"
        ) from None
    except SigloError as exc:
        if not report.rotated:
            raise
        # The new keys are current and stay so: rotating again would only add more.
        raise CliError(
            str(exc),
            f"the rotation was made before this error and stays in effect (new data keys "
            f"{_made(report)}): once the error is fixed, finish with `siglo rekey` without "
            "--rotate (rotating again would add another key)",
        ) from exc
    finally:
        restore_signals()
    for ns, key_id in (report.rotated or {}).items():
        click.echo(f"namespace {ns if ns is not None else '(none)'}: new data key {key_id}")
    click.echo(
        f"rekeyed {report.rekeyed} checkpoint(s); {report.current} already under the "
        f"current key; {report.left} kept changing (run again to finish them)"
    )
    if report.running:
        click.echo(
            f"{report.running} checkpoint(s) left to the runs executing them (their workflow "
            "lock held; a re-save would refuse the run's next checkpoint): run again once "
            "those runs have finished or are waiting"
        )
    for kind, counts in report.payloads.items():
        click.echo(
            f"rekeyed {counts.rekeyed} {_NOUNS[kind]}; {counts.current} already under the "
            f"current key; {counts.left} kept changing; {counts.unreadable} unreadable "
            "(erased namespace or key not held: left as they are)"
        )
    for kind, why in report.skipped.items():
        # Not an error: everything this backend can list was done. But the old key
        # must stay until these are rewritten or expire, which the user must know.
        click.echo(
            f"warning: {_NOUNS[kind]} not rekeyed ({why}): they keep the key they were "
            "written with until they are rewritten or expire; keep that key until then",
            err=True,
        )
    if report.refused:
        click.echo(
            f"error: {len(report.refused)} checkpoint(s) not rekeyed, left under the key "
            "they were written with (keep it until they are rewritten or removed):",
            err=True,
        )
        for refused in report.refused:
            where = "" if refused.namespace is None else f" (namespace {refused.namespace!r})"
            click.echo(f"  {refused.stack_id!r}{where}: {refused.reason}", err=True)
        sys.exit(1)
    if report.left or report.running or any(c.left for c in report.payloads.values()):
        sys.exit(3)


def _made(report: RekeyReport) -> str:
    """The data keys a rotation made, by namespace."""
    return ", ".join(
        f"{ns if ns is not None else '(none)'}: {key_id}"
        for ns, key_id in (report.rotated or {}).items()
    )


_NOUNS = {
    "wait": "stand-alone wait record(s)",
    "step": "cached step(s)",
    "context": "context-change stream value(s)",
    "idempotency": "idempotency result(s)",
}


@click.command(name="erase")
@click.argument("url", required=False, default=None)
@click.option("--namespace", "-n", required=True, help="The namespace (tenant) to erase.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--settle-ms",
    type=click.IntRange(min=0),
    default=None,
    help="How long to wait between destroying the keys and deleting the data, for other "
    "processes' key caches to expire (default: 6000; 0 when nothing else writes the "
    "namespace).",
)
def erase_command(url: str | None, namespace: str, yes: bool, settle_ms: int | None) -> None:
    """Destroy a namespace's data keys, then delete its checkpoints, stand-alone wait
    records and cached steps: nothing of it stays readable anywhere, exports and
    backups included. Needs envelope keys (master_key)."""
    if not yes:
        click.confirm(
            f"Erase namespace {namespace!r}: destroy its keys and delete its data? "
            "This cannot be undone",
            abort=True,
        )

    async def run() -> EraseReport:
        async with open_store(resolve_url(url), existing=True) as backend:
            require(backend, Capability.LISTING, Capability.DELETION)
            settle_s = None if settle_ms is None else ms_as_seconds(settle_ms)
            return await erase(backend, namespace, settle_s=settle_s)

    restore_signals = stopped_by_signals(as_interrupt=True)
    try:
        report = asyncio.run(stoppable(run()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise interrupted(
            f"siglo erase of namespace {namespace!r}",
            "its data keys may be destroyed already and its data not yet deleted: run "
            f"`siglo erase --namespace {namespace}` again to finish (what is left is "
            "deleted; the keys destroyed stay destroyed)",
        ) from None
    finally:
        restore_signals()
    deleted = "".join(
        f", {report.payloads[kind]} {_ERASED[kind]}" for kind in _ERASED if kind in report.payloads
    )
    click.echo(
        f"erased namespace {report.namespace}: destroyed {len(report.erased_keys)} data "
        f"key(s), deleted {report.deleted} checkpoint(s){deleted}"
    )
    for kind, why in report.skipped.items():
        # The keys are gone, so these no longer decrypt; but they stay stored until
        # they expire, which the user must know.
        click.echo(
            f"warning: {_NOUNS[kind]} of {report.namespace} not deleted ({why}): they stay "
            "stored, undecryptable, until they expire",
            err=True,
        )
    left = {kind: n for kind, n in report.left.items() if n}
    for kind, n in left.items():
        click.echo(f"{n} {_NOUNS[kind]} kept changing: run siglo erase again", err=True)
    if left:
        sys.exit(3)


_ERASED = {
    "wait": "wait record(s)",
    "step": "cached step(s)",
    "context": "context-change stream value(s) emptied",
}
