"""What the base classes give a backend so that it implements only what differs: the
workflow lock over any ``Lock`` the adapter provides, and the seed's idempotency claim
from the owned claim (docs/writing-a-backend.md)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from siglo.adapter import Capability, StorageAdapter
from siglo.coordination import IdempotencyStoreBase, OwnedClaimReply
from siglo.errors import CapabilityNotSupportedError, LockNotAcquiredError, StorageAdapterError
from siglo_memory import MemoryLock


class LockedAdapter(StorageAdapter):
    """An adapter whose only capability is the workflow lock, on a real lock."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.WORKFLOW_LOCK})

    def __init__(self, lock: MemoryLock | None) -> None:
        self.workflow_lock = lock
        self.workflow_lock_ttl_ms = 5_000
        self.workflow_lock_timeout_ms = 200


async def test_the_workflow_lock_runs_over_the_lock_the_adapter_provides() -> None:
    lock = MemoryLock()
    adapter = LockedAdapter(lock)
    assert adapter.implements("with_workflow_lock")
    running = 0
    overlaps = 0

    async def action() -> str:
        nonlocal running, overlaps
        running += 1
        overlaps += running > 1
        # Keyed by the stack id, for the adapter's lease: another holder is refused.
        assert not (await lock.acquire("s", 1_000)).acquired
        await asyncio.sleep(0.01)
        running -= 1
        return "done"

    results = await asyncio.gather(*(adapter.with_workflow_lock("s", action) for _ in range(5)))
    assert results == ["done"] * 5 and overlaps == 0
    assert (await lock.acquire("s", 1_000)).acquired  # released after the last action


async def test_the_workflow_lock_waits_the_adapters_timeout_or_the_callers() -> None:
    lock = MemoryLock()
    adapter = LockedAdapter(lock)
    assert (await lock.acquire("s", 60_000)).acquired
    ran: list[str] = []

    async def action() -> None:
        ran.append("ran")

    loop = asyncio.get_running_loop()
    for timeout_ms, waited_ms in ((None, 200), (50, 50)):
        started = loop.time()
        with pytest.raises(LockNotAcquiredError, match=f"after {waited_ms} ms"):
            await adapter.with_workflow_lock("s", action, timeout_ms=timeout_ms)
        assert loop.time() - started >= waited_ms / 1000 * 0.9
    assert ran == []


async def test_without_a_lock_the_workflow_lock_is_unsupported() -> None:
    adapter = LockedAdapter(None)
    assert not adapter.implements("with_workflow_lock")
    with pytest.raises(CapabilityNotSupportedError, match="with_workflow_lock"):
        await adapter.with_workflow_lock("s", lambda: asyncio.sleep(0))


class OwnedOnly(IdempotencyStoreBase):
    """Implements the owned claim only: the seed's claim comes with it."""

    def __init__(self, reply: OwnedClaimReply = "claimed") -> None:
        self.reply = reply
        self.calls: list[tuple[Any, ...]] = []

    async def _do_claim_owned(
        self, key: str, ttl_ms: int | None, token: str | None, fingerprint: str | None
    ) -> OwnedClaimReply:
        self.calls.append((key, ttl_ms, token, fingerprint))
        return self.reply


class SeedOnly(IdempotencyStoreBase):
    """Written before owners existed: the seed's claim only."""

    async def _do_claim(self, key: str, ttl_ms: int | None) -> Any:
        return "claimed"


async def test_the_seeds_claim_is_the_owned_claim_without_owner_or_fingerprint() -> None:
    store = OwnedOnly()
    assert await store.claim("k", 1_000) == "claimed"
    assert store.calls == [("k", 1_000, None, None)]


async def test_a_mismatch_without_a_fingerprint_is_the_stores_fault() -> None:
    with pytest.raises(StorageAdapterError, match=r"'k'.*OwnedOnly.*mismatch"):
        await OwnedOnly("mismatch").claim("k")


async def test_a_seed_only_store_claims_and_refuses_owners() -> None:
    store = SeedOnly()
    assert await store.claim("k") == "claimed"
    with pytest.raises(CapabilityNotSupportedError, match="claim_owned"):
        await store.claim_owned("k")
    with pytest.raises(CapabilityNotSupportedError, match="claim_owned"):
        await store.claim("k", fingerprint="body")


async def test_a_store_with_neither_claim_says_so() -> None:
    """The two defaults call each other only when the other is the store's own."""
    store = IdempotencyStoreBase()
    with pytest.raises(CapabilityNotSupportedError, match=r"claim\(\)"):
        await store.claim("k")
    with pytest.raises(CapabilityNotSupportedError, match="claim_owned"):
        await store.claim_owned("k")
