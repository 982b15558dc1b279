"""siglo: pluggable, multi-backend storage for durable workflows.

Checkpoints with optimistic concurrency, durable wait records, step caches,
context-change streams, and the idempotency keys, locks and nonces beside them, on
in-memory, Redis, SQLite and PostgreSQL backends discovered as plugins.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

from siglo.adapter import Capability, StorageAdapter
from siglo.backend import Backend
from siglo.checkpoint import Checkpoint, Status
from siglo.clock import Clock, ManualClock, SystemClock
from siglo.config import Settings, configure, current_settings, load_settings
from siglo.connect import connect
from siglo.coordination import (
    ClaimState,
    IdempotencyClaim,
    IdempotencyStore,
    Lock,
    LockResult,
    NonceStore,
)
from siglo.errors import (
    AmbiguousStackError,
    BackendNotFoundError,
    CapabilityNotSupportedError,
    CheckpointConflictError,
    CheckpointConflictException,
    CheckpointVersionError,
    CheckpointVersionException,
    DamagedBlobError,
    DanglingReferenceError,
    DecryptionError,
    DocumentTooLargeError,
    DriverNotInstalledError,
    EncryptionRequiredError,
    IdempotencyKeyMismatchError,
    IdempotencyOwnershipError,
    InvalidArgumentError,
    InvalidStateTransitionError,
    KeyErasedError,
    LockLostError,
    LockNotAcquiredError,
    MalformedRecordError,
    NamespaceMismatchError,
    NamespaceMismatchException,
    NotJSONError,
    OutcomeUnknownError,
    PluginError,
    ReservedFormError,
    SchemaVersionError,
    SigloError,
    StorageAdapterError,
    StorageAdapterException,
    UnknownStackError,
    WaitRecordClaimError,
    WaitTimeoutError,
    WorkflowVersionMismatchError,
    WorkflowVersionMismatchException,
)
from siglo.locking import Lease, current_lease
from siglo.manager import (
    ErrorMode,
    StorageManager,
    StorageWarning,
    default_error_mode,
    default_storage_manager,
    use_storage,
)
from siglo.plugins import get_registry
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord, WaitStatus
from siglo.redaction import REDACTED
from siglo.sentinel import MISSING, Missing
from siglo.stack import ExecutionStack
from siglo.workflow import (
    Flow,
    Step,
    WorkflowSuspended,
    current_backend,
    current_manager,
    flow,
    wait_for_event,
)


def _version() -> str:
    # One version source: the distribution's metadata, set in pyproject.toml.
    try:
        return version("siglo")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "MISSING",
    "REDACTED",
    "AmbiguousStackError",
    "Backend",
    "BackendNotFoundError",
    "CacheEvent",
    "Capability",
    "CapabilityNotSupportedError",
    "Checkpoint",
    "CheckpointConflictError",
    "CheckpointConflictException",
    "CheckpointVersionError",
    "DamagedBlobError",
    "DanglingReferenceError",
    "DecryptionError",
    "CheckpointVersionException",
    "ClaimState",
    "IdempotencyClaim",
    "Clock",
    "ContextChangeEvent",
    "DocumentTooLargeError",
    "DriverNotInstalledError",
    "EncryptionRequiredError",
    "ErrorMode",
    "ExecutionStack",
    "Flow",
    "IdempotencyStore",
    "InvalidArgumentError",
    "InvalidStateTransitionError",
    "KeyErasedError",
    "Lock",
    "Lease",
    "IdempotencyKeyMismatchError",
    "IdempotencyOwnershipError",
    "LockLostError",
    "LockNotAcquiredError",
    "LockResult",
    "MalformedRecordError",
    "ManualClock",
    "Missing",
    "NamespaceMismatchError",
    "NamespaceMismatchException",
    "NotJSONError",
    "OutcomeUnknownError",
    "NonceStore",
    "PluginError",
    "ReservedFormError",
    "SchemaVersionError",
    "SigloError",
    "Settings",
    "Status",
    "Step",
    "StorageAdapter",
    "StorageAdapterError",
    "StorageAdapterException",
    "StorageManager",
    "StorageWarning",
    "SystemClock",
    "UnknownStackError",
    "WaitRecord",
    "WaitRecordClaimError",
    "WaitTimeoutError",
    "WaitStatus",
    "WorkflowVersionMismatchError",
    "WorkflowSuspended",
    "WorkflowVersionMismatchException",
    "__version__",
    "configure",
    "connect",
    "current_backend",
    "current_lease",
    "current_manager",
    "current_settings",
    "default_error_mode",
    "default_storage_manager",
    "flow",
    "load_settings",
    "use_storage",
    "wait_for_event",
]


def __getattr__(name: str) -> object:
    # The Redis classes of seed 001 are public under their seed names, imported lazily
    # so that `import siglo` never needs the redis driver.
    if name in _REDIS_NAMES:
        get_registry().backend("redis").load_factory()  # says which extra is missing
        return getattr(importlib.import_module("siglo_redis"), name)
    raise AttributeError(f"module 'siglo' has no attribute {name!r}")


_REDIS_NAMES = frozenset(
    {"RedisStorageAdapter", "RedisIdempotencyStore", "RedisLock", "RedisNonceStore"}
)
