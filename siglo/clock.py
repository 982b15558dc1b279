"""Clocks: where every expiry decision gets "now" from.

Times are integer milliseconds since the Unix epoch, as on the wire. Backends that keep
expiry in the client (in-memory, SQL) take a :class:`Clock`, so tests can move time with a
:class:`ManualClock` instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from siglo.errors import InvalidArgumentError

__all__ = ["Clock", "ManualClock", "SystemClock", "clock_or_system", "system_clock"]


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the time in epoch milliseconds."""

    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...


class SystemClock:
    """The wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that only moves when told to; starts at the wall clock unless given a time."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = time.time_ns() // 1_000_000 if start_ms is None else int(start_ms)

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        """Move forward by ``ms`` milliseconds (never backwards) and return the new time."""
        if ms < 0:
            raise ValueError(f"a clock cannot move backwards (advance by {ms} ms)")
        self._now += int(ms)
        return self._now

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms``; it must not be earlier than the current time."""
        if now_ms < self._now:
            raise ValueError(f"a clock cannot move backwards ({now_ms} < {self._now})")
        self._now = int(now_ms)

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"


system_clock = SystemClock()


def clock_or_system(clock: object) -> Clock:
    """``clock``, or the wall clock for ``None``. Anything without ``now_ms()`` is refused
    with :class:`~siglo.errors.InvalidArgumentError` where it is given, not raised as an
    ``AttributeError`` by the first expiry decision."""
    if clock is None:
        return system_clock
    if not isinstance(clock, Clock):
        raise InvalidArgumentError(
            f"clock must be a siglo Clock (an object with now_ms()), got {clock!r}"
        )
    return clock
