"""A run cancelled and deleted at once (the dashboard's Cancel and Delete from two tabs,
a black-box auditor): on PostgreSQL the two transactions locked the checkpoint's row and
its waits' rows in opposite orders and deadlocked; on Redis a delivery's claim between
the deletion's read of the waits and their removal left the claimed wait record behind
for good (listed as due at every worker pass, its run gone)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ops_support import shared_store

import siglo
from siglo import Step, WorkflowSuspended, flow, wait_for_event


async def _waiting_run(manager: siglo.StorageManager, stack_id: str) -> None:
    async def approve(_: Any) -> Any:
        return await wait_for_event(f"approve:{stack_id}", timeout_ms=86_400_000)

    waits = flow(Step.create("approve", approve), name="race-cancel-delete")
    with pytest.raises(WorkflowSuspended):
        await waits.run(None, manager=manager, stack_id=stack_id, namespace="t")


async def test_postgres_cancel_and_delete_at_once_never_deadlock() -> None:
    """The interleaving that deadlocked, made every time: another session holds the
    checkpoint's row, the deletion queues for it, then the cancel (which took its waits'
    rows first, before this fix); the row let go, the deletion deletes it and wants the
    waits' rows the cancel holds while the cancel waits for the deletion."""
    import psycopg
    from sql_support import POSTGRES_URL

    async with (
        shared_store("postgres", checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url) as one,
        siglo.connect(store.url) as two,
    ):
        manager = siglo.StorageManager(one)
        await _waiting_run(manager, "x")
        stored = await one.adapter.get_checkpoint("x", "t", fallback=False)
        assert stored is not None
        raw: Any = one.raw_adapter
        table = f"{raw.schema}.{raw.table_prefix}checkpoints"
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as holder:
            await holder.execute(f"SELECT 1 FROM {table} FOR UPDATE")
            # The dashboard's delete: a compare-and-set on the revision its page showed.
            deleting = asyncio.create_task(
                two.adapter.delete_checkpoint("x", "t", expected_revision=stored.revision)
            )
            await asyncio.sleep(0.3)
            cancelling = asyncio.create_task(one.adapter.cancel_workflow("x", "t"))
            await asyncio.sleep(0.3)
            await holder.rollback()
            results = await asyncio.gather(deleting, cancelling, return_exceptions=True)
        assert not [r for r in results if isinstance(r, BaseException)], results
        assert results[0] is True
        assert await one.adapter.get_checkpoint("x", "t", fallback=False) is None
        assert await one.adapter.get_wait_record("approve:x", namespace="t") is None


async def test_redis_a_wait_claimed_while_its_run_is_deleted_goes_with_it() -> None:
    async with (
        shared_store("redis", checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url) as backend,
        siglo.connect(store.url) as other,
    ):
        manager = siglo.StorageManager(backend)
        await _waiting_run(manager, "claimed")
        waits: Any = backend.raw_adapter._waits  # type: ignore[attr-defined]
        snapshot = waits.snapshot_of_stack

        async def then_a_delivery_claims(stack_id: str, namespace: str | None) -> Any:
            found = await snapshot(stack_id, namespace)
            # Another process's delivery, between the read of the waits and their removal.
            claimed = await other.adapter.claim_wait_record(
                "approve:claimed", "someone", namespace="t"
            )
            assert claimed is not None
            return found

        waits.snapshot_of_stack = then_a_delivery_claims
        try:
            assert await backend.adapter.delete_checkpoint("claimed", "t") is True
        finally:
            waits.snapshot_of_stack = snapshot
        assert await backend.adapter.get_checkpoint("claimed", "t", fallback=False) is None
        assert await backend.adapter.get_wait_record("approve:claimed", namespace="t") is None
