"""Group commit on an SQLite file (:mod:`siglo_sqlite.group_commit`): keyed writes that
concurrent callers ask once the inline work has held the loop its while share one
``BEGIN IMMEDIATE`` … ``COMMIT`` on the writer connection, each with its own outcome,
none answered before the commit. Against real files; the hold is set to nothing here (and
the batch's budget to a minute, so that a loaded machine cannot split it), so that every
write after a burst's first joins the batch.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sql_support import statements_sent

import siglo
from siglo import Checkpoint
from siglo_sqlite import database as sqlite_database


def cp(revision: int, stack_id: str = "s") -> Checkpoint:
    return Checkpoint(
        stack_id=stack_id, revision=revision, timestamp=1, contexts={"c": {"v": "x" * 1000}}
    )


@pytest.fixture
async def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[siglo.Backend]:
    monkeypatch.setattr(sqlite_database, "HOLD_S", 0.0)
    monkeypatch.setattr(sqlite_database, "GAP_S", 60.0)  # one stretch, however slow
    monkeypatch.setattr(sqlite_database, "BATCH_BUDGET_S", 60.0)
    async with siglo.connect(f"sqlite:///{tmp_path}/g.db") as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


def traced(backend: siglo.Backend) -> list[str]:
    trace: list[str] = []
    backend.adapter.database._writer.set_trace_callback(trace.append)  # type: ignore[attr-defined]
    return trace


def kinds(trace: list[str]) -> list[str]:
    """The statements sent, each as BEGIN, COMMIT, SAVEPOINT, RELEASE or WRITE."""
    out = []
    for sql in statements_sent(trace):
        word = sql.lstrip().split(None, 1)[0].upper()
        out.append(word if word in {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"} else "WRITE")
    return out


async def test_concurrent_saves_share_one_transaction(backend: siglo.Backend) -> None:
    """32 callers save at once: the first runs at once (autocommit), the other 31 in one
    transaction, and every save is stored."""
    adapter: Any = backend.adapter
    trace = traced(backend)
    await asyncio.gather(*(adapter.save_checkpoint(cp(1, f"s{i}")) for i in range(32)))
    assert kinds(trace) == ["WRITE", "BEGIN", *["WRITE"] * 31, "COMMIT"], kinds(trace)
    for i in range(32):
        got = await adapter.get_checkpoint(f"s{i}")
        assert got is not None and got.revision == 1


async def test_each_compare_and_set_keeps_its_own_outcome(backend: siglo.Backend) -> None:
    """In one batch: compare-and-sets that expect the stored revision succeed, those
    that do not are refused (each its own conflict, naming the revision it met), and
    the refused do not undo the others."""
    adapter: Any = backend.adapter
    for i in range(8):
        await adapter.save_checkpoint(cp(1, f"s{i}"), expected_revision=0)
    trace = traced(backend)
    results = await asyncio.gather(
        *(
            adapter.save_checkpoint(
                cp(2, f"s{i}") if i % 2 else cp(7, f"s{i}"), expected_revision=1 if i % 2 else 6
            )
            for i in range(8)
        ),
        return_exceptions=True,
    )
    assert kinds(trace).count("BEGIN") == 1
    for i, result in enumerate(results):
        got = await adapter.get_checkpoint(f"s{i}")
        assert got is not None
        if i % 2:
            assert result is None and got.revision == 2
        else:
            assert isinstance(result, siglo.CheckpointConflictError), result
            assert result.current_revision == 1 and got.revision == 1


async def test_a_failing_write_fails_only_its_caller(backend: siglo.Backend) -> None:
    """A statement that fails (a constraint) and a plan that raises, in a batch with
    good writes: each error goes to its own caller; the others commit."""
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    await db.write("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    await db.write("INSERT INTO t VALUES (1, 'one')")

    def failing_plan() -> Any:
        yield ("INSERT INTO t VALUES (20, 'undone')", ())
        raise ValueError("the plan gives up")

    def good_plan() -> Any:
        yield ("INSERT INTO t VALUES (30, 'a')", ())
        yield ("INSERT INTO t VALUES (31, 'b')", ())

    trace = traced(backend)
    results = await asyncio.gather(
        db.write("INSERT INTO t VALUES (2, 'two')"),
        db.write("INSERT INTO t VALUES (1, 'again')"),  # the primary key: refused
        db.run_plan(failing_plan()),
        db.write("INSERT INTO t VALUES (3, 'three')"),
        db.run_plan(good_plan()),
        return_exceptions=True,
    )
    assert kinds(trace).count("BEGIN") == 1, trace
    assert results[0] == [] and results[3] == [] and results[4] is None
    assert isinstance(results[1], siglo.StorageAdapterError)
    assert "UNIQUE" in str(results[1])
    assert isinstance(results[2], ValueError)
    rows = await db.read("SELECT k, v FROM t ORDER BY k")
    assert rows == [(1, "one"), (2, "two"), (3, "three"), (30, "a"), (31, "b")]


async def test_no_caller_is_answered_before_the_commit(backend: siglo.Backend) -> None:
    """Each caller of a batch, once answered, finds its write committed: another
    connection sees it."""
    adapter: Any = backend.adapter
    db: Any = adapter.database
    seen: list[bool] = []

    async def save_then_look(i: int) -> None:
        await adapter.save_checkpoint(cp(1, f"s{i}"))
        assert not db._writer.in_transaction
        rows = db._reader.execute(
            "SELECT count(*) FROM siglo_checkpoints WHERE stack_id = ?", (f"s{i}",)
        ).fetchall()
        seen.append(rows == [(1,)])

    trace = traced(backend)
    await asyncio.gather(*(save_then_look(i) for i in range(16)))
    assert kinds(trace).count("COMMIT") == 1
    assert seen == [True] * 16


async def test_a_sequential_save_commits_on_its_own(tmp_path: Path) -> None:
    """With the default hold, one caller saving in a loop: every save is its own
    autocommit statement, committed before it returns; no transaction is opened."""
    async with siglo.connect(f"sqlite:///{tmp_path}/q.db") as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        trace = traced(backend)
        db: Any = adapter.database
        for revision in range(1, 11):
            await adapter.save_checkpoint(cp(revision), expected_revision=revision - 1)
            assert not db._writer.in_transaction
            assert db._reader.execute("SELECT revision FROM siglo_checkpoints").fetchall() == [
                (revision,)
            ]
        assert kinds(trace) == ["WRITE"] * 10


async def test_a_batch_keeps_the_loop_turning(backend: siglo.Backend) -> None:
    """Callers that never wait otherwise: 32 of them saving 20 times each still let a
    sleeper wake within a few milliseconds (the batch's budget and the hold)."""
    adapter: Any = backend.adapter
    lags: list[float] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def sleeper() -> None:
        while not stop.is_set():
            t0 = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t0 - 0.001)

    probe = asyncio.ensure_future(sleeper())
    await asyncio.sleep(0)

    async def caller(n: int) -> None:
        for r in range(1, 21):
            await adapter.save_checkpoint(cp(r, f"c{n}"), expected_revision=r - 1)

    await asyncio.gather(*(caller(n) for n in range(32)))
    stop.set()
    await probe
    assert len(lags) > 5
    for n in range(32):
        got = await adapter.get_checkpoint(f"c{n}")
        assert got is not None and got.revision == 20


_CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    import siglo
    from siglo import Checkpoint

    async def main():
        backend = siglo.connect("sqlite:///" + sys.argv[1] + sys.argv[2])
        adapter = backend.adapter
        await adapter.open()
        from siglo_sqlite import database
        database.HOLD_S, database.GAP_S = 0.0, 60.0
        # One transaction for the batch however slow the machine (its 2 ms budget split
        # it in two under load).
        database.BATCH_BUDGET_S = 60.0
        trace = []
        db = adapter.database
        (db._writer or db._syncing).set_trace_callback(trace.append)
        async def save(i):
            await adapter.save_checkpoint(
                Checkpoint(stack_id=f"s{i}", revision=1, timestamp=1, contexts={})
            )
        await asyncio.gather(*(save(i) for i in range(16)))
        print("saved", trace.count("BEGIN IMMEDIATE"), flush=True)
        await asyncio.sleep(60)  # killed here, never closed

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("query", ["", "?synchronous=FULL"])
def test_saves_that_returned_survive_a_kill(tmp_path: Path, query: str) -> None:
    """A process saves 16 checkpoints at once (one at once and 15 in a batch; at FULL all
    16 in a batch on the backend's thread), prints once they returned and is killed
    (SIGKILL, nothing closed): every one is in the file."""
    path = tmp_path / "k.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), query],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        # The first save ran at once, the other 15 in one transaction.
        assert child.stdout.readline().strip() == "saved 1"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)

    async def look() -> list[int | None]:
        async with siglo.connect(f"sqlite:///{path}") as backend:
            adapter: Any = backend.adapter
            found = [await adapter.get_checkpoint(f"s{i}") for i in range(16)]
            return [None if cp is None else cp.revision for cp in found]

    assert asyncio.run(look()) == [1] * 16


async def test_at_full_concurrent_saves_share_one_syncing_commit(tmp_path: Path) -> None:
    """At ``synchronous=FULL`` no write runs on the loop: every one goes to a batch,
    committed on the backend's own thread; 32 callers saving at once share one
    transaction there (one sync of the WAL instead of 32), each CAS its own outcome."""
    async with siglo.connect(f"sqlite:///{tmp_path}/f.db?synchronous=FULL") as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        db: Any = adapter.database
        await adapter.save_checkpoint(cp(1, "taken"), expected_revision=0)
        trace: list[str] = []
        db._syncing.set_trace_callback(trace.append)
        results = await asyncio.gather(
            *(adapter.save_checkpoint(cp(1, f"s{i}"), expected_revision=0) for i in range(31)),
            adapter.save_checkpoint(cp(1, "taken"), expected_revision=0),
            return_exceptions=True,
        )
        assert results[:31] == [None] * 31
        assert isinstance(results[31], siglo.CheckpointConflictError)
        assert kinds(trace) == ["BEGIN", *["WRITE"] * 32, "COMMIT"], kinds(trace)
        for i in range(31):
            got = await adapter.get_checkpoint(f"s{i}")
            assert got is not None and got.revision == 1


async def test_calls_asked_after_a_batched_write_see_it(backend: siglo.Backend) -> None:
    """A batch takes its place in line when its first write is asked: a read, a statement
    on the driver and a transaction asked after it (before it commits) run after it and
    see it, as they would after that write run alone."""
    adapter: Any = backend.adapter
    db: Any = adapter.database
    await adapter.save_checkpoint(cp(1))
    saving = asyncio.ensure_future(adapter.save_checkpoint(cp(2), expected_revision=1))
    await asyncio.sleep(0)  # in a batch (the hold is nothing here), not committed yet
    assert not saving.done()
    assert db._collecting is not None and db._order.in_line == 1
    select = "SELECT revision FROM siglo_checkpoints WHERE stack_id = 's'"

    async def in_a_transaction() -> list[Any]:
        async with db.transaction() as tx:
            rows: list[Any] = await tx.fetch(select)
            return rows

    reading = asyncio.ensure_future(adapter.get_checkpoint("s"))
    fetching = asyncio.ensure_future(db.fetch(select))
    transacting = asyncio.ensure_future(in_a_transaction())
    await saving
    got = await reading
    assert got is not None and got.revision == 2
    assert await fetching == [(2,)]
    assert await transacting == [(2,)]
    assert db._order.in_line == 0 and db._collecting is None


async def test_a_batch_waits_for_a_statement_in_flight_on_the_driver(
    backend: siglo.Backend,
) -> None:
    """A batch opened while the driver has a statement in flight runs after it: a
    compare-and-set on the revision that statement writes succeeds."""
    adapter: Any = backend.adapter
    db: Any = adapter.database
    await adapter.save_checkpoint(cp(1))
    writer, db._writer = db._writer, None  # this save goes to the driver's thread
    first = asyncio.ensure_future(adapter.save_checkpoint(cp(2), expected_revision=1))
    await asyncio.sleep(0)
    db._writer = writer
    assert db._order.on_driver == 1
    trace = traced(backend)
    await asyncio.gather(
        adapter.save_checkpoint(cp(3), expected_revision=2),
        adapter.save_checkpoint(cp(1, "other")),
    )
    await first
    assert kinds(trace) == ["BEGIN", "WRITE", "WRITE", "COMMIT"], kinds(trace)
    got = await adapter.get_checkpoint("s")
    assert got is not None and got.revision == 3


async def test_a_batch_cancelled_before_it_ran_lets_the_line_go_on(
    backend: siglo.Backend,
) -> None:
    """The loop shutting down cancels a batch's task before it runs: its callers are
    cancelled, and the calls asked after it still run."""
    adapter: Any = backend.adapter
    db: Any = adapter.database
    await adapter.save_checkpoint(cp(1))
    saving = asyncio.ensure_future(adapter.save_checkpoint(cp(2), expected_revision=1))
    await asyncio.sleep(0)
    (task,) = db._batches
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await saving
    assert db._order.in_line == 0 and db._collecting is None
    got = await adapter.get_checkpoint("s")
    assert got is not None and got.revision == 1
    await adapter.save_checkpoint(cp(2), expected_revision=1)


def _turns() -> list[int]:
    """A counter of the event loop's turns (``[n]``), advanced once a turn until the
    test's loop closes."""
    loop = asyncio.get_running_loop()
    count = [0]

    def tick() -> None:
        count[0] += 1
        loop.call_soon(tick)

    loop.call_soon(tick)
    return count


def _at_most_per_turn(resumed: list[int]) -> int:
    """The most callers that resumed in one turn of the loop."""
    return max(resumed.count(turn) for turn in set(resumed))


async def test_a_batch_answers_its_callers_a_few_a_turn(backend: siglo.Backend) -> None:
    """A batch of 31 saves commits once, then answers ANSWERS_PER_TURN callers a turn
    of the loop: each resumes in the turn after its answer, and 31 at once made one turn
    of their work, which a sleeping coroutine waited for (issue 36's loop lag)."""
    adapter: Any = backend.adapter
    trace = traced(backend)
    count = _turns()
    resumed: list[int] = []

    async def save(i: int) -> None:
        await adapter.save_checkpoint(cp(1, f"s{i}"))
        resumed.append(count[0])

    await asyncio.gather(*(save(i) for i in range(32)))
    assert kinds(trace) == ["WRITE", "BEGIN", *["WRITE"] * 31, "COMMIT"], kinds(trace)
    batched = resumed[1:]  # the first wrote alone, at once
    assert _at_most_per_turn(batched) == sqlite_database.ANSWERS_PER_TURN == 8
    assert len(set(batched)) == 4
    for i in range(32):
        got = await adapter.get_checkpoint(f"s{i}")
        assert got is not None and got.revision == 1


async def test_coalesced_loads_are_answered_a_few_a_turn(backend: siglo.Backend) -> None:
    """31 loads queued behind a running one share one statement, and are answered
    ANSWERS_PER_TURN a turn, each with its own checkpoint."""
    adapter: Any = backend.adapter
    for i in range(32):
        await adapter.save_checkpoint(cp(i + 1, f"s{i}"))
    count = _turns()
    resumed: list[int] = []

    async def load(i: int) -> None:
        got = await adapter.get_checkpoint(f"s{i}")
        assert got is not None and got.revision == i + 1
        resumed.append(count[0])

    await asyncio.gather(*(load(i) for i in range(32)))
    assert len(resumed) == 32
    assert _at_most_per_turn(resumed) <= sqlite_database.ANSWERS_PER_TURN
    assert len(set(resumed)) >= 4


async def test_a_batch_cancelled_while_answering_answers_the_rest() -> None:
    """What committed is never reported otherwise: cancelled between its turns,
    answer_in_turns answers every caller left before it stops."""
    from siglo_sqlite.group_commit import Entry, answer_in_turns

    loop = asyncio.get_running_loop()
    entries = [Entry("", {}, None, 0.0, loop.create_future()) for _ in range(20)]
    answering = asyncio.ensure_future(
        answer_in_turns([(e, [(i,)], None) for i, e in enumerate(entries)])
    )
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert 0 < sum(e.future.done() for e in entries) < 20
    answering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answering
    assert [e.future.result() for e in entries] == [[(i,)] for i in range(20)]


async def test_at_full_a_syncing_commit_answers_a_few_a_turn(tmp_path: Path) -> None:
    """The syncing commit on the backend's thread answers its callers ANSWERS_PER_TURN a
    turn of the loop too, each with its own outcome."""
    async with siglo.connect(f"sqlite:///{tmp_path}/f.db?synchronous=FULL") as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        await adapter.save_checkpoint(cp(1, "taken"), expected_revision=0)
        count = _turns()
        resumed: list[int] = []

        async def save(stack: str) -> BaseException | None:
            try:
                await adapter.save_checkpoint(cp(1, stack), expected_revision=0)
            except siglo.CheckpointConflictError as exc:
                return exc
            finally:
                resumed.append(count[0])
            return None

        results = await asyncio.gather(*(save(f"s{i}") for i in range(31)), save("taken"))
        assert results[:31] == [None] * 31
        assert isinstance(results[31], siglo.CheckpointConflictError)
        assert _at_most_per_turn(resumed) <= sqlite_database.ANSWERS_PER_TURN
        assert len(set(resumed)) >= 4
