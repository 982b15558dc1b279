"""Clients other than siglo's own: a seed-§4-minimal client, URLs, unix sockets, plugins."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, RedisServer, require_redis
from ports import free_port

import siglo
from siglo import Checkpoint, StorageAdapterError
from siglo_redis import RedisLock, RedisNonceStore, RedisStorageAdapter
from siglo_redis.adapter import RedisStorageAdapter as AdapterClass

rule = pytest.mark.rule


class SeedMinimalClient:
    """Only the methods seed 001 §4 requires, without ``eval`` — on a real server."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def get(self, key: str) -> Any:
        return await self._client.get(key)

    async def set(self, key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._client.set(key, value, *args, **kwargs)

    async def delete(self, *keys: str) -> Any:
        return await self._client.delete(*keys)

    async def hset(self, key: str, *args: Any, **kwargs: Any) -> Any:
        return await self._client.hset(key, *args, **kwargs)

    async def hgetall(self, key: str) -> Any:
        return await self._client.hgetall(key)

    async def pexpire(self, key: str, ms: int) -> Any:
        return await self._client.pexpire(key, ms)


@pytest.fixture
async def minimal(redis_backend: siglo.Backend) -> tuple[SeedMinimalClient, str]:
    adapter = redis_backend.adapter
    assert isinstance(adapter, AdapterClass)
    return SeedMinimalClient(adapter.client), adapter.keys.prefix


@rule("lock.release.token", "nonce.claim.once")
async def test_eval_less_client_follows_the_seeds_rules(
    minimal: tuple[SeedMinimalClient, str],
) -> None:
    client, prefix = minimal
    strict = RedisLock(client, f"{prefix}lock:", strict_atomicity=True)
    held = await strict.acquire("L", 5_000)
    assert held.acquired and held.fencing_token is None  # no eval, no incr: no fence
    with pytest.raises(StorageAdapterError, match=r"client\.eval is required"):
        await strict.release("L", held.token)
    lenient = RedisLock(client, f"{prefix}lock:")
    assert not await lenient.release("L", "other")
    assert await lenient.extend("L", held.token, 5_000)
    assert await lenient.release("L", held.token)  # GET then DEL
    assert (await lenient.acquire("L")).acquired
    nonces = RedisNonceStore(client, key_prefix=f"{prefix}wh:dedup:")
    assert await nonces.claim("n", 60) and not await nonces.claim("n", 60)
    adapter = RedisStorageAdapter(client, key_prefix=prefix)
    # The context stream needs no script: the seed's HSET then PEXPIRE.
    event = siglo.ContextChangeEvent(stack_id="s", step_id="p", key="f", value=[1], timestamp=1)
    await adapter.on_context_change(event)
    assert await adapter.get_context_changes("s", "p") == {"f": [1]}
    with pytest.raises(StorageAdapterError, match="no eval"):
        await adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))


async def test_classes_built_from_a_url_close_their_client(redis_backend: siglo.Backend) -> None:
    prefix = redis_backend.adapter.keys.prefix  # type: ignore[attr-defined]
    adapter = siglo.RedisStorageAdapter(REDIS_URL, key_prefix=prefix)
    lock = siglo.RedisLock(REDIS_URL, f"{prefix}lock:")
    await adapter.set_cached_step("k", 1)
    assert await redis_backend.adapter.get_cached_step("k") == 1
    assert (await lock.acquire("L")).acquired
    await adapter.aclose()
    await lock.aclose()


async def test_a_passed_client_is_never_closed(redis_backend: siglo.Backend) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS_URL)
    prefix = redis_backend.adapter.keys.prefix  # type: ignore[attr-defined]
    async with siglo.connect(REDIS_URL, client=client, prefix=prefix) as backend:
        await backend.adapter.set_cached_step("k", 2)
    assert await client.ping()  # still open
    # The backend refuses all the same: it was closed (redis-py would reconnect).
    with pytest.raises(StorageAdapterError, match="storage adapter 'redis' is closed"):
        await backend.adapter.get_cached_step("k")
    await client.aclose()


async def test_a_class_closed_alone_refuses_and_keeps_a_passed_client(
    redis_backend: siglo.Backend,
) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS_URL)
    prefix = redis_backend.adapter.keys.prefix  # type: ignore[attr-defined]
    adapter = RedisStorageAdapter(client, key_prefix=prefix)
    lock = RedisLock(client, f"{prefix}lock:")
    for part in (adapter, lock):
        await part.aclose()
        await part.aclose()  # twice is harmless
        assert part.closed
    with pytest.raises(StorageAdapterError, match="is closed"):
        await adapter.set_cached_step("k", 3)
    with pytest.raises(StorageAdapterError, match="RedisLock is closed"):
        await lock.acquire("L")
    assert await redis_backend.adapter.get_cached_step("k") is siglo.MISSING  # not stored
    assert await client.ping()  # a passed-in client stays open
    await client.aclose()


@pytest.fixture
def unix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    socket_path = tmp_path_factory.mktemp("sock") / "redis.sock"
    server = RedisServer(free_port(30010, 30100), "--unixsocket", str(socket_path)).start()
    try:
        yield f"unix://{socket_path}?db=0"
    finally:
        server.stop()


async def test_unix_socket_url(unix_server: str) -> None:
    async with siglo.connect(unix_server) as backend:
        assert backend.name == "redis"
        await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        assert (await backend.adapter.get_checkpoint("s")).revision == 1  # type: ignore[union-attr]


@rule("plugins.discovery")
def test_registered_as_the_redis_plugin() -> None:
    spec = siglo.plugins.get_registry().for_url("rediss://example:6380/0")
    assert spec.name == "redis" and spec.plugin == "redis"
    assert spec.schemes == ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
    assert siglo.plugins.get_registry().for_url("redis+sentinel://h:1/svc/0") == spec
    assert spec.extra == "redis" and spec.multiprocess and spec.isolated is not None
    assert "clock" not in {c.value for c in spec.capabilities}
    assert {c.value for c in spec.capabilities} == {
        "checkpoints", "wait_records", "workflow_lock", "step_cache", "context_stream",
        "cache_events", "idempotency", "locks", "nonces", "listing", "deletion", "due_waits",
        "payload_scan",
    }  # fmt: skip
    assert siglo.RedisStorageAdapter is RedisStorageAdapter


@rule("input.rejected")
def test_bad_options_are_rejected() -> None:
    require_redis()
    for url, options in [
        ("redis://127.0.0.1:6379/0?checkpoint_ttl_ms=abc", {}),
        ("redis://127.0.0.1:6379/0?record_context_changes=maybe", {}),
        ("redis://127.0.0.1:6379/0", {"cache_ttl_ms": 0}),
        ("redis://127.0.0.1:6379/0", {"bogus": 1}),
        ("redis://127.0.0.1:6379/0?prefix=a{b", {}),
    ]:
        with pytest.raises(siglo.InvalidArgumentError):
            siglo.connect(url, **options)


async def test_backend_url_carries_the_options(redis_backend: siglo.Backend) -> None:
    prefix = redis_backend.adapter.keys.prefix  # type: ignore[attr-defined]
    async with siglo.connect(
        REDIS_URL, prefix=prefix, checkpoint_ttl_ms=None, record_context_changes=False
    ) as first:
        assert "checkpoint_ttl_ms=none" in first.url and "record_context_changes=false" in first.url
        async with siglo.connect(first.url) as second:
            adapter = second.adapter
            assert isinstance(adapter, RedisStorageAdapter)
            assert adapter.keys.prefix == prefix and adapter.checkpoint_ttl_ms is None
            assert adapter.record_context_changes is False
            await first.adapter.set_cached_step("shared", [1])
            assert await adapter.get_cached_step("shared") == [1]


async def test_isolated_removes_every_key_however_many() -> None:
    # 200,000 keys: one UNLINK per key, all under one 10 s command timeout, left most of
    # a million-checkpoint scale run behind. Each SCAN page now goes in one call.
    import redis.asyncio

    from siglo_redis import isolated

    require_redis()
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        async with isolated(REDIS_URL) as backend:
            prefix = backend.adapter.keys.prefix  # type: ignore[attr-defined]
            async with client.pipeline(transaction=False) as pipe:
                for i in range(200_000):
                    pipe.set(f"{prefix}checkpoint:s{i}", b"{}")
                await pipe.execute()
            assert await client.exists(f"{prefix}checkpoint:s199999") == 1
        assert [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)] == []
    finally:
        await client.aclose()


async def test_a_passed_client_that_decodes_replies_works_and_keeps_its_settings(
    redis_backend: siglo.Backend,
) -> None:
    """siglo sends through its own client over a passed redis-py client's pool
    (docs/backends/redis.md): the pool's settings, ``decode_responses`` here, are the
    application's, and siglo reads its replies either way; the client is left as it was."""
    import redis.asyncio

    from siglo_redis.sent_once import SentOnceRedis

    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    prefix = redis_backend.adapter.keys.prefix  # type: ignore[attr-defined]
    try:
        async with siglo.connect(REDIS_URL, client=client, prefix=prefix) as backend:
            assert isinstance(backend.adapter.client, SentOnceRedis)  # type: ignore[attr-defined]
            assert backend.adapter.client.connection_pool is client.connection_pool  # type: ignore[attr-defined]
            a, lock, nonces = backend.adapter, backend.lock, backend.nonces
            assert lock is not None and nonces is not None
            await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
            loaded = await a.get_checkpoint("s")
            assert loaded is not None and loaded.revision == 1
            await a.set_cached_step("k", {"v": "é"})
            assert await a.get_cached_step("k") == {"v": "é"}
            assert (await lock.acquire("L")).acquired
            assert await nonces.claim("n", 60) is True
        assert isinstance(await client.get(f"{prefix}checkpoint:s"), str)  # still decodes
    finally:
        await client.aclose()
