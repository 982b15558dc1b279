"""The checkpoint: a serialized snapshot of an execution stack (storage schema v2.0.0)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from siglo import codec
from siglo.errors import CheckpointVersionError, MalformedRecordError
from siglo.wire import Field, check_fields, from_wire_fields, to_wire_fields

__all__ = [
    "CHECKPOINT_VERSION",
    "SCHEMA_VERSION",
    "STATUSES",
    "TERMINAL_STATUSES",
    "Checkpoint",
    "Status",
]

CHECKPOINT_VERSION: Final = 2
SCHEMA_VERSION: Final = "2.0.0"

Status = Literal["running", "completed", "failed", "cancelled", "waiting"]
STATUSES: Final = frozenset({"running", "completed", "failed", "cancelled", "waiting"})
TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "cancelled"})

_FIELDS: Final = (
    Field("version", "version", "int"),
    Field("schema_version", "schemaVersion", "str"),
    Field("stack_id", "stackId", "str"),
    Field("workflow_id", "workflowId", "str", optional=True),
    Field("namespace", "namespace", "str", optional=True),
    Field("type", "type", "str"),
    Field("status", "status", "choice", choices=STATUSES),
    Field("revision", "revision", "int"),
    Field("chains", "chains", "str_list"),
    Field("contexts", "contexts", "dict_of_dicts"),
    Field("timestamp", "timestamp", "int"),
    Field("expires_at", "expiresAt", "int", optional=True),
    Field("metadata", "metadata", "dict", optional=True),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """An immutable snapshot of an execution stack.

    Attributes are the snake_case names of the seed's camelCase wire fields
    (``stack_id`` ↔ ``stackId``, ``expires_at`` ↔ ``expiresAt`` …); :meth:`to_wire` and
    :meth:`from_wire` convert. Times are integer milliseconds since the Unix epoch.
    ``contexts`` and ``metadata`` are plain dicts shared with the snapshot: treat them
    as read-only. Construction validates every field and raises
    :class:`~siglo.errors.MalformedRecordError` naming the wire field that is wrong.
    """

    stack_id: str
    revision: int
    timestamp: int
    status: Status = "running"
    type: str = "execution"
    chains: tuple[str, ...] = ()
    contexts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    workflow_id: str | None = None
    namespace: str | None = None
    expires_at: int | None = None
    metadata: Mapping[str, Any] | None = None
    version: int = CHECKPOINT_VERSION
    schema_version: str = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """Wire fields this version of siglo does not know, kept so a re-save keeps them."""
    _json: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_version(self.version)
        if isinstance(self.chains, list):
            object.__setattr__(self, "chains", tuple(self.chains))
        check_fields("checkpoint", _FIELDS, self)
        if self.revision < 0:
            raise MalformedRecordError(
                "checkpoint", "revision", f"must be >= 0, got {self.revision}"
            )
        if not self.schema_version.startswith("2."):
            raise MalformedRecordError(
                "checkpoint", "schemaVersion", f"is {self.schema_version!r}; expected 2.x.y"
            )

    # -- wire format ---------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The camelCase wire document (seed 000 §1); absent optional fields are omitted."""
        doc = to_wire_fields(_FIELDS, self)
        if self.extra:
            doc.update(self.extra)
        return doc

    def to_json(self) -> bytes:
        """The wire document as compact UTF-8 JSON (encoded once, then cached)."""
        if self._json is None:
            data = codec.dumps(self.to_wire(), what=f"checkpoint of stack {self.stack_id!r}")
            object.__setattr__(self, "_json", data)
            return data
        return self._json

    @classmethod
    def from_wire(cls, doc: Any) -> Checkpoint:
        """Build a checkpoint from a decoded wire document, validating every field.

        A ``version`` above 2 raises :class:`~siglo.errors.CheckpointVersionError`; any
        other problem raises :class:`~siglo.errors.MalformedRecordError`.
        """
        if isinstance(doc, Mapping) and "version" in doc:
            _check_version(doc["version"])
        kwargs, extra = from_wire_fields("checkpoint", _FIELDS, doc)
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str) -> Checkpoint:
        """Decode a JSON wire document (see :meth:`from_wire`)."""
        checkpoint = cls.from_wire(codec.loads(data, what="checkpoint"))
        if isinstance(data, bytes):
            # The document is exactly this encoding: a re-save need not encode again.
            object.__setattr__(checkpoint, "_json", data)
        return checkpoint

    # -- conveniences --------------------------------------------------------------

    def is_expired(self, now_ms: int) -> bool:
        """True once ``now_ms`` has reached ``expires_at``."""
        return self.expires_at is not None and now_ms >= self.expires_at

    def replace(self, **changes: Any) -> Checkpoint:
        """A copy with some fields changed (validated like a new checkpoint)."""
        return dataclasses.replace(self, **changes)


def _check_version(version: object) -> None:
    if type(version) is not int:
        raise MalformedRecordError(
            "checkpoint", "version", f"must be an integer, got {type(version).__name__}"
        )
    if version > CHECKPOINT_VERSION:
        raise CheckpointVersionError(version, CHECKPOINT_VERSION)
    if version < CHECKPOINT_VERSION:
        raise MalformedRecordError(
            "checkpoint", "version", f"is {version}; only storage schema version 2 is readable"
        )
