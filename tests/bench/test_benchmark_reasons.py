"""The measured reasons the report prints beside a missed target (benchmarks/reasons.py):
what the product is now, not a lab diary, and the lowest round's figures from the run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.reasons import NO_REASON, REASONS, lowest_round_text, reason_for

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
