"""Event-loop lag: how late a coroutine that sleeps 1 ms wakes while a subject works.

Storage work done inline on the event loop's thread (siglo's SQLite backend, the
raw-fast ``sqlite3`` baseline) never yields: every other coroutine of the process waits
for it. While a subject saves, loads or compare-and-sets 1 KB checkpoints with 32
callers (the workloads of :mod:`benchmarks.workloads`), a probe task loops on
``asyncio.sleep(0.001)`` and records, each time it wakes, how much later than 1 ms that
was; the workload runs again (on new stacks) until the probe has woken
:data:`MIN_SAMPLES` times. The subjects of a backend alternate within each round, as in
the other workloads; a cell is the p50 and p99 of the lags a round recorded, median of
the rounds with the min–max of the rounds' p99. The bar (issue 36): p99 ≤ 5 ms.

``python -m benchmarks --loop-lag --backends sqlite --workloads save`` (the harness's
``--repeat``, ``--ops-scale``, ``--quick`` apply).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.slices import round_order
from benchmarks.subject import Subject
from benchmarks.workloads import CONC, Workload, measure

PROBE_SLEEP_S = 0.001
BAR_MS = 5.0
"""The issue's bar for the p99 lag."""
KINDS = ("siglo", "raw", "raw-fast")
OPS = {"save": 2000, "load": 2000, "cas": 1000}
MIN_SAMPLES = 500
"""A round runs its workload again until the probe has woken this many times…"""
MAX_S = 5.0
"""…or for this long (a subject that never yields lets it wake twice a run)."""


async def _probe(stop: asyncio.Event, lags_ms: list[float]) -> None:
    """Sleep 1 ms in a loop until ``stop``; record each wake's lateness in ms."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(PROBE_SLEEP_S)
        lags_ms.append(max(0.0, (time.perf_counter() - t0 - PROBE_SLEEP_S) * 1e3))


async def lag_during(
    subject: Subject,
    workload: Workload,
    tag: str,
    *,
    min_samples: int = MIN_SAMPLES,
    max_s: float = MAX_S,
) -> list[float]:
    """The probe's lags (ms, in order) while ``workload`` runs on ``subject``: once, and
    again (on new stacks) until the probe has woken ``min_samples`` times or ``max_s``
    seconds have passed. A p99 is only one when there are a hundred wakes and more: one
    run of 2,000 saves at 32 callers is about 50 ms, 20 to 60 wakes, whose p99 was their
    worst."""
    stop = asyncio.Event()
    lags: list[float] = []
    task = asyncio.create_task(_probe(stop, lags))
    await asyncio.sleep(0)  # the probe is asleep before the work starts
    until = time.perf_counter() + max_s
    try:
        passes = 0
        while passes == 0 or (len(lags) < min_samples and time.perf_counter() < until):
            await measure(subject, workload, f"{tag}p{passes}")
            passes += 1
    finally:
        stop.set()
        await task
    return lags


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; ``nan`` if empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def run_loop_lag(
    backend: str,
    args: argparse.Namespace,
    doc: dict[str, Any],
    tmp: str,
    make_subjects: Callable[[str, argparse.Namespace, str], list[Subject | str]],
) -> None:
    """Probe the loop lag of ``backend``'s subjects at 32 callers; fill ``doc["loop_lag"]``."""
    import os
    import secrets

    doc.setdefault("loop_lag", [])
    where = os.path.join(tmp, f"lag-{backend}")
    os.makedirs(where, exist_ok=True)
    subjects: list[Subject] = []
    for s in make_subjects(backend, args, where):
        if isinstance(s, str) or s.kind not in KINDS:
            continue  # an unavailable subject is reported with the workloads
        try:
            await s.open()
        except Exception as exc:
            print(f"[loop-lag skip] {s.kind}:{backend}: {exc!r}", flush=True)
            continue
        subjects.append(s)
    names = [n for n in OPS if n in set(args.workloads)] or list(OPS)
    try:
        for name in names:
            ops = 64 if args.quick else max(CONC, int(OPS[name] * args.ops_scale))
            w = Workload(name, "1k", CONC, ops)
            rounds: dict[int, list[list[float]]] = {i: [] for i in range(len(subjects))}
            errors: dict[int, str] = {}
            for round_no in range(args.repeat):
                for order in round_order(len(subjects), round_no, 1):
                    for i in order:
                        if i in errors:
                            continue
                        try:
                            lags = await asyncio.wait_for(
                                lag_during(
                                    subjects[i],
                                    w,
                                    f"lag{secrets.token_hex(3)}",
                                    # --quick: does it run, not what it measures
                                    min_samples=1 if args.quick else MIN_SAMPLES,
                                ),
                                args.timeout,
                            )
                        except Exception as exc:
                            errors[i] = f"{type(exc).__name__}: {exc}"
                            continue
                        rounds[i].append(lags)
            for i, s in enumerate(subjects):
                doc["loop_lag"].append(_entry(backend, s.kind, w, rounds[i], errors.get(i)))
                e = doc["loop_lag"][-1]
                if e["status"] == "ok":
                    print(
                        f"loop-lag {backend:8} {s.kind:9} {w.id:16} p50 {e['p50_ms']:.2f} ms"
                        f"  p99 {e['p99_ms']:.2f} ms  max {e['max_ms']:.1f} ms",
                        flush=True,
                    )
    finally:
        for s in subjects:
            try:
                await s.close()
            except Exception as exc:  # clean-up must not hide the results
                print(f"[loop-lag warn] closing {s.kind}:{backend}: {exc!r}", flush=True)


def _entry(
    backend: str, kind: str, w: Workload, rounds: list[list[float]], error: str | None
) -> dict[str, Any]:
    ok = [r for r in rounds if r]
    if error is not None or not ok:
        return {
            "backend": backend,
            "kind": kind,
            "workload": w.id,
            "status": "error",
            "error": error or "the probe never woke",
        }
    p50s = [percentile(r, 0.50) for r in ok]
    p99s = [percentile(r, 0.99) for r in ok]
    return {
        "backend": backend,
        "kind": kind,
        "workload": w.id,
        "status": "ok",
        "samples": [len(r) for r in ok],
        "p50_rounds_ms": p50s,
        "p99_rounds_ms": p99s,
        "max_rounds_ms": [max(r) for r in ok],
        "p50_ms": statistics.median(p50s),
        "p99_ms": statistics.median(p99s),
        "max_ms": max(max(r) for r in ok),
    }


def loop_lag_markdown(doc: dict[str, Any]) -> list[str]:
    """The loop-lag table as markdown lines."""
    lines = [
        "### event-loop lag at 32 callers (a 1 ms sleeper's lateness)",
        "",
        "| backend | workload | subject | lag p50 ms | lag p99 ms, median (min–max of rounds) "
        f"| worst wake ms | p99 ≤ {BAR_MS:g} ms |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for e in doc.get("loop_lag", []):
        if e["status"] != "ok":
            lines.append(
                f"| {e['backend']} | {e['workload']} | {e['kind']} | error: {e['error']} | | | |"
            )
            continue
        p99s = e["p99_rounds_ms"]
        lines.append(
            f"| {e['backend']} | {e['workload']} | {e['kind']} | {e['p50_ms']:.2f} | "
            f"{e['p99_ms']:.2f} ({min(p99s):.2f}–{max(p99s):.2f}) | {e['max_ms']:.1f} | "
            f"{'yes' if max(p99s) <= BAR_MS else 'no'} |"
        )
    return [*lines, ""]
