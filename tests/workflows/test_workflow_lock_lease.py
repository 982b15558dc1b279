"""``with_workflow_lock`` never overlaps silently after a lost lease (issue 11 defect 2).

When the lease cannot be renewed before it lapses — the server stalled, the lock row is
held by another connection, the lease was taken over — the running action is cancelled
and the caller gets ``LockLostError``; the next holder enters only after that, with a
higher fencing token. Against real servers: a private redis-server paused with SIGSTOP,
an SQLite write lock and a PostgreSQL table lock held by another connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, RedisServer, require_redis
from ports import free_port
from raw_storage import KINDS, any_backend
from sql_support import POSTGRES_URL

import siglo
from siglo import Lease, LockLostError, current_lease

TTL_MS = 600


class Probe:
    """An action that runs until cancelled (or ``seconds``), recording when."""

    def __init__(self, seconds: float = 5.0) -> None:
        self.seconds = seconds
        self.entered = asyncio.Event()
        self.lease: Lease | None = None
        self.cancelled_at: float | None = None

    async def __call__(self) -> str:
        self.lease = current_lease()
        self.entered.set()
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled_at = time.monotonic()
            raise
        return "finished"


async def _second_holder(backend: siglo.Backend, stack_id: str) -> tuple[float, Lease | None]:
    entered: list[float] = []
    leases: list[Lease | None] = []

    async def enter() -> None:
        entered.append(time.monotonic())
        leases.append(current_lease())

    await backend.adapter.with_workflow_lock(stack_id, enter, timeout_ms=10_000)
    return entered[0], leases[0]


async def _lost_while(
    backend: siglo.Backend, stall: Callable[[], Awaitable[Any]], stack_id: str = "lease-1"
) -> tuple[Probe, LockLostError, float]:
    probe = Probe()
    run = asyncio.create_task(backend.adapter.with_workflow_lock(stack_id, probe))
    await asyncio.wait_for(probe.entered.wait(), 5)
    stalled_at = time.monotonic()
    await stall()
    with pytest.raises(LockLostError) as info:
        await asyncio.wait_for(run, 10)
    return probe, info.value, time.monotonic() - stalled_at


@pytest.fixture
def private_redis() -> RedisServer:
    require_redis()
    server = RedisServer(free_port(30200, 30300)).start()
    yield server  # type: ignore[misc]
    server.stop()


async def test_redis_paused_server_cancels_the_action_before_anyone_enters(
    private_redis: RedisServer,
) -> None:
    options = {"workflow_lock_ttl_ms": TTL_MS, "command_timeout_ms": 150}
    async with siglo.connect(private_redis.url, **options) as first:

        async def pause() -> None:
            private_redis.pause()

        try:
            probe, error, elapsed = await _lost_while(first, pause)
        finally:
            private_redis.resume()
        assert probe.cancelled_at is not None, "the action was not cancelled"
        assert elapsed < 3, f"LockLostError took {elapsed:.2f} s for a {TTL_MS} ms lease"
        assert "could not be renewed" in str(error)
        async with siglo.connect(private_redis.url, **options) as second:
            entered_at, lease = await _second_holder(second, "lease-1")
        assert probe.cancelled_at < entered_at, "the second holder entered before the cancel"
        assert probe.lease is not None and lease is not None
        assert probe.lease.fencing_token is not None and lease.fencing_token is not None
        assert lease.fencing_token > probe.lease.fencing_token
        assert error.fencing_token == probe.lease.fencing_token


async def test_redis_lease_taken_over_is_reported(private_redis: RedisServer) -> None:
    """A lease that lapsed and was taken by another holder: the next renewal sees it."""
    import redis.asyncio

    async with siglo.connect(private_redis.url, workflow_lock_ttl_ms=TTL_MS) as backend:
        raw = redis.asyncio.Redis.from_url(private_redis.url)
        try:

            async def steal() -> None:
                keys = [k async for k in raw.scan_iter(match="*lease-1*")]
                lock_keys = [k for k in keys if b"lock" in k and b"fence" not in k]
                assert lock_keys, keys
                for key in lock_keys:
                    await raw.set(key, "someone-else", px=60_000)

            probe, error, _ = await _lost_while(backend, steal)
        finally:
            await raw.aclose()
        assert probe.cancelled_at is not None
        assert "taken by another holder" in str(error)


async def test_sqlite_write_lock_held_elsewhere_cancels_the_action() -> None:
    async with any_backend("sqlite", workflow_lock_ttl_ms=TTL_MS) as backend:
        path = backend.adapter.database.path  # type: ignore[attr-defined]
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:

            async def hold() -> None:
                holder.execute("BEGIN EXCLUSIVE")

            probe, _, elapsed = await _lost_while(backend, hold)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert probe.cancelled_at is not None
        assert elapsed < 5
        entered_at, lease = await _second_holder(backend, "lease-1")
        assert probe.cancelled_at < entered_at
        assert probe.lease is not None and lease is not None
        assert (lease.fencing_token or 0) > (probe.lease.fencing_token or 0)


@pytest.fixture
async def postgres_backend() -> AsyncIterator[siglo.Backend]:
    async with any_backend("postgres", workflow_lock_ttl_ms=TTL_MS) as backend:
        yield backend


async def test_postgres_lock_table_held_elsewhere_cancels_the_action(
    postgres_backend: siglo.Backend,
) -> None:
    import psycopg

    adapter: Any = postgres_backend.adapter
    table = f'"{adapter.schema}"."{adapter.table_prefix}locks"'
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as holder:

        async def hold() -> None:
            await holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

        try:
            probe, _, elapsed = await _lost_while(postgres_backend, hold)
        finally:
            await holder.rollback()
    assert probe.cancelled_at is not None
    assert elapsed < 5
    entered_at, _ = await _second_holder(postgres_backend, "lease-1")
    assert probe.cancelled_at < entered_at


async def test_postgres_killed_connections_are_survived_by_renewal() -> None:
    """Renewals that fail (every pooled connection killed) are retried while the lease
    has time left: no cancel. (Each dead pooled connection costs one failed try, so the
    lease here is long enough for a pool's worth of them.)"""
    import psycopg

    async with any_backend("postgres", workflow_lock_ttl_ms=3_000) as postgres_backend:
        await _survive_kills(postgres_backend, psycopg)


async def _survive_kills(postgres_backend: siglo.Backend, psycopg: Any) -> None:
    async def kill_and_wait() -> str:
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as admin:
            killed = await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                "AND query LIKE %s",
                (f"%{postgres_backend.adapter.schema}%",),  # type: ignore[attr-defined]
            )
            assert len(await killed.fetchall()) >= 1, "no connection of the backend was killed"
        await asyncio.sleep(4)
        return "finished"

    assert await postgres_backend.adapter.with_workflow_lock("lease-2", kill_and_wait) == (
        "finished"
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_every_holder_reads_a_growing_fencing_token(kind: str) -> None:
    async with any_backend(kind) as backend:
        tokens = []
        for _ in range(3):

            async def read() -> None:
                lease = current_lease()
                assert lease is not None
                tokens.append(lease.fencing_token)

            await backend.adapter.with_workflow_lock("fenced", read)
        assert current_lease() is None
        assert all(t is not None for t in tokens)
        assert tokens == sorted(set(tokens)), tokens


async def test_a_healthy_long_action_keeps_its_lease() -> None:
    """On the shared server: an action three leases long keeps the lock by renewal."""
    require_redis()
    from siglo_redis import isolated

    async with isolated(REDIS_URL, workflow_lock_ttl_ms=1_000) as backend:

        async def long() -> str:
            await asyncio.sleep(3.0)
            return "done"

        assert await backend.adapter.with_workflow_lock("long", long) == "done"
