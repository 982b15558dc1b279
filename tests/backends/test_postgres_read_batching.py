"""Concurrent checkpoint loads on PostgreSQL (siglo_sql.batching): a failing batch and
the callers of a running batch cancelled. What SQLite and PostgreSQL share is in
``test_read_batching.py``.

Against the real server, on a private schema: a failing batch is SQL that PostgreSQL
rejects, and a slow batch is a real ``pg_sleep``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sql_support import open_backend

import siglo
from siglo import Checkpoint
from siglo.errors import StorageAdapterError
from siglo_sql.batching import KeyedReads
from siglo_sql.keys import row_id
from siglo_sql.statements import many_ids


@pytest.fixture
async def backend() -> AsyncIterator[siglo.Backend]:
    async with open_backend("postgres") as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


async def save(backend: siglo.Backend, stack_id: str, revision: int, **kw: Any) -> None:
    cp = Checkpoint(stack_id=stack_id, revision=revision, timestamp=1, **kw)
    await backend.adapter.save_checkpoint(cp)


def reads_with(backend: siglo.Backend, many: str) -> KeyedReads:
    adapter: Any = backend.adapter
    db = adapter.database
    return KeyedReads(
        db,
        adapter._s.cp_get,
        lambda n: db.sql(many.format(ids=many_ids(n))),
        adapter.clock.now_ms,
    )


async def test_a_failing_batch_fails_its_callers_only(backend: siglo.Backend) -> None:
    await save(backend, "a", 1)
    reads = reads_with(
        backend, "SELECT id, document FROM no_such_table WHERE id IN ({ids}) AND ? > 0"
    )
    key = row_id("", "a")
    results = await asyncio.gather(reads.get(key), reads.get(key), return_exceptions=True)
    assert isinstance(results[0], bytes)  # ran alone, with the single-key statement
    assert isinstance(results[1], StorageAdapterError)
    assert "no_such_table" in str(results[1])
    assert await reads.get(key) == results[0]  # usable afterwards


async def test_cancelled_callers_of_a_running_batch_leave_the_others_answered(
    backend: siglo.Backend,
) -> None:
    adapter: Any = backend.adapter
    for name in ("a", "b", "c", "d"):
        await save(backend, name, 1)
    # The batch statement sleeps 0.3 s in the server before answering.
    slow = adapter._s.cp_get_many.replace("WHERE", "WHERE pg_sleep(0.3) IS NOT NULL AND", 1)
    reads = reads_with(backend, slow)
    runner = asyncio.ensure_future(reads.get(row_id("", "a")))
    await asyncio.sleep(0)
    waiters = [asyncio.ensure_future(reads.get(row_id("", n))) for n in ("b", "c", "d")]
    await runner
    await asyncio.sleep(0.1)  # the batch of b, c, d is running in the server
    waiters[0].cancel()
    assert await waiters[1] is not None
    assert await waiters[2] is not None
    with pytest.raises(asyncio.CancelledError):
        await waiters[0]
    assert not reads._running
    assert not reads._waiting
