"""``siglo ls``, ``show``, ``rm``, ``prune`` and ``clean``: find, inspect and remove what a
store holds (SPEC §9). Tables on a terminal, ``--json`` for scripts."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import click
import orjson

from siglo.adapter import Capability
from siglo.checkpoint import STATUSES
from siglo.cli.common import (
    format_ms,
    interruptible,
    open_store,
    print_json,
    print_table,
    require,
    visible,
)
from siglo.cli.errors import CliError, cli_settings, left_out, resolve_url
from siglo.clock import system_clock
from siglo.errors import CheckpointConflictError, SigloError
from siglo.listing import CheckpointSummary
from siglo.moments import describe_ms
from siglo.pipeline import shown_run
from siglo.sealing import refuse_unopened_run
from siglo.sentinel import MISSING, Missing
from siglo.stored_runs import read_run
from siglo.unreadable import collecting_unreadable
from siglo.workflow.outcomes import WAITING_FOR, is_sleep, wait_outcome, waiting_for

__all__ = ["clean", "ls", "parse_duration", "prune", "rm", "show"]

_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_duration(text: str) -> int:
    """``7d``, ``12h``, ``30m``, ``45s``, ``500ms``, ``2w`` (or a sum: ``1d12h``) in ms."""
    parts = re.findall(r"(\d+)\s*(ms|s|m|h|d|w)", text.strip().lower())
    if not parts or re.sub(r"(\d+)\s*(ms|s|m|h|d|w)|\s", "", text.strip().lower()):
        raise click.BadParameter(f"{text!r} is not a duration such as 7d, 12h, 30m or 45s")
    return sum(int(n) * _UNITS[unit] for n, unit in parts)


def _statuses(text: str | None) -> list[str] | None:
    if text is None:
        return None
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown or not wanted:
        raise click.BadParameter(
            f"{text!r}: statuses are {', '.join(sorted(STATUSES))} (comma-separated)"
        )
    return wanted


def _namespace(value: str | None, *, unnamespaced: bool) -> str | Missing | None:
    if unnamespaced:
        if value is not None:
            raise click.UsageError("--namespace and --no-namespace exclude each other")
        return None
    return MISSING if value is None else value


_ROW = (
    "stack id",
    "namespace",
    "workflow",
    "status",
    "rev",
    "updated (UTC)",
    "expires (UTC)",
)


def _print_summaries(items: list[CheckpointSummary]) -> None:
    # The expiry column only when something expires: the table stays within 80 columns.
    expiring = any(s.expires_at is not None for s in items)
    columns = _ROW if expiring else _ROW[:-1]
    print_table(None, columns, [_row(s)[: len(columns)] for s in items])


def _row(s: CheckpointSummary) -> list[Any]:
    return [
        s.stack_id,
        s.namespace,
        s.workflow_id,
        s.status,
        s.revision,
        format_ms(s.timestamp),
        format_ms(s.expires_at),
    ]


namespace_option = click.option(
    "--namespace", "-n", default=None, help="Only this namespace (default: every one)."
)
no_namespace_option = click.option(
    "--no-namespace", "unnamespaced", is_flag=True, help="Only stacks without a namespace."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.command()
@click.argument("url", required=False, default=None)
@namespace_option
@no_namespace_option
@click.option("--status", default=None, help="Comma-separated statuses, e.g. running,waiting.")
@click.option("--workflow", default=None, help="Only runs of this workflow id.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--cursor", default=None, help="Continue after a previous page (its next cursor).")
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="FIELD=VALUE",
    help="Only stacks whose metadata FIELD equals VALUE (JSON, else a string); repeatable. "
    "Encrypted metadata: fields of blind_index_fields only.",
)
@json_option
@interruptible("siglo ls", "a listing or a read: nothing was changed; run it again")
def ls(
    url: str | None,
    namespace: str | None,
    unnamespaced: bool,
    status: str | None,
    workflow: str | None,
    limit: int,
    cursor: str | None,
    where: tuple[str, ...],
    as_json: bool,
) -> None:
    """List stored checkpoints, a page at a time."""
    metadata = _where(where)

    async def run() -> None:
        async with open_store(resolve_url(url), existing=True) as backend:
            require(backend, Capability.LISTING)
            query: dict[str, Any] = {
                "namespace": _namespace(namespace, unnamespaced=unnamespaced),
                "status": _statuses(status),
                "workflow_id": workflow,
                "limit": limit,
                "cursor": cursor,
            }
            page = await backend.adapter.list_checkpoints(metadata=metadata, **query)
        if as_json:
            print_json({"items": [s.to_wire() for s in page.items], "nextCursor": page.next_cursor})
            return
        _print_summaries(list(page.items))
        click.echo(f"{len(page.items)} stack(s)")
        if page.next_cursor is not None:
            click.echo(f"more: --cursor {page.next_cursor}")

    with collecting_unreadable() as unreadable:
        asyncio.run(run())
    left_out(unreadable)


def _where(pairs: tuple[str, ...]) -> dict[str, Any] | None:
    """``--where FIELD=VALUE`` options as a metadata filter (VALUE parsed as JSON when it
    is a JSON scalar — ``7``, ``true``, ``null``, ``"7"`` — else taken as a string)."""
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for pair in pairs:
        field, sep, text = pair.partition("=")
        if not sep or not field:
            raise CliError(f"--where {pair!r} is not FIELD=VALUE", "e.g. --where customer=acme")
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            value = text
        if isinstance(value, dict | list):
            value = text
        out[field] = value
    return out


def _url_and_stack_id(first: str | None, second: str | None) -> tuple[str | None, str]:
    """``[URL] STACK_ID``: with one argument it is the stack id, and the URL comes from the
    settings (as for every other command)."""
    if second is not None:
        return first, second
    if first is None:
        raise click.UsageError("Missing argument 'STACK_ID'.")
    return None, first


async def _missing_hint(adapter: Any, stack_id: str, namespace: str | None) -> str:
    """What to look at for a stack ``stack_id`` that is not in ``namespace``: a stack is
    its namespace and its id, and the application's reads may fall back to the stack
    without a namespace (``namespace_fallback``), which a command never does."""
    if namespace is None:
        return (
            "`siglo ls URL` lists the stored stacks; one saved in a namespace is shown "
            "with --namespace NS"
        )
    try:
        bare = await adapter.get_checkpoint(stack_id, None, fallback=False)
    except SigloError:
        bare = None
    if bare is None:
        return "`siglo ls URL --namespace NS` lists a namespace's stacks"
    said = f"a stack {stack_id!r} without a namespace exists (shown without --namespace)"
    if cli_settings().namespace_fallback:
        said += (
            f"; the application's reads in namespace {namespace!r} return it while "
            "namespace_fallback is on (docs/configuration.md)"
        )
    return said


@click.command()
@click.argument("url", required=False, default=None)
@click.argument("stack_id", required=False, default=None, metavar="STACK_ID")
@click.option("--namespace", "-n", default=None, help="The stack's namespace.")
@json_option
@interruptible("siglo show", "a listing or a read: nothing was changed; run it again")
def show(url: str | None, stack_id: str | None, namespace: str | None, as_json: bool) -> None:
    """Show one stack: its checkpoint (as stored; a key the settings redact is shown
    [REDACTED] even in a value stored before it was redacted), what it waits for, and its
    wait records.

    Each wait has an outcome: waiting, sleeping, due, claimed, claim lapsed, delivered,
    timed out, slept or cancelled. Times are ISO-8601 UTC with a relative time; --json
    keeps the stored epoch milliseconds and adds each record's "outcome".
    """
    url, stack_id = _url_and_stack_id(url, stack_id)

    async def run() -> None:
        async with open_store(resolve_url(url), existing=True) as backend:
            adapter = backend.adapter
            # The run and its waits as the store held them, read in its namespace (the
            # hint of a malformed one: siglo rm).
            run = await read_run(adapter, stack_id, namespace)
            if run is None:
                where = f" in namespace {namespace!r}" if namespace else ""
                raise CliError(
                    f"no stack {stack_id!r}{where}",
                    await _missing_hint(adapter, stack_id, namespace),
                )
            checkpoint, waits = run
            now = system_clock.now_ms()
            # Read without the keys it was stored with: said, not printed as its data.
            refuse_unopened_run(checkpoint, waits)
        # Shown as the dashboard and an export give it: a key the settings redact is
        # hidden even in a value stored before it was redacted (pipeline.shown_run).
        checkpoint, waits, _hidden = shown_run(checkpoint, waits, cli_settings().redact_fields)
        doc = checkpoint.to_wire()
        outcomes = [wait_outcome(w, checkpoint, now) for w in waits]
        if as_json:
            # Times stay in epoch ms here; "outcome" tells a timeout from a delivery.
            print_json(
                {
                    "checkpoint": doc,
                    "waitingFor": waiting_for(checkpoint, now),
                    "waitRecords": [
                        {**w.to_wire(), "outcome": outcome}
                        for w, outcome in zip(waits, outcomes, strict=True)
                    ],
                }
            )
            return
        print_table(
            f"stack {stack_id}",
            ("field", "value"),
            [
                ("namespace", checkpoint.namespace),
                ("workflow", checkpoint.workflow_id),
                ("status", checkpoint.status),
                ("waiting for", waiting_for(checkpoint, now)),
                ("revision", checkpoint.revision),
                ("updated (UTC)", format_ms(checkpoint.timestamp)),
                ("expires (UTC)", format_ms(checkpoint.expires_at)),
                ("chains", " → ".join(checkpoint.chains) or None),
            ],
        )
        for step, context in checkpoint.contexts.items():
            print_table(
                f"context {step}",
                ("key", "value"),
                [(key, _context_value(key, value)) for key, value in context.items()],
            )
        for w, outcome in zip(waits, outcomes, strict=True):
            claimed = w.status == "claimed"
            print_table(
                "sleep" if is_sleep(w.correlation_key) else f"wait {w.correlation_key}",
                ("field", "value"),
                [
                    ("outcome", outcome),
                    ("step", w.step_id),
                    ("deadline", describe_ms(w.expires_at, now)),
                    ("claimed by", w.claimant_id if claimed else None),
                    (
                        "claim lease until",
                        describe_ms(w.lease_expires_at, now) if claimed else None,
                    ),
                    ("completed", describe_ms(w.completed_at, now)),
                ],
            )

    asyncio.run(run())


def _context_value(key: str, value: Any) -> str:
    # A sleep's correlation key is siglo's own: people see that the step sleeps.
    if key == WAITING_FOR and isinstance(value, str) and is_sleep(value):
        return "sleep"
    return _compact(value)


def _compact(value: Any) -> str:
    import orjson

    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@click.command()
@click.argument("url", required=False, default=None)
@click.argument("stack_id", required=False, default=None, metavar="STACK_ID")
@click.option("--namespace", "-n", default=None, help="The stack's namespace.")
@click.option(
    "--revision",
    type=click.IntRange(min=1, max=2**63 - 1),
    default=None,
    help="Only if the stored revision is this one (compare-and-set).",
)
@json_option
@interruptible("siglo rm", "run it again to remove what is left")
def rm(
    url: str | None,
    stack_id: str | None,
    namespace: str | None,
    revision: int | None,
    as_json: bool,
) -> None:
    """Delete a stack: its checkpoint, wait records and context streams.

    Exits with status 1 when nothing was deleted (no such stack, or --revision did not
    match); with --json the outcome is printed as JSON on stdout either way.
    """
    url, stack_id = _url_and_stack_id(url, stack_id)
    result: dict[str, Any] = {"stackId": stack_id, "namespace": namespace, "deleted": False}
    missing: list[str] = []  # where to look, for a stack not there

    async def run() -> None:
        async with open_store(resolve_url(url), existing=True) as backend:
            require(backend, Capability.DELETION)
            try:
                result["deleted"] = await backend.adapter.delete_checkpoint(
                    stack_id, namespace, expected_revision=revision
                )
            except CheckpointConflictError as exc:
                result["currentRevision"] = exc.current_revision
                result["expectedRevision"] = revision
                if as_json:
                    print_json(result)
                if exc.current_revision is None:  # no live stack: nothing to compare with
                    where = f" in namespace {namespace!r}" if namespace else ""
                    raise CliError(
                        f"no stack {stack_id!r}{where} to delete (expected revision "
                        f"{revision}); nothing was deleted",
                        await _missing_hint(backend.adapter, stack_id, namespace),
                    ) from exc
                raise CliError(
                    f"stack {stack_id!r} is at revision {exc.current_revision}, not {revision}; "
                    "nothing was deleted",
                    "`siglo show URL STACK_ID` shows the current revision",
                ) from exc
            if not result["deleted"]:
                missing.append(await _missing_hint(backend.adapter, stack_id, namespace))
        if as_json:
            print_json(result)
        if not result["deleted"]:
            where = f" in namespace {namespace!r}" if namespace else ""
            raise CliError(f"no stack {stack_id!r}{where} to delete", missing[0])
        if not as_json:
            click.echo(f"deleted {visible(stack_id)}")

    asyncio.run(run())


@click.command()
@click.argument("url", required=False, default=None)
@click.option(
    "--status",
    default="completed,failed,cancelled",
    show_default=True,
    help="Comma-separated statuses to prune.",
)
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Only stacks not updated for this long: 7d, 12h, 30m …",
)
@namespace_option
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@json_option
@interruptible("siglo prune", "what was pruned stays pruned: run it again to finish")
def prune(
    url: str | None,
    status: str,
    older_than: str,
    namespace: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete finished stacks older than a cut-off (each only if unchanged since listed)."""
    statuses = _statuses(status)
    cutoff = system_clock.now_ms() - parse_duration(older_than)

    async def run() -> tuple[list[CheckpointSummary], int, int]:
        chosen: list[CheckpointSummary] = []
        changed = gone = 0
        async with open_store(resolve_url(url), existing=True) as backend:
            require(backend, Capability.LISTING)
            if not dry_run:
                require(backend, Capability.DELETION)
            adapter = backend.adapter
            cursor = None
            while True:
                page = await adapter.list_checkpoints(
                    namespace=MISSING if namespace is None else namespace,
                    status=statuses,
                    updated_before=cutoff,
                    limit=500,
                    cursor=cursor,
                )
                for summary in page.items:
                    if dry_run:
                        chosen.append(summary)
                        continue
                    try:
                        # Compare-and-set: a stack written since it was listed stays.
                        if await adapter.delete_checkpoint(
                            summary.stack_id,
                            summary.namespace,
                            expected_revision=summary.revision,
                        ):
                            chosen.append(summary)
                        else:
                            gone += 1  # expired, or removed by another, since listed
                    except CheckpointConflictError as exc:
                        if exc.current_revision is None:
                            gone += 1  # no live stack left to compare with
                        else:
                            changed += 1
                if (cursor := page.next_cursor) is None:
                    return chosen, changed, gone

    with collecting_unreadable() as unreadable:
        chosen, changed, gone = asyncio.run(run())
    verb = "would delete" if dry_run else "deleted"
    if as_json:
        print_json(
            {
                "dryRun": dry_run,
                "stacks": [s.to_wire() for s in chosen],
                "changed": changed,
                "gone": gone,
            }
        )
    else:
        if dry_run and chosen:
            _print_summaries(chosen)
        statuses_text = ", ".join(statuses or [])
        click.echo(f"{verb} {len(chosen)} stack(s) older than {older_than} ({statuses_text})")
        if changed:
            click.echo(f"kept {changed} stack(s) written meanwhile")
        if gone:
            click.echo(f"{gone} stack(s) expired or were removed meanwhile")
    left_out(unreadable)  # not read, so neither judged nor deleted: named for `siglo rm`


@click.command()
@click.argument("url", required=False, default=None)
@json_option
@interruptible("siglo clean", "what was removed stays removed: run it again to finish")
def clean(url: str | None, as_json: bool) -> None:
    """Remove expired records now, with a count per kind (Redis expires keys itself)."""

    async def run() -> dict[str, int]:
        async with open_store(resolve_url(url), existing=True) as backend:
            adapter = backend.adapter
            everything = getattr(adapter, "clean_expired", None)
            if callable(everything):
                counts: dict[str, int] = await everything()
                return counts
            require(backend, Capability.CHECKPOINTS)
            return {"checkpoints": await adapter.clean_expired_checkpoints()}

    with collecting_unreadable() as unreadable:
        counts = asyncio.run(run())
    if as_json:
        print_json(counts)
    else:
        print_table("expired records removed", ("kind", "removed"), list(counts.items()))
    left_out(unreadable)
