"""The facades of :mod:`siglo.sync`: a stack, an adapter, the coordination stores and a
backend, each forwarding its calls to the async object on the portal's loop."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import inspect
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
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
    "SyncIterator",
    "SyncNonceStore",
    "SyncStack",
    "connect",
    "run_in_own_thread",
    "settle_locked_calls",
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
            return lambda *args, **kwargs: _wrap(
                self._portal, self._portal.run(value, *args, **kwargs)
            )
        if callable(value) and not isinstance(value, type):
            # An async generator method (an adapter's ``scan_payloads``) is called here
            # too: the generator it returns becomes a SyncIterator in _wrap.
            return lambda *args, **kwargs: _wrap(
                self._portal, self._portal.call(value, *args, **kwargs)
            )
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._portal.call(setattr, self._inner, name, value)

    def __repr__(self) -> str:
        return f"<siglo.sync facade of {self._inner!r}>"


def _wrap(portal: Portal, value: Any) -> Any:
    """What a facade's method returns, for synchronous code: a stack as its facade, an
    async iterator of the loop as a :class:`SyncIterator` over it."""
    if isinstance(value, ExecutionStack):
        return SyncStack(value, portal)
    if isinstance(value, AsyncIterator):
        return SyncIterator(value, portal)
    return value


class SyncIterator(Iterator[Any]):
    """An async iterator of the portal's loop (what ``adapter.scan_payloads(kind)`` or
    ``idempotency.scan_results()`` returns), iterated from synchronous code: each item is
    awaited on the loop, as the async iterator's own ``__anext__``.

    Iteration stopped early — ``close()``, the end of a ``with`` block, or the iterator
    dropped (a ``break`` out of ``for item in adapter.scan_payloads(…)``) — closes the
    async iterator on the loop (``aclose``: a generator's ``finally`` runs, its cursor or
    connection is given back): ``close()`` and ``with`` wait for it, a dropped iterator
    has it done in the background.
    """

    __slots__ = ("_done", "_inner", "_portal")

    def __init__(self, inner: AsyncIterator[Any], portal: Portal) -> None:
        self._inner = inner
        self._portal = portal
        self._done = False

    def __iter__(self) -> SyncIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            return self._portal.run(self._inner.__anext__)
        except StopAsyncIteration:
            self._done = True
            raise StopIteration from None

    def close(self) -> None:
        """Close the async iterator on the loop (if it has ``aclose``), and wait for it;
        the iterator is then exhausted. Closing twice, or after the end, does nothing."""
        if self._done:
            return
        self._done = True
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            self._portal.run(aclose)

    def __enter__(self) -> SyncIterator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if self._done:
            return
        self._done = True
        aclose = getattr(self._inner, "aclose", None)
        portal = self._portal
        # A finalizer runs in whichever thread drops the last reference, the loop's
        # included, so it must not wait on the loop: the closing is handed to it. Not
        # in a process forked from the portal's (the loop is not running there), nor
        # once it is closed.
        if aclose is None or os.getpid() != portal.pid or not portal.running:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (at exit)
            portal.loop.call_soon_threadsafe(_close_in_background, aclose)

    def __repr__(self) -> str:
        return f"<siglo.sync iterator over {self._inner!r}>"


_CLOSING: set[asyncio.Task[Any]] = set()
"""The closings of dropped iterators in progress (a task the loop only holds weakly)."""


def _close_in_background(aclose: Callable[[], Any]) -> None:
    task = asyncio.ensure_future(aclose())
    _CLOSING.add(task)
    task.add_done_callback(_closed)


def _closed(task: asyncio.Task[Any]) -> None:
    _CLOSING.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a generator that fails to close is not worth a log


async def run_in_own_thread(fn: Callable[[], T]) -> T:
    """Run the synchronous ``fn`` in a new thread, in this task's context (the hold of a
    workflow lock included), and return or raise its outcome, never before ``fn`` has
    returned: the way the lock helpers run their function while the loop holds the lock.

    A thread of its own, not the loop's default executor: a locked function may take
    another lock through :mod:`siglo.sync`, whose function then needs a thread too, and
    with a bounded pool, as many waiting outer functions as it has threads left the inner
    ones queued behind them for ever.

    Cancelled while ``fn`` runs (its caller was interrupted: Ctrl-C, a signal-based time
    limit; or the workflow lock's lease was lost), this still waits for ``fn`` — a thread
    cannot be stopped — and only then raises the cancellation, so the lock is released
    after ``fn`` has returned, never while it runs (a second caller would run alongside
    it). What ``fn`` returned or raised is then dropped.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            result = context.run(fn)
        except BaseException as exc:  # all of it: handed to the awaiting task
            outcome = functools.partial(_settle, done, None, exc)
        else:
            outcome = functools.partial(_settle, done, result, None)
        # The portal closed meanwhile (the process is exiting): nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(outcome)

    # Not a daemon: an interpreter exiting (after a Ctrl-C) waits for ``fn`` to end, as
    # it waited for the default executor's threads.
    threading.Thread(target=work, name="siglo-sync-locked", daemon=False).start()
    interrupted: asyncio.CancelledError | None = None
    while not done.done():
        try:
            # asyncio.wait, unlike awaiting ``done``, leaves it alone when cancelled.
            await asyncio.wait((done,))
        except asyncio.CancelledError as exc:
            interrupted = exc
    if interrupted is not None:
        done.exception()  # retrieved, so not logged as never retrieved
        raise interrupted
    return done.result()


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


_LOCKED_CALLS: dict[asyncio.Task[Any], tuple[object, Portal]] = {}
"""The lock helpers' calls in progress (each a task of its portal's loop), with the
async store whose lock each holds (a lock, an adapter) and the portal."""


async def _locked_call(
    owner: object,
    portal: Portal,
    helper: Callable[..., Awaitable[T]],
    /,
    *args: Any,
    **kwargs: Any,
) -> T:
    """``helper(*args, **kwargs)`` (a store's ``with_lock`` or ``with_workflow_lock``),
    listed while it runs, so that closing waits for it once its caller is gone."""
    task = asyncio.current_task()
    assert task is not None  # run by the portal, as a task
    _LOCKED_CALLS[task] = (owner, portal)
    try:
        return await helper(*args, **kwargs)
    finally:
        del _LOCKED_CALLS[task]


async def settle_locked_calls(owners: Collection[object] | None = None) -> None:
    """Wait for the lock helpers' calls of this loop whose caller was interrupted (of the
    stores ``owners`` only, if given): each waits for its function to return, then
    releases its lock. Closing a backend under one would cut the release off, leaving
    the lock held until its lease lapsed."""
    loop = asyncio.get_running_loop()
    interrupted = {
        task
        for task, (owner, _) in list(_LOCKED_CALLS.items())
        if task.get_loop() is loop
        and task.cancelling()
        and (owners is None or any(owner is one for one in owners))
    }
    if interrupted:
        await asyncio.wait(interrupted)


@atexit.register
def _settle_at_exit() -> None:
    # Registered after (so run before) the portal's own closing, siglo.sync_portal
    # being imported first. The functions themselves have returned by now (their
    # threads are not daemons, which the interpreter joins first); their releases are
    # let through before the loop stops.
    portals = {id(portal): portal for _, portal in list(_LOCKED_CALLS.values())}
    for portal in portals.values():
        if portal.pid == os.getpid() and portal.running:
            with contextlib.suppress(Exception):
                portal.run(settle_locked_calls)


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

        The action runs in a thread of its own while the portal's loop keeps the lock
        (renewing its lease); it cannot be interrupted, so a lost lease is raised when it
        returns. A caller interrupted meanwhile (Ctrl-C) is told at once, and the lock is
        released when the action returns (:func:`run_in_own_thread`).
        """
        result: T = self._portal.run(
            _locked_call,
            self._inner,
            self._portal,
            self._inner.with_workflow_lock,
            stack_id,
            functools.partial(run_in_own_thread, action),
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
        """Run the synchronous ``fn`` under the lock (in a thread of its own), waiting up
        to ``wait_ms`` for it, or raise :class:`~siglo.errors.LockNotAcquiredError`. A
        caller interrupted meanwhile (Ctrl-C) is told at once, and the lock is released
        when ``fn`` returns (:func:`run_in_own_thread`)."""
        result: T = self._portal.run(
            _locked_call,
            self._inner,
            self._portal,
            self._inner.with_lock,
            lock_key,
            functools.partial(run_in_own_thread, fn),
            ttl_ms,
            wait_ms=wait_ms,
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
        """Release the backend's connections (``Backend.aclose`` on the portal's loop).

        A lock helper whose caller was interrupted (``with_lock``, ``with_workflow_lock``)
        holds its lock until its function returns: ``close`` waits for that, and for
        the lock's release, first."""
        self._portal.run(self._aclose)

    async def _aclose(self) -> None:
        backend = self.backend
        await settle_locked_calls((backend.adapter, backend.raw_adapter, backend.lock))
        await backend.aclose()

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
