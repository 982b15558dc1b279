"""The documentation runs: every ``python`` block of README.md and docs/**/*.md is executed
as a script, twice in the same directory (a second run on a persistent store must work
too), against the real backends; and ``mkdocs build --strict`` builds the site.

A block that is not meant to run is marked on the line before its fence with
``<!-- not run: REASON -->``; :data:`NOT_RUN` below lists each such block and why, and
the test fails when the pages and the list disagree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
POSTGRES_URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")

_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```\s*$", re.M | re.S)
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _NOT_RUN.search(before)
            found.append(
                Block(
                    str(page.relative_to(ROOT)),
                    line,
                    match.group(1),
                    marker.group(1) if marker else None,
                )
            )
    return found


NOT_RUN = {
    (
        "docs/running-the-contract-suite.md",
        "a third party's test module: it imports its own my_store",
    ),
    (
        "docs/safety.md",
        "a web handler's body: request and Response come from the web framework",
    ),
    (
        "docs/writing-a-backend.md",
        "a plugin's own module: MyAdapter's constructor is the plugin's",
    ),
}
"""The blocks that are not run, by page, and why (each marked on its page)."""


def test_blocks_not_run_are_listed_with_their_reason() -> None:
    marked = {(b.page, b.not_run) for b in blocks() if b.not_run}
    assert marked == NOT_RUN
    assert sum(b.not_run is None for b in blocks()) >= 10  # most blocks run


def _script(code: str) -> str:
    # The pages name the development servers' default URLs; a run elsewhere
    # (SIGLO_POSTGRES_URL, SIGLO_REDIS_URL) substitutes its own.
    code = code.replace("postgresql://127.0.0.1:5432/test", POSTGRES_URL)
    return code.replace("redis://127.0.0.1:6379/0", REDIS_URL)


def _drop_docs_schema() -> None:
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS siglo_docs CASCADE")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", [b for b in blocks() if b.not_run is None], ids=lambda b: b.id)
def test_code_block_runs_twice(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(_script(block.code), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "SIGLO_URL"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "backends"), str(ROOT / "contract_tests")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    # The PostgreSQL page's example keeps its tables in schema siglo_docs: both runs see
    # it, and it is gone before and after.
    uses_postgres = "schema=siglo_docs" in block.code
    if uses_postgres:
        _drop_docs_schema()
    try:
        for run in (1, 2):
            done = subprocess.run(
                [sys.executable, "-W", "error::RuntimeWarning", str(script)],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                env=env,
                timeout=300,
            )
            assert done.returncode == 0, f"{block.id}, run {run}:\n{done.stderr[-3000:]}"
    finally:
        if uses_postgres:
            _drop_docs_schema()


@pytest.mark.timeout(600)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if shutil.which("mkdocs") is None and not _has_module("mkdocs"):
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "index.html").exists()


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
