"""The storage adapter contract (seed 000 §6), snake_case and async.

Every public method checks its arguments here, once for every backend, refuses once the
adapter is closed (:class:`~siglo.closing.Closable`), and then calls a protected hook of
the same name with a ``_do_`` prefix (``save_checkpoint`` → ``_do_save_checkpoint``).
A backend implements only the hooks, and each hook receives arguments already checked:
bad input is refused the same way everywhere, before anything is read or written.

Every method is optional. An adapter says which parts it implements in
:attr:`StorageAdapter.capabilities`; a hook it does not implement raises
:class:`~siglo.errors.CapabilityNotSupportedError`. The contract suite checks that a
declared capability is really implemented, and reports an undeclared one as "not
supported" rather than passed. The rules every method obeys are on ``docs/contract.md``.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

from siglo import codec
from siglo.blind import check_tokens, list_matching, scan_tokens
from siglo.checkpoint import Checkpoint
from siglo.closing import Closable
from siglo.coordination import Lock
from siglo.errors import (
    CapabilityNotSupportedError,
    InvalidArgumentError,
    OutcomeUnknownError,
    read_failure,
)
from siglo.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    CheckpointPage,
    ListQuery,
    without_keyrings,
)
from siglo.listing import check_list_arguments as _check_list_arguments
from siglo.locking import namespaced_key, run_with_lock, workflow_lock_key
from siglo.payloads import CONTEXT_KIND, PAYLOAD_KINDS, PayloadKind, StoredPayload
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord
from siglo.reserved import check_not_keyring, check_not_keyring_listing
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.sizing import check_change_size, check_document_size
from siglo.validation import (
    check_context_change,
    check_save_arguments,
    check_wait_record,
    require_id,
    require_lease_ms,
    require_optional_id,
    require_ttl_ms,
)

__all__ = ["CAPABILITY_METHODS", "CacheEntry", "Capability", "StorageAdapter"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A step's cache entry, as :meth:`StorageAdapter.set_cached_step` takes it: what
    :meth:`StorageAdapter.save_checkpoint_caching` writes beside a checkpoint."""

    key: str
    value: Any
    ttl_ms: int | None = None
    """``None``: the adapter's default."""
    namespace: str | None = None

    def checked(self) -> CacheEntry:
        """Itself, its arguments checked as :meth:`StorageAdapter.set_cached_step`'s."""
        require_id("key", self.key)
        require_ttl_ms("ttl_ms", self.ttl_ms, optional=True)
        require_optional_id("namespace", self.namespace)
        return self

    def in_namespace(self) -> dict[str, Any]:
        """The ``namespace`` keyword of a ``set_cached_step`` call (none without one, so
        an adapter that predates namespaced entries is called as before)."""
        return {} if self.namespace is None else {"namespace": self.namespace}


class Capability(enum.StrEnum):
    """An optional part of the storage contract."""

    CHECKPOINTS = "checkpoints"
    """save_checkpoint (atomic compare-and-set), get_checkpoint, clean_expired_checkpoints."""
    WAIT_RECORDS = "wait_records"
    """save / get / claim / complete / cancel wait records, and cancel_workflow."""
    WORKFLOW_LOCK = "workflow_lock"
    """with_workflow_lock: actions for one stack never overlap."""
    STEP_CACHE = "step_cache"
    """get_cached_step / set_cached_step, with a cached None distinct from a miss."""
    CONTEXT_STREAM = "context_stream"
    """on_context_change, readable back through get_context_changes."""
    CACHE_EVENTS = "cache_events"
    """on_cache_event accepts telemetry without affecting stored state."""
    IDEMPOTENCY = "idempotency"
    """The backend provides an idempotency store (seed 001 §6)."""
    LOCKS = "locks"
    """The backend provides a distributed lock with fencing tokens (seed 001 §7)."""
    NONCES = "nonces"
    """The backend provides a nonce store (seed 001 §8)."""
    CLOCK = "clock"
    """Every expiry decision uses the injected Clock, so tests can move time."""
    LISTING = "listing"
    """list_checkpoints: keyset pages of checkpoint summaries, filtered (SPEC §9)."""
    DELETION = "deletion"
    """delete_checkpoint: a stack and everything of it, compare-and-set (SPEC §9)."""
    DUE_WAITS = "due_waits"
    """list_due_waits: waits whose deadline has passed, oldest first (durable timers)."""
    PAYLOAD_SCAN = "payload_scan"
    """scan_payloads / swap_payload / delete_payload: every stand-alone wait record and
    cached step with its stored payloads, and a compare-and-set rewrite (``siglo rekey``)
    or removal (``siglo erase``) of them."""


CAPABILITY_METHODS: Final[dict[Capability, tuple[str, ...]]] = {
    Capability.CHECKPOINTS: ("save_checkpoint", "get_checkpoint", "clean_expired_checkpoints"),
    Capability.WAIT_RECORDS: (
        "save_wait_record",
        "create_wait_record",
        "get_wait_record",
        "claim_wait_record",
        "complete_wait_record",
        "release_wait_record",
        "cancel_wait_record",
        "cancel_workflow",
    ),
    Capability.WORKFLOW_LOCK: ("with_workflow_lock",),
    Capability.STEP_CACHE: ("get_cached_step", "set_cached_step"),
    Capability.CONTEXT_STREAM: ("on_context_change", "get_context_changes"),
    Capability.CACHE_EVENTS: ("on_cache_event",),
    Capability.LISTING: ("list_checkpoints",),
    Capability.DELETION: ("delete_checkpoint",),
    Capability.DUE_WAITS: ("list_due_waits",),
    Capability.PAYLOAD_SCAN: ("scan_payloads", "swap_payload", "delete_payload"),
}
"""The adapter methods each adapter-level capability requires."""


def latest_changes(changes: Sequence[ContextChangeEvent]) -> list[ContextChangeEvent]:
    """``changes`` without those a later one of the same key supersedes: a stream keeps
    the latest value of each key, and a value set then replaced in one turn is no part
    of what the save carries — measured by itself, a large one refused a save whose
    document was under the limit (a black-box auditor; the SQL and Redis backends
    write the batch as one, keeping the latest)."""
    last = {
        (change.namespace, change.stack_id, change.step_id, change.key): index
        for index, change in enumerate(changes)
    }
    return [
        change
        for index, change in enumerate(changes)
        if last[(change.namespace, change.stack_id, change.step_id, change.key)] == index
    ]


class StorageAdapter(Closable):
    """Base class of storage adapters.

    Subclasses set :attr:`name` and :attr:`capabilities` and implement the ``_do_…``
    hooks of the capabilities they declare; the public methods check their arguments
    and call those hooks. A hook not implemented raises
    :class:`~siglo.errors.CapabilityNotSupportedError`.
    """

    name: ClassVar[str] = "adapter"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    durable: ClassVar[bool] = True
    """Whether what the adapter stores outlives the process. A
    :class:`~siglo.StorageManager` over a durable adapter defaults to ``strict``."""
    max_document_bytes: int | None = None
    """The largest checkpoint document (its stored JSON, in bytes) a save may write: a
    backend class declares its store's maximum here, and :func:`siglo.connect` lowers it
    on the instance to the settings' ``max_document_bytes`` and the plugin's declaration.
    A save over it raises :class:`~siglo.errors.DocumentTooLargeError` before anything is
    written (:mod:`siglo.sizing`); ``None``: no limit."""
    offloaded_from_bytes: int | None = None
    """Set on the instance by :func:`siglo.connect` when a layer above offloads values
    (``offload_min_bytes``): a context value at least this large is stored in a
    checkpoint as a blob reference, so a context change streamed on its own with such a
    value is not refused for its size (:func:`siglo.sizing.check_change_size`); the
    stream holds the value as set. ``0`` where the pipeline seals contexts whole
    (encryption, compression): the sealed context is what is offloaded, so a value of
    any size may be. ``None``: nothing is offloaded."""
    workflow_lock: Lock | None = None
    """The lock :meth:`with_workflow_lock` takes, keyed by the stack id, if the backend
    provides one (any :class:`~siglo.coordination.Lock`): the base class then runs the
    action under it with :func:`siglo.locking.run_with_lock`. A backend with a lock of
    another kind overrides ``_do_with_workflow_lock`` instead."""
    workflow_lock_ttl_ms: int = DEFAULTS.workflow_lock_ttl_ms
    """The lease of :attr:`workflow_lock`, renewed while the action runs."""
    workflow_lock_timeout_ms: int = DEFAULTS.workflow_lock_timeout_ms
    """How long :meth:`with_workflow_lock` waits for the lock when the caller names no
    ``timeout_ms``."""
    payload_kinds: ClassVar[frozenset[PayloadKind]] = frozenset(PAYLOAD_KINDS)
    """With :attr:`Capability.PAYLOAD_SCAN`, the kinds :meth:`scan_payloads` lists and
    :meth:`swap_payload` rewrites: stand-alone wait records and cached steps, and
    ``"context"`` for a backend that lists its context-change streams too (every built-in
    one; ``siglo rekey`` re-seals their values). Declared, not guessed from the hooks: a
    backend written before streams were listed would take ``"context"`` for another kind."""

    def supports(self, capability: Capability | str) -> bool:
        """Whether this adapter declares ``capability``."""
        if type(capability) is Capability:
            # Asked on every save and step: a member needs no enum look-up.
            return capability in self.capabilities
        return Capability(capability) in self.capabilities

    def implements(self, method: str) -> bool:
        """Whether this adapter's class implements the contract method ``method``.

        True when its ``_do_<method>`` hook is overridden (or, for an adapter written
        before the hooks, the public method itself), and for ``with_workflow_lock`` when
        it provides a :attr:`workflow_lock`.
        """
        if method == "with_workflow_lock" and self.workflow_lock is not None:
            return True
        cls = type(self)
        hook = "_do_" + method
        return getattr(cls, hook) is not getattr(StorageAdapter, hook) or getattr(
            cls, method
        ) is not getattr(StorageAdapter, method)

    def _unsupported(self, method: str) -> CapabilityNotSupportedError:
        return CapabilityNotSupportedError(
            f"storage adapter {self.name!r} does not implement {method}()"
        )

    # -- 1. context and event streaming -------------------------------------------

    async def on_context_change(self, event: ContextChangeEvent) -> None:
        """Record one context mutation. A storage failure raises
        :class:`~siglo.errors.StorageAdapterError`, which the storage manager handles by
        its error mode."""
        event = check_context_change(event)
        check_not_keyring(
            event.namespace, f"recording a context change of stack {event.stack_id!r}"
        )
        # A value over the document limit by itself, which no offloading takes out of a
        # checkpoint: refused before anything is written, as the save of any checkpoint
        # holding it would be (siglo.sizing).
        check_change_size(event, self.max_document_bytes, self.offloaded_from_bytes)
        self._require_open()
        await self._do_on_context_change(event)

    async def get_context_changes(
        self, stack_id: str, step_id: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """The latest recorded value of every field of one step's context stream."""
        require_id("stack_id", stack_id)
        require_id("step_id", step_id)
        require_optional_id("namespace", namespace)
        self._require_open()
        try:
            return await self._do_get_context_changes(stack_id, step_id, namespace)
        except OutcomeUnknownError as exc:
            raise read_failure(exc) from (exc.__cause__ or exc)

    # -- 2. checkpointing ------------------------------------------------------------

    async def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        """Store ``checkpoint`` under ``(checkpoint.namespace, checkpoint.stack_id)``.

        An atomic compare-and-set on the stored revision: with ``expected_revision`` the
        live stored revision (0 when none) must equal it, without it the new revision
        must be greater than the stored one. Otherwise raises
        :class:`~siglo.errors.CheckpointConflictError` and stores nothing.
        """
        check_save_arguments(checkpoint, expected_revision)
        limit = self.max_document_bytes
        if limit is not None and len(checkpoint.to_json()) > limit:  # inline: every save
            check_document_size(checkpoint, limit)
        self._require_open()
        await self._do_save_checkpoint(checkpoint, expected_revision=expected_revision)

    def writes_with_checkpoint(self, changes: Sequence[ContextChangeEvent]) -> bool:
        """Whether :meth:`save_checkpoint_streamed` writes ``changes`` and a checkpoint
        in one go (here: never). The storage manager sends them with a checkpoint only
        then; otherwise it streams them first, each failure handled on its own."""
        return False

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        """Record ``changes`` (as :meth:`on_context_change`), then store ``checkpoint``
        (as :meth:`save_checkpoint`): what the storage manager sends when a stack is
        saved right after its context changed.

        Here, the two calls in that order. A backend may override it to write both in
        one statement (the SQL backend on PostgreSQL: one round trip and one commit),
        saying which changes it takes in :meth:`writes_with_checkpoint`; the changes are
        then recorded even when the checkpoint's compare-and-set is refused, as with the
        two calls, and a failure of either fails the call. A backend that declares
        changes in :meth:`writes_with_checkpoint` without overriding this (the in-memory
        one) has them taken here, after the size guard.
        """
        check_save_arguments(checkpoint, expected_revision)
        # Before the changes: a document too large leaves nothing written, changes included.
        check_document_size(checkpoint, self.max_document_bytes)
        for change in latest_changes(changes):
            await self.on_context_change(change)
        await self.save_checkpoint(checkpoint, expected_revision=expected_revision)

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        """:meth:`save_checkpoint_streamed`, as the last write of the action that holds
        the stack's workflow lock (:meth:`with_workflow_lock`) in this task: what the
        storage manager sends for ``save_checkpoint(…, unlock=True)``.

        A backend may release that lock in the same transaction as the save (the SQL
        backend on PostgreSQL: one round trip, one commit; see
        :func:`siglo.locking.held`), whatever the compare-and-set's outcome; if the write
        fails, the lock stays held until the action ends. Here, and wherever no such lock
        is held, only the save: the lock is released when the action ends, as always.
        Either way the lock is held until the save has landed.
        """
        await self.save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        """A step's checkpoint with its cache entry: :meth:`save_checkpoint_streamed`
        (:meth:`save_checkpoint_unlocking` with ``unlock``) and
        :meth:`set_cached_step` of ``entry``, what a workflow sends after a cached step
        ran (contract rule ``cache.with-checkpoint``).

        The entry is stored as :meth:`set_cached_step` stores it whatever the
        compare-and-set decides (it is valid for its input either way), and a refused
        compare-and-set is raised as :class:`~siglo.errors.CheckpointConflictError`. A
        backend may override it to write the changes, the entry, the checkpoint and
        (``unlock``) the lock's release in one transaction, where a failure of any
        writes none of them (SQL: one transaction; Redis: one script).

        Here, for an adapter that does not override it: the entry and the save sent at
        once (neither waits for the other's reply), both awaited to the end, a failure
        of either raised (the save's first); ``unlock`` is not passed on, since the lock
        must cover the entry too: the lock is released when the action ends, as always.
        """
        check_save_arguments(checkpoint, expected_revision)
        entry.checked()
        # Before anything is sent: a document too large leaves nothing written.
        check_document_size(checkpoint, self.max_document_bytes)
        self._require_open()
        cache = asyncio.ensure_future(
            self.set_cached_step(entry.key, entry.value, entry.ttl_ms, **entry.in_namespace())
        )
        try:
            await self.save_checkpoint_streamed(
                checkpoint, changes, expected_revision=expected_revision
            )
        finally:
            (cached,) = await asyncio.gather(cache, return_exceptions=True)
        if isinstance(cached, BaseException):
            raise cached

    async def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        """The live checkpoint of a stack, or ``None``.

        With a ``namespace``, looks there first and, when ``fallback`` is true, then at
        the un-namespaced checkpoint (seed 001 §5). Expired checkpoints are never returned.
        """
        require_id("stack_id", stack_id)
        if namespace is not None:  # require_optional_id, without a call more on every load
            require_id("namespace", namespace)
            check_not_keyring(namespace, f"reading stack {stack_id!r}")
        self._require_open()
        try:
            return await self._do_get_checkpoint(stack_id, namespace, fallback=fallback)
        except OutcomeUnknownError as exc:
            raise read_failure(exc) from (exc.__cause__ or exc)

    async def clean_expired_checkpoints(self) -> int:
        """Delete expired checkpoints; return how many (0 for native-expiry stores)."""
        self._require_open()
        return await self._do_clean_expired_checkpoints()

    # -- 3. durable waits ------------------------------------------------------------

    async def save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        """Store ``record`` under its correlation key, indexed by its stack id.

        ``ttl_ms`` is how long the record is kept (``None``: the adapter's default);
        past it the record is gone. It is distinct from the wait's deadline
        ``record.expires_at``.
        """
        check_wait_record(record)
        check_not_keyring(record.namespace, f"storing a wait record of stack {record.stack_id!r}")
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        self._require_open()
        await self._do_save_wait_record(record, ttl_ms=ttl_ms)

    async def create_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> bool:
        """Store ``record`` exactly as given — its status, claim, lease and event payload —
        unless a live record already has its correlation key in its namespace.

        ``True`` if this call stored it; ``False`` if a record was there, which is left
        as it was. Atomic: of concurrent creates of one key, one stores. ``ttl_ms`` as in
        :meth:`save_wait_record`. This is how ``siglo import`` brings a wait over
        without ever replacing one the store already has (delivered or claimed since).
        """
        check_wait_record(record)
        check_not_keyring(record.namespace, f"storing a wait record of stack {record.stack_id!r}")
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        self._require_open()
        return await self._do_create_wait_record(record, ttl_ms=ttl_ms)

    async def get_wait_record(
        self, correlation_key_or_stack_id: str, *, namespace: str | None = None
    ) -> WaitRecord | None:
        """The record with this correlation key, else the latest saved for this stack id.

        Wait records are scoped by the namespace of their stack (``record.namespace``):
        ``namespace`` names it (``None``: an un-namespaced stack, the seed's keys), and a
        record of one namespace is never seen, claimed or changed from another.
        """
        require_id("correlation_key_or_stack_id", correlation_key_or_stack_id)
        require_optional_id("namespace", namespace)
        self._require_open()
        try:
            return await self._do_get_wait_record(correlation_key_or_stack_id, namespace)
        except OutcomeUnknownError as exc:
            raise read_failure(exc) from (exc.__cause__ or exc)

    async def claim_wait_record(
        self,
        correlation_key: str,
        claimant_id: str | None = None,
        *,
        allow_expired: bool = False,
        event_payload: Any = MISSING,
        lease_ms: int | None = None,
        namespace: str | None = None,
    ) -> WaitRecord | None:
        """Atomically move one record from ``waiting`` to ``claimed``.

        Returns the claimed record, or ``None`` when it cannot be claimed (missing,
        completed, cancelled, claimed under a live lease by another claimant, or past its
        deadline without ``allow_expired``). Exactly one concurrent caller wins.
        ``namespace``: the namespace of the record's stack (see :meth:`get_wait_record`).
        """
        require_id("correlation_key", correlation_key)
        require_optional_id("claimant_id", claimant_id)
        require_optional_id("namespace", namespace)
        require_lease_ms("lease_ms", lease_ms, optional=True)
        if event_payload is not MISSING:
            codec.dumps(event_payload, what="event_payload")  # JSON data, or refused here
        self._require_open()
        return await self._do_claim_wait_record(
            correlation_key,
            # Resolved here, so every backend gives an anonymous claim a fresh identity.
            claimant_id or uuid.uuid4().hex,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )

    async def complete_wait_record(
        self, correlation_key: str, claimant_id: str, *, namespace: str | None = None
    ) -> None:
        """Mark a claimed record completed; only its claimant may.

        Raises :class:`~siglo.errors.WaitRecordClaimError` otherwise, changing nothing.
        ``namespace``: the namespace of the record's stack (see :meth:`get_wait_record`).
        """
        require_id("correlation_key", correlation_key)
        require_id("claimant_id", claimant_id)
        require_optional_id("namespace", namespace)
        self._require_open()
        await self._do_complete_wait_record(correlation_key, claimant_id, namespace)

    async def release_wait_record(
        self, correlation_key: str, claimant_id: str, *, namespace: str | None = None
    ) -> bool:
        """Give a claim back: a record claimed by ``claimant_id`` is ``waiting`` again.

        Atomic, and only for the claimant: ``True`` if this call released it; ``False``
        (nothing changed) when the record is missing, not claimed, or claimed by another.
        Its claimant, claim time and lease are cleared; the event payload is kept.
        For a delivery that was refused before it used the event. ``namespace``: the
        namespace of the record's stack (see :meth:`get_wait_record`).
        """
        require_id("correlation_key", correlation_key)
        require_id("claimant_id", claimant_id)
        require_optional_id("namespace", namespace)
        self._require_open()
        return await self._do_release_wait_record(correlation_key, claimant_id, namespace)

    async def cancel_wait_record(
        self, correlation_key: str, *, namespace: str | None = None
    ) -> bool:
        """Cancel a waiting or claimed record; ``True`` if it was cancelled by this call.

        ``namespace``: the namespace of the record's stack (see :meth:`get_wait_record`).
        """
        require_id("correlation_key", correlation_key)
        require_optional_id("namespace", namespace)
        self._require_open()
        return await self._do_cancel_wait_record(correlation_key, namespace)

    async def cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        """Cancel every open wait of the stack and mark its checkpoint ``cancelled``."""
        require_id("stack_id", stack_id)
        require_optional_id("namespace", namespace)
        check_not_keyring(namespace, f"cancelling stack {stack_id!r}")
        self._require_open()
        await self._do_cancel_workflow(stack_id, namespace)

    async def with_workflow_lock(
        self,
        stack_id: str,
        action: Callable[[], Awaitable[T]],
        *,
        timeout_ms: int | None = None,
        namespace: str | None = None,
    ) -> T:
        """Run ``action`` holding the lock of the run ``stack_id`` in ``namespace``; two
        actions of one run never overlap, and runs of other namespaces (or none) under
        the same stack id never wait for each other.

        Waits up to ``timeout_ms`` (``None``: the adapter's default) for the lock, then
        raises :class:`~siglo.errors.LockNotAcquiredError`. The backend's
        ``_do_with_workflow_lock`` is given :func:`siglo.locking.workflow_lock_key`
        (the stack id itself when there is no namespace) as the key to lock.
        """
        require_id("stack_id", stack_id)
        require_optional_id("namespace", namespace)
        check_not_keyring(namespace, f"locking stack {stack_id!r}")
        require_ttl_ms("timeout_ms", timeout_ms, optional=True)
        self._require_open()
        key = workflow_lock_key(stack_id, namespace)
        return await self._do_with_workflow_lock(key, action, timeout_ms=timeout_ms)

    # -- 4. step cache ---------------------------------------------------------------

    async def get_cached_step(self, key: str, *, namespace: str | None = None) -> Any | Missing:
        """The value cached under ``key`` in ``namespace``, or :data:`~siglo.MISSING` (a
        cached ``None`` is a hit). Each namespace has its own entries: a key cached in one
        is a miss in another and without a namespace. The backend's
        ``_do_get_cached_step`` is given :func:`siglo.locking.namespaced_key` (the key
        itself when there is no namespace)."""
        require_id("key", key)
        require_optional_id("namespace", namespace)
        self._require_open()
        try:
            return await self._do_get_cached_step(namespaced_key(key, namespace))
        except OutcomeUnknownError as exc:
            raise read_failure(exc) from (exc.__cause__ or exc)

    async def set_cached_step(
        self, key: str, value: Any, ttl_ms: int | None = None, *, namespace: str | None = None
    ) -> None:
        """Cache ``value`` under ``key`` in ``namespace`` for ``ttl_ms`` (``None``: the
        adapter's default); see :meth:`get_cached_step`."""
        require_id("key", key)
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        require_optional_id("namespace", namespace)
        check_not_keyring(namespace, f"caching step {key!r}")
        self._require_open()
        await self._do_set_cached_step(namespaced_key(key, namespace), value, ttl_ms)

    # -- stored payloads (siglo rekey) -------------------------------------------------

    def scan_payloads(self, kind: PayloadKind) -> AsyncIterator[StoredPayload]:
        """Every live stand-alone wait record (``kind="wait"``), cached step
        (``"step"``) or context-change stream value (``"context"``, on a backend whose
        :attr:`payload_kinds` has it; else :class:`~siglo.errors.CapabilityNotSupportedError`)
        that holds a payload, with its payloads as stored (:mod:`siglo.payloads`): each
        stored copy once (Redis also keeps the seed's copy of a wait record at its stack
        id's key, and lists it too). Records written or removed during the walk may or may
        not be listed."""
        if kind not in (*PAYLOAD_KINDS, CONTEXT_KIND):
            raise InvalidArgumentError(
                f"kind must be one of {', '.join(map(repr, (*PAYLOAD_KINDS, CONTEXT_KIND)))}, "
                f"got {kind!r}"
            )
        self._require_listed(kind)
        self._require_open()
        return self._do_scan_payloads(kind)

    def _require_listed(self, kind: str) -> None:
        # Checked here, before the backend's hook: one written before streams were listed
        # would walk (or rewrite) another kind of record for "context".
        if kind not in self.payload_kinds:
            what = "context-change streams" if kind == CONTEXT_KIND else f"{kind} records"
            raise CapabilityNotSupportedError(
                f"storage adapter {self.name!r} does not list its {what} (payload_kinds)"
            )

    async def swap_payload(self, item: StoredPayload, fields: Mapping[str, Any]) -> bool:
        """Replace the payloads of the record ``item`` was listed from with ``fields``
        (the same field names as ``item.fields``) — only if the record still holds what
        it held when listed; ``False`` (nothing changed) if it changed, expired or went
        meanwhile. Nothing else of the record (status, claim, expiry) changes."""
        if not isinstance(item, StoredPayload):
            raise InvalidArgumentError(
                f"item must be a siglo.payloads.StoredPayload, got {type(item).__name__}"
            )
        if set(fields) != set(item.fields):
            raise InvalidArgumentError(
                f"fields must be the payload fields listed ({sorted(item.fields)}), got "
                f"{sorted(fields)}"
            )
        metadata = fields.get("metadata")
        if item.kind == "wait" and metadata is not None and not isinstance(metadata, dict):
            raise InvalidArgumentError(
                f"a wait record's metadata must be an object, got {type(metadata).__name__}"
            )
        self._require_listed(item.kind)
        self._require_open()
        return await self._do_swap_payload(item, dict(fields))

    async def delete_payload(self, item: StoredPayload) -> bool:
        """Remove the record ``item`` was listed from — only if it still holds what it
        held when listed; ``False`` (nothing removed) if it changed, expired or went
        meanwhile (``siglo erase``)."""
        if not isinstance(item, StoredPayload):
            raise InvalidArgumentError(
                f"item must be a siglo.payloads.StoredPayload, got {type(item).__name__}"
            )
        if item.kind not in PAYLOAD_KINDS:
            raise InvalidArgumentError(
                f"item.kind must be one of {', '.join(map(repr, PAYLOAD_KINDS))}, got {item.kind!r}"
            )
        self._require_open()
        return await self._do_delete_payload(item)

    # -- 5. telemetry ------------------------------------------------------------------

    async def on_cache_event(self, event: CacheEvent) -> None:
        """Accept a cache telemetry event; it never changes stored state."""
        if not isinstance(event, CacheEvent):
            raise InvalidArgumentError(
                f"event must be a siglo.CacheEvent, got {type(event).__name__}"
            )
        self._require_open()
        await self._do_on_cache_event(event)

    # -- 6. operating what is stored (SPEC §9) -----------------------------------------

    async def list_checkpoints(
        self,
        *,
        namespace: str | Missing | None = MISSING,
        status: str | Iterable[str] | None = None,
        workflow_id: str | None = None,
        updated_before: int | None = None,
        updated_after: int | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        cursor: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointPage:
        """A page of summaries of the live checkpoints that pass every filter.

        ``namespace`` omitted lists every namespace, ``None`` the un-namespaced stacks
        only. ``status`` is one status or several; ``updated_after < timestamp <
        updated_before``. Pass a page's ``next_cursor`` as ``cursor`` for the next page
        (``None`` when the walk is done). Pages follow a fixed order of the backend, so a
        stack is never returned twice in one walk, and an expired or deleted stack never.
        ``metadata`` keeps the stacks whose metadata fields equal these values
        (:mod:`siglo.blind`: read from each stored document; through an encrypting
        connection, by the blind index).
        """
        if metadata is not None:
            return await list_matching(
                self,
                metadata,
                indexed=frozenset(),
                index_key=None,
                namespace=namespace,
                status=status,
                workflow_id=workflow_id,
                updated_before=updated_before,
                updated_after=updated_after,
                limit=limit,
                cursor=cursor,
            )
        query = _check_list_arguments(
            namespace=namespace,
            status=status,
            workflow_id=workflow_id,
            updated_before=updated_before,
            updated_after=updated_after,
            limit=limit,
            cursor=cursor,
        )
        # The keyrings are siglo's, not the application's (siglo.reserved).
        check_not_keyring_listing(namespace)
        self._require_open()
        try:
            page = await self._do_list_checkpoints(query)
        except OutcomeUnknownError as exc:
            raise read_failure(exc) from (exc.__cause__ or exc)
        return without_keyrings(page) if namespace is MISSING else page

    async def list_checkpoints_by_index(
        self,
        tokens: Mapping[str, str],
        *,
        namespace: str | None,
        status: str | Iterable[str] | None = None,
        workflow_id: str | None = None,
        updated_before: int | None = None,
        updated_after: int | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        cursor: str | None = None,
    ) -> CheckpointPage:
        """A page of the live checkpoints of ``namespace`` that pass the other filters and
        whose stored blind-index tokens (the metadata's ``$sigloIndex``, written by the
        pipeline: :mod:`siglo.blind`) hold every ``field: token`` of ``tokens``.

        Tokens are per namespace, so the namespace is named (``None``: un-namespaced).
        Paging is ``list_checkpoints``' (a stack is never returned twice in one walk). A
        backend answers it from an index kept in step with every write (the SQL backends,
        Redis) or by reading each listed stack (:func:`siglo.blind.scan_tokens`, the
        default)."""
        wanted = check_tokens(tokens)
        query = _check_list_arguments(
            namespace=namespace,
            status=status,
            workflow_id=workflow_id,
            updated_before=updated_before,
            updated_after=updated_after,
            limit=limit,
            cursor=cursor,
        )
        self._require_open()
        try:
            return await self._do_list_by_index(query, wanted)
        except OutcomeUnknownError as exc:
            raise read_failure(exc) from (exc.__cause__ or exc)

    async def delete_checkpoint(
        self,
        stack_id: str,
        namespace: str | None = None,
        *,
        expected_revision: int | None = None,
    ) -> bool:
        """Delete a stack: its checkpoint, its wait records and its context streams.

        With ``expected_revision`` the live stored revision must equal it, else
        :class:`~siglo.errors.CheckpointConflictError` and nothing changes. Returns
        whether a live checkpoint was deleted. The step cache, keyed by cache key rather
        than by stack, is not touched.
        """
        require_id("stack_id", stack_id)
        require_optional_id("namespace", namespace)
        check_not_keyring(namespace, f"deleting stack {stack_id!r}")
        if expected_revision is not None and (
            type(expected_revision) is not int or not 1 <= expected_revision < 2**63
        ):
            raise InvalidArgumentError(
                "expected_revision must be a positive integer below 2**63 (a stored "
                f"revision), got {expected_revision!r}"
            )
        self._require_open()
        return await self._do_delete_checkpoint(stack_id, namespace, expected_revision)

    async def list_due_waits(self, *, limit: int = DEFAULT_PAGE_SIZE) -> list[WaitRecord]:
        """Wait records whose deadline ``expires_at`` has passed and that nobody holds
        (``waiting``, or ``claimed`` under a lapsed lease), earliest deadline first, at
        most ``limit``. What a timer worker fires."""
        if type(limit) is not int or not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidArgumentError(
                f"limit must be an integer from 1 to {MAX_PAGE_SIZE}, got {limit!r}"
            )
        self._require_open()
        try:
            return await self._do_list_due_waits(limit)
        except OutcomeUnknownError as exc:
            raise read_failure(exc) from (exc.__cause__ or exc)

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        raise self._unsupported("list_checkpoints")

    async def _do_list_by_index(self, query: ListQuery, tokens: dict[str, str]) -> CheckpointPage:
        # No index of its own: read each stack the listing passes.
        return await scan_tokens(self, query, tokens)

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        raise self._unsupported("delete_checkpoint")

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        raise self._unsupported("list_due_waits")

    # -- life cycle --------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release connections; afterwards every call raises
        :class:`~siglo.errors.StorageAdapterError`. An adapter that overrides it calls
        ``await super().aclose()`` (a backend's ``aclose()`` marks it closed anyway)."""
        self.mark_closed()

    def _describe_part(self) -> str:
        return f"storage adapter {self.name!r}"

    # -- hooks a backend implements (arguments already checked) ----------------------

    async def _do_on_context_change(self, event: ContextChangeEvent) -> None:
        raise self._unsupported("on_context_change")

    async def _do_get_context_changes(
        self, stack_id: str, step_id: str, namespace: str | None
    ) -> dict[str, Any]:
        raise self._unsupported("get_context_changes")

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None
    ) -> None:
        raise self._unsupported("save_checkpoint")

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None, *, fallback: bool
    ) -> Checkpoint | None:
        raise self._unsupported("get_checkpoint")

    async def _do_clean_expired_checkpoints(self) -> int:
        raise self._unsupported("clean_expired_checkpoints")

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None) -> None:
        raise self._unsupported("save_wait_record")

    async def _do_create_wait_record(self, record: WaitRecord, *, ttl_ms: int | None) -> bool:
        raise self._unsupported("create_wait_record")

    async def _do_get_wait_record(
        self, correlation_key_or_stack_id: str, namespace: str | None
    ) -> WaitRecord | None:
        raise self._unsupported("get_wait_record")

    async def _do_claim_wait_record(
        self,
        correlation_key: str,
        claimant_id: str,
        *,
        allow_expired: bool,
        event_payload: Any,
        lease_ms: int | None,
        namespace: str | None,
    ) -> WaitRecord | None:
        raise self._unsupported("claim_wait_record")

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None
    ) -> None:
        raise self._unsupported("complete_wait_record")

    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None
    ) -> bool:
        raise self._unsupported("release_wait_record")

    async def _do_cancel_wait_record(self, correlation_key: str, namespace: str | None) -> bool:
        raise self._unsupported("cancel_wait_record")

    async def _do_cancel_workflow(self, stack_id: str, namespace: str | None) -> None:
        raise self._unsupported("cancel_workflow")

    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None
    ) -> T:
        """``action`` under :attr:`workflow_lock` (key: ``stack_id``, which is
        :func:`~siglo.locking.workflow_lock_key` of the run's stack id and namespace),
        its lease renewed while it runs; unsupported without one."""
        lock = self.workflow_lock
        if lock is None:
            raise self._unsupported("with_workflow_lock")
        return await run_with_lock(
            lock,
            stack_id,
            action,
            ttl_ms=self.workflow_lock_ttl_ms,
            timeout_ms=timeout_ms or self.workflow_lock_timeout_ms,
        )

    async def _do_get_cached_step(self, key: str) -> Any | Missing:
        raise self._unsupported("get_cached_step")

    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None) -> None:
        raise self._unsupported("set_cached_step")

    def _do_scan_payloads(self, kind: PayloadKind) -> AsyncIterator[StoredPayload]:
        raise self._unsupported("scan_payloads")

    async def _do_swap_payload(self, item: StoredPayload, fields: dict[str, Any]) -> bool:
        raise self._unsupported("swap_payload")

    async def _do_delete_payload(self, item: StoredPayload) -> bool:
        raise self._unsupported("delete_payload")

    async def _do_on_cache_event(self, event: CacheEvent) -> None:
        raise self._unsupported("on_cache_event")
