"""An anonymous claim (no ``claimant_id``) gets a fresh identity of its own, the same way
on every backend: the base class resolves it before the backend's hook runs
(docs/writing-a-backend.md)."""

from __future__ import annotations

import pytest
from raw_storage import KINDS, any_backend

from siglo import WaitRecord


@pytest.mark.parametrize("kind", KINDS)
async def test_two_anonymous_claims_are_two_claimants(kind: str) -> None:
    async with any_backend(kind) as backend:
        a = backend.adapter
        await a.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"))
        first = await a.claim_wait_record("k")
        assert first is not None and first.claimant_id
        # A second anonymous caller is somebody else: the live claim is not theirs.
        assert await a.claim_wait_record("k") is None
        await a.save_wait_record(WaitRecord(correlation_key="k2", stack_id="s"))
        other = await a.claim_wait_record("k2")
        assert other is not None and other.claimant_id
        assert other.claimant_id != first.claimant_id
        # The identity it was given is the one that may complete it.
        await a.complete_wait_record("k", first.claimant_id)
        done = await a.get_wait_record("k")
        assert done is not None and done.status == "completed"
