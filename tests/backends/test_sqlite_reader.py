"""Keyed reads of an SQLite file run at once on the event loop's thread
(``SqliteDatabase.read``), on a second read-only connection that never waits for a lock:
what they read, what happens when they meet a lock, and that they stay off aiosqlite's
thread. Against real files, real locks held by real connections.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import siglo
from siglo import Checkpoint
from siglo.records import WaitRecord


def cp(revision: int, stack_id: str = "s") -> Checkpoint:
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=1)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[siglo.Backend]:
    async with siglo.connect(f"sqlite:///{tmp_path}/r.db") as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


def database(backend: siglo.Backend) -> Any:
    return backend.adapter.database  # type: ignore[attr-defined]


async def test_keyed_reads_run_on_the_reader_not_the_driver_thread(
    backend: siglo.Backend,
) -> None:
    adapter: Any = backend.adapter
    await adapter.save_checkpoint(cp(1))
    await adapter.save_wait_record(WaitRecord(correlation_key="k", stack_id="s", created_at=1))
    await adapter.set_cached_step("step", {"v": 1})
    on_driver: list[str] = []
    on_reader: list[str] = []
    db = database(backend)
    await db._driver.conn.set_trace_callback(on_driver.append)
    db._reader.set_trace_callback(on_reader.append)
    assert (await adapter.get_checkpoint("s")).revision == 1
    assert (await adapter.get_checkpoint("s", "tenant")).revision == 1  # falls back to ''
    assert (await adapter.get_wait_record("k")).stack_id == "s"
    assert await adapter.get_cached_step("step") == {"v": 1}
    assert await adapter.get_context_changes("s", "step") == {}
    assert not [s for s in on_driver if s.lstrip().upper().startswith("SELECT")], on_driver
    assert len([s for s in on_reader if s.lstrip().upper().startswith("SELECT")]) == 5
    # It never waits for a lock (the loop is never held by one) and never writes.
    assert db._reader.execute("PRAGMA busy_timeout").fetchone() == (0,)
    assert db._reader.execute("PRAGMA query_only").fetchone() == (1,)


async def test_a_read_sees_what_another_connection_committed(
    backend: siglo.Backend, tmp_path: Path
) -> None:
    await backend.adapter.save_checkpoint(cp(1))
    async with siglo.connect(f"sqlite:///{tmp_path}/r.db") as other:
        await other.adapter.save_checkpoint(cp(2))
        got = await backend.adapter.get_checkpoint("s")
        assert got is not None
        assert got.revision == 2  # a new snapshot per read, not one kept open


async def test_a_read_asked_while_a_write_is_in_flight_reads_after_it(
    backend: siglo.Backend,
) -> None:
    """While the driver connection has work in flight the read queues behind it there:
    it sees the write asked before it, and the loop leaves the GIL to the driver."""
    adapter: Any = backend.adapter
    await adapter.save_checkpoint(cp(1))
    db = database(backend)
    on_reader: list[str] = []
    db._reader.set_trace_callback(on_reader.append)
    writer, db._writer = db._writer, None  # this save goes to the driver's thread
    saving = asyncio.ensure_future(adapter.save_checkpoint(cp(2)))
    await asyncio.sleep(0)  # the save is submitted to aiosqlite's thread
    db._writer = writer
    assert db._order.on_driver == 1
    got = await adapter.get_checkpoint("s")
    await saving
    assert got is not None
    assert got.revision == 2
    assert on_reader == []
    assert db._order.on_driver == 0
    got = await adapter.get_checkpoint("s")  # idle again: on the reader
    assert got is not None
    assert len(on_reader) == 1


class _BusyReader:
    """A reader connection that SQLite answers with "database is locked".

    A fake, because that cannot be produced for real with the backend open: in WAL mode a
    reader waits only for a connection holding the file in ``locking_mode=EXCLUSIVE``
    (which cannot take the file while this backend has it open) or for a WAL recovery
    (milliseconds, after the last connection closed uncleanly). What it returns is
    SQLite's own error for that case."""

    def execute(self, sql: str, params: Any = ()) -> Any:
        raise sqlite3.OperationalError("database is locked")


async def test_a_read_that_meets_a_lock_goes_through_the_driver_thread(
    backend: siglo.Backend,
) -> None:
    await backend.adapter.save_checkpoint(cp(1))
    db = database(backend)
    on_driver: list[str] = []
    await db._driver.conn.set_trace_callback(on_driver.append)
    real, db._reader = db._reader, _BusyReader()
    try:
        got = await backend.adapter.get_checkpoint("s")
    finally:
        db._reader = real
    assert got is not None
    assert got.revision == 1
    assert [s for s in on_driver if s.lstrip().upper().startswith("SELECT")]


async def test_a_failing_read_is_wrapped_and_a_closed_backend_refuses(
    tmp_path: Path,
) -> None:
    backend = siglo.connect(f"sqlite:///{tmp_path}/z.db")
    await backend.adapter.save_checkpoint(cp(1))
    db = database(backend)
    with pytest.raises(siglo.StorageAdapterError, match="no_such_table"):
        await db.read("SELECT * FROM no_such_table")
    reader = db._reader
    await backend.aclose()
    assert db._reader is None
    with pytest.raises(sqlite3.ProgrammingError):
        reader.execute("SELECT 1")  # closed with the backend
    with pytest.raises(siglo.StorageAdapterError):
        await backend.adapter.get_checkpoint("s")


async def test_an_in_memory_database_has_no_reader() -> None:
    """A private in-memory database cannot be opened twice: its reads use the driver."""
    async with siglo.connect("sqlite://") as backend:
        await backend.adapter.save_checkpoint(cp(1))
        assert database(backend)._reader is None
        got = await backend.adapter.get_checkpoint("s")
        assert got is not None
