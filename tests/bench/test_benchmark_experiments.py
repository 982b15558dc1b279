"""The experiments in benchmarks/experiments/ still run: each prints every figure the docs
quote from it (no timing is asserted), and each says on its first line what it measured.
"""

from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "benchmarks" / "experiments").glob("[!_]*.py"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_an_experiment_says_what_it_measured_and_runs_as_a_module(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    assert doc is not None and doc.splitlines()[0].startswith("Measured "), path.name
    assert f"python -m benchmarks.experiments.{path.stem}" in doc, path.name
    assert any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
    ), f'{path.name} has no `if __name__ == "__main__":` block'


def test_the_harness_imports_no_experiment() -> None:
    for path in (ROOT / "benchmarks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            assert not any(n.startswith("benchmarks.experiments") for n in names), path.name


def test_the_pipelining_ab_runs_and_prints_both_ratios(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/benchmarks-history.md quotes this A/B: it runs and prints the save and load
    ratios."""
    from _redis_helpers import REDIS_URL, require_redis

    from benchmarks.experiments import pipelining_ab

    require_redis()
    monkeypatch.setattr(pipelining_ab, "ROUNDS", 2)
    monkeypatch.setattr(pipelining_ab, "OPS", 20)
    asyncio.run(pipelining_ab.main(REDIS_URL))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["save", "load"]
    assert all("pipelined / unpipelined speed, sequential, per round: median " in x for x in lines)


def test_the_sqlite_writes_ab_runs_and_prints_every_cell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/benchmarks-history.md and docs/backends/sqlite.md quote this A/B: it runs, one
    caller and several, and prints a ratio for each of its four cells."""
    from benchmarks.experiments import sqlite_writes_ab

    monkeypatch.setattr(sqlite_writes_ab, "OPS", 40)
    for callers in (1, 4):
        asyncio.run(sqlite_writes_ab.main(1, callers))
        lines = capsys.readouterr().out.splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "save 1k",
            "save 16k",
            "cas 1k",
            "cas 16k",
        ]
        assert all(f"{callers} caller(s)" in line for line in lines)


def test_the_sqlite_lookups_measure_both_files(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plain-sqlite3 lookups the SQLite scale miss cites: both files built, each
    round's cold and warm medians printed."""
    from benchmarks.experiments import sqlite_lookups

    monkeypatch.setattr(sqlite_lookups, "SAMPLES", 50)
    monkeypatch.setattr(sqlite_lookups, "WARMING", 100)
    sqlite_lookups.main(sizes=(100, 2_000), rounds=2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"round {n}: cold ") for n, line in enumerate(lines, 1))


def test_the_postgres_pipeline_ab_runs_and_prints_every_cell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/backends/postgres.md quotes this A/B: it runs and prints both ways of both
    writes."""
    from sql_support import POSTGRES_URL

    from benchmarks.experiments import postgres_pipeline_ab

    monkeypatch.setattr(postgres_pipeline_ab, "OPS", 10)
    monkeypatch.setattr(postgres_pipeline_ab, "URL", POSTGRES_URL)
    asyncio.run(postgres_pipeline_ab.main(2))
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split(":")[0] for line in lines) == [
        "context change, pipelined",
        "context change, transaction",
        "delete, pipelined",
        "delete, transaction",
    ]


def test_the_steal_ab_runs_and_prints_both_ways_of_counting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/benchmarks.md quotes this A/B (Method: what the machine took): it runs and
    prints the correlations and the rounds from first and from kept attempts."""
    from benchmarks.experiments import steal_ab

    asyncio.run(steal_ab.main("memory", "save", "1k", 1, rounds=3, pause_s=0))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6, lines
    assert lines[0].startswith("memory save/1k/c1: siglo first attempts: stolen share median")
    assert lines[1].startswith("memory save/1k/c1: raw first attempts:")
    assert "difference of their shares" in lines[2]
    assert lines[3].startswith("memory save/1k/c1: siglo / raw, first attempts, 3 rounds: ")
    assert lines[4].startswith("memory save/1k/c1: siglo / raw, kept attempts, 3 rounds: ")
    assert lines[5].startswith("memory save/1k/c1: passes timed again: ")
    assert lines[5].endswith(" of 18")  # 3 rounds of 3 passes of each subject


def test_the_lookahead_ab_runs_both_ways_and_restores_the_flow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/benchmarks-history.md and docs/workflows.md quote this A/B: it runs both ways,
    prints one line, and leaves the look-ahead in place."""
    import siglo.workflow.flow  # noqa: F401
    from benchmarks.experiments import lookahead_ab

    module = sys.modules["siglo.workflow.flow"]
    before = module._look_ahead
    asyncio.run(lookahead_ab.main("memory", 1, 4, 2))
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("memory c1: runs/s sent after ")
    assert line.endswith(", 2 blocks of 4 runs")
    assert module._look_ahead is before


def test_the_decoders_comparison_times_every_decoder(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/reasons.py quotes this (SQLite 256 KB loads): the same document decoded as
    JSON and as msgpack, every decoder timed, the decoded values the same."""
    ormsgpack = pytest.importorskip("ormsgpack")
    import orjson

    from benchmarks.experiments import decoders
    from benchmarks.payloads import make_contexts, wire_document

    doc = wire_document("same", 1, make_contexts(1024), expires_at=None)
    assert ormsgpack.unpackb(ormsgpack.packb(doc)) == orjson.loads(orjson.dumps(doc))
    decoders.main("1k", 2, 3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith("1k: ") and " as msgpack" in lines[0]
    for line, name in zip(
        lines[1:], ("orjson.loads", "ormsgpack.unpackb", "Checkpoint.from_json"), strict=True
    ):
        assert line.startswith(f"1k: {name} ") and line.endswith(", 2 rounds of 3")


def test_the_large_state_callgrind_experiment_runs_each_operation() -> None:
    """docs/benchmarks-large-state.md quotes its instruction counts: every mode and
    operation runs (a few operations, no valgrind)."""
    from benchmarks.experiments import large_state_callgrind

    for mode in ("whole", "parts"):
        for op in ("load", "save", "cycle", "resume"):
            assert asyncio.run(large_state_callgrind.run(mode, op, 3)) > 0


def test_the_loop_turns_run_and_print_every_workload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/backends/sqlite.md quotes these figures (group commit, a loop that keeps
    turning): it runs at both durabilities and prints a line a workload."""
    from benchmarks.experiments import loop_turns

    for synchronous in ("NORMAL", "FULL"):
        asyncio.run(loop_turns.main(synchronous, 0.02))
        lines = capsys.readouterr().out.splitlines()
        assert [line.split(" ")[0] for line in lines] == [
            "save/1k/c32",
            "load/1k/c32",
            "cas/1k/c32",
            "cas/1k/c8",
        ]
        assert all("CPU a turn p99" in line for line in lines)


def test_the_postgres_write_sync_ab_runs_and_prints_every_way(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/backends/postgres.md quotes this A/B (concurrent writes share a pipeline): it
    runs and prints the three ways."""
    from sql_support import POSTGRES_URL

    from benchmarks.experiments import postgres_write_sync_ab

    monkeypatch.setattr(postgres_write_sync_ab, "WRITES", 3)
    monkeypatch.setattr(postgres_write_sync_ab, "URL", POSTGRES_URL)
    asyncio.run(postgres_write_sync_ab.main(1))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["pool", "sync each", "one sync"]


def test_the_parts_ab_runs_every_cell_on_sqlite() -> None:
    from benchmarks.experiments.parts_ab import CELLS, run

    lines = asyncio.run(run("sqlite", 1, 4))
    assert lines[0] == "sqlite: the 16k document is 16,387 bytes encoded"
    assert len(lines) == 1 + len(CELLS)
    for line in lines[1:]:
        assert "parts " in line and "whole " in line and "raw-fast " in line, line
        assert "whole / parts " in line, line


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_flow_callgrind_runs_the_e2e_workflow(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/benchmarks-instructions.md ("A workflow run") quotes its counts: it runs the
    end-to-end benchmark's siglo workflow, warm-up and counted runs alike."""
    from benchmarks.experiments import flow_callgrind

    monkeypatch.setattr(flow_callgrind, "WARMUP", 2)
    assert asyncio.run(flow_callgrind.run(kind, 0)) == 0.0
    assert asyncio.run(flow_callgrind.run(kind, 3)) > 0.0


def test_the_e2e_statements_experiment_times_every_statement_of_a_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/benchmarks.md cites it for the end-to-end miss on SQLite: each round prints
    its runs/s, the statements a run with their time, and the loop's and the other
    threads' totals; the timed connections are undone afterwards."""
    import sqlite3

    from benchmarks.experiments import e2e_statements

    plain = sqlite3.connect
    e2e_statements.main(runs=64, rounds=2)
    assert sqlite3.connect is plain
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("round")] == [
        "round 1",
        "round 2",
    ]
    # Each run inserts its checkpoint and updates it once a step, on the loop's thread.
    saves = [line for line in lines if "loop   UPDATE siglo_checkpoints" in line]
    assert saves and all(line.split()[0] == "3.00" for line in saves), saves
    assert sum("in statements on the loop:" in line for line in lines) == 2
