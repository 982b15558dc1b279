"""One fixed timeout over many concurrent calls, kept with a single timer.

``asyncio.timeout`` arms a timer handle for every call and cancels it afterwards; on a
Redis call of ~200 µs that bookkeeping measured ~15 µs (docs/benchmarks.md). Here every
call of one :class:`Deadlines` has the same timeout, so the deadlines of the calls in
flight are in the order the calls started: one timer, set for the oldest call still
running, serves them all, and a call costs a dict insert and delete.

A call past its deadline is cancelled and raises :class:`TimeoutError`, exactly like
``asyncio.timeout``: a cancellation from elsewhere still propagates as
:class:`asyncio.CancelledError`, and the task's cancellation count is restored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["Deadlines"]

T = TypeVar("T")


class Deadlines:
    """Bounds each awaited call by ``timeout_s`` seconds (``None``: unbounded)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        # Tasks with a call in flight -> deadline; insertion order is deadline order.
        self._inflight: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``; :class:`TimeoutError` once the timeout has passed."""
        timeout = self.timeout_s
        if timeout is None:
            return await awaitable
        task = asyncio.current_task()
        if task is None or task in self._inflight:
            # Not in a task, or a call nested in a call: the general mechanism.
            async with asyncio.timeout(timeout):
                return await awaitable
        loop = task.get_loop()
        if loop is not self._loop:
            # A client used from a new event loop: the old loop's timer will never run.
            self._loop, self._inflight, self._expired, self._timer = loop, {}, set(), None
        deadline = loop.time() + timeout
        self._inflight[task] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        cancelling = task.cancelling()
        try:
            return await awaitable
        except asyncio.CancelledError:
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() <= cancelling:
                    raise TimeoutError from None
            raise
        finally:
            del self._inflight[task]
            if task in self._expired:
                # Cancelled for its deadline, but the call swallowed the cancellation.
                self._expired.discard(task)
                task.uncancel()

    def _expire(self) -> None:
        """Cancel every call past its deadline; set the timer for the next one."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for task, deadline in self._inflight.items():
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            if task not in self._expired:
                self._expired.add(task)
                task.cancel()
