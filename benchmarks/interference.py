"""Passes the hypervisor took the machine from, timed again.

On a virtual machine the hypervisor can run another guest while this one is ready to
run; Linux counts that time as *steal* (:func:`benchmarks.machine.cpu_times`). It comes
in bursts: on this kind of machine a pass of a few tenths of a second had anything from
none of the CPU time stolen to half of it, and a pass's speed followed its stolen share
closely (over 36 passes of 256 KB saves on Redis, one at a time, the correlation of
log ops/s with the share was −0.87 for siglo and −0.90 for raw redis-py; the ratio of
the two passes of a pair, −0.86 with the difference of their shares). Passes are
interleaved so that a slow moment meets every subject alike, but a burst that hits one
subject's pass and not the next is noise in that round's ratio, and the lowest of a
few rounds decides whether a target is met.

So a pass during which more than ``limit`` of the machine's CPU time was stolen is
timed again, after a pause, up to ``retimes`` times; the last attempt is kept whatever
its share, and counted as over the limit. Every subject is held to the same rule, and
the report says how many passes were timed again and how many kept over the limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from benchmarks.machine import cpu_times

__all__ = ["PAUSE_S", "RETIMES", "STEAL_LIMIT", "Pass", "timed_pass"]

T = TypeVar("T")

STEAL_LIMIT: Final = 0.10
"""The share of the machine's CPU time that may be stolen during a pass it keeps."""

RETIMES: Final = 3
"""How many times a pass over the limit is timed again before it is kept anyway."""

PAUSE_S: Final = 0.5
"""How long to wait before timing a pass again: a burst of steal lasts a while."""


@dataclass(frozen=True)
class Pass(Generic[T]):
    """The attempt a pass kept, and how it got there."""

    result: T
    stolen: int
    """Clock ticks stolen during the kept attempt (all CPUs)."""
    ticks: int
    """Clock ticks of all CPUs during the kept attempt (0 where /proc/stat is missing)."""
    retimed: int
    """Attempts before it that were over the limit and dropped."""
    over_limit: bool
    """The kept attempt was over the limit too (the last one allowed)."""


async def timed_pass(
    run: Callable[[], Awaitable[T]],
    *,
    limit: float = STEAL_LIMIT,
    retimes: int = RETIMES,
    pause_s: float = PAUSE_S,
) -> Pass[T]:
    """Run ``run()`` until an attempt has at most ``limit`` of the CPU time stolen, or
    ``retimes`` attempts more have been made; return the last attempt."""
    attempt = 0
    while True:
        before = cpu_times()
        result = await run()
        after = cpu_times()
        stolen = ticks = 0
        if before is not None and after is not None:
            stolen, ticks = after[0] - before[0], after[1] - before[1]
        over = ticks > 0 and stolen > limit * ticks
        if not over or attempt >= retimes:
            return Pass(result, stolen, ticks, attempt, over)
        attempt += 1
        await asyncio.sleep(pause_s)
