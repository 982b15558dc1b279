"""A delivery refused before the run starts releases its claim (issue 11 defect 11).

A flow whose steps changed refuses to resume with ``WorkflowVersionMismatchError``; the
event was not consumed, so the wait goes back to ``waiting`` at once instead of staying
claimed for the whole lease, and each refused claim says why, with advice that fits.
"""

from __future__ import annotations

from typing import Any

import pytest
from raw_storage import KINDS, any_backend

import siglo
from siglo import Step, StorageManager, flow, wait_for_event


async def _approve(_: Any) -> Any:
    return await wait_for_event("approve:refused")


async def _after(value: Any) -> Any:
    return {"done": value}


V1 = flow(Step.create("approve", _approve), name="refusal")
V2 = flow(Step.create("approve", _approve), Step.create("after", _after), name="refusal")


@pytest.mark.parametrize("kind", KINDS)
async def test_version_mismatch_releases_the_claim_and_advises(kind: str) -> None:
    async with any_backend(kind) as backend:
        manager = StorageManager(backend, error_mode="strict")
        with pytest.raises(siglo.WorkflowSuspended):
            await V1.run(None, manager=manager, stack_id="refused-1")

        with pytest.raises(siglo.WorkflowVersionMismatchError, match="with_migration") as info:
            await V2.deliver("approve:refused", {"ok": 1}, manager=manager)
        assert "allow_expired" not in str(info.value)
        record = await backend.adapter.get_wait_record("approve:refused")
        assert record is not None
        assert record.status == "waiting" and record.claimant_id is None

        # The event is still deliverable, at once, by the flow that wrote the run.
        assert await V1.deliver("approve:refused", {"ok": 1}, manager=manager) == {"ok": 1}

        # A second delivery is told the truth: already delivered, not "allow_expired".
        with pytest.raises(siglo.WaitRecordClaimError, match="already delivered") as again:
            await V1.deliver("approve:refused", {"ok": 2}, manager=manager)
        assert "allow_expired" not in str(again.value)
        with pytest.raises(siglo.WaitRecordClaimError, match="no wait has this"):
            await V1.deliver("approve:unknown", None, manager=manager)


async def test_claimed_elsewhere_says_so() -> None:
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        with pytest.raises(siglo.WorkflowSuspended):
            await V1.run(None, manager=manager, stack_id="refused-2")
        assert await backend.adapter.claim_wait_record("approve:refused", "other") is not None
        with pytest.raises(siglo.WaitRecordClaimError, match="another delivery holds"):
            await V1.deliver("approve:refused", None, manager=manager)


async def test_a_run_removed_during_its_delivery_says_so_not_no_wait_record() -> None:
    """`siglo rm` of a run while a delivery executes it: the run's next checkpoint is
    refused (the stack is gone), and deliver() raised "no wait record" — the error of a
    delivery that never claimed the wait — from the wait's completion (a black-box
    auditor). The run's own failure propagates."""
    import asyncio

    from ops_support import shared_store

    from siglo import Step, WorkflowSuspended, flow, wait_for_event
    from siglo.errors import CheckpointConflictError

    working, release = asyncio.Event(), asyncio.Event()

    async def approve(_: object) -> object:
        return await wait_for_event("rm:1")

    async def slow(value: object) -> object:
        working.set()
        await release.wait()
        return value

    removed = flow(Step.create("approve", approve), Step.create("slow", slow), name="rm-during")
    async with shared_store("sqlite") as store, siglo.connect(store.url) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await removed.run(None, manager=manager, stack_id="rm-1")
        delivering = asyncio.create_task(removed.deliver("rm:1", "ada", manager=manager))
        await working.wait()
        assert await backend.adapter.delete_checkpoint("rm-1") is True  # `siglo rm`
        release.set()
        with pytest.raises(CheckpointConflictError):
            await delivering
