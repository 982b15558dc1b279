"""The storage manager: live execution stacks, snapshots and the adapter behind them.

What an adapter failure does is in :mod:`siglo.error_modes`, background failures wait
in :mod:`siglo.deferred_failures`, snapshots are built in :mod:`siglo.snapshots`, and
this module keeps the manager's API and the process-wide default manager.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.backend import Backend
from siglo.background import SerialJobs
from siglo.checkpoint import Checkpoint
from siglo.clock import Clock, clock_or_system
from siglo.config import Settings, current_settings, effective_settings, settings_generation
from siglo.deferred_failures import DeferredFailures, StackKey
from siglo.error_modes import (
    ERROR_MODES,
    ErrorMode,
    StorageWarning,
    check_error_mode,
    default_error_mode,
    surfaced_failure,
)
from siglo.errors import (
    AmbiguousStackError,
    CheckpointConflictError,
    DocumentTooLargeError,
    InvalidArgumentError,
    NotJSONError,
    ReservedFormError,
    UnknownStackError,
)
from siglo.records import ContextChangeEvent, ContextOp
from siglo.redaction import check_redact_fields, redact, redacting
from siglo.sealing import refuse_unopened
from siglo.snapshots import context_change_event, restore_stack, take_snapshot
from siglo.stack import ExecutionStack
from siglo.unsent import unsent
from siglo.validation import require_id, require_optional_id

__all__ = [
    # ERROR_MODES, ErrorMode, StorageWarning, default_error_mode live in
    # siglo.error_modes; re-exported so their first import path keeps working.
    "ERROR_MODES",
    "ErrorMode",
    "StorageManager",
    "StorageWarning",
    "default_error_mode",
    "default_storage_manager",
    "use_storage",
]


class StorageManager:
    """Owns live execution stacks and persists their snapshots through an adapter.

    ``error_mode`` decides what an adapter failure does (seed 000 §5): ``"best-effort"``
    swallows it, ``"warn"`` logs it to the ``siglo`` logger and issues a
    :class:`StorageWarning`, ``"strict"`` raises :class:`~siglo.errors.StorageAdapterError`
    — for a background save or stream, once, from the next awaited manager call for that
    stack or from :meth:`flush`. A :class:`~siglo.errors.CheckpointConflictError` is
    raised in every mode. ``namespace_fallback`` lets a namespaced load fall back to the
    un-namespaced checkpoint, as the seed does.

    ``redact_fields`` names context keys whose values never leave the process: they are
    ``"[REDACTED]"``, at any depth, in every snapshot, in the context-change stream and
    in event payloads a flow stores in wait records. Keys a stack was created with, or
    that a :meth:`checkpoint` call named, are redacted from then on for that stack too.

    Without an explicit ``error_mode`` the manager is ``"strict"`` over a durable adapter
    (every backend but ``memory://``) and ``"best-effort"`` over ``memory://`` or no
    adapter — a deliberate difference from the TypeScript original, whose default is
    always ``best-effort``: a user who connected a database never loses data silently.
    The default follows :meth:`use_storage` until a mode is set explicitly.
    """

    def __init__(
        self,
        adapter: StorageAdapter | Backend | None = None,
        *,
        settings: Settings | None = None,
        error_mode: ErrorMode | None = None,
        clock: Clock | None = None,
        namespace_fallback: bool | None = None,
        redact_fields: Collection[str] = (),
    ) -> None:
        if settings is not None and not isinstance(settings, Settings):
            raise InvalidArgumentError(
                f"settings must be a siglo.Settings, got {type(settings).__name__}"
            )
        # Given settings still redact what the file and the environment name.
        self._settings = None if settings is None else effective_settings(settings)
        # The process's settings as last read, for a manager given none (re-read when
        # settings_generation() moves: a cheap check on the hot path).
        self._followed: tuple[int, Settings] | None = None
        self._adapter: StorageAdapter | None = None
        self._backend: Backend | None = None
        # Keys named here are redacted on top of the settings' (never instead of them).
        self._extra_fields = check_redact_fields(redact_fields)
        self._explicit_mode: ErrorMode | None = None
        if namespace_fallback is not None and type(namespace_fallback) is not bool:
            # Any value was taken and its truth used: "false" meant True, and a tenant's
            # reads fell back to the stacks saved without a namespace (a black-box
            # auditor). None is "the settings' value".
            raise InvalidArgumentError(
                f"namespace_fallback must be True, False or None (the settings'), "
                f"got {namespace_fallback!r}"
            )
        self._fallback = namespace_fallback
        self.use_storage(adapter)
        if error_mode is not None:
            if not isinstance(error_mode, str) or error_mode not in ERROR_MODES:
                # Refused naming the argument, and before the look-up among the modes
                # for a value that is not text: an unhashable one (a list) failed it
                # with a bare TypeError that named nothing.
                raise InvalidArgumentError(
                    f"error_mode must be one of {', '.join(sorted(ERROR_MODES))} or None, "
                    f"got {error_mode!r}"
                )
            self.set_error_mode(error_mode)
        self.clock: Clock = clock_or_system(clock)
        # The latest live stack of each id, and every live stack of each id: two callers
        # sharing the manager may each hold one (see _one_live).
        self._stacks: dict[str, ExecutionStack] = {}
        # Weak references, not a WeakSet: one is made for every run, and a WeakSet (its
        # own callback and guards) cost a third of creating and discarding a stack.
        self._live: dict[str, list[weakref.ref[ExecutionStack]]] = {}
        self._jobs = SerialJobs()
        # Context changes of each stack whose stream job has not started yet, oldest
        # first: the next save of the stack may send them with its checkpoint.
        self._unstreamed: dict[StackKey, list[_Unstreamed]] = {}
        # One background failure per stored stack (namespace and id), raised once (SPEC §4).
        self._deferred = DeferredFailures()

    # -- configuration -------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings this manager follows: those it was given, else the process's
        (:func:`siglo.config.current_settings`, followed as they change)."""
        if self._settings is not None:
            return self._settings
        followed = self._followed
        if followed is None or followed[0] != settings_generation():
            settings = current_settings()
            self._followed = followed = (settings_generation(), settings)
        return followed[1]

    @property
    def adapter(self) -> StorageAdapter | None:
        """The storage adapter in use (``None``: snapshots are taken but not stored)."""
        return self._adapter

    def use_storage(self, adapter: StorageAdapter | Backend | None) -> None:
        """Store through ``adapter`` (or a :class:`~siglo.Backend`'s adapter) from now on."""
        backend = adapter if isinstance(adapter, Backend) else None
        if isinstance(adapter, Backend):
            adapter = adapter.adapter
        if adapter is not None and not isinstance(adapter, StorageAdapter):
            raise InvalidArgumentError(
                f"use_storage() takes a siglo.StorageAdapter or siglo.Backend, "
                f"got {type(adapter).__name__}"
            )
        self._adapter = adapter
        self._backend = backend

    @property
    def backend(self) -> Backend | None:
        """The :class:`~siglo.Backend` this manager stores through, with its idempotency
        store, lock and nonce store; ``None`` when it was given a bare adapter."""
        return self._backend

    @property
    def error_mode(self) -> ErrorMode:
        """The error mode in effect: the one set explicitly (argument or
        :meth:`set_error_mode`), else the settings', else the safe default of
        :func:`default_error_mode` for the adapter in use."""
        if self._explicit_mode is not None:
            return self._explicit_mode
        configured = self.settings.error_mode
        if configured is not None:
            return check_error_mode(configured)
        return default_error_mode(self._adapter)

    def set_error_mode(self, mode: ErrorMode) -> None:
        """Set the error mode: ``"best-effort"``, ``"warn"`` or ``"strict"``.

        An explicit mode wins over the settings and the default from then on.
        """
        self._explicit_mode = check_error_mode(mode)

    @property
    def namespace_fallback(self) -> bool:
        """Whether a namespaced load falls back to the un-namespaced checkpoint: the value
        given to the manager, else the settings'."""
        if self._fallback is not None:
            return self._fallback
        return self.settings.namespace_fallback

    @namespace_fallback.setter
    def namespace_fallback(self, value: bool) -> None:
        if type(value) is not bool:
            raise InvalidArgumentError(f"namespace_fallback must be a bool, got {value!r}")
        self._fallback = value

    @property
    def redact_fields(self) -> frozenset[str]:
        """Context keys redacted from everything every stack sends out: the settings'
        and those given to the manager (see the class)."""
        configured = self.settings.redact_fields
        return configured | self._extra_fields if self._extra_fields else configured

    def set_redact_fields(self, fields: Collection[str]) -> None:
        """Replace the keys this manager redacts on top of the settings' (stacks keep the
        ones they added; the settings' are always redacted)."""
        self._extra_fields = check_redact_fields(fields)

    def redact(self, value: Any, stack_id: str | ExecutionStack | None = None) -> Any:
        """``value`` as siglo would store it: a copy with the redacted keys replaced.

        Uses the manager's keys, plus those of the live stack given — or, given an id, of
        every live stack of that id this manager holds (several callers sharing it, other
        tenants' runs of the same id among them, may each hold one: redacting by all of
        their keys never stores one in clear that one of them redacts).
        """
        if isinstance(stack_id, ExecutionStack):
            fields = self._fields_of(stack_id)
        else:
            fields = self._fields_of(None)
            for stack in self._live_of(stack_id) if stack_id is not None else ():
                fields = fields | self._fields_of(stack)
        return redact(value, fields) if fields else value

    async def redact_event(
        self, correlation_key: str, payload: Any, *, namespace: str | None = None
    ) -> Any:
        """``payload`` as the wait record of ``correlation_key`` (in ``namespace``) stores
        it when the event is delivered: redacted by this manager's keys and by the waiting
        run's own (its checkpoint's ``redactFields``, which travel with the data), so a
        process delivering without the application's settings — a webhook handler, the
        dashboard — stores no key the application redacts. The claim stores the payload
        before the run is restored, so the run is read first (two reads): its keys, and
        whether this process can open it at all — a run stored encrypted, read without
        the keys, raises :class:`~siglo.errors.DecryptionError` here, before the claim
        writes the payload in clear beside its ciphertext."""
        fields = self.redact_fields
        adapter = self._supports(Capability.WAIT_RECORDS)
        if adapter is not None and adapter.supports(Capability.CHECKPOINTS):
            waiting = await adapter.get_wait_record(correlation_key, namespace=namespace)
            if waiting is not None:
                stored = await adapter.get_checkpoint(waiting.stack_id, namespace, fallback=False)
                if stored is not None:
                    refuse_unopened(stored)
                fields = redacting(stored, fields)
        return redact(payload, fields) if fields else payload

    def _fields_of(self, stack: ExecutionStack | None) -> frozenset[str]:
        fields = self.redact_fields
        if stack is None or not stack.redact_fields:
            return fields
        return fields | stack.redact_fields

    def _supports(self, capability: Capability) -> StorageAdapter | None:
        adapter = self._adapter
        return adapter if adapter is not None and adapter.supports(capability) else None

    # -- live stacks -----------------------------------------------------------------------

    def create_stack(
        self,
        stack_id: str | None = None,
        *,
        workflow_id: str | None = None,
        namespace: str | None = None,
        type: str = "execution",
        metadata: Mapping[str, Any] | None = None,
        redact_fields: Collection[str] = (),
    ) -> ExecutionStack:
        """Start a live stack (``stack_id`` defaults to a new UUID) with status running.

        ``redact_fields`` adds keys redacted from everything this stack sends out, on top
        of the manager's.
        """
        stack_id = require_id("stack_id", stack_id if stack_id is not None else str(uuid.uuid4()))
        require_optional_id("workflow_id", workflow_id)
        require_optional_id("namespace", namespace)
        require_id("type", type)
        fields = check_redact_fields(redact_fields)
        # Another caller may hold a live stack of this id (a request of a web
        # application sharing this manager, another tenant's run): that is no reason to
        # refuse this one. Whose save is stored is the compare-and-set's to decide, as
        # for stacks resumed twice (id-based calls then refuse as ambiguous).
        stack = ExecutionStack(
            stack_id=stack_id,
            manager=self,
            workflow_id=workflow_id,
            namespace=namespace,
            type=type,
            metadata=dict(metadata or {}),
            redact_fields=fields,
        )
        self._register(stack)
        return stack

    def _register(self, stack: ExecutionStack) -> None:
        self._stacks[stack.stack_id] = stack
        refs = self._live.get(stack.stack_id)
        if refs is None:
            self._live[stack.stack_id] = [weakref.ref(stack)]
            return
        # The dead ones go here too: an id resumed again and again that no id-based call
        # names (which prunes them) would otherwise keep a reference a resume.
        refs[:] = [ref for ref in refs if ref() is not None]
        refs.append(weakref.ref(stack))

    def _live_of(self, stack_id: str) -> list[ExecutionStack]:
        """Every live stack of ``stack_id`` some caller still holds (the latest one is
        held by the manager until discarded)."""
        refs = self._live.get(stack_id)
        if not refs:
            self._live.pop(stack_id, None)
            return []
        live = [stack for ref in refs if (stack := ref()) is not None]
        if not live:
            del self._live[stack_id]
        elif len(live) != len(refs):
            self._live[stack_id] = [weakref.ref(stack) for stack in live]
        return live

    def _one_live(self, stack_id: str) -> ExecutionStack:
        """The live stack of ``stack_id`` an id-based call means: the only one.

        Two callers sharing this manager (two requests of a web application) can each hold
        a live stack of the same id; a call that names only the id could then act on the
        other caller's stack — save it, acknowledge it — so it is refused instead.
        """
        live = self._live_of(stack_id)
        if len(live) > 1:
            raise AmbiguousStackError(
                f"{len(live)} live stacks of {stack_id!r} are held in this manager (another "
                "caller created, resumed or restored the same id): save the stack object itself, "
                "with `await stack.save(...)` or `manager.save(stack, ...)`"
            )
        if not live:
            raise UnknownStackError(f"no live stack with id {stack_id!r}")
        # The one a caller still holds, which need not be the latest: another caller
        # may have discarded that one since.
        return live[0]

    def _stack(self, stack: str | ExecutionStack) -> ExecutionStack:
        """``stack`` itself (it must be one of this manager's), or the one live stack of
        the id (:meth:`_one_live`)."""
        if isinstance(stack, ExecutionStack):
            if stack.manager is not self:
                raise InvalidArgumentError(
                    f"stack {stack.stack_id!r} belongs to another manager; save it there"
                )
            return stack
        return self._one_live(stack)

    def get_stack(self, stack_id: str) -> ExecutionStack:
        """The live stack with this id; raises :class:`~siglo.errors.UnknownStackError`,
        or :class:`~siglo.errors.AmbiguousStackError` when several callers hold one."""
        return self._one_live(stack_id)

    def discard_stack(self, stack_id: str | ExecutionStack) -> None:
        """Forget a live stack (its stored checkpoints stay): the stack object given, or
        the one live stack of the id given — when several callers hold one, an id could
        mean another caller's, and :class:`~siglo.errors.AmbiguousStackError` is raised
        (discard the stack object itself)."""
        if isinstance(stack_id, ExecutionStack):
            stack = stack_id
            if self._stacks.get(stack.stack_id) is stack:
                del self._stacks[stack.stack_id]
            refs = self._live.get(stack.stack_id)
            if refs is not None:
                kept = [ref for ref in refs if (held := ref()) is not None and held is not stack]
                if kept:
                    self._live[stack.stack_id] = kept
                else:
                    del self._live[stack.stack_id]
            return
        holders = len(self._live_of(stack_id))
        if holders > 1:
            raise AmbiguousStackError(
                f"{holders} live stacks of {stack_id!r} are held in this manager (another caller "
                "created, resumed or restored the same id): discard the stack object itself, with "
                "`manager.discard_stack(stack)`"
            )
        self._stacks.pop(stack_id, None)
        self._live.pop(stack_id, None)

    @property
    def stacks(self) -> Mapping[str, ExecutionStack]:
        """The latest live stack of each id (read-only view)."""
        return dict(self._stacks)

    def stream_context_change(
        self, stack: ExecutionStack, step_id: str, key: str, value: Any, op: ContextOp
    ) -> None:
        """Stream one change of a stack's context to the adapter, in the background.

        Called by :meth:`ExecutionStack.set` and :meth:`ExecutionStack.delete` (the
        :class:`~siglo.stack.ContextStream` protocol); failures follow the error mode.
        """
        adapter = self._supports(Capability.CONTEXT_STREAM)
        if adapter is None:
            return
        revision = stack.revision
        now = self.clock.now_ms()
        stack_id = stack.stack_id
        stored = (stack.namespace, stack_id)

        def build() -> ContextChangeEvent:
            # Redacted here, in the job, like the encoding: a value too deep to redact
            # fails this stream (raised for the stack), not the caller's set(). By the
            # keys redacted when it is sent, which only grow: a key named on a save
            # after this set() (redact_fields=) is redacted here too.
            return context_change_event(
                stack,
                step_id,
                key,
                value,
                op,
                fields=self._fields_of(stack),
                revision=revision,
                timestamp=now,
            )

        change = _Unstreamed(build)
        self._unstreamed.setdefault(stored, []).append(change)

        async def stream() -> None:
            if change.taken:
                return  # sent with a checkpoint (save_checkpoint)
            change.taken = True
            pending = self._unstreamed.get(stored)
            if pending and pending[0] is change:  # jobs of a stack start in order
                del pending[0]
                if not pending:
                    del self._unstreamed[stored]
            try:
                await adapter.on_context_change(change.build())
            except Exception as exc:
                self._handle_failure(
                    exc, f"streaming a context change of {stack_id!r}", background=stored
                )

        if _writes_together(adapter):
            # Deferred to the loop's next turn: a save of the stack right after the
            # change (a flow's step checkpoint) takes it first, and the job then costs
            # no task. Elsewhere a save streams it first anyway: no deferral.
            self._jobs.defer(stack_id, stream, change.untaken)
        else:
            self._jobs.submit(stack_id, stream)

    def _take_unstreamed(self, key: StackKey) -> list[_Unstreamed]:
        """The stack's context changes whose stream has not started, now the caller's."""
        taken = [c for c in self._unstreamed.pop(key, ()) if not c.taken]
        for change in taken:
            change.taken = True
        return taken

    def _requeue(self, key: StackKey, changes: list[_Unstreamed]) -> None:
        """``changes`` (taken by a save that wrote nothing) ahead of the stack's changes
        not streamed yet, for its next save to take."""
        if not changes:
            return
        for change in changes:
            change.taken = False
        self._unstreamed[key] = [*changes, *self._unstreamed.get(key, ())]

    def _built(self, key: StackKey, changes: list[_Unstreamed]) -> list[ContextChangeEvent]:
        """The events of ``changes``; one that cannot be built fails as its stream job
        would have (deferred for the stack, raised by the caller's next check)."""
        events = []
        for change in changes:
            try:
                events.append(change.build())
            except Exception as exc:
                self._handle_failure(
                    exc, f"streaming a context change of {key[1]!r}", background=key
                )
        return events

    async def _stream_now(self, key: StackKey, events: list[ContextChangeEvent]) -> None:
        """Send ``events`` one by one, as their stream jobs would have."""
        adapter = self._supports(Capability.CONTEXT_STREAM)
        for event in events:
            try:
                if adapter is not None:
                    await adapter.on_context_change(event)
            except Exception as exc:
                self._handle_failure(
                    exc, f"streaming a context change of {key[1]!r}", background=key
                )

    # -- snapshots ------------------------------------------------------------------------

    def _scrub_stream(self, stack: ExecutionStack, redact_fields: Collection[str]) -> None:
        """Keys named on a save (``redact_fields=``, the seed's ``checkpoint(id,
        {redactFields})``) that the stack did not redact yet: the stack redacts them from
        now on, and every value of its contexts that holds one is streamed again,
        redacted, over what its ``set()`` streamed in clear (a stream keeps the latest
        value of each key). Bad names raise before anything changes."""
        if not redact_fields:
            return
        new = check_redact_fields(redact_fields) - self._fields_of(stack)
        if not new:
            return
        stack.redact_fields = stack.redact_fields | new
        if self._supports(Capability.CONTEXT_STREAM) is None:
            return
        for step_id, context in stack.contexts.items():
            for key, value in context.items():
                if key in new or redact(value, new) != value:
                    self.stream_context_change(stack, step_id, key, value, "set")

    def _snapshot(
        self,
        stack: ExecutionStack,
        expected_revision: int | None,
        redact_fields: Collection[str],
        ttl_ms: int | None,
    ) -> Checkpoint:
        return take_snapshot(
            stack,
            self.redact_fields,
            self.clock,
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
        )

    def checkpoint(
        self,
        stack_id: str | ExecutionStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
    ) -> Checkpoint:
        """Snapshot a live stack now and save it in the background.

        ``stack_id`` is the stack's id, when this manager holds one live stack of that id
        (:class:`~siglo.errors.AmbiguousStackError` when several callers hold one), or the
        stack object itself. The snapshot has the next revision, ``redact_fields`` replaced by
        ``"[REDACTED]"`` at any depth of the contexts (the live stack keeps them), and
        ``expires_at`` ``ttl_ms`` from now. With ``expected_revision`` the save is a
        compare-and-set against the stored revision. Saves of one stack reach the store
        in the order taken; a failure surfaces once, from the next awaited call for this
        stack or :meth:`flush` (a conflict always, an adapter failure in strict mode).
        """
        live = self._stack(stack_id)
        stack_id = live.stack_id
        key = (live.namespace, stack_id)
        read = live.revision
        self._scrub_stream(live, redact_fields)
        checkpoint = self._snapshot(live, expected_revision, redact_fields, ttl_ms)
        adapter = self._supports(Capability.CHECKPOINTS)
        if adapter is not None:

            async def save() -> None:
                try:
                    if read > live.revision:
                        # Built on a snapshot whose own save was refused (the stack went
                        # back below it): its compare-and-set could match another
                        # writer's revision and overwrite that writer's save. Refused too.
                        raise CheckpointConflictError(
                            stack_id, None, expected_revision, checkpoint.revision
                        )
                    await adapter.save_checkpoint(checkpoint, expected_revision=expected_revision)
                except Exception as exc:
                    _back_if_refused(live, read, exc)
                    self._handle_failure(exc, f"saving checkpoint of {stack_id!r}", background=key)

            # Changes set before this snapshot stream before it: none is left for a
            # later save to send after it.
            self._unstreamed.pop(key, None)
            self._jobs.submit(stack_id, save)
        return checkpoint

    async def save(
        self,
        stack: ExecutionStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
        unlock: bool = False,
        cache_entry: CacheEntry | None = None,
    ) -> Checkpoint:
        """Snapshot ``stack`` — this very object — and wait until it is stored.

        The way to save in concurrent code: a manager shared by concurrent requests
        never saves (nor acknowledges) a stack another request holds, whatever ids they
        share. See :meth:`save_checkpoint` for the arguments and errors.
        """
        if not isinstance(stack, ExecutionStack):
            raise InvalidArgumentError(
                f"save() takes the live stack itself, got {type(stack).__name__}; "
                "save_checkpoint() takes an id"
            )
        return await self.save_checkpoint(
            stack,
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
            unlock=unlock,
            cache_entry=cache_entry,
        )

    async def save_checkpoint(
        self,
        stack_id: str | ExecutionStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
        unlock: bool = False,
        cache_entry: CacheEntry | None = None,
    ) -> Checkpoint:
        """Snapshot a live stack and wait until it is stored (see :meth:`checkpoint`).

        ``stack_id`` is the stack's id, when this manager holds one live stack of that
        id, or the stack object itself: when several callers hold one (a shared manager,
        two requests that resumed the same id) an id is refused with
        :class:`~siglo.errors.AmbiguousStackError` rather than saving another caller's
        stack — use :meth:`save` (or ``await stack.save()``) in concurrent code.

        Earlier background saves of the stack land first. Raises
        :class:`~siglo.errors.CheckpointConflictError` on a lost compare-and-set, and
        :class:`~siglo.errors.StorageAdapterError` on an adapter failure in strict mode.

        ``unlock=True`` says this save is the last write of the action that holds the
        stack's workflow lock (``adapter.with_workflow_lock``) in this task: nothing of
        the action may be written after it. A backend may then release the lock in the
        same transaction (PostgreSQL: one round trip fewer); elsewhere the lock is
        released when the action ends, as always. Without such a lock it changes nothing.

        ``cache_entry``: a step's cache entry (its value redacted already), stored with
        the checkpoint by :meth:`StorageAdapter.save_checkpoint_caching` — in one
        transaction where the backend can — whatever the compare-and-set decides; a
        failure to store it is handled as the save's, by the error mode.
        """
        live = self._stack(stack_id)
        stack_id = live.stack_id
        key = (live.namespace, stack_id)
        # On a backend that writes context changes and a checkpoint in one statement
        # (StorageAdapter.save_checkpoint_streamed overridden), the changes not streamed
        # yet go with the checkpoint: one round trip and one commit fewer per change, the
        # order kept. Elsewhere their jobs stream them first, as always.
        adapter = self._supports(Capability.CHECKPOINTS)
        together = adapter is not None and _writes_together(adapter)
        self._scrub_stream(live, redact_fields)
        taken = self._take_unstreamed(key) if together else []
        events = self._built(key, taken)
        await self._jobs.drain(stack_id)
        if events and not (adapter is not None and adapter.writes_with_checkpoint(events)):
            # Not these: streamed now, one by one, their failures handled on their own
            # and raised below, as their jobs' would have been.
            await self._stream_now(key, events)
            events, taken = [], []
        read = live.revision
        try:
            self._deferred.raise_for(key)
            checkpoint = self._snapshot(live, expected_revision, redact_fields, ttl_ms)
        except BaseException:
            await self._stream_now(key, events)  # as their jobs would have
            raise
        if adapter is not None:
            try:
                if cache_entry is not None:
                    await adapter.save_checkpoint_caching(
                        checkpoint,
                        events,
                        cache_entry,
                        expected_revision=expected_revision,
                        unlock=unlock,
                    )
                elif unlock:
                    await adapter.save_checkpoint_unlocking(
                        checkpoint, events, expected_revision=expected_revision
                    )
                elif events:
                    await adapter.save_checkpoint_streamed(
                        checkpoint, events, expected_revision=expected_revision
                    )
                else:
                    await adapter.save_checkpoint(checkpoint, expected_revision=expected_revision)
            except asyncio.CancelledError as exc:
                if unsent(exc):
                    # Cut off before anything of it was sent: nothing is stored, so the
                    # stack is back at its revision, as after a refused save (a delivery
                    # cut off here gives its claim back: siglo.workflow.flow).
                    live.revision = min(live.revision, read)
                raise
            except Exception as exc:
                _back_if_refused(live, read, exc)
                if isinstance(exc, WRITES_NOTHING):
                    # Refused before anything was written, its changes with it: they go
                    # with the stack's next save (the redacted re-streams of keys this
                    # save named among them, which no later save would make again: a
                    # black-box auditor found the clear values left in the stream).
                    self._requeue(key, taken)
                self._handle_failure(exc, f"saving checkpoint of {stack_id!r}")
        return checkpoint

    def restore_checkpoint(
        self,
        checkpoint: Checkpoint | Mapping[str, Any] | bytes | str,
        *,
        expected_namespace: str | None = None,
    ) -> ExecutionStack:
        """Make a checkpoint a live stack of its id, and return it.

        Accepts a :class:`Checkpoint`, a wire document or its JSON. Raises
        :class:`~siglo.errors.NamespaceMismatchError` when ``expected_namespace`` and the
        checkpoint's namespace are both present and differ, and
        :class:`~siglo.errors.CheckpointVersionError` for a storage schema above 2. A live
        stack of the same id that another caller still holds stays that caller's (save
        each through its own object: see :meth:`save`).
        """
        stack = restore_stack(checkpoint, self, expected_namespace=expected_namespace)
        self._register(stack)
        return stack

    async def load_checkpoint(
        self, stack_id: str, *, namespace: str | None = None
    ) -> Checkpoint | None:
        """The stored checkpoint of a stack, or ``None`` (also for a swallowed failure)."""
        require_id("stack_id", stack_id)
        require_optional_id("namespace", namespace)
        await self._jobs.drain(stack_id)
        self._deferred.raise_for((namespace, stack_id))
        adapter = self._supports(Capability.CHECKPOINTS)
        if adapter is None:
            return None
        try:
            found = await adapter.get_checkpoint(
                stack_id, namespace, fallback=self.namespace_fallback
            )
        except Exception as exc:
            self._handle_failure(exc, f"loading checkpoint of {stack_id!r}")
            return None
        if found is not None:
            refuse_unopened(found)
        return found

    async def resume(self, stack_id: str, *, namespace: str | None = None) -> ExecutionStack | None:
        """Load a stack's checkpoint and restore it as the live stack (``None`` if none)."""
        checkpoint = await self.load_checkpoint(stack_id, namespace=namespace)
        if checkpoint is None:
            return None
        return self.restore_checkpoint(checkpoint, expected_namespace=namespace)

    async def clean_expired_checkpoints(self) -> int:
        """Ask the adapter to remove expired checkpoints; returns how many it removed."""
        adapter = self._supports(Capability.CHECKPOINTS)
        if adapter is None:
            return 0
        try:
            return await adapter.clean_expired_checkpoints()
        except Exception as exc:
            self._handle_failure(exc, "cleaning expired checkpoints")
            return 0

    async def flush(self) -> None:
        """Wait for every background save and stream, then raise what they deferred.

        Raises the first stack's failure, with a note naming the other stacks that
        failed; every deferred failure is then cleared (each is raised once).
        """
        await self._jobs.drain()
        self._deferred.raise_all()

    # -- failures ---------------------------------------------------------------------------

    def _handle_failure(
        self, exc: Exception, doing: str, *, background: StackKey | None = None
    ) -> None:
        """Apply the error mode; ``background`` is the stack (namespace and id) of a
        background job, whose failure waits for that stack's next call or :meth:`flush`."""
        failure = surfaced_failure(exc, doing, self.error_mode)
        if failure is None:
            return
        if background is not None:
            self._deferred.defer(background, failure)
            return
        raise failure


def _back_if_refused(stack: ExecutionStack, read: int, exc: Exception) -> None:
    """After a save refused before anything was written (a lost compare-and-set, a
    document too large, bad input), the stack is back at the revision it had (``read``):
    left at the snapshot's, its holder's next compare-and-set — a retry without a reload
    — would match another writer's revision and overwrite that writer's acknowledged
    save. After any other failure the save may have landed, and the revision stays."""
    if isinstance(exc, CheckpointConflictError | InvalidArgumentError):
        stack.revision = min(stack.revision, read)


WRITES_NOTHING: Final = (DocumentTooLargeError, ReservedFormError, NotJSONError)
"""Refusals of a save raised before anything of it is written, its changes included."""


def _writes_together(adapter: StorageAdapter) -> bool:
    """Whether ``adapter`` may take context changes with a checkpoint: it overrides
    :meth:`StorageAdapter.save_checkpoint_streamed` (one write of both), or declares
    through :meth:`StorageAdapter.writes_with_checkpoint` that the base's (the size guard,
    the changes, the save) takes them; otherwise the manager streams them first, each
    failure handled on its own, as it always has."""
    kind = type(adapter)
    return adapter.supports(Capability.CONTEXT_STREAM) and (
        kind.save_checkpoint_streamed is not StorageAdapter.save_checkpoint_streamed
        or kind.writes_with_checkpoint is not StorageAdapter.writes_with_checkpoint
    )


class _Unstreamed:
    """A context change queued for the stream; ``taken`` once its job or a save sends it."""

    __slots__ = ("build", "taken")

    def __init__(self, build: Callable[[], ContextChangeEvent]) -> None:
        self.build = build
        self.taken = False

    def untaken(self) -> bool:
        """Whether its stream job still has it to send."""
        return not self.taken


default_storage_manager: Final = StorageManager()
"""The process-wide manager that :func:`use_storage` configures."""


def use_storage(adapter: StorageAdapter | Backend | None) -> None:
    """Make the default storage manager store through ``adapter`` (seed's ``useStorage``)."""
    default_storage_manager.use_storage(adapter)
