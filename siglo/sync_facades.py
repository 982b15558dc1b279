"""The facades of :mod:`siglo.sync`: a stack, an adapter, the coordination stores and a
backend, each forwarding its calls to the async object on the portal's loop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Collection
from types import TracebackType
from typing import Any, TypeVar

from siglo.adapter import Capability
from siglo.backend import Backend
from siglo.checkpoint import Checkpoint
from siglo.config import Settings
from siglo.connect import connect as async_connect
from siglo.coordination import (
    DEFAULT_LOCK_TTL_MS,
    ClaimState,
    IdempotencyClaim,
    LockResult,
    LockState,
)
from siglo.sentinel import Missing
from siglo.stack import ExecutionStack
from siglo.sync_portal import Portal, get_portal

__all__ = [
    "Facade",
    "SyncAdapter",
    "SyncBackend",
    "SyncIdempotencyStore",
    "SyncLock",
    "SyncNonceStore",
    "SyncStack",
    "connect",
]

T = TypeVar("T")


class Facade:
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


class SyncStack(Facade):
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

    def save(
        self,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
        unlock: bool = False,
    ) -> Checkpoint:
        """``ExecutionStack.save``: this stack, stored; blocks until it is."""
        saved: Checkpoint = self._portal.run(
            self._inner.save,
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
            unlock=unlock,
        )
        return saved

    def checkpoint(
        self,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
    ) -> Checkpoint:
        """``ExecutionStack.checkpoint``: a snapshot, stored in the background."""
        snapshot: Checkpoint = self._portal.call(
            self._inner.checkpoint,
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
        )
        return snapshot

    def push_chain(self, chain: str) -> None:
        """``ExecutionStack.push_chain``."""
        self._portal.call(self._inner.push_chain, chain)

    def transition(self, status: str) -> None:
        """``ExecutionStack.transition``."""
        self._portal.call(self._inner.transition, status)


class SyncAdapter(Facade):
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
        self,
        stack_id: str,
        action: Callable[[], T],
        *,
        timeout_ms: int | None = None,
        namespace: str | None = None,
    ) -> T:
        """Run the synchronous ``action`` holding the workflow lock of the run
        ``stack_id`` in ``namespace``.

        The action runs in a worker thread while the portal's loop keeps the lock; it
        cannot be interrupted, so a lost lease is raised when it returns.
        """

        async def in_thread() -> T:
            return await asyncio.to_thread(action)

        result: T = self._portal.run(
            self._inner.with_workflow_lock,
            stack_id,
            in_thread,
            timeout_ms=timeout_ms,
            namespace=namespace,
        )
        return result


class SyncIdempotencyStore(Facade):
    """:class:`~siglo.IdempotencyStore`, blocking."""

    __slots__ = ()

    def claim(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> ClaimState:
        """``IdempotencyStore.claim``."""
        state: ClaimState = self._portal.run(
            self._inner.claim, key, ttl_ms, fingerprint=fingerprint
        )
        return state

    def claim_owned(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> IdempotencyClaim:
        """``IdempotencyStore.claim_owned``."""
        claim: IdempotencyClaim = self._portal.run(
            self._inner.claim_owned, key, ttl_ms, fingerprint=fingerprint
        )
        return claim

    def complete(
        self, key: str, result: Any, ttl_ms: int | None = None, *, token: str | None = None
    ) -> None:
        """``IdempotencyStore.complete``."""
        self._portal.run(self._inner.complete, key, result, ttl_ms, token=token)

    def fail(
        self, key: str, error: BaseException | None = None, *, token: str | None = None
    ) -> None:
        """``IdempotencyStore.fail``."""
        self._portal.run(self._inner.fail, key, error, token=token)

    def extend(self, key: str, token: str, ttl_ms: int) -> bool:
        """``IdempotencyStore.extend``."""
        return bool(self._portal.run(self._inner.extend, key, token, ttl_ms))

    def get_result(self, key: str) -> Any | Missing:
        """``IdempotencyStore.get_result``."""
        return self._portal.run(self._inner.get_result, key)

    def get(self, key: str) -> Any | Missing:
        """``IdempotencyStore.get``."""
        return self._portal.run(self._inner.get, key)


class SyncLock(Facade):
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

    def inspect(self, lock_key: str) -> LockState | None:
        """``LockBase.inspect``: who holds the lock and the lease left; ``None`` if free."""
        state: LockState | None = self._portal.run(self._inner.inspect, lock_key)
        return state

    def with_lock(
        self,
        lock_key: str,
        fn: Callable[[], T],
        ttl_ms: int = DEFAULT_LOCK_TTL_MS,
        *,
        wait_ms: int = 0,
    ) -> T:
        """Run the synchronous ``fn`` under the lock (in a worker thread), waiting up to
        ``wait_ms`` for it, or raise :class:`~siglo.errors.LockNotAcquiredError`."""

        async def in_thread() -> T:
            return await asyncio.to_thread(fn)

        result: T = self._portal.run(
            self._inner.with_lock, lock_key, in_thread, ttl_ms, wait_ms=wait_ms
        )
        return result


class SyncNonceStore(Facade):
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
        self.raw_adapter = SyncAdapter(backend.raw_adapter, self._portal)
        """The backend's own adapter, without the pipeline: what is stored, as it is
        stored (:attr:`siglo.Backend.raw_adapter`)."""
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
    def url_shares_storage(self) -> bool:
        """Whether connecting to :attr:`url` again reaches this same storage."""
        return self.backend.url_shares_storage

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


def connect(
    url: str | None = None, *, settings: Settings | None = None, **options: Any
) -> SyncBackend:
    """:func:`siglo.connect` for synchronous code: the same settings (``url`` defaults to
    the settings' URL, ``$SIGLO_URL``), the same pipeline.

    The backend is built on the portal's loop, where all its calls then run.
    """
    portal = get_portal()
    return SyncBackend(portal.call(async_connect, url, settings=settings, **options), portal)
