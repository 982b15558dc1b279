"""A run and its wait read as the store held them, on every path that prints or carries a
run (:mod:`siglo.stored_runs`): ``siglo show``, the dashboard's run page and an export.

A delivery stores the run's checkpoint, then completes the wait. A reader that took the
checkpoint just before and the wait just after paired a run still ``waiting`` with its
wait ``completed`` — a pair the store never held — and said "delivered" beside it, a
timeout included (a black-box auditor: ``siglo show`` and the run page within a few
hundred reads racing deliveries, on SQLite, PostgreSQL and Redis). Here the delivery
lands exactly between the two reads, on every reader.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Step, StorageManager, WorkflowSuspended, flow, wait_for_event
from siglo.adapter import StorageAdapter
from siglo.cli import cli
from siglo.transfer import export_lines
from siglo.ui.data import run_detail

READERS = ("show", "dashboard", "export")
"""Every path that reads a run with its waits to print or carry it."""


async def _waits(_: Any) -> Any:
    return await wait_for_event("k")


async def _then(event: Any) -> Any:
    return {"got": event}


FLOW = flow(Step.create("w", _waits), Step.create("then", _then), name="read-as-stored")


async def _read(reader: str, backend: siglo.Backend) -> tuple[str, list[str]]:
    """The run's status and its waits' statuses, as ``reader`` gives them."""
    if reader == "show":
        shown = await asyncio.to_thread(
            CliRunner().invoke, cli, ["show", backend.url, "A", "--json"], catch_exceptions=False
        )
        assert shown.exit_code == 0, shown.output
        doc = json.loads(shown.output)
        return doc["checkpoint"]["status"], [w["status"] for w in doc["waitRecords"]]
    if reader == "dashboard":
        detail = await run_detail(backend.adapter, "A", None, ())
        assert detail is not None
        return detail.checkpoint.status, [w.status for w in detail.waits]
    status, waits = "", []
    async for line in export_lines(backend.adapter):
        item = orjson.loads(line)
        if item.get("kind") == "checkpoint":
            status = item["document"]["status"]
        elif item.get("kind") == "wait":
            waits.append(item["record"]["status"])
    return status, waits


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_run_read_across_a_delivery_is_read_again(
    kind: str, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with shared_store(kind) as backend:
        with pytest.raises(WorkflowSuspended):
            await FLOW.run(None, manager=StorageManager(backend), stack_id="A")
        real = StorageAdapter.get_wait_record
        delivered: list[Any] = []

        async def across(self: StorageAdapter, key: str, *, namespace: str | None = None) -> Any:
            if not delivered:
                # The run was read waiting; a delivery (another process) lands now.
                delivered.append(key)
                async with siglo.connect(backend.url) as other:
                    delivered.append(await FLOW.deliver("k", "E", manager=StorageManager(other)))
            return await real(self, key, namespace=namespace)

        monkeypatch.setattr(StorageAdapter, "get_wait_record", across)
        status, waits = await _read(reader, backend)
        assert delivered[1:] == [{"got": "E"}]  # it landed between the two reads
        # The pair the store holds after the delivery: never "waiting" beside an ended wait.
        assert status == "completed", (status, waits)
        assert all(w == "completed" for w in waits), waits
