"""Contract rules on the SQL backends that need more than the differential test:
concurrent callers (tasks), exact wire bytes, hostile ids, tokens, capabilities."""

from __future__ import annotations

import asyncio
import re

import pytest
from sql_support import KINDS, open_backend

import siglo
from siglo import Checkpoint, ManualClock, WaitRecord
from siglo.adapter import CAPABILITY_METHODS
from siglo.plugins import get_registry

pytestmark = pytest.mark.parametrize("kind", KINDS)

N = 12


async def test_checkpoint_roundtrip_keeps_the_wire_document(kind: str) -> None:
    """checkpoint.roundtrip: every field, unknown wire fields included, byte for byte."""
    async with open_backend(kind) as backend:
        cp = Checkpoint.from_json(
            b'{"version":2,"schemaVersion":"2.0.0","stackId":"s","type":"execution",'
            b'"status":"waiting","revision":3,"chains":["a","b"],"contexts":{"a":{"x":[1,{}]}},'
            b'"timestamp":5,"metadata":{"k":null},"futureField":{"z":1}}'
        )
        await backend.adapter.save_checkpoint(cp)
        got = await backend.adapter.get_checkpoint("s")
        assert got == cp
        assert got is not None
        assert got.extra == {"futureField": {"z": 1}}
        assert got.to_json() == cp.to_json()


async def test_checkpoint_occ_atomic_concurrent_tasks(kind: str) -> None:
    """checkpoint.occ.atomic: N concurrent saves with one expected revision, one winner."""
    async with open_backend(kind) as backend:
        a = backend.adapter
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        saves = [
            a.save_checkpoint(
                Checkpoint(stack_id="s", revision=2, timestamp=1, contexts={"w": {"i": i}}),
                expected_revision=1,
            )
            for i in range(N)
        ]
        results = await asyncio.gather(*saves, return_exceptions=True)
        winners = [i for i, r in enumerate(results) if r is None]
        assert len(winners) == 1
        for r in results:
            if r is not None:
                assert isinstance(r, siglo.CheckpointConflictError)
                assert r.current_revision == 2
                assert r.expected_revision == 1
        stored = await a.get_checkpoint("s")
        assert stored is not None
        assert stored.contexts == {"w": {"i": winners[0]}}


async def test_checkpoint_occ_absent_concurrent_tasks(kind: str) -> None:
    """checkpoint.occ.atomic with an absent checkpoint (expected revision 0)."""
    async with open_backend(kind) as backend:
        a = backend.adapter
        saves = [
            a.save_checkpoint(
                Checkpoint(stack_id="s", revision=1, timestamp=i), expected_revision=0
            )
            for i in range(N)
        ]
        results = await asyncio.gather(*saves, return_exceptions=True)
        assert sum(r is None for r in results) == 1


async def test_wait_claim_once_concurrent_tasks(kind: str) -> None:
    """wait.claim.once: of N concurrent claimants exactly one gets the record."""
    async with open_backend(kind) as backend:
        a = backend.adapter
        await a.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"))
        claims = await asyncio.gather(
            *(a.claim_wait_record("k", f"c{i}", event_payload=i) for i in range(N))
        )
        won = [c for c in claims if c is not None]
        assert len(won) == 1
        stored = await a.get_wait_record("k")
        assert stored == won[0]
        assert stored is not None
        assert stored.event_payload == int(stored.claimant_id[1:])


async def test_wait_claim_lease_takeover(kind: str) -> None:
    """wait.claim.lease and wait.claim.refused: a live lease refuses others, a dead one
    does not; the claimant re-claiming renews."""
    clock = ManualClock(1_000)
    async with open_backend(kind, clock=clock, claim_lease_ms=100) as backend:
        a = backend.adapter
        await a.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"))
        first = await a.claim_wait_record("k", "one")
        assert first is not None
        assert first.lease_expires_at == 1_100
        assert await a.claim_wait_record("k", "two") is None
        clock.advance(50)
        renewed = await a.claim_wait_record("k", "one")
        assert renewed is not None
        assert renewed.lease_expires_at == 1_150
        clock.advance(150)
        taken = await a.claim_wait_record("k", "two", lease_ms=10)
        assert taken is not None
        assert taken.claimant_id == "two"
        with pytest.raises(siglo.WaitRecordClaimError):
            await a.complete_wait_record("k", "one")
        await a.complete_wait_record("k", "two")
        assert await a.claim_wait_record("k", "three") is None


async def test_wait_retention(kind: str) -> None:
    """wait.retention: past its retention a record is never returned, claimed,
    completed or cancelled."""
    clock = ManualClock(1_000)
    async with open_backend(kind, clock=clock) as backend:
        a = backend.adapter
        await a.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"), ttl_ms=10)
        clock.advance(10)
        assert await a.get_wait_record("k") is None
        assert await a.get_wait_record("s") is None
        assert await a.claim_wait_record("k", "c", allow_expired=True) is None
        assert await a.cancel_wait_record("k") is False
        with pytest.raises(siglo.WaitRecordClaimError):
            await a.complete_wait_record("k", "c")


async def test_workflow_lock_exclusive_across_tasks(kind: str) -> None:
    """lock.workflow.exclusive and lock.workflow.release-on-error."""
    async with open_backend(kind) as backend:
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
            *(a.with_workflow_lock("s", lambda i=i: action(i)) for i in range(8))
        )
        assert sorted(results) == list(range(8))
        assert peak == 1

        async def boom() -> None:
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await a.with_workflow_lock("s", boom)
        assert (
            await a.with_workflow_lock("s", lambda: asyncio.sleep(0, "free"), timeout_ms=500)
            == "free"
        )

        async def hold() -> None:
            await asyncio.sleep(0.3)

        holder = asyncio.create_task(a.with_workflow_lock("t", hold))
        await asyncio.sleep(0.05)
        with pytest.raises(siglo.LockNotAcquiredError):
            await a.with_workflow_lock("t", lambda: asyncio.sleep(0), timeout_ms=50)
        await holder


async def test_coordination_concurrent_claims(kind: str) -> None:
    """idempotency.claim.once, lock.acquire.exclusive, nonce.claim.once with N tasks."""
    async with open_backend(kind) as backend:
        assert backend.idempotency
        assert backend.lock
        assert backend.nonces
        claims = await asyncio.gather(*(backend.idempotency.claim("i") for _ in range(N)))
        assert claims.count("claimed") == 1
        assert claims.count("in-progress") == N - 1
        locks = await asyncio.gather(*(backend.lock.acquire("l", 5_000) for _ in range(N)))
        assert sum(r.acquired for r in locks) == 1
        nonces = await asyncio.gather(*(backend.nonces.claim("n", 5) for _ in range(N)))
        assert nonces.count(True) == 1


async def test_lock_tokens_and_fencing(kind: str) -> None:
    """lock.token, lock.fencing, lock.with-lock, lock.expiry."""
    clock = ManualClock(1_000)
    async with open_backend(kind, clock=clock) as backend:
        lock = backend.lock
        assert lock is not None
        first = await lock.acquire("k", 100)
        assert re.fullmatch(r"lock_1000_[0-9a-f]{32}", first.token)
        assert first.fencing_token == 1
        assert (await lock.acquire("k", 100)).acquired is False
        clock.advance(100)
        second = await lock.acquire("k", 100, custom_token="mine")
        assert second.token == "mine"
        assert second.fencing_token == 2
        assert await lock.release("k", first.token) is False
        assert await lock.extend("k", "mine", 500) is True
        clock.advance(400)
        assert (await lock.acquire("k")).acquired is False
        assert await lock.release("k", "mine") is True
        assert await lock.with_lock("k", lambda: asyncio.sleep(0, 7)) == 7
        third = await lock.acquire("k")
        assert third.fencing_token == 4  # with_lock's acquire was the third
        with pytest.raises(siglo.LockNotAcquiredError):
            await lock.with_lock("k", lambda: asyncio.sleep(0))


async def test_hostile_ids(kind: str) -> None:
    """ids.hostile: ids of any characters (and 1,000 of them) are data."""
    ids = ["a:b", "a*", "a?", "[a]", "{a}", "'a'", '"a"', "a%", "a_", "a\\", "a b", "ü日本",
           "😀" * 1000, "x" * 1000, "%", "_"]  # fmt: skip
    async with open_backend(kind) as backend:
        a = backend.adapter
        for i, ident in enumerate(ids):
            cp = Checkpoint(stack_id=ident, namespace=ident, revision=i + 1, timestamp=1)
            await a.save_checkpoint(cp)
            await a.set_cached_step(ident, i)
            await a.save_wait_record(
                WaitRecord(correlation_key=ident, stack_id=ident, namespace=ident)
            )
            assert backend.lock
            assert (await backend.lock.acquire(ident)).acquired
        for i, ident in enumerate(ids):
            got = await a.get_checkpoint(ident, ident, fallback=False)
            assert got is not None
            assert got.revision == i + 1
            assert await a.get_checkpoint(ident) is None
            assert await a.get_cached_step(ident) == i
            record = await a.get_wait_record(ident)
            assert record is not None
            assert record.correlation_key == ident


async def test_bad_input_changes_nothing(kind: str) -> None:
    """input.rejected: an InvalidArgumentError naming the argument; nothing changes."""
    async with open_backend(kind) as backend:
        a = backend.adapter
        cp = Checkpoint(stack_id="s", revision=2, timestamp=1)
        await a.save_checkpoint(cp)
        with pytest.raises(siglo.InvalidArgumentError, match="expected_revision"):
            await a.save_checkpoint(cp.replace(revision=3), expected_revision=5)
        with pytest.raises(siglo.InvalidArgumentError, match="stack_id"):
            await a.get_checkpoint("")
        with pytest.raises(siglo.InvalidArgumentError, match="ttl_ms"):
            await a.set_cached_step("c", 1, ttl_ms=0)
        with pytest.raises(siglo.InvalidArgumentError, match="cached value"):
            await a.set_cached_step("s", object())
        with pytest.raises(siglo.InvalidArgumentError, match="event"):
            await a.on_context_change("nope")  # type: ignore[arg-type]
        assert await a.get_checkpoint("s") == cp
        assert await a.get_cached_step("s") is siglo.MISSING


async def test_capabilities_declared_and_events(kind: str) -> None:
    """capability.declared, cache-events.accepted."""
    async with open_backend(kind) as backend:
        spec = get_registry().for_url(backend.url)
        for cap in spec.capabilities:
            assert cap in {c.value for c in siglo.Capability}
            for method in CAPABILITY_METHODS.get(cap, ()):
                assert backend.adapter.implements(method)
        assert backend.adapter.supports("checkpoints")
        assert backend.adapter.supports("clock")
        event = siglo.CacheEvent(type="hit", key="k", timestamp=1)
        await backend.adapter.on_cache_event(event)
        assert await backend.adapter.get_cached_step("k") is siglo.MISSING


async def test_expected_zero_matches_a_checkpoint_stored_at_revision_zero(kind: str) -> None:
    """checkpoint.occ.expected: a live checkpoint at revision 0 is "revision 0", as an
    absent one is (found by the contract suite's state machine on sqlite://)."""
    async with open_backend(kind) as backend:
        a = backend.adapter
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=0, timestamp=1))
        await a.save_checkpoint(
            Checkpoint(stack_id="s", revision=1, timestamp=2), expected_revision=0
        )
        stored = await a.get_checkpoint("s")
        assert stored is not None
        assert stored.revision == 1
        with pytest.raises(siglo.CheckpointConflictError):
            await a.save_checkpoint(
                Checkpoint(stack_id="s", revision=2, timestamp=3), expected_revision=0
            )
