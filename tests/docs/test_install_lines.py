"""No install line can fetch the unrelated ``siglo`` on PyPI (1.0.x, 2022) instead of
siglo: every ``pip install`` in the README, the docs and the example plugin names siglo by
path, or with a version specifier that excludes 1.0.4; the example plugin's dependency
excludes it too."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
UNRELATED = "1.0.4"
"""The unrelated project's release on PyPI."""


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [*pages, *sorted((ROOT / "examples").rglob("*.md"))]


def _requirements(line: str) -> list[str]:
    """The requirements a ``pip install`` command line names (not paths, not options)."""
    args = line.split("pip install", 1)[1].split("#", 1)[0]
    args = args.split("`", 1)[0].split("&&", 1)[0]
    found = []
    for token in args.split():
        token = token.strip("'\",;()")
        if not token or token.startswith(("-", ".", "/")) or "placeholder" in token:
            continue
        found.append(token)
    return found


def test_every_install_line_excludes_the_unrelated_siglo() -> None:
    checked = 0
    for page in _pages():
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            if "pip install" not in line:
                continue
            for text in _requirements(line):
                requirement = Requirement(text)
                if requirement.name != "siglo":
                    continue
                checked += 1
                assert not requirement.specifier.contains(UNRELATED, prereleases=True), (
                    f"{page.relative_to(ROOT)}:{number}: {text!r} can install PyPI's unrelated "
                    "siglo: install from a checkout or pin it below 1"
                )
    assert checked >= 1


def test_the_example_plugin_cannot_depend_on_the_unrelated_siglo() -> None:
    project = tomllib.loads((ROOT / "examples/siglo-filestore/pyproject.toml").read_text())
    (dependency,) = [
        d for d in project["project"]["dependencies"] if Requirement(d).name == "siglo"
    ]
    assert not Requirement(dependency).specifier.contains(UNRELATED)
    assert Requirement(dependency).specifier.contains("0.1.0")
