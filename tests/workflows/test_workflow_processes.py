"""Workflows across real processes on one SQLite file: a worker killed mid-step is
resumed by another, and an event is delivered by a different process than the one that
started the run (SPEC §8)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import siglo

pytest.importorskip("aiosqlite")

WORKER = Path(__file__).resolve().parents[1] / "support" / "workflow_worker.py"


def run_worker(url: str, log: Path, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), url, str(log), command],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_a_killed_worker_is_resumed_and_the_event_delivered_elsewhere(tmp_path: Path) -> None:
    # A crashed process's workflow lock is free once its lease lapses: a short lease
    # keeps the resume below from waiting out the 30 s default.
    url = f"sqlite:///{tmp_path / 'flows.db'}?workflow_lock_ttl_ms=1500"
    log = tmp_path / "steps.log"

    crashed = run_worker(url, log, "run", SIGLO_TEST_CRASH_IN_CHARGE="1")
    assert crashed.returncode == 17, crashed.stderr
    first_pid = log.read_text().split()[1]
    assert log.read_text().splitlines() == [f"reserve {first_pid}", f"charge {first_pid}"]

    # Another process resumes from the last checkpoint: reserve is not run again.
    async def resume() -> str:
        from workflow_worker import make_flow

        async with siglo.connect(url) as backend:
            manager = siglo.StorageManager(backend, error_mode="strict")
            with pytest.raises(siglo.WorkflowSuspended) as waiting:
                await make_flow(str(log)).resume("order-1", manager=manager)
            return waiting.value.correlation_key

    assert asyncio.run(resume()) == "approve:1"
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["reserve", "charge", "charge"]

    # A third process receives the webhook and finishes the run.
    delivered = run_worker(url, log, "deliver")
    assert delivered.returncode == 0, delivered.stderr
    assert "order 1 shipped, approved by ada" in delivered.stdout
    steps = [line.split() for line in log.read_text().splitlines()]
    assert [s[0] for s in steps] == ["reserve", "charge", "charge", "charge", "ship"]
    assert steps[-1][1] != first_pid

    # A second delivery of the same event is refused: the run resumed exactly once.
    again = run_worker(url, log, "deliver")
    assert again.returncode != 0
    assert "WaitRecordClaimError" in again.stderr
