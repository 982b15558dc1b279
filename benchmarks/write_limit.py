"""The raw write limit per workflow run, measured beside the end-to-end comparison.

A durable workflow's runs/s cannot exceed what its store sustains in writes a second
divided by the writes one run issues. The end-to-end comparison (:mod:`benchmarks.e2e`)
therefore times, in the same rounds and passes as the systems, the fastest competent
raw way to write a small checkpoint row on the backend, at the same number of concurrent
writers as the runs (1 and 32): the raw-fast baselines' plain save (one single-statement
upsert that refuses an older revision, ``benchmarks.raw_sql.SAVE_PLAIN``, or the save
script on Redis):

* **SQLite**: ``sqlite3`` inline on the loop's thread, autocommit, one commit per write
  (:mod:`benchmarks.raw_fast_sqlite`), WAL and ``synchronous`` as every e2e system's;
* **PostgreSQL**: the psycopg pool with one tick's writes sent in pipeline mode
  (:mod:`benchmarks.raw_fast_postgres`);
* **Redis**: redis-py with one tick's commands sent as one pipeline
  (:mod:`benchmarks.raw_fast_redis`), one ``EVALSHA`` a write.

Each writer updates a row of its own (a workflow run's checkpoint) with a document like a
step's output (~260 bytes encoded). A round's limit for a system is this round's raw
writes/s over that system's writes per run (counted at the driver,
:mod:`benchmarks.writes`), and the system's runs/s of the same round over it is its
share of the limit (the issue's goal for siglo: at least 0.8).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import time
from typing import Any

from benchmarks.client_cpu import ClientClock
from benchmarks.subject import Subject

WRITES_PER_RUN_TIMED = 10
"""A pass of the limit times this many writes for each workflow run a system's pass times,
so that its passes last about as long as theirs (a run is 5-16 writes)."""

CONTEXTS = {
    "step": {
        "run": "e2e-run",
        "step": 2,
        "total": 20,
        "items": [{"sku": f"SKU-{i}", "qty": i, "price": 9.5 + i} for i in range(4)],
    }
}
"""One step's output as the workflows write it (benchmarks.e2e._step_output)."""


def make_raw_writer(backend: str, args: Any, tmp: str) -> Subject | str:
    """The raw-fast subject whose plain save is the backend's write (a string: why none)."""
    import importlib.util

    if backend == "sqlite":
        from benchmarks.raw_fast_sqlite import RawFastSqliteSubject

        path = os.path.join(tmp, f"limit-{secrets.token_hex(3)}.db")
        return RawFastSqliteSubject(path, synchronous=getattr(args, "sqlite_synchronous", "NORMAL"))
    if backend == "postgres":
        if importlib.util.find_spec("psycopg_pool") is None:
            return "raw write limit: psycopg[pool] not installed"
        from benchmarks.raw_fast_postgres import RawFastPostgresSubject

        return RawFastPostgresSubject(
            args.postgres_url,
            pool_size=getattr(args, "pg_pool", 10),
            doc_type=getattr(args, "pg_doc_type", "bytea"),
            compression=getattr(args, "pg_compression", "lz4"),
        )
    if backend == "redis":
        if importlib.util.find_spec("redis") is None:
            return "raw write limit: redis-py not installed"
        from benchmarks.raw_fast_redis import RawFastRedisSubject

        return RawFastRedisSubject(args.redis_url)
    return f"raw write limit: no raw driver on {backend}"


async def measure_writes(writer: Subject, concurrency: int, writes: int) -> dict[str, Any]:
    """``writes`` plain saves by ``concurrency`` tasks, each on a row of its own, after one
    untimed save each (its row exists): writes/s and each write's latency (µs)."""
    tag = f"lim-{secrets.token_hex(3)}"
    per = max(1, writes // concurrency)
    latencies: list[float] = []

    async def worker(w: int, first: int, stop: int) -> None:
        for j in range(first, stop):
            t0 = time.perf_counter_ns()
            await writer.save(f"{tag}-{w}", j + 1, CONTEXTS)
            if first:
                latencies.append((time.perf_counter_ns() - t0) / 1e3)

    await asyncio.gather(*(worker(w, 0, 1) for w in range(concurrency)))
    clock = ClientClock()
    clock.start()
    await asyncio.gather(*(worker(w, 1, 1 + per) for w in range(concurrency)))
    took = clock.stop()
    latencies.sort()
    return {  # writes, under the names benchmarks.e2e._joined sums
        "runs_per_s": per * concurrency / took.seconds,
        "runs": per * concurrency,
        "seconds": took.seconds,
        "cpu_s": took.cpu_s,
        "step_us": latencies,
    }


def add_limit_ratios(doc: dict[str, Any]) -> None:
    """For every system and round: the raw write limit per run (this round's raw writes/s
    over the system's writes per run) and the system's runs/s as a share of it;
    ``doc["e2e_limit_ratios"]``."""
    limits = {
        (x["backend"], x["concurrency"]): x
        for x in doc.get("e2e_limit", [])
        if x["status"] == "ok" and x["writes_per_s_rounds"]
    }
    out: list[dict[str, Any]] = []
    for r in doc.get("e2e", []):
        lim = limits.get((r["backend"], r["concurrency"]))
        per_run = r.get("writes_per_run")
        if lim is None or r["status"] != "ok" or not per_run:
            continue
        rates, runs = lim["writes_per_s_rounds"], r["runs_per_s_rounds"]
        if len(rates) != len(runs):
            continue
        shares = [a / (w / per_run) for a, w in zip(runs, rates, strict=True) if w]
        if not shares:
            continue
        out.append(
            {
                "backend": r["backend"],
                "system": r["system"],
                "concurrency": r["concurrency"],
                "writes_per_run": per_run,
                "runs_per_s": r["runs_per_s"],
                "limit_writes_per_s": lim["writes_per_s"],
                "limit_runs_per_s": statistics.median(w / per_run for w in rates),
                "cpu_ms_per_run": r.get("cpu_ms_per_run") or [],
                "rounds": shares,
                "ratio": statistics.median(shares),
                "ratio_min": min(shares),
                "ratio_max": max(shares),
            }
        )
    doc["e2e_limit_ratios"] = out


def limit_text(x: dict[str, Any] | None) -> str:
    """``limit runs/s · share median (min–max)`` of a system's limit entry (``–``: none)."""
    if x is None:
        return "–"
    return (
        f"{x['limit_runs_per_s']:,.0f} · **{x['ratio']:.2f}** "
        f"({x['ratio_min']:.2f}–{x['ratio_max']:.2f})"
    )
