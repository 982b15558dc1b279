"""Instruction counts per stage of a save and a load (benchmarks/instructions.py): the
table's shape from a real callgrind run with a tiny ``n``, never a ratio."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.instructions import Row, render, table

ROOT = Path(__file__).resolve().parents[2]

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None,
    reason="valgrind (callgrind) is not installed",
)


@needs_valgrind
def test_a_sqlite_save_is_counted_stage_by_stage_under_callgrind() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.instructions", "sqlite", "save", "--n", "2", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=True,
    )
    doc = json.loads(proc.stdout)
    assert (doc["backend"], doc["op"], doc["n"]) == ("sqlite", "save", 2)
    rows = [Row(**r) for r in doc["rows"]]
    stages = {(r.subject, r.stage) for r in rows}
    assert {
        ("siglo", "Checkpoint(...)"),
        ("siglo", "+ to_json()"),
        ("siglo", "check_save_arguments"),
        ("siglo", "database.write"),
        ("siglo", "database.write: statement (C)"),
        ("siglo", "save (all)"),
        ("siglo", "save (all): statement (C)"),
        ("raw-fast", "orjson.dumps"),
        ("raw-fast", "save (all)"),
        ("raw-fast", "save (all): statement (C)"),
    } <= stages
    by = {(r.subject, r.stage): r.instructions for r in rows}
    # Every stage ran: each counted instructions, the statement's C inside its stage's.
    assert all(v > 0 for v in by.values()), by
    assert by[("siglo", "save (all): statement (C)")] < by[("siglo", "save (all)")]
    assert by[("raw-fast", "save (all): statement (C)")] < by[("raw-fast", "save (all)")]
    lines = table("save", rows)
    assert lines[-1] == ("save (all)", by[("siglo", "save (all)")], by[("raw-fast", "save (all)")])
    # The lines above the total are its parts: they add up to it, for both subjects.
    assert sum(s or 0 for _, s, _ in lines[:-1]) == pytest.approx(lines[-1][1])
    assert sum(r or 0 for _, _, r in lines[:-1]) == pytest.approx(lines[-1][2])


def test_the_table_of_a_load_adds_up_and_prints_one_line_per_stage() -> None:
    rows = [
        Row("siglo", "orjson.loads", 10.0),
        Row("siglo", "Checkpoint.from_json", 25.0),
        Row("siglo", "load (all)", 100.0),
        Row("raw-fast", "load (all)", 40.0),
    ]
    lines = table("load", rows)
    assert [what for what, _, _ in lines] == [
        "orjson.loads",
        "Checkpoint from the decoded document",
        "the rest (adapter, backend, awaits)",
        "load (all)",
    ]
    assert lines[1][1] == 15.0 and lines[2] == ("the rest (adapter, backend, awaits)", 75.0, 30.0)
    text = render("memory", "load", 7, rows).splitlines()
    assert text[0] == "instructions per load, memory, 1 KB document, n=7 (callgrind)"
    assert text[-1].split()[-1] == "2.50"
    assert len(text) == 2 + len(lines) + 1
