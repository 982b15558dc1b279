"""The published benchmark page agrees with the run it was rendered from.

docs/benchmarks.md says how many targets its run met and that a target counts as met
only when every round meets it; these tests hold the page and its ``results.json`` to
that, so a hand edit or a stale render cannot report a cell as met whose rounds miss.
The page's results section is exactly what the renderer makes of ``results.json``, and
the page stays method and results: at most 250 lines, its history on a page of its own.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from benchmarks import report

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"
HISTORY = ROOT / "docs" / "benchmarks-history.md"
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
        if t["target"] == report.WORKFLOW_GOAL:  # the limit's share, or 10x the others
            others = t["versus"].values()
            whole_range_meets |= bool(others) and all(lo >= 10.0 for lo, _ in others)
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


def test_the_results_section_is_the_render_of_results_json(tmp_path: Path) -> None:
    # The page rendered again from its results.json, beside its charts, as
    # `python -m benchmarks --render … --out docs/benchmarks --update-docs …` does.
    (tmp_path / "benchmarks").mkdir()
    charts = ["ratios.png", "ops.png", "e2e.png"]
    charts += [p.name for p in RESULTS.parent.glob(report.backend_chart_name("*"))]
    for chart in charts:
        shutil.copy(RESULTS.parent / chart, tmp_path / "benchmarks" / chart)
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE.read_text())
    doc = json.loads(RESULTS.read_text())
    report.add_ratios_and_targets(doc)
    out = tmp_path / "benchmarks"
    report.update_page(page, doc, out / "ratios.png", out / "results.md")
    assert page.read_text() == PAGE.read_text()
    # … and the whole report beside it is the render's too.
    assert (RESULTS.parent / "results.md").read_text() == report.markdown(doc)


def test_the_page_is_method_and_results_and_links_its_history() -> None:
    page = PAGE.read_text()
    assert len(page.splitlines()) <= 250
    assert "](benchmarks-history.md)" in page
    assert " round (issue 15)" not in page and HISTORY.exists()
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "benchmarks-history.md" in nav


RAW_FAST = ROOT / "docs" / "benchmarks" / "raw-fast" / "results.json"


def test_the_raw_fast_section_is_the_render_of_its_run() -> None:
    """The page's raw-fast figures (both raw columns, loop lag, writes per run) and its
    load average are those of docs/benchmarks/raw-fast/results.json, and the report it
    links is that run's render."""
    doc = json.loads(RAW_FAST.read_text())
    report.add_ratios_and_targets(doc)
    page = PAGE.read_text()
    section = page.split("## Raw-fast, loop lag, writes per run", 1)[1].split("\n## ", 1)[0]
    for line in report.raw_fast_summary(doc):
        assert line in section, line
    load = doc["meta"]["load"]
    assert f"load average {load['start'][0]:.2f} at the start, {load['end'][0]:.2f}" in section
    assert "](benchmarks/raw-fast/results.md)" in section
    assert (RAW_FAST.parent / "results.md").read_text() == report.markdown(doc)
