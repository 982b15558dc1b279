"""Versioned schema migrations of the SQL backends.

A database created at schema version 1 (the committed fixture
``tests/support/fixtures/sql_schema_v1.*.sql``) is refused without ``auto_migrate``, upgraded in
place by ``siglo migrate URL`` or on first connect with its data intact; a database newer
than the code is refused with a clear error; several processes migrating at once are
safe.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sql_support import POSTGRES_URL, SHARED_KINDS, open_backend, race, require_postgres

import siglo
from siglo.cli import cli
from siglo_sql import SCHEMA_VERSION

FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures"
pytestmark = pytest.mark.parametrize("kind", SHARED_KINDS)


@asynccontextmanager
async def v1_database(kind: str) -> AsyncIterator[str]:
    """A database loaded from the version-1 fixture; yields its URL, removes it after."""
    if kind == "sqlite-file":
        with tempfile.TemporaryDirectory(prefix="siglo-v1-") as directory:
            path = Path(directory) / "v1.db"
            conn = sqlite3.connect(path)
            conn.executescript((FIXTURES / "sql_schema_v1.sqlite.sql").read_text())
            conn.close()
            yield f"sqlite:///{path}"
        return
    require_postgres()
    import psycopg

    from siglo_postgres import drop_schema

    schema = f"siglo_test_{secrets.token_hex(6)}"
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        async with conn.transaction():
            await conn.execute(f'SET LOCAL search_path TO "{schema}"')
            await conn.execute((FIXTURES / "sql_schema_v1.postgres.sql").read_text())  # type: ignore[arg-type]
    try:
        yield f"{POSTGRES_URL}?schema={schema}"
    finally:
        await drop_schema(POSTGRES_URL, schema)


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


async def check_v1_data(backend: siglo.Backend) -> None:
    """Every row of the fixture is there, read through version-2 code."""
    a = backend.adapter
    cp = await a.get_checkpoint("stack-1")
    assert cp is not None
    assert cp.revision == 3
    assert cp.contexts["main"]["note"] == "it's v1"
    ns = await a.get_checkpoint("stack-1", "tenant-a")
    assert ns is not None
    assert ns.revision == 7
    wait = await a.get_wait_record("order-1")
    assert wait is not None
    assert wait.event_type == "paid"
    assert wait.status == "waiting"
    latest = await a.get_wait_record("stack-1")
    assert latest is not None
    assert latest.correlation_key == "order-2"
    assert (await a.get_wait_record("embedded-missing")) is None
    assert await a.get_cached_step("rates") == {"EUR": 1.08}
    assert backend.idempotency
    assert backend.lock
    assert backend.nonces
    assert await backend.idempotency.claim("payment-1") == "completed"
    assert await backend.idempotency.get_result("payment-1") == {"ok": True}
    assert await backend.nonces.claim("sig-1", 60) is False
    # The held lock is still held, and version 2's fencing counter starts from it.
    assert (await backend.lock.acquire("nightly")).acquired is False
    assert await backend.lock.release("nightly", "lock_1_v1holder") is True
    assert (await backend.lock.acquire("nightly")).fencing_token == 1
    # Version 2's context stream works on the upgraded database.
    event = siglo.ContextChangeEvent(stack_id="stack-1", step_id="p", key="k", value=1, timestamp=1)
    await a.on_context_change(event)
    assert await a.get_context_changes("stack-1", "p") == {"k": 1}
    # And the claimed record can still be completed by its claimant.
    await a.complete_wait_record("order-2", "worker-1")
    # Version 4's listing columns were filled from the documents written before.
    page = await a.list_checkpoints()
    assert {(s.namespace, s.stack_id, s.revision, s.status, s.timestamp) for s in page.items} == {
        (None, "stack-1", 3, "waiting", 1_700_000_000_000),
        ("tenant-a", "stack-1", 7, "waiting", 1_700_000_000_000),
    }
    assert [s.revision for s in (await a.list_checkpoints(namespace="tenant-a")).items] == [7]


async def test_v1_is_refused_without_auto_migrate(kind: str) -> None:
    async with v1_database(kind) as url:
        backend = siglo.connect(url, auto_migrate=False)
        with pytest.raises(siglo.SchemaVersionError, match=r"schema version 1.*siglo migrate"):
            await backend.adapter.get_checkpoint("stack-1")
        await backend.aclose()


async def test_v1_upgraded_by_siglo_migrate(kind: str) -> None:
    async with v1_database(kind) as url:
        status = await asyncio.to_thread(run_cli, "migrate", url, "--status")
        assert status.exit_code == 0
        assert "schema version 1" in status.output
        result = await asyncio.to_thread(run_cli, "migrate", url)
        assert result.exit_code == 0, result.output
        assert f"from version 1 to {SCHEMA_VERSION}" in result.output
        again = await asyncio.to_thread(run_cli, "migrate", url)
        assert f"already at version {SCHEMA_VERSION}" in again.output
        async with siglo.connect(url, auto_migrate=False) as backend:
            await check_v1_data(backend)


async def test_v1_upgraded_on_first_connect(kind: str) -> None:
    async with v1_database(kind) as url, siglo.connect(url) as backend:
        await check_v1_data(backend)
        assert await backend.adapter.schema_version() == SCHEMA_VERSION  # type: ignore[attr-defined]


async def test_newer_database_is_refused(kind: str) -> None:
    async with open_backend(kind) as backend:
        await backend.adapter.open()  # type: ignore[attr-defined]
        db = backend.adapter.database  # type: ignore[attr-defined]
        table = "siglo_schema_version"
        if kind == "postgres":
            table = f'"{backend.adapter.schema}".{table}'  # type: ignore[attr-defined]
        await db.fetch(
            db.sql(
                f"INSERT INTO {table} (version, applied_at, description) "
                "VALUES (:version, 1, 'from the future')"
            ),
            {"version": SCHEMA_VERSION + 1},
        )
        later = siglo.connect(backend.url)
        with pytest.raises(siglo.SchemaVersionError, match="newer than this siglo"):
            await later.adapter.get_checkpoint("s")
        await later.aclose()
        result = await asyncio.to_thread(run_cli, "migrate", backend.url)
        assert result.exit_code == 1
        assert "newer than this siglo" in result.output
        # The hint is to upgrade siglo: `siglo migrate` cannot help a newer schema.
        assert "upgrade siglo" in result.output.split("Hint:", 1)[1]
        assert "migrate URL` upgrades" not in result.output


async def test_no_tables_and_no_auto_migrate(kind: str) -> None:
    async with open_backend(kind, auto_migrate=False) as backend:
        with pytest.raises(siglo.SchemaVersionError, match="no siglo tables"):
            await backend.adapter.open()  # type: ignore[attr-defined]


async def test_concurrent_migrate_from_processes(kind: str) -> None:
    async with open_backend(kind, auto_migrate=False) as backend:
        results = await race("migrate", backend.url)
        assert sorted(map(tuple, results)) == [(0, SCHEMA_VERSION)] + [(SCHEMA_VERSION,) * 2] * 3
        db = backend.adapter.database  # type: ignore[attr-defined]
        await db.connect_unchecked()
        table = "siglo_schema_version"
        if kind == "postgres":
            table = f'"{backend.adapter.schema}".{table}'  # type: ignore[attr-defined]
        rows = await db.raw_fetch(f"SELECT version FROM {table} ORDER BY version")
        assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


async def test_a_document_holding_a_nul_escape_is_migrated(kind: str) -> None:
    """A context may hold "\\u0000" in a string, which siglo stores and reads back. On
    PostgreSQL, migration 4 read every stored document as jsonb to fill the listing
    columns, and jsonb refuses that escape: the migration rolled back, for ever, and the
    store could not be opened (a black-box auditor, with a store an older siglo wrote)."""
    import json
    from hashlib import blake2b

    document = json.dumps(
        {
            "version": 2,
            "schemaVersion": "2.0.0",
            "stackId": "nul",
            "type": "execution",
            "status": "running",
            "revision": 1,
            "chains": ["s"],
            "contexts": {"s": {"v": "a\u0000b"}},
            "timestamp": 1_700_000_000_000,
        },
        separators=(",", ":"),
    ).encode()
    row_id = blake2b(b"\x00".join([b"", b"nul"]), digest_size=16).digest()
    insert = (
        "INSERT INTO siglo_checkpoints (id, namespace, stack_id, revision, status, gone_at, "
        "document) VALUES ({p}, '', 'nul', 1, 'running', NULL, {p})"
    )
    async with v1_database(kind) as url:
        if kind == "sqlite-file":
            with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
                conn.execute(insert.format(p="?"), (row_id, document))
        else:
            import psycopg

            schema = url.rsplit("schema=", 1)[1]
            async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn:
                await conn.execute(f'SET search_path TO "{schema}"')
                await conn.execute(insert.format(p="%s"), (row_id, document))  # type: ignore[arg-type]
                await conn.commit()
        result = await asyncio.to_thread(run_cli, "migrate", url)
        assert result.exit_code == 0, result.output
        async with siglo.connect(url, auto_migrate=False) as backend:
            stored = await backend.adapter.get_checkpoint("nul")
            assert stored is not None and stored.to_json() == document
            await check_v1_data_listing_of(backend, "nul")


async def check_v1_data_listing_of(backend: siglo.Backend, stack_id: str) -> None:
    """The listing columns of ``stack_id``'s row were filled by the migration."""
    page = await backend.adapter.list_checkpoints()
    (summary,) = [s for s in page.items if s.stack_id == stack_id]
    assert (summary.status, summary.timestamp) == ("running", 1_700_000_000_000)
