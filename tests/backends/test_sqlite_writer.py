"""Keyed writes to an SQLite file (a checkpoint's save or compare-and-set, a cache entry,
a coordination record's or wait record's transition) run at once on the event loop's
thread (``SqliteDatabase.write``), on a third connection that never waits for a lock and
never checkpoints the WAL: that they stay off aiosqlite's thread, what happens when they
meet a lock held by another connection, that the WAL is still checkpointed, and where
they are not used. Against real files and real locks.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from sql_support import statements_sent

import siglo
from siglo import Checkpoint
from siglo.records import WaitRecord
from siglo_sqlite import wal_checkpoints
from siglo_sqlite.wal_checkpoints import CHECKPOINT_EVERY_MIN


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
    sent = statements_sent(trace)
    return [s for s in sent if s.lstrip().upper().startswith(("INSERT", "UPDATE"))]


@asynccontextmanager
async def loop_turns() -> AsyncIterator[list[int]]:
    """Counts (in its one item) the 10 ms sleeps the loop completes meanwhile: that it
    keeps turning while a call waits."""
    turns = [0]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            turns[0] += 1

    ticker = asyncio.ensure_future(tick())
    try:
        yield turns
    finally:
        ticker.cancel()


async def driver_trace(db: Any) -> list[str]:
    """The statements the aiosqlite connection runs from now on."""
    trace: list[str] = []
    await db._driver.conn.set_trace_callback(trace.append)
    return trace


async def test_sequential_writes_run_on_the_writer_and_a_thread_checkpoints(
    backend: siglo.Backend,
) -> None:
    """Every write runs on the writer, none on the driver; every so many, the
    checkpointer's connection checkpoints the WAL on its own thread."""
    adapter: Any = backend.adapter
    db = database(backend)
    on_driver: list[str] = []
    on_writer: list[str] = []
    checkpoints: list[str] = []
    await db._driver.conn.set_trace_callback(on_driver.append)
    db._writer.set_trace_callback(on_writer.append)
    db._wal.conn.set_trace_callback(checkpoints.append)
    db._wal._writes = 0
    total = 2 * (CHECKPOINT_EVERY_MIN + 1)
    for revision in range(1, total + 1):  # saves and compare-and-sets
        await adapter.save_checkpoint(cp(revision), expected_revision=revision - 1)
    await adapter.set_cached_step("step", {"v": 1})
    db._wal._submitted.result(timeout=5)  # the last checkpoint asked has answered
    assert writes(on_driver) == [], on_driver
    # Each write once, or twice where the checkpoint's last step made it wait and retry.
    assert total + 1 <= len(writes(on_writer)) <= total + 1 + len(checkpoints), on_writer
    assert checkpoints[:2] == [
        "PRAGMA wal_checkpoint(PASSIVE)",
        "PRAGMA wal_checkpoint(RESTART)",
    ], checkpoints
    got = await adapter.get_checkpoint("s")
    assert got is not None
    assert got.revision == total
    assert await adapter.get_cached_step("step") == {"v": 1}
    # It never waits for a lock (the loop is never held by one), never checkpoints the
    # WAL, and commits as durably as the driver connection.
    assert db._writer.execute("PRAGMA busy_timeout").fetchone() == (0,)
    assert db._writer.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    assert db._writer.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL


def statements(trace: list[str]) -> list[str]:
    return [
        s
        for s in trace
        if s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE", "SELECT", "WITH"))
    ]


async def test_coordination_and_wait_transitions_run_inline_not_on_the_driver(
    backend: siglo.Backend,
) -> None:
    """Idempotency keys, locks, nonces and a wait record's claim, completion, release
    and cancellation are one keyed statement each (or a write and a keyed read of its
    state): they run on the writer and the reader, none on the aiosqlite connection."""
    adapter: Any = backend.adapter
    idem, lock, nonces = backend.idempotency, backend.lock, backend.nonces
    assert idem is not None and lock is not None and nonces is not None
    for key in ("w1", "w2", "w3"):
        await adapter.save_wait_record(WaitRecord(correlation_key=key, stack_id="s", created_at=1))
    db = database(backend)
    on_driver = await driver_trace(db)
    on_writer: list[str] = []
    on_reader: list[str] = []
    db._writer.set_trace_callback(on_writer.append)
    db._reader.set_trace_callback(on_reader.append)

    assert await idem.claim("k") == "claimed"
    assert await idem.claim("k") == "in-progress"  # the claim refused, then its state read
    await idem.complete("k", {"paid": 1})
    assert await idem.get_result("k") == {"paid": 1}
    owned = await idem.claim_owned("o", 60_000)
    assert owned.token is not None
    assert await idem.extend("o", owned.token, 60_000)
    await idem.fail("o", token=owned.token)
    await idem.fail("nobody")  # nothing freed: the owned-claim read decides
    held = await lock.acquire("l", 10_000)
    assert held.acquired and held.token
    assert not (await lock.acquire("l", 10_000)).acquired
    assert await lock.extend("l", held.token, 10_000)
    assert await lock.release("l", held.token)
    assert await nonces.claim("n", 60)
    assert not await nonces.claim("n", 60)
    assert await adapter.claim_wait_record("w1", "me") is not None
    with pytest.raises(siglo.WaitRecordClaimError):
        await adapter.complete_wait_record("w1", "someone else")  # then the state read
    await adapter.complete_wait_record("w1", "me")
    assert await adapter.claim_wait_record("w2", "me") is not None
    assert await adapter.release_wait_record("w2", "me")
    assert await adapter.cancel_wait_record("w3")

    assert statements(on_driver) == [], on_driver
    # 19 writes: each call above one, the second nonce claim too; 4 reads: the state
    # after the refused claim, the result, the owned-claim check, the claimant check.
    assert len(statements(on_writer)) == 19, on_writer
    assert len(statements(on_reader)) == 4, on_reader
    # What they stored is what the driver connection reads.
    assert (await adapter.get_wait_record("w1")).status == "completed"
    assert (await adapter.get_wait_record("w2")).status == "waiting"
    assert (await adapter.get_wait_record("w3")).status == "cancelled"
    assert await idem.claim("o") == "claimed"  # failed, so free again


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
    """While the driver connection has a statement in flight, a write waits for it (on
    the loop, in turn), then runs inline: a compare-and-set on the revision that
    statement writes succeeds (run inline at once, it would have met revision 1 and
    been refused)."""
    adapter: Any = backend.adapter
    db = database(backend)
    await adapter.save_checkpoint(cp(1))
    on_writer: list[str] = []
    db._writer.set_trace_callback(on_writer.append)
    writer, db._writer = db._writer, None  # the next save goes to the driver's thread
    first = asyncio.ensure_future(adapter.save_checkpoint(cp(2), expected_revision=1))
    await asyncio.sleep(0)  # submitted to aiosqlite's thread
    db._writer = writer
    assert db._order.on_driver == 1
    await adapter.save_checkpoint(cp(3), expected_revision=2)
    assert first.done()
    await first
    assert writes(on_writer) == [on_writer[-1]] and "revision = 2" in on_writer[-1]
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
    on_driver = await driver_trace(db)
    other = sqlite3.connect(f"{tmp_path}/w.db", isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, other.execute, "COMMIT")
        async with loop_turns() as turns:
            started = time.monotonic()
            await adapter.save_checkpoint(cp(2), expected_revision=1)
            waited = time.monotonic() - started
    finally:
        other.close()
    assert waited >= 0.25
    assert turns[0] >= 10
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
    a checkpoint on the driver's thread every so many writes (an interval that adapts
    to about 1,000 frames a checkpoint) keeps the WAL file near SQLite's 1,000 pages
    (4 MB)."""
    adapter: Any = backend.adapter
    for i in range(600):
        await adapter.save_checkpoint(cp(1, stack_id=f"s{i}", size=16_000))
    assert wal_bytes(tmp_path / "w.db") < 6 * 2**20


async def test_without_the_driver_writes_the_wal_would_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control of the test above: with no checkpoint asked, nothing checkpoints."""
    monkeypatch.setattr(wal_checkpoints.WalCheckpoints, "soon", lambda self: None)
    async with siglo.connect(f"sqlite:///{tmp_path}/g.db") as backend:
        adapter: Any = backend.adapter
        for i in range(600):
            await adapter.save_checkpoint(cp(1, stack_id=f"s{i}", size=16_000))
        assert wal_bytes(tmp_path / "g.db") > 8 * 2**20


@pytest.mark.parametrize("synchronous", ["FULL", "EXTRA"])
async def test_a_syncing_commit_never_runs_on_the_loop(tmp_path: Path, synchronous: str) -> None:
    """At ``synchronous=FULL`` a commit waits for the disk: writes go to the syncing
    writer on the backend's own thread (none on the loop's, none on the driver's)."""
    url = f"sqlite:///{tmp_path}/f.db?synchronous={synchronous}"
    async with siglo.connect(url) as backend:
        adapter: Any = backend.adapter
        await adapter.save_checkpoint(cp(1))
        db = database(backend)
        assert db._writer is None
        assert db._reader is not None
        on_driver = await driver_trace(db)
        threads: list[str] = []
        db._syncing.set_trace_callback(lambda sql: threads.append(threading.current_thread().name))
        await adapter.save_checkpoint(cp(2), expected_revision=1)
        assert writes(on_driver) == []
        assert threads and all(name.startswith("siglo-sqlite") for name in threads), threads
        assert db._syncing.execute("PRAGMA synchronous").fetchone() == (
            2 if synchronous == "FULL" else 3,
        )
        got = await adapter.get_checkpoint("s")
        assert got is not None and got.revision == 2


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


async def test_thirty_two_callers_write_inline_and_the_wal_stays_bounded(
    backend: siglo.Backend, tmp_path: Path
) -> None:
    """32 callers saving at once: every write runs on the writer (none takes the hop to
    the driver, as one in 32 did, after which every caller's writes followed it there),
    the WAL is checkpointed and starts over, and every save is stored."""
    adapter: Any = backend.adapter
    db = database(backend)
    on_driver = await driver_trace(db)

    async def caller(n: int) -> None:
        for i in range(40):
            await adapter.save_checkpoint(cp(1, stack_id=f"c{n}-{i}", size=4_000))

    await asyncio.gather(*(caller(n) for n in range(32)))
    assert writes(on_driver) == []
    assert wal_bytes(tmp_path / "w.db") < 6 * 2**20  # 1,280 saves of ~2 pages: ~10 MB
    for n in range(32):
        got = await adapter.get_checkpoint(f"c{n}-39")
        assert got is not None


async def test_a_write_waits_for_the_checkpoints_last_step_and_a_later_read_sees_it(
    backend: siglo.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection reads in the WAL, so the checkpoint's last step (start the WAL
    over) keeps trying for its bound (half a second here, so that a loaded machine
    cannot miss it). A write asked then waits on the loop for it (not on the driver),
    and a read asked after the write waits behind it and sees it; once the reader is
    gone, the next checkpoint starts the WAL over."""
    monkeypatch.setattr(wal_checkpoints, "CHECKPOINT_RESTART_WAIT_MS", 500)
    adapter: Any = backend.adapter
    db = database(backend)
    await adapter.save_checkpoint(cp(1))
    other = sqlite3.connect(f"{tmp_path}/w.db", isolation_level=None)
    try:
        other.execute("BEGIN")
        other.execute("SELECT count(*) FROM siglo_checkpoints").fetchall()  # reads the WAL
        on_driver = await driver_trace(db)
        db._wal.soon()
        async with asyncio.timeout(5):
            # The copy is done; the last step is trying. (A flag set on another
            # thread: polled, as no event of the loop's can be set from there.)
            while not db._wal._restarting:  # noqa: ASYNC110
                await asyncio.sleep(0.0005)
        saving = asyncio.ensure_future(adapter.save_checkpoint(cp(2), expected_revision=1))
        loading = asyncio.ensure_future(adapter.get_checkpoint("s"))
        await asyncio.sleep(0)
        assert not saving.done() and not loading.done()
        await saving
        got = await loading
        assert got is not None and got.revision == 2
        assert writes(on_driver) == []
        busy, frames, _ = db._wal.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert frames > 0  # the WAL did not start over while the reader was in it
    finally:
        other.close()
    db._wal.soon()
    db._wal._submitted.result(timeout=5)
    await adapter.save_checkpoint(cp(3), expected_revision=2)
    busy, after, _ = db._wal.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and 0 < after < frames  # started over: that write went to its beginning


async def test_closing_during_a_checkpoint_waits_for_it(tmp_path: Path) -> None:
    backend = siglo.connect(f"sqlite:///{tmp_path}/c.db")
    adapter: Any = backend.adapter
    for i in range(50):
        await adapter.save_checkpoint(cp(1, stack_id=f"s{i}", size=16_000))
    db = database(backend)
    db._wal.soon()
    checkpoint, checkpointer = db._wal._submitted, db._wal.conn
    await backend.aclose()
    assert checkpoint.done()
    assert db._wal is None and db._thread is None
    with pytest.raises(sqlite3.ProgrammingError):
        checkpointer.execute("SELECT 1")  # closed with the backend, after the checkpoint
    async with siglo.connect(f"sqlite:///{tmp_path}/c.db") as again:
        assert await again.adapter.get_checkpoint("s49") is not None


async def test_calls_asked_while_a_write_waits_run_after_it_in_order(
    backend: siglo.Backend,
) -> None:
    """A write waits in turn for a statement in flight on the driver. A read, a
    statement and a transaction asked after it wait behind it, and each sees it."""
    adapter: Any = backend.adapter
    db = database(backend)
    await adapter.save_checkpoint(cp(1))
    writer, db._writer = db._writer, None  # this save goes to the driver's thread
    first = asyncio.ensure_future(adapter.save_checkpoint(cp(2), expected_revision=1))
    await asyncio.sleep(0)
    db._writer = writer
    second = asyncio.ensure_future(adapter.save_checkpoint(cp(3), expected_revision=2))
    await asyncio.sleep(0)
    assert db._order.in_line == 1  # the second save waits for the first
    select = "SELECT revision FROM siglo_checkpoints"

    async def in_a_transaction() -> list[Any]:
        async with db.transaction() as tx:
            rows: list[Any] = await tx.fetch(select)
            return rows

    reading = asyncio.ensure_future(adapter.get_checkpoint("s"))
    fetching = asyncio.ensure_future(db.fetch(select))
    transacting = asyncio.ensure_future(in_a_transaction())
    await asyncio.gather(first, second)
    got = await reading
    assert got is not None and got.revision == 3
    assert await fetching == [(3,)]
    assert await transacting == [(3,)]
    assert db._order.in_line == 0


async def test_writes_after_a_statement_on_the_driver_go_back_inline(
    backend: siglo.Backend,
) -> None:
    """32 callers saving while other statements keep going to the driver (a context
    change, a listing): a save asked meanwhile waits for them and runs inline; none
    follows them onto the driver."""
    adapter: Any = backend.adapter
    db = database(backend)
    on_driver = await driver_trace(db)

    async def caller(n: int) -> None:
        for i in range(30):
            await adapter.save_checkpoint(cp(1, stack_id=f"c{n}-{i}"))
            if i % 10 == 5:
                await db.fetch("SELECT count(*) FROM siglo_checkpoints")

    await asyncio.gather(*(caller(n) for n in range(32)))
    assert sum("count(*)" in s for s in on_driver) == 96
    assert writes(on_driver) == []
    for n in range(32):
        assert await adapter.get_checkpoint(f"c{n}-29") is not None


async def test_writes_that_reach_the_wals_bound_wait_for_the_checkpoint(
    backend: siglo.Backend,
) -> None:
    """A checkpoint that takes long (a slow disk: stood in for by a job that sleeps on
    the checkpointer's thread) holds up writes once they reach the interval's worth
    since it started, so the WAL does not grow past its bound meanwhile; the loop
    keeps turning, and the writes land when it ends."""
    adapter: Any = backend.adapter
    db = database(backend)
    await adapter.save_checkpoint(cp(1))
    db._wal._submitted = db._thread.submit(time.sleep, 0.3)
    db._wal._done = asyncio.wrap_future(db._wal._submitted)
    db._wal._writes = db._wal._every - 1
    async with loop_turns() as turns:
        started = time.monotonic()
        await adapter.save_checkpoint(cp(2), expected_revision=1)  # the last one allowed
        assert time.monotonic() - started < 0.1
        await adapter.save_checkpoint(cp(3), expected_revision=2)  # waits for it
        waited = time.monotonic() - started
    assert waited >= 0.25
    assert turns[0] >= 10
    got = await adapter.get_checkpoint("s")
    assert got is not None and got.revision == 3


async def test_a_slow_checkpoint_is_waited_for_past_the_bound_as_work(
    tmp_path: Path,
) -> None:
    """The bound is on waits for a lock, not on work: a write held up by a checkpoint
    that takes a second (a slow disk: stood in for by a job that sleeps on the
    backend's thread) waits for it past ``busy_timeout_ms=200``, as it would have
    waited for a checkpoint run by a commit on the driver, and then lands."""
    async with siglo.connect(f"sqlite:///{tmp_path}/t.db?busy_timeout_ms=200") as backend:
        adapter: Any = backend.adapter
        db = database(backend)
        await adapter.save_checkpoint(cp(1))
        db._wal._submitted = db._thread.submit(time.sleep, 1.0)
        db._wal._done = asyncio.wrap_future(db._wal._submitted)
        db._wal._writes = db._wal._every
        started = time.monotonic()
        await adapter.save_checkpoint(cp(2), expected_revision=1)
        assert time.monotonic() - started >= 0.9
        got = await adapter.get_checkpoint("s")
        assert got is not None and got.revision == 2


async def test_with_no_busy_wait_concurrent_calls_queue_and_none_fails(
    tmp_path: Path,
) -> None:
    """``busy_timeout_ms=0``: a call that meets a lock fails at once, but waiting behind
    this backend's own calls or checkpoints is not a lock. 32 callers saving, with
    statements going to the driver among them and the WAL checkpointed as they go: every
    save lands."""
    async with siglo.connect(f"sqlite:///{tmp_path}/z.db?busy_timeout_ms=0") as backend:
        adapter: Any = backend.adapter
        db = database(backend)

        async def caller(n: int) -> None:
            for i in range(40):
                await adapter.save_checkpoint(cp(1, stack_id=f"c{n}-{i}", size=2_000))
                if i % 10 == 5:
                    await db.fetch("SELECT count(*) FROM siglo_checkpoints")

        await asyncio.gather(*(caller(n) for n in range(32)))
        assert db._wal._submitted is not None  # checkpoints ran among them
        for n in range(32):
            assert await adapter.get_checkpoint(f"c{n}-39") is not None


async def test_a_wait_in_turn_counts_against_the_calls_bound(tmp_path: Path) -> None:
    """A transaction is open; a statement asked then waits on the driver for its lock,
    and a write asked after it waits in turn for that statement, then for the lock. The
    write's deadline runs from when it was asked, as when it queued on the driver: its
    waits end 200 ms after that, not 200 ms after its turn came, and it stores nothing."""
    async with siglo.connect(f"sqlite:///{tmp_path}/u.db?busy_timeout_ms=200") as backend:
        adapter: Any = backend.adapter
        db = database(backend)
        await adapter.save_checkpoint(cp(1))
        async with db.transaction() as tx:
            await tx.fetch("SELECT 1")
            statement = asyncio.ensure_future(db.fetch("SELECT count(*) FROM siglo_checkpoints"))
            await asyncio.sleep(0.05)  # the statement waits for the transaction's lock
            started = time.monotonic()
            with pytest.raises(siglo.StorageAdapterError, match="busy_timeout_ms=200"):
                await adapter.save_checkpoint(cp(2), expected_revision=1)
            took = time.monotonic() - started
            with pytest.raises(siglo.StorageAdapterError, match="busy_timeout_ms=200"):
                await statement
        assert 0.15 <= took < 0.3
        got = await adapter.get_checkpoint("s")
        assert got is not None and got.revision == 1


async def test_a_checkpoint_that_gave_up_tries_longer_next_time(
    backend: siglo.Backend, tmp_path: Path
) -> None:
    """The last step of a checkpoint (start the WAL over) gives up after 10 ms while
    another connection reads in the WAL; on a loaded machine that was every checkpoint,
    and the WAL grew unbounded. Each one that gives up doubles the next one's try, up to
    CHECKPOINT_RESTART_WAIT_MAX_MS; one that succeeds starts from 10 ms again."""
    adapter: Any = backend.adapter
    wal = database(backend)._wal
    await adapter.save_checkpoint(cp(1))
    other = sqlite3.connect(f"{tmp_path}/w.db", isolation_level=None)
    tried: list[float] = []
    try:
        other.execute("BEGIN")
        other.execute("SELECT count(*) FROM siglo_checkpoints").fetchall()  # reads the WAL
        for _ in range(8):
            began = time.monotonic()
            await asyncio.to_thread(wal._checkpoint)
            tried.append((time.monotonic() - began) * 1000)
        assert wal._gave_up == 8
    finally:
        other.execute("ROLLBACK")
        other.close()
    # 10, 20, … 640, 640 ms (and the copy before each): each at least its bound.
    bounds = [10, 20, 40, 80, 160, 320, 640, 640]
    assert all(took >= bound for took, bound in zip(tried, bounds, strict=True)), tried
    assert tried[-1] < 640 * 4, tried  # capped
    await adapter.save_checkpoint(cp(2), expected_revision=1)
    await asyncio.to_thread(wal._checkpoint)
    assert wal._gave_up == 0


async def test_a_checkpoint_that_gave_up_comes_again_after_the_fewest_writes(
    backend: siglo.Backend, tmp_path: Path
) -> None:
    """After a checkpoint whose last step gave up, the next one comes CHECKPOINT_EVERY_MIN
    writes later, not at the interval aimed at 1,000 frames: with only the few tries that
    interval gives in 600 saves of 16 KB, a loaded machine's WAL passed 10 MB once each of
    them gave up."""
    adapter: Any = backend.adapter
    wal = database(backend)._wal
    await adapter.save_checkpoint(cp(1))
    wal._every, wal._writes = 400, 0
    other = sqlite3.connect(f"{tmp_path}/w.db", isolation_level=None)
    try:
        other.execute("BEGIN")
        other.execute("SELECT count(*) FROM siglo_checkpoints").fetchall()  # reads the WAL
        await asyncio.to_thread(wal._checkpoint)
        assert wal._gave_up == 1
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert wal._every == CHECKPOINT_EVERY_MIN
    before = wal._submitted
    for i in range(CHECKPOINT_EVERY_MIN):
        await adapter.save_checkpoint(cp(1, stack_id=f"n{i}"))
    assert wal._submitted is not before  # the next checkpoint has started
    await wal.answered()
    assert wal._gave_up == 0


async def test_the_interval_counts_from_the_restart_and_at_most_doubles(
    backend: siglo.Backend,
) -> None:
    """The writes counted while a checkpoint ran are in the WAL it started over: the next
    interval counts from zero (left counted, the first write after a long checkpoint
    started another one at once, and the next real one came a whole interval later, twice
    the frames aimed at). And a measurement that saw few frames for its writes at most
    doubles the interval: under load one set it to 4,096 writes of 4 KB, and the WAL
    passed 7 MB."""
    adapter: Any = backend.adapter
    wal = database(backend)._wal
    await adapter.save_checkpoint(cp(1))
    wal._every, wal._writes, wal._since_restart = 40, 39, 10_000  # ~0 frames a write
    await asyncio.to_thread(wal._checkpoint)
    assert wal._gave_up == 0
    assert wal._writes == 0
    assert wal._every == 80
    before = wal._submitted
    await adapter.save_checkpoint(cp(1, stack_id="next"))
    assert wal._submitted is before  # no checkpoint started by the first write after it
