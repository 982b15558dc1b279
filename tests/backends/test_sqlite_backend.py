"""SQLite specifics: URL forms, WAL, the busy timeout, failures, an application's engine,
a backend never closed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import siglo
from siglo import Checkpoint
from siglo_sqlite import connect_engine, is_memory_url


def cp(revision: int = 1, stack_id: str = "s") -> Checkpoint:
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=1)


async def test_memory_urls_are_private() -> None:
    assert is_memory_url("sqlite://")
    assert is_memory_url("sqlite:///:memory:")
    assert not is_memory_url("sqlite:///x.db")
    async with siglo.connect("sqlite://") as one, siglo.connect("sqlite://") as two:
        await one.adapter.save_checkpoint(cp())
        assert await two.adapter.get_checkpoint("s") is None
        assert one.url == "sqlite://"


async def test_file_urls_prefix_and_wal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with siglo.connect("sqlite:///rel.db?table_prefix=app_") as backend:
        assert backend.url == "sqlite:///rel.db?table_prefix=app_"
        await backend.adapter.save_checkpoint(cp())
        db = backend.adapter.database  # type: ignore[attr-defined]
        assert (await db.fetch("PRAGMA journal_mode"))[0][0] == "wal"
        names = {r[0] for r in await db.fetch("SELECT name FROM sqlite_master")}
        assert "app_checkpoints" in names
        assert "siglo_checkpoints" not in names
    assert (tmp_path / "rel.db").exists()
    absolute = f"sqlite:///{tmp_path}/rel.db"  # sqlite:////tmp/... : an absolute path
    async with siglo.connect(absolute, table_prefix="app_") as same:
        assert same.url == absolute + "?table_prefix=app_"
        assert await same.adapter.get_checkpoint("s") == cp()
    async with siglo.connect(absolute) as other:
        assert await other.adapter.get_checkpoint("s") is None


async def test_bad_options_are_named() -> None:
    with pytest.raises(siglo.InvalidArgumentError, match="bogus"):
        siglo.connect("sqlite://", bogus=1)
    with pytest.raises(siglo.InvalidArgumentError, match="table_prefix"):
        siglo.connect("sqlite://", table_prefix="bad-prefix;")
    with pytest.raises(siglo.InvalidArgumentError, match="busy_timeout_ms"):
        siglo.connect("sqlite:///x.db?busy_timeout_ms=soon")


def _hold_write_lock(path: Path, seconds: float, ready: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("BEGIN IMMEDIATE")
    ready.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


async def test_a_writer_waits_for_another_process_lock(tmp_path: Path) -> None:
    """No "database is locked" while another connection holds the write lock briefly."""
    url = f"sqlite:///{tmp_path}/busy.db"
    async with siglo.connect(url) as backend:
        await backend.adapter.save_checkpoint(cp(1))
        ready = threading.Event()
        holder = threading.Thread(target=_hold_write_lock, args=(tmp_path / "busy.db", 0.4, ready))
        holder.start()
        await asyncio.to_thread(ready.wait)
        began = time.monotonic()
        await backend.adapter.save_checkpoint(cp(2), expected_revision=1)
        await backend.adapter.cancel_workflow("s")  # a transaction (BEGIN IMMEDIATE)
        assert time.monotonic() - began >= 0.3
        holder.join()
        got = await backend.adapter.get_checkpoint("s")
        assert got is not None
        assert got.revision == 3
        assert got.status == "cancelled"


async def test_busy_past_the_timeout_is_wrapped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/busy.db"
    async with siglo.connect(url, busy_timeout_ms=150) as backend:
        await backend.adapter.save_checkpoint(cp(1))
        ready = threading.Event()
        # The holder keeps the lock far longer than the timeout, so "gave up after about
        # the timeout" and "waited for the holder" stay apart on a loaded machine too.
        holder = threading.Thread(target=_hold_write_lock, args=(tmp_path / "busy.db", 4.0, ready))
        holder.start()
        await asyncio.to_thread(ready.wait)
        began = time.monotonic()
        with pytest.raises(siglo.StorageAdapterError, match="locked") as info:
            await backend.adapter.save_checkpoint(cp(2))
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert "busy_timeout_ms=150" in str(info.value)  # the bound that applied
        assert time.monotonic() - began < 2.5
        holder.join()
        await backend.adapter.save_checkpoint(cp(2))  # and it works again afterwards


async def test_a_zero_busy_timeout_waits_for_no_lock_but_does_the_work(tmp_path: Path) -> None:
    """The busy timeout bounds waits for a lock, not a call's own work: with 0, a fresh file
    is migrated (a transaction of many statements) and every operation runs, and only a
    lock held elsewhere fails, at once. (It bounded the whole transaction: a migration
    slower than a 150 ms busy timeout on a loaded machine timed out with no lock held,
    and busy_timeout_ms=0 could not open a file at all.)"""
    url = f"sqlite:///{tmp_path}/zero.db"
    async with siglo.connect(url, busy_timeout_ms=0) as backend:
        await backend.adapter.save_checkpoint(cp(1))
        await backend.adapter.cancel_workflow("s")  # a BEGIN IMMEDIATE transaction
        got = await backend.adapter.get_checkpoint("s")
        assert got is not None
        assert got.status == "cancelled"
        ready = threading.Event()
        holder = threading.Thread(target=_hold_write_lock, args=(tmp_path / "zero.db", 2.0, ready))
        holder.start()
        await asyncio.to_thread(ready.wait)
        began = time.monotonic()
        with pytest.raises(siglo.StorageAdapterError, match="locked"):
            await backend.adapter.cancel_workflow("s")
        assert time.monotonic() - began < 1.5
        holder.join()
        await backend.adapter.cancel_workflow("s")


async def test_unopenable_file_is_wrapped(tmp_path: Path) -> None:
    backend = siglo.connect(f"sqlite:///{tmp_path}/missing-dir/x.db")
    with pytest.raises(siglo.StorageAdapterError) as info:
        await backend.adapter.get_checkpoint("s")
    assert info.value.__cause__ is not None
    await backend.aclose()


async def test_cancelled_transaction_does_not_poison_the_connection(tmp_path: Path) -> None:
    """A task cancelled anywhere in a transaction leaves no transaction (nor write lock)
    behind: the next operations work, and another connection can write."""
    path = tmp_path / "c.db"
    async with siglo.connect(f"sqlite:///{path}") as backend:
        a = backend.adapter
        await a.save_checkpoint(cp(1))
        for steps in range(8):
            task = asyncio.create_task(a.cancel_workflow("s"))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await a.save_wait_record(siglo.WaitRecord(correlation_key="k", stack_id="s"))
            assert await a.get_wait_record("k") is not None
            other = sqlite3.connect(path, isolation_level=None, timeout=1)
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            other.close()


async def test_application_engine(tmp_path: Path) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/engine.db")
    try:
        backend = connect_engine(engine, table_prefix="eng_")
        await backend.adapter.save_checkpoint(cp())
        assert await backend.adapter.get_checkpoint("s") == cp()
        assert backend.lock is not None
        assert (await backend.lock.acquire("k")).acquired
        await backend.aclose()
        async with engine.connect() as conn:  # the engine is still the application's
            rows = await conn.execute(text("SELECT stack_id FROM eng_checkpoints"))
            assert rows.all() == [("s",)]
    finally:
        await engine.dispose()


async def test_closed_backend_refuses_calls() -> None:
    backend = siglo.connect("sqlite://")
    await backend.adapter.save_checkpoint(cp())
    await backend.aclose()
    await backend.aclose()  # idempotent
    with pytest.raises(siglo.StorageAdapterError, match="closed"):
        await backend.adapter.get_checkpoint("s")


# A program that never closes its backend: the checkpoint it saved, then it ends.
UNCLOSED = """
import asyncio, sys
import siglo
from siglo import Checkpoint

kept = None

async def main(url, where):
    global kept
    backend = siglo.connect(url)
    if where == "global":
        kept = backend
    await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
    print("saved", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize(("where", "file"), [("local", True), ("global", True), ("local", False)])
async def test_a_backend_never_closed_does_not_keep_the_process_alive(
    tmp_path: Path, where: str, file: bool
) -> None:
    """aiosqlite's worker thread is not a daemon and never ends on its own; siglo makes
    it one, so a program that forgets ``aclose()`` still exits, and what it committed
    is kept (SQLite's journal, as for an open plain ``sqlite3`` connection at exit)."""
    url = f"sqlite:///{tmp_path}/unclosed.db" if file else "sqlite://"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", UNCLOSED, url, where],
        capture_output=True,
        text=True,
        timeout=30,  # before the fix it never returned
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "saved\n"
    if file:
        async with siglo.connect(url) as backend:
            stored = await backend.adapter.get_checkpoint("s")
        assert stored is not None
        assert stored.revision == 1


async def test_opens_when_the_loops_default_executor_is_shut_down(tmp_path: Path) -> None:
    """DBOS Transact sets its own pool as the loop's default executor and shuts that
    pool down when it stops; every ``asyncio.to_thread`` then fails. A file-backed
    backend opened after that still opens (its connections are opened on its own
    thread), and its writes are checkpointed there too."""
    loop = asyncio.get_running_loop()
    gone = concurrent.futures.ThreadPoolExecutor(1)
    loop.set_default_executor(gone)
    gone.shutdown()
    try:
        with pytest.raises(RuntimeError):
            await asyncio.to_thread(time.sleep, 0)  # the condition DBOS leaves behind
        async with siglo.connect(f"sqlite:///{tmp_path}/d.db") as backend:
            for i in range(100):
                await backend.adapter.save_checkpoint(cp(stack_id=f"s{i}"))
            db: Any = backend.adapter.database  # type: ignore[attr-defined]
            assert db._wal._submitted is not None
            await asyncio.wrap_future(db._wal._submitted)
            assert db._wal._submitted.exception() is None
            assert await backend.adapter.get_checkpoint("s99") is not None
    finally:
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())


async def test_a_document_written_past_siglo_as_text_reads(tmp_path: Path) -> None:
    """A checkpoint row edited with the ``sqlite3`` shell (``UPDATE … SET document =
    '{…}'``) holds TEXT, not a BLOB: it reads as the document it spells; a value that is
    no document at all is a MalformedRecordError (which `siglo show`, `export` and the
    dashboard name the stack with), never a TypeError."""
    path = tmp_path / "edited.db"
    async with siglo.connect(f"sqlite:///{path}") as backend:
        manager = siglo.StorageManager(backend)
        stack = manager.create_stack("edited")
        stack.set("a", "k", 1)
        await stack.save()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE siglo_checkpoints SET document = CAST(document AS TEXT)")
    async with siglo.connect(f"sqlite:///{path}") as backend:
        found = await backend.adapter.get_checkpoint("edited")
        assert found is not None and found.contexts == {"a": {"k": 1}}
    with sqlite3.connect(path) as db:
        db.execute("UPDATE siglo_checkpoints SET document = 42")
    async with siglo.connect(f"sqlite:///{path}") as backend:
        with pytest.raises(siglo.MalformedRecordError, match="not a JSON document"):
            await siglo.StorageManager(backend).load_checkpoint("edited")
