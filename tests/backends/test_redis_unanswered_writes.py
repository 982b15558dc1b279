"""A write whose reply was lost is an unknown outcome, never sent again.

A proxy between siglo and a real Redis lets the request through, the server runs it,
and the reply is dropped with the connection (a network cut, a server dying between
running a command and replying). redis-py would send the command again on a new
connection, where it meets its own effect: a stored save reported as a conflict, a
fresh nonce as a replay, a lock and an idempotency key as somebody else's. siglo's
clients (:mod:`siglo_redis.sent_once`) raise ``OutcomeUnknownError`` instead, and still
retry a read whose reply was lost. Every client is tried: auto-pipelined (the default),
plain, and waiting for a replica (``wait_replicas``), on one server and on a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import pytest
from _redis_helpers import (
    REDIS_URL,
    RedisServer,
    SentinelGroup,
    redis_cli,
    require_redis,
    start_cluster,
    wait_for_replica_links,
)
from _tcp_proxy import TcpProxy, proxied_url, tcp_proxy
from ports import free_ports

import siglo
from siglo import Checkpoint, CheckpointConflictError, OutcomeUnknownError, StorageAdapterError
from siglo.records import WaitRecord
from siglo_redis import isolated, scripts

rule = pytest.mark.rule

_SCRIPT = b"EVALSHA"
_SET = b"$3\r\nSET\r\n"
_DEL = b"$3\r\nDEL\r\n"


def _load_scripts(proxies: list[TcpProxy]) -> None:
    """Every siglo script in each server's cache: the reply dropped is then the
    script's own, not a ``NOSCRIPT`` (after which the script has not run)."""
    import redis

    for proxy in proxies:
        host, port = proxy.upstream
        with redis.Redis(host=host, port=port) as client:
            for script in vars(scripts).values():
                if isinstance(script, scripts.Script):
                    client.script_load(script.source)


async def _check_every_write(backend: siglo.Backend, proxies: list[TcpProxy]) -> None:
    """Each writing primitive, its reply lost: ``OutcomeUnknownError``, and the store
    shows that it ran; then a read whose reply was lost is retried and answers."""
    _load_scripts(proxies)
    a, lock, idem, nonces = backend.adapter, backend.lock, backend.idempotency, backend.nonces
    assert lock is not None and idem is not None and nonces is not None
    stack = f"s-{uuid.uuid4().hex[:6]}"

    async def lost(marker: bytes, call: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        lost_before = sum(p.replies_lost for p in proxies)
        for proxy in proxies:
            proxy.lose_reply_to(marker)
        try:
            with pytest.raises(OutcomeUnknownError) as err:
                await call()
        finally:
            for proxy in proxies:
                proxy.lose_reply_to(b"\0never\0")  # disarm the proxies not used
        assert sum(p.replies_lost for p in proxies) == lost_before + 1
        assert "may or may not have taken effect" in str(err.value)

    await a.save_checkpoint(Checkpoint(stack_id=stack, revision=1, timestamp=1))
    await lost(_SCRIPT, lambda: a.save_checkpoint(
        Checkpoint(stack_id=stack, revision=2, timestamp=2), expected_revision=1
    ))  # fmt: skip
    stored = await a.get_checkpoint(stack)
    assert stored is not None and stored.revision == 2  # it ran; re-reading tells
    with pytest.raises(CheckpointConflictError):  # the documented retry: a conflict
        await a.save_checkpoint(
            Checkpoint(stack_id=stack, revision=2, timestamp=2), expected_revision=1
        )
    await lost(_SCRIPT, lambda: a.save_checkpoint(
        Checkpoint(stack_id=stack, revision=3, timestamp=3)
    ))  # fmt: skip
    stored = await a.get_checkpoint(stack)
    assert stored is not None and stored.revision == 3

    await lost(_SCRIPT, lambda: lock.acquire(f"L-{stack}", ttl_ms=60_000))
    assert not (await lock.acquire(f"L-{stack}", ttl_ms=60_000)).acquired  # it is held

    await lost(_SCRIPT, lambda: idem.claim(f"I-{stack}"))
    assert await idem.claim(f"I-{stack}") == "in-progress"

    await lost(_SET, lambda: nonces.claim(f"N-{stack}", 60))
    assert await nonces.claim(f"N-{stack}", 60) is False  # consumed by the lost call

    wait_key = f"W-{stack}"
    await a.save_wait_record(WaitRecord(correlation_key=wait_key, stack_id=stack))
    await lost(_SCRIPT, lambda: a.claim_wait_record(wait_key, "claimant"))
    claimed = await a.get_wait_record(wait_key)
    assert claimed is not None and claimed.status == "claimed"

    # A read is sent again: nothing it did changed anything.
    lost_before = sum(p.replies_lost for p in proxies)
    for proxy in proxies:
        proxy.lose_reply_to(b"GET")
    stored = await a.get_checkpoint(stack)
    for proxy in proxies:
        proxy.lose_reply_to(b"\0never\0")
    assert stored is not None and stored.revision == 3
    assert sum(p.replies_lost for p in proxies) == lost_before + 1

    # Connections the server closed while idle (a restart, its `timeout`) are not
    # written on: each write goes on a new connection and is answered, not lost unsent
    # and reported unknown — whether the client's event loop saw each connection end
    # (an await), or was busy as they ended (a blocking stretch of the application).
    for revision, blocked in ((4, False), (5, True)):
        for proxy in proxies:
            proxy.cut()
            proxy.restore()
        wait_for_replica_links([proxy.upstream[1] for proxy in proxies])
        if blocked:
            time.sleep(0.2)  # noqa: ASYNC251 - the loop must not run: that is the case
        else:
            await asyncio.sleep(0.1)
        await a.save_checkpoint(
            Checkpoint(stack_id=stack, revision=revision, timestamp=revision),
            expected_revision=revision - 1,
        )
        assert (await lock.acquire(f"L{revision}-{stack}", ttl_ms=60_000)).acquired
        assert await idem.claim(f"I{revision}-{stack}") == "claimed"
        assert await nonces.claim(f"N{revision}-{stack}", 60) is True


@pytest.fixture
def replicated() -> Iterator[RedisServer]:
    """A server of our own with one replica (for ``wait_replicas=1``)."""
    # Ranges no other test uses: the cluster tests take 12 ports at a time from 30200-30300.
    master_port, replica_port = free_ports(30600, 30700, 2)
    master = RedisServer(master_port).start()
    replica = RedisServer(replica_port, "--replicaof", "127.0.0.1", str(master_port))
    try:
        replica.start()
        wait_for_replica_links([replica_port], replicas=1)
        yield master
    finally:
        replica.stop()
        master.stop()


@rule("manager.error-mode")
@pytest.mark.parametrize("options", ["", "auto_pipeline=false", "wait_replicas=1"])
async def test_a_write_whose_reply_was_lost_is_an_unknown_outcome(
    options: str, request: pytest.FixtureRequest
) -> None:
    if options.startswith("wait_replicas"):
        server = request.getfixturevalue("replicated").url
    else:
        require_redis()
        server = REDIS_URL
    with proxied_url(server, 6379) as (via_proxy, proxy):
        separator = "&" if "?" in via_proxy else "?"
        url = f"{via_proxy}{separator}command_timeout_ms=5000&{options}"
        async with isolated(url) as backend:
            await _check_every_write(backend, [proxy])


@pytest.mark.parametrize("retries", [None, 3])
async def test_an_applications_redis_client_sends_a_write_once_too(retries: int | None) -> None:
    """A redis-py client the application passes in (as the seed's example does), with
    redis-py's defaults (a lost reply: a plain error, though the write ran) or a
    ``Retry`` (the write sent again, meeting its own effect): siglo sends through one of
    its own clients over the application's connection pool, and the lost reply is an
    unknown outcome. The application's client stays open and usable."""
    require_redis()
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from siglo_redis import RedisNonceStore, RedisStorageAdapter
    from siglo_redis.connect import delete_prefix

    prefix = f"siglo-test-{uuid.uuid4().hex[:16]}:"
    with proxied_url(REDIS_URL, 6379) as (via_proxy, proxy):
        _load_scripts([proxy])
        extra = {} if retries is None else {"retry": Retry(NoBackoff(), retries)}
        client = redis.asyncio.Redis.from_url(via_proxy, **extra)
        adapter = RedisStorageAdapter(client, key_prefix=prefix)
        nonces = RedisNonceStore(client, key_prefix=f"{prefix}nonce:")
        try:
            await adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
            proxy.lose_reply_to(_SCRIPT)
            with pytest.raises(OutcomeUnknownError):
                await adapter.save_checkpoint(
                    Checkpoint(stack_id="s", revision=2, timestamp=2), expected_revision=1
                )
            stored = await adapter.get_checkpoint("s")
            assert stored is not None and stored.revision == 2
            proxy.lose_reply_to(_SET)
            with pytest.raises(OutcomeUnknownError):
                await nonces.claim("fresh", 60)
            assert await nonces.claim("fresh", 60) is False  # the lost call took it
            await adapter.aclose()
            await nonces.aclose()
            assert await client.ping()  # the application's, open
        finally:
            await delete_prefix(client, prefix)
            await client.aclose()


@pytest.mark.parametrize("options", ["", "?auto_pipeline=false"])
async def test_a_write_refused_while_the_server_loads_is_a_plain_failure(options: str) -> None:
    """redis-py raises a ``-LOADING`` reply (a restarted server still loading its data) as
    a ``ConnectionError``; the server answered, and did not run the command: a plain
    ``StorageAdapterError`` (after the client's quick retries), never an unknown outcome
    (a black-box auditor: every write of an AOF load reported unknown)."""
    import redis

    (port,) = free_ports(30600, 30700, 1)
    server = RedisServer(port).start()
    try:
        async with isolated(server.url + options) as backend:
            a = backend.adapter
            await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
            with redis.Redis(port=port) as raw:
                with raw.pipeline(transaction=False) as pipe:
                    for i in range(20_000):
                        pipe.set(f"filler:{i}", "x" * 16)
                    pipe.execute()
                raw.save()
            server.halt()
            # Loading takes 20,000 x 100 us = 2 s, answering -LOADING meanwhile.
            server.extra = (
                "--key-load-delay", "100", "--loading-process-events-interval-bytes", "1024",
            )  # fmt: skip
            server.start()
            with pytest.raises(StorageAdapterError) as err:
                await a.save_checkpoint(
                    Checkpoint(stack_id="s", revision=2, timestamp=2), expected_revision=1
                )
            assert not isinstance(err.value, OutcomeUnknownError), err.value
            assert "LOADING" in str(err.value) or "loading" in str(err.value)
            deadline = time.monotonic() + 30
            while True:  # loaded: the same save, sent again, is stored (it had not run)
                try:
                    await a.save_checkpoint(
                        Checkpoint(stack_id="s", revision=2, timestamp=2), expected_revision=1
                    )
                    break
                except StorageAdapterError:
                    assert time.monotonic() < deadline, "the server never finished loading"
                    await asyncio.sleep(0.2)
    finally:
        server.stop()


@pytest.mark.parametrize("options", ["", "?auto_pipeline=false"])
async def test_a_write_a_demoted_master_refused_is_a_plain_failure(options: str) -> None:
    """Through Sentinel, a master demoted to a replica answers a write ``-READONLY``, which
    redis-py's Sentinel connection raises again as a ``ConnectionError``: the write did
    not run, and its failure is a plain ``StorageAdapterError``, not an unknown outcome."""
    group = SentinelGroup(free_ports(30600, 30700, 5)).start()
    try:
        async with isolated(group.url + options) as backend:
            a = backend.adapter
            await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
            # Demoted behind the Sentinels' back: they still name it the master.
            redis_cli(group.master.port, "replicaof", "127.0.0.1", str(group.replica.port))
            with pytest.raises(StorageAdapterError) as err:
                await a.save_checkpoint(
                    Checkpoint(stack_id="s", revision=2, timestamp=2), expected_revision=1
                )
            assert not isinstance(err.value, OutcomeUnknownError), err.value
            redis_cli(group.master.port, "replicaof", "no", "one")
            stored = await a.get_checkpoint("s")
            assert stored is not None and stored.revision == 1
    finally:
        group.stop()


async def test_a_blob_change_whose_reply_was_lost_is_an_unknown_outcome() -> None:
    """The Redis blob store's client sends a change once too: a put, the collector's
    removal and a delete whose reply was lost raise ``OutcomeUnknownError`` (a removal
    sent again would report "nothing removed" of the blob it removed)."""
    require_redis()
    import redis.asyncio

    from siglo_redis.blobs import open_store

    prefix = f"siglo-test-{uuid.uuid4().hex[:16]}:"
    with proxied_url(REDIS_URL, 6379) as (via_proxy, proxy):
        separator = "&" if "?" in via_proxy else "?"
        store = open_store(f"{via_proxy}{separator}prefix={prefix}")
        try:
            blobs = [f"blob {i} {uuid.uuid4().hex}".encode() for i in range(3)]
            digests = [hashlib.sha256(b).hexdigest() for b in blobs]
            # Each of the store's scripts in the server's cache (a put runs two, a removal
            # of a blob nobody stored the third): the reply lost is then the script's
            # own, not a NOSCRIPT, after which the script has not run. A fresh server
            # caches none of them; the suite's other tests may or may not have.
            await store.put(digests[0], blobs[0])
            assert not await store.delete_stale(digests[2], kept_before_ms=2**62)
            proxy.lose_reply_to(blobs[1])  # the put that sends the bytes
            with pytest.raises(OutcomeUnknownError):
                await store.put(digests[1], blobs[1])
            assert await store.get(digests[1]) == blobs[1]  # it ran
            proxy.lose_reply_to(digests[1].encode())
            with pytest.raises(OutcomeUnknownError):
                await store.delete_stale(digests[1], kept_before_ms=2**62)
            assert await store.get(digests[1]) is None
            proxy.lose_reply_to(_DEL)
            with pytest.raises(OutcomeUnknownError):
                await store.delete(digests[0])
            assert await store.get(digests[0]) is None
            assert proxy.replies_lost == 3
        finally:
            await store.aclose()
            async with redis.asyncio.Redis.from_url(REDIS_URL) as raw:
                async for key in raw.scan_iter(match=f"{prefix}*"):
                    await raw.delete(key)


@contextlib.contextmanager
def _proxied_cluster() -> Iterator[list[TcpProxy]]:
    """Three masters and three replicas, each announcing a proxy's port: every client
    (and replica) connection to a node goes through its proxy."""
    ports = free_ports(30500, 30600, 12)
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(tcp_proxy("127.0.0.1", port)) for port in ports[:6]]
        servers = stack.enter_context(
            contextlib.contextmanager(start_cluster)(
                ports[:6], ports[6:], replicas=1, announce_ports=[p.port for p in proxies]
            )
        )
        wait_for_replica_links([server.port for server in servers], replicas=3)
        yield proxies


@pytest.fixture(scope="module")
def proxied_cluster() -> Iterator[list[TcpProxy]]:
    try:
        subprocess.run(["redis-cli", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("redis-cli not found: cannot create a Redis Cluster")
    with _proxied_cluster() as proxies:
        yield proxies


@pytest.fixture
async def cluster_backend(
    proxied_cluster: list[TcpProxy], request: pytest.FixtureRequest
) -> AsyncIterator[siglo.Backend]:
    url = (
        f"redis://{proxied_cluster[0].url_host}/0?cluster=true&command_timeout_ms=5000"
        f"&{request.param}"
    )
    async with isolated(url) as backend:
        yield backend


@rule("manager.error-mode")
@pytest.mark.parametrize(
    "cluster_backend", ["", "auto_pipeline=false", "wait_replicas=1"], indirect=True
)
async def test_a_cluster_write_whose_reply_was_lost_is_an_unknown_outcome(
    cluster_backend: siglo.Backend, proxied_cluster: list[TcpProxy]
) -> None:
    await _check_every_write(cluster_backend, proxied_cluster)


_SHAPES = [
    "redis://127.0.0.1:1/0",
    "redis+sentinel://127.0.0.1:1/service/0",
    "redis://127.0.0.1:1/0?cluster=true",
]
_OPTIONS = ["", "auto_pipeline=false", "wait_replicas=1", "auto_pipeline=false&wait_replicas=1"]


@pytest.mark.parametrize("options", _OPTIONS)
@pytest.mark.parametrize("shape", _SHAPES)
async def test_every_client_siglo_builds_sends_a_write_once(shape: str, options: str) -> None:
    """The tests above lose replies through a proxy on one server and on a cluster;
    a Sentinel URL builds the same client classes (over Sentinel-managed connections).
    This lists every URL shape and option that picks a class, so that a client added
    later without the mechanism fails here."""
    from siglo_redis.client import client_from_url, close_client
    from siglo_redis.pipelining import AutoPipelinedRedisCluster
    from siglo_redis.sent_once import SentOnceRedis, SentOnceRedisCluster

    separator = "&" if "?" in shape else "?"
    client = client_from_url(shape + (separator + options if options else ""))
    try:
        if "cluster=true" in shape and not options.startswith(("auto_pipeline", "wait")):
            # Its node pipelines raise UnansweredWriteError themselves (pipelining.py).
            assert type(client) is AutoPipelinedRedisCluster
        else:
            assert isinstance(client, SentOnceRedis | SentOnceRedisCluster), type(client)
    finally:
        await close_client(client)


def test_what_counts_as_a_write() -> None:
    """Only a write is kept from being sent again: every command siglo reads with is not
    one (its read-only scripts by their SHA-1, sent as EVALSHA or whole as EVAL), and a
    command redis-py names with its subcommand is read by its first word."""
    from siglo_redis.sent_once import is_write

    for script in vars(scripts).values():
        if isinstance(script, scripts.Script):
            for args in (("EVALSHA", script.sha, 1, "k"), (b"EVAL", script.source.encode(), 0)):
                assert is_write(args) is not script.read_only, (script.name, args[0])
    assert not any(is_write((c, "k")) for c in ("GET", b"hgetall", "ZRANGE", "SCRIPT LOAD"))
    assert all(is_write((c, "k")) for c in ("SET", b"DEL", "ZADD", "hset", "UNLINK"))
