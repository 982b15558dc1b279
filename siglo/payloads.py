"""Stored payloads outside checkpoints, as ``siglo rekey`` walks and rewrites them.

A backend that declares :attr:`~siglo.adapter.Capability.PAYLOAD_SCAN` lists every live
stand-alone wait record and cached step with its payloads as stored
(:meth:`~siglo.adapter.StorageAdapter.scan_payloads`), and rewrites those payloads with a
compare-and-set on what it listed (:meth:`~siglo.adapter.StorageAdapter.swap_payload`):
the rewrite happens only if the record still holds the bytes it was read with, so a
concurrent claim, completion or set is never overwritten (docs/encryption.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from siglo.records import WaitRecord

__all__ = [
    "PAYLOAD_FIELDS",
    "PAYLOAD_KINDS",
    "PayloadKind",
    "StoredPayload",
    "wait_fields",
    "with_wait_fields",
]

PayloadKind = Literal["wait", "step", "idempotency"]
"""A stand-alone wait record (``wait``) or a cached step (``step``), which the storage
adapter lists, or a completed idempotency key's result (``idempotency``), which the
idempotency store lists."""

PAYLOAD_KINDS: Final[tuple[PayloadKind, ...]] = ("wait", "step")
"""The kinds :meth:`~siglo.adapter.StorageAdapter.scan_payloads` lists."""

PAYLOAD_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "wait": ("eventPayload", "metadata"),
    "step": ("value",),
    "idempotency": ("result",),
}
"""The payload fields of each kind (the field names of the associated data)."""


@dataclass(frozen=True)
class StoredPayload:
    """One record's payloads as a backend stores them."""

    kind: PayloadKind
    key: str
    """A wait record's correlation key; a cached step's key as the backend stores it
    (:func:`siglo.locking.namespaced_key` of the key and the run's namespace); an
    idempotency key."""
    namespace: str | None
    """A wait record's namespace (``None`` for a cached step: its key holds it)."""
    fields: dict[str, Any]
    """Each payload field present (not ``None``) and its value as stored."""
    token: Any = field(default=None, compare=False, repr=False)
    """What the backend read, which :meth:`swap_payload` compares against (opaque)."""


def wait_fields(record: WaitRecord) -> dict[str, Any]:
    """A wait record's payload fields that hold something."""
    found = {"eventPayload": record.event_payload, "metadata": record.metadata}
    return {k: v for k, v in found.items() if v is not None}


def with_wait_fields(record: WaitRecord, fields: dict[str, Any]) -> WaitRecord:
    """``record`` with the payload fields of ``fields`` replaced (others as they are)."""
    return record.replace(
        event_payload=fields.get("eventPayload", record.event_payload),
        metadata=fields.get("metadata", record.metadata),
    )
