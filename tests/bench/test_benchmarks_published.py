"""The published benchmark page agrees with the run it was rendered from.

docs/benchmarks.md says how many targets its run met and that a target counts as met
only when every round meets it; these tests hold the page and its ``results.json`` to
that, so a hand edit or a stale render cannot report a cell as met whose rounds miss.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "docs" / "benchmarks" / "results.json"


def _targets() -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = json.loads(RESULTS.read_text())["targets"]
    assert targets
    return targets


def test_no_published_target_is_met_on_a_round_that_misses_it() -> None:
    for t in _targets():
        at_most = t["target"].startswith("load latency")  # the one "at most" target
        whole_range_meets = (
            t["ratio_max"] <= t["threshold"] if at_most else t["ratio_min"] >= t["threshold"]
        )
        assert t["met"] == whole_range_meets, t
        # the range holds the median it is published with
        assert t["ratio_min"] <= t["ratio"] <= t["ratio_max"], t


def test_the_page_counts_the_targets_its_run_met() -> None:
    targets = _targets()
    met = sum(1 for t in targets if t["met"])
    page = PAGE.read_text()
    assert f"Targets met: {met} of {len(targets)}" in page  # the rendered section
    summary = re.search(r"\*\*(\d+) of (\d+) targets met, counting a target", page)
    assert summary is not None, "the 'Targets: met and missed' section states the count"
    assert (int(summary[1]), int(summary[2])) == (met, len(targets))


def test_every_missed_target_is_listed_with_its_range() -> None:
    page = PAGE.read_text()
    for t in _targets():
        if not t["met"]:
            row = f"| {t['backend']} | {t['workload']} | {t['ratio']:.2f} ({t['ratio_min']:.2f}–"
            assert row in page, row
