"""Why a target was missed, as measured: the report prints these beside each miss.

Each entry matches a missed target by backend, workload name, size and concurrency
(``None``: any) and says what was measured to explain it, with where. A miss that no
entry matches is printed as "no measured reason", never with a guess.
"""

from __future__ import annotations

from typing import Any, Final

# (backend, workload name, size, concurrency, reason)
REASONS: Final[list[tuple[str | None, str | None, str | None, int | None, str]]] = []


def reason_for(target: dict[str, Any]) -> str:
    """The measured reason for a missed ``target`` (a report target entry)."""
    for backend, name, size, concurrency, reason in REASONS:
        if backend is not None and backend != target.get("backend"):
            continue
        if name is not None and name != target.get("name"):
            continue
        if size is not None and size != target.get("size"):
            continue
        if concurrency is not None and concurrency != target.get("concurrency"):
            continue
        return reason
    return "no measured reason"
