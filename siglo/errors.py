"""The one error hierarchy of siglo.

Every error siglo raises derives from :class:`SigloError`. The names follow PEP 8; the
names of the TypeScript original (``CheckpointConflictException`` …) are kept as aliases
so code ported from it reads the same.
"""

from __future__ import annotations

from typing import TypeVar

from siglo.masking import scrub, scrub_chain, scrub_handled

__all__ = [
    "AmbiguousStackError",
    "BackendNotFoundError",
    "CapabilityNotSupportedError",
    "CheckpointConflictError",
    "CheckpointConflictException",
    "CheckpointVersionError",
    "CheckpointVersionException",
    "DecryptionError",
    "DocumentTooLargeError",
    "DriverNotInstalledError",
    "EncryptionRequiredError",
    "InvalidArgumentError",
    "InvalidStateTransitionError",
    "KeyErasedError",
    "IdempotencyKeyMismatchError",
    "IdempotencyOwnershipError",
    "LockLostError",
    "LockNotAcquiredError",
    "MalformedRecordError",
    "NamespaceMismatchError",
    "NamespaceMismatchException",
    "OutcomeUnknownError",
    "PluginError",
    "ReservedFormError",
    "SchemaVersionError",
    "SigloError",
    "StorageAdapterError",
    "StorageAdapterException",
    "UnknownStackError",
    "WaitRecordClaimError",
    "WaitTimeoutError",
    "WorkflowVersionMismatchError",
    "WorkflowVersionMismatchException",
    "naming_stack",
    "naming_wait",
]


class SigloError(Exception):
    """Base class of every error siglo raises.

    Every siglo error pickles as itself — its message and every attribute its
    constructor set — so it crosses a process boundary (a process pool, a worker
    process) intact, whatever its constructor's arguments: :meth:`__reduce__` rebuilds
    it without calling the constructor again.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        # Made while handling a driver's exception (raised from it): that exception is
        # masked now, not first when this error is printed (siglo.masking).
        scrub_handled()

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))

    def __str__(self) -> str:
        # A driver's text in the message may carry a URL's secret (siglo.masking), and
        # so may the driver's exception chained below: a traceback renders this first.
        scrub_chain(self)
        return scrub(super().__str__())


def _rebuild(
    cls: type[SigloError], args: tuple[object, ...], state: dict[str, object]
) -> SigloError:
    """The error :meth:`SigloError.__reduce__` pickled: ``cls`` with ``args`` and the
    attributes of ``state``, its constructor not called."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


_E = TypeVar("_E", bound=SigloError)


def naming_stack(exc: _E, stack_id: str, namespace: str | None) -> _E:
    """``exc``, of the same type and fields, with the stack whose stored checkpoint it was
    read from named: in its message, and as ``stack_id`` and ``namespace`` attributes.

    For the walks over every stored stack (an export, a re-key, a blob collection, a
    filtered listing), whose failure must say which stack to look at."""
    return _named(exc, f"the stored checkpoint of stack {stack_id!r}", stack_id, namespace)


def naming_wait(
    exc: _E,
    correlation_key: str,
    namespace: str | None,
    stack_id: str | None = None,
) -> _E:
    """``exc``, of the same type and fields, with the stored wait record it was read from
    named: in its message, and as ``correlation_key``, ``stack_id`` (when known) and
    ``namespace`` attributes (as :func:`naming_stack` names a checkpoint's stack)."""
    of = f" of stack {stack_id!r}" if stack_id is not None else ""
    record = f"the stored wait record {correlation_key!r}{of}"
    return _named(exc, record, stack_id, namespace, correlation_key=correlation_key)


def _named(
    exc: _E,
    record: str,
    stack_id: str | None,
    namespace: str | None,
    **more: str,
) -> _E:
    """``exc`` rebuilt (:func:`_rebuild`) with ``record`` and its namespace at the end of
    its message, and ``stack_id``, ``namespace`` and ``more`` as attributes."""
    where = record + (f" (namespace {namespace!r})" if namespace is not None else "")
    state = {**vars(exc), **more, "stack_id": stack_id, "namespace": namespace}
    named = _rebuild(type(exc), (f"{exc}, in {where}",), state)
    assert isinstance(named, type(exc))
    return named


class InvalidArgumentError(SigloError, ValueError):
    """An argument is malformed; the message names it. Nothing stored was changed."""


class MalformedRecordError(SigloError, ValueError):
    """A stored or received document does not have the documented shape.

    ``field`` names the offending field (dotted for nested ones), ``kind`` the document
    (``"checkpoint"``, ``"wait record"`` …).
    """

    def __init__(self, kind: str, field: str, problem: str) -> None:
        self.kind = kind
        self.field = field
        self.problem = problem
        super().__init__(f"malformed {kind}: field {field!r} {problem}")


class DanglingReferenceError(SigloError):
    """A stored record references an offloaded value its blob store does not have (the
    store named by ``blob_url`` changed or was restored, or a collector ran without this
    backend's records): a fault of that record's data, not of reaching the storage —
    retrying does not bring the value back. Not a :class:`StorageAdapterError`, so that
    ``siglo worker`` reports that run failed and goes on with the others, as for any
    run it cannot read, instead of taking it for an outage of the whole store."""


class DamagedBlobError(DanglingReferenceError):
    """A stored record references an offloaded value whose blob's bytes do not match the
    SHA-256 the reference names: the blob was altered, truncated or replaced in the blob
    store. Never read as the value; like a missing blob, a fault of that record's data
    (a :class:`DanglingReferenceError`, so ``siglo worker`` fails that run alone)."""


class NotJSONError(InvalidArgumentError):
    """A value that is not JSON data (a set, bytes, an integer beyond 64 bits, a key
    that is not text …), refused when it is encoded, before anything is written. As for
    a document too large, a flow whose step output is not JSON data fails the run
    rather than leave it running for a worker to run the step again."""


class ReservedFormError(InvalidArgumentError):
    """A value stored where siglo would take it for one of its own forms — a sealed
    value (``{"$siglo": "…"}``), a reference to an offloaded value (``{"$siglo.blob":
    "…", "bytes": n}``) — refused before anything is written: stored, every later read
    would take it for that form, and refuse it. As for a document too large, a flow
    whose step output or delivered event has such a form fails the run (or refuses the
    delivery before its claim) rather than leave it running or waiting."""


class DocumentTooLargeError(InvalidArgumentError):
    """A checkpoint's stored document is larger than the limit in force (SPEC §13).

    Raised before anything is written. ``size`` is the document's length in bytes as it
    would be stored (its compact JSON wire form, after the pipeline), ``limit`` the
    smaller of the settings' ``max_document_bytes`` and the backend's declared maximum,
    and ``largest`` the largest contexts as ``(step_id, bytes)`` pairs, largest first.
    ``record`` says what was measured: ``"checkpoint document"``, or a context change
    streamed on its own (``"context change 'key' of step 'step'"``, its value's JSON
    measured; ``largest`` is then that step and the value's size).
    """

    def __init__(
        self,
        stack_id: str,
        size: int,
        limit: int,
        largest: tuple[tuple[str, int], ...] = (),
        namespace: str | None = None,
        *,
        record: str = "checkpoint document",
    ) -> None:
        self.stack_id = stack_id
        self.size = size
        self.limit = limit
        self.largest = largest
        self.namespace = namespace
        self.record = record
        where = f"stack {stack_id!r}" + (f" (namespace {namespace!r})" if namespace else "")
        shown = ", ".join(f"{step!r}: {n} bytes" for step, n in largest) or "none"
        super().__init__(
            f"{record} of {where} is {size} bytes, over the limit of {limit} "
            f"bytes; largest contexts: {shown}. Keep large values out of the contexts "
            "(offload them: docs/large-state.md) or raise max_document_bytes"
        )


class CheckpointVersionError(MalformedRecordError):
    """A checkpoint was written by a newer storage schema than this siglo understands."""

    def __init__(self, version: object, supported: int = 2) -> None:
        self.version = version
        self.supported = supported
        super().__init__(
            "checkpoint",
            "version",
            f"is {version!r}; this siglo reads storage schema versions up to {supported}. "
            "Upgrade siglo to read it.",
        )


class CheckpointConflictError(SigloError):
    """An optimistic-concurrency save lost: the stored revision is not the expected one.

    ``current_revision`` is the revision stored when the save was refused (``None`` when
    no live checkpoint exists); ``expected_revision`` is what the caller expected
    (``None`` for a save without one, refused because it would not move the revision
    forward); ``attempted_revision`` is the revision of the refused checkpoint.
    """

    def __init__(
        self,
        stack_id: str,
        current_revision: int | None,
        expected_revision: int | None,
        attempted_revision: int | None = None,
    ) -> None:
        self.stack_id = stack_id
        self.current_revision = current_revision
        self.expected_revision = expected_revision
        self.attempted_revision = attempted_revision
        if expected_revision is not None:
            detail = f"expected revision {expected_revision}, stored is {current_revision}"
        else:
            detail = (
                f"revision {attempted_revision} does not move past the stored revision "
                f"{current_revision}"
            )
        super().__init__(
            f"checkpoint conflict on stack {stack_id!r}: {detail}; "
            "reload the latest checkpoint, reconcile and retry"
        )


class NamespaceMismatchError(SigloError):
    """A checkpoint of one namespace was restored where another was expected."""

    def __init__(self, stack_id: str, expected_namespace: str, actual_namespace: str) -> None:
        self.stack_id = stack_id
        self.expected_namespace = expected_namespace
        self.actual_namespace = actual_namespace
        super().__init__(
            f"checkpoint of stack {stack_id!r} belongs to namespace {actual_namespace!r}, "
            f"not the expected {expected_namespace!r}"
        )


class StorageAdapterError(SigloError):
    """A backend failed (connection lost, timeout, driver error).

    The driver's exception is the ``__cause__``. Error modes decide whether the storage
    manager raises, logs or swallows it.
    """

    timed_out: bool = False
    """Whether the call ran past its bound (``command_timeout_ms``) rather than failing
    otherwise: what the ``siglo.timeouts`` metric counts. Set by :func:`past_its_bound`
    on the errors the backends raise for a call that did not finish in time."""


class OutcomeUnknownError(StorageAdapterError):
    """A call whose outcome is unknown: it may or may not have taken effect.

    Raised when a call ran past its time limit after its request may have reached the
    server (``command_timeout_ms``), or when the server itself left the outcome
    ambiguous: PostgreSQL committed locally but its synchronous standby never confirmed
    the commit, Redis applied a write that fewer replicas than ``wait_replicas``
    confirmed, or the connection of a Redis write failed after it was sent. The write
    may be there now and be lost in a failover, or be there for good, or never have
    happened. It is never reported as a success (SPEC §4, "an
    acknowledgement is never a guess"), and the storage manager raises it in every
    error mode.

    What to do: re-read what the call wrote before acting on it, and retry writes as a
    compare-and-set (a checkpoint's ``expected_revision``, a lock's owner token, a
    claim's claimant), so that a retry of a write that did land conflicts instead of
    applying twice. A subclass of :class:`StorageAdapterError`, so handlers of adapter
    failures still catch it. ``operation`` names the call, ``reason`` why its outcome
    is unknown.
    """

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(
            f"outcome unknown: {operation} may or may not have taken effect ({reason}); "
            "re-read before acting on it, and retry it as a compare-and-set"
        )


_Failure = TypeVar("_Failure", bound=StorageAdapterError)


def past_its_bound(error: _Failure) -> _Failure:
    """``error``, marked as a call that ran past its bound (:attr:`StorageAdapterError.
    timed_out`): every backend's timed-out calls are counted alike, whatever its driver
    raised (a ``TimeoutError``, PostgreSQL's ``QueryCanceled``, SQLite's busy error)."""
    error.timed_out = True
    return error


def read_failure(exc: OutcomeUnknownError) -> StorageAdapterError:
    """``exc``, raised by a call that only reads, as what it is: a failed read. A read
    changes nothing stored, so only its answer is missing — nothing to re-read or to
    retry as a compare-and-set, and a ``best-effort`` manager may swallow it like any
    adapter failure. The storage adapter's reads raise this, with the driver's exception
    (``exc``'s cause) as its cause."""
    failed = StorageAdapterError(
        f"{exc.operation} failed ({exc.reason}); it only reads, so nothing stored changed"
    )
    failed.timed_out = exc.timed_out
    return failed


class WorkflowVersionMismatchError(SigloError):
    """A workflow's steps changed since the checkpoint was written, with no migration."""


class WaitTimeoutError(SigloError):
    """Raised inside a step by :func:`siglo.workflow.wait_for_event` when the wait's
    ``timeout_ms`` passed before its event arrived (a ``siglo worker`` fired the timer).

    The step may catch it and go on (its output is then the run's next input); uncaught,
    it fails the run like any exception of a step.
    """

    def __init__(self, correlation_key: str) -> None:
        self.correlation_key = correlation_key
        super().__init__(f"no event {correlation_key!r} arrived before the wait's timeout")


class InvalidStateTransitionError(SigloError):
    """A status transition the execution lifecycle does not allow."""


class UnknownStackError(SigloError, KeyError):
    """No live execution stack has this id in the storage manager."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown stack"


class AmbiguousStackError(SigloError):
    """A call named a stack by id while several callers hold a live stack of that id in
    one storage manager: it is refused rather than acting on another caller's stack.
    Save the stack object instead (``await stack.save()`` / ``manager.save(stack)``)."""


class WaitRecordClaimError(SigloError):
    """A wait record could not be completed: missing, not claimed, or claimed by another."""


class IdempotencyOwnershipError(SigloError):
    """``complete`` or ``fail`` of an idempotency key by someone who does not own its claim:
    a wrong or missing owner token, or the owner's lease lapsed (the key may since have been
    claimed by another, completed, or freed). Nothing stored was changed."""


class IdempotencyKeyMismatchError(SigloError):
    """An idempotency key was claimed again with a different payload fingerprint than the
    claim that holds it (in progress or completed): the same key names a different request.
    Nothing stored was changed."""


class LockNotAcquiredError(SigloError):
    """A lock is held by someone else and could not be acquired in time."""


class LockLostError(SigloError):
    """A lock's lease lapsed (or was taken over) while its action ran; the action was
    cancelled. ``fencing_token`` is the lost lease's token (``None`` if it had none)."""

    fencing_token: int | None = None


class CapabilityNotSupportedError(SigloError, NotImplementedError):
    """The adapter does not implement an optional part of the storage contract."""


class PluginError(SigloError):
    """A backend plugin is broken: it failed to load or declared something invalid."""


class BackendNotFoundError(SigloError, LookupError):
    """No registered backend serves a URL's scheme."""


class DriverNotInstalledError(SigloError, ImportError):
    """A backend's driver is not installed; the message says which extra to install."""


class SchemaVersionError(SigloError):
    """A database's siglo schema is older or newer than this siglo's code."""

    newer: bool = False
    """The database's schema is newer than this siglo's (upgrade siglo; ``siglo migrate``
    cannot help)."""


class DecryptionError(SigloError):
    """A stored payload could not be decoded: its ciphertext does not belong where it was
    read (another row, record kind, field or namespace), was altered, or its key is not
    one the key provider has. Nothing is returned in its place."""


class KeyErasedError(DecryptionError):
    """The namespace's data key was destroyed (``siglo erase``): what it encrypted —
    in the store, a replica, a backup or an export — can no longer be read."""


class EncryptionRequiredError(SigloError):
    """``require_encryption`` is set and a stored payload was found in clear (written
    before encryption was turned on, or by something that bypassed it)."""


# The names of the TypeScript original.
CheckpointVersionException = CheckpointVersionError
CheckpointConflictException = CheckpointConflictError
NamespaceMismatchException = NamespaceMismatchError
StorageAdapterException = StorageAdapterError
WorkflowVersionMismatchException = WorkflowVersionMismatchError
