"""Ordered background jobs: the storage manager's non-blocking saves and streams."""

from __future__ import annotations

import asyncio
import contextvars
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
    next submission from inside a loop). A job must handle its own errors. Each job runs
    in the context (:mod:`contextvars`) of the call that submitted it, whoever starts it:
    its spans belong to its caller's trace, and what its caller's context says (the
    step, an expected conflict) is what it sees.
    """

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._waiting: list[tuple[str, Job, contextvars.Context]] = []
        # Jobs of :meth:`defer` not started yet, per key, oldest first, and the loop
        # they were deferred in, from the first deferral until the turn of that loop
        # that starts them (None otherwise).
        self._deferred: dict[str, list[tuple[Job, Callable[[], bool], contextvars.Context]]] = {}
        self._deferred_loop: asyncio.AbstractEventLoop | None = None
        # Read by the queue-depth gauge when a meter collects (nothing per job).
        telemetry.register_queue(self)

    def pending(self) -> int:
        """Jobs submitted and not finished yet (the last of each key, those deferred and
        those waiting for a loop)."""
        deferred = sum(len(jobs) for jobs in self._deferred.values())
        return len(self._tails) + len(self._waiting) + deferred

    def submit(self, key: str, job: Job) -> None:
        """Queue ``job`` after the previous job of ``key``."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._waiting.append((key, job, contextvars.copy_context()))
            return
        self._start_waiting(loop)
        self._start_deferred_of(key)
        self._start(loop, key, job, contextvars.copy_context())

    def defer(self, key: str, job: Job, wanted: Callable[[], bool]) -> None:
        """Queue ``job`` after the previous job of ``key``, as :meth:`submit` does, but
        start it at the loop's next turn (or before a later job of ``key`` starts, or
        when ``key`` is drained), and only if ``wanted()`` is still true then.

        For a job the caller usually makes needless within the same turn (a context
        change that the stack's save, right after it, sends itself): such a job then
        costs no task, and the drain of its key no turn of the loop, where a task
        would start only to find it has nothing to do.
        """
        # Started later, by another caller or the loop's turn: in this caller's context.
        context = contextvars.copy_context()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._waiting.append((key, job, context))
            return
        if self._deferred_loop is not loop:
            self._start_waiting(loop)
            self._deferred_loop = loop
            loop.call_soon(self._start_all_deferred, loop)
        self._deferred.setdefault(key, []).append((job, wanted, context))

    def _start_all_deferred(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's turn the deferred jobs waited for: start those still wanted."""
        if loop is not self._deferred_loop:
            return  # started already, as waiting jobs of another loop
        deferred, self._deferred = self._deferred, {}
        self._deferred_loop = None
        for key, jobs in deferred.items():
            for job, wanted, context in jobs:
                if wanted():
                    self._start(loop, key, job, context)

    def _start_deferred_of(self, key: str) -> None:
        """Start the deferred jobs of ``key`` still wanted (in the running loop, which
        deferred them): a job submitted after them, or a drain of the key, comes after
        them."""
        jobs = self._deferred.pop(key, None) if self._deferred else None
        if jobs is None:
            return
        loop = self._deferred_loop
        assert loop is not None  # set whenever a job is deferred
        for job, wanted, context in jobs:
            if wanted():
                self._start(loop, key, job, context)

    def _start_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._deferred_loop is not None and self._deferred_loop is not loop:
            # Deferred in a loop that ended before its turn came: they wait like jobs
            # submitted with no loop running, and start here, in their order.
            for key, jobs in self._deferred.items():
                self._waiting.extend(
                    (key, job, context) for job, wanted, context in jobs if wanted()
                )
            self._deferred = {}
            self._deferred_loop = None
        waiting, self._waiting = self._waiting, []
        for key, job, context in waiting:
            self._start(loop, key, job, context)

    def _start(
        self,
        loop: asyncio.AbstractEventLoop,
        key: str,
        job: Job,
        context: contextvars.Context,
    ) -> None:
        previous = self._tails.get(key)
        if previous is not None and (previous.done() or previous.get_loop() is not loop):
            previous = None  # finished, or left behind by a loop that has ended
        task = loop.create_task(self._run(previous, job), context=context)
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
            self._start_deferred_of(key)
            tails = [self._tails[key]] if key in self._tails else []
        else:
            if self._deferred_loop is loop:
                self._start_all_deferred(loop)
            tails = list(self._tails.values())
        tails = [t for t in tails if t.get_loop() is loop]
        if tails:
            # wait(), not gather(): a drain cancelled by its caller (a request's deadline
            # around flush()) must not cancel the jobs it waits for — they are other
            # callers' saves too, and a job cancelled before it ran would read as done.
            await asyncio.wait(tails)
