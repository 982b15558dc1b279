"""A benchmark round in passes (benchmarks/slices.py): the order of each pass, the size
of a pass, and a real run in slices, whose figures are the passes' sums."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.slices import MIN_OPS_PER_WORKER, round_order, slice_size
from benchmarks.workloads import default_workloads

ROOT = Path(__file__).resolve().parents[2]


def test_every_other_pass_runs_the_subjects_backwards_and_rounds_turn() -> None:
    assert round_order(3, 0, 3) == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]
    assert round_order(3, 1, 2) == [[1, 2, 0], [0, 2, 1]]
    assert round_order(2, 2, 1) == [[0, 1]]
    # Over a round of an even number of passes every subject's average position is the
    # same, so a steady drift of the machine's speed favours none.
    for subjects in (2, 3, 4):
        passes = round_order(subjects, 0, 4)
        positions = [sum(p.index(i) for p in passes) for i in range(subjects)]
        assert len(set(positions)) == 1, passes


def test_a_pass_gives_every_worker_a_few_operations() -> None:
    assert slice_size(2000, 3, 1) == 667
    assert slice_size(150, 3, 32) == 32 * MIN_OPS_PER_WORKER
    assert slice_size(10, 1, 1) == 10


def test_a_run_in_slices_reports_each_round_from_all_its_passes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--backends",
            "memory",
            "--workloads",
            "save,lock",
            "--sizes",
            "1k",
            "--repeat",
            "2",
            "--slices",
            "3",
            "--ops-scale",
            "0.05",
            "--no-chart",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["slices"] == 3
    planned = {
        w.id: w.ops for w in default_workloads(["1k"], ops_scale=0.05, names={"save", "lock"})
    }
    assert {r["workload"] for r in doc["results"]} == set(planned)
    for r in doc["results"]:
        assert r["status"] == "ok", r
        assert len(r["runs"]) == 2  # one figure a round, not one a pass
        assert r["ops"] == 3 * slice_size(planned[r["workload"]], 3, r["concurrency"]), r
