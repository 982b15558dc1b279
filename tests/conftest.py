"""Shared fixtures and configuration of siglo's own tests."""

from __future__ import annotations

import os

import pytest
from mutant_seeds import mutant_base_seed

import siglo
from siglo import ManualClock

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("siglo mutants", "the contract suite's mutation test")
    group.addoption(
        "--mutant-seeds",
        type=int,
        default=int(os.environ.get("SIGLO_MUTANT_SEEDS", "1")),
        help="How many seeds tests/suite/test_contract_mutants.py runs every mutant with "
        "(default: $SIGLO_MUTANT_SEEDS, else 1).",
    )
    group.addoption(
        "--mutant-seed",
        type=int,
        default=None,
        help="The first of those seeds (default: derived from the commit, printed in the header).",
    )
    group.addoption(
        "--mutant-whole",
        action="store_true",
        default=os.environ.get("SIGLO_MUTANT_WHOLE", "") not in ("", "0"),
        help="Run the whole suite against every mutant instead of the trimmed run "
        "(tests/support/mutant_runs.py; default: $SIGLO_MUTANT_WHOLE).",
    )


def pytest_report_header(config: pytest.Config) -> str:
    seeds = config.getoption("mutant_seeds")
    base = mutant_base_seed(config)
    whole = " --mutant-whole" if config.getoption("mutant_whole") else ""
    return (
        f"mutant seeds: {base}..{base + seeds - 1} "
        f"(--mutant-seed {base} --mutant-seeds {seeds}{whole})"
    )


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
