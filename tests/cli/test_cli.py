"""The `siglo` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from siglo.cli import cli


@pytest.mark.rule("plugins.discovery")
def test_backends_table_and_json() -> None:
    runner = CliRunner()
    table = runner.invoke(cli, ["backends"], terminal_width=200)
    assert table.exit_code == 0, table.output
    assert "memory" in table.output and "memory://" in table.output
    assert "installed" in table.output
    as_json = runner.invoke(cli, ["backends", "--json"])
    assert as_json.exit_code == 0
    rows = {row["plugin"]: row for row in json.loads(as_json.output)}
    memory = rows["memory"]
    assert memory["distribution"] == "siglo"
    assert memory["status"] == "ok"
    backend = memory["backends"][0]
    assert backend["schemes"] == ["memory"]
    assert "checkpoints" in backend["capabilities"]
    assert backend["driver_installed"] is True


def test_python_dash_m_siglo_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "--version"], capture_output=True, text=True, check=True
    )
    assert "siglo" in done.stdout


def test_version_comes_from_the_distribution_metadata() -> None:
    from importlib.metadata import version

    import siglo

    assert siglo.__version__ == version("siglo")
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == f"siglo {version('siglo')}"
