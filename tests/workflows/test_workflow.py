"""The workflow runtime: checkpointed steps, crash recovery, durable waits, caching."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

import siglo
from siglo import ManualClock, Step, StorageManager, WorkflowSuspended, flow, wait_for_event
from siglo.errors import InvalidArgumentError
from siglo.workflow import run_input
from siglo_memory import MemoryStorageAdapter


def fresh_manager(backend: siglo.Backend, clock: ManualClock) -> StorageManager:
    """A new manager on the same store: what another process would have."""
    return StorageManager(backend, clock=clock, error_mode="strict")


async def test_steps_run_in_order_and_are_checkpointed(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    async def double(x: int) -> int:
        return x * 2

    async def describe(x: int) -> dict[str, int]:
        return {"result": x}

    billing = flow(Step.create("double", double), Step.create("describe", describe))
    assert await billing.run(21, manager=manager, stack_id="run-1") == {"result": 42}
    assert "run-1" not in manager.stacks  # the checkpoint holds the run, not the manager
    stored = await memory.adapter.get_checkpoint("run-1")
    assert stored is not None
    assert stored.status == "completed"
    assert stored.chains == ("double", "describe")
    assert stored.contexts == {"double": {"output": 42}, "describe": {"output": {"result": 42}}}
    assert stored.workflow_id == "double+describe"
    # Resuming a completed run returns its output without running anything.
    assert await billing.resume("run-1", manager=fresh_manager(memory, manager.clock)) == {
        "result": 42
    }


async def test_the_last_step_and_the_completion_are_one_checkpoint(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    saved: list[tuple[int, str, tuple[str, ...]]] = []
    save = memory.adapter.save_checkpoint

    async def recording(checkpoint: siglo.Checkpoint, **kwargs: Any) -> None:
        saved.append((checkpoint.revision, checkpoint.status, checkpoint.chains))
        await save(checkpoint, **kwargs)

    memory.adapter.save_checkpoint = recording  # type: ignore[method-assign]

    async def inc(x: int) -> int:
        return x + 1

    three = flow(*(Step.create(name, inc) for name in ("a", "b", "c")))
    assert await three.run(0, manager=manager, stack_id="run-1") == 3
    # Creation, one checkpoint after each step but the last, and the last step's outcome
    # with the completion: one save fewer than a checkpoint per step plus the completion.
    assert saved == [
        (1, "running", ()),
        (2, "running", ("a",)),
        (3, "running", ("a", "b")),
        (4, "completed", ("a", "b", "c")),
    ]


async def test_a_run_with_every_output_stored_but_not_completed_only_completes(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    """A checkpoint whose steps all have outputs but which is still ``running`` (as a
    version that saved the last step and the completion apart could leave it after a
    crash): resuming runs no step and stores the completion."""
    ran: list[str] = []

    async def inc(x: int) -> int:
        ran.append("step")
        return x + 1

    two = flow(Step.create("a", inc), Step.create("b", inc))
    probe = fresh_manager(memory, clock)
    assert await two.run(0, manager=probe, stack_id="probe") == 2
    done = await memory.adapter.get_checkpoint("probe")
    assert done is not None
    ran.clear()
    left = siglo.Checkpoint(
        stack_id="left",
        revision=3,
        timestamp=1,
        status="running",
        workflow_id=done.workflow_id,
        contexts=done.contexts,
        chains=done.chains,
        metadata=done.metadata,
    )
    await memory.adapter.save_checkpoint(left, expected_revision=0)
    assert await two.resume("left", manager=fresh_manager(memory, clock)) == 2
    assert ran == []
    stored = await memory.adapter.get_checkpoint("left")
    assert stored is not None
    assert (stored.status, stored.revision) == ("completed", 4)


async def test_a_crashed_run_resumes_after_its_last_finished_step(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    calls = {"first": 0, "second": 0}
    hang = asyncio.Event()

    async def first(x: int) -> int:
        calls["first"] += 1
        return x + 1

    async def second(x: int) -> int:
        calls["second"] += 1
        if calls["second"] == 1:
            await hang.wait()  # the worker dies here
        return x * 10

    work = flow(Step.create("first", first), Step.create("second", second))
    doomed = asyncio.create_task(work.run(1, manager=fresh_manager(memory, clock), stack_id="w"))
    await asyncio.sleep(0.01)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert await work.resume("w", manager=fresh_manager(memory, clock)) == 20
    assert calls == {"first": 1, "second": 2}


async def test_a_step_waits_for_an_event_delivered_elsewhere(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    async def request(order: dict[str, Any]) -> dict[str, Any]:
        approval = await wait_for_event(f"approval:{order['id']}", timeout_ms=60_000)
        return {**order, "approved_by": approval["by"]}

    async def ship(order: dict[str, Any]) -> str:
        return f"shipped {order['id']} ({order['approved_by']})"

    approvals = flow(Step.create("request", request), Step.create("ship", ship))
    with pytest.raises(WorkflowSuspended) as info:
        await approvals.run({"id": 7}, manager=fresh_manager(memory, clock), stack_id="o7")
    assert (info.value.correlation_key, info.value.step) == ("approval:7", "request")
    record = await memory.adapter.get_wait_record("approval:7")
    assert record is not None
    assert (record.status, record.stack_id, record.expires_at) == (
        "waiting",
        "o7",
        clock.now_ms() + 60_000,
    )
    assert (await memory.adapter.get_wait_record("o7")) == record
    stored = await memory.adapter.get_checkpoint("o7")
    assert stored is not None and stored.status == "waiting"
    # Still waiting: resuming says so again.
    with pytest.raises(WorkflowSuspended):
        await approvals.resume("o7", manager=fresh_manager(memory, clock))

    # Two processes receive the same webhook: the run resumes once.
    results = await asyncio.gather(
        approvals.deliver("approval:7", {"by": "ada"}, manager=fresh_manager(memory, clock)),
        approvals.deliver("approval:7", {"by": "bob"}, manager=fresh_manager(memory, clock)),
        return_exceptions=True,
    )
    done = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, siglo.WaitRecordClaimError)]
    assert len(done) == 1 and len(refused) == 1
    assert done[0] in ("shipped 7 (ada)", "shipped 7 (bob)")
    record = await memory.adapter.get_wait_record("approval:7")
    assert record is not None and record.status == "completed"
    final = await memory.adapter.get_checkpoint("o7")
    assert final is not None and final.status == "completed"


async def test_late_events_need_allow_expired(memory: siglo.Backend, clock: ManualClock) -> None:
    async def wait(_: Any) -> Any:
        return await wait_for_event("late", timeout_ms=1_000)

    waiting = flow(Step.create("wait", wait))
    with pytest.raises(WorkflowSuspended):
        await waiting.run(manager=fresh_manager(memory, clock), stack_id="late-run")
    clock.advance(1_000)
    with pytest.raises(siglo.WaitRecordClaimError, match="deadline"):
        await waiting.deliver("late", 1, manager=fresh_manager(memory, clock))
    assert (
        await waiting.deliver("late", 1, manager=fresh_manager(memory, clock), allow_expired=True)
        == 1
    )


async def test_changed_steps_need_a_migration(memory: siglo.Backend, clock: ManualClock) -> None:
    async def ask(_: Any) -> Any:
        return await wait_for_event("answer")

    async def old_tail(x: Any) -> str:
        return f"old {x}"

    async def new_tail(x: Any) -> str:
        return f"new {x}"

    v1 = flow(Step.create("ask", ask), Step.create("tail", old_tail), name="survey")
    v2 = flow(Step.create("ask", ask), Step.create("finish", new_tail), name="survey")
    assert v1.version != v2.version
    with pytest.raises(WorkflowSuspended):
        await v1.run(manager=fresh_manager(memory, clock), stack_id="survey-1")
    with pytest.raises(siglo.WorkflowVersionMismatchError, match="with_migration"):
        await v2.resume("survey-1", manager=fresh_manager(memory, clock))
    with pytest.raises(siglo.WorkflowVersionMismatchError):
        await v2.deliver("answer", 1, manager=fresh_manager(memory, clock))
    migrated = v2.with_migration(v1.version, lambda stack: None)
    # The refused delivery kept its claim; let its lease run out before redelivering.
    clock.advance(MemoryStorageAdapter(clock=clock).claim_lease_ms)
    assert await migrated.deliver("answer", 42, manager=fresh_manager(memory, clock)) == "new 42"


async def test_a_failing_step_marks_the_run_failed(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    async def broken(_: Any) -> Any:
        raise ValueError("card declined")

    with pytest.raises(ValueError, match="card declined"):
        await flow(Step.create("charge", broken)).run(manager=manager, stack_id="f")
    stored = await memory.adapter.get_checkpoint("f")
    assert stored is not None and stored.status == "failed"
    with pytest.raises(siglo.InvalidStateTransitionError):
        await flow(Step.create("charge", broken)).resume("f", manager=manager)


async def test_cached_steps_hit_the_step_cache(memory: siglo.Backend, clock: ManualClock) -> None:
    fetches = 0

    async def fetch_rates(_: Any) -> dict[str, float]:
        nonlocal fetches
        fetches += 1
        return {"EUR": 1.08}

    async def settle(rates: dict[str, float]) -> float:
        return 5000 * rates["EUR"]

    rates = Step.create("fetchRates", fetch_rates).cache(
        ttl_ms=300_000, key=lambda: "currency-rates-latest"
    )
    billing = flow(rates, Step.create("settle", settle))
    for run in range(3):
        assert await billing.run(
            None, manager=fresh_manager(memory, clock), stack_id=f"b{run}"
        ) == (5400.0)
    assert fetches == 1
    assert await memory.adapter.get_cached_step("currency-rates-latest") == {"EUR": 1.08}
    adapter = memory.adapter
    assert isinstance(adapter, MemoryStorageAdapter)
    assert [e.type for e in adapter.cache_events] == ["miss", "set", "hit", "hit"]
    clock.advance(300_000)
    await billing.run(None, manager=fresh_manager(memory, clock), stack_id="b-late")
    assert fetches == 2


async def test_a_cached_steps_look_up_is_taken_after_the_checkpoint_before_it(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    """The look-up is sent beside the previous step's checkpoint (tests/
    test_flow_statements.py), but nothing is decided from it earlier: its cache event
    follows that checkpoint, and its failure fails the run there, with the previous
    step's output stored."""
    adapter = memory.adapter
    assert isinstance(adapter, MemoryStorageAdapter)
    order: list[str] = []
    save, lookup = adapter.save_checkpoint, adapter.get_cached_step

    async def saving(checkpoint: siglo.Checkpoint, **kwargs: Any) -> None:
        await asyncio.sleep(0.002)  # the look-up, sent beside it, answers first
        await save(checkpoint, **kwargs)
        order.append(f"saved {checkpoint.status} {checkpoint.chains}")

    async def looking_up(key: str, **kwargs: Any) -> Any:
        order.append(f"look-up {key}")
        if key == "rates-broken":
            raise siglo.StorageAdapterError("cache unreachable")
        return await lookup(key, **kwargs)

    adapter.save_checkpoint = saving  # type: ignore[method-assign]
    adapter.get_cached_step = looking_up  # type: ignore[method-assign]

    async def fetch(run: str) -> str:
        return run

    async def rates(run: str) -> dict[str, float]:
        return {"EUR": 1.08}

    work = flow(
        Step.create("fetch", fetch),
        Step.create("rates", rates).cache(ttl_ms=60_000, key=lambda run: f"rates-{run}"),
    )
    assert await work.run("ok", manager=manager, stack_id="ok") == {"EUR": 1.08}
    assert order[:3] == ["saved running ()", "look-up rates-ok", "saved running ('fetch',)"]
    assert [e.type for e in adapter.cache_events] == ["miss", "set"]

    order.clear()
    with pytest.raises(siglo.StorageAdapterError, match="cache unreachable"):
        await work.run("broken", manager=manager, stack_id="broken")
    assert order == [
        "saved running ()",
        "look-up rates-broken",
        "saved running ('fetch',)",
        "saved failed ('fetch',)",
    ]
    stored = await adapter.get_checkpoint("broken")
    assert stored is not None and stored.status == "failed"
    assert stored.contexts["fetch"]["output"] == "broken"


async def test_a_failed_checkpoint_drops_the_next_steps_look_up(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    """The checkpoint before a cached step fails: its error is raised, the look-up sent
    beside it is dropped (its outcome retrieved, no event), and the cached step never runs."""
    adapter = memory.adapter
    assert isinstance(adapter, MemoryStorageAdapter)
    save = adapter.save_checkpoint

    async def refusing(checkpoint: siglo.Checkpoint, **kwargs: Any) -> None:
        if checkpoint.chains == ("fetch",):
            await asyncio.sleep(0.002)  # the look-up fails first
            raise siglo.StorageAdapterError("disk full")
        await save(checkpoint, **kwargs)

    async def failing_look_up(key: str, **kwargs: Any) -> Any:
        raise siglo.StorageAdapterError("cache unreachable")

    adapter.save_checkpoint = refusing  # type: ignore[method-assign]
    adapter.get_cached_step = failing_look_up  # type: ignore[method-assign]
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    ran: list[str] = []

    async def fetch(run: str) -> str:
        return run

    async def rates(run: str) -> str:
        ran.append(run)
        return run

    work = flow(
        Step.create("fetch", fetch),
        Step.create("rates", rates).cache(ttl_ms=60_000, key=lambda run: f"rates-{run}"),
    )
    try:
        with pytest.raises(siglo.StorageAdapterError, match="disk full"):
            await work.run("r", manager=manager, stack_id="r")
        gc.collect()  # a task whose exception nobody retrieved is reported when collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert unretrieved == []
    assert ran == []
    assert adapter.cache_events == []


async def test_a_cached_step_sees_the_entry_the_step_before_it_wrote(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    """Two cached steps under one key: the second's look-up is not sent ahead of the
    first's cache write, so it finds that entry, as when each waited for the other."""
    adapter = memory.adapter
    assert isinstance(adapter, MemoryStorageAdapter)
    ran: list[str] = []

    async def first(_: Any) -> str:
        ran.append("first")
        return "from first"

    async def second(_: Any) -> str:
        ran.append("second")
        return "from second"

    work = flow(
        Step.create("first", first).cache(ttl_ms=60_000, key=lambda: "shared"),
        Step.create("second", second).cache(ttl_ms=60_000, key=lambda: "shared"),
    )
    assert await work.run(None, manager=manager, stack_id="s") == "from first"
    assert ran == ["first"]
    assert [e.type for e in adapter.cache_events] == ["miss", "set", "hit"]


def test_flow_and_step_arguments() -> None:
    async def noop(_: Any) -> None:
        return None

    with pytest.raises(siglo.InvalidArgumentError):
        flow()
    with pytest.raises(siglo.InvalidArgumentError, match="unique"):
        flow(Step.create("a", noop), Step.create("a", noop))
    with pytest.raises(siglo.InvalidArgumentError):
        Step.create("", noop)
    with pytest.raises(siglo.InvalidArgumentError):
        Step.create("a", noop).cache(ttl_ms=0)
    with pytest.raises(siglo.InvalidArgumentError, match="inside a step"):
        asyncio.run(wait_for_event("x"))
    with pytest.raises(siglo.InvalidArgumentError, match="inside a step"):
        run_input()


def test_flow_refuses_what_is_not_a_flow_clearly() -> None:
    """``flow()`` is given steps and an optional name (the runs' ``workflow_id``): a
    string for a step, a non-string or empty name, no steps, or two steps of one name is
    an ``InvalidArgumentError`` naming what is wrong, not an ``AttributeError`` later."""

    async def one(value: Any) -> Any:
        return value

    step = Step.create("one", one)
    with pytest.raises(InvalidArgumentError, match="argument 0 is str"):
        flow("one")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="name must be a string"):
        flow(step, name=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="name must not be empty"):
        flow(step, name="")
    with pytest.raises(InvalidArgumentError, match="at least one step"):
        flow()
    with pytest.raises(InvalidArgumentError, match="must be unique"):
        flow(step, Step.create("one", one))
    assert flow(step).name == "one" and flow(step, name="orders").name == "orders"
