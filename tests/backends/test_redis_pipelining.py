"""Auto-pipelining (siglo_redis.pipelining) against real Redis servers.

The shared server for the ordinary cases (each test under its own key prefix); a private
server on a loopback port where a connection is killed; the 3-master loopback cluster
for per-node batches.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from _redis_helpers import BUSY_LUA, REDIS_URL, CancelWhenQueued, RedisServer, require_redis
from ports import free_port

import siglo
from siglo import urls
from siglo.checkpoint import Checkpoint
from siglo.errors import InvalidArgumentError, StorageAdapterError
from siglo.unsent import unwritten
from siglo_redis import isolated
from siglo_redis.commands import Commands
from siglo_redis.connect import client_from_url
from siglo_redis.pipelining import AutoPipelinedRedis, AutoPipelinedRedisCluster

# A Lua script that keeps Redis busy for about ARGV[1] milliseconds, then returns 'done'.
_SPIN = """
local t = redis.call('TIME')
local start = t[1] * 1000 + t[2] / 1000
repeat
  t = redis.call('TIME')
until t[1] * 1000 + t[2] / 1000 - start >= tonumber(ARGV[1])
return 'done'
"""


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    require_redis()
    c = client_from_url(REDIS_URL)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def prefix() -> str:
    return f"siglo-test-{uuid.uuid4().hex[:12]}:"


async def _cleanup(client: Any, prefix: str) -> None:
    keys = [k async for k in client.scan_iter(match=prefix + "*")]
    if keys:
        await client.delete(*keys)


async def test_built_clients_pipeline_unless_told_not_to() -> None:
    assert isinstance(client_from_url(REDIS_URL), AutoPipelinedRedis)
    plain = client_from_url(urls.with_options(REDIS_URL, {"auto_pipeline": False}))
    assert not isinstance(plain, AutoPipelinedRedis)
    # A cluster has database 0 only: SIGLO_REDIS_URL may name another (issue 31), so the
    # cluster client is built for database 0 of the same server (nothing connects here).
    cluster_url = urlunsplit(urlsplit(REDIS_URL)._replace(path="/0"))
    assert isinstance(client_from_url(cluster_url, cluster=True), AutoPipelinedRedisCluster)
    with pytest.raises(InvalidArgumentError, match="only database 0"):
        client_from_url(urlunsplit(urlsplit(REDIS_URL)._replace(path="/5")), cluster=True)
    backend = siglo.connect(REDIS_URL, auto_pipeline=False)
    try:
        assert not isinstance(backend.adapter.client, AutoPipelinedRedis)  # type: ignore[attr-defined]
        assert "auto_pipeline=false" in backend.url
    finally:
        await backend.aclose()


async def test_concurrent_calls_share_writes_and_get_their_own_replies(
    client: Any, prefix: str
) -> None:
    try:
        await asyncio.gather(*(client.set(f"{prefix}{i}", f"v{i}") for i in range(200)))
        pipe = client._auto_pipeline
        before = pipe.writes
        got = await asyncio.gather(*(client.get(f"{prefix}{i}") for i in range(200)))
        assert got == [f"v{i}".encode() for i in range(200)]
        # 200 calls issued in one loop turn: one lone write, then one batch.
        assert pipe.writes - before <= 3
    finally:
        await _cleanup(client, prefix)


async def test_sequential_calls_are_written_at_once(client: Any, prefix: str) -> None:
    try:
        await client.set(prefix + "k", "1")
        pipe = client._auto_pipeline
        before = pipe.writes
        for _ in range(20):
            assert await client.get(prefix + "k") == b"1"
        assert pipe.writes - before == 20
    finally:
        await _cleanup(client, prefix)


async def test_an_error_in_the_middle_of_a_batch_fails_only_its_call(
    client: Any, prefix: str
) -> None:
    import redis

    try:
        await client.set(prefix + "s", "text")
        results = await asyncio.gather(
            client.set(prefix + "a", "1"),
            client.hget(prefix + "s", "field"),  # WRONGTYPE
            client.eval("return redis.error_reply('boom')", 0),
            client.incr(prefix + "a"),
            client.get(prefix + "a"),
            return_exceptions=True,
        )
        assert results[0] is True
        assert isinstance(results[1], redis.ResponseError)
        assert "WRONGTYPE" in str(results[1])
        assert isinstance(results[2], redis.ResponseError)
        assert "boom" in str(results[2])
        assert results[3] == 2
        assert results[4] == b"2"
    finally:
        await _cleanup(client, prefix)


async def test_a_call_cancelled_before_its_write_never_runs(client: Any, prefix: str) -> None:
    try:
        await client.set(prefix + "n", "0")
        first = asyncio.ensure_future(client.eval(_SPIN, 0, 50))
        await asyncio.sleep(0.01)  # the spin is written and running
        queued = asyncio.ensure_future(client.incr(prefix + "n"))
        await asyncio.sleep(0)  # queued behind it, not yet written
        queued.cancel()
        assert await first == b"done"
        with pytest.raises(asyncio.CancelledError) as cut:
            await queued
        assert await client.get(prefix + "n") == b"0"
        # Its cancellation says so: a save cut off there stored nothing (siglo.unsent).
        assert unwritten(cut.value)
    finally:
        await _cleanup(client, prefix)


async def test_a_call_cancelled_after_its_write_leaves_the_stream_in_step(
    client: Any, prefix: str
) -> None:
    try:
        await client.set(prefix + "x", "x-value")
        spin = asyncio.ensure_future(client.eval(_SPIN, 0, 80))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        written = asyncio.ensure_future(client.get(prefix + "x"))
        await asyncio.sleep(0.02)  # both written; Redis still spinning
        written.cancel()
        spin.cancel()
        cut = await asyncio.gather(spin, written, return_exceptions=True)
        # Written, it may have run: its cancellation does not say it was not.
        assert [isinstance(c, asyncio.CancelledError) and not unwritten(c) for c in cut] == [
            True,
            True,
        ]
        # The dropped replies were read and discarded: the next calls get their own.
        assert await client.set(prefix + "y", "y-value") is True
        assert await asyncio.gather(client.get(prefix + "y"), client.get(prefix + "x")) == [
            b"y-value",
            b"x-value",
        ]
    finally:
        await _cleanup(client, prefix)


async def test_deadlines_time_out_a_pipelined_call_and_later_calls_still_match(
    client: Any, prefix: str
) -> None:
    commands = Commands(client, command_timeout_ms=30)
    try:
        await client.set(prefix + "k", "v")
        with pytest.raises(StorageAdapterError, match="timed out"):
            await commands.call("EVAL", client.eval(_SPIN, 0, 200))
        await asyncio.sleep(0.3)  # Redis is busy with the spin until then
        late = await asyncio.gather(*(commands.get(prefix + "k") for _ in range(5)))
        assert late == [b"v"] * 5
    finally:
        await _cleanup(client, prefix)


async def test_siglo_backend_under_32_callers_stores_every_checkpoint() -> None:
    require_redis()
    async with isolated(REDIS_URL) as backend:
        adapter = backend.adapter

        async def writer(w: int) -> None:
            for r in range(1, 21):
                cp = Checkpoint(
                    stack_id=f"s{w}", revision=r, timestamp=r, contexts={"c": {"w": w, "r": r}}
                )
                await adapter.save_checkpoint(cp)
                got = await adapter.get_checkpoint(f"s{w}")
                assert got is not None
                assert (got.revision, got.contexts) == (r, {"c": {"w": w, "r": r}})

        await asyncio.gather(*(writer(w) for w in range(32)))
        assert isinstance(adapter.client, AutoPipelinedRedis)  # type: ignore[attr-defined]
        assert adapter.client._auto_pipeline.writes < 32 * 40  # type: ignore[attr-defined]


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port(30100, 30200)).start()
    try:
        yield server
    finally:
        server.stop()


async def _kill_pipeline_connection(client: Any, server: RedisServer) -> None:
    """``CLIENT KILL`` the pipeline's socket, from another connection (own server only)."""
    import redis.asyncio

    conn = client._auto_pipeline._conn
    host, port = conn._writer.get_extra_info("sockname")[:2]
    killer = redis.asyncio.Redis.from_url(server.url)
    try:
        assert await killer.client_kill_filter(_id=None, addr=f"{host}:{port}") == 1
    finally:
        await killer.aclose()


async def test_a_lost_connection_fails_in_flight_calls_and_later_calls_reconnect(
    own_server: RedisServer,
) -> None:
    import redis

    client = client_from_url(own_server.url, retry=None)
    try:
        await client.set("k", "v")
        own_server.pause()  # the calls below are written and never answered
        in_flight = [asyncio.ensure_future(client.get("k")) for _ in range(5)]
        await asyncio.sleep(0.05)
        own_server.kill()
        results = await asyncio.gather(*in_flight, return_exceptions=True)
        assert all(isinstance(r, redis.ConnectionError) for r in results), results
        own_server.start()
        assert await asyncio.gather(*(client.set(f"k{i}", i) for i in range(10))) == [True] * 10
        assert await client.get("k9") == b"9"
    finally:
        await client.aclose()


async def test_a_lost_connection_is_retried_by_the_clients_policy(
    own_server: RedisServer,
) -> None:
    client = client_from_url(own_server.url)  # siglo's default: 3 quick retries
    try:
        await client.set("k", "v")
        await _kill_pipeline_connection(client, own_server)
        assert await asyncio.gather(*(client.get("k") for _ in range(10))) == [b"v"] * 10
    finally:
        await client.aclose()


async def test_a_killed_server_fails_calls_with_storage_adapter_error(
    own_server: RedisServer,
) -> None:
    async with isolated(own_server.url) as backend:
        cp = Checkpoint(stack_id="s", revision=1, timestamp=1, contexts={"c": {}})
        await backend.adapter.save_checkpoint(cp)
        own_server.kill()
        results = await asyncio.gather(
            *(backend.adapter.get_checkpoint("s") for _ in range(8)), return_exceptions=True
        )
        assert all(isinstance(r, StorageAdapterError) for r in results), results
        own_server.start()
        found = await backend.adapter.get_checkpoint("s")
        assert found is None  # a fresh server (no persistence): reached again, empty


@pytest.mark.redis_cluster
async def test_cluster_batches_per_node(cluster_url: str) -> None:
    async with isolated(cluster_url) as backend:
        client = backend.adapter.client  # type: ignore[attr-defined]
        assert isinstance(client, AutoPipelinedRedisCluster)

        async def writer(w: int) -> None:
            for r in range(1, 11):
                cp = Checkpoint(stack_id=f"s{w}", revision=r, timestamp=r, contexts={"c": {}})
                await backend.adapter.save_checkpoint(cp)
                got = await backend.adapter.get_checkpoint(f"s{w}")
                assert got is not None
                assert got.revision == r

        await asyncio.gather(*(writer(w) for w in range(48)))
        pipes = client._node_pipelines
        # 48 stacks hash to every master: one pipeline per node, each batching.
        assert len(pipes) == 3
        assert sum(p.writes for p in pipes.values()) < 48 * 20


def test_commands_are_packed_as_redis_py_packs_them() -> None:
    from redis.asyncio.connection import Connection

    from siglo_redis.pipelining import _Entry, pack

    conn = Connection()
    commands = [
        ("EVALSHA", "a" * 40, 2, "k1", "k2", b"\x00\xff bytes", "", "ünïcode ✓", -5, 2**62),
        ("SET", "k", "v", "PX", 1000),
        ("CONFIG GET", "maxmemory"),  # redis-py splits the name: packed by redis-py
        ("SET", "k", 1.5),  # floats: redis-py's repr
    ]
    entries = [_Entry(c, {}, None) for c in commands]
    chunks, packed = pack(conn, entries)
    assert packed == entries
    assert b"".join(chunks) == b"".join(b"".join(conn.pack_command(*c)) for c in commands)


def test_a_large_argument_is_sent_uncopied() -> None:
    """Past _HIREDIS_MAX_ARG an argument goes out as redis-py sends it: its own chunk, the
    caller's bytes object itself (hiredis would copy it into a new buffer, a fresh
    allocation of its size on every save of a large checkpoint). The wire bytes are the
    same either way."""
    from redis.asyncio.connection import Connection

    from siglo_redis.pipelining import _HIREDIS_MAX_ARG, _Entry, pack

    conn = Connection()
    big = b"x" * (_HIREDIS_MAX_ARG + 1)
    small = b"y" * _HIREDIS_MAX_ARG
    commands = [("EVALSHA", "a" * 40, 1, "k", big, 3), ("EVALSHA", "a" * 40, 1, "k", small, 3)]
    entries = [_Entry(c, {}, None) for c in commands]
    chunks, packed = pack(conn, entries)
    assert packed == entries
    assert any(chunk is big for chunk in chunks)
    assert not any(chunk is small for chunk in chunks)  # up to the cutoff: hiredis packs it
    assert b"".join(chunks) == b"".join(b"".join(conn.pack_command(*c)) for c in commands)


async def test_a_large_checkpoint_round_trips_through_the_pipeline() -> None:
    require_redis()
    big = {"step": {"blob": "z" * 300_000}}
    async with isolated(REDIS_URL) as backend:
        for revision in (1, 2):
            cp = Checkpoint(stack_id="big", revision=revision, timestamp=1, contexts=big)
            await backend.adapter.save_checkpoint(cp, expected_revision=revision - 1)
        got = await backend.adapter.get_checkpoint("big")
        assert got is not None
        assert (got.revision, got.contexts) == (2, big)


async def test_a_command_that_cannot_be_encoded_fails_alone(client: Any, prefix: str) -> None:
    import redis

    try:
        results = await asyncio.gather(
            client.set(prefix + "a", "1"),
            client.set(prefix + "b", True),  # redis-py refuses to encode a bool
            client.get(prefix + "a"),
            return_exceptions=True,
        )
        assert results[0] is True
        assert isinstance(results[1], redis.DataError)
        assert results[2] == b"1"
    finally:
        await _cleanup(client, prefix)


async def test_a_save_cut_off_before_its_write_leaves_the_stack_at_its_revision() -> None:
    """A save cut off by its caller while its script waited in the queue (another call in
    flight) stored nothing, and the stack says so: its revision is the one it had, so the
    caller's retry of the same compare-and-set stores it (the stack was left one ahead,
    and the retry lost to a revision nobody had written)."""
    require_redis()
    async with isolated(REDIS_URL) as backend:
        manager = siglo.StorageManager(backend, error_mode="strict")
        stack = manager.create_stack("s")
        stack.set("step", "n", 1)
        await stack.save(expected_revision=0)
        client = backend.adapter.client  # type: ignore[attr-defined]
        queue = CancelWhenQueued(backend.adapter.keys.checkpoint("s", None))  # type: ignore[attr-defined]
        client._pipeline_of()._queue = queue
        busy = asyncio.ensure_future(client.eval(BUSY_LUA, 0))
        await asyncio.sleep(0.05)  # written and running: the save's script is queued
        stack.set("step", "n", 2)
        save = asyncio.ensure_future(stack.save(expected_revision=1))
        queue.task = save
        with pytest.raises(asyncio.CancelledError):
            await save
        assert queue.task is None  # cut off where the test meant it to be
        await busy
        stored = await manager.load_checkpoint("s")
        assert stored is not None and stored.revision == 1
        assert stack.revision == 1
        saved = await stack.save(expected_revision=stack.revision)
        assert saved.revision == 2 and saved.contexts == {"step": {"n": 2}}
