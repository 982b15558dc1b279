"""The suite on storage shared by every example (the path of SQL and Redis backends):
an ``isolated`` factory opened once per run, a random id prefix per example, and new
connections by URL for the concurrent callers."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

from siglo import Backend, Capability
from siglo_contract.runner import run_contract
from siglo_contract.target import Target
from siglo_memory import connect as memory_connect


@contextlib.asynccontextmanager
async def _isolated(**options: Any) -> AsyncIterator[Backend]:
    # memory://NAME is one store per name in this process: a stand-in for a server.
    backend = memory_connect(f"memory://contract-{secrets.token_hex(4)}", **options)
    yield backend


def _target(capabilities: frozenset[Capability]) -> Target:
    return Target(
        label="memory://shared",
        capabilities=capabilities,
        multiprocess=False,
        factory=lambda **options: memory_connect("memory://", **options),
        isolated=_isolated,
    )


def test_shared_storage_with_a_manual_clock() -> None:
    report = run_contract(_target(frozenset(Capability)), seed=2)
    assert report.ok, [r.detail for r in report.failures]


def test_shared_storage_in_real_time() -> None:
    caps = frozenset(c for c in Capability if c is not Capability.CLOCK)
    report = run_contract(_target(caps), seed=3, examples=10)
    assert report.ok, [r.detail for r in report.failures]
