"""Why a target was missed, as measured: the report prints these beside each miss.

Each entry matches a missed target by backend, workload name, size and concurrency
(``None``: any) and says what was measured to explain it, with where. A miss that no
entry matches is printed as "no measured reason", never with a guess.
"""

from __future__ import annotations

from typing import Any, Final

# (backend, workload name, size, concurrency, reason)
REASONS: Final[list[tuple[str | None, str | None, str | None, int | None, str]]] = [
    (
        "redis",
        None,
        "1k",
        32,
        "the kernel, not Python: cProfile of 32 callers x 100 loads at load average ~12 "
        "spent 0.19 of 0.91 s in socket send() (225 writes carried the 3,200 commands, 14 "
        "a write) and 0.19 s waiting in epoll; siglo's own Python was under 0.1 s. At load "
        "average ~2 the same cells measured save 2.00, load 2.13 (run at 19a4269)",
    ),
    (
        "postgres",
        "workflow",
        None,
        None,
        "commits per run: siglo's flow runs 9 statements, 7 of them writes (workflow "
        "lock taken and released, creation, each step's context-stream row and checkpoint "
        "in one statement, the last with the completion, the cache entry; recorded at its "
        "database's fetch; 13 and 11 before this round), DBOS 8 commits in "
        "16 statements (counted with SQLAlchemy events on its engine); with the shared "
        "server's commits at several ms each, the count decides. LangGraph's count was "
        "not measured",
    ),
]


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
