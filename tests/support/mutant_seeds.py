"""The seeds of the mutation test (tests/suite/test_contract_mutants.py)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

__all__ = ["mutant_base_seed"]


def commit_seed() -> int:
    """A seed derived from the checked-out commit: it rotates with every commit, and a
    run of the same commit repeats (random where the tree is not a git checkout)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        return int(head[:8], 16)
    except (OSError, subprocess.SubprocessError, ValueError):
        return random.randrange(2**31)


def mutant_base_seed(config: pytest.Config) -> int:
    """The first mutant seed of this run (``--mutant-seed``, else the commit's)."""
    given: int | None = config.getoption("mutant_seed")
    return commit_seed() if given is None else given
