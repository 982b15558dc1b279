"""A delivery's claim while the run it resumes goes on (a black-box auditor's findings on
the claim's renewal and on claims kept through a worker's rerun).

- a renewal renews only the record it claimed: a run cancelled or removed meanwhile frees
  its key, and another run's wait placed on it is not taken;
- a rerun keeps a live claim only of its own step's wait: a later wait on the same key
  gets its own record, deadline included, and the claim of the earlier, answered wait
  is never used by it;
- the dashboard never writes an event into a step that ran;
- a delivery whose claim lapsed under a step that blocked the event loop says its event
  was used.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from _redis_helpers import BUSY_LUA, CancelWhenQueued
from background import background_settled
from raw_storage import KINDS, any_backend

import siglo
from siglo import Step, StorageManager, flow, wait_for_event
from siglo.ui.actions import ActionRefused, deliver_event
from siglo.workflow.outcomes import EVENT


async def _suspended(run: Any) -> None:
    with pytest.raises(siglo.WorkflowSuspended):
        await run


async def _waits(_: Any) -> Any:
    return await wait_for_event("k")


async def _slow(value: Any) -> Any:
    await asyncio.sleep(0.9)
    return value


@pytest.mark.parametrize("how", ["cancel", "rm"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_renewal_never_takes_the_wait_another_run_placed_on_the_key(
    kind: str, how: str
) -> None:
    """Run A's delivery renews its claim while A's slow step runs; A is cancelled (or
    removed), and run B waits on the freed key. The renewal claimed B's fresh wait, and
    A's delivery then completed it: B waited for ever, every event refused as "already
    delivered"."""
    a = flow(Step.create("w", _waits), Step.create("slow", _slow), name="renewed-a")
    b = flow(Step.create("w", _waits), name="renewed-b")
    async with any_backend(kind, claim_lease_ms=600) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(a.run(None, manager=manager, stack_id="A"))
        delivery = asyncio.create_task(a.deliver("k", "for-A", manager=manager))
        await asyncio.sleep(0.3)  # A's slow step runs; renewals every 0.2 s
        if how == "cancel":
            await adapter.cancel_workflow("A")
        else:
            await adapter.delete_checkpoint("A")
        await _suspended(b.run(None, manager=manager, stack_id="B"))
        await asyncio.sleep(0.45)  # renewals come and go
        record = await adapter.get_wait_record("k")
        assert record is not None and record.stack_id == "B" and record.status == "waiting"
        await asyncio.gather(delivery, return_exceptions=True)  # A's run refused
        record = await adapter.get_wait_record("k")
        assert record is not None and record.stack_id == "B" and record.status == "waiting"
        assert await b.deliver("k", "for-B", manager=manager) == "for-B"


async def _w1(_: Any) -> Any:
    return await wait_for_event("k", timeout_ms=DEADLINES["w1"])


async def _w3(value: Any) -> Any:
    try:
        return [value, await wait_for_event("k", timeout_ms=DEADLINES["w3"])]
    except siglo.WaitTimeoutError:
        return [value, "timed out"]


DEADLINES: dict[str, int | None] = {"w1": None, "w3": None}
THREE = flow(
    Step.create("w1", _w1), Step.create("slow", _slow), Step.create("w3", _w3), name="three"
)


async def _answered_then_stopped(manager: StorageManager, event: Any) -> None:
    """W1 answered with ``event``, the delivery stopped in the slow step (its claim left
    live): the run is ``running``, w1's checkpoint holding the event."""
    await _suspended(THREE.run(None, manager=manager, stack_id="R"))
    delivery = asyncio.create_task(THREE.deliver("k", event, manager=manager))
    await asyncio.sleep(0.4)
    delivery.cancel()  # the delivering process ends here
    await asyncio.gather(delivery, return_exceptions=True)
    stored = await manager.adapter.get_checkpoint("R")
    assert stored is not None and stored.status == "running"
    assert stored.contexts["w1"][EVENT] == event


@pytest.mark.parametrize("kind", KINDS)
async def test_a_rerun_reaching_a_later_wait_on_the_key_gets_a_record_of_its_own(
    kind: str,
) -> None:
    """The worker recovers the run while the stopped delivery's claim of w1's wait is
    live, and the rerun reaches w3, which waits on the same key with a deadline of its
    own: the claimed record was kept for it, with w1's step and no deadline, and w3's
    timer never fired."""
    DEADLINES.update(w1=None, w3=600)
    async with any_backend(kind, claim_lease_ms=5_000) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _answered_then_stopped(manager, "E1")
        assert await THREE.recover("R", manager=manager)  # the worker's rerun: w3 waits
        record = await manager.adapter.get_wait_record("k")
        assert record is not None and record.status == "waiting" and record.step_id == "w3"
        assert record.expires_at is not None and record.created_at is not None
        assert record.expires_at - record.created_at == 600
        await asyncio.sleep(0.7)
        assert await THREE.fire_timeout("k", manager=manager) == ["E1", "timed out"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retry_claiming_an_answered_wait_is_not_used_by_a_later_wait(kind: str) -> None:
    """A retried webhook claims w1's answered wait (the first delivery stopped after w1's
    checkpoint) and waits for the run's lock, which a worker recovering the run holds;
    the rerun reaches w3 on the same key. The retry's event was handed to w3 — one event
    used by two waits. It is told its event was not used, and w3 still waits."""
    DEADLINES.update(w1=None, w3=None)
    async with any_backend(kind, claim_lease_ms=500) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _answered_then_stopped(manager, "E0")
        await asyncio.sleep(0.6)  # the stopped delivery's claim lapses
        worker = asyncio.create_task(THREE.recover("R", manager=manager))
        await asyncio.sleep(0.15)  # the worker holds the run's lock, in the slow step
        with pytest.raises(siglo.WaitRecordClaimError, match="not used"):
            await THREE.deliver("k", "E0", manager=manager)  # the webhook's retry
        assert await worker
        stored = await manager.adapter.get_checkpoint("R")
        assert stored is not None and stored.status == "waiting"
        assert EVENT not in stored.contexts["w3"]
        record = await manager.adapter.get_wait_record("k")
        assert record is not None and record.step_id == "w3" and record.status == "waiting"
        assert await THREE.deliver("k", "E3", manager=manager) == ["E0", "E3"]


async def _delivered_then_stopped(
    run: Any, manager: StorageManager, event: Any, *, key: str = "k"
) -> None:
    """``event`` delivered, and the delivering process ended before it completed the
    wait: the run went on with the event, the wait stays claimed until its lease lapses."""
    adapter = manager.adapter

    async def stopped(*_: Any, **__: Any) -> None:
        raise asyncio.CancelledError  # the delivering process ends before completing

    real = adapter.complete_wait_record
    adapter.complete_wait_record = stopped  # type: ignore[method-assign]
    try:
        with pytest.raises(asyncio.CancelledError):
            await run.deliver(key, event, manager=manager)
        # A process that lives on completes the wait in the background: this one ended,
        # and its background completion with it.
        await background_settled()
    finally:
        adapter.complete_wait_record = real  # type: ignore[method-assign]


async def _w3_elsewhere(value: Any) -> Any:
    return [value, await wait_for_event("k-2")]


GONE_PAST = flow(
    Step.create("w1", _waits),
    Step.create("slow", _slow),
    Step.create("w3", _w3_elsewhere),
    name="gone-past",
)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_dashboard_never_delivers_into_a_step_that_ran(kind: str) -> None:
    """A wait answered and gone past (the run waits for another key now), its claim
    lapsed: the dashboard's deliver wrote the event over the one w1 used, marked the run
    running and said "delivered". It is refused, the run left as it is, and the wait
    completed as it was answered."""
    async with any_backend(kind, claim_lease_ms=400) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(GONE_PAST.run(None, manager=manager, stack_id="G"))
        await _delivered_then_stopped(GONE_PAST, manager, "E1")
        await asyncio.sleep(0.5)  # its claim lapses
        before = await adapter.get_checkpoint("G")
        assert before is not None and before.status == "waiting"
        with pytest.raises(ActionRefused, match="already received an event"):
            await deliver_event(manager, "k", None, "E2", run_id="G")
        after = await adapter.get_checkpoint("G")
        assert after is not None and after.revision == before.revision
        assert after.contexts["w1"][EVENT] == "E1"
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "completed"
        assert record.event_payload == "E1"


RETRIED: dict[str, Any] = {}


async def _blocking(value: Any) -> Any:
    time.sleep(0.8)  # noqa: ASYNC251 (a synchronous call: no renewal runs meanwhile)
    # A retried webhook in another process takes the lapsed claim meanwhile; here, as the
    # loop gets its first turn after the block (before a renewal can run).
    RETRIED["claim"] = await RETRIED["adapter"].claim_wait_record("k", "retry", allow_expired=True)
    return value


BLOCKING = flow(Step.create("w", _waits), Step.create("blocking", _blocking), name="blocking")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delivery_whose_claim_lapsed_under_a_blocking_step_returns_its_output(
    kind: str,
) -> None:
    """A later step blocks the event loop past the claim's lease, and a retry takes the
    lapsed claim: the first delivery's event was used, yet it raised WaitRecordClaimError.
    It returns the run's output; the retry is told its event was not used, and the wait
    ends completed with the first event."""
    # The lock's lease outlasts the blocking step, the claim's does not.
    options: dict[str, Any] = {"claim_lease_ms": 300}
    if kind != "memory":  # whose workflow lock has no lease to lapse
        options["workflow_lock_ttl_ms"] = 10_000
    async with any_backend(kind, **options) as backend:
        manager = StorageManager(backend, error_mode="strict")
        await _suspended(BLOCKING.run(None, manager=manager, stack_id="B"))
        adapter = manager.adapter
        RETRIED["adapter"] = adapter
        assert await BLOCKING.deliver("k", "E", manager=manager) == "E"
        assert RETRIED["claim"] is not None  # the claim had lapsed: the retry took it
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "claimed"
        assert record.claimant_id == "retry"
        # The retry stopped too; another one finds the run answered: not used, and the
        # wait ends completed with the first event.
        await asyncio.sleep(0.35)
        with pytest.raises(siglo.WaitRecordClaimError, match="not used"):
            await BLOCKING.deliver("k", "E2", manager=manager)
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "completed"
        assert record.event_payload == "E"
        stored = await adapter.get_checkpoint("B")
        assert stored is not None and stored.status == "completed"
        assert stored.contexts["w"][EVENT] == "E"


async def _used(value: Any) -> Any:
    return {"used": value}


DASHBOARD = flow(Step.create("w", _waits), Step.create("done", _used), name="dashboard")


@pytest.mark.parametrize("kind", KINDS)
async def test_the_dashboard_never_delivers_to_another_namespaces_run(kind: str) -> None:
    """Tenant t1's run and a run of no namespace of the same id wait on one key; t1's
    is removed while the dashboard's delivery to it waits for the run's lock. The
    delivery loaded the run through namespace_fallback — the other one — wrote t1's
    event into it and saved it under t1, bringing the removed run back with another
    tenant's data (a black-box auditor). It is refused, and nothing of it is stored."""
    async with any_backend(kind) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        for namespace in ("t1", None):
            await _suspended(
                DASHBOARD.run(
                    {"tenant": namespace}, manager=manager, stack_id="A", namespace=namespace
                )
            )

        async def removed_meanwhile() -> None:
            await asyncio.sleep(0.3)  # the delivery has claimed t1's wait and waits
            assert await adapter.delete_checkpoint("A", "t1")

        holder = asyncio.create_task(
            adapter.with_workflow_lock("A", removed_meanwhile, namespace="t1")
        )
        await asyncio.sleep(0.05)
        with pytest.raises(ActionRefused, match="nothing was delivered"):
            await deliver_event(manager, "k", "t1", "T1-EVENT", run_id="A")
        await holder
        assert await adapter.get_checkpoint("A", "t1", fallback=False) is None
        other = await adapter.get_checkpoint("A", None, fallback=False)
        assert other is not None and other.status == "waiting"
        assert EVENT not in other.contexts["w"]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_dashboards_claim_is_kept_while_it_waits_for_the_lock(kind: str) -> None:
    """The dashboard's delivery waits up to 2 s for the run's lock; its claim lapsed
    meanwhile, a webhook's delivery took it over, and both were told they failed though
    the dashboard's event was used (a black-box auditor). The claim is renewed: the
    webhook's delivery is refused as a duplicate, the dashboard's goes through."""
    async with any_backend(kind, claim_lease_ms=300) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(DASHBOARD.run(None, manager=manager, stack_id="L"))

        async def held() -> None:
            await asyncio.sleep(0.9)  # another process holds the run for a while

        holder = asyncio.create_task(adapter.with_workflow_lock("L", held))
        await asyncio.sleep(0.05)
        dashboard = asyncio.create_task(deliver_event(manager, "k", None, "UI", run_id="L"))
        await asyncio.sleep(0.5)  # past the claim's first lease
        with pytest.raises(siglo.WaitRecordClaimError):
            await DASHBOARD.deliver("k", "WEBHOOK", manager=manager)
        await holder
        assert "delivered to k" in await dashboard
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "completed"
        assert await DASHBOARD.resume("L", manager=manager) == {"used": "UI"}


async def _short(_: Any) -> Any:
    try:
        return await wait_for_event("k", timeout_ms=DEADLINES["w1"])
    except siglo.WaitTimeoutError:
        return "timed out"


RESTARTED = flow(Step.create("w", _short), Step.create("done", _used), name="restarted")


@pytest.mark.parametrize("by", ["delivery", "timer"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_claim_of_a_removed_runs_wait_is_nothing_to_a_new_run_of_its_id(
    kind: str, by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery (or a worker's timer) claims run R's wait and waits for R's lock; R is
    removed and started again under its id, waiting on the key with a record of its own.
    The old event (or timeout) was handed to the new run, which went on, its own wait
    left open for ever (a black-box auditor). The claim is refused; the new run waits
    on its own wait, which a delivery then ends."""
    DEADLINES["w1"] = 100 if by == "timer" else None
    async with any_backend(kind) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(RESTARTED.run("old", manager=manager, stack_id="R"))
        if by == "timer":
            await asyncio.sleep(0.2)  # due
        restarted = asyncio.Event()
        real_lock = adapter.with_workflow_lock

        async def after_the_restart(stack_id: str, action: Any, **kwargs: Any) -> Any:
            if asyncio.current_task() is claiming and stack_id == "R":
                await restarted.wait()
            return await real_lock(stack_id, action, **kwargs)

        monkeypatch.setattr(adapter, "with_workflow_lock", after_the_restart)
        claiming = asyncio.create_task(
            RESTARTED.deliver("k", "old event", manager=manager)
            if by == "delivery"
            else RESTARTED.fire_timeout("k", manager=manager)
        )
        for _ in range(200):
            record = await adapter.get_wait_record("k")
            if record is not None and record.status == "claimed":
                break
            await asyncio.sleep(0.01)
        assert await adapter.delete_checkpoint("R")  # `siglo rm`, its waits with it
        DEADLINES["w1"] = 3_600_000
        await _suspended(RESTARTED.run("new", manager=manager, stack_id="R"))
        restarted.set()
        with pytest.raises(siglo.WaitRecordClaimError, match="waits on a wait of its own"):
            await claiming
        stored = await adapter.get_checkpoint("R")
        assert stored is not None and stored.status == "waiting"
        assert stored.metadata["input"] == "new" and EVENT not in stored.contexts["w"]
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "waiting"
        assert await RESTARTED.deliver("k", "new event", manager=manager) == {"used": "new event"}


@pytest.mark.parametrize("kind", KINDS)
async def test_the_dashboard_completes_a_wait_the_run_answered_and_went_past(kind: str) -> None:
    """A delivery's run went on with its event but the delivery could not complete the
    wait (its claim lapsed; here: it stopped), and the dashboard's deliver takes the
    lapsed claim: it gave the claim back, and the wait of a completed run waited again
    for ever (a black-box auditor). It completes the wait as it was answered, and says
    its own event was not delivered."""
    async with any_backend(kind, claim_lease_ms=300) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(DASHBOARD.run(None, manager=manager, stack_id="P"))
        await _delivered_then_stopped(DASHBOARD, manager, "E1")
        done = await adapter.get_checkpoint("P")
        assert done is not None and done.status == "completed"
        await asyncio.sleep(0.4)  # its claim lapses
        with pytest.raises(ActionRefused, match="already received an event"):
            await deliver_event(manager, "k", None, "E2", run_id="P")
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "completed"
        assert record.event_payload == "E1"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delivery_cut_off_before_the_runs_first_snapshot_gives_its_claim_back(
    kind: str,
) -> None:
    """The caller's deadline cuts a delivery off after it put the event in the restored
    run, while the step's code after its wait still runs — before the run took a
    snapshot, so nothing of the event is stored: the claim is given back at once (it was
    kept for the whole lease, the run stored as waiting on a claimed wait; the test of
    random cut-offs caught one in 50), and the next delivery resumes the run."""
    entered = asyncio.Event()
    hold = {"on": True}

    async def waits_then_works(_: Any) -> Any:
        got = await wait_for_event("k")
        if hold["on"]:
            entered.set()
            await asyncio.sleep(3600)
        return got

    f = flow(Step.create("w", waits_then_works), name="cut-before-snapshot")
    async with any_backend(kind, claim_lease_ms=60_000) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(f.run(None, manager=manager, stack_id="A"))
        delivery = asyncio.create_task(f.deliver("k", "first", manager=manager))
        await asyncio.wait_for(entered.wait(), 10)
        delivery.cancel()
        with pytest.raises(asyncio.CancelledError):
            await delivery
        record = await adapter.get_wait_record("k")
        stored = await manager.load_checkpoint("A")
        assert stored is not None and stored.status == "waiting"
        assert record is not None and record.status == "waiting", record
        hold["on"] = False
        assert await f.deliver("k", "second", manager=manager) == "second"
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "completed"


async def test_a_delivery_cut_off_while_its_save_is_queued_gives_its_claim_back() -> None:
    """Redis: the caller's deadline lands after the run's first snapshot, while its save
    waits in the auto-pipeline's queue behind another call in flight. The command is
    never written, so nothing of the event is stored, and the claim is given back at once
    (it was kept for the whole lease, the run stored as waiting on a claimed wait: 5 of
    1,000 random cut-offs of deliveries beside other calls; ``siglo.unsent``)."""
    in_flight: list[asyncio.Future[Any]] = []
    async with any_backend("redis", claim_lease_ms=60_000) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        client = adapter.client  # type: ignore[attr-defined]
        queue = CancelWhenQueued(adapter.keys.checkpoint("A", None))  # type: ignore[attr-defined]

        async def waits_beside_a_busy_call(_: Any) -> Any:
            got = await wait_for_event("k")
            if queue.task is not None:
                await asyncio.sleep(0.05)  # the event's context change is streamed
                # Another call in flight on the connection: the step's save is queued.
                in_flight.append(asyncio.ensure_future(client.eval(BUSY_LUA, 0)))
                await asyncio.sleep(0.05)
            return got

        f = flow(Step.create("w", waits_beside_a_busy_call), name="cut-while-queued")
        await _suspended(f.run(None, manager=manager, stack_id="A"))
        client._pipeline_of()._queue = queue
        delivery = asyncio.create_task(f.deliver("k", "first", manager=manager))
        queue.task = delivery
        with pytest.raises(asyncio.CancelledError):
            await delivery
        assert queue.task is None  # cut off where the test meant it to be
        await asyncio.gather(*in_flight)
        stored = await manager.load_checkpoint("A")
        assert stored is not None and stored.status == "waiting" and stored.revision == 2
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "waiting", record
        assert await f.deliver("k", "second", manager=manager) == "second"
        record = await adapter.get_wait_record("k")
        assert record is not None and record.status == "completed"


async def _on_a(_: Any) -> Any:
    return await wait_for_event("a")


async def _then_on_b(event: Any) -> Any:
    return [event, await wait_for_event("b")]


A_THEN_B = flow(Step.create("w1", _on_a), Step.create("w2", _then_on_b), name="a-then-b")
ON_A = flow(Step.create("w1", _on_a), name="on-a")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delivery_cut_off_as_it_completes_the_wait_completes_it_in_the_background(
    kind: str,
) -> None:
    """The caller's deadline lands as the delivery completes the wait, after the run's
    checkpoint took the event and the run went on to its next wait: the wait stayed
    `claimed` for good (no worker recovers a waiting run, no timer fires a wait without a
    deadline), and its key refused every other run's wait, even after the run completed
    (a black-box auditor). It is completed in the background, with the event used."""
    f, other = A_THEN_B, ON_A
    async with any_backend(kind, claim_lease_ms=60_000) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(f.run(None, manager=manager, stack_id="A"))
        real = adapter.complete_wait_record

        async def cut_off(*args: Any, **kwargs: Any) -> None:
            # The one fault not produced for real: a cancellation at this very await.
            adapter.complete_wait_record = real  # type: ignore[method-assign]
            raise asyncio.CancelledError

        adapter.complete_wait_record = cut_off  # type: ignore[method-assign]
        with pytest.raises(asyncio.CancelledError):
            await f.deliver("a", "E1", manager=manager)
        await background_settled()
        stored = await manager.load_checkpoint("A")
        assert stored is not None and stored.status == "waiting"
        assert stored.contexts["w1"][EVENT] == "E1"
        record = await adapter.get_wait_record("a")
        assert record is not None and record.status == "completed", record
        assert record.event_payload == "E1"
        assert await f.deliver("b", "B", manager=manager) == ["E1", "B"]
        await _suspended(other.run(None, manager=manager, stack_id="B"))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_wait_answered_and_gone_past_frees_its_key_for_another_run(kind: str) -> None:
    """A delivery's process ended after the run's checkpoint took the event and the run
    went on to its next wait, before it completed the wait: no worker recovers a waiting
    run and no timer fires a wait without a deadline, so the key refused every other
    run's wait until someone delivered to it again (a black-box auditor). Once the claim
    has lapsed, the next run to wait on the key completes that wait as it was answered,
    with the event the first run used, and waits on the key itself."""

    f, other = A_THEN_B, ON_A
    async with any_backend(kind, claim_lease_ms=300) as backend:
        manager = StorageManager(backend, error_mode="strict")
        adapter = manager.adapter
        await _suspended(f.run(None, manager=manager, stack_id="A"))
        await _delivered_then_stopped(f, manager, "E1", key="a")
        record = await adapter.get_wait_record("a")
        assert record is not None and record.status == "claimed"
        with pytest.raises(siglo.InvalidArgumentError, match="waits for it already"):
            await other.run(None, manager=manager, stack_id="B")  # the claim still holds
        await asyncio.sleep(0.4)  # the claim lapses
        await _suspended(other.run(None, manager=manager, stack_id="C"))
        record = await adapter.get_wait_record("a")
        assert record is not None and record.stack_id == "C" and record.status == "waiting"
        assert await other.deliver("a", "for-C", manager=manager) == "for-C"
        assert await f.deliver("b", "B", manager=manager) == ["E1", "B"]
