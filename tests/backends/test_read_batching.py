"""Concurrent checkpoint loads share one statement on SQLite and PostgreSQL
(siglo_sql.batching): what every SQL backend must show, against the real database.

The statements that ran are read where each driver lets us see them: SQLite's own trace
callback on the backend's connection, and on PostgreSQL a recorder wrapped around the
database's real ``fetch`` (it records, then runs them). The failure and cancellation
cases that depend on the driver are in ``test_sql_read_batching.py`` (SQLite) and
``test_postgres_read_batching.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sql_support import open_backend

import siglo
from siglo import Checkpoint


# SQLite in memory: on a file, keyed reads run at once on the event loop's thread
# (SqliteDatabase.read, test_sqlite_reader.py) and none ever queues.
@pytest.fixture(params=["sqlite-memory", "postgres"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[siglo.Backend]:
    async with open_backend(request.param) as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


async def statements_run(backend: siglo.Backend) -> list[str]:
    """Every statement the backend's database runs from now on."""
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    statements: list[str] = []
    conn = getattr(getattr(db, "_driver", None), "conn", None)  # SQLite's aiosqlite connection
    if conn is not None and hasattr(conn, "set_trace_callback"):
        await conn.set_trace_callback(statements.append)  # on the connection's thread
        return statements
    real = db.fetch

    async def fetch(sql: str, params: Any = ()) -> Any:
        statements.append(sql)
        return await real(sql, params)

    db.fetch = fetch
    return statements


def reads_in(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith("SELECT")]


async def save(backend: siglo.Backend, stack_id: str, revision: int, **kw: Any) -> None:
    cp = Checkpoint(stack_id=stack_id, revision=revision, timestamp=1, **kw)
    await backend.adapter.save_checkpoint(cp)


async def test_concurrent_loads_share_statements_and_read_what_is_stored(
    backend: siglo.Backend,
) -> None:
    adapter: Any = backend.adapter
    for i in range(40):
        await save(backend, f"s{i}", i + 1)
    await save(backend, "expired", 1, expires_at=adapter.clock.now_ms() - 1)
    await save(backend, "s1", 7, namespace="tenant")  # another row, same stack id
    statements = await statements_run(backend)
    ids = [f"s{i}" for i in range(40)] + ["s3", "s3", "missing", "expired"]
    found = await asyncio.gather(*(adapter.get_checkpoint(i) for i in ids))
    assert [None if cp is None else (cp.stack_id, cp.revision) for cp in found] == [
        *((f"s{i}", i + 1) for i in range(40)),
        ("s3", 4),
        ("s3", 4),
        None,
        None,
    ]
    reads = reads_in(statements)
    # The first lookup runs alone; the 43 that queued behind it share one batch (<= 64).
    assert len(reads) == 2, reads
    assert " IN (" in reads[1]


async def test_callers_that_ask_again_at_once_share_the_next_batch(
    backend: siglo.Backend,
) -> None:
    """32 callers loading 3 times each, one after another: the first lookup runs alone,
    and every later one shares a batch. The callers a batch answered ask again in the
    loop's next turn; had the first of them run its lookup alone again, each batch would
    cost a lone statement more (6 reads instead of 4)."""
    adapter: Any = backend.adapter
    for i in range(32):
        await save(backend, f"c{i}", i + 1)
    statements = await statements_run(backend)

    async def caller(i: int) -> list[int]:
        out = []
        for _ in range(3):
            cp = await adapter.get_checkpoint(f"c{i}")
            assert cp is not None
            out.append(cp.revision)
        return out

    revisions = await asyncio.gather(*(caller(i) for i in range(32)))
    assert revisions == [[i + 1] * 3 for i in range(32)]
    reads = reads_in(statements)
    assert len(reads) == 4, reads
    assert " IN (" not in reads[0] and all(" IN (" in s for s in reads[1:])


async def test_sequential_loads_run_alone(backend: siglo.Backend) -> None:
    await save(backend, "a", 1)
    statements = await statements_run(backend)
    for _ in range(3):
        assert await backend.adapter.get_checkpoint("a") is not None
    reads = reads_in(statements)
    assert len(reads) == 3
    assert not any(" IN (" in s for s in reads)


async def test_a_batch_sees_writes_that_finished_before_it_was_asked(
    backend: siglo.Backend,
) -> None:
    adapter: Any = backend.adapter
    await save(backend, "a", 1)
    first = asyncio.ensure_future(adapter.get_checkpoint("a"))
    await asyncio.sleep(0)  # the first lookup is running; the save queues or commits
    await save(backend, "a", 2)
    later = await adapter.get_checkpoint("a")  # asked after the save returned
    assert (await first) is not None
    assert later is not None
    assert later.revision == 2
