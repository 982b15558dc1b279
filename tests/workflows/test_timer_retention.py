"""A durable timer the store would forget before it is due (docs/workflows.md): a wait
whose deadline is at or past the backend's retention (``checkpoint_ttl_ms``) is refused,
on SQLite, PostgreSQL and Redis."""

from __future__ import annotations

from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Step, WorkflowSuspended, flow, wait_for_event


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_timer_past_the_stores_retention_is_refused_not_lost(kind: str) -> None:
    """A store that keeps a run and its wait ``checkpoint_ttl_ms`` after a save (Redis:
    24 h by default) forgot a wait whose deadline came at or after that: its timer never
    fired and the run vanished without a word (a black-box auditor). Such a wait is
    refused before anything is written, and the run ends failed saying why; a deadline
    within the retention waits as before."""

    async def long_wait(value: Any) -> Any:
        return await wait_for_event(f"later:{value}", timeout_ms=2_000)

    async def short_wait(value: Any) -> Any:
        return await wait_for_event(f"soon:{value}", timeout_ms=500)

    longer = flow(Step.create("wait", long_wait), name="outlives")
    shorter = flow(Step.create("wait", short_wait), name="within")
    async with shared_store(kind, checkpoint_ttl_ms=1_000) as store:
        manager = siglo.StorageManager(store)
        with pytest.raises(siglo.errors.InvalidArgumentError, match="would never fire"):
            await longer.run("a", manager=manager, stack_id="long-1")
        stored = await store.adapter.get_checkpoint("long-1")
        assert stored is not None and stored.status == "failed"
        assert await store.adapter.get_wait_record("later:a") is None
        with pytest.raises(WorkflowSuspended):
            await shorter.run("b", manager=manager, stack_id="short-1")
        record = await store.adapter.get_wait_record("soon:b")
        assert record is not None and record.status == "waiting"
