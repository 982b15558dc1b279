"""The checkpoint: a serialized snapshot of an execution stack (storage schema v2.0.0)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from siglo import codec
from siglo.errors import CheckpointVersionError, MalformedRecordError
from siglo.wire import Field, check_fields, from_wire_fields

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
        if _plain_fields(self):
            return
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
        # The field table's order, written out (every save encodes it: the generic
        # to_wire_fields took twice as long). tests/test_checkpoint_decode.py holds the
        # two to the same document, key order included.
        doc: dict[str, Any] = {
            "version": self.version,
            "schemaVersion": self.schema_version,
            "stackId": self.stack_id,
        }
        if self.workflow_id is not None:
            doc["workflowId"] = self.workflow_id
        if self.namespace is not None:
            doc["namespace"] = self.namespace
        doc["type"] = self.type
        doc["status"] = self.status
        doc["revision"] = self.revision
        doc["chains"] = list(self.chains)
        doc["contexts"] = self.contexts
        doc["timestamp"] = self.timestamp
        if self.expires_at is not None:
            doc["expiresAt"] = self.expires_at
        if self.metadata is not None:
            doc["metadata"] = self.metadata
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
        if cls is Checkpoint and type(doc) is dict:
            fast = _from_plain_wire(doc)
            if fast is not None:
                return fast
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


def _plain_fields(c: Checkpoint) -> bool:
    """Whether a constructed checkpoint is plainly valid: every field of the exact type
    the field table asks for (``str``, ``int``, ``dict``, a tuple of ``str``).

    Every save builds a checkpoint, and the generic field-table check cost about as much
    as encoding a 1 KB document. This accepts only; anything else (a subclass, a
    ``Mapping`` that is not a ``dict``, any invalid value) returns ``False`` and
    :func:`~siglo.wire.check_fields` decides, with the error naming the field.
    tests/test_checkpoint_decode.py holds the two checks to the same verdict.
    """
    if not (
        type(c.version) is int
        and c.version == CHECKPOINT_VERSION
        and type(c.schema_version) is str
        and c.schema_version.startswith("2.")
        and type(c.stack_id) is str
        and type(c.type) is str
        and type(c.status) is str
        and c.status in STATUSES
        and type(c.revision) is int
        and c.revision >= 0
        and type(c.timestamp) is int
        and type(c.chains) is tuple
        and type(c.contexts) is dict
        and (c.workflow_id is None or type(c.workflow_id) is str)
        and (c.namespace is None or type(c.namespace) is str)
        and (c.expires_at is None or type(c.expires_at) is int)
        and (c.metadata is None or type(c.metadata) is dict)
    ):
        return False
    for chain in c.chains:
        if type(chain) is not str:
            return False
    for key, inner in c.contexts.items():
        if type(key) is not str or type(inner) is not dict:
            return False
    return True


_OPTIONAL_WIRE: Final = ("workflowId", "namespace", "expiresAt", "metadata")
_set = object.__setattr__


def _from_plain_wire(doc: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint of a well-formed document in the shape siglo writes, else ``None``.

    Every load decodes a checkpoint, and building it through the dataclass constructor
    (keyword unpacking, then the generic field-table validation) cost about three times
    ``orjson.loads`` of a 1 KB document. This checks the same rules inline and fills the
    slots directly. It only ever accepts: anything unusual (an unknown field, a ``null``,
    a wrong type, another version) returns ``None`` and the caller takes the general
    path, which raises the exact error naming the field. tests/test_checkpoint_decode.py
    checks that both paths agree on every document.
    """
    try:
        version = doc["version"]
        schema_version = doc["schemaVersion"]
        stack_id = doc["stackId"]
        kind = doc["type"]
        status = doc["status"]
        revision = doc["revision"]
        chains = doc["chains"]
        contexts = doc["contexts"]
        timestamp = doc["timestamp"]
    except KeyError:
        return None
    if not (
        type(version) is int
        and version == CHECKPOINT_VERSION
        and type(schema_version) is str
        and schema_version.startswith("2.")
        and type(stack_id) is str
        and type(kind) is str
        and type(status) is str
        and status in STATUSES
        and type(revision) is int
        and revision >= 0
        and type(timestamp) is int
        and type(chains) is list
        and type(contexts) is dict
    ):
        return None
    for chain in chains:
        if type(chain) is not str:
            return None
    for key, inner in contexts.items():
        if type(key) is not str or type(inner) is not dict:
            return None
    size = 9
    workflow_id = namespace = expires_at = metadata = None
    if len(doc) != size:
        workflow_id = doc.get("workflowId")
        namespace = doc.get("namespace")
        expires_at = doc.get("expiresAt")
        metadata = doc.get("metadata")
        if (
            (workflow_id is not None and type(workflow_id) is not str)
            or (namespace is not None and type(namespace) is not str)
            or (expires_at is not None and type(expires_at) is not int)
            or (metadata is not None and type(metadata) is not dict)
        ):
            return None
        present = sum(1 for name in _OPTIONAL_WIRE if doc.get(name) is not None)
        if len(doc) != size + present:
            return None  # a null optional field or an unknown one: the general path
    checkpoint: Checkpoint = object.__new__(Checkpoint)
    _set(checkpoint, "stack_id", stack_id)
    _set(checkpoint, "revision", revision)
    _set(checkpoint, "timestamp", timestamp)
    _set(checkpoint, "status", status)
    _set(checkpoint, "type", kind)
    _set(checkpoint, "chains", tuple(chains))
    _set(checkpoint, "contexts", contexts)
    _set(checkpoint, "workflow_id", workflow_id)
    _set(checkpoint, "namespace", namespace)
    _set(checkpoint, "expires_at", expires_at)
    _set(checkpoint, "metadata", metadata)
    _set(checkpoint, "version", version)
    _set(checkpoint, "schema_version", schema_version)
    _set(checkpoint, "extra", {})
    _set(checkpoint, "_json", None)
    return checkpoint
