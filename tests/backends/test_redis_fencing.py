"""Redis fencing counters are bounded (issue 11 defect 9): one counter per cluster slot,
not one key per lock key kept forever; a key's fencing tokens still only grow, across
the upgrade from per-key counters too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import siglo
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.keys import fence_key, hash_slot, legacy_fence_key


def prefix_of(backend: siglo.Backend) -> str:
    adapter = backend.adapter
    assert isinstance(adapter, RedisStorageAdapter)
    return adapter.keys.prefix


async def _keys(raw: Any, pattern_prefix: str) -> list[str]:
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in pattern_prefix)
    return [key async for key in raw.scan_iter(match=escaped + "*", count=1000)]


@pytest.mark.rule("lock.fencing")
async def test_fence_counters_do_not_grow_with_lock_keys(
    redis_backend: siglo.Backend,
    raw_redis: Any,
) -> None:
    lock = redis_backend.lock
    assert lock is not None
    p = prefix_of(redis_backend)
    # 300 keys in slots of their own, 300 sharing one slot through a hash tag.
    names = [f"item-{i}" for i in range(300)] + [f"{{tenant}}item-{i}" for i in range(300)]
    last: dict[str, int] = {}
    for round_ in range(2):
        for name in names:
            held = await lock.acquire(name, 60_000)
            assert held.acquired and held.fencing_token is not None
            if round_:
                assert held.fencing_token > last[name]
            last[name] = held.fencing_token
            assert await lock.release(name, held.token)
    fences = await _keys(raw_redis, f"{p}lock-fence:")
    slots = {hash_slot(f"{p}lock:{name}") for name in names}
    assert len(fences) == len(slots) <= 301
    assert not any(name in key for key in fences for name in names)
    # Nothing else is left behind by 1,200 acquire/release cycles.
    assert await _keys(raw_redis, f"{p}lock:") == []


async def test_a_per_key_counter_of_an_older_siglo_is_folded_in(
    redis_backend: siglo.Backend,
    raw_redis: Any,
) -> None:
    lock = redis_backend.lock
    assert lock is not None
    p = prefix_of(redis_backend)
    full = f"{p}lock:daily"
    legacy = legacy_fence_key(f"{p}lock-fence:", "daily", full)
    await raw_redis.set(legacy, 1000)  # as the old acquire script left it
    held = await lock.acquire("daily", 60_000)
    assert held.fencing_token == 1001
    assert await raw_redis.exists(legacy) == 0
    assert int(await raw_redis.get(fence_key(f"{p}lock-fence:", full))) == 1001
    assert await lock.release("daily", held.token)
    again = await lock.acquire("daily", 60_000)
    assert again.fencing_token == 1002


@pytest.mark.rule("lock.fencing")
async def test_a_clean_up_after_a_lock_lapsed_keeps_its_fence(
    redis_backend: siglo.Backend,
) -> None:
    """``siglo clean`` (the adapter's ``clean_expired``) between a lock's expiry and its
    next acquire: Redis dropped the lapsed lock's key itself, the slot's counter stays, so
    the next holder's fencing token is still greater."""
    lock = redis_backend.lock
    assert lock is not None
    held = await lock.acquire("lapsing", 50)
    assert held.acquired and held.fencing_token is not None
    await asyncio.sleep(0.12)
    await redis_backend.adapter.clean_expired()  # type: ignore[attr-defined]
    again = await lock.acquire("lapsing", 60_000)
    assert again.acquired and again.fencing_token is not None
    assert again.fencing_token > held.fencing_token
    assert await lock.release("lapsing", again.token)
