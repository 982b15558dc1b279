"""Shared fixtures and configuration of siglo's own tests."""

from __future__ import annotations

import pytest

import siglo
from siglo import ManualClock

pytest_plugins = ["pytester"]


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
