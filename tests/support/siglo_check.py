"""``siglo check URL`` as CI and users run it: the real command line in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["run_siglo_check"]


def run_siglo_check(url: str, tmp_path: Path, *args: str) -> tuple[str, str]:
    """Run `siglo check URL [ARGS]` in a subprocess, in ``tmp_path`` (a relative SQLite
    URL's isolated directories are made beside it, not in the checkout); it must pass
    every rule it checks. Returns its output and its JUnit XML report."""
    report = tmp_path / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "check", url, "--junit-xml", str(report), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "FAIL" not in done.stdout
    xml = report.read_text()
    assert 'failures="0"' in xml
    return done.stdout, xml
