"""Times as people read them: ISO-8601 in UTC with how far off they are.

Stored times are integer milliseconds since the epoch (SPEC §2), and ``--json`` output
keeps them so; what siglo prints for people — tables, error messages — goes through
:func:`describe_ms` instead.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["describe_ms", "iso_ms", "relative_ms"]


def iso_ms(ms: int) -> str:
    """``ms`` as ISO-8601 UTC to the second, e.g. ``2026-12-05T01:02:03Z`` (the number
    itself if no calendar date has it)."""
    try:
        moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def relative_ms(ms: int, now_ms: int) -> str:
    """How far ``ms`` is from ``now_ms``: ``in 12 s``, ``3 min ago``, ``in 1 h``, ``now``."""
    delta = ms - now_ms
    seconds = round(abs(delta) / 1000)
    if seconds < 1:
        return "now"
    # Each unit from the rounded smaller one: 3,599.6 s is "1 h", not "60 min".
    amount = f"{seconds} s"
    if seconds >= 60:
        minutes = round(seconds / 60)
        amount = f"{minutes} min"
        if minutes >= 60:
            hours = round(seconds / 3_600)
            amount = f"{hours} h"
            if hours >= 24:
                amount = f"{round(seconds / 86_400)} d"
    return f"in {amount}" if delta > 0 else f"{amount} ago"


def describe_ms(ms: int | None, now_ms: int) -> str | None:
    """``2026-12-05T01:02:03Z (in 12 s)``; ``None`` stays ``None``."""
    if ms is None:
        return None
    return f"{iso_ms(ms)} ({relative_ms(ms, now_ms)})"
