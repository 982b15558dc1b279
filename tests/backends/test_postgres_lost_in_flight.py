"""A PostgreSQL write whose connection was lost in flight is an unknown outcome; a
connection the server closed while idle is never used.

A TCP proxy in front of the shared PostgreSQL lets a statement through, the server runs
and commits it, and the reply is dropped with the connection (the server died, the
network dropped, between committing and answering). psycopg never sends it again, and
siglo raises ``OutcomeUnknownError`` (SPEC §4: an acknowledgement is never a guess); a
read's failure is a plain ``StorageAdapterError``. To psycopg a connection the server
closed while it sat in the pool (a restart) fails the same way, though nothing it was
sent ran: siglo replaces such a connection before sending a call on it
(``siglo_postgres.liveness``), so after every idle connection is closed, each write is
answered.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from _tcp_proxy import TcpProxy, proxied_url
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo import Checkpoint, OutcomeUnknownError, StorageAdapterError
from siglo.records import WaitRecord
from siglo_postgres import drop_schema
from siglo_sql.keys import row_id


@pytest.fixture
async def proxied() -> AsyncIterator[tuple[siglo.Backend, TcpProxy]]:
    require_postgres()
    schema = "siglo_test_lost_" + os.urandom(4).hex()
    with proxied_url(POSTGRES_URL, 5432) as (via_proxy, proxy):
        backend = siglo.connect(via_proxy, schema=schema, pool_min_size=4, pool_max_size=4)
        try:
            yield backend, proxy
        finally:
            await backend.aclose()
            await drop_schema(POSTGRES_URL, schema)


async def _lost(
    proxy: TcpProxy, marker: str | bytes, call: Callable[[], Coroutine[Any, Any, Any]]
) -> BaseException:
    """What ``call`` raises when the reply to the request carrying ``marker`` is lost."""
    lost_before = proxy.replies_lost
    proxy.lose_reply_to(marker.encode() if isinstance(marker, str) else marker)
    try:
        with pytest.raises(StorageAdapterError) as err:
            await call()
    finally:
        proxy.lose_reply_to(b"\0never\0")
    assert proxy.replies_lost == lost_before + 1
    return err.value


async def test_a_write_lost_in_flight_is_an_unknown_outcome_and_a_read_a_failure(
    proxied: tuple[siglo.Backend, TcpProxy],
) -> None:
    backend, proxy = proxied
    a, lock, idem, nonces = backend.adapter, backend.lock, backend.idempotency, backend.nonces
    assert lock is not None and idem is not None and nonces is not None
    tag = uuid.uuid4().hex[:8]

    stack = f"stack-{tag}"
    await a.save_checkpoint(Checkpoint(stack_id=stack, revision=1, timestamp=1))
    error = await _lost(proxy, stack, lambda: a.save_checkpoint(
        Checkpoint(stack_id=stack, revision=2, timestamp=2), expected_revision=1
    ))  # fmt: skip
    assert isinstance(error, OutcomeUnknownError), error
    stored = await a.get_checkpoint(stack)
    assert stored is not None and stored.revision == 2  # it committed

    error = await _lost(proxy, f"lock-{tag}", lambda: lock.acquire(f"lock-{tag}", ttl_ms=60_000))
    assert isinstance(error, OutcomeUnknownError), error
    assert not (await lock.acquire(f"lock-{tag}", ttl_ms=60_000)).acquired

    error = await _lost(proxy, f"idem-{tag}", lambda: idem.claim(f"idem-{tag}"))
    assert isinstance(error, OutcomeUnknownError), error
    assert await idem.claim(f"idem-{tag}") == "in-progress"

    error = await _lost(proxy, f"nonce-{tag}", lambda: nonces.claim(f"nonce-{tag}", 60))
    assert isinstance(error, OutcomeUnknownError), error
    assert await nonces.claim(f"nonce-{tag}", 60) is False

    wait = f"wait-{tag}"
    await a.save_wait_record(WaitRecord(correlation_key=wait, stack_id=stack))
    claimant = f"claimant-{tag}"
    error = await _lost(proxy, claimant, lambda: a.claim_wait_record(wait, claimant))
    assert isinstance(error, OutcomeUnknownError), error
    claimed = await a.get_wait_record(wait)
    assert claimed is not None and claimed.status == "claimed"

    # A read's failure says it failed and changed nothing (the row's key: a hash of the id).
    error = await _lost(proxy, row_id("", stack), lambda: a.get_checkpoint(stack))
    assert not isinstance(error, OutcomeUnknownError), error


async def test_connections_the_server_closed_while_idle_are_not_used(
    proxied: tuple[siglo.Backend, TcpProxy],
) -> None:
    backend, proxy = proxied
    a, nonces = backend.adapter, backend.nonces
    assert nonces is not None
    await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
    for round_ in range(2):
        proxy.cut()  # every pooled connection closed, as by a restart …
        proxy.restore()  # … and the server back
        for i in range(6):  # more calls than the pool has connections
            revision = 2 + round_ * 6 + i
            await a.save_checkpoint(
                Checkpoint(stack_id="s", revision=revision, timestamp=revision),
                expected_revision=revision - 1,
            )
            assert await nonces.claim(f"n-{round_}-{i}", 60) is True


async def test_a_blob_change_lost_in_flight_is_an_unknown_outcome() -> None:
    require_postgres()
    from siglo_postgres.blobs import open_store

    schema = "siglo_test_lost_blobs_" + os.urandom(4).hex()
    with proxied_url(POSTGRES_URL, 5432) as (via_proxy, proxy):
        store = open_store(f"{via_proxy}?schema={schema}")
        try:
            body = f"blob {uuid.uuid4().hex}".encode()
            digest = hashlib.sha256(body).hexdigest()
            await store.put(hashlib.sha256(b"warm").hexdigest(), b"warm")
            error = await _lost(proxy, body.decode(), lambda: store.put(digest, body))
            assert isinstance(error, OutcomeUnknownError), error
            assert await store.get(digest) == body
            error = await _lost(proxy, digest, lambda: store.get(digest))
            assert not isinstance(error, OutcomeUnknownError), error
            proxy.cut()
            proxy.restore()
            assert await store.get(digest) == body  # a new connection, not the closed one
        finally:
            await store.aclose()
            await drop_schema(POSTGRES_URL, schema)


async def test_an_applications_engine_connections_closed_while_idle_are_not_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same with an application's SQLAlchemy engine: a connection of its pool that
    the server closed is invalidated, and the engine opens another; one lost in flight
    is an unknown outcome, and is dropped from the engine's pool without the failed
    reset SQLAlchemy would log as an error."""
    require_postgres()
    from sqlalchemy.ext.asyncio import create_async_engine

    from siglo_postgres import connect_engine

    schema = "siglo_test_lost_engine_" + os.urandom(4).hex()
    with proxied_url(POSTGRES_URL, 5432) as (via_proxy, proxy):
        engine = create_async_engine("postgresql+psycopg://" + via_proxy.split("://", 1)[1])
        backend = connect_engine(engine, schema=schema)
        try:
            a = backend.adapter
            await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
            for revision in range(2, 6):
                proxy.cut()
                proxy.restore()
                await a.save_checkpoint(
                    Checkpoint(stack_id="s", revision=revision, timestamp=revision),
                    expected_revision=revision - 1,
                )
            caplog.set_level(logging.WARNING)
            error = await _lost(proxy, '"revision":6', lambda: a.save_checkpoint(
                Checkpoint(stack_id="s", revision=6, timestamp=6), expected_revision=5
            ))  # fmt: skip
            assert isinstance(error, OutcomeUnknownError), error
            stored = await a.get_checkpoint("s")
            assert stored is not None and stored.revision == 6
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        finally:
            await backend.aclose()
            await engine.dispose()
            await drop_schema(POSTGRES_URL, schema)


async def test_a_call_the_server_ended_with_an_error_is_a_plain_failure() -> None:
    """A session the server terminated (``57P01``) while its save waited on a row lock:
    the server said so, the save did not commit, and the error is a plain
    ``StorageAdapterError``, not an unknown outcome."""
    require_postgres()
    import asyncio

    import psycopg

    schema = "siglo_test_terminated_" + os.urandom(4).hex()
    backend = siglo.connect(POSTGRES_URL, schema=schema, command_timeout_ms=20_000)
    try:
        a = backend.adapter
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as holder:
            await holder.execute(
                f'SELECT 1 FROM "{schema}".siglo_checkpoints WHERE id = %s FOR UPDATE',
                (row_id("", "s"),),
            )
            save = asyncio.ensure_future(
                a.save_checkpoint(
                    Checkpoint(stack_id="s", revision=2, timestamp=2), expected_revision=1
                )
            )
            waiting: list[Any] = []
            for _ in range(100):
                cur = await holder.execute(
                    # The sessions this holder's lock blocks: the save alone (other
                    # tests of the run wait on locks of their own in this database).
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
                )
                waiting = await cur.fetchall()
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert len(waiting) == 1, waiting
            await holder.execute("SELECT pg_terminate_backend(%s)", (waiting[0][0],))
            with pytest.raises(StorageAdapterError) as err:
                await save
            assert not isinstance(err.value, OutcomeUnknownError), err.value
            await holder.rollback()
        stored = await a.get_checkpoint("s")
        assert stored is not None and stored.revision == 1
    finally:
        await backend.aclose()
        await drop_schema(POSTGRES_URL, schema)
