"""The reference model's read-only views (``model``): what the suite's state machines read
beside the public API — entries stored but expired included, and nothing changed by
reading them."""

from __future__ import annotations

import dataclasses

import pytest

import siglo
from siglo import Checkpoint, ManualClock, WaitRecord
from siglo_memory import MemoryIdempotencyStore, MemoryLock, MemoryNonceStore
from siglo_memory.adapter import MemoryStorageAdapter


@pytest.fixture
def adapter(memory: siglo.Backend) -> MemoryStorageAdapter:
    assert isinstance(memory.adapter, MemoryStorageAdapter)
    return memory.adapter


async def test_checkpoints_expired_ones_included(
    adapter: MemoryStorageAdapter, clock: ManualClock
) -> None:
    now = clock.now_ms()
    cp = Checkpoint(stack_id="s", namespace="n", revision=1, timestamp=1, expires_at=now + 100)
    await adapter.save_checkpoint(cp)
    model = adapter.model
    stored = model.checkpoint(("n", "s"))
    assert stored is not None and stored.value == cp and stored.gone_at == now + 100
    assert model.live_checkpoint(("n", "s"), now) == cp
    assert model.checkpoint((None, "s")) is None  # no namespace fallback in the view
    assert model.expired_checkpoints(now) == []
    clock.advance(100)
    now = clock.now_ms()
    assert model.live_checkpoint(("n", "s"), now) is None
    stored = model.checkpoint(("n", "s"))
    assert stored is not None and not stored.live(now)
    assert model.expired_checkpoints(now) == [("n", "s")]
    assert await adapter.clean_expired_checkpoints() == 1
    assert model.checkpoint(("n", "s")) is None  # the view is live: it sees the clean-up


async def test_wait_records_and_the_stack_index(
    adapter: MemoryStorageAdapter, clock: ManualClock
) -> None:
    for ns in (None, "n"):
        record = WaitRecord(correlation_key="c", stack_id="s", namespace=ns, event_type="e")
        await adapter.save_wait_record(record, ttl_ms=50)
    model = adapter.model
    assert model.latest_wait_of_stack("s") == "c"
    assert model.latest_wait_of_stack(("n", "s")) == ("n", "c")
    assert model.latest_wait_of_stack("c") is None
    namespaced = model.live_wait_record(("n", "c"), clock.now_ms())
    assert namespaced is not None and namespaced.namespace == "n"
    claimed = await adapter.claim_wait_record("c", "me")
    assert model.live_wait_record("c", clock.now_ms()) == claimed
    clock.advance(50)
    assert model.live_wait_record("c", clock.now_ms()) is None
    stored = model.wait_record("c")
    assert stored is not None and stored.value == claimed and not stored.live(clock.now_ms())
    assert model.wait_record("never") is None


async def test_cached_steps_come_back_as_new_objects(
    adapter: MemoryStorageAdapter, clock: ManualClock
) -> None:
    await adapter.set_cached_step("k", {"a": [1]}, 100)
    stored = adapter.model.cached_step("k")
    assert stored is not None and stored.value == {"a": [1]}
    stored.value["a"].append(2)  # a decoded copy: the store keeps its own
    with pytest.raises(dataclasses.FrozenInstanceError):
        stored.gone_at = None  # type: ignore[misc]
    clock.advance(100)
    assert await adapter.get_cached_step("k") is siglo.MISSING
    expired = adapter.model.cached_step("k")
    assert expired is not None and expired.value == {"a": [1]} and not expired.live(clock.now_ms())


async def test_expiring_keys_are_shown_and_never_purged(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    store, lock, nonces = memory.idempotency, memory.lock, memory.nonces
    assert isinstance(store, MemoryIdempotencyStore)
    assert isinstance(lock, MemoryLock)
    assert isinstance(nonces, MemoryNonceStore)
    now = clock.now_ms()
    assert await store.claim("i", 100) == "claimed"
    assert (await lock.acquire("l", 100)).acquired
    assert await nonces.claim("n", 0.1)
    for model, key in ((store.model, "i"), (lock.model, "l"), (nonces.model, "n")):
        assert model.expires_at(key) == now + 100
        assert model.expires_at("other") is None
        assert not model.lapsed(key, now) and not model.lapsed("other", now + 10**9)
    clock.advance(100)
    now = clock.now_ms()
    for model, key in ((store.model, "i"), (lock.model, "l"), (nonces.model, "n")):
        assert model.lapsed(key, now) and model.lapsed(key, now)  # reading purges nothing
    # A read through the store purges the lapsed key; the view then shows it gone.
    assert await store.get_result("i") is siglo.MISSING
    assert store.model.expires_at("i") is None
