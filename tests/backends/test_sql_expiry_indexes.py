"""The SQL backends' expiry indexes: the sweeps use them, and (schema version 3) the
indexes on a ``gone_at`` that may be ``NULL`` hold only the rows that can expire.

The plans are read from each database's own ``EXPLAIN``. PostgreSQL prefers a sequential
scan of a small table, so there the test turns sequential scans off: what is checked is
that the planner *can* use the index for the sweep's condition (a partial index is only
usable when the query's condition implies the index's).
"""

from __future__ import annotations

from typing import Any

import pytest
from sql_support import SHARED_KINDS, open_backend

from siglo import Checkpoint
from siglo_sql.keys import row_id
from siglo_sql.schema import SCHEMA_VERSION

pytestmark = pytest.mark.parametrize("kind", SHARED_KINDS)

# (statement of siglo_sql.statements, table suffix, partial since version 3)
SWEEPS = (
    ("cp_clean_batch", "checkpoints", True),
    ("wait_clean_batch", "wait_records", True),
    ("cache_clean_batch", "step_cache", False),
    ("ctx_clean_batch", "context_changes", True),
    ("idem_clean_batch", "idempotency_keys", False),
    ("lock_clean_batch", "locks", True),
    ("nonce_clean_batch", "nonces", False),
)


async def _plan(adapter: Any, kind: str, sql: str) -> str:
    db = adapter.database
    sql = db.sql(sql)
    if kind == "postgres":
        async with db.transaction() as tx:
            await tx.fetch("SET LOCAL enable_seqscan = off")
            rows = await tx.fetch("EXPLAIN " + sql, {"now": 0, "limit": 10})
        return "\n".join(str(r[0]) for r in rows)
    rows = await db.fetch("EXPLAIN QUERY PLAN " + sql, {"now": 0, "limit": 10})
    return "\n".join(str(r[-1]) for r in rows)


@pytest.mark.parametrize(("statement", "table", "partial"), SWEEPS)
async def test_sweep_uses_the_expiry_index(
    kind: str, statement: str, table: str, partial: bool
) -> None:
    async with open_backend(kind) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        plan = await _plan(adapter, kind, getattr(adapter._s, statement))
        assert f"siglo_{table}_gone_at" in plan, plan


async def _index_definitions(adapter: Any, kind: str) -> dict[str, str]:
    db = adapter.database  # raw_fetch: also before the schema is current
    if kind == "postgres":
        rows = await db.raw_fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s",
            (adapter.schema,),
        )
    else:
        rows = await db.raw_fetch("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
    return {str(name): str(sql) for name, sql in rows if sql is not None}


async def test_expiry_indexes_are_partial_where_gone_at_may_be_null(kind: str) -> None:
    assert SCHEMA_VERSION >= 3
    async with open_backend(kind) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        indexes = await _index_definitions(adapter, kind)
        for _, table, partial in SWEEPS:
            definition = indexes[f"siglo_{table}_gone_at"]
            assert ("IS NOT NULL" in definition) is partial, definition


async def test_version_2_database_migrates_to_partial_indexes(kind: str) -> None:
    async with open_backend(kind, auto_migrate=False) as backend:
        adapter: Any = backend.adapter
        assert await adapter.migrate(target=2) == (0, 2)
        before = await _index_definitions(adapter, kind)
        assert "IS NOT NULL" not in before["siglo_checkpoints_gone_at"]
        # Rows written at version 2, one expired and one kept until removed, survive
        # the migration and are swept correctly through the new index.
        db = adapter.database
        # The columns of version 2 (later versions add columns the current save sets).
        save = db.sql(
            "INSERT INTO siglo_checkpoints (id, namespace, stack_id, revision, status, "
            "gone_at, document) VALUES (:id, '', :stack_id, 1, 'running', :gone_at, :document)"
            if kind != "postgres"
            else f"INSERT INTO {adapter.schema}.siglo_checkpoints (id, namespace, stack_id, "
            "revision, status, gone_at, document) "
            "VALUES (:id, '', :stack_id, 1, 'running', :gone_at, :document)"
        )
        for stack_id, gone_at in (("kept", None), ("expired", 1)):
            doc = Checkpoint(stack_id=stack_id, revision=1, timestamp=1).to_json()
            key = row_id("", stack_id)
            row = {"id": key, "stack_id": stack_id, "gone_at": gone_at, "document": doc}
            await db.raw_fetch(save, row)
        assert await adapter.migrate() == (2, SCHEMA_VERSION)
        kept = await adapter.get_checkpoint("kept")
        assert kept is not None
        assert kept.revision == 1
        assert await adapter.clean_expired_checkpoints() == 1
        assert await adapter.get_checkpoint("kept") is not None
        after = await _index_definitions(adapter, kind)
        assert "IS NOT NULL" in after["siglo_checkpoints_gone_at"]
        assert await adapter.schema_version() == SCHEMA_VERSION
