"""The example third-party plugin (examples/siglo-filestore) passes what it declares."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from siglo_contract.runner import run_contract

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("siglo_filestore") is None and os.environ.get("CI") != "true",
    reason="pip install ./examples/siglo-filestore to run the example plugin's contract check",
)


def test_example_plugin_passes_its_declared_rules(tmp_path: Path) -> None:
    report = run_contract(f"filestore://{tmp_path}", seed=11)
    verdicts = {rid: r.verdict for rid, r in report.results.items()}
    assert report.ok, [r.detail for r in report.failures]
    declared = {rid for rid, v in verdicts.items() if v == "pass"}
    assert {"checkpoint.occ.atomic", "cache.falsy-hit", "ids.hostile"} <= declared
    assert verdicts["wait.claim.once"] == "not supported"
    assert verdicts["nonce.expiry"] == "not supported"


def test_siglo_check_refuses_what_the_plugins_connect_refuses(tmp_path: Path) -> None:
    """The example's suite factory ignored its URL: `siglo check` passed a URL with an
    unknown option, or a directory that cannot be made, which `siglo.connect` refuses (a
    black-box auditor). Both are one error line now; a good URL's suite storage is a
    directory inside the URL's, removed afterwards."""
    from click.testing import CliRunner

    import siglo
    from siglo.cli import cli
    from siglo.errors import InvalidArgumentError

    for url in (f"filestore://{tmp_path}?cache_tl_ms=5", "filestore:///proc/no/such/dir"):
        with pytest.raises(InvalidArgumentError):
            siglo.connect(url)
        done = CliRunner().invoke(cli, ["check", url, "--rule", "checkpoint.roundtrip"])
        assert done.exit_code == 1, done.output
        assert "Error:" in done.output and "Traceback" not in done.output, done.output
    done = CliRunner().invoke(
        cli, ["check", f"filestore://{tmp_path}", "--rule", "checkpoint.roundtrip"]
    )
    assert done.exit_code == 0, done.output
    assert list(tmp_path.iterdir()) == []
