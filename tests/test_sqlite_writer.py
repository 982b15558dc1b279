"""Keyed writes to an SQLite file (a checkpoint's save or compare-and-set, a cache entry)
run at once on the event loop's thread (``SqliteDatabase.write``), on a third connection
that never waits for a lock and never checkpoints the WAL: that they stay off aiosqlite's
thread, what happens when they meet a lock held by another connection, that the WAL is
still checkpointed, and where they are not used. Against real files and real locks.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import siglo
from siglo import Checkpoint
from siglo_sqlite import database as sqlite_database
from siglo_sqlite.database import DRIVER_WRITE_EVERY


def cp(revision: int, stack_id: str = "s", size: int = 0) -> Checkpoint:
    contexts = {"step": {"blob": "x" * size}} if size else {}
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=1, contexts=contexts)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[siglo.Backend]:
    async with siglo.connect(f"sqlite:///{tmp_path}/w.db") as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


def database(backend: siglo.Backend) -> Any:
    return backend.adapter.database  # type: ignore[attr-defined]


def wal_bytes(path: Path | str) -> int:
    return os.path.getsize(f"{path}-wal")


def writes(trace: list[str]) -> list[str]:
    return [s for s in trace if s.lstrip().upper().startswith(("INSERT", "UPDATE"))]


async def test_sequential_writes_run_on_the_writer_one_in_n_on_the_driver(
    backend: siglo.Backend,
) -> None:
    adapter: Any = backend.adapter
    db = database(backend)
    on_driver: list[str] = []
    on_writer: list[str] = []
    await db._conn.set_trace_callback(on_driver.append)
    db._writer.set_trace_callback(on_writer.append)
    db._inline_writes = 0
    total = 2 * (DRIVER_WRITE_EVERY + 1)
    for revision in range(1, total + 1):  # saves and compare-and-sets
        await adapter.save_checkpoint(cp(revision), expected_revision=revision - 1)
    await adapter.set_cached_step("step", {"v": 1})
    assert len(writes(on_driver)) == 2, on_driver
    assert len(writes(on_writer)) == total - 1
    got = await adapter.get_checkpoint("s")
    assert got is not None
    assert got.revision == total
    assert await adapter.get_cached_step("step") == {"v": 1}
    # It never waits for a lock (the loop is never held by one), never checkpoints the
    # WAL, and commits as durably as the driver connection.
    assert db._writer.execute("PRAGMA busy_timeout").fetchone() == (0,)
    assert db._writer.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    assert db._writer.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL


async def test_a_refused_compare_and_set_on_the_writer_stores_nothing(
    backend: siglo.Backend,
) -> None:
    adapter: Any = backend.adapter
    await adapter.save_checkpoint(cp(1), expected_revision=0)
    with pytest.raises(siglo.CheckpointConflictError) as refused:
        await adapter.save_checkpoint(cp(3), expected_revision=2)
    assert refused.value.current_revision == 1
    with pytest.raises(siglo.CheckpointConflictError):
        await adapter.save_checkpoint(cp(1), expected_revision=0)
    got = await adapter.get_checkpoint("s")
    assert got is not None
    assert got.revision == 1


async def test_a_write_asked_while_a_statement_is_in_flight_runs_after_it(
    backend: siglo.Backend,
) -> None:
    """While the driver connection has a statement in flight, a write queues behind it
    there: a compare-and-set on the revision that statement writes succeeds (run inline
    at once, it would have met revision 1 and been refused)."""
    adapter: Any = backend.adapter
    db = database(backend)
    await adapter.save_checkpoint(cp(1))
    on_writer: list[str] = []
    db._writer.set_trace_callback(on_writer.append)
    db._inline_writes = DRIVER_WRITE_EVERY  # the next save goes to the driver's thread
    first = asyncio.ensure_future(adapter.save_checkpoint(cp(2), expected_revision=1))
    await asyncio.sleep(0)  # submitted to aiosqlite's thread
    assert db._on_driver == 1
    await adapter.save_checkpoint(cp(3), expected_revision=2)
    await first
    assert on_writer == []
    got = await adapter.get_checkpoint("s")
    assert got is not None
    assert got.revision == 3


async def test_a_write_that_meets_another_connections_lock_waits_on_the_driver(
    backend: siglo.Backend, tmp_path: Path
) -> None:
    """Another connection holds the write lock: the writer is answered "database is
    locked" at once (the loop is not held), the save waits on the driver's thread until
    the lock is released, then lands."""
    adapter: Any = backend.adapter
    db = database(backend)
    await adapter.save_checkpoint(cp(1))
    on_driver: list[str] = []
    await db._conn.set_trace_callback(on_driver.append)
    other = sqlite3.connect(f"{tmp_path}/w.db", isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, other.execute, "COMMIT")
        ticks = 0

        async def tick() -> None:  # the loop keeps turning while the save waits
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        started = time.monotonic()
        await adapter.save_checkpoint(cp(2), expected_revision=1)
        waited = time.monotonic() - started
        ticker.cancel()
    finally:
        other.close()
    assert waited >= 0.25
    assert ticks >= 10
    assert writes(on_driver), on_driver
    got = await adapter.get_checkpoint("s")
    assert got is not None
    assert got.revision == 2


async def test_a_write_past_the_busy_timeout_is_wrapped_and_stores_nothing(
    tmp_path: Path,
) -> None:
    async with siglo.connect(f"sqlite:///{tmp_path}/b.db?busy_timeout_ms=100") as backend:
        adapter: Any = backend.adapter
        await adapter.save_checkpoint(cp(1))
        other = sqlite3.connect(f"{tmp_path}/b.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(siglo.StorageAdapterError, match="busy_timeout_ms=100"):
                await adapter.save_checkpoint(cp(2), expected_revision=1)
        finally:
            other.execute("ROLLBACK")
            other.close()
        got = await adapter.get_checkpoint("s")
        assert got is not None
        assert got.revision == 1


async def test_the_wal_is_checkpointed_though_the_writer_never_does(
    backend: siglo.Backend, tmp_path: Path
) -> None:
    """600 saves of 16 KB (about five pages each): the WAL would pass 12 MB unchecked;
    every DRIVER_WRITE_EVERY-th write checkpoints it on the driver's thread, so the WAL
    file stays near SQLite's 1,000 pages (4 MB) plus one round of inline writes."""
    adapter: Any = backend.adapter
    for i in range(600):
        await adapter.save_checkpoint(cp(1, stack_id=f"s{i}", size=16_000))
    assert wal_bytes(tmp_path / "w.db") < 6 * 2**20


async def test_without_the_driver_writes_the_wal_would_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control of the test above: with every write inline, nothing checkpoints."""
    monkeypatch.setattr(sqlite_database, "DRIVER_WRITE_EVERY", 10**9)
    async with siglo.connect(f"sqlite:///{tmp_path}/g.db") as backend:
        adapter: Any = backend.adapter
        for i in range(600):
            await adapter.save_checkpoint(cp(1, stack_id=f"s{i}", size=16_000))
        assert wal_bytes(tmp_path / "g.db") > 8 * 2**20


@pytest.mark.parametrize("synchronous", ["FULL", "EXTRA"])
async def test_a_syncing_commit_never_runs_on_the_loop(tmp_path: Path, synchronous: str) -> None:
    """At ``synchronous=FULL`` a commit waits for the disk: writes stay on the driver."""
    url = f"sqlite:///{tmp_path}/f.db?synchronous={synchronous}"
    async with siglo.connect(url) as backend:
        adapter: Any = backend.adapter
        await adapter.save_checkpoint(cp(1))
        db = database(backend)
        assert db._writer is None
        assert db._reader is not None
        on_driver: list[str] = []
        await db._conn.set_trace_callback(on_driver.append)
        await adapter.save_checkpoint(cp(2), expected_revision=1)
        assert writes(on_driver)


async def test_a_closed_backend_closes_its_writer(tmp_path: Path) -> None:
    backend = siglo.connect(f"sqlite:///{tmp_path}/z.db")
    await backend.adapter.save_checkpoint(cp(1))
    db = database(backend)
    writer = db._writer
    await backend.aclose()
    assert db._writer is None
    with pytest.raises(sqlite3.ProgrammingError):
        writer.execute("SELECT 1")
    with pytest.raises(siglo.StorageAdapterError):
        await backend.adapter.save_checkpoint(cp(2))
