"""Wait records, context-change events and cache events: the other wire documents."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from siglo import codec
from siglo.wire import Field, check_fields, from_wire_fields, to_wire_fields

__all__ = [
    "CACHE_EVENT_TYPES",
    "WAIT_STATUSES",
    "CacheEvent",
    "CacheEventType",
    "ContextChangeEvent",
    "ContextOp",
    "WaitRecord",
    "WaitStatus",
    "another_record_of_its_key",
    "embedded_wait_record",
]

WaitStatus = Literal["waiting", "claimed", "completed", "cancelled"]
WAIT_STATUSES: Final = frozenset({"waiting", "claimed", "completed", "cancelled"})

_WAIT_FIELDS: Final = (
    Field("correlation_key", "correlationKey", "str"),
    Field("stack_id", "stackId", "str"),
    Field("status", "status", "choice", choices=WAIT_STATUSES),
    Field("namespace", "namespace", "str", optional=True),
    Field("step_id", "stepId", "str", optional=True),
    Field("event_type", "eventType", "str", optional=True),
    Field("created_at", "createdAt", "int", optional=True),
    Field("expires_at", "expiresAt", "int", optional=True),
    Field("claimant_id", "claimantId", "str", optional=True),
    Field("claimed_at", "claimedAt", "int64", optional=True),
    Field("lease_expires_at", "leaseExpiresAt", "int64", optional=True),
    Field("completed_at", "completedAt", "int64", optional=True),
    Field("event_payload", "eventPayload", "any", optional=True),
    Field("metadata", "metadata", "dict", optional=True),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitRecord:
    """A durable wait: a workflow suspended until an event with ``correlation_key`` arrives.

    Lifecycle: ``waiting → claimed → completed``, or ``cancelled``. ``expires_at`` is the
    wait's deadline: a record past it is not claimable unless the claim passes
    ``allow_expired``. A claim is a lease until ``lease_expires_at``; after that another
    claimant may take the record over. Wire names are camelCase (``correlationKey`` …).
    """

    correlation_key: str
    stack_id: str
    status: WaitStatus = "waiting"
    namespace: str | None = None
    step_id: str | None = None
    event_type: str | None = None
    created_at: int | None = None
    expires_at: int | None = None
    claimant_id: str | None = None
    claimed_at: int | None = None
    lease_expires_at: int | None = None
    completed_at: int | None = None
    event_payload: Any = None
    metadata: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_fields("wait record", _WAIT_FIELDS, self)

    def is_expired(self, now_ms: int) -> bool:
        """True once ``now_ms`` has reached the wait's deadline ``expires_at``."""
        return self.expires_at is not None and now_ms >= self.expires_at

    def lease_expired(self, now_ms: int) -> bool:
        """True if the record is claimed and its claim lease has run out."""
        return (
            self.status == "claimed"
            and self.lease_expires_at is not None
            and now_ms >= self.lease_expires_at
        )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase wire document; absent optional fields are omitted."""
        doc = to_wire_fields(_WAIT_FIELDS, self)
        if self.extra:
            doc.update(self.extra)
        return doc

    def to_json(self) -> bytes:
        """The wire document as compact UTF-8 JSON."""
        return codec.dumps(self.to_wire(), what=f"wait record {self.correlation_key!r}")

    @classmethod
    def from_wire(cls, doc: Any) -> WaitRecord:
        """Build from a decoded wire document, validating every field.

        A document without ``status`` — as the TypeScript adapter of seed 001 writes
        them, its record has no such field — is a record still ``waiting``; so is one
        whose ``status`` is ``null``, as a ``null`` optional field reads as absent.
        """
        if isinstance(doc, dict) and doc.get("status") is None:
            doc = {**doc, "status": "waiting"}
        kwargs, extra = from_wire_fields("wait record", _WAIT_FIELDS, doc)
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str) -> WaitRecord:
        """Decode a JSON wire document."""
        return cls.from_wire(codec.loads(data, what="wait record"))

    def replace(self, **changes: Any) -> WaitRecord:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def embedded_wait_record(metadata: Mapping[str, Any] | None) -> WaitRecord | None:
    """The wait record a checkpoint keeps as ``metadata.waitRecord`` (seed 001 §5), if any.

    ``get_wait_record`` falls back to it when neither index has the key.
    """
    embedded = metadata.get("waitRecord") if metadata else None
    return WaitRecord.from_wire(embedded) if isinstance(embedded, dict) else None


def another_record_of_its_key(metadata: Mapping[str, Any] | None, record: WaitRecord) -> bool:
    """Whether the wait record a checkpoint keeps (:func:`embedded_wait_record`) is a record
    of ``record``'s key other than ``record``: by creation time, a run removed and started
    again under its id waiting on a record of its own. Where either does not say when it
    was created (a TypeScript worker's record, an older siglo's), or the checkpoint keeps
    none, it is taken for the same: the flow's delivery and the dashboard's decide alike."""
    embedded = embedded_wait_record(metadata)
    return (
        embedded is not None
        and embedded.correlation_key == record.correlation_key
        and embedded.created_at is not None
        and record.created_at is not None
        and embedded.created_at != record.created_at
    )


ContextOp = Literal["set", "delete"]

_CONTEXT_OPS: Final = frozenset({"set", "delete"})

_CONTEXT_FIELDS: Final = (
    Field("stack_id", "stackId", "str"),
    Field("step_id", "stepId", "str"),
    Field("key", "key", "str"),
    Field("value", "value", "any", optional=True),
    Field("op", "op", "choice", choices=_CONTEXT_OPS),
    Field("namespace", "namespace", "str", optional=True),
    Field("revision", "revision", "int", optional=True),
    Field("timestamp", "timestamp", "int"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextChangeEvent:
    """One mutation of a step's context, streamed to ``on_context_change``."""

    stack_id: str
    step_id: str
    key: str
    timestamp: int
    value: Any = None
    op: ContextOp = "set"
    namespace: str | None = None
    revision: int | None = None

    def __post_init__(self) -> None:
        # Plainly valid, as every event a manager builds (three a flow run): accepted
        # without the field table, whose check cost about half of building the event.
        # Anything else is the table's to judge, with its error naming the field
        # (tests/core/test_record_checks.py holds the two to the same verdict).
        if not (
            type(self.stack_id) is str
            and type(self.step_id) is str
            and type(self.key) is str
            and type(self.op) is str
            and self.op in _CONTEXT_OPS
            and (self.namespace is None or type(self.namespace) is str)
            and (self.revision is None or type(self.revision) is int)
            and type(self.timestamp) is int
        ):
            check_fields("context change", _CONTEXT_FIELDS, self)

    def to_wire(self) -> dict[str, Any]:
        """The camelCase wire document."""
        return to_wire_fields(_CONTEXT_FIELDS, self)

    @classmethod
    def from_wire(cls, doc: Any) -> ContextChangeEvent:
        """Build from a decoded wire document, validating every field."""
        kwargs, _ = from_wire_fields("context change", _CONTEXT_FIELDS, doc)
        return cls(**kwargs)


CacheEventType = Literal["hit", "miss", "set", "error"]
CACHE_EVENT_TYPES: Final = frozenset({"hit", "miss", "set", "error"})

_CACHE_FIELDS: Final = (
    Field("type", "type", "choice", choices=CACHE_EVENT_TYPES),
    Field("key", "key", "str"),
    Field("timestamp", "timestamp", "int"),
    Field("stack_id", "stackId", "str", optional=True),
    Field("step_id", "stepId", "str", optional=True),
    Field("ttl_ms", "ttlMs", "int", optional=True),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheEvent:
    """A step-cache hit, miss, set or error, reported to ``on_cache_event`` for telemetry."""

    type: CacheEventType
    key: str
    timestamp: int
    stack_id: str | None = None
    step_id: str | None = None
    ttl_ms: int | None = None

    def __post_init__(self) -> None:
        # Plainly valid (a flow's look-ups and sets): accepted without the field table;
        # anything else is the table's to judge (see ContextChangeEvent).
        if not (
            type(self.type) is str
            and self.type in CACHE_EVENT_TYPES
            and type(self.key) is str
            and type(self.timestamp) is int
            and (self.stack_id is None or type(self.stack_id) is str)
            and (self.step_id is None or type(self.step_id) is str)
            and (self.ttl_ms is None or type(self.ttl_ms) is int)
        ):
            check_fields("cache event", _CACHE_FIELDS, self)

    def to_wire(self) -> dict[str, Any]:
        """The camelCase wire document."""
        return to_wire_fields(_CACHE_FIELDS, self)

    @classmethod
    def from_wire(cls, doc: Any) -> CacheEvent:
        """Build from a decoded wire document, validating every field."""
        kwargs, _ = from_wire_fields("cache event", _CACHE_FIELDS, doc)
        return cls(**kwargs)
