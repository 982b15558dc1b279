"""Documents as table rows and back: the named parameters a checkpoint or a wait record
is written with, and a wait record read from its row.

Kept apart from :mod:`siglo_sql.adapter`, which decides *which* statement runs; this
module only says what a row holds (the tables are :mod:`siglo_sql.schema`'s).
"""

from __future__ import annotations

from typing import Any

from siglo import codec
from siglo.checkpoint import Checkpoint
from siglo.errors import MalformedRecordError, naming_wait
from siglo.records import WaitRecord
from siglo_sql.database import Row
from siglo_sql.keys import at_most, row_id

__all__ = [
    "checkpoint_row",
    "stored_bytes",
    "earliest",
    "due_wait_from_row",
    "wait_from_row",
    "wait_id",
    "wait_row",
]


def stored_bytes(value: Any, field: str = "document") -> bytes:
    """A document column's value as bytes: a BLOB as it is, a TEXT value — a row written
    past siglo, by the ``sqlite3`` shell's ``UPDATE … SET document = '{…}'`` — as its
    UTF-8; anything else is :class:`MalformedRecordError` (which the paths that read a
    stack name it with), never a ``TypeError``."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise MalformedRecordError(
        "checkpoint", field, f"is stored as {type(value).__name__}, not a JSON document"
    )


def earliest(a: int | None, b: int | None) -> int | None:
    """The earlier of two optional times (``None``: never)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def checkpoint_row(checkpoint: Checkpoint, retention: int | None, now: int) -> dict[str, Any]:
    """The parameters of a checkpoint's row; it is gone at the earlier of its own
    ``expires_at`` and ``retention`` (both clamped to what a BIGINT holds)."""
    namespace = checkpoint.namespace or ""
    expires_at = None if checkpoint.expires_at is None else at_most(checkpoint.expires_at)
    return {
        "id": row_id(namespace, checkpoint.stack_id),
        "namespace": namespace,
        "stack_id": checkpoint.stack_id,
        "revision": checkpoint.revision,
        "status": checkpoint.status,
        "gone_at": earliest(expires_at, retention),
        "document": checkpoint.to_json(),
        "workflow_id": checkpoint.workflow_id,
        "updated_at": at_most(checkpoint.timestamp),
        "expires_at": expires_at,
        "parts": None,  # stored whole (siglo_sql.parts cuts a large one)
        "now": now,
    }


def wait_id(namespace: str | None, key: str) -> bytes:
    """The row id of a wait record (or of a stack's latest-wait row): the correlation key
    (stack id) alone for an un-namespaced stack, as before namespaces scoped waits; with
    the namespace for a namespaced one, so two tenants' records never share a row."""
    return row_id(key) if namespace is None else row_id(namespace, key)


def wait_row(record: WaitRecord, gone_at: int | None) -> dict[str, Any]:
    """The parameters of a wait record's row and of its by-stack index row."""
    namespace = record.namespace or ""
    return {
        "id": wait_id(record.namespace, record.correlation_key),
        "correlation_key": record.correlation_key,
        "stack_id": record.stack_id,
        "namespace": namespace,
        "stack_ref": row_id(namespace, record.stack_id),
        "status": record.status,
        "deadline": None if record.expires_at is None else at_most(record.expires_at),
        "claimant_id": record.claimant_id,
        "claimed_at": record.claimed_at,
        "lease_expires_at": record.lease_expires_at,
        "completed_at": record.completed_at,
        "event_payload": codec.dumps(record.event_payload, what="event_payload"),
        "gone_at": gone_at,
        "document": record.to_json(),
        "latest_id": wait_id(record.namespace, record.stack_id),
    }


def due_wait_from_row(row: Row) -> WaitRecord:
    """A wait record from a row of ``wait_due``: :func:`wait_from_row`'s columns, then
    the record's correlation key, stack id and namespace, which name a stored document
    that cannot be read."""
    try:
        return wait_from_row(row[:-3])
    except MalformedRecordError as exc:
        key, stack_id, namespace = row[-3:]
        raise naming_wait(exc, key, namespace or None, stack_id) from exc


def wait_from_row(row: Row) -> WaitRecord:
    """A wait record from its saved document and its current state columns."""
    doc, status, claimant_id, claimed_at, lease_expires_at, completed_at, payload = row
    record = WaitRecord.from_json(doc)
    return record.replace(
        status=status,
        claimant_id=claimant_id,
        claimed_at=claimed_at,
        lease_expires_at=lease_expires_at,
        completed_at=completed_at,
        event_payload=record.event_payload
        if payload is None
        else codec.loads(payload, what="event payload"),
    )
