"""`siglo check URL` passes every rule for every built-in backend (issue 3's must-show).

Each runs the real command line in a subprocess, as CI and users run it. Servers that are
unreachable skip their backend with a plain message, except under CI=true.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _redis_helpers import REDIS_URL, require_redis
from sql_support import POSTGRES_URL, require_postgres


def run_siglo_check(url: str, tmp_path: Path) -> None:
    """Run `siglo check URL` in a subprocess; it must pass every rule it checks."""
    report = tmp_path / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "check", url, "--junit-xml", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "FAIL" not in done.stdout
    xml = report.read_text()
    assert 'failures="0"' in xml


@pytest.mark.rule("capability.declared")
@pytest.mark.parametrize(
    "url",
    ["memory://", "sqlite://", "sqlite:///siglo-contract.db"],
    ids=["memory", "sqlite-memory", "sqlite-file"],
)
def test_siglo_check_embedded_backends(url: str, tmp_path: Path) -> None:
    run_siglo_check(url, tmp_path)


@pytest.mark.rule("capability.declared")
def test_siglo_check_postgres(tmp_path: Path) -> None:
    require_postgres()
    run_siglo_check(POSTGRES_URL, tmp_path)


@pytest.mark.rule("capability.declared")
def test_siglo_check_redis(tmp_path: Path) -> None:
    require_redis()
    run_siglo_check(REDIS_URL, tmp_path)
