"""The focused check of a closed backend (``backend.closed``), and the second backend
of the target that it and ``manager.error-mode.stored`` close."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from siglo import MISSING
from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.backend import Backend
from siglo.coordination import LockBase
from siglo.errors import StorageAdapterError
from siglo.payloads import StoredPayload
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord
from siglo_contract.registry import CheckContext, check, expect, fail

C = Capability

__all__ = ["closed_calls", "second_backend"]


def second_backend(ctx: CheckContext) -> Backend | None:
    """Another backend of the target: a new connection to the run's storage, or the
    target's factory's; ``None`` when the target offers neither."""
    if ctx.session.shared_url is not None:
        return ctx.session.open_backend()
    factory = ctx.session.target.factory
    return None if factory is None else factory(**ctx.session.backend_options())


def closed_calls(
    ctx: CheckContext, closed: Backend, stack: str, key: str, ran: list[str]
) -> list[tuple[Capability, str, Callable[[], Awaitable[Any]]]]:
    """One call of every method a closed backend must refuse, by capability: those
    that write, those that read, and ``with_workflow_lock``, whose action must not run."""
    a = closed.adapter

    async def action() -> None:
        ran.append("with_workflow_lock")

    change = ContextChangeEvent(stack_id=stack, step_id="p", key="k", value=1, timestamp=1)
    calls: list[tuple[Capability, str, Callable[[], Awaitable[Any]]]] = [
        (C.CHECKPOINTS, "save_checkpoint", lambda: a.save_checkpoint(ctx.checkpoint(stack, 1))),
        (C.CHECKPOINTS, "get_checkpoint", lambda: a.get_checkpoint(stack)),
        (C.CHECKPOINTS, "clean_expired_checkpoints", a.clean_expired_checkpoints),
        (
            C.WAIT_RECORDS,
            "save_wait_record",
            lambda: a.save_wait_record(WaitRecord(correlation_key=key, stack_id=stack)),
        ),
        (
            C.WAIT_RECORDS,
            "create_wait_record",
            lambda: a.create_wait_record(WaitRecord(correlation_key=key, stack_id=stack)),
        ),
        (C.WAIT_RECORDS, "get_wait_record", lambda: a.get_wait_record(key)),
        (C.WAIT_RECORDS, "claim_wait_record", lambda: a.claim_wait_record(key, "c")),
        (C.WAIT_RECORDS, "complete_wait_record", lambda: a.complete_wait_record(key, "c")),
        (C.WAIT_RECORDS, "release_wait_record", lambda: a.release_wait_record(key, "c")),
        (C.WAIT_RECORDS, "cancel_wait_record", lambda: a.cancel_wait_record(key)),
        (C.WAIT_RECORDS, "cancel_workflow", lambda: a.cancel_workflow(stack)),
        (C.WORKFLOW_LOCK, "with_workflow_lock", lambda: a.with_workflow_lock(stack, action)),
        (C.STEP_CACHE, "set_cached_step", lambda: a.set_cached_step(key, 1)),
        (C.STEP_CACHE, "get_cached_step", lambda: a.get_cached_step(key)),
        (C.CONTEXT_STREAM, "on_context_change", lambda: a.on_context_change(change)),
        (C.CONTEXT_STREAM, "get_context_changes", lambda: a.get_context_changes(stack, "p")),
        (
            C.CONTEXT_STREAM,
            "save_checkpoint_streamed",
            lambda: a.save_checkpoint_streamed(ctx.checkpoint(stack, 1), [change]),
        ),
        (
            C.WORKFLOW_LOCK,
            "save_checkpoint_unlocking",
            lambda: a.save_checkpoint_unlocking(ctx.checkpoint(stack, 1), [change]),
        ),
        (
            C.STEP_CACHE,
            "save_checkpoint_caching",
            lambda: a.save_checkpoint_caching(
                ctx.checkpoint(stack, 1), [], CacheEntry(key, 1), expected_revision=0
            ),
        ),
        (
            C.CACHE_EVENTS,
            "on_cache_event",
            lambda: a.on_cache_event(CacheEvent(type="hit", key=key, timestamp=1)),
        ),
        (C.LISTING, "list_checkpoints", lambda: a.list_checkpoints(limit=1)),
        (
            C.LISTING,
            "list_checkpoints_by_index",
            lambda: a.list_checkpoints_by_index({"f": "t"}, namespace=None, limit=1),
        ),
        (C.DELETION, "delete_checkpoint", lambda: a.delete_checkpoint(stack)),
        (C.DUE_WAITS, "list_due_waits", lambda: a.list_due_waits(limit=1)),
        (C.PAYLOAD_SCAN, "scan_payloads", lambda: _first_payload(a)),
        (
            C.PAYLOAD_SCAN,
            "swap_payload",
            lambda: a.swap_payload(StoredPayload("step", key, None, {"value": 1}), {"value": 2}),
        ),
        (
            C.PAYLOAD_SCAN,
            "delete_payload",
            lambda: a.delete_payload(StoredPayload("step", key, None, {"value": 1})),
        ),
    ]
    if closed.idempotency is not None:
        store: Any = closed.idempotency  # scan_results, swap_result: IdempotencyStoreBase's
        calls += [
            (C.IDEMPOTENCY, "idempotency.claim", lambda: store.claim(key)),
            (C.IDEMPOTENCY, "idempotency.claim_owned", lambda: store.claim_owned(key)),
            (C.IDEMPOTENCY, "idempotency.complete", lambda: store.complete(key, 1)),
            (C.IDEMPOTENCY, "idempotency.fail", lambda: store.fail(key)),
            (C.IDEMPOTENCY, "idempotency.extend", lambda: store.extend(key, "t", 1_000)),
            (C.IDEMPOTENCY, "idempotency.get_result", lambda: store.get_result(key)),
            (C.IDEMPOTENCY, "idempotency.get", lambda: store.get(key)),
            (C.PAYLOAD_SCAN, "idempotency.scan_results", lambda: _first_result(store)),
            (
                C.PAYLOAD_SCAN,
                "idempotency.swap_result",
                lambda: store.swap_result(
                    StoredPayload("idempotency", key, None, {"result": 1}), {"result": 2}
                ),
            ),
        ]
    if closed.lock is not None:
        lock = closed.lock

        async def locked() -> None:
            ran.append("with_lock")

        calls += [
            (C.LOCKS, "lock.acquire", lambda: lock.acquire(key)),
            (C.LOCKS, "lock.release", lambda: lock.release(key, "t")),
            (C.LOCKS, "lock.extend", lambda: lock.extend(key, "t", 1_000)),
            (C.LOCKS, "lock.with_lock", lambda: lock.with_lock(key, locked)),
        ]
        if isinstance(lock, LockBase):  # inspect is LockBase's (contract 1.4), not the protocol's
            inspected = lock
            calls.append((C.LOCKS, "lock.inspect", lambda: inspected.inspect(key)))
    if closed.nonces is not None:
        nonces = closed.nonces
        calls.append((C.NONCES, "nonces.claim", lambda: nonces.claim(key, 60)))
    return calls


async def _first_payload(adapter: StorageAdapter) -> Any:
    """The first item of ``scan_payloads`` (the call that starts the walk)."""
    async for item in adapter.scan_payloads("step"):
        return item
    return None


async def _first_result(store: Any) -> Any:
    """The first item of ``scan_results`` (the call that starts the walk)."""
    async for item in store.scan_results():
        return item
    return None


@check("backend.closed")
async def closed_backend_refuses(ctx: CheckContext) -> None:
    """After ``aclose()`` every call of the adapter and of the coordination stores raises
    ``StorageAdapterError``, runs no action, and (where the run's backend shares the
    storage) stores nothing."""
    ctx.about("backend.closed")
    closed = second_backend(ctx)
    if closed is None:
        return
    caps = ctx.session.target.capabilities
    stack, key = ctx.id("closed"), ctx.id("closed-key")
    ran: list[str] = []
    await closed.aclose()
    try:
        for capability, name, call in closed_calls(ctx, closed, stack, key, ran):
            if capability not in caps:
                continue
            try:
                outcome: Any = await call()
            except StorageAdapterError:
                continue
            except Exception as exc:
                outcome = exc
            fail(
                "backend.closed",
                f"{name} on a closed backend gave {outcome!r}, not StorageAdapterError",
            )
    finally:
        await closed.aclose()  # a second aclose() is harmless, whatever happened above
    expect(not ran, "backend.closed", f"{' and '.join(ran)} ran an action on a closed backend")
    if ctx.session.shared_url is None:
        return  # the closed backend had storage of its own: nothing to read back
    live = ctx.backend
    if C.CHECKPOINTS in caps:
        stored = await live.adapter.get_checkpoint(stack)
        expect(stored is None, "backend.closed", f"a closed backend stored {stored!r}")
    if C.WAIT_RECORDS in caps:
        record = await live.adapter.get_wait_record(key)
        expect(record is None, "backend.closed", f"a closed backend stored {record!r}")
    if C.STEP_CACHE in caps:
        cached = await live.adapter.get_cached_step(key)
        expect(cached is MISSING, "backend.closed", f"a closed backend cached {cached!r}")
    if C.IDEMPOTENCY in caps and live.idempotency is not None:
        state = await live.idempotency.claim(key)
        expect(
            state == "claimed",
            "backend.closed",
            f"a key a closed backend was asked to claim is {state!r}, not free",
        )
    if C.LOCKS in caps and live.lock is not None:
        result = await live.lock.acquire(key)
        expect(result.acquired, "backend.closed", "a closed backend took a lock")
    if C.NONCES in caps and live.nonces is not None:
        first = await live.nonces.claim(key, 60)
        expect(first, "backend.closed", "a closed backend claimed a nonce")
