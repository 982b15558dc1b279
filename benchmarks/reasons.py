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
        "sqlite",
        "save",
        None,
        32,
        "not this round's inline writer: at 32 callers the aiosqlite connection is busy, so "
        "every save takes the hop as raw's does; an interleaved A/B of the same code with "
        "and without the writer (python -m benchmarks.sqlite_writes_ab 5 32) measured "
        "0.98 (0.89-1.35) at 1 KB and 1.00 (0.78-1.14) at 16 KB. The loop's thread does "
        "more per save than raw's: building a 1 KB checkpoint and its row took 14.0 us "
        "against 1.8 us for raw's dict and orjson.dumps (fourth round); at 32 callers that "
        "thread, not the statement, sets the pace. Earlier runs: 0.71 (0.60-0.77) at 1 KB "
        "(9728891)",
    ),
    *(
        (
            "redis",
            name,
            "256k",
            1,
            "the check of the checkpoint, and one slow round: before 582fa17 hiredis packed "
            "the 256 KB argument, ~420 us a save in cProfile (a fresh buffer each time); "
            "since, timed in one process with the test suite running beside it, siglo "
            "took 1,200-1,460 us a save against raw's 1,095-1,462, and cProfile shows "
            "Checkpoint's construction check (_plain_fields, one type check per context "
            "entry, 1,014 entries here: 54 us by timeit, ~300 us inside the save loop) as "
            "the one cost raw does not have. The cell's median met 0.8 in this run",
        )
        for name in ("save", "cas")
    ),
    *(
        (
            "sqlite",
            name,
            None,
            1,
            "the noise of one thread hop in a few: since 0d6b67e a sequential save or "
            "compare-and-set runs on siglo's writer connection on the loop's thread (one "
            "in 32 through aiosqlite, to checkpoint the WAL there) and a load on its reader, "
            "while raw takes a hop to aiosqlite's thread for each. Interleaved A/B, same "
            "code with and without the writer (python -m benchmarks.sqlite_writes_ab, 7 "
            "rounds of 1,000): saves 3.94 (2.15-5.59) x as fast at 1 KB, 3.06 (2.64-3.39) "
            "at 16 KB; compare-and-sets 4.09 (3.62-4.71) and 2.56 (1.98-2.93)",
        )
        for name in ("save", "load", "cas")
    ),
    (
        "sqlite",
        "scale",
        None,
        None,
        "SQLite's own lookup, not siglo's: siglo's load statement run by plain sqlite3 "
        "with siglo's page settings on the same table and indexes (python -m "
        "benchmarks.sqlite_lookups, 3 rounds of 2,000 random ids) took 10.9-13.3 us at "
        "1,000 rows and 18.5-20.2 us at 1,000,000 on a connection new to the files "
        "(ratio 1.41-1.85: every lookup descends the id index and the table, and the "
        "pages of the large file are mapped as first touched), 1.25-1.41 after 20,000 "
        "lookups",
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
    *(
        (
            "postgres",
            name,
            size,
            None,
            "not from this round (since 9728891 no PostgreSQL read path changed, and a save "
            "only by one call: Database.write, which is fetch there; in that run the cells "
            "measured load 16 KB / 256 KB at 32 callers 1.79 (1.76-1.82) / "
            "1.70 (1.65-1.71), save 16 KB at 32 callers 0.89 (0.83-0.95), CAS 16 KB one at "
            "a time 0.93 (0.85-1.03)); in this round's runs the machine was 2.4 to 3 x slower "
            "than in that one (raw aiosqlite 1 KB saves one at a time: 3,518 and 4,397/s "
            "against 10,630/s) and the rounds of these cells spread widely",
        )
        for name in ("load", "save", "cas")
        for size in ("1k", "16k", "256k")
    ),
    (
        "postgres",
        "workflow",
        None,
        None,
        "commits per run: siglo's flow runs 8 statements, 7 of them writes (workflow "
        "lock taken and released, creation, each step's context-stream row and checkpoint "
        "in one statement, the last with the completion, the cache entry, in flight "
        "beside its step's checkpoint since f1b949a, so 7 round trips; the one read, "
        "the cached step's look-up; tests/test_flow_statements.py; 13 and 11 three rounds "
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
