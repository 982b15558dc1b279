"""What one run of a 3-step flow (one step cached) sends to an SQL database: each
statement recorded at the database's ``fetch``/``read``, the way the end-to-end benchmark's
flow runs (docs/benchmarks.md counts them). The count is what the run costs on a server
whose commits take milliseconds, so a change that adds one must show up here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sql_support import open_backend, refusing_trigger

import siglo
from siglo import Step, WorkflowSuspended, flow, wait_for_event
from siglo_sql.database import Database


@pytest.fixture(params=["sqlite-file", "postgres"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[siglo.Backend]:
    async with open_backend(request.param) as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


def entry_points(db: Any, *names: str) -> list[str]:
    """Of ``names``, those the database runs statements through: ``fetch``, and ``read``
    and ``write`` where the dialect has its own (SQLite's reader and writer connections;
    elsewhere they call ``fetch``)."""
    return [n for n in names if n == "fetch" or getattr(type(db), n) is not getattr(Database, n)]


def head(sql: str) -> str:
    """A statement's first three words (``INSERT INTO <table>``), upper case."""
    return " ".join(sql.split()[:3]).upper()


def saves_checkpoint(head: str) -> bool:
    """Whether a statement of that head writes a checkpoint (``WITH ctx AS``: a context
    change and a checkpoint in one statement)."""
    return "CHECKPOINTS" in head or head == "WITH CTX AS"


def record(backend: siglo.Backend, sends: list[list[str]] | None = None) -> list[str]:
    """The first words of every statement the backend's database runs from now on; and
    in ``sends``, the statements of each call, one list per call (``fetch_all`` sends
    several in one call: one round trip on PostgreSQL; ``run_plan`` runs several in one
    transaction: on SQLite one ``BEGIN IMMEDIATE … COMMIT`` on the writer)."""
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    sent: list[str] = []
    calls = sends if sends is not None else []
    for name in entry_points(db, "fetch", "read", "write"):
        real = getattr(db, name)

        async def call(sql: str, params: Any = (), _real: Any = real) -> Any:
            sent.append(head(sql))
            calls.append([head(sql)])
            return await _real(sql, params)

        setattr(db, name, call)
    real_all = db.fetch_all

    async def call_all(statements: Any) -> Any:
        heads = [head(sql) for sql, _ in statements]
        sent.extend(heads)
        calls.append(heads)
        return await real_all(statements)  # its statements run on a transaction's executor

    db.fetch_all = call_all
    real_plan = db.run_plan

    async def call_plan(plan: Any) -> None:
        heads: list[str] = []
        calls.append(heads)

        def recorded() -> Any:
            try:
                step = next(plan)
                while True:
                    heads.append(head(step[0]))
                    sent.append(head(step[0]))
                    step = plan.send((yield step))
            except StopIteration:
                return

        await real_plan(recorded())

    db.run_plan = call_plan
    return sent


def three_steps() -> Any:
    async def step(inp: dict[str, Any]) -> dict[str, Any]:
        return {"run": inp["run"], "step": inp.get("step", 0) + 1}

    return flow(
        Step.create("fetch", step),
        Step.create("price", step).cache(ttl_ms=300_000, key=lambda inp: f"price-{inp['run']}"),
        Step.create("settle", step),
        name="statements",
    )


def reading(statement: str) -> bool:
    return statement.startswith(("SELECT", "WITH LIVE"))


async def test_a_new_run_sends_no_read_before_creating(backend: siglo.Backend) -> None:
    manager = siglo.StorageManager(backend, error_mode="strict")
    work = three_steps()
    await work.run({"run": "warm"}, manager=manager, stack_id="warm")  # migrations, caches
    calls: list[list[str]] = []
    sent = record(backend, calls)
    out = await work.run({"run": "r1"}, manager=manager, stack_id="r1")
    assert out == {"run": "r1", "step": 3}
    reads = [s for s in sent if reading(s)]
    writes = [c for c in calls if not all(reading(s) for s in c)]
    # Five writes, each one transaction: the workflow lock taken, the creation, and one
    # per step — its context change and checkpoint; the cached step's with its cache
    # entry; the last with the completion and the lock's release. The one read: the
    # cached step's look-up. No look-up of the run before its creation: the creation's
    # compare-and-set is that look-up.
    assert len(reads) == 1, sent
    assert len(writes) == 5, calls
    # PostgreSQL: a change and its checkpoint are one statement (WITH ctx AS).
    sizes = [1, 1, 1, 2, 2] if backend.name == "postgres" else [1, 1, 2, 3, 3]
    assert [len(c) for c in writes] == sizes, calls
    assert any("STEP_CACHE" in s for s in writes[3]), calls
    assert "LOCKS" in writes[4][-1], calls


async def test_the_lock_is_released_with_the_last_checkpoint(backend: siglo.Backend) -> None:
    """The completion's checkpoint and the workflow lock's release are one call to the
    database (one transaction: on PostgreSQL one round trip, tests/backends/test_sql_fetch_all.py
    counts its Syncs; on SQLite one ``BEGIN IMMEDIATE … COMMIT``). The run is completed
    and its lock free when ``run`` returns."""
    manager = siglo.StorageManager(backend, error_mode="strict")
    work = three_steps()
    await work.run({"run": "warm"}, manager=manager, stack_id="warm")
    calls: list[list[str]] = []
    record(backend, calls)
    await work.run({"run": "r-last"}, manager=manager, stack_id="r-last")
    last = calls[-1]
    assert any(saves_checkpoint(s) for s in last) and "LOCKS" in last[-1], calls
    assert len(calls) == 6, calls  # 5 writes and the cache look-up
    stored = await backend.adapter.get_checkpoint("r-last")
    assert stored is not None and stored.status == "completed"

    async def enter() -> str:
        return "entered"

    entered = backend.adapter.with_workflow_lock("r-last", enter, timeout_ms=50)
    assert await entered == "entered"


async def test_a_stored_run_is_taken_up_and_nothing_is_written_for_it(
    backend: siglo.Backend,
) -> None:
    """The creation's refused compare-and-set stores nothing; the stored run answers."""
    manager = siglo.StorageManager(backend, error_mode="strict")
    work = three_steps()
    first = await work.run({"run": "r"}, manager=manager, stack_id="r")
    stored = await backend.adapter.get_checkpoint("r")
    assert stored is not None
    again = await work.run({"run": "other input"}, manager=manager, stack_id="r")
    assert again == first
    after = await backend.adapter.get_checkpoint("r")
    assert after is not None
    assert after.revision == stored.revision
    assert after.to_json() == stored.to_json()


async def test_a_cache_entry_is_written_with_its_steps_checkpoint(
    backend: siglo.Backend,
) -> None:
    """The cached step's cache entry, context change and checkpoint are one call to the
    database (one transaction), and all land."""
    manager = siglo.StorageManager(backend, error_mode="strict")
    work = three_steps()
    await work.run({"run": "warm"}, manager=manager, stack_id="warm")
    calls: list[list[str]] = []
    record(backend, calls)
    out = await work.run({"run": "r2"}, manager=manager, stack_id="r2")
    assert out == {"run": "r2", "step": 3}
    caching = [c for c in calls if any("STEP_CACHE" in s for s in c)]
    assert len(caching) == 1, calls
    assert any(saves_checkpoint(s) for s in caching[0]), calls
    assert await backend.adapter.get_cached_step("price-r2") == {"run": "r2", "step": 2}
    stored = await backend.adapter.get_checkpoint("r2")
    assert stored is not None
    assert stored.status == "completed"
    assert stored.contexts["price"]["output"] == {"run": "r2", "step": 2}


async def test_a_cached_steps_look_up_goes_beside_the_checkpoint_before_it(
    backend: siglo.Backend,
) -> None:
    """The cached step's input is the output of the step before it, known before that
    step's checkpoint is sent: its cache look-up is sent while that checkpoint is being
    written, not after it has landed (one round trip fewer, one after the other)."""
    manager = siglo.StorageManager(backend, error_mode="strict")
    work = three_steps()
    await work.run({"run": "warm"}, manager=manager, stack_id="warm")
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    events: list[tuple[str, str]] = []  # ("start" | "end", statement)
    for name in entry_points(db, "fetch", "read", "write"):
        real = getattr(db, name)

        async def send(sql: str, params: Any = (), _real: Any = real) -> Any:
            text = " ".join(sql.split()).upper()
            what = "CACHE LOOK-UP" if text.startswith("SELECT VALUE FROM") else head(sql)
            events.append(("start", what))
            try:
                await asyncio.sleep(0.005)  # long enough for a call sent beside it to start
                return await _real(sql, params)
            finally:
                events.append(("end", what))

        setattr(db, name, send)
    real_plan = db.run_plan

    async def run_plan(plan: Any) -> None:  # SQLite: a change and its checkpoint
        events.append(("start", "A TRANSACTION"))
        try:
            await asyncio.sleep(0.005)
            await real_plan(plan)
        finally:
            events.append(("end", "A TRANSACTION"))

    db.run_plan = run_plan
    out = await work.run({"run": "r-ahead"}, manager=manager, stack_id="r-ahead")
    assert out == {"run": "r-ahead", "step": 3}
    # The checkpoints written through these calls start with the creation, then the first
    # step's (the one before the cached step); the look-up starts before that one ends.
    ends = [
        i
        for i, (kind, what) in enumerate(events)
        if kind == "end" and (saves_checkpoint(what) or what == "A TRANSACTION")
    ]
    lookups = [i for i, event in enumerate(events) if event == ("start", "CACHE LOOK-UP")]
    assert len(lookups) == 1 and len(ends) >= 2, events
    assert ends[0] < lookups[0] < ends[1], events
    stored = await backend.adapter.get_checkpoint("r-ahead")
    assert stored is not None and stored.status == "completed"
    assert stored.contexts["fetch"]["output"] == {"run": "r-ahead", "step": 1}


async def test_a_failed_cache_write_is_raised_and_nothing_of_its_step_written(
    backend: siglo.Backend,
) -> None:
    """The database refuses the cache entry (a trigger): ``run`` raises, and the step's
    checkpoint, written in the same transaction, is not stored either; the lock is
    free, and the run continues from the step before, running the step again."""
    manager = siglo.StorageManager(backend, error_mode="strict")
    work = three_steps()
    adapter: Any = backend.adapter
    db: Any = adapter.database
    drop = await refusing_trigger(backend, "step_cache", "INSERT", "no cache today")
    with pytest.raises(siglo.StorageAdapterError, match="no cache today"):
        await work.run({"run": "r3"}, manager=manager, stack_id="r3")
    stored = await adapter.get_checkpoint("r3")
    assert stored is not None
    assert stored.status == "running"
    assert stored.contexts["fetch"]["output"] == {"run": "r3", "step": 1}
    assert "output" not in stored.contexts.get("price", {})
    assert await adapter.get_cached_step("price-r3") is siglo.MISSING
    await db.fetch(drop)
    out = await work.resume("r3", manager=siglo.StorageManager(backend, error_mode="strict"))
    assert out == {"run": "r3", "step": 3}
    assert await adapter.get_cached_step("price-r3") == {"run": "r3", "step": 2}


@pytest.mark.parametrize("ending", ["fails", "waits", "delivered"])
async def test_a_run_that_fails_or_waits_releases_its_lock_with_that_checkpoint(
    backend: siglo.Backend, ending: str
) -> None:
    """A failing step's ``failed`` checkpoint and a suspending step's ``waiting`` one are
    the run's last writes too: each goes in one call with the lock's release. A
    delivered event's run is not: the wait's completion follows its checkpoint, so the
    lock is released after that, alone."""
    manager = siglo.StorageManager(backend, error_mode="strict")

    async def first(inp: Any) -> Any:
        return inp

    async def second(inp: Any) -> Any:
        if ending == "fails":
            raise ValueError("step failed")
        # One key a run: a correlation key names one waiting run (the warm-up's waits).
        return await wait_for_event(f"approve-{ending}-{inp}")

    work = flow(Step.create("first", first), Step.create("second", second), name=ending)
    with contextlib.suppress(ValueError, WorkflowSuspended):  # statements prepared
        await work.run("warm", manager=manager, stack_id=f"warm-{ending}")
    calls: list[list[str]] = []
    record(backend, calls)
    with pytest.raises(ValueError if ending == "fails" else WorkflowSuspended):
        await work.run("in", manager=manager, stack_id=f"r-{ending}")
    if ending == "delivered":
        calls.clear()
        assert await work.deliver(f"approve-{ending}-in", "ok", manager=manager) == "ok"
    last = calls[-1]
    if ending != "delivered":
        assert any(saves_checkpoint(s) for s in last) and "LOCKS" in last[-1], calls
    else:
        assert len(last) == 1 and "LOCKS" in last[0], calls
    stored = await backend.adapter.get_checkpoint(f"r-{ending}")
    assert stored is not None
    assert (
        stored.status == {"fails": "failed", "waits": "waiting", "delivered": "completed"}[ending]
    )

    async def enter() -> str:
        return "entered"

    entered = backend.adapter.with_workflow_lock(f"r-{ending}", enter, timeout_ms=50)
    assert await entered == "entered"
