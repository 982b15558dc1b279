"""``with_workflow_lock`` built on any :class:`~siglo.coordination.Lock`, as a lease.

Backends whose workflow lock is a lease row or key share this: wait for the lock with
jittered back-off, renew the lease while the action runs, release it with the owner's
token afterwards. A lease that cannot be renewed before it lapses cancels the action and
raises :class:`~siglo.errors.LockLostError`: the action never goes on silently while a
second holder may already have entered. Each holder gets a fencing token that only grows
(:func:`current_lease`), so a store can refuse the writes of a holder that paused past
its lease — see ``docs/safety.md`` for what a lease can and cannot promise.

An action's last write may take the release with it (:func:`held`): a backend that can
send the write and the release together (PostgreSQL: one transaction, one round trip)
releases the lease there and marks the hold released, and the release after the action
is then skipped. The lock is still held until that write has landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from siglo import telemetry
from siglo.coordination import Lock, acquire_undone_on_cancel
from siglo.errors import LockLostError, LockNotAcquiredError
from siglo.lease_release import release_lease
from siglo.settings import DEFAULTS
from siglo.validation import MAX_ID_LENGTH, ms_as_seconds

__all__ = [
    "Hold",
    "Lease",
    "current_lease",
    "held",
    "run_with_lock",
    "using_lease",
    "workflow_lock_key",
]

T = TypeVar("T")

_MIN_POLL_S: Final = 0.002
_MAX_POLL_S: Final = 0.05
_RENEWALS_PER_TTL: Final = 3
"""A healthy lease is renewed every third of its TTL."""
_SAFETY_FRACTION: Final = 0.1
"""The action is cancelled this fraction of the TTL before the lease would lapse."""


@dataclass(frozen=True, slots=True)
class Lease:
    """The workflow lock an action holds, readable inside it with :func:`current_lease`.

    ``fencing_token`` grows with every holder of ``key`` (``None`` where the backend's
    lock has none): pass it to a store that remembers the highest token it has seen and
    refuses lower ones, and a holder that paused past its lease cannot overwrite the work
    of the next one.
    """

    key: str
    token: str
    fencing_token: int | None


@dataclass(slots=True)
class Hold:
    """The running action's hold of a workflow lock: its :class:`Lease`, the
    :class:`~siglo.coordination.Lock` it is held on (``None`` for a lock that is not a
    lease in a store), and whether the action's last write released it already."""

    lease: Lease
    lock: Lock | None
    released: bool = False


_current: contextvars.ContextVar[Hold | None] = contextvars.ContextVar(
    "siglo_workflow_lease", default=None
)


def current_lease() -> Lease | None:
    """The :class:`Lease` of the workflow lock the running action holds, or ``None``."""
    hold = _current.get()
    return None if hold is None else hold.lease


def held(lock: Lock, lock_key: str) -> Hold | None:
    """The running action's hold of ``lock_key`` on ``lock``, if it is not released yet.

    For a backend whose next write is the action's last (``unlock=True`` on the storage
    manager's save): it may release the lease in the same transaction as that write, with
    the owner's token, and then set :attr:`Hold.released` so that the release after the
    action is skipped. It must set it only once the write and the release have both
    committed; if they fail, the release after the action happens as always.
    """
    hold = _current.get()
    if hold is None or hold.released or hold.lock is not lock or hold.lease.key != lock_key:
        return None
    return hold


async def using_lease(lease: Lease, action: Callable[[], Awaitable[T]]) -> T:
    """Run ``action`` with ``lease`` as its :func:`current_lease` (for non-lease locks)."""
    reset = _current.set(Hold(lease, None))
    try:
        return await action()
    finally:
        _current.reset(reset)


async def run_with_lock(
    lock: Lock,
    lock_key: str,
    action: Callable[[], Awaitable[T]],
    *,
    ttl_ms: int = DEFAULTS.workflow_lock_ttl_ms,
    timeout_ms: int = DEFAULTS.workflow_lock_timeout_ms,
) -> T:
    """Acquire ``lock_key`` (waiting up to ``timeout_ms``), run ``action``, release.

    While the action runs the lease is renewed every third of ``ttl_ms``; a failed
    renewal is retried until shortly before the lease would lapse. If it cannot be
    renewed by then (the server stalled, the lock was taken over), the action is
    cancelled and :class:`~siglo.errors.LockLostError` raised. Raises
    :class:`~siglo.errors.LockNotAcquiredError` if the lock stays taken past the timeout.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ms_as_seconds(timeout_ms)
    delay = _MIN_POLL_S
    while True:
        started = loop.time()
        # Undone if this task is cancelled meanwhile (a request's timeout): the lock a
        # lost reply granted is released, not held by nobody for the whole lease.
        result = await acquire_undone_on_cancel(lock, lock_key, ttl_ms)
        if result.acquired:
            break
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise LockNotAcquiredError(
                f"workflow lock {lock_key!r} still held by another worker after {timeout_ms} ms"
            )
        # Jitter keeps contending workers from waking in lock-step.
        await asyncio.sleep(min(remaining, delay * (0.5 + random.random())))
        delay = min(delay * 2, _MAX_POLL_S)

    hold = Hold(Lease(lock_key, result.token, result.fencing_token), lock)
    renewer = _Renewer(lock, hold, ttl_ms, lapses_at=started + ms_as_seconds(ttl_ms))
    reset = _current.set(hold)
    try:
        # A child task (it copies the context, lease included), so it can be cancelled.
        work = asyncio.ensure_future(action())
    finally:
        _current.reset(reset)
    # The keeper's task starts when the first renewal is due: an action shorter than a
    # third of the lease (a workflow run, usually) costs a timer, not a task.
    due = loop.call_later(renewer.ttl_s / _RENEWALS_PER_TTL, renewer.start, work)
    try:
        try:
            outcome = await work
        except BaseException:
            if not renewer.gave_up or _cancelled_from_outside():
                raise
        else:
            if not renewer.gave_up:
                return outcome
        # The keeper gave up first: the lease is lost, and it cancelled the action
        # before another holder can enter. Report that, whatever the action did.
        if not work.done():
            work.cancel()
            await asyncio.wait({work})
        lost = renewer.lost_error()
        telemetry.note_lease_lost(lost)
        raise lost
    finally:
        due.cancel()
        keeper = renewer.keeper
        if keeper is not None:
            keeper.cancel()
        if not work.done():  # we ourselves were cancelled: so is the action
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
        if keeper is not None:
            with contextlib.suppress(BaseException):
                await keeper
        # Bounded: a stalled server must not hold the caller past the lease. A failed
        # release is retried in the background until it works or the lease lapses by
        # itself: an outage must not strand the lock for the whole lease (defect 5).
        if not hold.released:
            await release_lease(lock, lock_key, hold.lease.token, lapses_at=renewer.lapses_at)


def _cancelled_from_outside() -> bool:
    """Whether the running task itself is being cancelled (not only the action)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _Renewer:
    """Keeps one lease alive; returns (ending the wait) only when it is lost, or when the
    action's last write released it (:attr:`Hold.released`)."""

    def __init__(self, lock: Lock, hold: Hold, ttl_ms: int, *, lapses_at: float) -> None:
        self.lock = lock
        self.hold = hold
        self.lease = hold.lease
        self.ttl_s = ms_as_seconds(ttl_ms)
        self.ttl_ms = ttl_ms
        # Measured from before the request that set the lease: the server's lease
        # cannot end earlier than this on our clock, only later.
        self.lapses_at = lapses_at
        self.taken_over = False
        self.last_error: BaseException | None = None
        self.keeper: asyncio.Task[None] | None = None
        """The task renewing the lease, from the first renewal due on."""
        self.gave_up = False
        """Whether the lease was lost (not renewed in time, or taken over) while the
        action ran; the keeper then cancelled the action."""

    def start(self, work: asyncio.Future[Any]) -> None:
        """Start renewing (the first renewal is due); cancel ``work`` if the lease is
        lost while it runs."""
        if work.done():
            return
        self.keeper = asyncio.ensure_future(self._keep(work))

    async def _keep(self, work: asyncio.Future[Any]) -> None:
        await self.run()
        if not self.hold.released and not work.done():
            self.gave_up = True
            work.cancel()

    async def run(self) -> None:
        """Renew the lease now and every third of its TTL; return when it is lost or
        released by the action's last write."""
        loop = asyncio.get_running_loop()
        margin = self.ttl_s * _SAFETY_FRACTION
        while True:
            while True:
                if self.hold.released:
                    return  # released with the action's last write: nothing to keep
                started = loop.time()
                remaining = self.lapses_at - margin - started
                if remaining <= 0:
                    return  # could not renew in time: the lease is as good as lost
                try:
                    async with asyncio.timeout(remaining):
                        renewed = await self.lock.extend(
                            self.lease.key, self.lease.token, self.ttl_ms
                        )
                except Exception as exc:  # a timeout or a failed call: retry while time is left
                    self.last_error = exc
                    telemetry.note_retry("lease_renewal")
                    await asyncio.sleep(min(self.ttl_s / 10, max(0.0, remaining)))
                    continue
                if not renewed:
                    # Refused: taken over — or released meanwhile by the action's last
                    # write, which run_with_lock tells apart by the hold.
                    self.taken_over = True
                    return
                self.lapses_at = started + self.ttl_s
                break
            await asyncio.sleep(self.ttl_s / _RENEWALS_PER_TTL)

    def lost_error(self) -> LockLostError:
        key = self.lease.key
        if self.taken_over:
            why = "a renewal found it expired, taken by another holder or removed"
        else:
            cause = f": {self.last_error!r}" if self.last_error is not None else ""
            why = f"it could not be renewed before it would lapse{cause}"
        error = LockLostError(
            f"workflow lock {key!r} was lost while its action ran ({why}); the action was "
            "cancelled. Its writes before that may race a later holder's: use the lease's "
            "fencing token or a compare-and-set save to refuse stale writes."
        )
        error.fencing_token = self.lease.fencing_token
        if self.last_error is not None:
            error.__cause__ = self.last_error
        return error


_NAMESPACED: Final = "@"
"""Marks a namespaced workflow-lock key; an un-namespaced stack id that begins with it
is escaped by doubling it, so that no un-namespaced id meets a namespaced key."""


def workflow_lock_key(stack_id: str, namespace: str | None) -> str:
    """The key of the workflow lock of ``stack_id`` in ``namespace``, one per run.

    Tenant A's run and tenant B's run under the same stack id are two runs, and must
    not wait for each other: the key holds the namespace. Without a namespace the key
    is the stack id itself (as before namespaces were part of it, so processes of both
    versions exclude each other), unless the id begins with ``@``: that ``@`` is doubled.
    A namespaced key is ``@<length of namespace>:<namespace>:<stack id>``, a digest of it
    when that would be longer than an id may be (:data:`~siglo.validation.MAX_ID_LENGTH`).
    The base storage adapter passes this key, not the bare stack id, to
    ``_do_with_workflow_lock``.
    """
    return namespaced_key(stack_id, namespace)


def namespaced_key(key: str, namespace: str | None) -> str:
    """``key`` of ``namespace`` as one key of a store's single key space: ``key`` itself
    without a namespace (``@`` doubled if it begins with one), else
    ``@<length of namespace>:<namespace>:<key>`` — or ``@sha256:<hex digest>`` of that
    when it would be longer than an id may be. No two (key, namespace) pairs meet, so a
    tenant never sees another's entry (:func:`workflow_lock_key`, the step cache)."""
    if namespace is None:
        return _NAMESPACED + key if key.startswith(_NAMESPACED) else key
    joined = f"{_NAMESPACED}{len(namespace)}:{namespace}:{key}"
    if len(joined) > MAX_ID_LENGTH:
        digest = hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()
        joined = f"{_NAMESPACED}sha256:{digest}"
    return joined


def split_namespaced_key(stored: str) -> tuple[str, str | None] | None:
    """The key and namespace that :func:`namespaced_key` joined into ``stored``; ``None``
    for the digest of a pair too long to join (it cannot be read back)."""
    if not stored.startswith(_NAMESPACED):
        return stored, None
    rest = stored[len(_NAMESPACED) :]
    if rest.startswith(_NAMESPACED):
        return rest, None
    length, colon, tail = rest.partition(":")
    if not colon or not length.isdigit() or length != str(int(length)):
        return None  # "@sha256:<digest>"
    size = int(length)
    if len(tail) <= size or tail[size] != ":":
        return None
    return tail[size + 1 :], tail[:size]
