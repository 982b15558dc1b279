"""Stores seeded with runs for the dashboard's tests (tests/observability/test_ui*.py).

:func:`seed` writes, through a :class:`siglo.StorageManager` on the one configuration,
a handful of real workflow runs (one waiting for an event, one crashed mid-step, finished
ones) and ``bulk`` plain checkpoints for the paging tests, in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

import siglo
from siglo import Step, StorageManager, WorkflowSuspended, flow, wait_for_event
from siglo.checkpoint import Checkpoint

SECRET: Final = "4111-1111-1111-1111"
FIELD: Final = "card"
NAMESPACE: Final = "shop"
STATUSES: Final = ("completed", "failed", "cancelled", "running", "waiting")


async def _take(order: Any) -> dict[str, Any]:
    return {"order": order, FIELD: SECRET, "items": [{"sku": "A-1", "qty": 2}]}


async def _approve(taken: Any) -> Any:
    event = await wait_for_event(f"approve:{taken['order']}")
    return {**taken, "approved": event}


async def _ship(approved: Any) -> str:
    return f"shipped {approved['order']}"


ORDERS = flow(
    Step.create("take", _take),
    Step.create("approve", _approve),
    Step.create("ship", _ship),
    name="orders",
)


async def _remind(_: Any) -> Any:
    return await wait_for_event("remind:r-1", timeout_ms=1)


REMINDERS = flow(Step.create("remind", _remind), name="reminders")


async def seed(
    backend: siglo.Backend, settings: siglo.Settings, *, bulk: int = 0, overdue: bool = False
) -> None:
    """Real runs of :data:`ORDERS` in :data:`NAMESPACE` (``order-1`` and ``order-2``
    waiting, ``order-3`` completed), and ``bulk`` checkpoints ``bulk-00000`` … spread
    over the statuses and two workflows, without a namespace; with ``overdue``, the run
    ``reminder-1`` waiting on a wait past its deadline."""
    manager = StorageManager(backend, settings=settings)
    for n in range(1, 4):
        with contextlib.suppress(WorkflowSuspended):
            await ORDERS.run(f"o-{n}", manager=manager, stack_id=f"order-{n}", namespace=NAMESPACE)
    await ORDERS.deliver("approve:o-3", {"by": "ops"}, manager=manager, namespace=NAMESPACE)
    if overdue:
        # A wait whose deadline passes at once: overdue until a worker fires it.
        with contextlib.suppress(WorkflowSuspended):
            await REMINDERS.run(None, manager=manager, stack_id="reminder-1")
    adapter = backend.adapter
    now = 1_780_000_000_000
    batch: list[Checkpoint] = []
    for i in range(bulk):
        batch.append(
            Checkpoint(
                stack_id=f"bulk-{i:05d}",
                revision=1,
                timestamp=now + i,
                contexts={"step": {"i": i}},
                status=STATUSES[i % len(STATUSES)],
                workflow_id="nightly" if i % 2 else "hourly",
            )
        )
        if len(batch) == 200 or i == bulk - 1:
            await asyncio.gather(*(adapter.save_checkpoint(cp) for cp in batch))
            batch = []
