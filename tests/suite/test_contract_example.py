"""The example third-party plugin (examples/siglo-filestore) passes what it declares."""

from __future__ import annotations

import importlib.util
import os

import pytest

from siglo_contract.runner import run_contract

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("siglo_filestore") is None and os.environ.get("CI") != "true",
    reason="pip install ./examples/siglo-filestore to run the example plugin's contract check",
)


def test_example_plugin_passes_its_declared_rules() -> None:
    report = run_contract("filestore:///unused", seed=11)
    verdicts = {rid: r.verdict for rid, r in report.results.items()}
    assert report.ok, [r.detail for r in report.failures]
    declared = {rid for rid, v in verdicts.items() if v == "pass"}
    assert {"checkpoint.occ.atomic", "cache.falsy-hit", "ids.hostile"} <= declared
    assert verdicts["wait.claim.once"] == "not supported"
    assert verdicts["nonce.expiry"] == "not supported"
