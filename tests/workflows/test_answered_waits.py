"""A wait answered once stays answered (two black-box auditors' findings).

A delivery claims a wait, the run goes on with the event (its checkpoint stores it), and
the delivering process stops before it completes the wait (here: cancelled in the next
step, as a process ends). When the claim's lease lapses, the wait is claimable again:

- a worker firing its timer (past the deadline) resumes the run with the event it
  already has — not marked ``timedOut``, the wait ``delivered``, not ``timed out``;
- a second delivery (a retried webhook, another payload) resumes the run with the
  first event, puts that payload back in the wait record, and raises
  ``WaitRecordClaimError``: its own event was not used.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from background import background_settled
from raw_storage import KINDS, any_backend

import siglo
from siglo import Step, StorageManager, flow, wait_for_event
from siglo.workflow import Worker
from siglo.workflow.outcomes import EVENT, TIMED_OUT, wait_outcome

LEASE_MS = 300
STOP = {"now": False}


async def _waiter(_: Any) -> Any:
    try:
        return {"event": await wait_for_event("hook:answered", timeout_ms=DEADLINE["ms"])}
    except siglo.WaitTimeoutError:
        return {"event": None}


async def _after(value: Any) -> Any:
    if STOP["now"]:
        STOP["now"] = False
        raise asyncio.CancelledError  # the delivering process ends here
    return value


DEADLINE = {"ms": 200}


ANSWERED = flow(Step.create("waiter", _waiter), Step.create("after", _after), name="answered")


async def _delivered_then_stopped(manager: StorageManager, stack_id: str) -> None:
    with pytest.raises(siglo.WorkflowSuspended):
        await ANSWERED.run(None, manager=manager, stack_id=stack_id)
    STOP["now"] = True
    with pytest.raises(asyncio.CancelledError):
        await ANSWERED.deliver("hook:answered", {"v": 1}, manager=manager)
    await asyncio.sleep(LEASE_MS / 1000 + 0.2)  # the claim lapses (and the deadline passes)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_timer_fired_after_the_run_used_its_event_does_not_time_it_out(
    kind: str,
) -> None:
    DEADLINE["ms"] = 200
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _delivered_then_stopped(manager, "answered-timer")
        result = await ANSWERED.fire_timeout("hook:answered", manager=manager)
        assert result == {"event": {"v": 1}}
        stored = await backend.adapter.get_checkpoint("answered-timer")
        assert stored is not None and stored.status == "completed"
        assert stored.contexts["waiter"][EVENT] == {"v": 1}
        assert TIMED_OUT not in stored.contexts["waiter"]
        record = await backend.adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "completed"
        assert wait_outcome(record, stored, manager.clock.now_ms()) == "delivered"
        assert record.event_payload == {"v": 1}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_second_delivery_after_the_run_used_the_first_is_refused(kind: str) -> None:
    DEADLINE["ms"] = 600_000
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _delivered_then_stopped(manager, "answered-again")
        with pytest.raises(siglo.WaitRecordClaimError, match="this event was not used"):
            await ANSWERED.deliver("hook:answered", {"v": 2}, manager=manager)
        stored = await backend.adapter.get_checkpoint("answered-again")
        assert stored is not None and stored.status == "completed"
        assert stored.contexts["waiter"][EVENT] == {"v": 1}
        assert stored.contexts["after"]["output"] == {"event": {"v": 1}}
        record = await backend.adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "completed"
        assert record.event_payload == {"v": 1}
        # And now it is told it was delivered, as any later duplicate.
        with pytest.raises(siglo.WaitRecordClaimError, match="already delivered"):
            await ANSWERED.deliver("hook:answered", {"v": 3}, manager=manager)


async def test_a_lapsed_claim_past_its_deadline_is_refused_for_the_deadline() -> None:
    """The refusal says what refuses the claim now — the deadline, with allow_expired=True
    — not that another delivery holds a claim that lapsed (an auditor's finding)."""
    DEADLINE["ms"] = 200
    async with siglo.connect("memory://", claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        with pytest.raises(siglo.WorkflowSuspended):
            await ANSWERED.run(None, manager=manager, stack_id="lapsed")
        claimed = await backend.adapter.claim_wait_record("hook:answered", "gone")
        assert claimed is not None
        await asyncio.sleep(LEASE_MS / 1000 + 0.2)
        with pytest.raises(siglo.WaitRecordClaimError) as refused:
            await ANSWERED.deliver("hook:answered", {"v": 1}, manager=manager)
        message = str(refused.value)
        assert "claim lapsed" in message and "allow_expired=True" in message, message
        assert "holds its claim" not in message


@pytest.mark.parametrize("kind", KINDS)
async def test_a_late_delivery_after_the_run_timed_out_is_refused(kind: str) -> None:
    """The timer fired and the run went on without the event, then its worker stopped
    before completing the wait: a late delivery (``allow_expired``) after the lease is
    refused, the run keeps its timeout, and the record no payload."""
    DEADLINE["ms"] = 200
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        with pytest.raises(siglo.WorkflowSuspended):
            await ANSWERED.run(None, manager=manager, stack_id="answered-late")
        await asyncio.sleep(0.3)
        STOP["now"] = True
        with pytest.raises(asyncio.CancelledError):
            await ANSWERED.fire_timeout("hook:answered", manager=manager)
        await asyncio.sleep(LEASE_MS / 1000 + 0.2)
        with pytest.raises(siglo.WaitRecordClaimError, match="received its timeout"):
            await ANSWERED.deliver(
                "hook:answered", {"v": "late"}, manager=manager, allow_expired=True
            )
        stored = await backend.adapter.get_checkpoint("answered-late")
        assert stored is not None and stored.status == "completed"
        assert stored.contexts["waiter"][TIMED_OUT] is True
        assert EVENT not in stored.contexts["waiter"]
        record = await backend.adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "completed"
        assert record.event_payload is None
        assert wait_outcome(record, stored, manager.clock.now_ms()) == "timed out"


async def test_a_worker_counts_the_answered_run_it_resumes_as_recovered() -> None:
    """The worker's pass says what it did: the run of a due wait that already held its
    event was recovered, not a timer fired (an auditor read "fired 1 timer(s),
    recovered 0 run(s)" for it)."""
    DEADLINE["ms"] = 200
    async with siglo.connect("memory://", claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _delivered_then_stopped(manager, "answered-worker")
        done = await Worker(manager, [ANSWERED]).run_once()
        assert (done.timers_fired, done.runs_recovered) == (0, 1), done
        stored = await backend.adapter.get_checkpoint("answered-worker")
        assert stored is not None and stored.status == "completed"
        assert TIMED_OUT not in stored.contexts["waiter"]


async def _first(_: Any) -> Any:
    return await wait_for_event("hook:first", timeout_ms=DEADLINE["ms"])


async def _second(first: Any) -> Any:
    return {"first": first, "second": await wait_for_event("hook:second")}


TWO_WAITS = flow(Step.create("first", _first), Step.create("second", _second), name="two-waits")


@pytest.mark.parametrize("by", ["delivery", "timer"])
@pytest.mark.parametrize("kind", KINDS)
async def test_an_answered_wait_the_run_went_past_is_completed_when_claimed_again(
    kind: str, by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivering process stops after the run's checkpoint — the run went on and now
    waits for its next event — and before it completed the first wait. A retried
    delivery was refused with InvalidStateTransitionError ("no step waits … the event
    stays deliverable"), the wait put back, and the worker's timer failed on it at every
    pass, for as long as the run waited (a black-box auditor): a claim of it now
    completes it as answered, the run left as it is, waiting for the next event."""
    DEADLINE["ms"] = 1500
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        with pytest.raises(siglo.WorkflowSuspended):
            await TWO_WAITS.run(None, manager=manager, stack_id="went-on")

        async def stopped(*_: Any, **__: Any) -> None:
            raise asyncio.CancelledError  # the delivering process ends here

        with monkeypatch.context() as patched:
            patched.setattr(adapter, "complete_wait_record", stopped)
            with pytest.raises(asyncio.CancelledError):
                await TWO_WAITS.deliver("hook:first", {"v": 1}, manager=manager)
            # A process that lives on completes the wait in the background: this one
            # ended, and its background completion with it.
            await background_settled()
        went_on = await adapter.get_checkpoint("went-on")
        assert went_on is not None and went_on.status == "waiting"
        await asyncio.sleep(LEASE_MS / 1000 + 0.2)  # the claim lapses

        if by == "delivery":
            with pytest.raises(siglo.WaitRecordClaimError, match="this event was not used"):
                await TWO_WAITS.deliver("hook:first", {"v": 2}, manager=manager)
        else:  # the worker's pass past the first wait's deadline
            waiting = await adapter.get_wait_record("hook:first")
            assert waiting is not None and waiting.expires_at is not None
            await asyncio.sleep((waiting.expires_at - manager.clock.now_ms()) / 1000 + 0.1)
            report = await Worker(manager, [TWO_WAITS]).run_once()
            assert report.failures == [] and report.runs_recovered == 1, report
        record = await adapter.get_wait_record("hook:first")
        assert record is not None and record.status == "completed"
        assert record.event_payload == {"v": 1}
        stored = await adapter.get_checkpoint("went-on")
        assert stored is not None and stored.revision == went_on.revision  # left as it is
        assert stored.contexts["first"][EVENT] == {"v": 1}
        assert TIMED_OUT not in stored.contexts["first"]
        with pytest.raises(siglo.WaitRecordClaimError, match="already delivered"):
            await TWO_WAITS.deliver("hook:first", {"v": 3}, manager=manager)
        assert await TWO_WAITS.deliver("hook:second", "done", manager=manager) == {
            "first": {"v": 1},
            "second": "done",
        }


async def _charge(order: Any) -> Any:
    return {"charged": order, "confirmed": await wait_for_event("hook:confirm")}


CONFIRMED = flow(Step.create("charge", _charge), name="confirmed")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_recovery_rerunning_the_step_keeps_the_claim_of_a_delivery_in_flight(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run dies after placing its wait and before its waiting checkpoint; a delivery
    claims the wait and waits for the run's lock; a worker recovers the run first, and
    its rerun step reached the wait: the wait was placed again over the claim, and the
    delivery — which then resumed the run with its event — could not complete it: the
    wait stayed open after its event was used (a black-box auditor). The claim is kept:
    the delivery completes the wait, and the run completes with its event."""
    async with any_backend(kind, claim_lease_ms=30_000) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        real_save = adapter.save_checkpoint

        async def dies_at_the_waiting_save(checkpoint: Any, **kwargs: Any) -> Any:
            if checkpoint.status == "waiting":
                raise asyncio.CancelledError  # the process ends here
            return await real_save(checkpoint, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(adapter, "save_checkpoint", dies_at_the_waiting_save)
            with pytest.raises(asyncio.CancelledError):
                await CONFIRMED.run(7, manager=manager, stack_id="in-flight")
        crashed = await adapter.get_checkpoint("in-flight")
        assert crashed is not None and crashed.status == "running"

        # The delivery claims the wait, then finds the run's lock taken by the worker.
        recovered = asyncio.Event()
        real_lock = adapter.with_workflow_lock

        async def after_the_recovery(stack_id: str, action: Any, **kwargs: Any) -> Any:
            if asyncio.current_task() is delivery and stack_id == "in-flight":
                await recovered.wait()
            return await real_lock(stack_id, action, **kwargs)

        monkeypatch.setattr(adapter, "with_workflow_lock", after_the_recovery)
        delivery = asyncio.create_task(CONFIRMED.deliver("hook:confirm", "yes", manager=manager))
        for _ in range(200):
            record = await adapter.get_wait_record("hook:confirm")
            if record is not None and record.status == "claimed":
                break
            await asyncio.sleep(0.01)
        report = await Worker(manager, [CONFIRMED]).run_once()
        assert report.runs_recovered == 1 and report.failures == [], report
        record = await adapter.get_wait_record("hook:confirm")
        assert record is not None and record.status == "claimed"  # not placed again
        recovered.set()

        assert await delivery == {"charged": 7, "confirmed": "yes"}
        record = await adapter.get_wait_record("hook:confirm")
        assert record is not None and record.status == "completed"
        assert record.event_payload == "yes"
        with pytest.raises(siglo.WaitRecordClaimError, match="already delivered"):
            await CONFIRMED.deliver("hook:confirm", "again", manager=manager)


async def _slow(value: Any) -> Any:
    await asyncio.sleep(LEASE_MS * 4 / 1000)  # longer than the claim's lease
    return value


SLOW_AFTER = flow(
    Step.create("approve", lambda _: wait_for_event("hook:slow")),
    Step.create("slow", _slow),
    name="slow-after",
)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delivery_keeps_its_claim_while_the_run_outlasts_the_lease(kind: str) -> None:
    """A delivery whose run goes on longer than the claim's lease lost the claim to a
    retried webhook: the run completed with the first event, yet the first delivery was
    told its claim was taken and the retry that its claimant had stopped — neither
    caller learnt the event was accepted (a black-box auditor). The claimant renews its
    claim while it resumes the run: the first delivery returns the run's output, the
    retry is refused as a duplicate, and the wait completes with the first payload."""
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        with pytest.raises(siglo.WorkflowSuspended):
            await SLOW_AFTER.run(None, manager=manager, stack_id="slow-1")
        first = asyncio.create_task(SLOW_AFTER.deliver("hook:slow", {"n": 1}, manager=manager))
        await asyncio.sleep(LEASE_MS * 2 / 1000)  # past the first claim's lease
        with pytest.raises(siglo.WaitRecordClaimError) as retried:
            await SLOW_AFTER.deliver("hook:slow", {"n": 2}, manager=manager)
        assert "stopped before completing" not in str(retried.value), retried.value
        assert await first == {"n": 1}
        record = await backend.adapter.get_wait_record("hook:slow")
        assert record is not None and record.status == "completed"
        assert record.event_payload == {"n": 1}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancel_between_the_runs_checkpoint_and_the_completion_is_said_as_such(
    kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancel (``cancel_workflow``, ``siglo cancel``) lands after the run's checkpoint
    took the event and before the delivery completes the wait: the run keeps the event
    (completed), the cancel ended the wait, and the delivery returns the run's output,
    logging that the wait was cancelled — it blamed another claimant that does not exist
    (a black-box auditor)."""
    DEADLINE["ms"] = 600_000
    async with any_backend(kind) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        with pytest.raises(siglo.WorkflowSuspended):
            await ANSWERED.run(None, manager=manager, stack_id="cancelled-late")
        complete = adapter.complete_wait_record

        async def after_a_cancel(*args: Any, **kwargs: Any) -> None:
            await adapter.cancel_workflow("cancelled-late")
            await complete(*args, **kwargs)

        monkeypatch.setattr(adapter, "complete_wait_record", after_a_cancel)
        result = await ANSWERED.deliver("hook:answered", {"v": 1}, manager=manager)
        assert result == {"event": {"v": 1}}
        stored = await adapter.get_checkpoint("cancelled-late")
        assert stored is not None and stored.status == "completed"
        assert stored.contexts["waiter"][EVENT] == {"v": 1}
        record = await adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "cancelled"
        assert "was cancelled (cancel_workflow) before the delivery completed it" in caplog.text
        assert "another claimant" not in caplog.text


@pytest.mark.parametrize("kind", KINDS)
async def test_a_worker_recovering_a_run_completes_its_answered_wait_without_a_deadline(
    kind: str,
) -> None:
    """A delivery claimed a wait with no deadline, the run took the event, and the
    delivering process died in a later step; a worker recovered the run and finished it.
    The wait stayed ``claimed`` (its lease lapsed) for as long as the store kept it: no
    timer ever fires a wait without a deadline, so nothing completed it, and its key
    refused every other run's wait. The recovery completes it, as delivered, with the
    event the run used."""
    DEADLINE["ms"] = None
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _delivered_then_stopped(manager, "answered-recovered")
        before = await backend.adapter.get_wait_record("hook:answered")
        assert before is not None and before.status == "claimed"
        done = await Worker(manager, [ANSWERED]).run_once()
        assert done.runs_recovered == 1, done
        stored = await backend.adapter.get_checkpoint("answered-recovered")
        assert stored is not None and stored.status == "completed"
        assert stored.contexts["after"]["output"] == {"event": {"v": 1}}
        record = await backend.adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "completed", record
        assert wait_outcome(record, stored, manager.clock.now_ms()) == "delivered"
        assert record.event_payload == {"v": 1}
        # The key is free again: another run waits on it, and is delivered to.
        with pytest.raises(siglo.WorkflowSuspended):
            await ANSWERED.run(None, manager=manager, stack_id="answered-next")
        assert await ANSWERED.deliver("hook:answered", {"v": 2}, manager=manager) == {
            "event": {"v": 2}
        }


async def test_a_resume_of_the_run_completes_its_answered_wait_too() -> None:
    """``resume`` (continuing a crashed run by hand) completes it as the worker does."""
    DEADLINE["ms"] = None
    async with siglo.connect("memory://", claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _delivered_then_stopped(manager, "answered-resumed")
        assert await ANSWERED.resume("answered-resumed", manager=manager) == {"event": {"v": 1}}
        record = await backend.adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "completed", record
        assert record.event_payload == {"v": 1}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_recovery_puts_back_the_event_the_run_used_not_a_lapsed_later_claims(
    kind: str,
) -> None:
    """The run used {"v": 1}; a retried delivery claimed the wait with {"v": 2}, writing
    it into the record, and died before resuming the run. The recovery completed the
    wait with {"v": 2}, an event the run never used (a black-box auditor)."""
    DEADLINE["ms"] = None
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _delivered_then_stopped(manager, "answered-twice")
        retried = await backend.adapter.claim_wait_record(
            "hook:answered", "retry-that-died", event_payload={"v": 2}
        )
        assert retried is not None and retried.event_payload == {"v": 2}
        await asyncio.sleep(LEASE_MS / 1000 + 0.2)
        assert await ANSWERED.recover("answered-twice", manager=manager)
        record = await backend.adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "completed"
        assert record.event_payload == {"v": 1}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_timer_leaves_no_payload_of_a_delivery_the_run_never_used(kind: str) -> None:
    """A delivery claimed the wait with its event and died before the run took it; the
    deadline passed and the worker's timer timed the run out. The wait was completed with
    the dead delivery's payload, an event the run never used."""
    DEADLINE["ms"] = 200
    async with any_backend(kind, claim_lease_ms=LEASE_MS) as backend:
        manager = StorageManager(backend, error_mode="strict")
        with pytest.raises(siglo.WorkflowSuspended):
            await ANSWERED.run(None, manager=manager, stack_id="never-used")
        died = await backend.adapter.claim_wait_record(
            "hook:answered", "delivery-that-died", event_payload={"v": 9}
        )
        assert died is not None
        await asyncio.sleep(LEASE_MS / 1000 + 0.2)  # the claim lapses, the deadline passes
        done = await Worker(manager, [ANSWERED]).run_once()
        assert done.timers_fired == 1, done
        stored = await backend.adapter.get_checkpoint("never-used")
        assert stored is not None and stored.contexts["waiter"][TIMED_OUT] is True
        record = await backend.adapter.get_wait_record("hook:answered")
        assert record is not None and record.status == "completed"
        assert record.event_payload is None
        assert wait_outcome(record, stored, manager.clock.now_ms()) == "timed out"
