"""SQL listing, deleting and due waits: every walk, sweep and lookup of SPEC §9 follows
an index (read from each database's own EXPLAIN), and pages stay exact over many rows.

PostgreSQL prefers a sequential scan of a small table, so there sequential scans, bitmap
scans and sorts are turned off: what is checked is that the planner *can* answer the query
through the index without sorting (as tests/backends/test_sql_expiry_indexes.py does for the
sweeps).
"""

from __future__ import annotations

from typing import Any

import pytest
from sql_support import SHARED_KINDS, open_backend

from siglo import Checkpoint
from siglo.listing import ListQuery, encode_cursor
from siglo_sql.listing import page_conditions

pytestmark = pytest.mark.parametrize("kind", SHARED_KINDS)


async def _plan(adapter: Any, kind: str, sql: str, params: dict[str, Any]) -> str:
    db = adapter.database
    sql = db.sql(sql)
    if kind == "postgres":
        async with db.transaction() as tx:
            # "can": a plan with a sort (or a bitmap scan, which sorts) is costed out
            # unless nothing else answers the query.
            for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
                await tx.fetch(f"SET LOCAL {setting} = off")
            rows = await tx.fetch("EXPLAIN " + sql, params)
        return "\n".join(str(r[0]) for r in rows)
    rows = await db.fetch("EXPLAIN QUERY PLAN " + sql, params)
    return "\n".join(str(r[-1]) for r in rows)


async def _list_plan(adapter: Any, kind: str, query: ListQuery) -> str:
    where, params = page_conditions(query, adapter.database.dialect_name)
    sql = adapter._s.cp_list.format(where=where)
    return await _plan(adapter, kind, sql, {**params, "now": 0, "limit": 101})


@pytest.mark.rule("list.walk")
async def test_a_namespace_walk_follows_the_namespace_index(kind: str) -> None:
    async with open_backend(kind) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        cursor = encode_cursor(bytes(16).hex())
        for query in (
            ListQuery(namespace="tenant"),
            ListQuery(namespace="tenant", cursor=cursor, statuses=frozenset({"completed"})),
            ListQuery(namespace=None, cursor=cursor),
            # As long as the indexed prefix: the whole namespace is compared as well.
            ListQuery(namespace="n" * 250, cursor=cursor),
        ):
            plan = await _list_plan(adapter, kind, query)
            assert "siglo_checkpoints_namespace" in plan, plan
            assert "TEMP B-TREE" not in plan.upper() and "Sort" not in plan, plan


@pytest.mark.rule("list.walk")
async def test_a_walk_of_every_namespace_follows_the_primary_key(kind: str) -> None:
    async with open_backend(kind) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        cursor = encode_cursor(bytes(16).hex())
        for query in (ListQuery(), ListQuery(cursor=cursor, workflow_id="wf")):
            plan = await _list_plan(adapter, kind, query)
            if kind == "postgres":
                assert "siglo_checkpoints_pkey" in plan, plan
                assert "Sort" not in plan, plan
            else:
                assert "PRIMARY KEY" in plan or "sqlite_autoindex_siglo_checkpoints" in plan, plan
                assert "TEMP B-TREE" not in plan.upper(), plan


@pytest.mark.rule("waits.due")
async def test_due_waits_follow_the_deadline_index(kind: str) -> None:
    async with open_backend(kind) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        plan = await _plan(adapter, kind, adapter._s.wait_due, {"now": 0, "limit": 10})
        assert "siglo_wait_records_deadline" in plan, plan
        # Only waits that can still fire are indexed: the history is never scanned.
        db = adapter.database
        if kind == "postgres":
            rows = await db.fetch(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'siglo_wait_records_deadline'"
                f" AND schemaname = '{adapter.schema}'"
            )
        else:
            rows = await db.fetch(
                "SELECT sql FROM sqlite_master WHERE name = 'siglo_wait_records_deadline'"
            )
        assert "status" in str(rows[0][0]), rows


@pytest.mark.rule("delete.stack")
async def test_deleting_a_stack_follows_indexes(kind: str) -> None:
    async with open_backend(kind) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        s = adapter._s
        params = {"stack_id_prefix": "x", "stack_id": "x", "namespace": ""}
        plan = await _plan(adapter, kind, s.ctx_delete_stack, params)
        assert "siglo_context_changes_stack" in plan, plan
        plan = await _plan(adapter, kind, s.wait_delete_stack, {"stack_ref": bytes(16)})
        assert "siglo_wait_records_stack" in plan, plan


@pytest.mark.rule("list.walk")
async def test_long_namespaces_walk_exactly(kind: str) -> None:
    """Namespaces alike in their first 200 characters (what the index holds) stay apart."""
    async with open_backend(kind) as backend:
        a = backend.adapter
        base = "ň" * 250
        for i, namespace in enumerate((base + "a", base + "b", base)):
            for j in range(5):
                await a.save_checkpoint(
                    Checkpoint(stack_id=f"s{j}", revision=1, timestamp=i, namespace=namespace)
                )
        for namespace in (base + "a", base + "b", base):
            seen: list[str] = []
            cursor = None
            while True:
                page = await a.list_checkpoints(namespace=namespace, limit=2, cursor=cursor)
                assert all(s.namespace == namespace for s in page.items)
                seen += [s.stack_id for s in page.items]
                if (cursor := page.next_cursor) is None:
                    break
            assert sorted(seen) == [f"s{j}" for j in range(5)]
