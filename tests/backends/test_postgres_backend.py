"""PostgreSQL specifics: URL forms and options, pool settings, an application's engine."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo import Checkpoint
from siglo_postgres import connect_engine, drop_schema


@pytest.fixture
async def schema() -> object:
    require_postgres()
    name = f"siglo_test_{secrets.token_hex(6)}"
    yield name
    await drop_schema(POSTGRES_URL, name)


def cp(revision: int = 1) -> Checkpoint:
    return Checkpoint(stack_id="s", revision=revision, timestamp=1)


async def test_url_forms_and_options(schema: str) -> None:
    _scheme, rest = POSTGRES_URL.split("://", 1)
    url = f"postgresql+psycopg://{rest}?schema={schema}&application_name=siglo-test"
    async with siglo.connect(url, pool_max_size=2, prepare_threshold=None) as backend:
        assert backend.name == "postgres"
        assert f"schema={schema}" in backend.url
        await backend.adapter.save_checkpoint(cp())
        db = backend.adapter.database  # type: ignore[attr-defined]
        assert db.pool_max_size == 2
        assert db.prepare_threshold is None
        rows = await db.fetch("SELECT current_setting('application_name')")
        assert rows == [("siglo-test",)]
        rows = await db.fetch(
            db.sql(
                "SELECT data_type FROM information_schema.columns WHERE table_schema = :schema "
                "AND table_name = 'siglo_checkpoints' AND column_name = 'document'"
            ),
            {"schema": schema},
        )
        assert rows == [("bytea",)]
        # More concurrent operations than pooled connections: they queue, all succeed.
        await asyncio.gather(*(backend.adapter.set_cached_step(f"k{i}", i) for i in range(20)))
    # Another connection with the backend's URL reaches the same tables.
    async with siglo.connect(f"postgres://{rest}?schema={schema}") as again:
        assert await again.adapter.get_checkpoint("s") == cp()
    async with siglo.connect(POSTGRES_URL, schema=schema, table_prefix="other_") as other:
        assert await other.adapter.get_checkpoint("s") is None


async def test_bad_options_are_named() -> None:
    with pytest.raises(siglo.InvalidArgumentError, match="bogus"):
        siglo.connect(POSTGRES_URL, bogus=1)
    with pytest.raises(siglo.InvalidArgumentError, match="schema"):
        siglo.connect(POSTGRES_URL, schema='x"; DROP TABLE y')
    with pytest.raises(siglo.InvalidArgumentError, match="pool_max_size"):
        siglo.connect(POSTGRES_URL + "?pool_max_size=many")


async def test_application_engine(schema: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    _scheme, rest = POSTGRES_URL.split("://", 1)
    engine = create_async_engine(f"postgresql+psycopg://{rest}")
    try:
        backend = connect_engine(engine, schema=schema)
        a = backend.adapter
        await a.save_checkpoint(cp())
        await a.save_checkpoint(cp(2), expected_revision=1)
        with pytest.raises(siglo.CheckpointConflictError):
            await a.save_checkpoint(cp(3), expected_revision=1)
        await a.save_wait_record(siglo.WaitRecord(correlation_key="k", stack_id="s"))
        await a.cancel_workflow("s")  # a transaction on the engine's connection
        got = await a.get_checkpoint("s")
        assert got is not None
        assert got.status == "cancelled"
        assert got.revision == 3
        await backend.aclose()
        async with engine.connect() as conn:  # the engine is still the application's
            rows = await conn.execute(text(f'SELECT revision FROM "{schema}".siglo_checkpoints'))
            assert rows.all() == [(3,)]
    finally:
        await engine.dispose()


async def test_documents_are_lz4_compressed_where_the_server_has_it(schema: str) -> None:
    async with siglo.connect(f"{POSTGRES_URL}?schema={schema}") as backend:
        adapter = backend.adapter
        big = {"main": {"text": "checkpoint " * 30_000}}  # ~330 KB: stored compressed
        await adapter.save_checkpoint(
            Checkpoint(stack_id="s", revision=1, timestamp=1, contexts=big)
        )
        db = adapter.database  # type: ignore[attr-defined]
        rows = await db.fetch(
            "SELECT name FROM pg_settings WHERE name = 'default_toast_compression' "
            "AND 'lz4' = ANY (enumvals)"
        )
        has_lz4 = bool(rows)
        columns = await db.fetch(
            "SELECT c.relname, a.attname, a.attcompression FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND a.attname IN ('document', 'value', 'result', "
            "'event_payload', 'body') AND c.relkind = 'r'",
            (schema,),
        )
        assert len(columns) == 7, columns
        expected = "l" if has_lz4 else ""
        assert {str(row[2]) for row in columns} == {expected}, columns
        # Saved incrementally (over 64 KiB): the context is a checkpoint_parts body.
        stored = await db.fetch(
            f'SELECT pg_column_compression(body) FROM "{schema}".siglo_checkpoint_parts'
        )
        assert stored[0][0] == ("lz4" if has_lz4 else "pglz")
        loaded = await adapter.get_checkpoint("s")
        assert loaded is not None
        assert loaded.contexts == big
