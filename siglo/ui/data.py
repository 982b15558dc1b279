"""What the dashboard shows, read through the backend's pipeline: runs a page at a time
with counts by status, one run's history, and what needs attention."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from siglo.adapter import Capability, StorageAdapter
from siglo.checkpoint import STATUSES, Checkpoint
from siglo.clock import system_clock
from siglo.coordination import LockBase
from siglo.errors import (
    CapabilityNotSupportedError,
    InvalidArgumentError,
    LockNotAcquiredError,
)
from siglo.listing import MAX_PAGE_SIZE, CheckpointPage, CheckpointSummary
from siglo.locking import workflow_lock_key
from siglo.pipeline import shown_run
from siglo.records import WaitRecord
from siglo.redaction import hide
from siglo.sealing import refuse_unopened_run
from siglo.sentinel import MISSING, Missing
from siglo.stored_runs import read_run
from siglo.unreadable import collecting_unreadable
from siglo.workflow.flow import STEP_CACHE_KEY, run_cache_namespace
from siglo.workflow.outcomes import wait_outcome

__all__ = [
    "COUNT_LIMIT",
    "Attention",
    "HeldRun",
    "LockView",
    "RunDetail",
    "RunFilter",
    "StepCacheUse",
    "attention",
    "lock_state",
    "run_detail",
    "runs_page",
    "status_counts",
]

COUNT_LIMIT: Final = 100_000
"""Counting by status stops here (and says so): a listing is paged, not a count query."""

STATUS_ORDER: Final = ("running", "waiting", "completed", "failed", "cancelled")
assert set(STATUS_ORDER) == STATUSES


@dataclass(frozen=True)
class RunFilter:
    """The listing's filters, as the runs page's form gives them."""

    namespace: str | Missing | None = MISSING
    """``MISSING``: every namespace; ``None``: only runs without one."""
    statuses: tuple[str, ...] = ()
    workflow_id: str | None = None
    updated_after: int | None = None
    updated_before: int | None = None

    def listing(self, *, with_status: bool = True) -> dict[str, Any]:
        """Keyword arguments of ``list_checkpoints`` for these filters."""
        return {
            "namespace": self.namespace,
            "status": list(self.statuses) if with_status and self.statuses else None,
            "workflow_id": self.workflow_id,
            "updated_after": self.updated_after,
            "updated_before": self.updated_before,
        }


async def runs_page(
    adapter: StorageAdapter, filters: RunFilter, *, limit: int, cursor: str | None
) -> CheckpointPage:
    """One page of runs, newest keyset order of the backend (``cursor``: the previous
    page's ``next_cursor``)."""
    return await adapter.list_checkpoints(**filters.listing(), limit=limit, cursor=cursor)


async def status_counts(adapter: StorageAdapter, filters: RunFilter) -> tuple[dict[str, int], bool]:
    """How many runs match ``filters`` in each status (the status filter aside), and
    whether counting stopped at :data:`COUNT_LIMIT` before the end."""
    counts = dict.fromkeys(STATUS_ORDER, 0)
    seen = 0
    for status in STATUS_ORDER:
        cursor: str | None = None
        while True:
            page = await adapter.list_checkpoints(
                **{**filters.listing(with_status=False), "status": status},
                limit=MAX_PAGE_SIZE,
                cursor=cursor,
            )
            counts[status] += len(page.items)
            seen += len(page.items)
            if seen >= COUNT_LIMIT:
                return counts, True
            if (cursor := page.next_cursor) is None:
                break
    return counts, False


@dataclass(frozen=True)
class LockView:
    """A run's workflow lock as the pages show it."""

    held: bool
    holder: str | None = None
    """The holder's label (:func:`~siglo.coordination.holder_label`: never its token), when
    the lock could be read; ``None`` when it was found held by taking it for an instant."""
    expires_in_ms: int | None = None
    """The lease left when it was read."""
    fencing_token: int | None = None
    taken_at_ms: int | None = None
    """When the holder took it, from the ``lock_<ms>`` of a seed-format token's label."""


@dataclass(frozen=True)
class StepCacheUse:
    """A cached step of a run: whether its output came from the step cache, and the
    entry it used or wrote (read from the checkpoint's ``stepCache`` metadata)."""

    step: str
    hit: bool
    """``True``: the output came from the cache; ``False``: computed, and cached."""
    key: str
    looked_up_at: int | None
    expires_at: int | None
    """When the entry expires: known for one this run wrote (a miss: its TTL from the
    look-up), not for one it found (a hit: written by an earlier run)."""
    present: bool | None
    """Whether the entry is in the cache now (``None``: the backend has no step cache)."""


@dataclass
class RunDetail:
    """One run as the run page shows it; every payload already redacted."""

    checkpoint: Checkpoint
    contexts: dict[str, Any]
    metadata: dict[str, Any]
    waits: list[WaitRecord]
    stream: dict[str, dict[str, Any]]
    """Per step, the context stream's latest value of each key (streamed changes)."""
    lock: LockView | None
    """The workflow lock: held (by whom, until when) or free; ``None`` when the backend
    has none, or when it can only be told by taking it and the run is not running."""
    redacted: frozenset[str] = field(default_factory=frozenset)
    step_cache: list[StepCacheUse] = field(default_factory=list)
    """The run's cached steps, in the order of its finished steps."""
    outcomes: list[str] = field(default_factory=list)
    """Each of :attr:`waits`' outcome in words, as ``siglo show`` says it
    (:func:`siglo.workflow.outcomes.wait_outcome`: ``due``, ``claim lapsed``,
    ``delivered``, ``timed out`` …), not its stored status."""


async def lock_state(
    adapter: StorageAdapter, stack_id: str, namespace: str | None, *, probe: bool = True
) -> LockView | None:
    """The run's workflow lock (the run's: its namespace included).

    Read with the lock's ``inspect`` (who holds it, the lease left) where the backend's
    workflow lock has one; otherwise — a lock class built before contract 1.4, or a
    backend whose workflow lock is not a :class:`~siglo.coordination.Lock` — found the
    way a worker finds it, by taking it for an instant (a held lock refuses at once), and
    only when ``probe`` is true. ``None``: the backend has no workflow lock, or it could
    not be read without taking it."""
    if not adapter.supports(Capability.WORKFLOW_LOCK):
        return None
    lock = adapter.workflow_lock
    if isinstance(lock, LockBase):
        try:
            state = await lock.inspect(workflow_lock_key(stack_id, namespace))
        except CapabilityNotSupportedError:
            pass
        else:
            if state is None:
                return LockView(held=False)
            return LockView(
                held=True,
                holder=state.holder,
                expires_in_ms=state.expires_in_ms,
                fencing_token=state.fencing_token,
                taken_at_ms=_taken_at(state.holder),
            )
    if not probe:
        return None

    async def nothing() -> None:
        return None

    try:
        await adapter.with_workflow_lock(stack_id, nothing, timeout_ms=1, namespace=namespace)
    except LockNotAcquiredError:
        return LockView(held=True)
    return LockView(held=False)


def _taken_at(holder: str) -> int | None:
    head = holder.partition("#")[0]
    return int(head[len("lock_") :]) if head.startswith("lock_") else None


async def run_detail(
    adapter: StorageAdapter,
    stack_id: str,
    namespace: str | None,
    redact_fields: Iterable[str],
) -> RunDetail | None:
    """One run's checkpoint, wait records, context stream and lock; ``None`` if no
    checkpoint of ``stack_id`` is stored in ``namespace``."""
    # The run and its waits as the store held them (a malformed one named: its page
    # says to remove it).
    run = await read_run(adapter, stack_id, namespace)
    if run is None:
        return None
    checkpoint, stored_waits = run
    stream: dict[str, dict[str, Any]] = {}
    if adapter.supports(Capability.CONTEXT_STREAM):
        for step in checkpoint.contexts:
            changes = await adapter.get_context_changes(stack_id, step, namespace)
            if changes:
                stream[step] = changes
    # Read without the keys it was stored with: said, not printed as the run's data.
    refuse_unopened_run(checkpoint, stored_waits, stream)
    # Shown as `siglo show` and an export give it (pipeline.shown_run).
    shown, waits, fields = shown_run(checkpoint, stored_waits, redact_fields)
    stream = {step: hide(changes, fields) for step, changes in stream.items()}
    # Read for every run where the lock can be read without taking it (an action may
    # hold it whatever the status says); taken for an instant only for a running run.
    lock = await lock_state(
        adapter, stack_id, checkpoint.namespace, probe=checkpoint.status == "running"
    )
    metadata = dict(shown.metadata or {})
    now = system_clock.now_ms()
    return RunDetail(
        checkpoint=shown,
        contexts=dict(shown.contexts),
        metadata=metadata,
        waits=waits,
        stream=stream,
        lock=lock,
        redacted=fields,
        step_cache=await step_cache_uses(adapter, checkpoint, metadata),
        outcomes=[wait_outcome(w, checkpoint, now) for w in stored_waits],
    )


async def step_cache_uses(
    adapter: StorageAdapter, checkpoint: Checkpoint, metadata: Mapping[str, Any]
) -> list[StepCacheUse]:
    """The run's cached steps, as its flow recorded them in ``metadata`` (already
    redacted) beside each step's output; each entry looked up now for whether it is
    still cached (its value is not read out)."""
    recorded = metadata.get(STEP_CACHE_KEY)
    if not isinstance(recorded, Mapping):
        return []
    cache = adapter.supports(Capability.STEP_CACHE)
    order = {name: index for index, name in enumerate(checkpoint.chains)}
    uses: list[StepCacheUse] = []
    for step, use in sorted(recorded.items(), key=lambda item: order.get(item[0], len(order))):
        if not isinstance(use, Mapping) or not isinstance(use.get("key"), str):
            continue  # not what a flow records: shown in the metadata, not here
        key, at, ttl = use["key"], use.get("at"), use.get("ttlMs")
        hit = use.get("result") == "hit"
        expires_at = None
        if not hit and isinstance(at, int) and isinstance(ttl, int):
            expires_at = at + ttl
        present = None
        if cache:
            # A key no flow writes (edited metadata) is refused: nothing to look up.
            with contextlib.suppress(InvalidArgumentError):
                entry = await adapter.get_cached_step(
                    key, **run_cache_namespace(checkpoint.namespace)
                )
                present = entry is not MISSING
        uses.append(
            StepCacheUse(
                step=str(step),
                hit=hit,
                key=key,
                looked_up_at=at if isinstance(at, int) else None,
                expires_at=expires_at,
                present=present,
            )
        )
    return uses


@dataclass(frozen=True)
class HeldRun:
    """A running run whose lock a live process holds, and that lock."""

    summary: CheckpointSummary
    lock: LockView


@dataclass
class Attention:
    """What an operator should look at."""

    crashed: list[CheckpointSummary]
    """``running`` runs whose workflow lock is free: their process is gone, and a
    ``siglo worker`` with their flow will recover them."""
    held: list[HeldRun]
    """``running`` runs whose lock a live process holds, with its holder and lease."""
    overdue: list[WaitRecord]
    """Waits past their deadline that no worker has fired yet."""
    scanned: int
    """How many running runs were looked at (at most the page asked for)."""
    capabilities: Mapping[str, bool]
    unreadable: list[Exception] = field(default_factory=list)
    """Records the listings above left out because siglo cannot read them
    (:mod:`siglo.unreadable`), each error naming its record."""


async def attention(adapter: StorageAdapter, *, limit: int, now_ms: int) -> Attention:
    """Crashed runs awaiting recovery, runs holding their lock, and overdue waits (at
    most ``limit`` of each)."""
    crashed: list[CheckpointSummary] = []
    held: list[HeldRun] = []
    scanned = 0
    listing = adapter.supports(Capability.LISTING)
    with collecting_unreadable() as unreadable:
        overdue = await _overdue(adapter, limit=limit, now_ms=now_ms)
        page = await adapter.list_checkpoints(status="running", limit=limit) if listing else None
    if page is not None:
        scanned = len(page.items)
        for summary in page.items:
            state = await lock_state(adapter, summary.stack_id, summary.namespace)
            if state is not None and state.held:
                held.append(HeldRun(summary, state))
            else:
                crashed.append(summary)
    return Attention(
        crashed=crashed,
        held=held,
        overdue=overdue,
        scanned=scanned,
        capabilities={
            "listing": listing,
            "due_waits": adapter.supports(Capability.DUE_WAITS),
            "workflow_lock": adapter.supports(Capability.WORKFLOW_LOCK),
        },
        unreadable=unreadable,
    )


async def _overdue(adapter: StorageAdapter, *, limit: int, now_ms: int) -> list[WaitRecord]:
    """Waits past their deadline, without their payloads (none is shown)."""
    if not adapter.supports(Capability.DUE_WAITS):
        return []
    return [
        w.replace(event_payload=None, metadata=None)
        for w in await adapter.list_due_waits(limit=limit)
        if w.expires_at is not None and w.expires_at <= now_ms
    ]
