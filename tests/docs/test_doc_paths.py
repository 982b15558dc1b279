"""Every source file the docs name exists: a page that names a module is a claim about
where the code is, and a move or a split must carry the page along."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("docs/**/*.md"), ROOT / "README.md"])
SOURCE_ROOTS = (ROOT, ROOT / "backends", ROOT / "contract_tests")
"""Where a named path may start: the repository, or a source root (``siglo_sqlite/…``)."""
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
"""Code blocks: their paths are the reader's own (``tests/test_siglo_contract.py``)."""
NAMED = re.compile(
    r"`((?:siglo\w*|backends|contract_tests|benchmarks|tests|examples)/[\w/.-]*\.(?:py|lua))`"
)
"""A path into this repository (an illustration's ``my_store/connect.py`` is not one)."""


def named_paths(text: str) -> set[str]:
    return set(NAMED.findall(FENCED.sub("", text)))


def test_the_source_files_the_docs_name_exist() -> None:
    missing = {
        f"{page.relative_to(ROOT)}: {path}"
        for page in PAGES
        for path in named_paths(page.read_text(encoding="utf-8"))
        if not any((root / path).exists() for root in SOURCE_ROOTS)
    }
    assert missing == set()


def test_the_check_sees_a_path_and_skips_code_blocks() -> None:
    text = "`siglo_sqlite/database.py`, `my_store/x.py`\n```python\n# `tests/mine.py`\n```\n"
    assert named_paths(text) == {"siglo_sqlite/database.py"}
