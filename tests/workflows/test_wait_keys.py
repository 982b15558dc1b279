"""A correlation key names one waiting run of a namespace (docs/workflows.md): a second
run that waits on the key while the first's wait is pending fails, naming the first,
instead of taking its wait — which left the first waiting forever, its timer never
fired. A key whose wait ended may be waited on again, and the same key in another
namespace is another wait. On SQLite, PostgreSQL and Redis."""

from __future__ import annotations

from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Step, WorkflowSuspended, flow, wait_for_event
from siglo.errors import InvalidArgumentError


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
