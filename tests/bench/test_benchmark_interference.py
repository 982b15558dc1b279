"""Passes timed again when the hypervisor stole the machine during them
(benchmarks/interference.py), and how the report counts them.

The hypervisor's steal cannot be produced from inside the machine, so these tests give
``timed_pass`` the clock ticks ``/proc/stat`` would have shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import interference, report


def _ticks(monkeypatch: pytest.MonkeyPatch, shares: list[float | None]) -> None:
    """Each attempt sees 1,000 ticks of which ``share`` were stolen (``None``: no
    /proc/stat)."""
    readings: list[tuple[int, int] | None] = []
    now = [0, 0]
    for share in shares:
        if share is None:
            readings += [None, None]
            continue
        readings.append((now[0], now[1]))
        now = [now[0] + round(1000 * share), now[1] + 1000]
        readings.append((now[0], now[1]))
    it: Iterator[tuple[int, int] | None] = iter(readings)
    monkeypatch.setattr(interference, "cpu_times", lambda: next(it))


def _counting() -> tuple[list[int], Any]:
    calls: list[int] = []

    async def run() -> int:
        calls.append(len(calls) + 1)
        return len(calls)

    return calls, run


async def test_a_pass_over_the_limit_is_timed_again_and_the_quiet_one_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _ticks(monkeypatch, [0.30, 0.25, 0.04])
    calls, run = _counting()
    kept = await interference.timed_pass(run, limit=0.10, retimes=3, pause_s=0)
    assert calls == [1, 2, 3]
    assert kept.result == 3  # the third attempt's measurement, not a blend
    assert (kept.stolen, kept.ticks, kept.retimed, kept.over_limit) == (40, 1000, 2, False)


async def test_after_the_last_retime_the_pass_is_kept_and_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _ticks(monkeypatch, [0.30, 0.30, 0.30])
    calls, run = _counting()
    kept = await interference.timed_pass(run, limit=0.10, retimes=2, pause_s=0)
    assert calls == [1, 2, 3]
    assert (kept.result, kept.retimed, kept.over_limit) == (3, 2, True)


async def test_at_the_limit_or_without_proc_stat_the_first_attempt_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _ticks(monkeypatch, [0.10])
    calls, run = _counting()
    kept = await interference.timed_pass(run, limit=0.10, retimes=3, pause_s=0)
    assert (calls, kept.retimed, kept.over_limit) == ([1], 0, False)

    _ticks(monkeypatch, [None])
    calls, run = _counting()
    kept = await interference.timed_pass(run, limit=0.10, retimes=3, pause_s=0)
    assert (calls, kept.stolen, kept.ticks, kept.over_limit) == ([1], 0, 0, False)


async def test_a_limit_of_one_never_times_again(monkeypatch: pytest.MonkeyPatch) -> None:
    _ticks(monkeypatch, [0.9])
    calls, run = _counting()
    kept = await interference.timed_pass(run, limit=1.0, retimes=3, pause_s=0)
    assert (calls, kept.retimed) == ([1], 0)


def test_the_report_counts_the_passes_timed_again() -> None:
    def result(kind: str, retimed: list[int], over: list[int]) -> dict[str, Any]:
        return {"kind": kind, "status": "ok", "runs": [1.0] * 3, "retimed": retimed,
                "over_limit": over}  # fmt: skip

    doc: dict[str, Any] = {
        "meta": {"slices": 3, "steal_limit": 0.1, "retimes": 3},
        "results": [result("siglo", [0, 2, 0], [0, 0, 0]), result("raw", [1, 0, 0], [0, 1, 0])],
        "e2e": [{"status": "ok", "retimed": [1, 0, 0], "over_limit": [0, 0, 0]}],
    }
    text = report.retimed_text(doc)
    assert text == (
        "Passes timed again because more than 10% of the machine's CPU time was stolen "
        "during them (benchmarks/interference.py): 4 attempts dropped for 27 passes kept; "
        "1 kept over the limit after 3 attempts more."
    )
    doc["meta"] = {"slices": 3}  # a run recorded before passes were timed again
    assert report.retimed_text(doc) is None
