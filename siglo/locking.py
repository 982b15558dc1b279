"""``with_workflow_lock`` built on any :class:`~siglo.coordination.Lock`.

Backends whose workflow lock is a lease row or key share this: wait for the lock with
jittered back-off, keep the lease alive while the action runs (so a long action does not
lose it to the TTL), and release with the owner's token afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from siglo.coordination import Lock
from siglo.errors import LockNotAcquiredError

__all__ = ["DEFAULT_WORKFLOW_LOCK_TIMEOUT_MS", "DEFAULT_WORKFLOW_LOCK_TTL_MS", "run_with_lock"]

T = TypeVar("T")

DEFAULT_WORKFLOW_LOCK_TTL_MS: Final = 30_000
DEFAULT_WORKFLOW_LOCK_TIMEOUT_MS: Final = 30_000
_MIN_POLL_S: Final = 0.002
_MAX_POLL_S: Final = 0.05


async def run_with_lock(
    lock: Lock,
    lock_key: str,
    action: Callable[[], Awaitable[T]],
    *,
    ttl_ms: int = DEFAULT_WORKFLOW_LOCK_TTL_MS,
    timeout_ms: int = DEFAULT_WORKFLOW_LOCK_TIMEOUT_MS,
) -> T:
    """Acquire ``lock_key`` (waiting up to ``timeout_ms``), run ``action``, release.

    While the action runs the lease is extended every third of ``ttl_ms``. Raises
    :class:`~siglo.errors.LockNotAcquiredError` if the lock stays taken past the timeout.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    delay = _MIN_POLL_S
    while True:
        result = await lock.acquire(lock_key, ttl_ms)
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

    token = result.token

    async def keep_alive() -> None:
        while True:
            await asyncio.sleep(ttl_ms / 3000)
            if not await lock.extend(lock_key, token, ttl_ms):
                return

    renewer = asyncio.create_task(keep_alive())
    try:
        return await action()
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await renewer
        with contextlib.suppress(Exception):
            await lock.release(lock_key, token)
