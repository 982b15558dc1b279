"""Measured the CPU time each turn of the event loop takes while siglo's SQLite backend works.

``python -m benchmarks.experiments.loop_turns [SYNCHRONOUS [SCALE]]``: one siglo SQLite
backend on a temporary file (``synchronous`` ``NORMAL`` by default, or ``FULL``) runs the
save, load and compare-and-set workloads of :mod:`benchmarks.workloads` at 32 callers
(and compare-and-set at 8 on one stack), 1 KB, 4,000 / 4,000 / 2,000 / 1,000 operations
times SCALE. Every turn of the loop (``BaseEventLoop._run_once``) is timed in the loop
thread's CPU time (``time.thread_time``), which another process taking the CPU does not
lengthen, unlike the wake-up lag of :mod:`benchmarks.loop_lag`. Prints per workload the
operations a second, the turns, and the p99 and maximum of their CPU time (the first
workload's maximum includes the file's set-up), with the conflicts of compare-and-set.
Run it on two checkouts for a before / after.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.loop_lag import percentile
from benchmarks.siglo_subject import SigloSubject
from benchmarks.workloads import Workload, measure

WORKLOADS = (("save", 32, 4000), ("load", 32, 4000), ("cas", 32, 2000), ("cas", 8, 1000))


async def main(synchronous: str = "NORMAL", scale: float = 1.0) -> None:
    turns_ms: list[float] = []
    loop_class: Any = asyncio.base_events.BaseEventLoop
    run_once: Callable[[Any], None] = loop_class._run_once

    def timed(loop: Any) -> None:
        started = time.thread_time()
        run_once(loop)
        turns_ms.append((time.thread_time() - started) * 1e3)

    with tempfile.TemporaryDirectory() as tmp:
        subject = SigloSubject("sqlite", f"sqlite:///{tmp}/turns.db?synchronous={synchronous}")
        await subject.open()
        loop_class._run_once = timed
        try:
            for name, callers, ops in WORKLOADS:
                turns_ms.clear()
                w = Workload(name, "1k", callers, max(callers, int(ops * scale)))
                m = await measure(subject, w, f"turns-{name}-{callers}")
                conflicts = m.extra.get("conflicts")
                print(
                    f"{w.id} {synchronous}: {m.ops_per_s:,.0f} ops/s, {len(turns_ms)} turns, "
                    f"CPU a turn p99 {percentile(turns_ms, 0.99):.2f} ms, "
                    f"max {max(turns_ms):.2f} ms"
                    + ("" if conflicts is None else f", {conflicts} conflicts"),
                    flush=True,
                )
        finally:
            loop_class._run_once = run_once
            await subject.close()


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1] if len(sys.argv) > 1 else "NORMAL",
            float(sys.argv[2]) if len(sys.argv) > 2 else 1.0,
        )
    )
