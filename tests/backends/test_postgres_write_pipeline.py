"""Concurrent keyed writes on PostgreSQL (``PostgresDatabase.write``): a write asked while
none is under way goes at once on a connection of its own; those asked while one is go
out together in one pipeline on one connection, committed by its one Sync, each with its
own outcome. Against the real server, on a private schema: the groups are counted on
the client, the transactions by the rows' ``xmin``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sql_support import base_url, open_backend

import siglo
from siglo import Checkpoint
from siglo_sql.schema import build_tables


@pytest.fixture
async def backend() -> AsyncIterator[siglo.Backend]:
    async with open_backend("postgres") as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


def cp(stack_id: str, revision: int = 1) -> Checkpoint:
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=1, contexts={"c": {"v": 1}})


def counted(db: Any) -> list[int]:
    """The size of each group of writes sent together from now on."""
    sizes: list[int] = []
    send = db._send_together

    async def counting(writes: list[Any]) -> None:
        sizes.append(len(writes))
        await send(writes)

    db._send_together = counting
    return sizes


async def xmins(db: Any, table: str, column: str, keys: list[str]) -> set[str]:
    rows = await db.fetch(
        f"SELECT xmin::text FROM {table} WHERE {column} = ANY(%(keys)s)", {"keys": keys}
    )
    return {row[0] for row in rows}


async def test_concurrent_saves_go_out_together_in_one_transaction(
    backend: siglo.Backend,
) -> None:
    """32 callers save at once: the first goes alone, the other 31 in one pipeline whose
    Sync commits them as one transaction (one ``xmin``); every save is stored."""
    adapter: Any = backend.adapter
    db = adapter.database
    sizes = counted(db)
    ids = [f"s{i}" for i in range(32)]
    await asyncio.gather(*(adapter.save_checkpoint(cp(i)) for i in ids))
    assert sizes == [31]
    table = build_tables(adapter.table_prefix, adapter.schema).checkpoints
    name = f'"{table.schema}"."{table.name}"' if table.schema else f'"{table.name}"'
    found = await xmins(db, name, "stack_id", ids[1:])
    assert len(found) == 1
    for i in ids:
        got = await adapter.get_checkpoint(i)
        assert got is not None and got.revision == 1


async def test_each_keeps_its_own_outcome_and_a_refused_one_fails_alone(
    backend: siglo.Backend,
) -> None:
    """In one group: compare-and-sets that expect the stored revision succeed, the others
    are refused (each its own conflict); a statement the server refuses fails only its
    own caller (the group is rolled back and each is sent again alone)."""
    adapter: Any = backend.adapter
    db = adapter.database
    for i in range(6):
        await adapter.save_checkpoint(cp(f"s{i}"), expected_revision=0)
    sizes = counted(db)
    results = await asyncio.gather(
        adapter.save_checkpoint(cp("first", 1)),  # goes alone
        *(
            adapter.save_checkpoint(
                cp(f"s{i}", 2) if i % 2 else cp(f"s{i}", 7), expected_revision=1 if i % 2 else 6
            )
            for i in range(6)
        ),
        db.write("SELECT 1 / 0"),
        return_exceptions=True,
    )
    assert sizes == [7]
    assert results[0] is None
    for i in range(6):
        result = results[1 + i]
        got = await adapter.get_checkpoint(f"s{i}")
        assert got is not None
        if i % 2:
            assert result is None and got.revision == 2
        else:
            assert isinstance(result, siglo.CheckpointConflictError), result
            assert got.revision == 1
    assert isinstance(results[7], siglo.StorageAdapterError)
    assert "division by zero" in str(results[7])


async def test_a_sequential_write_goes_alone(backend: siglo.Backend) -> None:
    adapter: Any = backend.adapter
    sizes = counted(adapter.database)
    for revision in range(1, 6):
        await adapter.save_checkpoint(cp("s", revision), expected_revision=revision - 1)
    assert sizes == []


async def test_a_write_refused_before_it_was_sent_fails_alone_and_no_write_twice(
    backend: siglo.Backend,
) -> None:
    """A write whose parameters the driver cannot send (refused on the client, before the
    pipeline's Sync): only its caller fails, and the writes sent with it are committed
    once (each increments a counter exactly once)."""
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    table = f"gc_counts_{secrets.token_hex(4)}"
    await db.write(f"CREATE TABLE {table} (k int PRIMARY KEY, n int NOT NULL)")
    try:
        await bump_each_once(db, table)
    finally:
        await db.write(f"DROP TABLE {table}")


async def bump_each_once(db: Any, table: str) -> None:
    await db.write(f"INSERT INTO {table} VALUES (1, 0), (2, 0), (3, 0)")
    bump = f"UPDATE {table} SET n = n + 1 WHERE k = %(k)s RETURNING n"
    sizes = counted(db)
    results = await asyncio.gather(
        db.write(bump, {"k": 1}),  # goes alone
        db.write(bump, {"k": 2}),
        db.write(bump, {"k": object()}),  # no way to send an object
        db.write(bump, {"k": 3}),
        return_exceptions=True,
    )
    assert sizes == [3]
    assert results[0] == [(1,)] and results[1] == [(1,)] and results[3] == [(1,)]
    assert isinstance(results[2], siglo.StorageAdapterError)
    assert await db.fetch(f"SELECT k, n FROM {table} ORDER BY k") == [(1, 1), (2, 1), (3, 1)]


async def test_a_write_sent_together_that_waits_for_a_row_holds_no_other_callers(
    backend: siglo.Backend,
) -> None:
    """Writes sent together are one transaction: one of them waiting for a row another
    transaction holds kept every row the others had written locked, and their callers
    waiting, until that transaction ended (two processes' batches each waiting for the
    other's row deadlocked). Past the batch's lock timeout the batch is rolled back and
    each write sent again alone: the others are answered while the row is still held,
    and every write is done once."""
    db, table, bump = await _two_rows(backend, "gc_rows")
    async with await psycopg.AsyncConnection.connect(base_url("postgres")) as holder:
        await holder.execute(f"SELECT 1 FROM {table} WHERE k = 1 FOR UPDATE")
        first = asyncio.ensure_future(db.write(bump, {"k": 1}))  # alone, waits for row 1
        await asyncio.sleep(0.2)
        sizes = counted(db)
        other = asyncio.ensure_future(db.write(bump, {"k": 2}))
        same = asyncio.ensure_future(db.write(bump, {"k": 1}))
        done, _ = await asyncio.wait({other}, timeout=5)
        assert other in done, "a write sent together waited for another's row"
        assert sizes == [2]
        assert not first.done() and not same.done()
        await holder.commit()
    assert sorted([(await first)[0][0], (await same)[0][0]]) == [1, 2]
    assert await other == [(1,)]
    assert await db.fetch(f"SELECT k, n FROM {table} ORDER BY k") == [(1, 2), (2, 1)]


@pytest.mark.parametrize("call", ["raw_fetch", "fetch_all"])
async def test_a_statement_failed_to_break_a_deadlock_is_sent_again(
    backend: siglo.Backend, call: str
) -> None:
    """A statement (or ``fetch_all``'s transaction) that PostgreSQL fails to break a
    deadlock was rolled back, nothing of it done: it is sent again, and its caller gets
    its answer, not ``DeadlockDetected``. Here it takes two locks, the second held by
    another session that then asks for the first; the statement, which waited first, is
    the one PostgreSQL fails (after its ``deadlock_timeout``)."""
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    one, two = (secrets.randbits(62) for _ in range(2))
    # Taken in the order written (a select list is evaluated left to right).
    both = "SELECT pg_advisory_xact_lock(%(one)s), pg_advisory_xact_lock(%(two)s), 7"
    params = {"one": one, "two": two}
    async with await psycopg.AsyncConnection.connect(base_url("postgres")) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(%s)", (two,))
        if call == "raw_fetch":
            asked = asyncio.ensure_future(db.raw_fetch(both, params))
        else:
            asked = asyncio.ensure_future(db.fetch_all([(both, params)]))
        await asyncio.sleep(0.3)  # it holds `one` and waits for `two`
        await holder.execute("SELECT pg_advisory_xact_lock(%s)", (one,))  # a deadlock
        await holder.commit()
    rows = await asyncio.wait_for(asked, 10)
    answer = rows if call == "raw_fetch" else rows[0]
    assert [row[-1] for row in answer] == [7]


async def test_a_write_whose_caller_has_gone_is_not_sent_again_alone(
    backend: siglo.Backend,
) -> None:
    """A batch rolled back past its lock timeout sends its writes again alone, but not
    one whose caller was cut off meanwhile: the rollback undid it, and its caller may
    have made up for it already (a delivery cut off gives back the claim it might have
    made; sent after that, the claim stayed with nobody — a full run met one)."""
    db, table, bump = await _two_rows(backend, "gc_gone")
    async with await psycopg.AsyncConnection.connect(base_url("postgres")) as holder:
        await holder.execute(f"SELECT 1 FROM {table} WHERE k = 1 FOR UPDATE")
        first = asyncio.ensure_future(db.write(bump, {"k": 1}))  # alone, waits for row 1
        await asyncio.sleep(0.2)
        other = asyncio.ensure_future(db.write(bump, {"k": 2}))
        gone = asyncio.ensure_future(db.write(bump, {"k": 1}))
        await asyncio.sleep(0.01)  # the two sent together, waiting for row 1
        gone.cancel()
        assert await asyncio.wait_for(other, 5) == [(1,)]
        await holder.commit()
    assert await first == [(1,)]
    await asyncio.sleep(0.3)  # time for a write sent again to land
    assert await db.fetch(f"SELECT k, n FROM {table} ORDER BY k") == [(1, 1), (2, 1)]


async def _two_rows(backend: siglo.Backend, name: str) -> tuple[Any, str, str]:
    """The backend's database, a table of two rows (``k`` 1 and 2, ``n`` 0) in its
    schema, and the statement that bumps a row's ``n``."""
    adapter: Any = backend.adapter
    db = adapter.database
    table = f"{adapter.schema}.{name}_{secrets.token_hex(4)}"
    await db.write(f"CREATE TABLE {table} (k int PRIMARY KEY, n int NOT NULL)")
    await db.write(f"INSERT INTO {table} VALUES (1, 0), (2, 0)")
    return db, table, f"UPDATE {table} SET n = n + 1 WHERE k = %(k)s RETURNING n"
