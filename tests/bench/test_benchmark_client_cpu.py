"""The client's own CPU time and garbage collections, as the benchmark records and
reports them (benchmarks/client_cpu.py)."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

from _report_helpers import report_meta

from benchmarks import report
from benchmarks.client_cpu import ClientClock, gc_seconds
from benchmarks.raw_memory import RawMemorySubject
from benchmarks.workloads import Workload, measure


def _spin_cpu(cpu_seconds: float, wall_limit: float = 10.0) -> None:
    """Compute until the process has used ``cpu_seconds`` of CPU (or ``wall_limit``
    seconds have passed: on a machine whose CPU is taken away, that takes longer)."""
    start, end = time.process_time(), time.perf_counter() + wall_limit
    while time.process_time() - start < cpu_seconds and time.perf_counter() < end:
        pass


def test_the_clock_counts_the_cpu_a_busy_client_spends_and_not_its_waits() -> None:
    clock = ClientClock()
    clock.start()
    _spin_cpu(0.2)
    busy = clock.stop()
    clock.start()
    time.sleep(0.2)
    idle = clock.stop()
    # Busy: the CPU time it spent (the process's: at most every core, all the time).
    assert 0.2 <= busy.cpu_s <= busy.seconds * (os.cpu_count() or 1) + 0.02, busy
    # Waiting: the wall time passes, next to no CPU time does.
    assert idle.seconds >= 0.2 and idle.cpu_s < 0.05, idle


def test_the_clock_counts_the_time_the_collector_takes() -> None:
    clock = ClientClock()
    clock.start()
    garbage: list[list[Any]] = []
    for _ in range(200_000):
        cell: list[Any] = []
        cell.append(cell)  # a cycle: only the collector frees it
        garbage.append(cell)
    del garbage, cell
    before = gc_seconds()
    gc.collect()
    took = clock.stop()
    assert gc_seconds() > before
    assert 0 < took.gc_s <= took.seconds


def test_a_measurement_carries_the_cpu_and_collections_of_its_timed_part() -> None:
    async def run() -> Any:
        subject = RawMemorySubject()
        await subject.open()
        try:
            return await measure(subject, Workload("save", "16k", 4, 400), "t")
        finally:
            await subject.close()

    m = asyncio.run(run())
    assert m.ops == 400
    # The process's CPU time (all its threads: at most every core, all the time).
    assert 0 < m.cpu_s <= m.seconds * (os.cpu_count() or 1) + 0.01, m
    assert 0 <= m.gc_s <= m.seconds, m


def _result(kind: str, runs: list[float], cpu: list[float], in_gc: list[float]) -> dict[str, Any]:
    return {
        "backend": "postgres",
        "kind": kind,
        "workload": "load/256k/c32",
        "name": "load",
        "size": "256k",
        "concurrency": 32,
        "status": "ok",
        "runs": runs,
        "cpu_ms_per_op": cpu,
        "gc_ms_per_op": in_gc,
        "median": sorted(runs)[len(runs) // 2],
        "spread": 0.0,
    }


def test_the_lowest_rounds_client_cpu_is_shown_for_both_subjects() -> None:
    mine = _result("siglo", [450.0, 300.0, 440.0], [2.2, 3.4, 2.3], [0.3, 0.9, 0.3])
    other = _result("raw", [300.0, 290.0, 300.0], [2.8, 2.9, 2.8], [0.9, 1.0, 0.9])
    cpus = report.round_cpus(mine, other)
    assert cpus == [[2.2, 0.3, 2.8, 0.9], [3.4, 0.9, 2.9, 1.0], [2.3, 0.3, 2.8, 0.9]]
    ratio = {"rounds": report.round_ratios(mine["runs"], other["runs"]), "cpu": cpus}
    # Round 2 is the lowest (300 / 290): siglo spent 3.4 ms a load there, 0.9 collecting.
    assert report.low_round_cpu(ratio) == "3.40 (0.90) / 2.90 (1.00)"


def test_a_run_recorded_without_client_cpu_renders_a_dash() -> None:
    mine = _result("siglo", [450.0], [2.2], [0.3])
    other = _result("raw", [300.0], [2.8], [0.9])
    del mine["cpu_ms_per_op"]
    assert report.round_cpus(mine, other) == []
    assert report.low_round_cpu({"rounds": [1.5], "cpu": []}) == "–"
    assert report.low_round_cpu({"rounds": [1.5]}) == "–"


def test_the_report_shows_a_missed_targets_client_cpu_in_its_lowest_round() -> None:
    doc: dict[str, Any] = {
        "meta": report_meta(),
        "subjects": [],
        # Round 2 misses 1.5x (siglo 300 against raw 290).
        "results": [
            _result("siglo", [450.0, 300.0, 460.0], [2.2, 3.4, 2.3], [0.3, 0.9, 0.3]),
            _result("raw", [300.0, 290.0, 300.0], [2.8, 2.9, 2.8], [0.9, 1.0, 0.9]),
        ],
        "scale": [],
    }
    report.add_ratios_and_targets(doc)
    md = report.markdown(doc)
    missed = [line for line in md.splitlines() if line.startswith("| siglo >= 1.5x raw")]
    assert len(missed) == 1 and "| 3.40 (0.90) / 2.90 (1.00) |" in missed[0], missed
