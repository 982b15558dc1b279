"""The settings tests' clean slate: imported by a test module, it applies to each test of
that module (an autouse fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from siglo.config import CONFIG_ENV, ENVIRONMENT, reset_settings

__all__ = ["clean_settings"]


@pytest.fixture(autouse=True)
def clean_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test in an empty directory, without SIGLO_* variables, with fresh settings."""
    for name in (*ENVIRONMENT, CONFIG_ENV):
        # Set, then removed: monkeypatch restores the variable's absence afterwards even
        # when the code under test sets it (siglo --config does, for its process).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    reset_settings()
    yield
    reset_settings()
