"""A synchronous facade over siglo, for code that is not async (SPEC §3).

A Django or Flask view, a Celery task or a script uses the same objects as async code,
through one event loop running in a daemon thread (the *portal*)::

    from siglo import sync

    with sync.connect("sqlite:///app.db") as backend:
        manager = sync.StorageManager(backend)
        stack = manager.create_stack("order-42")
        stack.set("charge", "amount", 1200)
        stack.save()
        print(manager.load_checkpoint("order-42").revision)

A flow runs from synchronous code through :class:`SyncFlow` — its steps stay ``async``
functions and run on the portal's loop::

    orders = sync.SyncFlow(siglo.flow(Step.create("charge", charge)))
    print(orders.run({"id": 7}, manager=manager, stack_id="order-7"))

Every call is handed to the portal's loop and the calling thread waits for its result;
nothing here re-implements a backend: each method forwards to the async object of the
same name (:class:`siglo.StorageManager`, the backend's adapter, idempotency store, lock
and nonce store). Exceptions are those of the async API. Any number of threads may call
at once: their calls run concurrently on the one loop, as tasks of an async application
would. Do not call the facade from inside the portal's own loop (an async callback of a
synchronous action): that would wait for itself, and raises ``RuntimeError`` instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from siglo import webhooks
from siglo.adapter import CacheEntry, StorageAdapter
from siglo.backend import Backend
from siglo.checkpoint import Checkpoint
from siglo.clock import Clock
from siglo.config import Settings
from siglo.coordination import DEFAULT_LOCK_TTL_MS as DEFAULT_LOCK_TTL_MS
from siglo.coordination import NonceStore
from siglo.error_modes import ErrorMode
from siglo.errors import InvalidArgumentError
from siglo.manager import StorageManager as AsyncStorageManager
from siglo.stack import ExecutionStack
from siglo.sync_facades import (
    Facade,
    SyncAdapter,
    SyncBackend,
    SyncIdempotencyStore,
    SyncLock,
    SyncNonceStore,
    SyncStack,
    connect,
)
from siglo.sync_portal import Portal, get_portal
from siglo.webhooks import DEFAULT_HEADER, DEFAULT_TOLERANCE_S, Secret, VerifiedWebhook
from siglo.workflow.flow import Flow

# The portal is in siglo.sync_portal, the facades of a stack, an adapter, the
# coordination stores and a backend in siglo.sync_facades; all are exported here.
__all__ = [
    "Portal",
    "StorageManager",
    "SyncAdapter",
    "SyncFlow",
    "SyncBackend",
    "SyncIdempotencyStore",
    "SyncLock",
    "SyncNonceStore",
    "SyncStack",
    "connect",
    "get_portal",
    "verify_webhook",
]


class StorageManager(Facade):
    """:class:`siglo.StorageManager` for synchronous code: the same manager (error modes,
    background saves, redaction), its awaited methods made blocking."""

    __slots__ = ()

    def __init__(
        self,
        adapter: SyncBackend | Backend | StorageAdapter | None = None,
        *,
        settings: Settings | None = None,
        error_mode: ErrorMode | None = None,
        clock: Clock | None = None,
        namespace_fallback: bool | None = None,
        redact_fields: Collection[str] = (),
    ) -> None:
        # Built on the portal of the backend handed over, where its connections live:
        # this process's portal would run the parent's connections in a forked child.
        portal = _portal_for(adapter)
        target = _unwrap(adapter)
        manager = portal.call(
            AsyncStorageManager,
            target,
            settings=settings,
            error_mode=error_mode,
            clock=clock,
            namespace_fallback=namespace_fallback,
            redact_fields=redact_fields,
        )
        super().__init__(manager, portal)

    @property
    def settings(self) -> Settings:
        """``StorageManager.settings``."""
        settings: Settings = self._inner.settings
        return settings

    @property
    def redact_fields(self) -> frozenset[str]:
        """``StorageManager.redact_fields``."""
        fields: frozenset[str] = self._inner.redact_fields
        return fields

    @property
    def error_mode(self) -> ErrorMode:
        mode: ErrorMode = self._inner.error_mode
        return mode

    def set_error_mode(self, mode: ErrorMode) -> None:
        """``StorageManager.set_error_mode``."""
        self._portal.call(self._inner.set_error_mode, mode)

    def use_storage(self, adapter: SyncBackend | Backend | StorageAdapter | None) -> None:
        """``StorageManager.use_storage``: a backend on the manager's own portal (the
        storage of a manager runs on its loop); one of another portal — one opened
        before this process was forked, say — is refused with ``RuntimeError``."""
        given = _portal_of_facade(adapter)
        if given is not None and given is not self._portal:
            given.check()  # the fork (or the closed portal) named, if that is why
            raise RuntimeError(
                "use_storage() was given a backend of another siglo.sync portal than the "
                "manager's: make the manager with sync.StorageManager(backend)"
            )
        self._portal.call(self._inner.use_storage, _unwrap(adapter))

    def create_stack(
        self,
        stack_id: str | None = None,
        *,
        workflow_id: str | None = None,
        namespace: str | None = None,
        type: str = "execution",
        metadata: Mapping[str, Any] | None = None,
        redact_fields: Collection[str] = (),
    ) -> SyncStack:
        """``StorageManager.create_stack``."""
        stack = self._portal.call(
            self._inner.create_stack,
            stack_id,
            workflow_id=workflow_id,
            namespace=namespace,
            type=type,
            metadata=metadata,
            redact_fields=redact_fields,
        )
        return SyncStack(stack, self._portal)

    def get_stack(self, stack_id: str) -> SyncStack:
        """``StorageManager.get_stack``."""
        return SyncStack(self._portal.call(self._inner.get_stack, stack_id), self._portal)

    def discard_stack(self, stack_id: str | SyncStack) -> None:
        """``StorageManager.discard_stack``."""
        self._portal.call(self._inner.discard_stack, _live(stack_id))

    def save(
        self,
        stack: SyncStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
        unlock: bool = False,
        cache_entry: CacheEntry | None = None,
    ) -> Checkpoint:
        """``StorageManager.save``: this very stack, stored (the way to save in code that
        several threads run at once)."""
        if not isinstance(stack, SyncStack):
            raise InvalidArgumentError(
                f"save() takes the live stack itself, got {type(stack).__name__}; "
                "save_checkpoint() takes an id"
            )
        if cache_entry is None:
            return stack.save(
                expected_revision=expected_revision,
                redact_fields=redact_fields,
                ttl_ms=ttl_ms,
                unlock=unlock,
            )
        saved: Checkpoint = self._portal.run(
            self._inner.save,
            _live(stack),
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
            unlock=unlock,
            cache_entry=cache_entry,
        )
        return saved

    def checkpoint(
        self,
        stack_id: str | SyncStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
    ) -> Checkpoint:
        """``StorageManager.checkpoint``: a snapshot, saved in the background."""
        snapshot: Checkpoint = self._portal.call(
            self._inner.checkpoint,
            _live(stack_id),
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
        )
        return snapshot

    def save_checkpoint(
        self,
        stack_id: str | SyncStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
        unlock: bool = False,
        cache_entry: CacheEntry | None = None,
    ) -> Checkpoint:
        """``StorageManager.save_checkpoint``.

        ``unlock=True`` inside ``adapter.with_workflow_lock(stack_id, fn)``: the save is
        the last write of ``fn``, and the backend may release the lock with it, as in
        async code (the call carries the worker thread's context, the lock's hold
        included, onto the portal's loop).
        """
        saved: Checkpoint = self._portal.run(
            self._inner.save_checkpoint,
            _live(stack_id),
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
            unlock=unlock,
            cache_entry=cache_entry,
        )
        return saved

    def restore_checkpoint(
        self,
        checkpoint: Checkpoint | Mapping[str, Any] | bytes | str,
        *,
        expected_namespace: str | None = None,
    ) -> SyncStack:
        """``StorageManager.restore_checkpoint``."""
        stack = self._portal.call(
            self._inner.restore_checkpoint, checkpoint, expected_namespace=expected_namespace
        )
        return SyncStack(stack, self._portal)

    def load_checkpoint(self, stack_id: str, *, namespace: str | None = None) -> Checkpoint | None:
        """``StorageManager.load_checkpoint``."""
        found: Checkpoint | None = self._portal.run(
            self._inner.load_checkpoint, stack_id, namespace=namespace
        )
        return found

    def resume(self, stack_id: str, *, namespace: str | None = None) -> SyncStack | None:
        """``StorageManager.resume``."""
        stack = self._portal.run(self._inner.resume, stack_id, namespace=namespace)
        return None if stack is None else SyncStack(stack, self._portal)

    def clean_expired_checkpoints(self) -> int:
        """``StorageManager.clean_expired_checkpoints``."""
        return int(self._portal.run(self._inner.clean_expired_checkpoints))

    def flush(self) -> None:
        """``StorageManager.flush``: wait for background saves, raise what they deferred."""
        self._portal.run(self._inner.flush)


class SyncFlow:
    """A :class:`siglo.Flow` run from synchronous code: ``run``, ``resume``, ``deliver``
    and ``recover`` block until the flow returns, suspends or fails.

    The flow's steps are the same ``async`` functions, run on the portal's loop, so a
    Django view, a Celery task or a script runs, resumes and delivers to the very runs
    that async code and ``siglo worker`` do (same storage, same lock, same checkpoints).
    ``manager`` is a :class:`StorageManager` of this module (or an async one); without
    it, :data:`siglo.default_storage_manager`. :class:`~siglo.workflow.WorkflowSuspended`
    and a step's exception are raised as in async code.
    """

    __slots__ = ("flow",)

    def __init__(self, flow: Flow) -> None:
        if not isinstance(flow, Flow):
            raise InvalidArgumentError(
                f"SyncFlow takes a siglo.Flow (from siglo.flow(...)), got {type(flow).__name__}"
            )
        # No portal is kept: a SyncFlow is made at import time (a module of tasks), which
        # a pre-fork server (Celery, gunicorn --preload) does before it forks, and a
        # child's calls run on the child's own portal (see _portal_of).
        self.flow = flow

    @property
    def name(self) -> str:
        """The flow's name (the ``workflow_id`` of its runs)."""
        return self.flow.name

    def run(
        self,
        input: Any = None,
        *,
        manager: StorageManager | AsyncStorageManager | None = None,
        stack_id: str | None = None,
        namespace: str | None = None,
    ) -> Any:
        """``Flow.run``: run (or continue) the run, and return its output."""
        return _portal_of(manager).run(
            self.flow.run,
            input,
            manager=_manager(manager),
            stack_id=stack_id,
            namespace=namespace,
        )

    def resume(
        self,
        stack_id: str,
        *,
        manager: StorageManager | AsyncStorageManager | None = None,
        namespace: str | None = None,
    ) -> Any:
        """``Flow.resume``: continue a run from its last checkpoint."""
        return _portal_of(manager).run(
            self.flow.resume, stack_id, manager=_manager(manager), namespace=namespace
        )

    def recover(
        self,
        stack_id: str,
        *,
        manager: StorageManager | AsyncStorageManager | None = None,
        namespace: str | None = None,
    ) -> bool:
        """``Flow.recover``: continue a run a dead process left ``running``."""
        recovered: bool = _portal_of(manager).run(
            self.flow.recover, stack_id, manager=_manager(manager), namespace=namespace
        )
        return recovered

    def deliver(
        self,
        correlation_key: str,
        payload: Any = None,
        *,
        manager: StorageManager | AsyncStorageManager | None = None,
        claimant_id: str | None = None,
        allow_expired: bool = False,
        namespace: str | None = None,
    ) -> Any:
        """``Flow.deliver``: deliver an event to the run waiting for it, resume it here."""
        return _portal_of(manager).run(
            self.flow.deliver,
            correlation_key,
            payload,
            manager=_manager(manager),
            claimant_id=claimant_id,
            allow_expired=allow_expired,
            namespace=namespace,
        )

    def __repr__(self) -> str:
        return f"<siglo.sync.SyncFlow {self.flow.name!r}>"


def _portal_of(manager: StorageManager | AsyncStorageManager | None) -> Portal:
    """The portal a flow's call runs on: the one of the sync manager given (in a process
    forked after it was made, that portal says so and what to do), else this process's."""
    return _portal_for(manager)


def _manager(
    manager: StorageManager | AsyncStorageManager | None,
) -> AsyncStorageManager | None:
    if manager is None or isinstance(manager, AsyncStorageManager):
        return manager
    if isinstance(manager, StorageManager):
        inner: AsyncStorageManager = manager.wrapped
        return inner
    raise InvalidArgumentError(
        f"manager must be a siglo.sync.StorageManager, got {type(manager).__name__}"
    )


def _live(stack: str | SyncStack) -> str | ExecutionStack:
    """An id as it is, a stack facade as the stack behind it."""
    if isinstance(stack, SyncStack):
        inner: ExecutionStack = stack.wrapped
        return inner
    return stack


def _portal_of_facade(value: object) -> Portal | None:
    """The portal of a facade (where the async object behind it lives), else ``None``."""
    if isinstance(value, SyncBackend | Facade):
        portal: Portal = value._portal
        return portal
    return None


def _portal_for(value: object) -> Portal:
    """The portal to build an object from ``value`` on: a facade's own — in a process
    forked after the facade was made, that portal refuses every call, naming the fork,
    instead of handing the parent's connections to the child's — else this process's."""
    return _portal_of_facade(value) or get_portal()


def _unwrap(
    adapter: SyncBackend | Backend | StorageAdapter | None,
) -> Backend | StorageAdapter | None:
    if isinstance(adapter, SyncBackend):
        return adapter.backend
    if isinstance(adapter, SyncAdapter):
        inner: StorageAdapter = adapter.wrapped
        return inner
    return adapter


def verify_webhook(
    secret: Secret | Sequence[Secret],
    body: bytes,
    headers: Mapping[str, str],
    nonce_store: SyncNonceStore | NonceStore,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    header: str = DEFAULT_HEADER,
    clock: Clock | None = None,
    scope: str | None = None,
) -> VerifiedWebhook:
    """:func:`siglo.webhooks.verify` for synchronous code (a Flask or Django view): the
    same checks and the same one claim of the delivery's nonce, run on the loop of the
    store behind ``nonce_store`` (``sync_backend.require_nonces()``)."""
    store = nonce_store.wrapped if isinstance(nonce_store, SyncNonceStore) else nonce_store
    # webhooks.verify checks every argument (a store without ``claim`` included) first,
    # on the portal of the store's facade (in a forked child, the fork error).
    verified: VerifiedWebhook = _portal_for(nonce_store).run(
        webhooks.verify,
        secret,
        body,
        headers,
        store,
        tolerance_s=tolerance_s,
        header=header,
        clock=clock,
        scope=scope,
    )
    return verified
