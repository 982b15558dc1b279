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
        "redis",
        "cas",
        "1k",
        1,
        "the hypervisor: in the eleventh round's run (11 % of the machine's CPU time stolen) "
        "the hypervisor took 16-43 % of the CPU time during siglo's passes of this cell and "
        "22-24 % during raw's; attempts were dropped and timed again 21 times for siglo's "
        "passes and 24 for raw's, and 6 of siglo's 9 passes and 6 of raw's were kept over "
        "the limit after three attempts more; siglo's rounds ran "
        "1,267, 656 and 2,356 compare-and-sets/s, raw's 1,346, 1,884 and 1,414, and the low "
        "round (0.35) is the one with the most stolen from siglo's passes (43 %, raw's 22 %). "
        "1.21 (0.98-1.26) in the tenth round's run, 7 % stolen",
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
            "entry, 1,014 entries here: 54 us by timeit; cProfile charged it ~300 us inside "
            "the save loop, but cProfile slows a loop of Python bytecode more than the calls "
            "around it: timed in place with perf_counter_ns it took 43-46 us of a 256 KB save "
            "on PostgreSQL in the thirteenth round) as the one cost raw does not have. The "
            "cell's median met 0.8 in the run at 582fa17; "
            "the save's 0.92 (0.86-0.96) and 0.92 (0.72-1.05) in the tenth round's two "
            "runs, 12 % of the CPU stolen in siglo's passes of the low round, 8 % in raw's",
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
        "siglo's own Python, about a tenth more than raw's: one at a time a load is "
        "CPU-bound in the client on this machine (the process busy 90-100 % of the wall "
        "time, siglo and raw alike), and py-spy of 18,000 loads each (at b63254c) counted "
        "10.7 % more samples for siglo: the coalescing reads' bookkeeping 2 %, the "
        "adapter's checks 2 %, the checkpoint's check 2 %; psycopg's execute and the pool "
        "the same for both",
    ),
    (
        "postgres",
        "save",
        "16k",
        1,
        "single rounds: a sequential 16 KB save waits on the server's commit for about "
        "half its time (the client busy 50-58 % of the wall time, siglo and raw alike, "
        "one process, 4 interleaved rounds at b63254c), so a pass meets the disk's "
        "moment; medians 0.95 and 0.97 in the two full runs of the eighth round, lows 0.69 "
        "and 0.76, and 0.96 / 0.79 in two runs of the cell's backend alone",
    ),
    (
        "postgres",
        "load",
        "16k",
        32,
        "in the thirteenth round, a wait, not more work: siglo's client spent 0.100-0.107 "
        "ms of CPU a load in every round of the published run, but in the low round it "
        "was busy 74 % of its passes' wall time against 92-94 % in the other two (raw's "
        "93-98 %), so the time went waiting for the server, whose work in that round is "
        "not recorded; the same in the run before it (busy 73 % in the low round, 1.42, "
        "against 91-95 %; 1.86 (1.42-2.11)), and not in the one before that (93-95 % in "
        "every round; 2.21 (1.84-2.29)). Apart from such a round, decoding, in the "
        "client, for both: py-spy of 12,000 loads by 32 callers (at "
        "b63254c) found 89 % of siglo's load in Checkpoint.from_json (orjson 80 %); "
        "sharing the statements saves the rest, which is raw's per-statement cost, so "
        "the ratio cannot pass what decoding leaves. 1.43 (1.21-1.66) and 1.62 "
        "(1.26-1.96) in the two full runs of the eighth round; 1.59 (1.57-1.66) in the "
        "seventh's, on a quieter machine; 1.66 (1.31-2.08) in the ninth's, with the next "
        "batch shared (siglo's loads 1.04-1.22 x as fast in three A/B runs); 1.91 "
        "(1.82-2.56) and 1.70 (1.46-2.05) in the tenth's two, with 1 % of the CPU stolen "
        "in the low round's passes of either subject",
    ),
    (
        "postgres",
        "load",
        "256k",
        32,
        "decoding, in the client, for every subject: Checkpoint.from_json is 97 % of "
        "siglo's load at 32 callers (py-spy), 2.1-2.2 ms a load in the benchmark's "
        "process against 1.4 ms alone (orjson.loads 1.26-1.40 ms of it), with a full "
        "garbage collection of 35-44 ms every ~100 loads; raw decodes the same bytes with "
        "the collector running (9 collections a load to siglo's 1.3). Tried and not "
        "kept: msgspec's decoder (1,390 us against orjson's 1,250-1,270 at 256 KB), "
        "batches capped at 1 MiB (308 / 311 / 295 loads/s for one batch of all / 1 MiB / "
        "none, 5 rounds in passes), a young-generation collection before each large "
        "decode (full collections 24 -> 4, loads/s 351 -> 356). 1.56 (1.35-1.71) in the "
        "eighth round's run, 1.52 (1.48-1.72) in the ninth's, 1.85 (1.57-2.06) in the "
        "tenth's. On the eleventh round's machine (an Intel Xeon) the same: py-spy of "
        "siglo's loads found orjson.loads 45 %, the collector 13 %, freeing the decoded "
        "documents 12 %, psycopg 11 % (copying the rows) and system calls 6 %, the client "
        "busy 92-95 % of the wall time (so sending the next batch while this one decodes "
        "could gain 8 % at most); siglo's client spent 2.9-3.1 ms of CPU a load against "
        "raw's 3.5-4.0 (0.47 against 1.2 ms of it collecting: 7 full collections in 900 "
        "loads against 54). 1.46 (1.38-1.47) and 1.42 (1.39-1.48) in two runs before the "
        "published one, 1.53 (1.42-1.61) in it, siglo's low round 341 loads/s against "
        "383 and 384. In the thirteenth round's three full runs (an AMD EPYC, under 2 % "
        "stolen) 1.97 (1.62-2.11), 1.89 (1.73-2.01) and, published, 1.64 (1.31-1.70); in "
        "its low round siglo's client spent 2.15 ms of CPU a load (0.49 collecting) and "
        "raw's 2.80 (1.34), both busy 96 % of their passes: the CPU ratio, 1.30, is the "
        "round's ratio; in the other rounds siglo spent 1.69 and 1.99 ms, raw 2.89 and "
        "3.28",
    ),
    (
        "sqlite",
        "load",
        "1k",
        32,
        "the baseline's round, not siglo's: in the ninth round's run raw aiosqlite ran "
        "52,011 loads/s in its second round against 22,024 and 19,948 in the other two "
        "(its 1 KB saves at 32 callers 17,265 in the same round against 8,868 and 9,239), "
        "siglo 40,372 against 52,480 and 64,868; cause not found. The cell's median was "
        "2.63, its other rounds 2.95 and 2.63; 2.99 (2.51-3.41) in the eighth round's run",
    ),
    (
        "sqlite",
        "load",
        "256k",
        32,
        "the C allocator, as far as measured: a "
        "256 KB load makes a few allocations above glibc's mmap threshold (the row's "
        "blob and its bytes at least), and served by fresh mappings they cost "
        "about 0.5 ms more a load in this VM, siglo's and raw's alike, so the faster "
        "subject's ratio falls. Runs of --backends sqlite --sizes 256k --workloads load "
        "--repeat 3 at 5a8e2f2: with LangGraph in the run siglo/raw at 32 callers was "
        "1.61, 1.67, 1.74, without it 1.91, 2.01, 2.07, 2.22 (2.14 after the other "
        "backends); with glibc's large "
        "allocations all mapped afresh (MALLOC_MMAP_THRESHOLD_=131072) siglo ran "
        "455-521/s and 1.51-1.78 x raw with or without LangGraph; with all of them from "
        "the heap, never trimmed (MALLOC_MMAP_THRESHOLD_=4194304, "
        "MALLOC_TRIM_THRESHOLD_=268435456) 588-778/s, 1.99 and 2.02 x raw with LangGraph "
        "(2.54 and 2.58 x LangGraph), 2.20 and 1.71 without: the fall with LangGraph went "
        "away. How LangGraph's saver moves glibc's dynamic threshold is not measured. In "
        "the full run siglo's cell was 319/s (363 one at a time), LangGraph's 190 (all at "
        "5a8e2f2, on the ninth round's EPYC). In the eleventh round's run, on an Intel "
        "Xeon, siglo's rounds were 516, 343 and 431 loads/s, LangGraph's 223, 189 and 179, "
        "with under 1 % of the CPU stolen in siglo's passes: siglo's round fell, not "
        "LangGraph's (2.32 (1.82-2.42); 1.79 (1.75-1.81) and 1.92 (1.75-1.99) in two runs "
        "before it). Not the stored format: LangGraph's saver stores msgpack, but the "
        "benchmark's 256 KB document decoded in 1,222 and 1,550 us with ormsgpack against "
        "1,151 and 1,336 with orjson, and 1,186 and 1,480 by Checkpoint.from_json (python "
        "-m benchmarks.decoders: medians of 7 interleaved rounds of 200, two runs)",
    ),
    (
        "sqlite",
        "save",
        "256k",
        32,
        "the checkpoint's construction check, and the machine: siglo's save builds a "
        "Checkpoint whose check (_plain_fields, one type check per context entry, 1,014 "
        "entries) took 61-65 us a save inside the save loop, 10-12 % of a 256 KB save on "
        "SQLite one at a time and at 32 callers (timed around it, two runs at 5a8e2f2), a "
        "cost raw does not have; the encoding and the statement are the same. In 6 "
        "interleaved rounds in one process at 32 callers siglo ran 1,495-1,892/s and raw "
        "1,362-1,932/s (medians 1,548 and 1,456). 0.92 (0.83-1.00) and 0.83 (0.80-0.97) "
        "in the two full runs of the eighth round, 1.03 (0.81-1.04) in the seventh's",
    ),
    (
        "postgres",
        "workflow",
        None,
        1,
        "the rounds, not a change: one run at a time a PostgreSQL run is 6 round trips one "
        "after another (5 since the eleventh round; "
        "tests/workflows/test_flow_statements.py), and in "
        "the tenth round's second "
        "run the rounds' rates moved 2.2x within each subject (siglo 95, 123 and 213 "
        "runs/s, LangGraph's saver 41, 48 and 84); the low round is the one where siglo's "
        "fell most (1.99; the others 2.54 and 2.96). Those rounds did not record stolen CPU "
        "time (the end-to-end rounds do since the eleventh round); cause not found. 2.27 "
        "(2.14-2.36) in the ninth round's run, 2.32 (2.02-2.52) in the tenth's first, 2.92 "
        "(2.68-3.04) in the eleventh's, under 1 % of the CPU stolen in any of its rounds",
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
