"""Scale workloads: load latency at 1,000 vs 1,000,000 stored checkpoints, and
``clean_expired_checkpoints`` over 100,000 expired rows (time and peak Python memory).

Generic over any subject: rows are written through the subject's own ``save`` with 32
concurrent callers (no bulk-load shortcut), small documents (the latency of a lookup is
what is measured, not the transfer of a large one).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import tracemalloc
from typing import Any

from benchmarks.payloads import now_ms
from benchmarks.subject import Subject

_CONTEXTS: dict[str, Any] = {"step-0": {"status": "done", "n": 1}}
_FILLERS = 32
ROUNDS = 5
"""The load-latency samples are split into this many rounds; the target holds only if
every round's ratio meets it."""
WARMING_LOADS = 20_000
"""Untimed loads of random ids on each store between the first-touch measurement and the
measured rounds: a serving process has touched its store's pages before (SQLite maps a
page of the large file on its first lookup; the small file is all touched in the first
thousand)."""


async def _fill(
    subject: Subject, prefix: str, start: int, stop: int, expires_at: int | None = None
) -> None:
    next_i = start
    last_report = time.monotonic()

    async def worker() -> None:
        nonlocal next_i, last_report
        while next_i < stop:
            i = next_i
            next_i += 1
            await subject.save(f"{prefix}{i}", 1, _CONTEXTS, expires_at=expires_at)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                print(
                    f"  … {subject.kind}:{subject.backend} filled "
                    f"{next_i - start:,} / {stop - start:,}",
                    flush=True,
                )

    await asyncio.gather(*(worker() for _ in range(_FILLERS)))


async def _interleaved_p50_us(
    small: Subject, small_rows: int, large: Subject, large_rows: int, prefix: str, samples: int
) -> tuple[float, float, list[float]]:
    """Median load latency of each store, sampled alternately so that the machine's
    moment-to-moment load hits both alike (random stored ids, one load at a time), and
    the large / small ratio of each of :data:`ROUNDS` consecutive rounds of samples."""
    rng = random.Random(5)
    times: tuple[list[float], list[float]] = ([], [])
    per_round = max(1, samples // ROUNDS)
    rounds: list[float] = []
    for n in range(per_round * ROUNDS):
        for which, (subject, rows) in enumerate(((small, small_rows), (large, large_rows))):
            i = rng.randrange(rows)
            t0 = time.perf_counter_ns()
            found = await subject.load(f"{prefix}{i}")
            times[which].append((time.perf_counter_ns() - t0) / 1000)
            assert found == 1
        if (n + 1) % per_round == 0:
            rounds.append(
                statistics.median(times[1][-per_round:]) / statistics.median(times[0][-per_round:])
            )
    return statistics.median(times[0]), statistics.median(times[1]), rounds


async def _warm(
    small: Subject, small_rows: int, large: Subject, large_rows: int, prefix: str, loads: int
) -> None:
    """``loads`` untimed loads of random stored ids on each store, alternating."""
    rng = random.Random(7)
    for _ in range(loads):
        for subject, rows in ((small, small_rows), (large, large_rows)):
            await subject.load(f"{prefix}{rng.randrange(rows)}")


async def run_scale(
    subject: Subject, twin: Subject, rows: int, expired: int, quick: bool
) -> dict[str, Any]:
    """Run both scale workloads; return a result entry.

    ``twin`` is a second, separate store of the same kind (own key prefix, schema or
    file) that holds the 1,000 rows while ``subject`` holds the 1,000,000; their load
    latencies are sampled alternately, in the same minutes. (On Redis both live in one
    server keyspace, so there the comparison is of access patterns more than sizes.)
    """
    small = 100 if quick else 1_000
    large = max(small * 10, 1_000) if quick else rows
    expired = 200 if quick else expired
    samples = 50 if quick else 2_000
    prefix = "scale-"
    out: dict[str, Any] = {
        "backend": subject.backend,
        "kind": subject.kind,
        "rows_small": small,
        "rows_large": large,
    }
    label = f"{subject.kind}:{subject.backend}"
    try:
        print(f"[scale] {label}: filling {small:,} rows (small store)", flush=True)
        await _fill(twin, prefix, 0, small)
        print(f"[scale] {label}: filling {large:,} rows (large store)", flush=True)
        t0 = time.perf_counter()
        await _fill(subject, prefix, 0, large)
        out["fill_seconds"] = time.perf_counter() - t0
        # First touch: the loads right after the fill, reported beside the target's
        # figure (not judged), so a reader sees what a process new to the store meets.
        _, _, out["first_touch_rounds"] = await _interleaved_p50_us(
            twin, small, subject, large, prefix, samples
        )
        # The median of the rounds' ratios, as every other ratio of the report (the
        # ratio of the two p50s may fall outside the rounds' range).
        out["first_touch_ratio"] = statistics.median(out["first_touch_rounds"])
        out["warming_loads"] = 50 if quick else WARMING_LOADS
        await _warm(twin, small, subject, large, prefix, out["warming_loads"])
        (
            out["load_us_small"],
            out["load_us_large"],
            out["load_latency_rounds"],
        ) = await _interleaved_p50_us(twin, small, subject, large, prefix, samples)
        out["load_latency_ratio"] = statistics.median(out["load_latency_rounds"])

        print(f"[scale] {label}: {expired:,} expired rows", flush=True)
        # Already expired when written: the contract stores them as gone, and only a
        # clean-up removes them (no waiting for a TTL that a slow fill would outrun).
        t1 = time.perf_counter()
        await _fill(subject, "expired-", 0, expired, expires_at=now_ms() - 1_000)
        out["expired_fill_seconds"] = time.perf_counter() - t1
        out["expired_rows"] = expired
        tracemalloc.start()
        t2 = time.perf_counter()
        out["cleaned"] = await subject.clean_expired()
        out["clean_seconds"] = time.perf_counter() - t2
        out["clean_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
        out["status"] = "ok"
    except NotImplementedError:
        out["status"] = "unsupported"
    except Exception as exc:
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    print(f"[scale] {out}", flush=True)
    return out
