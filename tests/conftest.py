"""Shared fixtures and configuration of siglo's own tests."""

from __future__ import annotations

import os
import random

import pytest

import siglo
from siglo import ManualClock

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("siglo mutants", "the contract suite's mutation test")
    group.addoption(
        "--mutant-seeds",
        type=int,
        # Two under CI=true (with a random base, so each CI run tries two new seeds and
        # luck cannot pass it twice running); one locally, to stay quick. Three made the
        # CI run ~25 minutes once the real-backend mutants came in.
        default=int(os.environ.get("SIGLO_MUTANT_SEEDS", "2" if os.environ.get("CI") else "1")),
        help="How many seeds tests/test_contract_mutants.py runs every mutant with "
        "(default: $SIGLO_MUTANT_SEEDS, else 2 under CI, else 1).",
    )
    group.addoption(
        "--mutant-seed",
        type=int,
        default=random.randrange(2**31),
        help="The first of those seeds (default: random, printed in the header).",
    )


def pytest_report_header(config: pytest.Config) -> str:
    seeds = config.getoption("mutant_seeds")
    base = config.getoption("mutant_seed")
    return f"mutant seeds: {base}..{base + seeds - 1} (--mutant-seed {base} --mutant-seeds {seeds})"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rule(*ids): the docs/contract.md rule ids this test checks")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000_000)


@pytest.fixture
def memory(clock: ManualClock) -> siglo.Backend:
    return siglo.connect("memory://", clock=clock)


@pytest.fixture
def manager(memory: siglo.Backend, clock: ManualClock) -> siglo.StorageManager:
    return siglo.StorageManager(memory, clock=clock, error_mode="strict")
