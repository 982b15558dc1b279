"""Every adapter rule of docs/contract.md, run on Redis and on the memory reference.

Each test takes ``backend``, parametrised over ``memory`` and ``redis``: the same
operations must give the same observable results on both. Time rules use real, short
TTLs (Redis expires keys by its own clock; it has no ``clock`` capability). The random
differential program at the end drives both backends with identical operations.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo import MISSING, CacheEvent, Checkpoint, ContextChangeEvent, WaitRecord
from siglo.adapter import CAPABILITY_METHODS
from siglo.errors import (
    CheckpointConflictError,
    InvalidArgumentError,
    LockNotAcquiredError,
    WaitRecordClaimError,
)
from siglo_redis import isolated

rule = pytest.mark.rule


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[siglo.Backend]:
    if request.param == "memory":
        async with siglo.connect("memory://") as memory:
            yield memory
        return
    require_redis()
    async with isolated(REDIS_URL) as redis_backend:
        yield redis_backend


def cp(stack_id: str = "s", revision: int = 1, **fields: Any) -> Checkpoint:
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=now_ms(), **fields)


# -- checkpoints ---------------------------------------------------------------------------


@rule("checkpoint.roundtrip", "checkpoint.missing")
async def test_checkpoint_roundtrip(backend: siglo.Backend) -> None:
    a = backend.adapter
    assert await a.get_checkpoint("s") is None
    full = Checkpoint.from_wire(
        {
            **cp(workflow_id="w", status="waiting", chains=["x"], contexts={"x": {"k": [1]}},
                 metadata={"m": {}}, expires_at=now_ms() + 60_000).to_wire(),
            "unknownField": {"kept": [1, 2]},
        }
    )  # fmt: skip
    await a.save_checkpoint(full)
    got = await a.get_checkpoint("s")
    assert got == full and got is not None and got.extra == {"unknownField": {"kept": [1, 2]}}
    assert await a.get_checkpoint("other") is None


@rule("checkpoint.occ.expected", "checkpoint.occ.conflict", "checkpoint.occ.monotonic")
async def test_checkpoint_compare_and_set(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_checkpoint(cp(revision=1), expected_revision=0)  # absent counts as 0
    await a.save_checkpoint(cp(revision=2), expected_revision=1)
    with pytest.raises(CheckpointConflictError) as err:
        await a.save_checkpoint(cp(revision=5, status="failed"), expected_revision=3)
    assert (err.value.stack_id, err.value.current_revision, err.value.expected_revision) == (
        "s", 2, 3,
    )  # fmt: skip
    with pytest.raises(CheckpointConflictError) as err:
        await a.save_checkpoint(cp("fresh", revision=5), expected_revision=3)
    assert err.value.current_revision is None and err.value.expected_revision == 3
    for revision in (1, 2):
        with pytest.raises(CheckpointConflictError) as err:
            await a.save_checkpoint(cp(revision=revision, status="failed"))
        assert err.value.current_revision == 2 and err.value.expected_revision is None
    stored = await a.get_checkpoint("s")
    assert stored is not None and stored.revision == 2 and stored.status == "running"
    await a.save_checkpoint(cp(revision=7))
    assert (await a.get_checkpoint("s")).revision == 7  # type: ignore[union-attr]


@rule("checkpoint.occ.atomic")
async def test_checkpoint_concurrent_saves_one_winner(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_checkpoint(cp(revision=1))

    async def save(i: int) -> int:
        try:
            await a.save_checkpoint(cp(revision=2, metadata={"writer": i}), expected_revision=1)
        except CheckpointConflictError:
            return -1
        return i

    results = await asyncio.gather(*(save(i) for i in range(25)))
    winners = [r for r in results if r >= 0]
    assert len(winners) == 1
    stored = await a.get_checkpoint("s")
    assert stored is not None and stored.metadata == {"writer": winners[0]}


@rule("checkpoint.namespace.isolation", "checkpoint.namespace.fallback")
async def test_checkpoint_namespaces(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_checkpoint(cp(revision=5, namespace="A"))
    await a.save_checkpoint(cp(revision=1, namespace="B"))  # independent revision
    assert (await a.get_checkpoint("s", "A")).revision == 5  # type: ignore[union-attr]
    assert (await a.get_checkpoint("s", "B")).revision == 1  # type: ignore[union-attr]
    assert await a.get_checkpoint("s") is None  # never a namespaced one without a namespace
    assert await a.get_checkpoint("s", "C") is None
    await a.save_checkpoint(cp(revision=3))
    fallback = await a.get_checkpoint("s", "C")
    assert fallback is not None and fallback.namespace is None and fallback.revision == 3
    assert await a.get_checkpoint("s", "C", fallback=False) is None
    assert (await a.get_checkpoint("s", "A")).revision == 5  # type: ignore[union-attr]


@rule("checkpoint.expiry.hidden", "checkpoint.expiry.clean")
async def test_checkpoint_expiry(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_checkpoint(cp("gone", revision=4, expires_at=now_ms() - 1))
    assert await a.get_checkpoint("gone") is None
    await a.save_checkpoint(cp("gone", revision=1), expected_revision=0)  # no checkpoint left
    await a.save_checkpoint(cp("soon", revision=4, expires_at=now_ms() + 80))
    await a.save_checkpoint(cp("live", revision=1, expires_at=now_ms() + 60_000))
    assert await a.get_checkpoint("soon") is not None
    await asyncio.sleep(0.15)
    assert await a.get_checkpoint("soon") is None
    await a.save_checkpoint(cp("soon", revision=1), expected_revision=0)
    removed = await a.clean_expired_checkpoints()
    assert removed >= 0
    assert await a.get_checkpoint("live") is not None


# -- wait records --------------------------------------------------------------------------


def wr(key: str = "k", stack_id: str = "s", **fields: Any) -> WaitRecord:
    return WaitRecord(correlation_key=key, stack_id=stack_id, **fields)


@rule("wait.roundtrip", "wait.by-stack", "wait.checkpoint-fallback")
async def test_wait_lookup(backend: siglo.Backend) -> None:
    a = backend.adapter
    assert await a.get_wait_record("k") is None
    record = wr(step_id="st", event_type="paid", event_payload={"a": [1]}, metadata={"m": 1})
    await a.save_wait_record(record)
    assert await a.get_wait_record("k") == record
    await a.save_wait_record(wr("k2", event_type="later"))
    latest = await a.get_wait_record("s")
    assert latest is not None and latest.correlation_key == "k2"
    await a.claim_wait_record("k2", "c")
    latest = await a.get_wait_record("s")
    assert latest is not None and latest.status == "claimed"  # current state
    replaced = wr(event_type="replaced")
    await a.save_wait_record(replaced)
    assert await a.get_wait_record("k") == replaced
    assert (await a.get_wait_record("s")).correlation_key == "k"  # type: ignore[union-attr]
    # A correlation key that is also another stack's id: the record of that key wins.
    await a.save_wait_record(wr("x", "other"))
    await a.save_wait_record(wr("y", "x"))
    assert (await a.get_wait_record("x")).correlation_key == "x"  # type: ignore[union-attr]
    embedded = {"correlationKey": "e", "stackId": "cp", "status": "waiting"}
    await a.save_checkpoint(cp("cp", metadata={"waitRecord": embedded}))
    assert (await a.get_wait_record("cp")).to_wire() == embedded  # type: ignore[union-attr]
    await a.save_checkpoint(cp("cp2", namespace="N", metadata={"waitRecord": embedded}))
    assert await a.get_wait_record("cp2") is None


@rule("wait.claim.once", "wait.claim.refused", "wait.claim.expired")
async def test_wait_claims(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_wait_record(wr(event_payload={"stored": 1}))
    results = await asyncio.gather(*(a.claim_wait_record("k", f"c{i}") for i in range(20)))
    won = [r for r in results if r is not None]
    assert len(won) == 1
    claimed = won[0]
    assert claimed.status == "claimed" and claimed.claimed_at is not None
    assert claimed.lease_expires_at is not None and claimed.event_payload == {"stored": 1}
    assert await a.claim_wait_record("k", "intruder") is None
    again = await a.claim_wait_record("k", claimed.claimant_id, event_payload=None)
    assert again is not None and again.event_payload is None  # re-claim renews
    assert await a.claim_wait_record("missing") is None
    generated = await a.save_wait_record(wr("g")) or await a.claim_wait_record("g")
    assert generated is not None and generated.claimant_id
    await a.save_wait_record(wr("late", expires_at=now_ms() - 1))
    assert await a.claim_wait_record("late", "c") is None
    late = await a.claim_wait_record("late", "c", allow_expired=True, event_payload=[])
    assert late is not None and late.event_payload == []
    await a.complete_wait_record("late", "c")
    assert await a.claim_wait_record("late", "c", allow_expired=True) is None
    await a.save_wait_record(wr("gone"))
    assert await a.cancel_wait_record("gone")
    assert await a.claim_wait_record("gone", "c") is None


@rule("wait.claim.lease")
async def test_wait_claim_lease(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_wait_record(wr())
    assert await a.claim_wait_record("k", "dies", lease_ms=60) is not None
    assert await a.claim_wait_record("k", "other") is None
    await asyncio.sleep(0.1)
    taken = await a.claim_wait_record("k", "other")
    assert taken is not None and taken.claimant_id == "other"


@rule("wait.complete.claimant", "wait.cancel")
async def test_wait_complete_and_cancel(backend: siglo.Backend) -> None:
    a = backend.adapter
    with pytest.raises(WaitRecordClaimError):
        await a.complete_wait_record("k", "c")
    await a.save_wait_record(wr())
    with pytest.raises(WaitRecordClaimError):
        await a.complete_wait_record("k", "c")  # waiting, not claimed
    await a.claim_wait_record("k", "c")
    with pytest.raises(WaitRecordClaimError):
        await a.complete_wait_record("k", "someone")
    assert (await a.get_wait_record("k")).status == "claimed"  # type: ignore[union-attr]
    await a.complete_wait_record("k", "c")
    done = await a.get_wait_record("k")
    assert done is not None and done.status == "completed" and done.completed_at is not None
    assert not await a.cancel_wait_record("k")
    assert not await a.cancel_wait_record("missing")
    await a.save_wait_record(wr("w"))
    await a.save_wait_record(wr("c"))
    await a.claim_wait_record("c", "x")
    assert await a.cancel_wait_record("w") and await a.cancel_wait_record("c")
    assert not await a.cancel_wait_record("w")
    assert (await a.get_wait_record("c")).status == "cancelled"  # type: ignore[union-attr]


@rule("wait.cancel-workflow")
async def test_cancel_workflow(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_wait_record(wr("w1", namespace="N"))
    await a.save_wait_record(wr("w2", namespace="N"))
    await a.claim_wait_record("w2", "c")
    await a.save_wait_record(wr("w3", namespace="N"))
    await a.claim_wait_record("w3", "c")
    await a.complete_wait_record("w3", "c")
    await a.save_wait_record(wr("other-ns", namespace="M"))
    await a.save_wait_record(wr("no-ns"))
    await a.save_wait_record(wr("other-stack", "t", namespace="N"))
    await a.save_checkpoint(cp(revision=4, namespace="N"))
    await a.save_checkpoint(cp(revision=2))
    await a.save_checkpoint(cp("done", revision=2, namespace="N", status="completed"))
    await a.cancel_workflow("s", "N")
    status = {k: (await a.get_wait_record(k)).status for k in  # type: ignore[union-attr]
              ("w1", "w2", "w3", "other-ns", "no-ns", "other-stack")}  # fmt: skip
    assert status == {
        "w1": "cancelled", "w2": "cancelled", "w3": "completed",
        "other-ns": "waiting", "no-ns": "waiting", "other-stack": "waiting",
    }  # fmt: skip
    cancelled = await a.get_checkpoint("s", "N")
    assert cancelled is not None and (cancelled.status, cancelled.revision) == ("cancelled", 5)
    untouched = await a.get_checkpoint("s")
    assert untouched is not None and (untouched.status, untouched.revision) == ("running", 2)
    await a.cancel_workflow("s", "N")  # already cancelled: left alone
    assert (await a.get_checkpoint("s", "N")).revision == 5  # type: ignore[union-attr]
    await a.cancel_workflow("done", "N")
    done = await a.get_checkpoint("done", "N")
    assert done is not None and (done.status, done.revision) == ("completed", 2)
    await a.cancel_workflow("nothing-here")


@rule("wait.retention")
async def test_wait_retention(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_wait_record(wr(), ttl_ms=60)
    await a.save_wait_record(wr("c"), ttl_ms=60)
    await a.claim_wait_record("c", "x")
    await asyncio.sleep(0.12)
    assert await a.get_wait_record("k") is None and await a.get_wait_record("s") is None
    assert await a.claim_wait_record("k", "x") is None
    with pytest.raises(WaitRecordClaimError):
        await a.complete_wait_record("c", "x")
    assert not await a.cancel_wait_record("k")


# -- workflow lock -------------------------------------------------------------------------


@rule("lock.workflow.exclusive", "lock.workflow.release-on-error")
async def test_workflow_lock(backend: siglo.Backend) -> None:
    a = backend.adapter
    inside = 0
    peak = 0

    async def action(i: int) -> int:
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(0.005)
        inside -= 1
        return i

    results = await asyncio.gather(
        *(a.with_workflow_lock("s", lambda i=i: action(i)) for i in range(10))
    )
    assert results == list(range(10)) and peak == 1

    async def boom() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await a.with_workflow_lock("s", boom)
    assert (
        await a.with_workflow_lock("s", lambda: asyncio.sleep(0, "free"), timeout_ms=500) == "free"
    )

    async def hold() -> None:
        await asyncio.sleep(0.3)

    holder = asyncio.create_task(a.with_workflow_lock("t", hold))
    await asyncio.sleep(0.05)
    with pytest.raises(LockNotAcquiredError):
        await a.with_workflow_lock("t", lambda: asyncio.sleep(0), timeout_ms=50)
    await holder


# -- step cache, context stream, cache events ---------------------------------------------


@rule("cache.roundtrip", "cache.falsy-hit", "cache.miss", "cache.expiry")
async def test_step_cache(backend: siglo.Backend) -> None:
    a = backend.adapter
    assert await a.get_cached_step("k") is MISSING
    values: list[Any] = [None, 0, False, "", [], {}, 1.5, "s", [None, {}], {"value": 1},
                         {"value": None}, {"value": 1, "other": 2}, {"a": {"b": []}}]  # fmt: skip
    for value in values:
        await a.set_cached_step("k", value)
        got = await a.get_cached_step("k")
        assert got == value and type(got) is type(value)
    await a.set_cached_step("short", "v", 60)
    await asyncio.sleep(0.12)
    assert await a.get_cached_step("short") is MISSING


@rule("context.stream", "cache-events.accepted")
async def test_context_stream(backend: siglo.Backend) -> None:
    a = backend.adapter

    def ev(key: str, value: Any = None, op: str = "set", **kw: Any) -> ContextChangeEvent:
        return ContextChangeEvent(stack_id="s", step_id="p", key=key, value=value, op=op,  # type: ignore[arg-type]
                                  timestamp=now_ms(), **kw)  # fmt: skip

    await a.on_context_change(ev("a", 1))
    await a.on_context_change(ev("b", {"x": None}))
    await a.on_context_change(ev("a", [2]))
    await a.on_context_change(ev("b", op="delete"))
    await a.on_context_change(ev("c", None))
    await a.on_context_change(ev("a", "ns", namespace="N"))
    await a.on_context_change(ContextChangeEvent(stack_id="s:p", step_id="q", key="z", value=1,
                                                 timestamp=now_ms()))  # fmt: skip
    assert await a.get_context_changes("s", "p") == {"a": [2], "c": None}
    assert await a.get_context_changes("s", "p", "N") == {"a": "ns"}
    assert await a.get_context_changes("s", "p:q") == {}
    assert await a.get_context_changes("s:p", "q") == {"z": 1}
    await a.on_cache_event(CacheEvent(type="hit", key="k", timestamp=now_ms()))
    assert await a.get_cached_step("k") is MISSING


# -- idempotency, locks, nonces --------------------------------------------------------------


@rule("idempotency.claim.once", "idempotency.complete", "idempotency.fail", "idempotency.expiry")
async def test_idempotency(backend: siglo.Backend) -> None:
    store = backend.idempotency
    assert store is not None
    states = await asyncio.gather(*(store.claim("k") for _ in range(20)))
    assert sorted(states).count("claimed") == 1 and states.count("in-progress") == 19
    assert await store.get_result("k") is MISSING and await store.get("k") is MISSING
    await store.complete("k", None)
    assert await store.claim("k") == "completed"
    assert await store.get_result("k") is None and await store.get("k") is None
    await store.fail("k")
    assert await store.claim("k") == "completed"  # a completed result survives fail()
    assert await store.claim("f") == "claimed"
    await store.fail("f", RuntimeError("x"))
    assert await store.claim("f") == "claimed"
    await store.fail("never-claimed")
    assert await store.claim("t", ttl_ms=60) == "claimed"
    await store.complete("t2", {"r": 1}, ttl_ms=60)
    await asyncio.sleep(0.12)
    assert await store.claim("t") == "claimed"
    assert await store.get_result("t2") is MISSING


@rule("lock.acquire.exclusive", "lock.release.token", "lock.extend.token", "lock.expiry",
      "lock.fencing", "lock.token", "lock.with-lock")  # fmt: skip
async def test_lock(backend: siglo.Backend) -> None:
    lock = backend.lock
    assert lock is not None
    results = await asyncio.gather(*(lock.acquire("L", 5_000) for _ in range(20)))
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    held = winners[0]
    assert re.fullmatch(r"lock_\d+_[0-9a-f]{32}", held.token)
    assert len({r.token for r in results}) == 20
    assert not await lock.release("L", "wrong") and not await lock.extend("L", "wrong", 100)
    assert not (await lock.acquire("L")).acquired
    assert await lock.extend("L", held.token, 60)
    await asyncio.sleep(0.12)
    second = await lock.acquire("L", 5_000, custom_token="mine")
    assert second.acquired and second.token == "mine"
    assert second.fencing_token is not None and held.fencing_token is not None
    assert second.fencing_token > held.fencing_token
    assert not await lock.release("L", held.token)
    assert await lock.release("L", "mine") and not await lock.release("L", "mine")
    assert not await lock.extend("L", "mine", 100)
    fences = [(await lock.acquire("F", 50)).fencing_token for _ in range(1)]
    await lock.release("F", "nobody")
    assert fences[0] is not None

    async def work() -> str:
        assert not (await lock.acquire("W")).acquired
        return "done"

    assert await lock.with_lock("W", work) == "done"
    assert (await lock.acquire("W", 50)).acquired  # released afterwards

    async def fail() -> None:
        raise ValueError("x")

    await asyncio.sleep(0.1)
    with pytest.raises(ValueError, match="x"):
        await lock.with_lock("W", fail)
    ran = False

    async def never() -> None:
        nonlocal ran
        ran = True

    await lock.acquire("W", 5_000)
    with pytest.raises(LockNotAcquiredError):
        await lock.with_lock("W", never)
    assert not ran


@rule("nonce.claim.once", "nonce.expiry")
async def test_nonces(backend: siglo.Backend) -> None:
    nonces = backend.nonces
    assert nonces is not None
    results = await asyncio.gather(*(nonces.claim("sig", 300) for _ in range(20)))
    assert results.count(True) == 1
    assert await nonces.claim("short", 0.06)
    assert not await nonces.claim("short", 0.06)
    await asyncio.sleep(0.12)
    assert await nonces.claim("short", 0.06)


# -- input, ids, capabilities -----------------------------------------------------------------


@rule("input.rejected")
async def test_bad_input_rejected_and_nothing_changes(backend: siglo.Backend) -> None:
    a = backend.adapter
    await a.save_checkpoint(cp(revision=1))
    await a.save_wait_record(wr())
    bad_calls = [
        lambda: a.save_checkpoint("nope"),  # type: ignore[arg-type]
        lambda: a.save_checkpoint(cp(revision=1), expected_revision=1),
        lambda: a.save_checkpoint(cp(revision=2), expected_revision=-1),
        lambda: a.get_checkpoint(""),
        lambda: a.get_checkpoint("a\x00b"),
        lambda: a.get_checkpoint("s", 5),  # type: ignore[arg-type]
        lambda: a.save_wait_record(wr(), ttl_ms=0),
        lambda: a.save_wait_record(wr(""), ttl_ms=10),
        lambda: a.claim_wait_record("k", "c", lease_ms=1.5),  # type: ignore[arg-type]
        lambda: a.claim_wait_record("k", "c", event_payload={1, 2}),
        lambda: a.complete_wait_record("k", ""),
        lambda: a.set_cached_step("k", object()),
        lambda: a.set_cached_step("k", 1, ttl_ms=-5),
        lambda: a.get_cached_step(""),
        lambda: a.on_context_change("x"),  # type: ignore[arg-type]
        lambda: a.on_cache_event("x"),  # type: ignore[arg-type]
        lambda: a.with_workflow_lock("", lambda: asyncio.sleep(0)),
        lambda: backend.lock.acquire("L", 0),  # type: ignore[union-attr]
        lambda: backend.lock.acquire("", 10),  # type: ignore[union-attr]
        lambda: backend.idempotency.complete("k", {1}),  # type: ignore[union-attr]
        lambda: backend.idempotency.claim("k", ttl_ms=True),  # type: ignore[union-attr]
        lambda: backend.nonces.claim("n", 0),  # type: ignore[union-attr]
        lambda: backend.nonces.claim("n", float("nan")),  # type: ignore[union-attr]
    ]
    for call in bad_calls:
        with pytest.raises(InvalidArgumentError):
            await call()
    assert (await a.get_checkpoint("s")).revision == 1  # type: ignore[union-attr]
    assert (await a.get_wait_record("k")).status == "waiting"  # type: ignore[union-attr]
    assert await a.get_cached_step("k") is MISSING
    assert await backend.idempotency.claim("k") == "claimed"  # type: ignore[union-attr]
    assert await backend.nonces.claim("n", 1)  # type: ignore[union-attr]


HOSTILE = [":", "a:b", "*", "?", "[x]", "{t}", "}{", "'\"", "%", "%3A", "_", "\\", " s p ",
           "ünï©ødé", "x" * 1000, "wait", "checkpoint:x", "a:checkpoint:b"]  # fmt: skip


@rule("ids.hostile")
async def test_hostile_ids(backend: siglo.Backend) -> None:
    a = backend.adapter
    for i, ident in enumerate(HOSTILE):
        await a.save_checkpoint(cp(ident, revision=i + 1))
        await a.save_checkpoint(cp(ident, revision=i + 100, namespace=ident))
        await a.save_wait_record(wr(ident, ident, event_payload=i))
        await a.set_cached_step(ident, i)
        await a.on_context_change(ContextChangeEvent(stack_id=ident, step_id=ident, key=ident,
                                                     value=i, timestamp=now_ms()))  # fmt: skip
    assert await a.get_checkpoint("x") is None and await a.get_cached_step("a") is MISSING
    for i, ident in enumerate(HOSTILE):
        assert (await a.get_checkpoint(ident)).revision == i + 1  # type: ignore[union-attr]
        got = await a.get_checkpoint(ident, ident, fallback=False)
        assert got is not None and got.revision == i + 100
        assert (await a.get_wait_record(ident)).event_payload == i  # type: ignore[union-attr]
        assert await a.get_cached_step(ident) == i
        assert await a.get_context_changes(ident, ident) == {ident: i}
    lock, nonces, idem = backend.lock, backend.nonces, backend.idempotency
    assert lock is not None and nonces is not None and idem is not None
    for ident in HOSTILE:
        assert (await lock.acquire(ident, 5_000)).acquired
        assert await nonces.claim(ident, 60)
        assert await idem.claim(ident) == "claimed"


@rule("capability.declared")
async def test_declared_capabilities_are_implemented(backend: siglo.Backend) -> None:
    spec = siglo.plugins.get_registry().backend(backend.name)
    a = backend.adapter
    for capability in spec.capabilities:
        assert a.supports(capability) or capability.value in (
            "idempotency",
            "locks",
            "nonces",
            "clock",
        )
        for method in CAPABILITY_METHODS.get(capability, ()):
            assert a.implements(method), f"{spec.name} lacks {method}"
    assert backend.idempotency is not None and backend.lock is not None
    assert backend.nonces is not None


# -- a random differential program ----------------------------------------------------------


def _normalise(value: Any) -> Any:
    """Results with the wall-clock times each backend stamps itself taken out."""
    if isinstance(value, Checkpoint):
        return ("cp", value.replace(timestamp=0).to_wire())
    if isinstance(value, WaitRecord):
        return ("wait", value.replace(claimed_at=None, lease_expires_at=None,
                                      completed_at=None).to_wire())  # fmt: skip
    if isinstance(value, BaseException):
        return ("raised", type(value).__name__)
    return value


async def _apply(b: siglo.Backend, op: str, args: dict[str, Any]) -> Any:
    a = b.adapter
    idem, nonces = b.idempotency, b.nonces
    assert idem is not None and nonces is not None
    sid, ns, key = args["sid"], args["ns"], args["key"]
    if op in ("save", "save_exp"):
        expires_at = 1 if op == "save_exp" else None
        checkpoint = Checkpoint(
            stack_id=sid,
            namespace=ns,
            revision=args["revision"],
            timestamp=1,
            expires_at=expires_at,
        )
        expected = args["expected"] if op == "save" else None
        return await a.save_checkpoint(checkpoint, expected_revision=expected)
    if op == "get":
        return await a.get_checkpoint(sid, ns, fallback=args["fallback"])
    if op == "wsave":
        record = WaitRecord(correlation_key=key, stack_id=sid, namespace=ns)
        return await a.save_wait_record(record)
    if op == "wget":
        return await a.get_wait_record(key)
    if op == "claim":
        return await a.claim_wait_record(key, args["claimant"], event_payload=args["payload"])
    if op == "complete":
        return await a.complete_wait_record(key, args["claimant"])
    if op == "cancel":
        return await a.cancel_wait_record(key)
    if op == "cancel_wf":
        return await a.cancel_workflow(sid, ns)
    if op == "cset":
        return await a.set_cached_step(key, args["value"])
    if op == "cget":
        return await a.get_cached_step(key)
    if op == "idem":
        return await idem.claim(key)
    if op == "idem_done":
        return await idem.complete(key, args["value"])
    if op == "idem_fail":
        return await idem.fail(key)
    assert op == "nonce"
    return await nonces.claim(key, 60)


OPS = ["save", "save_exp", "get", "wsave", "wget", "claim", "complete", "cancel", "cancel_wf",
       "cset", "cget", "idem", "idem_done", "idem_fail", "nonce"]  # fmt: skip


@rule("checkpoint.occ.expected", "checkpoint.occ.monotonic", "checkpoint.namespace.isolation",
      "wait.claim.refused", "wait.cancel-workflow", "cache.roundtrip")  # fmt: skip
@pytest.mark.parametrize("seed", range(4))
async def test_random_program_matches_memory(seed: int) -> None:
    require_redis()
    await run_random_program(REDIS_URL, seed)


async def run_random_program(url: str, seed: int) -> None:
    """Drive memory and the Redis at ``url`` with one random program; compare each result."""
    rng = random.Random(seed)
    ids = ["a", "b", "a:b", "{a}"]
    async with siglo.connect("memory://") as memory, isolated(url) as redis_backend:
        seen: set[str] = set()
        for step in range(250):
            op = rng.choice(OPS)
            args = {
                "sid": rng.choice(ids),
                "ns": rng.choice([None, "N", "wait"]),
                "key": rng.choice(ids),
                "revision": rng.randint(0, 6),
                "expected": rng.choice([None, rng.randint(0, 5)]),
                "fallback": rng.random() < 0.5,
                "claimant": rng.choice(["c1", "c2"]),
                "payload": rng.choice([MISSING, None, 0, {"p": 1}]),
                "value": rng.choice([None, 0, "", [], {}, {"value": 2}, [1, "x"]]),
            }
            results = []
            for b in (memory, redis_backend):
                try:
                    result: Any = await _apply(b, op, args)
                except siglo.SigloError as exc:
                    result = exc
                results.append(_normalise(result))
            seen.add(f"{op}:{type(results[0]).__name__}")
            assert results[0] == results[1], f"step {step}: {op} {args}"
        # The program reached both outcomes of the interesting operations.
        assert {"save:tuple", "save:NoneType", "claim:tuple", "claim:NoneType"} <= seen


@rule("checkpoint.occ.expected", "checkpoint.occ.monotonic", "cache.roundtrip")
async def test_huge_revisions_and_ttls(backend: siglo.Backend) -> None:
    a = backend.adapter
    big = 2**60
    await a.save_checkpoint(cp(revision=big))
    with pytest.raises(CheckpointConflictError):
        await a.save_checkpoint(cp(revision=big))
    await a.save_checkpoint(cp(revision=big + 1), expected_revision=big)
    with pytest.raises(CheckpointConflictError) as err:
        await a.save_checkpoint(cp(revision=big + 3), expected_revision=big)
    assert err.value.current_revision == big + 1
    assert (await a.get_checkpoint("s")).revision == big + 1  # type: ignore[union-attr]
    # As doubles, 2**53 and 2**53 + 1 are equal; as revisions they are not.
    await a.save_checkpoint(cp("t", revision=2**53))
    await a.save_checkpoint(cp("t", revision=2**53 + 1))
    await a.save_checkpoint(cp("t", revision=2**53 + 2), expected_revision=2**53 + 1)
    await a.save_checkpoint(cp("far", revision=1, expires_at=2**62))
    assert await a.get_checkpoint("far") is not None
    await a.save_wait_record(wr(), ttl_ms=2**62)
    assert await a.claim_wait_record("k", "c", lease_ms=2**40) is not None
    await a.set_cached_step("k", 1, ttl_ms=2**62)
    assert await a.get_cached_step("k") == 1
    lock, idem, nonces = backend.lock, backend.idempotency, backend.nonces
    assert lock is not None and idem is not None and nonces is not None
    held = await lock.acquire("L", 2**62)
    assert held.acquired and await lock.extend("L", held.token, 2**62)
    assert await idem.claim("i", ttl_ms=2**62) == "claimed"
    await idem.complete("i", 1, ttl_ms=2**62)
    assert await nonces.claim("n", 2.0**50)
