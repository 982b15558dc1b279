"""The PostgreSQL blob store (``blob_url = "postgresql://…"``, siglo_postgres.blobs)
against the real server, as a black-box audit of offloaded values used it: a role that
may read and write the blob table but create nothing, processes meeting a fresh store at
once, and a call held up by a lock beside calls that are not."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from sql_support import POSTGRES_URL, require_postgres

from siglo.blobs import blob_digest, open_blob_store
from siglo_postgres import drop_schema

pytestmark = pytest.mark.rule("blobs.offload")


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    require_postgres()
    schema = f"siglo_blobs_{secrets.token_hex(6)}"
    try:
        yield schema
    finally:
        await drop_schema(POSTGRES_URL, schema)


def _as_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


async def test_a_role_that_may_not_create_uses_the_table_an_administrator_made() -> None:
    """Every connection ran ``CREATE SCHEMA/TABLE IF NOT EXISTS``, which PostgreSQL
    refuses to a role without the privilege to create even when the table exists: such a
    role could neither read nor save an offloaded value."""
    role = f"siglo_blob_reader_{secrets.token_hex(4)}"
    async with fresh_schema() as schema:
        admin = open_blob_store(f"{POSTGRES_URL}?schema={schema}")
        data = b'{"large":"value"}'
        await admin.put(blob_digest(data), data)  # made by the administrator
        await admin.aclose()
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as db:
            await db.execute(f'CREATE ROLE "{role}" LOGIN')
            try:
                await db.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
                await db.execute(
                    f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}"."siglo_blobs" TO "{role}"'
                )
                store = open_blob_store(f"{_as_user(POSTGRES_URL, role)}?schema={schema}")
                try:
                    assert await store.get(blob_digest(data)) == data
                    other = b'{"another":"value"}'
                    await store.put(blob_digest(other), other)
                    assert await store.get(blob_digest(other)) == other
                finally:
                    await store.aclose()
            finally:
                await db.execute(f'DROP OWNED BY "{role}"')
                await db.execute(f'DROP ROLE "{role}"')


async def test_processes_meeting_a_fresh_store_at_once_all_save() -> None:
    """Concurrent ``IF NOT EXISTS`` DDL is not race-safe: of eight stores (processes)
    saving into a fresh schema at once, seven failed ("duplicate key value violates
    unique constraint pg_namespace_nspname_index")."""
    async with fresh_schema() as schema:
        stores = [open_blob_store(f"{POSTGRES_URL}?schema={schema}") for _ in range(8)]
        try:
            values = [b'{"n":%d}' % n for n in range(8)]
            await asyncio.gather(
                *(store.put(blob_digest(v), v) for store, v in zip(stores, values, strict=True))
            )
            for value in values:
                assert await stores[0].get(blob_digest(value)) == value
        finally:
            for store in stores:
                await store.aclose()


async def test_a_call_held_up_by_a_lock_delays_no_other_call() -> None:
    """One connection served every call of a process: a put waiting for a row another
    session locked held every other blob call, loads of other stacks included, until
    its bound."""
    async with fresh_schema() as schema:
        store = open_blob_store(f"{POSTGRES_URL}?schema={schema}")
        held, free = b'{"held":1}', b'{"free":1}'
        await store.put(blob_digest(held), held)
        await store.put(blob_digest(free), free)
        try:
            async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as locker:
                await locker.execute(
                    f'SELECT 1 FROM "{schema}".siglo_blobs WHERE digest = %s FOR UPDATE',
                    (blob_digest(held),),
                )
                later = int(time.time() * 1000) + 3_600_000
                waiting = asyncio.create_task(
                    store.put(blob_digest(held), held, keep_until_ms=later)
                )
                await asyncio.sleep(0.2)
                began = time.monotonic()
                for _ in range(5):
                    assert await asyncio.wait_for(store.get(blob_digest(free)), 5) == free
                assert time.monotonic() - began < 1.0
                assert not waiting.done()
                await locker.rollback()
                await asyncio.wait_for(waiting, 10)
        finally:
            await store.aclose()


async def _connections(name: str) -> int:
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as db:
        cursor = await db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


async def test_the_store_recovers_when_the_server_closes_its_connections() -> None:
    """A connection the server closed (a restart) failed the pool's check but stayed in
    the pool, handed out again until every call's bound: no offloaded value was read
    again in that process (a black-box auditor, ``pg_terminate_backend``)."""
    name = f"siglo-blob-test-{secrets.token_hex(4)}"
    async with fresh_schema() as schema:
        store = open_blob_store(f"{POSTGRES_URL}?schema={schema}&application_name={name}")
        data = b'{"large":"value"}'
        try:
            await store.put(blob_digest(data), data)
            async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as db:
                await db.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (name,),
                )
            await asyncio.sleep(0.2)
            for _ in range(3):
                assert await asyncio.wait_for(store.get(blob_digest(data)), 10) == data
        finally:
            await store.aclose()


async def test_a_blob_url_applies_the_pool_options_it_takes_and_refuses_the_others() -> None:
    """``?pool_max_size=1`` was accepted and ignored (ten connections opened), and so
    were ``command_timeout_ms`` (no bound) and ``pgbouncer``."""
    from siglo.errors import InvalidArgumentError

    name = f"siglo-blob-test-{secrets.token_hex(4)}"
    async with fresh_schema() as schema:
        store = open_blob_store(
            f"{POSTGRES_URL}?schema={schema}&application_name={name}&pool_max_size=1"
            "&pgbouncer=transaction"
        )
        try:
            values = [b'{"n":%d}' % n for n in range(8)]
            await asyncio.gather(*(store.put(blob_digest(v), v) for v in values))
            await asyncio.gather(*(store.get(blob_digest(v)) for v in values))
            assert await _connections(name) == 1
        finally:
            await store.aclose()
    with pytest.raises(InvalidArgumentError, match="command_timeout_ms"):
        open_blob_store(f"{POSTGRES_URL}?command_timeout_ms=500")


async def test_the_first_call_against_a_stalled_server_fails_within_its_bound() -> None:
    """The pool's first use against a server that accepts and never answers: the
    wrapper's backstop cancelled the call, whose clean-up then waited psycopg_pool's
    5 s for a worker stuck connecting (a black-box auditor: 7.5 s at a bound of 0.5 s)."""
    from _tcp_proxy import tcp_proxy

    from siglo.blobs import BoundedBlobStore
    from siglo.errors import StorageAdapterError

    parts = urlsplit(POSTGRES_URL)
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        proxy.freeze()
        url = urlunsplit(parts._replace(netloc=f"{parts.username}@{proxy.url_host}"))
        store = BoundedBlobStore(open_blob_store(f"{url}?connect_timeout_ms=30000"), 500)
        began = time.monotonic()
        with pytest.raises(StorageAdapterError, match="timed out"):
            await store.get(blob_digest(b"{}"))
        took = time.monotonic() - began
        proxy.thaw()
        await store.aclose()
    assert took < 4.0, took
