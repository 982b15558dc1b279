"""Where hypothesis keeps its caches while ``run_contract`` runs: siglo's user cache
directory, then back where it was; nothing in the working directory
(docs/running-the-contract-suite.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import configuration

from siglo_contract import run_contract
from siglo_contract.hypothesis_home import cache_dir, hypothesis_home


def _home() -> object:
    return getattr(configuration, "__hypothesis_home_directory", None)


def test_a_run_uses_the_user_cache_directory_and_restores_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HYPOTHESIS_STORAGE_DIRECTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    before = _home()
    mine = tmp_path / "mine"
    configuration.set_hypothesis_home_dir(mine)
    try:
        seen: list[object] = []

        def on_plan(_: object) -> None:
            seen.append(_home())

        report = run_contract("memory://", rules=["cache.*"], examples=2, seed=3, on_plan=on_plan)
        assert report.ok
        assert seen == [tmp_path / "cache" / "siglo" / "hypothesis"]
        assert cache_dir() == tmp_path / "cache" / "siglo" / "hypothesis"
        assert _home() == mine  # restored
    finally:
        configuration.set_hypothesis_home_dir(before)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_the_storage_directory_variable_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(tmp_path / "storage"))
    before = _home()
    with hypothesis_home():
        assert _home() == before
    assert not (tmp_path / "cache").exists()


def test_without_a_usable_cache_directory_a_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.delenv("HYPOTHESIS_STORAGE_DIRECTORY", raising=False)
    before = _home()
    with hypothesis_home():
        during = _home()
        assert isinstance(during, Path) and during.name.startswith("siglo-check-hypothesis-")
        assert during.is_dir()
    assert not during.exists()
    assert _home() == before
    assert blocker.read_text() == ""
