"""The measured reasons the report prints beside a missed target (benchmarks/reasons.py):
what the product is now, not a lab diary, and the lowest round's figures from the run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.reasons import (
    NO_REASON,
    REASONS,
    computed_reason,
    lowest_round_text,
    reason_for,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks" / "results.json"

_ORDINAL_ROUND = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
    r"twelfth|thirteenth|\d+(st|nd|rd|th))\s+round",
    re.IGNORECASE,
)
_COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("reason", REASONS, ids=lambda r: f"{r.backend}-{r.name}-{r.size}")
def test_a_reason_reads_as_the_product_not_as_a_diary(reason: Any) -> None:
    assert not _ORDINAL_ROUND.search(reason.text), reason.text
    assert not _COMMIT.search(reason.text), reason.text


def test_the_diary_patterns_would_catch_a_diary() -> None:
    assert _ORDINAL_ROUND.search("in the thirteenth round's run")
    assert _COMMIT.search("measured at 6230cac")
    assert not _COMMIT.search("1,000,000 rows in 1,151-1,336 us, ratio 2.08")


def _target(**fields: Any) -> dict[str, Any]:
    base = {"backend": "postgres", "name": "load", "size": "256k", "concurrency": 32}
    return {**base, **fields}


def test_the_lowest_round_is_told_as_the_clients_cpu_and_busy_share() -> None:
    # siglo 2.0 ms a load, the baseline 3.0: a CPU ratio of 1.50; at a round ratio of
    # 1.20 siglo's client was busy 0.80 x as much of the round as the baseline's.
    target = _target(
        rounds=[1.6, 1.2, 1.5],
        cpu=[[1.9, 0.4, 3.0, 1.0], [2.0, 0.5, 3.0, 1.2], [2.0, 0.4, 3.1, 1.1]],
    )
    text = lowest_round_text(target)
    assert text is not None
    assert "lowest round (1.20)" in text
    assert "spent 2.00 ms of CPU an operation (0.50 collecting)" in text
    assert "the baseline's 3.00 (1.20), a CPU ratio of 1.50" in text
    assert "busy 0.80 x as much of the round" in text
    assert reason_for(target).endswith(text)


def test_without_recorded_cpu_the_reason_stands_alone() -> None:
    for target in (_target(), _target(rounds=[1.2, 1.3], cpu=[])):
        assert lowest_round_text(target) is None
        assert reason_for(target) == next(r.text for r in REASONS if r.matches(target))


def test_a_miss_no_reason_matches_has_no_reason() -> None:
    assert reason_for(_target(backend="memory")) == NO_REASON


def test_every_published_miss_has_a_measured_reason() -> None:
    targets = json.loads(RESULTS.read_text())["targets"]
    missed = [t for t in targets if not t["met"]]
    for t in missed:
        assert reason_for(t) != NO_REASON, t


def _fast(**fields: Any) -> dict[str, Any]:
    """A missed raw-fast target as the report makes it."""
    return _target(
        **{"vs": "raw-fast", "name": "save", "size": "16k", "backend": "sqlite", **fields}
    )


def test_a_raw_fast_miss_gets_a_reason_computed_from_its_run() -> None:
    # The lowest round (0.30): siglo 0.40 ms of CPU a save, raw-fast 0.10 (a CPU ratio of
    # 0.25, below the round's ratio): siglo's client CPU bounds it; siglo sent 3
    # statements a save against raw-fast's 1.
    target = _fast(
        rounds=[0.5, 0.3],
        cpu=[[0.3, 0.0, 0.1, 0.0], [0.4, 0.0, 0.1, 0.0]],
        statements=[3.0, 1.0],
        conflicts=[],
    )
    text = reason_for(target)
    assert text == computed_reason(target)
    assert text.startswith("siglo's client CPU an operation: 0.400 ms against raw-fast's 0.100")
    assert "(4.00x) in the lowest round (0.30), which alone bounds the ratio at 0.25" in text
    assert "siglo's client busy 1.20x as much of the round" in text
    assert "siglo sent 3.00 statements (Redis: commands) an operation against raw-fast's 1.00" in (
        text
    )
    assert text.endswith("(figures of this run)")
    # A document at least siglo's incremental_min_bytes is stored in parts (siglo_sql):
    # the run recorded both sizes, and the reason says so.
    stored = {"document_bytes": 16_391, "incremental_min_bytes": 16_384}
    assert (
        "the cell's document is 16,391 bytes encoded, at least siglo's incremental_min_bytes "
        "(16,384): siglo stores it in parts, raw-fast whole (figures of this run)"
    ) in reason_for({**target, "parts": stored})


def test_a_run_records_which_cells_siglo_stored_in_parts() -> None:
    from benchmarks import report

    doc: dict[str, Any] = {
        "meta": {
            "document_bytes": {"1k": 1_128, "16k": 16_391},
            "siglo_incremental_min_bytes": {"sqlite": 16_384},
        },
        "results": [
            {
                "backend": b,
                "kind": kind,
                "workload": f"save/{size}/c1",
                "name": "save",
                "size": size,
                "concurrency": 1,
                "runs": [1.0],
                "median": 1.0,
            }
            for b in ("sqlite", "redis")
            for kind in ("siglo", "raw-fast")
            for size in ("1k", "16k")
        ],
    }
    report.add_ratios_and_targets(doc)
    parts = {(x["backend"], x["size"]) for x in doc["ratios"] if "parts" in x}
    assert parts == {("sqlite", "16k")}


def test_a_miss_whose_client_waited_says_so_with_its_conflicts() -> None:
    # Equal CPU a compare-and-set, but the round at 0.5: siglo's client was busy half as
    # much of the round; its writers lost more updates than raw-fast's.
    target = _fast(
        name="cas",
        rounds=[0.5],
        cpu=[[0.2, 0.0, 0.2, 0.0]],
        statements=[2.0, 2.0],
        conflicts=[[1.5, 0.0]],
    )
    text = computed_reason(target)
    assert text is not None
    assert text.startswith("waiting: in the lowest round (0.50) siglo's client was busy 0.50x")
    assert "statements" not in text  # the same on both sides: not a reason
    assert "lost 1.50 compare-and-sets per successful update against raw-fast's 0.00" in text


def test_the_end_to_end_goal_miss_is_told_against_the_raw_write_limit() -> None:
    target = {
        "vs": "raw-limit",
        "backend": "sqlite",
        "writes_per_run": 10.0,
        "limit_writes_per_s": 20_000.0,
        "limit_runs_per_s": 2_000.0,
        "runs_per_s": 500.0,
        "rounds": [0.3, 0.25],
        "cpu_ms_per_run": [1.9, 2.0],
        "versus": {"dbos": [5.0, 6.0]},
    }
    text = reason_for(target)
    assert text.startswith(
        "siglo issued 10.0 store writes per run; the raw driver's 20,000 writes/s at 32 "
        "writers make 2,000 runs/s the limit, and siglo ran 500 runs/s"
    )
    assert (
        "2.00 ms of CPU a run in the lowest round: one core runs 500 of them a second, "
        "0.25 of the limit" in text
    )
    assert "dbos 5.00-6.00x" in text


def test_the_limit_share_is_each_rounds_runs_over_its_raw_rate_per_run() -> None:
    from benchmarks.write_limit import add_limit_ratios

    doc: dict[str, Any] = {
        "e2e_limit": [
            {
                "backend": "sqlite",
                "concurrency": 32,
                "status": "ok",
                "writes_per_s_rounds": [10_000.0, 20_000.0],
                "writes_per_s": 15_000.0,
            }
        ],
        "e2e": [
            {
                "backend": "sqlite",
                "system": "siglo",
                "concurrency": 32,
                "status": "ok",
                "runs_per_s_rounds": [800.0, 1_000.0],
                "runs_per_s": 900.0,
                "writes_per_run": 10.0,
            },
            {  # not counted: no share
                "backend": "sqlite",
                "system": "dbos",
                "concurrency": 32,
                "status": "ok",
                "runs_per_s_rounds": [80.0, 100.0],
                "runs_per_s": 90.0,
            },
        ],
    }
    add_limit_ratios(doc)
    (x,) = doc["e2e_limit_ratios"]
    assert x["system"] == "siglo" and x["rounds"] == [0.8, 0.5]
    assert (x["ratio_min"], x["ratio_max"], x["limit_runs_per_s"]) == (0.5, 0.8, 1_500.0)
