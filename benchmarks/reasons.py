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
            "the one cost raw does not have. The cell's median met 0.8 in the run at 582fa17",
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
            "compare-and-set runs on siglo's writer connection on the loop's thread (the "
            "WAL checkpointed on a thread of its own) and a load on its reader, "
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
        "benchmarks.sqlite_lookups, 3 rounds of 2,000 random ids, at 6230cac) took 5.4 us "
        "at 1,000 rows and 11.2-11.3 us at 1,000,000 on a connection new to the files "
        "(ratio 2.08: every lookup descends the id index and the table, and the pages of "
        "the large file are mapped as first touched), 1.36-1.39 after 20,000 lookups; the "
        "scale run's rounds fall as pages are touched (1.91, 1.78, 1.74, 1.64, 1.57 at "
        "6230cac). A WITHOUT ROWID table (one tree) measured slower at both sizes",
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
            backend,
            "load",
            "256k",
            32,
            "the loop's thread, not the database: at 256 KB a load is CPU-bound in the "
            "client, so 32 callers load no faster than one and coalescing has no round "
            "trips left to save (run at 6230cac: siglo on PostgreSQL 501-525 loads/s at 32 "
            "callers, 450-498 one at a time; raw 365-461 and 345-390; on SQLite siglo "
            "692-711 and 715-739, LangGraph 336-350 and 358-380). cProfile of 640 "
            "PostgreSQL loads by 32 callers, per load: orjson.loads 758 us, the young-"
            "generation GC pass that follows the decode ~306 us, the checkpoint's check "
            "175 us, freeing the document ~190 us; the ratios at 32 callers are those one "
            "at a time",
        )
        for backend in ("postgres", "sqlite")
    ),
    *(
        (
            "postgres",
            name,
            None,
            32,
            "single rounds, and about a tenth below raw, measured, not explained: at 32 "
            "callers siglo saved ~7,300 1 KB checkpoints a second against raw's ~8,200 in "
            "most rounds, one round in seven near 5,500. Save 1 KB: 0.91 (0.63-1.24) in the "
            "run at 6230cac, 0.86 (0.66-0.90) at d78f26a; the cell alone (python -m "
            "benchmarks --backends postgres --sizes 1k --workloads save --repeat 7) 0.89 "
            "(0.70-1.05), and 0.89 (0.69-0.95) with siglo's pool opened to 10 connections "
            "before timing as the raw pool is (--siglo-opt postgres:pool_min_size=10), so "
            "not the pool's growth. Save 16 KB: 0.84 (0.77-0.96) at d78f26a, alone for 7 "
            "rounds 0.88 (0.72-1.49) (siglo 7,219 saves/s, raw 8,110)",
        )
        for name in ("save", "cas")
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
        "the cached step's look-up; tests/test_flow_statements.py), DBOS 8 commits in 16 "
        "statements (counted with SQLAlchemy events on its engine); LangGraph's count was "
        "not measured. Timed at the database's fetch in one process (200 runs, at "
        "6230cac): 3,454 us a run, each write 391-453 us (its commit), the read 208 us. "
        "Sending the cached step's look-up beside the checkpoint before it was tried and "
        "measured 1.00 (0.95-1.20) x the runs/s without it (7 interleaved rounds, one "
        "run at a time): not kept. The ratio moves with the machine and the run: 2.26 "
        "(1.99-2.36) at 582fa17 (a machine 2.4 to 3 x slower), 1.93 (1.55-2.15) at "
        "6230cac, and with twice the runs a round (--e2e-scale 2) 2.17 (1.75-2.35) at "
        "7dbeb12 and 1.99 (1.89-2.11) at d78f26a, the same flow code",
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
