"""Ordered background jobs: the storage manager's non-blocking saves and streams."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from siglo import telemetry

__all__ = ["SerialJobs"]

Job = Callable[[], Awaitable[None]]


class SerialJobs:
    """Runs jobs in the background, in submission order per key.

    Two snapshots of one stack must reach the store in the order they were taken, or
    the later one would be refused as stale; jobs of different keys run concurrently.
    Jobs submitted with no event loop running wait for the next :meth:`drain` (or the
    next submission from inside a loop). A job must handle its own errors.
    """

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._waiting: list[tuple[str, Job]] = []
        # Read by the queue-depth gauge when a meter collects (nothing per job).
        telemetry.register_queue(self)

    def pending(self) -> int:
        """Jobs submitted and not finished yet (the last of each key, and those waiting
        for a loop)."""
        return len(self._tails) + len(self._waiting)

    def submit(self, key: str, job: Job) -> None:
        """Queue ``job`` after the previous job of ``key``."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._waiting.append((key, job))
            return
        self._start_waiting(loop)
        self._start(loop, key, job)

    def _start_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting, self._waiting = self._waiting, []
        for key, job in waiting:
            self._start(loop, key, job)

    def _start(self, loop: asyncio.AbstractEventLoop, key: str, job: Job) -> None:
        previous = self._tails.get(key)
        if previous is not None and (previous.done() or previous.get_loop() is not loop):
            previous = None  # finished, or left behind by a loop that has ended
        task = loop.create_task(self._run(previous, job))
        self._tails[key] = task
        task.add_done_callback(functools.partial(self._forget, key))

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tails.get(key) is task:
            del self._tails[key]

    @staticmethod
    async def _run(previous: asyncio.Task[None] | None, job: Job) -> None:
        if previous is not None:
            # wait() neither raises the previous job's outcome nor cancels it, and a
            # cancellation of this job still propagates.
            await asyncio.wait([previous])
        await job()

    async def drain(self, key: str | None = None) -> None:
        """Wait until the jobs of ``key`` (or of every key) submitted so far have run."""
        loop = asyncio.get_running_loop()
        self._start_waiting(loop)
        if key is not None:
            tails = [self._tails[key]] if key in self._tails else []
        else:
            tails = list(self._tails.values())
        tails = [t for t in tails if t.get_loop() is loop]
        if tails:
            await asyncio.gather(*tails, return_exceptions=True)
