"""A run whose checkpoint the size guard refuses ends failed (docs/large-state.md, the
size guard; docs/workflows.md): a step's output too large to store, or an event
delivered to a waiting run that makes its checkpoint too large, fails the run —
checkpointed without what made it too large — instead of leaving it "running" for a
worker to rerun the step's side effect at every pass, or "waiting" on a wait already
completed. On SQLite, PostgreSQL and Redis."""

from __future__ import annotations

from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import DocumentTooLargeError, Step, WorkflowSuspended, flow, wait_for_event
from siglo.config import Settings
from siglo.errors import (
    InvalidStateTransitionError,
    NotJSONError,
    ReservedFormError,
    WaitRecordClaimError,
)
from siglo.workflow import Worker

SETTINGS = Settings(max_document_bytes=4096)
charges: list[int] = []


async def charge(amount: Any) -> dict[str, Any]:
    charges.append(amount)
    return {"receipt": "r" * 10_000}  # too large for a 4 KB document


async def first(value: Any) -> Any:
    return value


async def approve(value: Any) -> Any:
    return await wait_for_event("approve:big", timeout_ms=60_000)


oversized = flow(Step.create("charge", charge), name="oversized-output")
waiting = flow(Step.create("first", first), Step.create("approve", approve), name="big-event")


async def _failed_and_not_taken_up(
    backend: siglo.Backend, manager: siglo.StorageManager, refused: Any, stack_id: str
) -> None:
    """The run of ``refused`` whose ``charge`` output was refused is stored failed,
    without that output, and three worker passes take nothing up (no step run again)."""
    stored = await backend.adapter.get_checkpoint(stack_id)
    assert stored is not None and stored.status == "failed"
    assert "output" not in stored.contexts.get("charge", {})
    worker = Worker(manager, [refused])
    for _ in range(3):
        done = await worker.run_once()
        assert done.runs_recovered == 0 and not done.failures


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_step_output_too_large_to_store_fails_the_run_once(kind: str) -> None:
    charges.clear()
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url, settings=SETTINGS) as backend,
    ):
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        with pytest.raises(DocumentTooLargeError, match="'charge'"):
            await oversized.run(1200, manager=manager, stack_id="order-1")
        await _failed_and_not_taken_up(backend, manager, oversized, "order-1")
        assert charges == [1200]  # the side effect ran once, not once a pass
        with pytest.raises(InvalidStateTransitionError, match="ended failed"):
            await oversized.run(1200, manager=manager, stack_id="order-1")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_an_event_too_large_to_store_fails_the_waiting_run(kind: str) -> None:
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url, settings=SETTINGS) as backend,
    ):
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        with pytest.raises(WorkflowSuspended):
            await waiting.run(None, manager=manager, stack_id="order-2")
        with pytest.raises(DocumentTooLargeError):
            await waiting.deliver("approve:big", {"blob": "x" * 10_000}, manager=manager)
        stored = await backend.adapter.get_checkpoint("order-2")
        # Failed, not "waiting" on a wait its delivery completed.
        assert stored is not None and stored.status == "failed"
        assert "event" not in stored.contexts.get("approve", {})
        with pytest.raises(WaitRecordClaimError):
            await waiting.deliver("approve:big", {"small": 1}, manager=manager)
        with pytest.raises(InvalidStateTransitionError, match="ended failed"):
            await waiting.run(None, manager=manager, stack_id="order-2")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_wait_whose_checkpoint_is_too_large_fails_the_run(kind: str) -> None:
    """The waiting checkpoint (the step's wait added to the run's document) is over the
    limit: it is refused, the wait it wrote is cancelled, and the run ends failed — not
    left running for a worker to rerun the step, its wait holding the key."""

    async def first(value: Any) -> Any:
        return {"blob": "x" * 3_000}

    async def waits(value: Any) -> Any:
        return await wait_for_event(f"approve:{value['id']}", timeout_ms=60_000)

    async def tagged(value: Any) -> Any:
        return {**value, "id": siglo.workflow.step.current_step.get().stack_id}

    runs = flow(
        Step.create("first", first),
        Step.create("tag", tagged),
        Step.create("wait", waits),
        name="bulky",
    )
    async with shared_store(kind, checkpoint_ttl_ms=None) as store:
        # The waiting checkpoint's size, measured on a run with no limit; the limit is
        # then set below it, above the document before the wait.
        async with siglo.connect(store.url) as backend:
            with pytest.raises(WorkflowSuspended):
                await runs.run(None, manager=siglo.StorageManager(backend), stack_id="b-0")
            waiting = await backend.adapter.get_checkpoint("b-0")
            assert waiting is not None
        big = Settings(max_document_bytes=len(waiting.to_json()) - 40)
        async with siglo.connect(store.url, settings=big) as backend:
            manager = siglo.StorageManager(backend, settings=big)
            with pytest.raises(DocumentTooLargeError):
                await runs.run(None, manager=manager, stack_id="b-1")
            stored = await backend.adapter.get_checkpoint("b-1")
            assert stored is not None and stored.status == "failed"
            record = await backend.adapter.get_wait_record("approve:b-1")
            assert record is None or record.status == "cancelled"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_run_stored_just_under_the_limit_fails_whatever_the_step_adds(kind: str) -> None:
    """The run is stored a few bytes under the limit before a step that goes over it
    (its output, its wait): the failed checkpoint, with the step's context emptied, was
    still over the limit by the empty context itself, and the run stayed ``running`` for
    every worker pass to rerun the step (a black-box auditor). Swept byte by byte across
    the limit: each run ends failed, or its first checkpoint is refused and nothing is
    stored."""

    async def small(value: Any) -> Any:
        return {"small": 1}

    async def grows(value: Any) -> Any:
        return {"out": "y" * 200}

    async def waits(value: Any) -> Any:
        stack_id = siglo.workflow.step.current_step.get().stack_id
        return await wait_for_event(f"near:{stack_id}", timeout_ms=60_000)

    outputs = flow(Step.create("first", small), Step.create("second", grows), name="near-out")
    waits_ = flow(Step.create("first", small), Step.create("second", waits), name="near-wait")
    alone = flow(Step.create("first", small), name="near-out")
    limit = SETTINGS.max_document_bytes
    assert limit is not None
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url, settings=SETTINGS) as backend,
    ):
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        # The document after the first step, less its padding: measured on a run of it.
        await alone.run({"pad": ""}, manager=manager, stack_id="measure")
        measured = await backend.adapter.get_checkpoint("measure")
        assert measured is not None
        base = len(measured.to_json())
        failed = 0
        for runs in (outputs, waits_):
            for pad in range(limit - base - 60, limit - base + 4):
                stack_id = f"{runs.name}-{pad}"
                try:
                    await runs.run({"pad": "p" * pad}, manager=manager, stack_id=stack_id)
                except DocumentTooLargeError:
                    stored = await backend.adapter.get_checkpoint(stack_id)
                    assert stored is None or stored.status == "failed", (pad, stored)
                    failed += stored is not None
                except WorkflowSuspended:
                    pass
        assert failed >= 20  # the sweep crossed the limit with the run stored before it


# -- values of a form siglo reserves: refused before anything is written, as a size is ------

RESERVED = {"$siglo.blob": "ab" * 32, "bytes": 3}
"""A value of the form siglo gives a reference to an offloaded value."""
reserved_charges: list[int] = []


async def charge_reserved(amount: Any) -> dict[str, Any]:
    reserved_charges.append(amount)
    return RESERVED


reserved_output = flow(Step.create("charge", charge_reserved), name="reserved-output")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_step_output_of_a_reserved_form_fails_the_run_once(kind: str) -> None:
    """Its checkpoint refused (``ReservedFormError``), the run stayed ``running`` at the
    revision before, and every ``siglo worker`` pass ran the step again, its side effect
    with it (a black-box auditor). It fails as a step too large to store does."""
    reserved_charges.clear()
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url) as backend,
    ):
        manager = siglo.StorageManager(backend)
        with pytest.raises(ReservedFormError, match=r"charge\.output"):
            await reserved_output.run(7, manager=manager, stack_id="reserved-1")
        await _failed_and_not_taken_up(backend, manager, reserved_output, "reserved-1")
        assert reserved_charges == [7]


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_an_event_of_a_reserved_form_is_refused_before_its_claim(kind: str) -> None:
    """The claim stored the payload and completed the wait; the run's checkpoint was then
    refused, so the run stayed ``waiting`` on a completed wait for ever: a good delivery
    "already delivered", ``siglo show`` refusing the stored payload as offloaded (a
    black-box auditor). Refused before the claim, nothing changed: the run still waits,
    and a good delivery resumes it."""
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url) as backend,
    ):
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await waiting.run(None, manager=manager, stack_id="reserved-2")
        before = await backend.adapter.get_wait_record("approve:big")
        assert before is not None and before.status == "waiting"
        with pytest.raises(ReservedFormError, match="approve:big"):
            await waiting.deliver("approve:big", RESERVED, manager=manager)
        after = await backend.adapter.get_wait_record("approve:big")
        assert after == before
        stored = await backend.adapter.get_checkpoint("reserved-2")
        assert stored is not None and stored.status == "waiting"
        assert await waiting.deliver("approve:big", {"by": "ada"}, manager=manager) == {"by": "ada"}


NOT_JSON = {
    "a set": {1, 2},
    "bytes": b"receipt",
    "an integer beyond 64 bits": 2**70,
    "a key that is not text": {1: "one"},
}
not_json_charges: list[Any] = []


def _charging(output: Any) -> Any:
    async def charge(amount: Any) -> Any:
        not_json_charges.append(amount)
        return {"receipt": output}

    return charge


@pytest.mark.parametrize("kind", DURABLE_KINDS)
@pytest.mark.parametrize("what", list(NOT_JSON))
async def test_a_step_output_that_is_not_json_fails_the_run_once(kind: str, what: str) -> None:
    """The step's checkpoint was refused (not JSON-serialisable) and the run stayed
    ``running``: every ``siglo worker`` pass ran the step again, its side effect with it
    (a black-box auditor). It fails as a step too large to store does, with
    ``NotJSONError``, and the manager has nothing left to report later."""
    not_json_charges.clear()
    refused = flow(Step.create("charge", _charging(NOT_JSON[what])), name=f"not-json-{what}")
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url) as backend,
    ):
        manager = siglo.StorageManager(backend)
        with pytest.raises(NotJSONError, match="not JSON-serialisable"):
            await refused.run(5, manager=manager, stack_id="not-json-1")
        await manager.flush()  # no failure deferred to a later call
        assert (await manager.load_checkpoint("not-json-1")) is not None
        await _failed_and_not_taken_up(backend, manager, refused, "not-json-1")
        assert not_json_charges == [5]
        with pytest.raises(InvalidStateTransitionError, match="ended failed"):
            await refused.run(5, manager=manager, stack_id="not-json-1")
