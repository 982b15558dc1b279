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
            "checking the checkpoint, which raw does not do: cProfile of 200 sequential "
            "saves of the 256 KB checkpoint (after this run, with the test suite running "
            "beside it) spent 290 us a save in Checkpoint's field check (_plain_fields: "
            "every value of the contexts walked, so that what cannot come back from JSON as "
            "it went in is refused before anything is stored), beside 385 us in "
            "orjson.dumps and 420 us packing the command, which raw pays too; timed in the "
            "same process, siglo 1,747-2,459 us a save against raw's 1,285-1,551. No Redis "
            "code changed since 9728891 (save 0.90 (0.85-0.98), CAS 0.96 (0.95-1.05)); a "
            "5-round rerun of the two cells right after this run: save 0.75 (0.67-0.80), "
            "CAS 0.92 (0.82-1.12)",
        )
        for name in ("save", "cas")
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
            "a time 0.93 (0.85-1.03)); in this run the machine was about 3 x slower than in "
            "that one (raw aiosqlite 1 KB saves 3,518/s against 10,630/s) and the rounds "
            "of these cells spread widely",
        )
        for name, size in (("load", "16k"), ("load", "256k"), ("save", "16k"), ("cas", "16k"))
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
