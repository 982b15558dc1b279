"""A wait record without ``status`` reads as ``waiting`` (issue 11 defect 10).

The TypeScript adapter of seed 001 stores wait records with no status field, at
``siglo:wait:<correlationKey>`` and ``siglo:wait:<stackId>``, and inside a checkpoint's
``metadata.waitRecord``. Each backend is given such a document in its raw storage (the
Redis keys, the SQL document column, the memory model's store) and must read it as a
waiting record in ``get_wait_record``, ``claim_wait_record`` and ``cancel_workflow``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from raw_storage import KINDS, any_backend

import siglo
from siglo import Checkpoint, WaitRecord

TS_RECORD = {"correlationKey": "ts:approval", "stackId": "ts-stack", "stepId": "approve"}


async def _store_without_status(kind: str, backend: siglo.Backend, doc: dict[str, Any]) -> None:
    """Replace the stored document of a saved record with ``doc`` (no status), raw."""
    adapter: Any = backend.adapter
    await adapter.save_wait_record(WaitRecord.from_wire({**doc, "status": "waiting"}))
    data = orjson.dumps(doc)
    key = doc["correlationKey"]
    if kind == "memory":
        adapter._waits[key].data = data  # the reference model's own store
    elif kind == "redis":
        await adapter.client.set(adapter.keys.wait(key), data)
        await adapter.client.set(adapter.keys.wait(doc["stackId"]), data)
        await adapter.client.delete(adapter.keys.wait_index(doc["stackId"]))
    else:
        db = adapter.database
        table = adapter.table_prefix + "wait_records"
        if adapter.schema:
            table = f'"{adapter.schema}".{table}'
        await db.fetch(db.sql(f"UPDATE {table} SET document = :document"), {"document": data})


@pytest.mark.parametrize("status", ["absent", "null"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_record_without_status_is_waiting(kind: str, status: str) -> None:
    """Without ``status``, or with ``"status": null`` (a null optional field reads as
    absent, as in every other field of a record)."""
    async with any_backend(kind) as backend:
        adapter = backend.adapter
        doc = TS_RECORD if status == "absent" else {**TS_RECORD, "status": None}
        await _store_without_status(kind, backend, doc)
        record = await adapter.get_wait_record("ts:approval")
        assert record is not None and record.status == "waiting"
        by_stack = await adapter.get_wait_record("ts-stack")
        assert by_stack is not None and by_stack.status == "waiting"

        claimed = await adapter.claim_wait_record("ts:approval", "worker-1", event_payload=1)
        assert claimed is not None and claimed.status == "claimed"
        await adapter.complete_wait_record("ts:approval", "worker-1")

        await _store_without_status(
            kind, backend, {"correlationKey": "ts:other", "stackId": "ts-stack-2"}
        )
        await adapter.cancel_workflow("ts-stack-2")
        cancelled = await adapter.get_wait_record("ts:other")
        assert cancelled is not None and cancelled.status == "cancelled"


@pytest.mark.parametrize("kind", KINDS)
async def test_an_embedded_record_without_status_is_waiting(kind: str) -> None:
    async with any_backend(kind) as backend:
        checkpoint = Checkpoint.from_wire(
            {
                "version": 2,
                "schemaVersion": "2.0.0",
                "stackId": "ts-embedded",
                "type": "execution",
                "status": "waiting",
                "revision": 1,
                "chains": [],
                "contexts": {},
                "timestamp": 1,
                "metadata": {"waitRecord": {**TS_RECORD, "stackId": "ts-embedded"}},
            }
        )
        await backend.adapter.save_checkpoint(checkpoint)
        record = await backend.adapter.get_wait_record("ts-embedded")
        assert record is not None and record.status == "waiting"
