"""The in-memory reference backend against the contract's rules, directly.

The contract suite drives every backend against this one; these tests pin the
reference itself, so a bug it shared with a backend would still be caught.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import siglo
from siglo import MISSING, Checkpoint, CheckpointConflictError, ManualClock, WaitRecord
from siglo.adapter import CAPABILITY_METHODS
from siglo_memory import MemoryStorageAdapter

HOSTILE = [
    "a:b",
    "*",
    "{tag}",
    "'\"",
    "%_\\",
    "with space",
    "ünïcødé ✓ 日本",
    "x" * 1000,
    "siglo:ns:checkpoint:x",
]


def cp(stack_id: str = "s", revision: int = 1, **fields: Any) -> Checkpoint:
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=1, **fields)


@pytest.fixture
def adapter(memory: siglo.Backend) -> MemoryStorageAdapter:
    assert isinstance(memory.adapter, MemoryStorageAdapter)
    return memory.adapter


@pytest.mark.rule("checkpoint.roundtrip", "checkpoint.missing", "checkpoint.occ.expected")
async def test_save_and_get(adapter: MemoryStorageAdapter) -> None:
    assert await adapter.get_checkpoint("s") is None
    first = cp(contexts={"a": {"b": [1, None]}}, metadata={"m": True})
    await adapter.save_checkpoint(first, expected_revision=0)
    assert await adapter.get_checkpoint("s") == first
    await adapter.save_checkpoint(cp(revision=2), expected_revision=1)
    stored = await adapter.get_checkpoint("s")
    assert stored is not None and stored.revision == 2


@pytest.mark.rule("checkpoint.occ.conflict", "checkpoint.occ.monotonic")
async def test_conflicts_change_nothing(adapter: MemoryStorageAdapter) -> None:
    await adapter.save_checkpoint(cp(revision=5, contexts={"a": {"v": 1}}))
    before = await adapter.get_checkpoint("s")
    with pytest.raises(CheckpointConflictError) as info:
        await adapter.save_checkpoint(cp(revision=9), expected_revision=4)
    assert (info.value.current_revision, info.value.expected_revision) == (5, 4)
    for stale in (5, 3):
        with pytest.raises(CheckpointConflictError) as info:
            await adapter.save_checkpoint(cp(revision=stale))
        assert info.value.expected_revision is None
        assert info.value.current_revision == 5
    with pytest.raises(CheckpointConflictError) as info:
        await adapter.save_checkpoint(cp("fresh", revision=2), expected_revision=1)
    assert info.value.current_revision is None
    assert await adapter.get_checkpoint("s") == before
    assert await adapter.get_checkpoint("fresh") is None


@pytest.mark.rule("checkpoint.occ.atomic")
async def test_concurrent_cas_has_exactly_one_winner(adapter: MemoryStorageAdapter) -> None:
    await adapter.save_checkpoint(cp(revision=1))

    async def writer(i: int) -> int:
        await asyncio.sleep(0)
        await adapter.save_checkpoint(cp(revision=2, metadata={"w": i}), expected_revision=1)
        return i

    results = await asyncio.gather(*(writer(i) for i in range(32)), return_exceptions=True)
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1
    assert all(isinstance(r, CheckpointConflictError) for r in results if not isinstance(r, int))
    stored = await adapter.get_checkpoint("s")
    assert stored is not None and stored.metadata == {"w": winners[0]}


@pytest.mark.rule("checkpoint.namespace.isolation", "checkpoint.namespace.fallback")
async def test_namespaces(adapter: MemoryStorageAdapter) -> None:
    await adapter.save_checkpoint(cp(revision=1, namespace="A"))
    await adapter.save_checkpoint(cp(revision=7, namespace="B"))
    a, b = await adapter.get_checkpoint("s", "A"), await adapter.get_checkpoint("s", "B")
    assert a is not None and a.revision == 1
    assert b is not None and b.revision == 7
    assert await adapter.get_checkpoint("s") is None
    assert await adapter.get_checkpoint("s", "C") is None
    await adapter.save_checkpoint(cp(revision=3))
    fallback = await adapter.get_checkpoint("s", "C")
    assert fallback is not None and fallback.namespace is None
    assert await adapter.get_checkpoint("s", "C", fallback=False) is None


@pytest.mark.rule("checkpoint.expiry.hidden", "checkpoint.expiry.clean")
async def test_expiry(adapter: MemoryStorageAdapter, clock: ManualClock) -> None:
    now = clock.now_ms()
    await adapter.save_checkpoint(cp("short", expires_at=now + 100))
    await adapter.save_checkpoint(cp("long", expires_at=now + 10_000))
    await adapter.save_checkpoint(cp("forever"))
    clock.advance(100)
    assert await adapter.get_checkpoint("short") is None
    # The expired stack counts as having no checkpoint.
    await adapter.save_checkpoint(cp("short", revision=1), expected_revision=0)
    clock.advance(10_000)
    assert await adapter.clean_expired_checkpoints() == 1
    assert await adapter.clean_expired_checkpoints() == 0
    assert await adapter.get_checkpoint("forever") is not None


@pytest.mark.rule("ids.hostile")
@pytest.mark.parametrize("ident", HOSTILE)
async def test_hostile_ids_are_data(adapter: MemoryStorageAdapter, ident: str) -> None:
    await adapter.save_checkpoint(cp(ident, namespace=ident))
    await adapter.save_checkpoint(cp(ident + "*", revision=2))
    got = await adapter.get_checkpoint(ident, ident)
    assert got is not None and got.revision == 1
    await adapter.set_cached_step(ident, ident)
    assert await adapter.get_cached_step(ident) == ident
    assert await adapter.get_cached_step(ident[:-1] or "?") is MISSING


@pytest.mark.rule("input.rejected")
async def test_bad_input_is_rejected_and_changes_nothing(adapter: MemoryStorageAdapter) -> None:
    await adapter.save_checkpoint(cp(revision=1))
    bad_calls = [
        adapter.save_checkpoint(cp(revision=1), expected_revision=1),
        adapter.save_checkpoint(cp(revision=2), expected_revision=-1),
        adapter.save_checkpoint("not a checkpoint"),  # type: ignore[arg-type]
        adapter.save_checkpoint(cp(""), expected_revision=0),
        adapter.get_checkpoint("a\x00b"),
        adapter.set_cached_step("k", {1, 2}),
        adapter.set_cached_step("k", 1, ttl_ms=0),
        adapter.set_cached_step("k", 1, ttl_ms=1.5),  # type: ignore[arg-type]
        adapter.save_wait_record(WaitRecord(correlation_key="", stack_id="s")),
        adapter.claim_wait_record("k", lease_ms=-5),
    ]
    for call in bad_calls:
        with pytest.raises(siglo.InvalidArgumentError):
            await call
    stored = await adapter.get_checkpoint("s")
    assert stored is not None and stored.revision == 1
    assert await adapter.get_cached_step("k") is MISSING


@pytest.mark.rule("wait.roundtrip", "wait.by-stack", "wait.checkpoint-fallback")
async def test_wait_lookup(adapter: MemoryStorageAdapter) -> None:
    first = WaitRecord(correlation_key="k1", stack_id="s", created_at=1)
    second = WaitRecord(correlation_key="k2", stack_id="s", created_at=2)
    await adapter.save_wait_record(first)
    await adapter.save_wait_record(second)
    assert await adapter.get_wait_record("k1") == first
    assert await adapter.get_wait_record("s") == second
    claimed = await adapter.claim_wait_record("k2", "me")
    assert await adapter.get_wait_record("s") == claimed
    embedded = WaitRecord(correlation_key="kx", stack_id="other")
    await adapter.save_checkpoint(cp("other", metadata={"waitRecord": embedded.to_wire()}))
    assert await adapter.get_wait_record("other") == embedded
    assert await adapter.get_wait_record("nothing") is None


@pytest.mark.rule("wait.claim.once", "wait.claim.refused", "wait.complete.claimant")
async def test_wait_lifecycle(adapter: MemoryStorageAdapter, clock: ManualClock) -> None:
    await adapter.save_wait_record(
        WaitRecord(correlation_key="k", stack_id="s", event_payload={"old": 1})
    )
    results = await asyncio.gather(
        *(adapter.claim_wait_record("k", f"c{i}", event_payload={"n": i}) for i in range(16))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    won = winners[0]
    assert won.status == "claimed"
    assert won.claimant_id is not None
    assert won.claimed_at == clock.now_ms()
    assert won.lease_expires_at == clock.now_ms() + adapter.claim_lease_ms
    assert won.event_payload == {"n": int(won.claimant_id[1:])}
    # The claimant re-claiming renews; others are refused.
    clock.advance(10)
    again = await adapter.claim_wait_record("k", won.claimant_id)
    assert again is not None and again.lease_expires_at == clock.now_ms() + adapter.claim_lease_ms
    assert again.event_payload == won.event_payload  # no payload passed: kept
    with pytest.raises(siglo.WaitRecordClaimError):
        await adapter.complete_wait_record("k", "somebody-else")
    assert await adapter.get_wait_record("k") == again
    await adapter.complete_wait_record("k", won.claimant_id)
    done = await adapter.get_wait_record("k")
    assert done is not None and done.status == "completed"
    assert await adapter.claim_wait_record("k", "late") is None
    with pytest.raises(siglo.WaitRecordClaimError):
        await adapter.complete_wait_record("k", won.claimant_id)
    with pytest.raises(siglo.WaitRecordClaimError):
        await adapter.complete_wait_record("missing", "x")
    assert await adapter.claim_wait_record("missing") is None
    generated = WaitRecord(correlation_key="g", stack_id="s")
    await adapter.save_wait_record(generated)
    claimed = await adapter.claim_wait_record("g")
    assert claimed is not None and claimed.claimant_id


@pytest.mark.rule("wait.claim.expired", "wait.claim.lease", "wait.retention")
async def test_wait_deadlines_leases_and_retention(
    adapter: MemoryStorageAdapter, clock: ManualClock
) -> None:
    now = clock.now_ms()
    await adapter.save_wait_record(
        WaitRecord(correlation_key="d", stack_id="s", expires_at=now + 50)
    )
    clock.advance(50)
    assert await adapter.claim_wait_record("d", "a") is None
    late = await adapter.claim_wait_record("d", "a", allow_expired=True, lease_ms=100)
    assert late is not None and late.claimant_id == "a"
    assert await adapter.claim_wait_record("d", "b", allow_expired=True) is None
    clock.advance(100)  # a's lease ran out: a died
    taken = await adapter.claim_wait_record("d", "b", allow_expired=True)
    assert taken is not None and taken.claimant_id == "b"
    await adapter.save_wait_record(WaitRecord(correlation_key="r", stack_id="s"), ttl_ms=10)
    clock.advance(10)
    assert await adapter.get_wait_record("r") is None
    assert await adapter.claim_wait_record("r") is None
    assert await adapter.cancel_wait_record("r") is False


@pytest.mark.rule("wait.cancel", "wait.cancel-workflow")
async def test_cancel(adapter: MemoryStorageAdapter) -> None:
    waits = [("a", "s", None), ("b", "s", None), ("c", "s", "t"), ("d", "x", None)]
    for key, stack, ns in waits:
        await adapter.save_wait_record(
            WaitRecord(correlation_key=key, stack_id=stack, namespace=ns)
        )
    await adapter.claim_wait_record("b", "me")
    await adapter.save_checkpoint(cp("s", revision=4))
    await adapter.save_checkpoint(cp("s", revision=2, namespace="t", status="completed"))
    await adapter.cancel_workflow("s")
    # Wait records are read in the namespace of their stack (rule wait.namespace.isolation).
    ns_of = {key: ns for key, _, ns in waits}
    statuses = {
        k: (await adapter.get_wait_record(k, namespace=ns_of[k])).status  # type: ignore[union-attr]
        for k in "abcd"
    }
    assert statuses == {"a": "cancelled", "b": "cancelled", "c": "waiting", "d": "waiting"}
    stored = await adapter.get_checkpoint("s")
    assert stored is not None and (stored.status, stored.revision) == ("cancelled", 5)
    await adapter.cancel_workflow("s", "t")
    done = await adapter.get_checkpoint("s", "t")
    assert done is not None and (done.status, done.revision) == ("completed", 2)
    assert (await adapter.get_wait_record("c", namespace="t")).status == "cancelled"  # type: ignore[union-attr]
    assert await adapter.get_wait_record("c") is None  # not from the un-namespaced space
    assert await adapter.cancel_wait_record("d") is True
    assert await adapter.cancel_wait_record("d") is False


@pytest.mark.rule("lock.workflow.exclusive", "lock.workflow.release-on-error")
async def test_workflow_lock(adapter: MemoryStorageAdapter) -> None:
    inside = 0
    overlaps = 0

    async def action() -> int:
        nonlocal inside, overlaps
        inside += 1
        overlaps += inside > 1
        await asyncio.sleep(0.001)
        inside -= 1
        return 7

    results = await asyncio.gather(*(adapter.with_workflow_lock("s", action) for _ in range(20)))
    assert results == [7] * 20
    assert overlaps == 0

    async def boom() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await adapter.with_workflow_lock("s", boom)
    assert await adapter.with_workflow_lock("s", action) == 7


@pytest.mark.rule("cache.roundtrip", "cache.falsy-hit", "cache.miss", "cache.expiry")
async def test_step_cache(adapter: MemoryStorageAdapter, clock: ManualClock) -> None:
    assert await adapter.get_cached_step("never") is MISSING
    for i, value in enumerate([None, 0, False, "", [], {}, {"value": 1}, [1, {"a": None}]]):
        await adapter.set_cached_step(f"k{i}", value, ttl_ms=100)
        got = await adapter.get_cached_step(f"k{i}")
        assert got == value and type(got) is type(value)
    clock.advance(100)
    assert await adapter.get_cached_step("k0") is MISSING


@pytest.mark.rule("cache-events.accepted")
async def test_cache_events_do_not_touch_state(adapter: MemoryStorageAdapter) -> None:
    await adapter.on_cache_event(siglo.CacheEvent(type="miss", key="k", timestamp=1))
    assert await adapter.get_cached_step("k") is MISSING
    assert len(adapter.cache_events) == 1


@pytest.mark.rule("idempotency.claim.once", "idempotency.complete", "idempotency.fail")
async def test_idempotency(memory: siglo.Backend) -> None:
    store = memory.idempotency
    assert store is not None
    states = await asyncio.gather(*(store.claim("k") for _ in range(16)))
    assert sorted(states).count("claimed") == 1
    assert await store.get_result("k") is MISSING
    await store.fail("k")
    assert await store.claim("k") == "claimed"
    await store.complete("k", None)
    assert await store.claim("k") == "completed"
    assert await store.get_result("k") is None
    assert await store.get("k") is None
    await store.fail("k")
    assert await store.claim("k") == "completed"


@pytest.mark.rule("idempotency.expiry", "nonce.claim.once", "nonce.expiry", "lock.expiry")
async def test_coordination_expiry(memory: siglo.Backend, clock: ManualClock) -> None:
    assert memory.idempotency is not None and memory.nonces is not None
    assert memory.lock is not None
    assert await memory.idempotency.claim("k", ttl_ms=10) == "claimed"
    claims = await asyncio.gather(*(memory.nonces.claim("n", 0.01) for _ in range(8)))
    assert claims.count(True) == 1
    held = await memory.lock.acquire("L", ttl_ms=10)
    clock.advance(10)
    assert await memory.idempotency.claim("k") == "claimed"
    assert await memory.nonces.claim("n", 0.01) is True
    taken = await memory.lock.acquire("L", ttl_ms=10)
    assert taken.acquired and taken.fencing_token is not None
    assert held.fencing_token is not None and taken.fencing_token > held.fencing_token
    assert await memory.lock.release("L", held.token) is False


@pytest.mark.rule(
    "lock.acquire.exclusive",
    "lock.release.token",
    "lock.extend.token",
    "lock.fencing",
    "lock.token",
    "lock.with-lock",
)
async def test_lock(memory: siglo.Backend, clock: ManualClock) -> None:
    lock = memory.lock
    assert lock is not None
    results = await asyncio.gather(*(lock.acquire("L", 1_000) for _ in range(16)))
    holders = [r for r in results if r.acquired]
    assert len(holders) == 1
    holder = holders[0]
    assert holder.token.startswith(f"lock_{clock.now_ms()}_")
    assert len(holder.token) == len(f"lock_{clock.now_ms()}_") + 32
    assert len({r.token for r in results}) == 16
    assert await lock.extend("L", "wrong", 5_000) is False
    assert await lock.extend("L", holder.token, 5_000) is True
    clock.advance(2_000)
    assert not (await lock.acquire("L")).acquired
    assert await lock.release("L", "wrong") is False
    assert await lock.release("L", holder.token) is True
    custom = await lock.acquire("L", 1_000, custom_token="mine")
    assert custom.token == "mine" and custom.fencing_token == 2
    with pytest.raises(siglo.LockNotAcquiredError):
        await lock.with_lock("L", lambda: asyncio.sleep(0))
    await lock.release("L", "mine")

    async def body() -> str:
        assert not (await lock.acquire("L")).acquired
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        await lock.with_lock("L", body)
    assert (await lock.acquire("L")).acquired


@pytest.mark.rule("capability.declared")
async def test_every_declared_method_is_implemented(adapter: MemoryStorageAdapter) -> None:
    for capability, methods in CAPABILITY_METHODS.items():
        assert adapter.supports(capability)
        for method in methods:
            assert adapter.implements(method)


async def test_named_memory_stores_are_shared_and_each_connection_closes_alone() -> None:
    """memory://NAME stands in for a server: every connect reaches the same data, and
    closing one connection leaves the others working (contract rule backend.closed)."""
    first = siglo.connect("memory://shared-test-store")
    second = siglo.connect("memory://shared-test-store")
    assert second is not first
    assert first.url_shares_storage
    await first.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
    assert (await second.adapter.get_checkpoint("s")).revision == 1  # type: ignore[union-attr]
    assert (await first.require_lock().acquire("L")).acquired
    assert not (await second.require_lock().acquire("L")).acquired  # one lock table
    assert await first.require_idempotency().claim("k") == "claimed"
    assert await second.require_idempotency().claim("k") == "in-progress"
    assert await first.require_nonces().claim("n", 60)
    assert not await second.require_nonces().claim("n", 60)
    await first.aclose()
    with pytest.raises(siglo.StorageAdapterError, match="is closed"):
        await first.adapter.get_checkpoint("s")
    await second.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=2, timestamp=1))
    third = siglo.connect("memory://shared-test-store")
    assert (await third.adapter.get_checkpoint("s")).revision == 2  # type: ignore[union-attr]
    assert (await third.require_lock().release("L", "not-the-token")) is False
    private = siglo.connect("memory://")
    assert not private.url_shares_storage
    assert await private.adapter.get_checkpoint("s") is None
