"""Stored payloads outside checkpoints, as ``siglo rekey`` walks and rewrites them.

A backend that declares :attr:`~siglo.adapter.Capability.PAYLOAD_SCAN` lists every live
stand-alone wait record and cached step with its payloads as stored
(:meth:`~siglo.adapter.StorageAdapter.scan_payloads`), and rewrites those payloads with a
compare-and-set on what it listed (:meth:`~siglo.adapter.StorageAdapter.swap_payload`):
the rewrite happens only if the record still holds the bytes it was read with, so a
concurrent claim, completion or set is never overwritten (docs/encryption.md). A backend
that also lists its context-change streams says so in
:attr:`~siglo.adapter.StorageAdapter.payload_kinds` (every built-in one does): each
stream value is then one record of kind ``context``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from siglo.records import WaitRecord

__all__ = [
    "CONTEXT_KIND",
    "PAYLOAD_FIELDS",
    "PAYLOAD_KINDS",
    "PayloadKind",
    "StoredPayload",
    "context_field",
    "context_field_key",
    "wait_fields",
    "with_wait_fields",
]

PayloadKind = Literal["wait", "step", "context", "idempotency"]
"""A stand-alone wait record (``wait``), a cached step (``step``) or one value of a
context-change stream (``context``), which the storage adapter lists, or a completed
idempotency key's result (``idempotency``), which the idempotency store lists."""

PAYLOAD_KINDS: Final[tuple[PayloadKind, ...]] = ("wait", "step")
"""The kinds :meth:`~siglo.adapter.StorageAdapter.scan_payloads` lists on every backend
with :attr:`~siglo.adapter.Capability.PAYLOAD_SCAN` (and
:meth:`~siglo.adapter.StorageAdapter.delete_payload` removes)."""

CONTEXT_KIND: Final = "context"
"""The kind a backend lists its context-change streams as, if its
:attr:`~siglo.adapter.StorageAdapter.payload_kinds` has it: one
:class:`StoredPayload` per stored value, keyed by the stack id, in the stream's
namespace, its one field named by :func:`context_field`. Not removed one by one: a
stack's streams go with its checkpoint (``delete_checkpoint``)."""

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
    (:func:`siglo.locking.namespaced_key` of the key and the run's namespace); a context
    stream's stack id; an idempotency key."""
    namespace: str | None
    """A wait record's or a context stream's namespace (``None`` for a cached step: its
    key holds it)."""
    fields: dict[str, Any]
    """Each payload field present (not ``None``) and its value as stored; a context
    stream value's one field is named by :func:`context_field`."""
    token: Any = field(default=None, compare=False, repr=False)
    """What the backend read, which :meth:`swap_payload` compares against (opaque)."""


def context_field(step_id: str, key: str) -> str:
    """The field name of a context-change stream's value of ``key`` in step ``step_id``:
    the name its associated data binds it to (the JSON array ``[step id, key]``, so a
    step ``"a.b"`` with key ``"c"`` is not step ``"a"`` with key ``"b.c"``), which is how
    ``siglo rekey`` re-seals it where it is."""
    return orjson.dumps([step_id, key]).decode()


def context_field_key(name: str) -> str:
    """The context key a :func:`context_field` name holds the value of."""
    key: str = orjson.loads(name)[1]
    return key


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
