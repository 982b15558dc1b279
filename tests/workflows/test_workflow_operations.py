"""Run-or-continue, durable timers (sleep, wait timeouts) and recovery of crashed runs,
in one process on the memory backend with a manual clock (SPEC §9). The same across
real processes and servers: tests/workflows/test_worker_processes.py."""

from __future__ import annotations

from typing import Any

import pytest

import siglo
from siglo import ManualClock, Step, StorageManager, WorkflowSuspended, flow, wait_for_event
from siglo.errors import InvalidStateTransitionError, WaitTimeoutError
from siglo.workflow import Worker, run_input, sleep


class _Crash(BaseException):
    """Stands for the process dying mid-step: no step error handling runs."""


def counting_flow(calls: list[str], *, crash_in: str | None = None) -> siglo.Flow:
    async def one(x: int) -> int:
        calls.append("one")
        return x + 1

    async def two(x: int) -> int:
        calls.append("two")
        if crash_in == "two" and calls.count("two") == 1:
            raise _Crash
        return x * 10

    return flow(Step.create("one", one), Step.create("two", two), name="counting")


async def test_run_twice_returns_the_finished_result(manager: StorageManager) -> None:
    calls: list[str] = []
    f = counting_flow(calls)
    assert await f.run(1, manager=manager, stack_id="twice") == 20
    # The same id again, even with another input: the stored run's answer, nothing rerun.
    assert await f.run(5, manager=manager, stack_id="twice") == 20
    assert calls == ["one", "two"]


async def test_run_on_a_suspended_run_reports_it(manager: StorageManager) -> None:
    async def wait(_: Any) -> Any:
        return await wait_for_event("approve:7")

    f = flow(Step.create("wait", wait), name="approval")
    with pytest.raises(WorkflowSuspended):
        await f.run(None, manager=manager, stack_id="approval-7")
    with pytest.raises(WorkflowSuspended) as again:
        await f.run(None, manager=manager, stack_id="approval-7")
    assert again.value.correlation_key == "approve:7"
    assert await f.deliver("approve:7", "yes", manager=manager) == "yes"
    assert await f.run(None, manager=manager, stack_id="approval-7") == "yes"


async def test_run_on_a_failed_run_says_so(manager: StorageManager) -> None:
    async def boom(_: Any) -> Any:
        raise ValueError("no")

    f = flow(Step.create("boom", boom), name="boom")
    with pytest.raises(ValueError, match="no"):
        await f.run(None, manager=manager, stack_id="failed-1")
    with pytest.raises(InvalidStateTransitionError, match="already ended failed"):
        await f.run(None, manager=manager, stack_id="failed-1")


async def test_run_continues_a_crashed_run_after_its_last_finished_step(
    manager: StorageManager,
) -> None:
    calls: list[str] = []
    f = counting_flow(calls, crash_in="two")
    with pytest.raises(_Crash):
        await f.run(1, manager=manager, stack_id="crashed")
    stored = await manager.load_checkpoint("crashed")
    assert stored is not None and stored.status == "running"
    assert await f.run(1, manager=manager, stack_id="crashed") == 20
    assert calls == ["one", "two", "two"]


async def test_worker_recovers_a_crashed_run_once(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    calls: list[str] = []
    f = counting_flow(calls, crash_in="two")
    with pytest.raises(_Crash):
        await f.run(1, manager=manager, stack_id="orphan")
    worker = Worker(manager, [f], batch=10)
    done = await worker.run_once()
    assert done.runs_recovered == 1 and not done.failures
    stored = await memory.adapter.get_checkpoint("orphan")
    assert stored is not None and stored.status == "completed"
    assert calls == ["one", "two", "two"]
    assert (await worker.run_once()).runs_recovered == 0


async def test_worker_leaves_a_run_whose_lock_is_held(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    calls: list[str] = []
    f = counting_flow(calls, crash_in="two")
    with pytest.raises(_Crash):
        await f.run(1, manager=manager, stack_id="busy")
    worker = Worker(manager, [f])

    async def while_held() -> int:
        return (await worker.run_once()).runs_recovered

    # Alive elsewhere: its process holds the workflow lock.
    assert await memory.adapter.with_workflow_lock("busy", while_held) == 0
    assert calls == ["one", "two"]


async def test_sleep_suspends_durably_until_a_worker_fires_it(
    memory: siglo.Backend, manager: StorageManager, clock: ManualClock
) -> None:
    calls: list[str] = []

    async def nap(x: int) -> int:
        calls.append("nap")
        await sleep(60_000)
        calls.append("woke")
        return x

    f = flow(Step.create("nap", nap), name="napper")
    with pytest.raises(WorkflowSuspended):
        await f.run(3, manager=manager, stack_id="nap-1")
    worker = Worker(manager, [f])
    assert (await worker.run_once()).timers_fired == 0
    clock.advance(59_999)
    assert (await worker.run_once()).timers_fired == 0
    clock.advance(1)
    assert (await worker.run_once()).timers_fired == 1
    assert calls == ["nap", "nap", "woke"]
    assert await f.run(3, manager=manager, stack_id="nap-1") == 3
    assert (await worker.run_once()).timers_fired == 0


async def test_a_wait_timeout_raises_in_the_step(
    manager: StorageManager, clock: ManualClock
) -> None:
    async def wait(_: Any) -> str:
        try:
            return str(await wait_for_event(f"pay:{run_input()}", timeout_ms=1_000))
        except WaitTimeoutError as exc:
            return f"timed out waiting for {exc.correlation_key}"

    f = flow(Step.create("wait", wait), name="payment")
    with pytest.raises(WorkflowSuspended):
        await f.run("9", manager=manager, stack_id="pay-9")
    clock.advance(1_000)
    # Past the deadline an event is refused; the timer fires instead.
    with pytest.raises(siglo.WaitRecordClaimError):
        await f.deliver("pay:9", "paid", manager=manager)
    assert (await Worker(manager, [f]).run_once()).timers_fired == 1
    assert await f.run("9", manager=manager, stack_id="pay-9") == "timed out waiting for pay:9"


async def test_an_uncaught_timeout_fails_the_run(
    memory: siglo.Backend, manager: StorageManager, clock: ManualClock
) -> None:
    async def wait(_: Any) -> Any:
        return await wait_for_event("never", timeout_ms=10)

    f = flow(Step.create("wait", wait), name="strict-wait")
    with pytest.raises(WorkflowSuspended):
        await f.run(None, manager=manager, stack_id="strict")
    clock.advance(10)
    done = await Worker(manager, [f]).run_once()
    assert done.timers_fired == 1
    assert done.failures and "WaitTimeoutError" in done.failures[0]
    stored = await memory.adapter.get_checkpoint("strict")
    assert stored is not None and stored.status == "failed"


async def test_workers_leave_other_flows_alone(manager: StorageManager, clock: ManualClock) -> None:
    async def nap(_: Any) -> None:
        await sleep(5)

    mine = flow(Step.create("nap", nap), name="mine")
    other = flow(Step.create("nap", nap), name="other")
    with pytest.raises(WorkflowSuspended):
        await other.run(None, manager=manager, stack_id="theirs")
    clock.advance(5)
    assert (await Worker(manager, [mine]).run_once()).timers_fired == 0
    assert (await Worker(manager, [other]).run_once()).timers_fired == 1


def test_a_worker_needs_flows(manager: StorageManager) -> None:
    with pytest.raises(siglo.InvalidArgumentError):
        Worker(manager, [])
    with pytest.raises(siglo.InvalidArgumentError):
        Worker(manager, ["not a flow"])  # type: ignore[list-item]


async def test_a_pass_is_bounded_by_its_batch(manager: StorageManager, clock: ManualClock) -> None:
    async def nap(_: Any) -> None:
        await sleep(5)

    f = flow(Step.create("nap", nap), name="bounded")
    for i in range(5):
        with pytest.raises(WorkflowSuspended):
            await f.run(None, manager=manager, stack_id=f"bounded-{i}")
    clock.advance(5)
    worker = Worker(manager, [f], batch=2)
    assert [(await worker.run_once()).timers_fired for _ in range(4)] == [2, 2, 1, 0]


async def test_foreign_due_waits_do_not_fill_a_pass(
    memory: siglo.Backend, manager: StorageManager, clock: ManualClock
) -> None:
    from siglo import WaitRecord

    for i in range(5):  # due waits no flow of this worker owns
        await memory.adapter.save_wait_record(
            WaitRecord(correlation_key=f"foreign-{i}", stack_id=f"f-{i}", expires_at=1)
        )

    async def nap(_: Any) -> None:
        await sleep(5)

    f = flow(Step.create("nap", nap), name="own")
    with pytest.raises(WorkflowSuspended):
        await f.run(None, manager=manager, stack_id="own-1")
    clock.advance(5)
    assert (await Worker(manager, [f], batch=2).run_once()).timers_fired == 1
