"""Releasing a lease whose release failed: retried until it works, not left to the TTL.

A lease held in the store (a lock row, a lock key) is released with the owner's token
when the work is done. If that release fails — the server restarting, the pool's
connection broken by the restart, a network blip — the lease would otherwise stay held
until its TTL runs out, and every other worker would wait that long (issue 11 defect 5:
with_workflow_lock refused calls for 30 s after a PostgreSQL restart).

:func:`release_lease` tries once; on a failure it keeps retrying in the background with
back-off, until a release answers (released, or no longer ours), or the lease has lapsed
by itself, whichever comes first. The caller is never held up by the retries.
"""

from __future__ import annotations

import asyncio
from typing import Final

from siglo import masking, telemetry
from siglo.coordination import Lock, pending_on, undos_pending

__all__ = ["release_lease", "releases_pending"]

_log = masking.logger("siglo.locking")

_FIRST_RETRY_S: Final = 0.05
_MAX_RETRY_S: Final = 1.0
_PENDING: set[asyncio.Task[None]] = set()


def releases_pending(loop: asyncio.AbstractEventLoop | None = None) -> int:
    """How many failed releases are still being retried in this process, and calls cut
    off by their callers still being given back (:func:`siglo.coordination.undo_later`),
    on event loops still open (a loop closed meanwhile never runs them: those leases
    lapse by themselves) — or on ``loop`` alone (a test's, an application's)."""
    return sum(pending_on(task, loop) for task in _PENDING) + undos_pending(loop)


async def release_lease(lock: Lock, lock_key: str, token: str, *, lapses_at: float) -> None:
    """Release ``lock_key`` held with ``token``; on failure retry in the background.

    ``lapses_at`` is when the lease ends by itself (event-loop time): retrying past it is
    pointless, since the store frees the key then anyway.
    """
    loop = asyncio.get_running_loop()
    try:
        # Bounded: a stalled server must not hold the caller past the lease (at least a
        # second, for a lease that is about to lapse anyway).
        async with asyncio.timeout(max(lapses_at - loop.time(), 1.0)):
            await lock.release(lock_key, token)
        return
    except asyncio.CancelledError:
        # The caller was cut off mid-release (a request's deadline): the release may
        # never have been sent; retried in the background like a failed one.
        _retry_later(lock, lock_key, token, lapses_at)
        raise
    except Exception as exc:
        _log.warning(
            "releasing lock %r failed (%s: %s); retrying until it works or the lease lapses",
            lock_key,
            type(exc).__name__,
            exc,
        )
    _retry_later(lock, lock_key, token, lapses_at)


def _retry_later(lock: Lock, lock_key: str, token: str, lapses_at: float) -> None:
    task = asyncio.get_running_loop().create_task(_retry(lock, lock_key, token, lapses_at))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


async def _retry(lock: Lock, lock_key: str, token: str, lapses_at: float) -> None:
    loop = asyncio.get_running_loop()
    delay = _FIRST_RETRY_S
    while True:
        remaining = lapses_at - loop.time()
        if remaining <= 0:
            return
        await asyncio.sleep(min(delay, remaining))
        telemetry.note_retry("lease_release")
        delay = min(delay * 2, _MAX_RETRY_S)
        try:
            await lock.release(lock_key, token)
        except Exception:
            continue
        _log.info("lock %r released after a failed first attempt", lock_key)
        return
