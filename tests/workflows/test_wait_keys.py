"""A correlation key names one waiting run of a namespace (docs/workflows.md): a second
run that waits on the key while the first's wait is pending fails, naming the first,
instead of taking its wait — which left the first waiting forever, its timer never
fired. A key whose wait ended may be waited on again, and the same key in another
namespace is another wait. On SQLite, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Step, WorkflowSuspended, flow, wait_for_event
from siglo.errors import InvalidArgumentError, InvalidStateTransitionError


async def approve(value: Any) -> Any:
    return await wait_for_event("approval:batch-7", timeout_ms=60_000)


batch = flow(Step.create("approve", approve), name="same-key")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_second_run_cannot_take_a_pending_wait(kind: str) -> None:
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await batch.run(None, manager=manager, stack_id="order-A")
        with pytest.raises(InvalidArgumentError, match="run 'order-A' of no namespace waits"):
            await batch.run(None, manager=manager, stack_id="order-B")
        second = await backend.adapter.get_checkpoint("order-B")
        assert second is not None and second.status == "failed"
        record = await backend.adapter.get_wait_record("approval:batch-7")
        assert record is not None and record.stack_id == "order-A"
        # Another tenant's run waits on the same key: another wait.
        with pytest.raises(WorkflowSuspended):
            await batch.run(None, manager=manager, stack_id="order-C", namespace="t2")
        assert await batch.deliver("approval:batch-7", {"ok": 1}, manager=manager) == {"ok": 1}
        first = await backend.adapter.get_checkpoint("order-A")
        assert first is not None and first.status == "completed"
        # The first wait ended: the key may be waited on again.
        with pytest.raises(WorkflowSuspended):
            await batch.run(None, manager=manager, stack_id="order-D")
        record = await backend.adapter.get_wait_record("approval:batch-7")
        assert record is not None and record.stack_id == "order-D"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_run_deleted_before_it_waits_leaves_no_pending_wait(kind: str) -> None:
    """An operator deletes a run (``siglo rm``) while its step runs, before the step waits:
    the run's waiting checkpoint is refused (nothing to compare with), and the wait record
    it had just written is cancelled — not left pending with no run, where it held its
    key against every other run and never fired."""
    from siglo.errors import CheckpointConflictError

    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:

        async def deleted_then_waits(value: Any) -> Any:
            assert await backend.adapter.delete_checkpoint("order-X")  # the operator
            return await wait_for_event("approval:order-X", timeout_ms=60_000)

        doomed = flow(Step.create("approve", deleted_then_waits), name="doomed")
        manager = siglo.StorageManager(backend)
        with pytest.raises(CheckpointConflictError):
            await doomed.run(None, manager=manager, stack_id="order-X")
        assert await backend.adapter.get_checkpoint("order-X") is None
        record = await backend.adapter.get_wait_record("approval:order-X")
        assert record is None or record.status == "cancelled"

        async def waits(value: Any) -> Any:
            return await wait_for_event("approval:order-X", timeout_ms=60_000)

        other = flow(Step.create("approve", waits), name="other")
        with pytest.raises(WorkflowSuspended):  # the key is free
            await other.run(None, manager=manager, stack_id="order-Y")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_run_that_waits_again_on_its_key_is_suspended_not_refused(kind: str) -> None:
    """Two steps wait on one key: the first delivery resumes the run, which waits again
    on the key (its new wait replaces the claimed one), so the delivery says the run is
    suspended — not that the wait was not claimed — and the second delivery finishes it."""

    async def ping(value: Any) -> Any:
        return await wait_for_event("ping:rw", timeout_ms=60_000)

    twice = flow(Step.create("one", ping), Step.create("two", ping), name="twice")
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await twice.run(None, manager=manager, stack_id="rw-1")
        with pytest.raises(WorkflowSuspended):
            await twice.deliver("ping:rw", {"n": 1}, manager=manager)
        record = await backend.adapter.get_wait_record("ping:rw")
        assert record is not None and record.status == "waiting" and record.step_id == "two"
        assert await twice.deliver("ping:rw", {"n": 2}, manager=manager) == {"n": 2}
        done = await backend.adapter.get_checkpoint("rw-1")
        assert done is not None and done.status == "completed"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_two_runs_taking_an_ended_key_at_once_get_one_wait(kind: str) -> None:
    """A key whose wait ended may be waited on again; two runs doing it at the same
    moment each find the ended record — its replacement happens under a lock of the key,
    so one waits and the other fails, never both waiting with one record."""

    async def w(value: Any) -> Any:
        return await wait_for_event("approval:shared", timeout_ms=60_000)

    racer = flow(Step.create("w", w), name="racer")
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await racer.run(None, manager=manager, stack_id="old")
        assert await racer.deliver("approval:shared", {"ok": 0}, manager=manager) == {"ok": 0}

        async def start(stack_id: str) -> str:
            try:
                await racer.run(None, manager=manager, stack_id=stack_id)
            except WorkflowSuspended:
                return "waiting"
            except InvalidArgumentError:
                return "refused"
            return "completed"

        outcomes = await asyncio.gather(start("A"), start("B"))
        assert sorted(outcomes) == ["refused", "waiting"], outcomes
        record = await backend.adapter.get_wait_record("approval:shared")
        winner = "AB"[outcomes.index("waiting")]
        assert record is not None and record.stack_id == winner and record.status == "waiting"


async def _twice(order: Any) -> Any:
    manager_ok = await wait_for_event(f"manager-approval:{order}")
    finance_ok = await wait_for_event(f"finance-approval:{order}")
    return {"manager": manager_ok, "finance": finance_ok}


async def _wait_then_sleep(order: Any) -> Any:
    approved = await wait_for_event(f"approval:{order}")
    await siglo.workflow.sleep(10)
    return approved


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_second_wait_in_one_step_is_refused(kind: str) -> None:
    """A step waits at most once (docs/workflows.md): a second ``wait_for_event`` (or a
    ``sleep`` after a wait) in the step that was resumed with its first key's event is an
    ``InvalidStateTransitionError`` naming the step, never the first event handed to the
    second wait. The run fails; the first delivery is consumed."""
    from siglo.errors import InvalidStateTransitionError

    two_waits = flow(Step.create("approve", _twice), name="twice")
    wait_sleep = flow(Step.create("approve", _wait_then_sleep), name="wait-sleep")
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        manager = siglo.StorageManager(backend)
        for run, first in ((two_waits, "manager-approval:7"), (wait_sleep, "approval:7")):
            stack_id = f"po-7-{run.name}"
            with pytest.raises(WorkflowSuspended) as suspended:
                await run.run("7", manager=manager, stack_id=stack_id)
            assert suspended.value.correlation_key == first
            with pytest.raises(InvalidStateTransitionError, match="a step waits at most once"):
                await run.deliver(first, {"by": "bob"}, manager=manager)
            stored = await backend.adapter.get_checkpoint(stack_id)
            assert stored is not None and stored.status == "failed"
            record = await backend.adapter.get_wait_record(first)
            assert record is not None and record.status == "completed"


async def _waits_forever(order: Any) -> Any:
    return await wait_for_event(f"approval:forever:{order}", timeout_ms=10**20)


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_timeout_past_any_stored_time_means_never(kind: str) -> None:
    """A wait's timeout (or a save's ttl_ms) so long that now plus it passes what any
    time can hold means "never": the deadline is the largest stored time, the run
    waits, and an event still delivers. Before, the wait record could not be encoded,
    the run stayed `running`, and a worker re-ran its step at every pass."""
    from siglo.wire import INT64_MAX

    forever = flow(Step.create("approve", _waits_forever), name="forever")
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await forever.run("1", manager=manager, stack_id="po-forever")
        record = await backend.adapter.get_wait_record("approval:forever:1")
        assert record is not None and record.expires_at == INT64_MAX
        assert await backend.adapter.list_due_waits(limit=10) == []
        assert await forever.deliver("approval:forever:1", {"ok": 1}, manager=manager) == {"ok": 1}
        stack = manager.create_stack("kept-forever")
        saved = await manager.save(stack, ttl_ms=10**20)
        assert saved.expires_at == INT64_MAX


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_refused_waiting_checkpoint_never_cancels_another_runs_wait(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A placed its wait on a key; before A's waiting checkpoint, A was cancelled
    (its wait ended) and run B waited on the freed key; A's checkpoint was refused, and
    its clean-up cancelled the key's wait — B's — by key alone: B waited for ever (a
    black-box auditor, the interleaving forced here as there; in life two processes and
    an operator's cancel). The clean-up cancels only A's own record."""
    import importlib

    from ops_support import shared_store

    flow_module = importlib.import_module("siglo.workflow.flow")

    async def first(value: Any) -> Any:
        return value

    async def waits(value: Any) -> Any:
        return {"x": value, "event": await wait_for_event("shared-key")}

    race = flow(Step.create("first", first), Step.create("waits", waits), name="key-race")
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url) as backend,
    ):
        manager = siglo.StorageManager(backend)
        placing = flow_module.place_wait

        async def then_a_cancelled_and_b_waiting(adapter: Any, record: Any, **kw: Any) -> Any:
            placed = await placing(adapter, record, **kw)
            if record.stack_id == "A":
                await backend.adapter.cancel_workflow("A")
                with pytest.raises(WorkflowSuspended):
                    await race.run("B", manager=manager, stack_id="B")
            return placed

        monkeypatch.setattr(flow_module, "place_wait", then_a_cancelled_and_b_waiting)
        with pytest.raises(InvalidStateTransitionError):
            await race.run("A", manager=manager, stack_id="A")
        monkeypatch.setattr(flow_module, "place_wait", placing)
        record = await backend.adapter.get_wait_record("shared-key")
        assert record is not None and (record.stack_id, record.status) == ("B", "waiting")
        assert await race.deliver("shared-key", "ev", manager=manager) == {
            "x": "B",
            "event": "ev",
        }


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_key_freed_by_a_removal_during_a_replacement_is_never_doubly_held(
    kind: str,
) -> None:
    """Run B replaced run A's ended wait under the key's lock; between B's look and B's
    save, `siglo rm A` removed A's record and run C created the key's record without the
    lock: B's save overwrote C's fresh wait, and C waited for ever (a black-box auditor,
    three processes). The create goes under the lock too: C finds B's wait and fails."""
    from ops_support import shared_store

    async def waits(value: Any) -> Any:
        return {"x": value, "event": await wait_for_event("reused-key")}

    race = flow(Step.create("waits", waits), name="key-reuse-race")
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url) as for_a,
        siglo.connect(store.url) as for_b,
        siglo.connect(store.url) as for_c,
    ):
        with pytest.raises(WorkflowSuspended):
            await race.run("A", manager=siglo.StorageManager(for_a), stack_id="A")
        assert await race.deliver("reused-key", 1, manager=siglo.StorageManager(for_a)) == {
            "x": "A",
            "event": 1,
        }
        adapter: Any = for_b.adapter
        reading = adapter.get_wait_record
        c_run: list[asyncio.Task[Any]] = []

        async def then_a_removed_and_c_waiting(*args: Any, **kwargs: Any) -> Any:
            found = await reading(*args, **kwargs)
            if not c_run:  # B looked at A's ended record: A goes, C tries the key
                assert await for_a.adapter.delete_checkpoint("A") is True
                c_run.append(
                    asyncio.create_task(
                        race.run("C", manager=siglo.StorageManager(for_c), stack_id="C")
                    )
                )
                await asyncio.sleep(0.3)  # C's create, where it does not wait for the lock
            return found

        adapter.get_wait_record = then_a_removed_and_c_waiting
        try:
            with pytest.raises(WorkflowSuspended):
                await race.run("B", manager=siglo.StorageManager(for_b), stack_id="B")
        finally:
            adapter.get_wait_record = reading
        with pytest.raises(InvalidArgumentError, match="waits for it already"):
            await c_run[0]
        record = await for_a.adapter.get_wait_record("reused-key")
        assert record is not None and (record.stack_id, record.status) == ("B", "waiting")
        c = await for_a.adapter.get_checkpoint("C")
        assert c is not None and c.status == "failed"
