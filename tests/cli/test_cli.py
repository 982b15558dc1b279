"""The `siglo` command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from siglo.cli import cli

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_design_page_lists_every_command_with_its_arguments_and_module() -> None:
    """docs/design.md's "The command line" names, one line each and in `siglo --help`'s
    order, every command with its arguments as its usage shows them and the module under
    siglo/cli/ that holds it."""
    page = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = page.split("\n## The command line\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `siglo ([a-z-]+)((?: [^`]+)?)` \(`([a-z_]+)\.py`\): \S", section, re.M)
    assert len(listed) == section.count("\n- `siglo "), section
    ctx = click.Context(cli, info_name="siglo")
    want = []
    for name in cli.list_commands(ctx):
        command = cli.commands[name]
        assert command.callback is not None
        args = [p for p in command.collect_usage_pieces(ctx) if p != "[OPTIONS]"]
        module = command.callback.__module__.removeprefix("siglo.cli.")
        want.append((name, "".join(f" {a}" for a in args), module))
    assert listed == want
