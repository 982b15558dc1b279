"""``Database.fetch_all``: several statements as one transaction, sent together.

On PostgreSQL they go out in psycopg's pipeline mode: every statement, then one Sync, one
round trip (counted here in libpq's own protocol trace), one implicit transaction that an
error anywhere rolls back. On SQLite they run one after another in ``BEGIN IMMEDIATE``.
The adapter uses it where a write is several statements with nothing to decide between
them: deleting a checkpoint without an expected revision, a context change on a backend
with a retention, a wait record where the dialect has no writable CTE.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from sql_support import open_backend, refusing_trigger

import siglo
from siglo import Checkpoint, ContextChangeEvent


@pytest.fixture(params=["sqlite-file", "postgres"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[siglo.Backend]:
    options: dict[str, Any] = {"checkpoint_ttl_ms": 3_600_000}
    if request.param == "postgres":
        options |= {"pool_min_size": 1, "pool_max_size": 1}
    async with open_backend(request.param, **options) as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


async def scratch(backend: siglo.Backend) -> str:
    adapter: Any = backend.adapter
    table = f"{adapter.schema}.scratch" if backend.name == "postgres" else "scratch"
    await adapter.database.fetch(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, v TEXT)")
    return table


async def test_the_rows_of_each_statement_in_order(backend: siglo.Backend) -> None:
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    t = await scratch(backend)
    out = await db.fetch_all(
        [
            (db.sql(f"INSERT INTO {t} (id, v) VALUES (:id, :v) RETURNING id"), {"id": 1, "v": "a"}),
            (db.sql(f"INSERT INTO {t} (id, v) VALUES (:id, :v)"), {"id": 2, "v": "b"}),
            (db.sql(f"SELECT id, v FROM {t} WHERE id <= :top ORDER BY id"), {"top": 9}),
        ]
    )
    # The third statement sees what the first two wrote: they run in order.
    assert out == [[(1,)], [], [(1, "a"), (2, "b")]]


async def test_an_error_in_any_statement_undoes_them_all(backend: siglo.Backend) -> None:
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    t = await scratch(backend)
    insert = db.sql(f"INSERT INTO {t} (id, v) VALUES (:id, :v)")
    with pytest.raises(siglo.StorageAdapterError, match=r"(?i)unique"):
        await db.fetch_all([(insert, {"id": 1, "v": "a"}), (insert, {"id": 1, "v": "again"})])
    assert await db.fetch(f"SELECT count(*) FROM {t}") == [(0,)]
    # The connection is usable afterwards (the pool's one connection on PostgreSQL).
    await db.fetch_all([(insert, {"id": 1, "v": "a"})])
    assert await db.fetch(f"SELECT v FROM {t}") == [("a",)]


async def test_a_delete_refused_at_its_last_statement_changes_nothing(
    backend: siglo.Backend,
) -> None:
    """Deleting a checkpoint removes its wait records and context streams in the same
    transaction; when the last of those statements fails, the checkpoint and its wait
    record are still there."""
    adapter: Any = backend.adapter
    now = adapter.clock.now_ms()
    await adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=now))
    await adapter.save_wait_record(
        siglo.WaitRecord(stack_id="s", step_id="p", correlation_key="k", created_at=now)
    )
    await adapter.on_context_change(
        ContextChangeEvent(stack_id="s", step_id="p", key="f", value=1, timestamp=now)
    )
    drop = await refusing_trigger(backend, "context_changes", "DELETE", "not today")
    with pytest.raises(siglo.StorageAdapterError, match="not today"):
        await adapter.delete_checkpoint("s")
    assert (await adapter.get_checkpoint("s")) is not None
    assert (await adapter.get_wait_record("k")) is not None
    assert await adapter.get_context_changes("s", "p") == {"f": 1}
    await adapter.database.fetch(drop)
    assert await adapter.delete_checkpoint("s") is True
    assert await adapter.get_checkpoint("s") is None
    assert await adapter.get_wait_record("k") is None
    assert await adapter.get_context_changes("s", "p") == {}


@asynccontextmanager
async def traced(
    backend: siglo.Backend,
) -> AsyncIterator[Callable[[Awaitable[Any]], Awaitable[int]]]:
    """libpq's protocol trace of the backend's pool's one connection, while in the block;
    yields ``round_trips(call)``: how many round trips the connection made while ``call``
    ran. Each Sync (the end of extended-protocol messages) and each simple Query
    (psycopg's ``BEGIN`` and ``COMMIT``) waits for the server's answer."""
    pool = backend.adapter.database._pool.pool  # type: ignore[attr-defined]  # psycopg's
    with tempfile.TemporaryFile("w+") as trace:
        async with pool.connection() as conn:
            conn.pgconn.trace(trace.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

        async def round_trips(call: Awaitable[Any]) -> int:
            trace.seek(0, os.SEEK_END)
            start = trace.tell()
            await call
            trace.seek(start)
            return sum(
                line.split()[:1] == ["F"] and line.split()[2] in ("Sync", "Query") for line in trace
            )

        try:
            yield round_trips
        finally:
            async with pool.connection() as conn:
                conn.pgconn.untrace()


async def test_on_postgres_they_are_one_round_trip() -> None:
    """libpq's trace of the pool's one connection: a delete (four statements) and a context
    change with a retention (three) are one round trip each (one Sync, no ``BEGIN``); a
    delete with an expected revision, which decides between its statements, takes its
    transaction's round trips."""
    async with open_backend(
        "postgres", checkpoint_ttl_ms=3_600_000, pool_min_size=1, pool_max_size=1
    ) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        now = adapter.clock.now_ms()
        for n in (1, 2):
            await adapter.save_checkpoint(Checkpoint(stack_id=f"s{n}", revision=1, timestamp=now))
        event = ContextChangeEvent(stack_id="s1", step_id="p", key="f", value=1, timestamp=now)
        # Outside the trace: a statement run on its own is prepared on first use (a round
        # trip more); pipelined ones are prepared in the pipeline.
        await adapter.save_wait_record(siglo.WaitRecord(stack_id="s3", correlation_key="k0"))
        async with traced(backend) as round_trips:
            assert await round_trips(adapter.on_context_change(event)) == 1
            assert await round_trips(adapter.delete_checkpoint("s1")) == 1
            assert await round_trips(adapter.delete_checkpoint("s2", expected_revision=1)) > 1
            # A wait record and its by-stack index: one statement (a writable CTE) here.
            wait = siglo.WaitRecord(stack_id="s3", correlation_key="k3", created_at=now)
            assert await round_trips(adapter.save_wait_record(wait)) == 1
        assert await adapter.get_checkpoint("s1") is None
        assert await adapter.get_context_changes("s1", "p") == {}
        assert await adapter.get_wait_record("k3") is not None


async def test_without_pipeline_mode_they_run_in_a_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A psycopg on a libpq older than 14 has no pipeline mode (not producible with the
    binary wheel installed here, so the flag is set by hand): the statements then run one
    after another in a transaction, with the same result."""
    from siglo_postgres import database

    monkeypatch.setattr(database, "PIPELINE_MODE", False)
    async with open_backend("postgres", pool_min_size=1, pool_max_size=1) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        # Once untraced: each statement is prepared on its first use (a round trip more).
        await adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        assert await adapter.delete_checkpoint("s") is True
        await adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        async with traced(backend) as round_trips:
            # BEGIN, the four statements, COMMIT.
            assert await round_trips(adapter.delete_checkpoint("s")) == 6
        assert await adapter.get_checkpoint("s") is None
