"""The instruction-count measurement of siglo[otel]'s cost runs (docs/observability.md,
"What it costs"): ``python -m benchmarks.otel_callgrind`` with a tiny count. No ratio is
asserted — the figures are the docs' — only that a condition was counted under valgrind,
on both sides of the marks, and that a second run of a cell counts the same; that the
measured child runs each condition (absent, api, sdk) is checked without valgrind, which
costs a Python process 15-30 s a run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Two Python processes under valgrind (one condition, run twice): about half a minute on
# an idle 2-core machine, two under the load of a whole suite beside other work.
@pytest.mark.timeout(900)
def test_the_callgrind_measurement_runs_and_repeats() -> None:
    if os.environ.get("SIGLO_TEST_CALLGRIND", "") in ("", "0"):
        pytest.skip("under valgrind (~30 s): SIGLO_TEST_CALLGRIND=1 runs it (docs/testing.md)")
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.otel_callgrind",
            "--backends",
            "memory",
            "--conditions",
            "api",
            "--ops",
            "3",
            "--warmup",
            "1",
            "--repeat",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(
        r"^\| memory \| (save|load) 1 KB \| (absent|api) \| ([\d,]+), ([\d,]+) \| (–) \|$",
        proc.stdout,
        re.MULTILINE,
    )
    assert {(op, condition) for op, condition, *_ in rows} == {
        ("save", "api"),
        ("load", "api"),
    }, proc.stdout
    for _, _, first, second, ratio in rows:
        one, two = int(first.replace(",", "")), int(second.replace(",", ""))
        assert one > 1_000  # a save or a load of 1 KB through siglo, not an empty stretch
        assert abs(one - two) <= one // 100, (first, second)  # counts, not timings
        assert ratio == "–"  # no "absent" run in this one to divide by


@pytest.mark.parametrize("condition", ["absent", "api", "sdk"])
@pytest.mark.parametrize("freeze", ["0", "1"])
def test_the_measured_child_runs_each_condition(
    condition: str, freeze: str, tmp_path: Path
) -> None:
    """The child process alone (no valgrind): each condition as it is set up — the API
    not importable, the API without an SDK, an SDK recording — on SQLite, with and
    without ``--freeze-gc``; it asserts its condition itself."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.otel_callgrind",
            "--child",
            f"sqlite,{condition},2,3,{freeze},{tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
