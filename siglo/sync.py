"""A synchronous facade over siglo, for code that is not async (SPEC §3).

A Django or Flask view, a Celery task or a script uses the same objects as async code,
through one event loop running in a daemon thread (the *portal*)::

    from siglo import sync

    with sync.connect("sqlite:///app.db") as backend:
        manager = sync.StorageManager(backend)
        manager.create_stack("order-42").set("charge", "amount", 1200)
        manager.save_checkpoint("order-42")
        print(manager.load_checkpoint("order-42").revision)

Every call is handed to the portal's loop and the calling thread waits for its result;
nothing here re-implements a backend: each method forwards to the async object of the
same name (:class:`siglo.StorageManager`, the backend's adapter, idempotency store, lock
and nonce store). Exceptions are those of the async API. Any number of threads may call
at once: their calls run concurrently on the one loop, as tasks of an async application
would. Do not call the facade from inside the portal's own loop (an async callback of a
synchronous action): that would wait for itself, and raises ``RuntimeError`` instead.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import threading
from collections.abc import Awaitable, Callable, Collection, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Final, ParamSpec, TypeVar

from siglo.adapter import Capability, StorageAdapter
from siglo.backend import Backend
from siglo.checkpoint import Checkpoint
from siglo.clock import Clock
from siglo.connect import connect as async_connect
from siglo.coordination import DEFAULT_LOCK_TTL_MS as _DEFAULT_LOCK_TTL_MS
from siglo.coordination import ClaimState, LockResult
from siglo.manager import ErrorMode
from siglo.manager import StorageManager as AsyncStorageManager
from siglo.sentinel import Missing
from siglo.stack import ExecutionStack

__all__ = [
    "Portal",
    "StorageManager",
    "SyncAdapter",
    "SyncBackend",
    "SyncIdempotencyStore",
    "SyncLock",
    "SyncNonceStore",
    "SyncStack",
    "connect",
    "get_portal",
]

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_LOCK_TTL_MS: Final = _DEFAULT_LOCK_TTL_MS


class Portal:
    """An asyncio event loop in a daemon thread, and the way into it from other threads."""

    def __init__(self, name: str = "siglo-sync") -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The portal's event loop."""
        return self._loop

    @property
    def running(self) -> bool:
        """Whether the loop still accepts calls."""
        return self._thread.is_alive() and not self._loop.is_closed()

    def run(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` on the portal's loop; return or raise its outcome."""

        async def call() -> T:
            return await fn(*args, **kwargs)

        return self._wait(call)

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call the plain function ``fn`` on the portal's loop thread (where the objects it
        touches live), and return or raise its outcome."""

        async def call() -> T:
            return fn(*args, **kwargs)

        return self._wait(call)

    def _wait(self, make: Callable[[], Awaitable[T]]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "siglo.sync called from inside its own event loop: in async code use the "
                "async API (await …), not siglo.sync"
            )
        if not self.running:
            raise RuntimeError("the siglo.sync portal is closed")
        future: Future[T] = asyncio.run_coroutine_threadsafe(_as_coroutine(make), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted caller (Ctrl-C) does not leave its call running
            raise

    def close(self) -> None:
        """Stop the loop (after the calls in flight) and its thread."""
        if not self.running:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _as_coroutine(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


_portal_lock = threading.Lock()
_portal: Portal | None = None


def get_portal() -> Portal:
    """The process-wide portal every facade object uses, started on first use."""
    global _portal
    with _portal_lock:
        if _portal is None or not _portal.running:
            _portal = Portal()
        return _portal


@atexit.register
def _close_portal() -> None:
    with _portal_lock:
        if _portal is not None:
            _portal.close()


class _Facade:
    """Forwards attribute access to an async object on the portal's loop: a coroutine
    method becomes a blocking one, a plain method runs on the loop thread, and anything
    else is read there. Subclasses add typed signatures for the public API."""

    __slots__ = ("_inner", "_portal")

    def __init__(self, inner: Any, portal: Portal | None = None) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_portal", portal or get_portal())

    @property
    def wrapped(self) -> Any:
        """The async object behind this facade (use it only from the portal's loop)."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        value = self._portal.call(getattr, self._inner, name)
        if inspect.iscoroutinefunction(value):
            return lambda *args, **kwargs: self._portal.run(value, *args, **kwargs)
        if callable(value) and not isinstance(value, type):
            return lambda *args, **kwargs: _wrap(
                self._portal, self._portal.call(value, *args, **kwargs)
            )
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._portal.call(setattr, self._inner, name, value)

    def __repr__(self) -> str:
        return f"<siglo.sync facade of {self._inner!r}>"


def _wrap(portal: Portal, value: Any) -> Any:
    if isinstance(value, ExecutionStack):
        return SyncStack(value, portal)
    return value


class SyncStack(_Facade):
    """A live :class:`~siglo.ExecutionStack`, used from any thread."""

    __slots__ = ()

    @property
    def stack_id(self) -> str:
        value: str = self._portal.call(getattr, self._inner, "stack_id")
        return value

    @property
    def contexts(self) -> dict[str, dict[str, Any]]:
        value: dict[str, dict[str, Any]] = self._portal.call(getattr, self._inner, "contexts")
        return value

    def set(self, step_id: str, key: str, value: Any) -> None:
        """``ExecutionStack.set`` on the portal's loop (its context event streams there)."""
        self._portal.call(self._inner.set, step_id, key, value)

    def delete(self, step_id: str, key: str) -> None:
        """``ExecutionStack.delete``."""
        self._portal.call(self._inner.delete, step_id, key)

    def context(self, step_id: str) -> dict[str, Any]:
        """``ExecutionStack.context``."""
        value: dict[str, Any] = self._portal.call(self._inner.context, step_id)
        return value

    def push_chain(self, chain: str) -> None:
        """``ExecutionStack.push_chain``."""
        self._portal.call(self._inner.push_chain, chain)

    def transition(self, status: str) -> None:
        """``ExecutionStack.transition``."""
        self._portal.call(self._inner.transition, status)


class SyncAdapter(_Facade):
    """A storage adapter's methods, blocking (``get_checkpoint``, ``claim_wait_record`` …)."""

    __slots__ = ()

    @property
    def capabilities(self) -> frozenset[Capability]:
        caps: frozenset[Capability] = self._inner.capabilities
        return caps

    def supports(self, capability: Capability | str) -> bool:
        """Whether the adapter declares ``capability``."""
        return bool(self._inner.supports(capability))

    def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        """``StorageAdapter.save_checkpoint``."""
        self._portal.run(
            self._inner.save_checkpoint, checkpoint, expected_revision=expected_revision
        )

    def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        """``StorageAdapter.get_checkpoint``."""
        found: Checkpoint | None = self._portal.run(
            self._inner.get_checkpoint, stack_id, namespace, fallback=fallback
        )
        return found

    def with_workflow_lock(
        self, stack_id: str, action: Callable[[], T], *, timeout_ms: int | None = None
    ) -> T:
        """Run the synchronous ``action`` holding the stack's workflow lock.

        The action runs in a worker thread while the portal's loop keeps the lock; it
        cannot be interrupted, so a lost lease is raised when it returns.
        """

        async def in_thread() -> T:
            return await asyncio.to_thread(action)

        result: T = self._portal.run(
            self._inner.with_workflow_lock, stack_id, in_thread, timeout_ms=timeout_ms
        )
        return result


class SyncIdempotencyStore(_Facade):
    """:class:`~siglo.IdempotencyStore`, blocking."""

    __slots__ = ()

    def claim(self, key: str, ttl_ms: int | None = None) -> ClaimState:
        """``IdempotencyStore.claim``."""
        state: ClaimState = self._portal.run(self._inner.claim, key, ttl_ms)
        return state

    def complete(self, key: str, result: Any, ttl_ms: int | None = None) -> None:
        """``IdempotencyStore.complete``."""
        self._portal.run(self._inner.complete, key, result, ttl_ms)

    def fail(self, key: str, error: BaseException | None = None) -> None:
        """``IdempotencyStore.fail``."""
        self._portal.run(self._inner.fail, key, error)

    def get_result(self, key: str) -> Any | Missing:
        """``IdempotencyStore.get_result``."""
        return self._portal.run(self._inner.get_result, key)

    def get(self, key: str) -> Any | Missing:
        """``IdempotencyStore.get``."""
        return self._portal.run(self._inner.get, key)


class SyncLock(_Facade):
    """:class:`~siglo.Lock`, blocking."""

    __slots__ = ()

    def acquire(
        self, lock_key: str, ttl_ms: int = DEFAULT_LOCK_TTL_MS, custom_token: str | None = None
    ) -> LockResult:
        """``Lock.acquire``."""
        result: LockResult = self._portal.run(self._inner.acquire, lock_key, ttl_ms, custom_token)
        return result

    def release(self, lock_key: str, token: str) -> bool:
        """``Lock.release``."""
        return bool(self._portal.run(self._inner.release, lock_key, token))

    def extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        """``Lock.extend``."""
        return bool(self._portal.run(self._inner.extend, lock_key, token, ttl_ms))

    def with_lock(self, lock_key: str, fn: Callable[[], T], ttl_ms: int = DEFAULT_LOCK_TTL_MS) -> T:
        """Run the synchronous ``fn`` under the lock (in a worker thread), or raise
        :class:`~siglo.errors.LockNotAcquiredError`."""

        async def in_thread() -> T:
            return await asyncio.to_thread(fn)

        result: T = self._portal.run(self._inner.with_lock, lock_key, in_thread, ttl_ms)
        return result


class SyncNonceStore(_Facade):
    """:class:`~siglo.NonceStore`, blocking."""

    __slots__ = ()

    def claim(self, key: str, ttl_seconds: float) -> bool:
        """``NonceStore.claim``: ``True`` the first time within the window."""
        return bool(self._portal.run(self._inner.claim, key, ttl_seconds))


class SyncBackend:
    """A :class:`~siglo.Backend` for synchronous code; see :func:`connect`."""

    def __init__(self, backend: Backend, portal: Portal | None = None) -> None:
        self._portal = portal or get_portal()
        self.backend = backend
        """The async backend behind the facade (use it only from the portal's loop)."""
        self.adapter = SyncAdapter(backend.adapter, self._portal)
        self.idempotency = (
            SyncIdempotencyStore(backend.idempotency, self._portal)
            if backend.idempotency is not None
            else None
        )
        self.lock = SyncLock(backend.lock, self._portal) if backend.lock is not None else None
        self.nonces = (
            SyncNonceStore(backend.nonces, self._portal) if backend.nonces is not None else None
        )

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.backend.capabilities

    def require_idempotency(self) -> SyncIdempotencyStore:
        """The idempotency store, or :class:`~siglo.CapabilityNotSupportedError`."""
        self.backend.require_idempotency()
        assert self.idempotency is not None
        return self.idempotency

    def require_lock(self) -> SyncLock:
        """The lock, or :class:`~siglo.CapabilityNotSupportedError`."""
        self.backend.require_lock()
        assert self.lock is not None
        return self.lock

    def require_nonces(self) -> SyncNonceStore:
        """The nonce store, or :class:`~siglo.CapabilityNotSupportedError`."""
        self.backend.require_nonces()
        assert self.nonces is not None
        return self.nonces

    def close(self) -> None:
        """Release the backend's connections (``Backend.aclose`` on the portal's loop)."""
        self._portal.run(self.backend.aclose)

    def __enter__(self) -> SyncBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def connect(url: str | None = None, **options: Any) -> SyncBackend:
    """:func:`siglo.connect` for synchronous code (``url`` defaults to ``$SIGLO_URL``).

    The backend is built on the portal's loop, where all its calls then run.
    """
    portal = get_portal()
    return SyncBackend(portal.call(async_connect, url, **options), portal)


class StorageManager(_Facade):
    """:class:`siglo.StorageManager` for synchronous code: the same manager (error modes,
    background saves, redaction), its awaited methods made blocking."""

    __slots__ = ()

    def __init__(
        self,
        adapter: SyncBackend | Backend | StorageAdapter | None = None,
        *,
        error_mode: ErrorMode | None = None,
        clock: Clock | None = None,
        namespace_fallback: bool = True,
    ) -> None:
        portal = get_portal()
        target = _unwrap(adapter)
        manager = portal.call(
            AsyncStorageManager,
            target,
            error_mode=error_mode,
            clock=clock,
            namespace_fallback=namespace_fallback,
        )
        super().__init__(manager, portal)

    @property
    def error_mode(self) -> ErrorMode:
        mode: ErrorMode = self._inner.error_mode
        return mode

    def set_error_mode(self, mode: ErrorMode) -> None:
        """``StorageManager.set_error_mode``."""
        self._portal.call(self._inner.set_error_mode, mode)

    def use_storage(self, adapter: SyncBackend | Backend | StorageAdapter | None) -> None:
        """``StorageManager.use_storage``."""
        self._portal.call(self._inner.use_storage, _unwrap(adapter))

    def create_stack(
        self,
        stack_id: str | None = None,
        *,
        workflow_id: str | None = None,
        namespace: str | None = None,
        type: str = "execution",
        metadata: Mapping[str, Any] | None = None,
    ) -> SyncStack:
        """``StorageManager.create_stack``."""
        stack = self._portal.call(
            self._inner.create_stack,
            stack_id,
            workflow_id=workflow_id,
            namespace=namespace,
            type=type,
            metadata=metadata,
        )
        return SyncStack(stack, self._portal)

    def get_stack(self, stack_id: str) -> SyncStack:
        """``StorageManager.get_stack``."""
        return SyncStack(self._portal.call(self._inner.get_stack, stack_id), self._portal)

    def discard_stack(self, stack_id: str) -> None:
        """``StorageManager.discard_stack``."""
        self._portal.call(self._inner.discard_stack, stack_id)

    def checkpoint(
        self,
        stack_id: str,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
    ) -> Checkpoint:
        """``StorageManager.checkpoint``: a snapshot, saved in the background."""
        snapshot: Checkpoint = self._portal.call(
            self._inner.checkpoint,
            stack_id,
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
        )
        return snapshot

    def save_checkpoint(
        self,
        stack_id: str,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
    ) -> Checkpoint:
        """``StorageManager.save_checkpoint``."""
        saved: Checkpoint = self._portal.run(
            self._inner.save_checkpoint,
            stack_id,
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
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


def _unwrap(
    adapter: SyncBackend | Backend | StorageAdapter | None,
) -> Backend | StorageAdapter | None:
    if isinstance(adapter, SyncBackend):
        return adapter.backend
    if isinstance(adapter, SyncAdapter):
        inner: StorageAdapter = adapter.wrapped
        return inner
    return adapter
