"""Waiting for siglo's background work in a test: the releases retried after a failure
and the undos of calls cut off by their callers (:func:`siglo.coordination.undo_later`:
a lock or claim given back, a wait completed)."""

from __future__ import annotations

import asyncio
import time

from siglo.lease_release import releases_pending

__all__ = ["background_settled"]


async def background_settled(within_s: float = 5.0) -> int:
    """Wait until the running loop's background releases and undos are done, for at
    most ``within_s`` (an undo's last try comes a few seconds after the call it undoes);
    how many are still pending then."""
    loop = asyncio.get_running_loop()
    ends = time.monotonic() + within_s
    while True:
        pending = releases_pending(loop)
        if not pending or time.monotonic() >= ends:
            return pending
        await asyncio.sleep(0.02)
