"""What ``siglo check`` shows while it runs and what it leaves behind; ``SIGLO_URL``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import siglo
from siglo.cli import cli

POSTGRES_URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")


def test_progress_shows_the_total_and_rule_ids_and_the_title_the_url() -> None:
    result = CliRunner().invoke(
        cli, ["check", "memory://", "--rule", "checkpoint.occ.*", "-n", "3"], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    assert "siglo check memory://: " in result.stderr and " checks" in result.stderr
    assert "(checkpoint.occ.atomic)" in result.stderr  # each finished check names its rules
    assert "siglo check memory://" in result.stdout


def test_check_leaves_no_hypothesis_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "check", "memory://", "-n", "3", "--rule", "cache.*"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def _check_in(cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    # The context stream's checks draw text, and with this seed (the programs depend on
    # it alone) a character that makes Hypothesis build its Unicode tables: another seed
    # may draw none (seed 6 does not).
    args = ["check", "memory://", "-n", "3", "--seed", "1", "--rule", "context.*"]
    return subprocess.run(
        [sys.executable, "-m", "siglo", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**base, **env},
    )


def test_check_keeps_hypothesis_caches_in_the_user_cache_directory(tmp_path: Path) -> None:
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    done = _check_in(work, XDG_CACHE_HOME=str(cache))
    assert done.returncode == 0, done.stderr
    assert list(work.iterdir()) == []
    kept = cache / "siglo" / "hypothesis"
    # Only the Unicode tables: no example database, no constants read from modules
    # (siglo_contract/determinism.py).
    assert {p.name for p in kept.iterdir()} <= {"unicode_data", "tmp"}
    assert any((kept / "unicode_data").iterdir())


def test_check_runs_without_a_usable_cache_directory(tmp_path: Path) -> None:
    work, blocker = tmp_path / "work", tmp_path / "not-a-directory"
    work.mkdir()
    blocker.write_text("")
    done = _check_in(work, XDG_CACHE_HOME=str(blocker))
    assert done.returncode == 0, done.stderr
    assert list(work.iterdir()) == []
    assert blocker.read_text() == ""


def test_hypothesis_storage_directory_wins(tmp_path: Path) -> None:
    work, cache, storage = tmp_path / "work", tmp_path / "cache", tmp_path / "storage"
    work.mkdir()
    done = _check_in(work, XDG_CACHE_HOME=str(cache), HYPOTHESIS_STORAGE_DIRECTORY=str(storage))
    assert done.returncode == 0, done.stderr
    assert not cache.exists()
    assert any(storage.rglob("*"))


def test_the_default_sqlite_file_is_not_created(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "check", "-n", "3", "--rule", "cache.*"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "SIGLO_URL"},
    )
    assert done.returncode == 0, done.stderr
    assert "siglo check sqlite:///siglo-check.db" in done.stdout
    assert "isolated storage" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_credentials_are_masked_in_what_check_prints() -> None:
    base = POSTGRES_URL.split("://", 1)[1]
    host = base.rpartition("@")[2]
    url = f"postgresql://siglo_nobody:hunter2@{host}"
    result = CliRunner().invoke(cli, ["check", url], terminal_width=200)
    assert result.exit_code == 1
    assert "hunter2" not in result.output
    assert "siglo_nobody:***@" in result.output


def test_siglo_url_is_the_default_url_of_check_and_migrate(tmp_path: Path) -> None:
    env = {"SIGLO_URL": "memory://"}
    result = CliRunner().invoke(cli, ["check", "--rule", "cache.*", "-n", "3"], env=env)
    assert result.exit_code == 0, result.output
    assert "siglo check memory://" in result.stdout
    url = f"sqlite:///{tmp_path / 'env.db'}"
    migrated = CliRunner().invoke(cli, ["migrate"], env={"SIGLO_URL": url})
    assert migrated.exit_code == 0, migrated.output
    assert "migrated from version 0" in migrated.output


async def test_connect_without_a_url_reads_siglo_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIGLO_URL", f"sqlite:///{tmp_path / 'env.db'}")
    async with siglo.connect() as backend:
        assert backend.name == "sqlite"
    monkeypatch.delenv("SIGLO_URL")
    with pytest.raises(siglo.InvalidArgumentError, match="SIGLO_URL"):
        siglo.connect()


@pytest.mark.parametrize(
    "url",
    [
        lambda tmp: f"sqlite+aiosqlite:///{tmp / 'sa.db'}",
        lambda tmp: POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1),
    ],
    ids=["sqlite+aiosqlite", "postgresql+psycopg"],
)
def test_sqlalchemy_driver_urls_are_accepted(url: object, tmp_path: Path) -> None:
    assert callable(url)
    result = CliRunner().invoke(cli, ["check", url(tmp_path), "--rule", "cache.*", "-n", "3"])
    assert result.exit_code == 0, result.output
