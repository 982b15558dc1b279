"""Instruction counts per stage of a save and a load (benchmarks/instructions.py): the
table's shape from a real callgrind run with a tiny ``n``, never a ratio."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.instructions import Row, render, render_json, table

ROOT = Path(__file__).resolve().parents[2]

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None
    or shutil.which("callgrind_annotate") is None
    or os.environ.get("SIGLO_TEST_CALLGRIND", "") in ("", "0"),
    reason="under valgrind (~50 s): SIGLO_TEST_CALLGRIND=1 runs it (docs/testing.md)",
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
        ("siglo", "save (all): adaptation (C)"),
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
    # The lines above the total are its parts ("of which" lines, a part's part, aside):
    # they add up to it, for both subjects.
    parts = [line for line in lines[:-1] if not line[0].startswith("  of which")]
    assert len(parts) == len(lines) - 2
    assert sum(s or 0 for _, s, _ in parts) == pytest.approx(lines[-1][1])
    assert sum(r or 0 for _, _, r in parts) == pytest.approx(lines[-1][2])


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


PAGE = ROOT / "docs" / "benchmarks-instructions.md"
RUNS = ROOT / "docs" / "benchmarks" / "instructions"


@pytest.mark.parametrize(
    "run",
    [f"{b}-{op}" for b in ("sqlite", "memory", "redis", "postgres") for op in ("save", "load")],
)
def test_the_page_shows_each_published_run_as_the_command_prints_it(run: str) -> None:
    doc = json.loads((RUNS / f"{run}.json").read_text())
    assert f"{doc['backend']}-{doc['op']}" == run
    assert render_json(doc) in PAGE.read_text()


def _bound_kinds(sql: str, params: dict[str, object]) -> list[str]:
    """The types of the parameters ``sql`` binds, by name (``:name``)."""
    return sorted(type(params[name]).__name__ for name in set(re.findall(r":(\w+)", sql)))


def test_siglo_binds_six_parameters_the_sqlite3_module_searches_an_adapter_for(
    tmp_path: Path,
) -> None:
    """The page's reason for part of the statement's extra instructions: every ``None``
    and ``bytes`` parameter costs an adapter search; a plain 1 KB save binds six of them
    (raw-fast's two), a load one (raw-fast's none)."""
    from benchmarks.payloads import make_contexts, now_ms
    from benchmarks.raw_fast_sqlite import _LOAD, _SAVE_PLAIN
    from benchmarks.siglo_subject import SigloSubject
    from siglo.checkpoint import Checkpoint
    from siglo_sql.keys import row_id
    from siglo_sql.rows import checkpoint_row

    async def statements() -> Any:
        subject = SigloSubject("sqlite", f"sqlite:///{tmp_path}/siglo.db")
        await subject.open()
        try:
            return subject.b.adapter._s  # type: ignore[attr-defined]
        finally:
            await subject.close()

    s = asyncio.run(statements())
    searched = {"NoneType", "bytes"}
    cp = Checkpoint(stack_id="s", revision=1, timestamp=now_ms(), contexts=make_contexts(1024))
    row = {**checkpoint_row(cp, None, now_ms()), "expected": None}
    kinds = _bound_kinds(s.cp_save_forward, row)
    assert sum(k in searched for k in kinds) == 6, kinds
    load = _bound_kinds(s.cp_load, {"id": row_id("", "s"), "now": now_ms()})
    assert sum(k in searched for k in load) == 1, load
    # raw-fast binds by position, in its statements' order: (stack id, revision, doc,
    # expires_at, now) for a plain save, (stack id, now) for a load.
    assert _SAVE_PLAIN.count("?") == 5 and _LOAD.count("?") == 2
    raw_save = [type(v).__name__ for v in ("s", 1, b"{}", None, now_ms())]
    assert sum(k in searched for k in raw_save) == 2
