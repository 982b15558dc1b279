"""The code is typed and linted as the house rules say: ``mypy --strict`` over every
package (siglo, the built-in backends, the suite, the benchmarks), ``ruff check`` and
``ruff format --check`` over the repository. Run in the default test command, so a
change that breaks them fails CI like any other test (docs/testing.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.timeout(900)
def test_mypy_strict_is_clean() -> None:
    done = _run("mypy")  # the packages and strictness come from pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr


def _tracked_tops() -> list[str]:
    """The checkout's top-level directories, Python and TOML files that git tracks (``.``
    outside a git checkout): what ruff walks. Not ``.`` itself: another test's
    temporary directory made and removed there meanwhile failed the walk (``io: …: No
    such file or directory``)."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    except OSError:  # no git here
        return ["."]
    if listed.returncode != 0 or not listed.stdout:
        return ["."]
    tops = {path.split("/", 1)[0] for path in listed.stdout.splitlines()}
    return sorted(t for t in tops if (ROOT / t).is_dir() or t.endswith((".py", ".toml")))


@pytest.mark.parametrize("command", [("ruff", "check"), ("ruff", "format", "--check")])
def test_ruff_is_clean(command: tuple[str, ...]) -> None:
    done = _run(*command, *_tracked_tops())
    assert done.returncode == 0, done.stdout + done.stderr
