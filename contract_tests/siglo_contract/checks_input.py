"""Focused checks of bad input: every id argument and every duration argument of every
method of a declared capability, refused with ``InvalidArgumentError`` naming the
argument, and nothing stored changes (``input.rejected``)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final

from siglo.adapter import Capability
from siglo.checkpoint import Checkpoint
from siglo.errors import InvalidArgumentError
from siglo.records import ContextChangeEvent, WaitRecord
from siglo.sentinel import MISSING
from siglo.validation import MAX_ID_LENGTH
from siglo_contract.machine_base import canon
from siglo_contract.registry import CheckContext, check, expect, fail

C = Capability

BAD_IDS: Final[tuple[tuple[str, Any], ...]] = (
    ("empty", ""),
    ("NUL", "a\x00b"),
    ("lone surrogate", "a\ud800b"),
    ("lone low surrogate", "\udfff"),
    ("over-long", "x" * (MAX_ID_LENGTH + 1)),
    ("an int", 123),
    ("bytes", b"a"),
)
"""Ids no backend may accept (``None`` too, where the id is required)."""

BAD_MS: Final[tuple[tuple[str, Any], ...]] = (
    ("zero", 0),
    ("negative", -1),
    ("a float", 1.5),
    ("an integral float", 1000.0),
    ("True", True),
    ("False", False),
    ("a string", "1000"),
    ("NaN", math.nan),
)
"""Durations in milliseconds no backend may accept: they are positive integers."""

BAD_SECONDS: Final[tuple[tuple[str, Any], ...]] = (
    ("zero", 0),
    ("negative", -1.5),
    ("NaN", math.nan),
    ("infinite", math.inf),
    ("True", True),
    ("a string", "1"),
)
"""Nonce windows no backend may accept: they are positive finite numbers."""


class _NotJson:
    pass


Call = Callable[[Any], Awaitable[Any]]


async def _rejects(what: str, argument: str, call: Callable[[], Awaitable[Any]]) -> None:
    """``call()`` must raise InvalidArgumentError whose message names ``argument``."""
    try:
        await asyncio.wait_for(call(), 30)
    except InvalidArgumentError as exc:
        expect(
            argument in str(exc),
            "input.rejected",
            f"{what} raised InvalidArgumentError({str(exc)!r}), which does not name {argument!r}",
        )
        return
    except Exception as exc:
        fail("input.rejected", f"{what} raised {exc!r}, not InvalidArgumentError")
    fail("input.rejected", f"{what} was accepted")


def _bind(call: Call, value: Any) -> Callable[[], Awaitable[Any]]:
    return lambda: call(value)


async def _each(
    method: str, argument: str, call: Call, bad: tuple[tuple[str, Any], ...], *, required: bool
) -> None:
    cases = [*bad, ("None", None)] if required else list(bad)
    for label, value in cases:
        await _rejects(f"{method}({argument}={label})", argument, _bind(call, value))


def _ids(method: str, argument: str, call: Call, *, required: bool = True) -> Awaitable[None]:
    return _each(method, argument, call, BAD_IDS, required=required)


def _ms(method: str, argument: str, call: Call) -> Awaitable[None]:
    return _each(method, argument, call, BAD_MS, required=False)


def _record_ids(
    method: str, make: Callable[[Any], Any], argument: str, call: Call
) -> list[Awaitable[None]]:
    """Bad ids inside a record or event; a value its constructor refuses is skipped."""
    out: list[Awaitable[None]] = []
    for label, value in BAD_IDS:
        try:
            obj = make(value)
        except Exception:
            continue
        out.append(_rejects(f"{method}({argument}={label})", argument, _bind(call, obj)))
    return out


class _State:
    """What the check stored first; every rejected call must leave it as it was."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.caps = ctx.session.target.capabilities
        self.stack, self.key, self.cache = ctx.id("kept"), ctx.id("wait"), ctx.id("cache")
        self.idem, self.lock, self.nonce = ctx.id("idem"), ctx.id("lock"), ctx.id("nonce")
        self.token = ctx.id("token")
        self.ran: list[str] = []

    async def setup(self) -> None:
        a, b = self.ctx.backend.adapter, self.ctx.backend
        if C.CHECKPOINTS in self.caps:
            await a.save_checkpoint(self.ctx.checkpoint(self.stack, 3, metadata={"v": 1}))
        if C.WAIT_RECORDS in self.caps:
            await a.save_wait_record(WaitRecord(correlation_key=self.key, stack_id=self.stack))
        if C.STEP_CACHE in self.caps:
            await a.set_cached_step(self.cache, "kept", 600_000)
        if C.IDEMPOTENCY in self.caps and b.idempotency is not None:
            await b.idempotency.claim(self.idem, 600_000)
        if C.LOCKS in self.caps and b.lock is not None:
            await b.lock.acquire(self.lock, 600_000, self.token)
        if C.NONCES in self.caps and b.nonces is not None:
            await b.nonces.claim(self.nonce, 600)

    async def snapshot(self) -> list[Any]:
        a, b = self.ctx.backend.adapter, self.ctx.backend
        out: list[Any] = []
        if C.CHECKPOINTS in self.caps:
            cp = await a.get_checkpoint(self.stack)
            out.append(("checkpoint", None if cp is None else canon(cp.to_wire())))
        if C.WAIT_RECORDS in self.caps:
            rec = await a.get_wait_record(self.key)
            out.append(("wait", None if rec is None else canon(rec.to_wire())))
        if C.STEP_CACHE in self.caps:
            value = await a.get_cached_step(self.cache)
            out.append(("cache", "MISSING" if value is MISSING else canon(value)))
        if C.IDEMPOTENCY in self.caps and b.idempotency is not None:
            out.append(("idempotency", repr(await b.idempotency.get(self.idem))))
        if C.LOCKS in self.caps and b.lock is not None:
            out.append(("lock held", not (await b.lock.acquire(self.lock, 1_000)).acquired))
        return out

    async def action(self) -> None:
        self.ran.append("action")


@check("input.rejected")
async def bad_input(ctx: CheckContext) -> None:
    """Bad ids, durations, revisions, values and types on every method raise
    InvalidArgumentError naming the argument; nothing stored changes; no action runs."""
    ctx.about("input.rejected")
    state = _State(ctx)
    await state.setup()
    before = await state.snapshot()
    calls = [
        *_checkpoint_calls(ctx, state),
        *_wait_calls(ctx, state),
        *_cache_and_context_calls(ctx, state),
        *_coordination_calls(ctx, state),
    ]
    try:
        for call in calls:
            await call
    finally:
        for call in calls:
            call.close()  # type: ignore[attr-defined]  # those not run after a failure
    expect(not state.ran, "input.rejected", "a call with bad input ran its action")
    after = await state.snapshot()
    for (what, was), (_, now) in zip(before, after, strict=True):
        expect(
            was == now, "input.rejected", f"rejected calls changed the {what}: {was!r} → {now!r}"
        )


def _checkpoint_calls(ctx: CheckContext, s: _State) -> list[Awaitable[None]]:
    if C.CHECKPOINTS not in s.caps:
        return []
    a = ctx.backend.adapter

    def cp(revision: int = 9, **fields: Any) -> Checkpoint:
        return ctx.checkpoint(s.stack, revision, **fields)

    return [
        _ids("get_checkpoint", "stack_id", lambda v: a.get_checkpoint(v)),
        _ids("get_checkpoint", "namespace", lambda v: a.get_checkpoint(s.stack, v), required=False),
        *_record_ids(
            "save_checkpoint",
            lambda v: Checkpoint(stack_id=v, revision=9, timestamp=1),
            "stack_id",
            lambda c: a.save_checkpoint(c),
        ),
        *_record_ids(
            "save_checkpoint",
            lambda v: cp(namespace=v),
            "namespace",
            lambda c: a.save_checkpoint(c),
        ),
        _rejects("save_checkpoint('x')", "checkpoint", lambda: a.save_checkpoint("x")),  # type: ignore[arg-type]
        *(
            _rejects(
                f"save_checkpoint(expected_revision={bad!r})",
                "expected_revision",
                _bind(lambda bad: a.save_checkpoint(cp(), expected_revision=bad), bad),
            )
            for bad in (-1, "3", 3.0, True)
        ),
        _rejects(
            "save_checkpoint(revision 3, expected_revision=3)",
            "expected_revision",
            lambda: a.save_checkpoint(cp(3), expected_revision=3),
        ),
        _rejects(
            "save_checkpoint(revision 2, expected_revision=3)",
            "expected_revision",
            lambda: a.save_checkpoint(cp(2), expected_revision=3),
        ),
    ]


def _wait_calls(ctx: CheckContext, s: _State) -> list[Awaitable[None]]:
    if C.WAIT_RECORDS not in s.caps:
        return []
    a = ctx.backend.adapter
    key = s.key

    def rec(**fields: Any) -> WaitRecord:
        return WaitRecord(**{"correlation_key": key, "stack_id": ctx.id("other"), **fields})

    calls: list[Awaitable[None]] = [
        *_record_ids(
            "save_wait_record", lambda v: rec(correlation_key=v), "correlation_key",
            lambda r: a.save_wait_record(r),
        ),
        *_record_ids(
            "save_wait_record", lambda v: rec(stack_id=v), "stack_id",
            lambda r: a.save_wait_record(r),
        ),
        *_record_ids(
            "save_wait_record", lambda v: rec(namespace=v), "namespace",
            lambda r: a.save_wait_record(r),
        ),
        _rejects("save_wait_record('x')", "record", lambda: a.save_wait_record("x")),  # type: ignore[arg-type]
        _ms("save_wait_record", "ttl_ms", lambda v: a.save_wait_record(rec(), ttl_ms=v)),
        _ids("get_wait_record", "correlation_key", lambda v: a.get_wait_record(v)),
        _ids("claim_wait_record", "correlation_key", lambda v: a.claim_wait_record(v, "c")),
        _ids(
            "claim_wait_record", "claimant_id", lambda v: a.claim_wait_record(key, v),
            required=False,
        ),
        _ms("claim_wait_record", "lease_ms", lambda v: a.claim_wait_record(key, "c", lease_ms=v)),
        _rejects(
            "claim_wait_record(event_payload=non-JSON)",
            "event_payload",
            lambda: a.claim_wait_record(key, "c", event_payload=_NotJson()),
        ),
        _ids("complete_wait_record", "correlation_key", lambda v: a.complete_wait_record(v, "c")),
        _ids("complete_wait_record", "claimant_id", lambda v: a.complete_wait_record(key, v)),
        _ids("cancel_wait_record", "correlation_key", lambda v: a.cancel_wait_record(v)),
        _ids(
            "get_wait_record", "namespace", lambda v: a.get_wait_record(key, namespace=v),
            required=False,
        ),
        _ids(
            "claim_wait_record", "namespace", lambda v: a.claim_wait_record(key, "c", namespace=v),
            required=False,
        ),
        _ids(
            "complete_wait_record", "namespace",
            lambda v: a.complete_wait_record(key, "c", namespace=v), required=False,
        ),
        _ids(
            "cancel_wait_record", "namespace", lambda v: a.cancel_wait_record(key, namespace=v),
            required=False,
        ),
        _ids("cancel_workflow", "stack_id", lambda v: a.cancel_workflow(v)),
        _ids(
            "cancel_workflow", "namespace", lambda v: a.cancel_workflow(s.stack, v),
            required=False,
        ),
    ]  # fmt: skip
    return calls


def _cache_and_context_calls(ctx: CheckContext, s: _State) -> list[Awaitable[None]]:
    a = ctx.backend.adapter
    calls: list[Awaitable[None]] = []
    if C.STEP_CACHE in s.caps:
        calls += [
            _ids("get_cached_step", "key", lambda v: a.get_cached_step(v)),
            _ids("set_cached_step", "key", lambda v: a.set_cached_step(v, 1, 60_000)),
            _ms("set_cached_step", "ttl_ms", lambda v: a.set_cached_step(s.cache, 1, v)),
            _rejects(
                "set_cached_step(non-JSON value)",
                "value",
                lambda: a.set_cached_step(s.cache, {1, 2}, 60_000),
            ),
            _rejects(
                "set_cached_step(object())",
                "value",
                lambda: a.set_cached_step(s.cache, _NotJson(), 60_000),
            ),
        ]
    if C.CONTEXT_STREAM in s.caps:

        def event(**fields: Any) -> ContextChangeEvent:
            base: dict[str, Any] = {
                "stack_id": s.stack,
                "step_id": "p",
                "key": "k",
                "value": 1,
                "timestamp": ctx.now_ms(),
            }
            return ContextChangeEvent(**{**base, **fields})

        calls += [
            *_record_ids(
                "on_context_change", lambda v: event(stack_id=v), "stack_id",
                lambda e: a.on_context_change(e),
            ),
            *_record_ids(
                "on_context_change", lambda v: event(step_id=v), "step_id",
                lambda e: a.on_context_change(e),
            ),
            *_record_ids(
                "on_context_change", lambda v: event(namespace=v), "namespace",
                lambda e: a.on_context_change(e),
            ),
            _rejects("on_context_change('x')", "event", lambda: a.on_context_change("x")),  # type: ignore[arg-type]
            _ids("get_context_changes", "stack_id", lambda v: a.get_context_changes(v, "p")),
            _ids("get_context_changes", "step_id", lambda v: a.get_context_changes(s.stack, v)),
            _ids(
                "get_context_changes", "namespace",
                lambda v: a.get_context_changes(s.stack, "p", v), required=False,
            ),
        ]  # fmt: skip
    if C.CACHE_EVENTS in s.caps:
        calls.append(
            _rejects("on_cache_event('x')", "event", lambda: a.on_cache_event("x"))  # type: ignore[arg-type]
        )
    if C.WORKFLOW_LOCK in s.caps:
        calls += [
            _ids("with_workflow_lock", "stack_id", lambda v: a.with_workflow_lock(v, s.action)),
            _ms(
                "with_workflow_lock",
                "timeout_ms",
                lambda v: a.with_workflow_lock(s.stack, s.action, timeout_ms=v),
            ),
        ]
    return calls


def _coordination_calls(ctx: CheckContext, s: _State) -> list[Awaitable[None]]:
    b = ctx.backend
    calls: list[Awaitable[None]] = []
    if C.IDEMPOTENCY in s.caps and b.idempotency is not None:
        idem = b.idempotency
        calls += [
            _ids("idempotency.claim", "key", lambda v: idem.claim(v)),
            _ms("idempotency.claim", "ttl_ms", lambda v: idem.claim(s.idem, v)),
            _ids("idempotency.complete", "key", lambda v: idem.complete(v, 1)),
            _ms("idempotency.complete", "ttl_ms", lambda v: idem.complete(s.idem, 1, v)),
            _rejects(
                "idempotency.complete(non-JSON)",
                "result",
                lambda: idem.complete(s.idem, _NotJson()),
            ),
            _ids("idempotency.fail", "key", lambda v: idem.fail(v)),
            _ids("idempotency.get_result", "key", lambda v: idem.get_result(v)),
            _ids("idempotency.get", "key", lambda v: idem.get(v)),
        ]
    if C.LOCKS in s.caps and b.lock is not None:
        lock = b.lock
        calls += [
            _ids("lock.acquire", "lock_key", lambda v: lock.acquire(v, 60_000)),
            _ms("lock.acquire", "ttl_ms", lambda v: lock.acquire(ctx.id("free"), v)),
            _ids(
                "lock.acquire",
                "custom_token",
                lambda v: lock.acquire(ctx.id("free"), 60_000, v),
                required=False,
            ),
            _ids("lock.release", "lock_key", lambda v: lock.release(v, s.token)),
            _ids("lock.release", "token", lambda v: lock.release(s.lock, v)),
            _ids("lock.extend", "lock_key", lambda v: lock.extend(v, s.token, 60_000)),
            _ids("lock.extend", "token", lambda v: lock.extend(s.lock, v, 60_000)),
            _ms("lock.extend", "ttl_ms", lambda v: lock.extend(s.lock, s.token, v)),
            _ms("lock.with_lock", "ttl_ms", lambda v: lock.with_lock(ctx.id("free"), s.action, v)),
        ]
    if C.NONCES in s.caps and b.nonces is not None:
        nonces = b.nonces
        calls += [
            _ids("nonces.claim", "key", lambda v: nonces.claim(v, 60)),
            _each(
                "nonces.claim",
                "ttl_seconds",
                lambda v: nonces.claim(ctx.id("fresh-nonce"), v),
                BAD_SECONDS,
                required=True,
            ),
        ]
    return calls
