"""Every call is bounded in time (SPEC §4): a lock held elsewhere or a frozen server gives
StorageAdapterError within ``command_timeout_ms`` (plus a small margin), never a hang.

What the error says of the outcome is checked too (SPEC §4, an acknowledgement is never
a guess): a statement PostgreSQL cancelled, and a wait for SQLite's write lock, did
nothing (a plain StorageAdapterError); a write to a frozen server may have run
(OutcomeUnknownError); a read changes nothing stored, so its failure is a plain
StorageAdapterError there too, which a ``best-effort`` manager swallows.

The faults are real: a row or table lock held by another PostgreSQL connection, a write
lock held by another SQLite connection, and a TCP proxy on loopback (tests/support/_tcp_proxy.py)
that stops forwarding in front of the real PostgreSQL and Redis servers.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import psycopg
import pytest
from _tcp_proxy import tcp_proxy
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo import Checkpoint
from siglo.settings import DEFAULTS
from siglo_postgres import drop_schema, isolated
from siglo_redis.connect import delete_prefix

BOUND_MS = 800
MARGIN_S = 1.5
"""What a bounded call may take beyond its bound: cancelling the statement in the
server, scheduling on a shared machine."""

REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")


def cp(revision: int, stack_id: str = "s") -> Checkpoint:
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=1)


async def bounded_failure(
    call: object, bound_ms: int = BOUND_MS, *, unknown: bool | None = None
) -> float:
    """Await ``call``; it must raise StorageAdapterError within the bound (an
    OutcomeUnknownError or not, as ``unknown`` says). Its duration."""
    began = time.monotonic()
    with pytest.raises(siglo.StorageAdapterError) as info:
        await asyncio.wait_for(call, timeout=bound_ms / 1000 + 30)  # type: ignore[arg-type]
    took = time.monotonic() - began
    assert took < bound_ms / 1000 + MARGIN_S, f"took {took:.2f} s, bound {bound_ms} ms"
    assert info.value.__cause__ is not None or "timed out" in str(info.value)
    if unknown is not None:
        assert isinstance(info.value, siglo.OutcomeUnknownError) is unknown, info.value
    if unknown:
        assert "may or may not have taken effect" in str(info.value)
    return took


def test_default_is_the_redis_command_timeout() -> None:
    assert DEFAULTS.command_timeout_ms == 10_000
    backend = siglo.connect(POSTGRES_URL)
    assert backend.adapter.database.command_timeout_ms == 10_000  # type: ignore[attr-defined]
    backend = siglo.connect("sqlite://")
    assert backend.adapter.database.command_timeout_ms == 10_000  # type: ignore[attr-defined]


def test_timeout_option_from_url_and_keyword() -> None:
    backend = siglo.connect(f"{POSTGRES_URL}?command_timeout_ms=1234")
    assert backend.adapter.database.command_timeout_ms == 1234  # type: ignore[attr-defined]
    assert "command_timeout_ms=1234" in backend.url
    backend = siglo.connect(POSTGRES_URL, command_timeout_ms=None)
    assert backend.adapter.database.command_timeout_ms is None  # type: ignore[attr-defined]
    backend = siglo.connect("sqlite://?command_timeout_ms=2345")
    assert backend.adapter.database.command_timeout_ms == 2345  # type: ignore[attr-defined]
    with pytest.raises(siglo.InvalidArgumentError, match="command_timeout_ms"):
        siglo.connect("sqlite://", command_timeout_ms=0)
    with pytest.raises(siglo.InvalidArgumentError, match="command_timeout_ms"):
        siglo.connect(POSTGRES_URL, command_timeout_ms=-5)


# -- PostgreSQL ----------------------------------------------------------------------------


@pytest.fixture
async def pg() -> AsyncIterator[siglo.Backend]:
    """A schema of the test's own, reached by a backend bounded at BOUND_MS. The schema
    is made (and migrated) without that bound: on a loaded machine the set-up alone may
    take longer, which is not what the tests measure."""
    require_postgres()
    async with isolated(POSTGRES_URL) as setup:
        await setup.adapter.save_checkpoint(cp(1))
        async with siglo.connect(setup.url, command_timeout_ms=BOUND_MS) as backend:
            assert backend.adapter.database.command_timeout_ms == BOUND_MS  # type: ignore[attr-defined]
            yield backend


def _schema_of(backend: siglo.Backend) -> str:
    schema = backend.adapter.schema  # type: ignore[attr-defined]
    assert isinstance(schema, str)
    return schema


async def test_postgres_row_lock_held_elsewhere(pg: siglo.Backend) -> None:
    schema = _schema_of(pg)
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as other:
        # Another session locks every checkpoint row and keeps its transaction open.
        await other.execute(f'SELECT 1 FROM "{schema}".siglo_checkpoints FOR UPDATE')
        # Cancelled by the server, rolled back: known not to have happened.
        await bounded_failure(pg.adapter.save_checkpoint(cp(2)), unknown=False)
        await bounded_failure(pg.adapter.save_checkpoint(cp(2), expected_revision=1), unknown=False)
        # A delete's statements go out pipelined (Database.fetch_all): cancelled alike.
        await bounded_failure(pg.adapter.delete_checkpoint("s"), unknown=False)
        await other.rollback()
    # The lock is gone: the same backend works again, and nothing half-done was kept.
    got = await pg.adapter.get_checkpoint("s")
    assert got is not None and got.revision == 1
    await pg.adapter.save_checkpoint(cp(2), expected_revision=1)


async def test_postgres_table_lock_held_elsewhere(pg: siglo.Backend) -> None:
    schema = _schema_of(pg)
    assert pg.lock is not None and pg.idempotency is not None
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as other:
        for table in ("checkpoints", "locks", "idempotency_keys", "wait_records"):
            await other.execute(f'LOCK TABLE "{schema}".siglo_{table} IN ACCESS EXCLUSIVE MODE')
        await bounded_failure(pg.adapter.get_checkpoint("s"), unknown=False)
        await bounded_failure(pg.lock.acquire("k"), unknown=False)
        await bounded_failure(pg.idempotency.claim("k"), unknown=False)
        await bounded_failure(pg.adapter.with_workflow_lock("s", asyncio.sleep, timeout_ms=100))
        await other.rollback()
    assert (await pg.lock.acquire("k")).acquired


async def test_postgres_frozen_server() -> None:
    require_postgres()
    parts = urlsplit(POSTGRES_URL)
    schema = "siglo_test_frozen_" + os.urandom(4).hex()
    # The schema is made first, unbounded: what is under test is the bound on calls to a
    # frozen server, not how long creating siglo's tables takes a loaded machine (the
    # whole suite on two cores once took over 800 ms for it).
    async with siglo.connect(POSTGRES_URL, schema=schema) as setup:
        await setup.adapter.migrate()
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        url = POSTGRES_URL.replace(parts.netloc, f"{parts.username}@{proxy.url_host}")
        backend = siglo.connect(url, schema=schema, command_timeout_ms=BOUND_MS)
        try:
            await backend.adapter.save_checkpoint(cp(1))
            proxy.freeze()
            # Sent, never answered, the connection cut: the server may have run it. (The
            # calls after it find no connection in time: nothing sent, a plain error.)
            await bounded_failure(backend.adapter.save_checkpoint(cp(2)), unknown=True)
            await bounded_failure(backend.adapter.get_checkpoint("s"), unknown=False)
            assert backend.lock is not None
            await bounded_failure(backend.lock.acquire("k"))
            proxy.thaw()
            # Back to normal within a few calls (broken connections are replaced).
            for _ in range(50):
                try:
                    got = await backend.adapter.get_checkpoint("s")
                    break
                except siglo.StorageAdapterError:
                    await asyncio.sleep(0.05)
            else:
                pytest.fail("no recovery after the proxy thawed")
            assert got is not None
        finally:
            proxy.restore()
            await backend.aclose()
            await drop_schema(POSTGRES_URL, schema)


async def test_postgres_frozen_before_the_first_call() -> None:
    """A server that takes the connection and never answers, before the backend has
    connected: each call that had to connect waited for libpq's ``connect_timeout``
    (10 s by default) whatever its ``command_timeout_ms``, and a worker's retries took
    ten times their ``--retry-for`` (a black-box auditor). Connecting is bounded with
    the call; once the server answers, the next call connects."""
    require_postgres()
    parts = urlsplit(POSTGRES_URL)
    schema = "siglo_test_frozen_" + os.urandom(4).hex()
    async with siglo.connect(POSTGRES_URL, schema=schema) as setup:
        await setup.adapter.migrate()
        await setup.adapter.save_checkpoint(cp(1))
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        url = POSTGRES_URL.replace(parts.netloc, f"{parts.username}@{proxy.url_host}")
        proxy.freeze()
        backend = siglo.connect(url, schema=schema, command_timeout_ms=BOUND_MS)
        try:
            for _ in range(2):
                await bounded_failure(backend.adapter.get_checkpoint("s"), unknown=False)
            assert backend.lock is not None
            await bounded_failure(backend.lock.acquire("k"), unknown=False)
            proxy.thaw()
            got = await backend.adapter.get_checkpoint("s")
            assert got is not None and got.revision == 1
        finally:
            proxy.restore()
            await backend.aclose()
            await drop_schema(POSTGRES_URL, schema)


# -- SQLite ----------------------------------------------------------------------------------


async def test_sqlite_write_lock_held_by_another_connection() -> None:
    directory = tempfile.mkdtemp(prefix="siglo-bounded-")
    path = os.path.join(directory, "siglo.db")
    backend = siglo.connect(f"sqlite:///{path}", command_timeout_ms=BOUND_MS)
    try:
        await backend.adapter.save_checkpoint(cp(1))
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # holds the write lock until it ends
        try:
            # SQLite's bound is on the wait for the write lock, before anything runs:
            # known not to have happened (no statement is interrupted mid-way).
            took = await bounded_failure(backend.adapter.save_checkpoint(cp(2)), unknown=False)
            assert took > BOUND_MS / 1000 * 0.5  # it did wait for the lock first
            # One busy wait, not two: a retry never waits past the call's deadline.
            assert took < BOUND_MS / 1000 + 0.5
            assert backend.lock is not None and backend.idempotency is not None
            await bounded_failure(backend.lock.acquire("k"), unknown=False)
            await bounded_failure(backend.idempotency.claim("k"), unknown=False)
            # Reads still work beside a writer (WAL).
            got = await backend.adapter.get_checkpoint("s")
            assert got is not None and got.revision == 1
        finally:
            other.execute("ROLLBACK")
            other.close()
        await backend.adapter.save_checkpoint(cp(2), expected_revision=1)
    finally:
        await backend.aclose()


# -- Redis (already bounded; kept so a regression is caught) ---------------------------------


async def test_redis_frozen_server() -> None:
    import redis

    parts = urlsplit(REDIS_URL)
    try:
        redis.Redis(host=parts.hostname, port=parts.port or 6379, socket_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {exc}")
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
        url = f"redis://{proxy.url_host}{parts.path or '/0'}"
        prefix = f"siglo-test-frozen-{os.urandom(4).hex()}:"
        backend = siglo.connect(url, prefix=prefix, command_timeout_ms=BOUND_MS)
        try:
            await backend.adapter.save_checkpoint(cp(1))
            proxy.freeze()
            # Sent, never answered: a read changed nothing whatever the server did.
            await bounded_failure(backend.adapter.get_checkpoint("s"), unknown=False)
            lenient = siglo.StorageManager(backend, error_mode="best-effort")
            began = time.monotonic()
            assert await lenient.load_checkpoint("s") is None  # swallowed, as documented
            assert time.monotonic() - began < BOUND_MS / 1000 + MARGIN_S
            # The coordination stores' reads too: a result looked up, a lock inspected.
            assert backend.idempotency is not None and backend.lock is not None
            await bounded_failure(backend.idempotency.get_result("k"), unknown=False)
            await bounded_failure(backend.lock.inspect("k"), unknown=False)
            assert backend.lock is not None
            # The script may have run: only its reply is missing.
            await bounded_failure(backend.lock.acquire("k"), unknown=True)
        finally:
            proxy.restore()
            await backend.aclose()
        cleanup = siglo.connect(REDIS_URL, prefix=prefix)
        # What the proxy held while frozen reaches the server once restored, the lock's
        # acquire among it, and may land after a first sweep (its fencing counter was
        # left behind): swept until a sweep finds nothing.
        for _ in range(50):
            if not await delete_prefix(cleanup.adapter.client, prefix):  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.1)
        await cleanup.aclose()
