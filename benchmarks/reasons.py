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
    *(
        (
            "sqlite",
            name,
            None,
            1,
            "Python around one statement: a save is one statement in one thread hop into "
            "aiosqlite, for siglo and raw alike (counted at aiosqlite's "
            "Connection._execute; siglo's loads, and the load of a CAS, run on its reader "
            "connection without the hop since bea2090); the statement alone, interleaved, "
            "costs siglo 36.0 us "
            "against raw's 32.0 (siglo's row has 10 columns and 3 indexes, raw's 5 and 2); "
            "building a 1 KB checkpoint and its row costs 14.0 us "
            "against 1.8 us for raw's dict and orjson.dumps (21.9 before this round's "
            "construction fast path); decoding a checkpoint 7.7 us against orjson.loads' "
            "3.9 at 1 KB, 66 against 58 at 16 KB. A sequential interleaved A/B before that "
            "change (9 rounds, load average ~1): save 1 KB 0.53 (0.46-0.76), load 1 KB "
            "0.75, load 16 KB 0.86, CAS 16 KB 0.75",
        )
        for name in ("save", "load", "cas")
    ),
    (
        "postgres",
        "load",
        "1k",
        1,
        "the shared server's round trip, not a statement more: a load is one prepared "
        "statement and one round trip for siglo and raw alike; siglo runs 362 Python calls "
        "a load against raw's 302 (cProfile: the call's deadline timer, the pooled "
        "connection's context manager, the checkpoint's decode). An interleaved A/B "
        "(9 rounds of 300 loads, load average ~6) measured 559 against 486 us a load, "
        "0.86 (0.19-1.81)",
    ),
    (
        "postgres",
        "workflow",
        None,
        None,
        "commits per run: siglo's flow runs 8 statements, 7 of them writes (workflow "
        "lock taken and released, creation, each step's context-stream row and checkpoint "
        "in one statement, the last with the completion, the cache entry; the one read, "
        "the cached step's look-up; tests/test_flow_statements.py; 13 and 11 two rounds "
        "ago, 9 and 7 with a read of the run before its creation), DBOS 8 commits in "
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
