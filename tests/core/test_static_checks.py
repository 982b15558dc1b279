"""The code is typed and linted as the house rules say: ``mypy --strict`` over every
package (siglo, the built-in backends, the suite, the benchmarks), ``ruff check`` and
``ruff format --check`` over the repository. Run in the default test command, so a
change that breaks them fails CI like any other test (docs/testing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def _mypy_cache() -> Path:
    """Where mypy keeps its incremental cache for this test: ``siglo-tests/mypy`` in the
    user's cache directory, not the checkout, so a fresh clone (CI's) starts from the last
    run's. mypy trusts a cached module only while its source's hash, the options and
    mypy's version are the ones it was checked with, so the verdict is a cold run's; a
    cold run takes about 45 s of CPU, a warm one a few."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "siglo-tests" / "mypy"


@pytest.mark.timeout(900)
def test_mypy_strict_is_clean() -> None:
    # The packages and strictness come from pyproject.toml.
    done = _run("mypy", "--cache-dir", str(_mypy_cache()))
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
