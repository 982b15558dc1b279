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
