"""Flows through deploys and cancellations (found from outside): a renamed waiting step,
another flow's run, a run that ended under an older version, a worker given two versions
of a flow, a step whose wait key changed, a run cancelled while it is first stored.

The memory backend with a manual clock (one process); the cancellation on PostgreSQL,
with the first save held up by another session's lock on the checkpoints table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import siglo
from siglo import ManualClock, Step, StorageManager, WorkflowSuspended, flow, wait_for_event
from siglo.errors import InvalidArgumentError, InvalidStateTransitionError
from siglo.workflow import Worker


def _manager(backend: siglo.Backend, clock: ManualClock) -> StorageManager:
    """A new manager on the same store: what another process would have."""
    return StorageManager(backend, clock=clock, error_mode="strict")


async def _reserve(order: Any) -> Any:
    return {"order": order}


async def _approve(state: Any) -> Any:
    approver = await wait_for_event(f"approve:{state['order']}", timeout_ms=60_000)
    return {**state, "approver": approver}


async def _approve_or_time_out(state: Any) -> Any:
    try:
        approver = await wait_for_event(f"approve:{state['order']}", timeout_ms=1_000)
    except siglo.WaitTimeoutError:
        approver = "nobody (timed out)"
    return {**state, "approver": approver}


async def _ship(state: Any) -> str:
    return f"shipped {state['order']} approved by {state['approver']}"


def _renamed(stack: Any) -> None:
    """v1 -> v2: the step `approve` is called `approval` now: its context moves."""
    stack.contexts["approval"] = stack.contexts.pop("approve")


@pytest.mark.parametrize("fired", [False, True], ids=["delivered", "timed-out"])
async def test_an_event_reaches_a_waiting_step_renamed_by_a_migration(
    memory: siglo.Backend, clock: ManualClock, fired: bool
) -> None:
    approve = _approve_or_time_out if fired else _approve
    v1 = flow(
        Step.create("reserve", _reserve),
        Step.create("approve", approve),
        Step.create("ship", _ship),
        name="orders",
    )
    v2 = flow(
        Step.create("reserve", _reserve),
        Step.create("approval", approve),
        Step.create("ship", _ship),
        name="orders",
    ).with_migration(v1.version, _renamed)
    with pytest.raises(WorkflowSuspended):
        await v1.run(1, manager=_manager(memory, clock), stack_id="r1")
    if fired:
        clock.advance(1_000)
        done = await Worker(_manager(memory, clock), [v2]).run_once()
        assert done.timers_fired == 1 and not done.failures, done
        expected = "shipped 1 approved by nobody (timed out)"
    else:
        assert (
            await v2.deliver("approve:1", "ada", manager=_manager(memory, clock))
            == "shipped 1 approved by ada"
        )
        expected = "shipped 1 approved by ada"
    stored = await _manager(memory, clock).load_checkpoint("r1")
    assert stored is not None and stored.status == "completed"
    assert "approve" not in stored.contexts  # no stray context of the old name
    assert await v2.run(manager=_manager(memory, clock), stack_id="r1") == expected


async def test_a_migration_that_loses_the_wait_is_refused_and_the_event_kept(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    v1 = flow(Step.create("reserve", _reserve), Step.create("approve", _approve), name="orders")
    v2 = flow(
        Step.create("reserve", _reserve), Step.create("approval", _approve), name="orders"
    ).with_migration(v1.version, lambda stack: None)  # forgets to move the context
    with pytest.raises(WorkflowSuspended):
        await v1.run(1, manager=_manager(memory, clock), stack_id="r1")
    with pytest.raises(InvalidStateTransitionError, match="no step of flow 'orders' waits"):
        await v2.deliver("approve:1", "ada", manager=_manager(memory, clock))
    # The claim was released: the event is still deliverable, here by the flow that wrote it.
    assert await v1.deliver("approve:1", "ada", manager=_manager(memory, clock)) == {
        "order": 1,
        "approver": "ada",
    }


async def test_a_flow_never_takes_up_another_flows_run(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    async def charge(order: Any) -> str:
        return f"charged {order}"

    async def refund(order: Any) -> str:
        return f"REFUNDED {order}"

    async def wait(order: Any) -> Any:
        await wait_for_event(f"go:{order}")
        return order

    charges = flow(Step.create("wait", wait), Step.create("pay", charge), name="charges")
    refunds = flow(Step.create("wait", wait), Step.create("pay", refund), name="refunds")
    assert charges.version == refunds.version  # the same step names
    with pytest.raises(WorkflowSuspended):
        await charges.run(7, manager=_manager(memory, clock), stack_id="o7")
    for call in (
        refunds.deliver("go:7", None, manager=_manager(memory, clock)),
        refunds.run(7, manager=_manager(memory, clock), stack_id="o7"),
        refunds.resume("o7", manager=_manager(memory, clock)),
    ):
        with pytest.raises(InvalidArgumentError, match="a run of flow 'charges', not of 'refunds'"):
            await call
    assert await charges.deliver("go:7", None, manager=_manager(memory, clock)) == "charged 7"


async def test_a_run_ended_under_an_older_version_answers_as_it_ended(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    async def one(x: Any) -> Any:
        return x + 1

    async def two(x: Any) -> Any:
        return x * 10

    async def boom(x: Any) -> Any:
        raise ValueError("no")

    v1 = flow(Step.create("one", one), Step.create("two", two), name="calc")
    v2 = flow(Step.create("first", one), Step.create("second", two), name="calc")
    assert await v1.run(1, manager=_manager(memory, clock), stack_id="done") == 20
    # Completed under v1: its output, nothing run (v2 has no migration, and needs none).
    assert await v2.run(5, manager=_manager(memory, clock), stack_id="done") == 20
    failing = flow(Step.create("one", one), Step.create("two", boom), name="calc")
    with pytest.raises(ValueError, match="no"):
        await failing.run(1, manager=_manager(memory, clock), stack_id="failed")
    with pytest.raises(InvalidStateTransitionError, match="already ended failed"):
        await v2.run(1, manager=_manager(memory, clock), stack_id="failed")


async def test_a_worker_given_two_versions_takes_each_run_with_its_own(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    v1 = flow(
        Step.create("reserve", _reserve),
        Step.create("approve", _approve_or_time_out),
        Step.create("ship", _ship),
        name="orders",
    )
    v2 = flow(
        Step.create("reserve", _reserve),
        Step.create("approve", _approve_or_time_out),
        Step.create("ship", _ship),
        Step.create("notify", _reserve),
        name="orders",
    )
    for version, run_id in ((v1, "old"), (v2, "new")):
        with pytest.raises(WorkflowSuspended):
            await version.run(run_id, manager=_manager(memory, clock), stack_id=run_id)
    clock.advance(1_000)
    done = await Worker(_manager(memory, clock), [v1, v2]).run_once()
    assert done.timers_fired == 2 and not done.failures, done
    for run_id in ("old", "new"):
        stored = await _manager(memory, clock).load_checkpoint(run_id)
        assert stored is not None and stored.status == "completed", run_id


async def test_a_timer_the_worker_leaves_as_stored_is_no_work_done(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    v1 = flow(Step.create("approve", _approve_or_time_out), name="orders")
    v2 = flow(
        Step.create("approve", _approve_or_time_out), Step.create("x", _reserve), name="orders"
    )
    with pytest.raises(WorkflowSuspended):
        await v1.run({"order": 1}, manager=_manager(memory, clock), stack_id="r1")
    clock.advance(1_000)
    worker = Worker(_manager(memory, clock), [v2])  # v1's run, no migration
    done = await worker.run_once()
    assert (done.timers_fired, done.runs_recovered, done.busy) == (0, 0, False), done
    assert len(done.failures) == 1 and "WorkflowVersionMismatchError" in done.failures[0]
    stored = await _manager(memory, clock).load_checkpoint("r1")
    assert stored is not None and stored.status == "waiting"  # left as stored


async def test_a_step_whose_wait_key_changed_says_so(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    async def old_key(order: Any) -> Any:
        return await wait_for_event(f"approve:{order}")

    async def new_key(order: Any) -> Any:
        return await wait_for_event(f"approval/{order}")

    v1 = flow(Step.create("approve", old_key), name="orders")
    v2 = flow(Step.create("approve", new_key), name="orders")
    assert v1.version == v2.version  # the step names did not change
    with pytest.raises(WorkflowSuspended):
        await v1.run(1, manager=_manager(memory, clock), stack_id="r1")
    with pytest.raises(InvalidStateTransitionError, match="now waits for another key"):
        await v2.deliver("approve:1", "ada", manager=_manager(memory, clock))


async def test_a_run_cancelled_while_first_stored_leaves_no_live_stack() -> None:
    """``asyncio.wait_for`` around ``flow.run`` times out while its first checkpoint
    waits for the database (another session holds the checkpoints table; the workflow
    lock, another table, was taken): the manager keeps no live stack of the run, so the
    retry in the same process starts it."""
    import psycopg
    from raw_storage import any_backend
    from sql_support import POSTGRES_URL

    async def one(x: Any) -> Any:
        return x + 1

    f = flow(Step.create("one", one), name="once")
    async with any_backend("postgres") as backend:
        raw: Any = backend.raw_adapter
        manager = StorageManager(backend)
        await manager.load_checkpoint("warm-up")  # the schema is there
        table = f'"{raw.schema}".{raw.table_prefix}checkpoints'
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as other:
            await other.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(f.run(1, manager=manager, stack_id="r1"), 0.5)
            assert manager.stacks == {}
            await other.rollback()
        assert await f.run(1, manager=manager, stack_id="r1") == 2
        assert manager.stacks == {}


async def test_a_cached_step_without_a_key_shares_one_entry(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    """docs/workflows.md: without ``key=`` a cached step's key is its name alone — one
    entry for every input, run and flow with a step of that name (in one namespace)."""
    calls: list[Any] = []

    async def fetch(order: Any) -> str:
        calls.append(order)
        return f"mail to customer of order {order}"

    orders = flow(Step.create("fetch", fetch).cache(ttl_ms=60_000), name="orders")
    billing = flow(Step.create("fetch", fetch).cache(ttl_ms=60_000), name="billing")
    first = await orders.run(1, manager=_manager(memory, clock), stack_id="o1")
    assert await orders.run(2, manager=_manager(memory, clock), stack_id="o2") == first
    assert await billing.run(3, manager=_manager(memory, clock), stack_id="b3") == first
    assert calls == [1]
    # Another namespace has its own entry.
    other = await orders.run(4, manager=_manager(memory, clock), stack_id="o4", namespace="t")
    assert other == "mail to customer of order 4" and calls == [1, 4]


async def test_a_run_cancelled_while_it_runs_says_so(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    """``cancel_workflow`` from elsewhere while a step runs: the step's checkpoint is
    refused, and the run says it was cancelled — not "reconcile and retry"."""
    started = asyncio.Event()
    proceed = asyncio.Event()

    async def slow(x: Any) -> Any:
        started.set()
        await proceed.wait()
        return x

    f = flow(Step.create("slow", slow), Step.create("next", _reserve), name="slow")
    running = asyncio.create_task(f.run(1, manager=_manager(memory, clock), stack_id="r1"))
    await started.wait()
    await memory.adapter.cancel_workflow("r1")
    proceed.set()
    with pytest.raises(InvalidStateTransitionError, match="was cancelled while it ran"):
        await running
    with pytest.raises(InvalidStateTransitionError, match="already ended cancelled"):
        await f.run(1, manager=_manager(memory, clock), stack_id="r1")


async def test_a_flow_without_a_name_is_migrated_like_a_named_one(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    """A flow made without ``name=`` is named after its steps, so renaming a step names
    the new version otherwise: its migration from the old version says the old runs are
    its own, and they continue (another flow's run, with no migration, stays refused)."""
    v1 = flow(Step.create("reserve", _reserve), Step.create("approve", _approve))
    v2 = flow(Step.create("reserve", _reserve), Step.create("approval", _approve))
    assert v1.name != v2.name
    with pytest.raises(WorkflowSuspended):
        await v1.run(1, manager=_manager(memory, clock), stack_id="r1")
    with pytest.raises(InvalidArgumentError, match="with_migration"):
        await v2.deliver("approve:1", "ada", manager=_manager(memory, clock))
    migrated = v2.with_migration(v1.version, _renamed)
    assert await migrated.deliver("approve:1", "ada", manager=_manager(memory, clock)) == {
        "order": 1,
        "approver": "ada",
    }
