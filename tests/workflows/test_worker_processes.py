"""``siglo worker`` in real processes on SQLite, PostgreSQL and Redis (SPEC §9): a run
whose process was SIGKILLed mid-step is recovered by a worker in another process without
re-running its finished steps, and a wait's deadline fires once with two workers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from ops_support import DURABLE_KINDS, shared_store, with_option

import siglo
from siglo.workflow import WorkflowSuspended

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "support"
LEASE_MS = 1_000
"""The workflow lock's lease: how soon a killed process's run is free to recover."""

pytestmark = pytest.mark.parametrize("kind", DURABLE_KINDS)


def _env(marks: Path, **extra: str) -> dict[str, str]:
    paths = [str(TESTS), str(ROOT), str(ROOT / "backends"), str(ROOT / "contract_tests")]
    old = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths + ([old] if old else [])),
        "SIGLO_TEST_MARKS": str(marks),
        **extra,
    }


def _worker(url: str, marks: Path, spec: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "siglo", "worker", url, "--flows", spec, "--interval", "0.05"],
        env=_env(marks),
        cwd=TESTS,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _started(process: subprocess.Popen[str]) -> str:
    """The worker's banner: printed once its settings are read, right before it takes
    SIGTERM as "stop after the run in progress" (before that, SIGTERM ends the process
    at once, as it does any process starting up)."""
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 60)
    assert line.startswith("siglo worker "), line
    return line


def _stop(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


def _marks(marks: Path) -> Counter[str]:
    if not marks.exists():
        return Counter()
    return Counter(line.rsplit(" ", 1)[0] for line in marks.read_text().splitlines())


async def _until(condition: object, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = condition() if callable(condition) else condition
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_killed_run_is_recovered_by_a_worker_without_rerunning_steps(
    kind: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    async with shared_store(kind) as backend:
        url = with_option(backend.url, "workflow_lock_ttl_ms", LEASE_MS)
        starter = subprocess.Popen(  # noqa: ASYNC220 - it runs beside the test, not awaited
            [sys.executable, str(TESTS / "ops_flows.py"), "run", url, "crash-1"],
            env=_env(marks, SIGLO_TEST_HANG="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            await _until(lambda: _marks(marks)["hanging"] == 1, "the run to reach step two")
        finally:
            starter.kill()  # SIGKILL: no clean-up of any kind runs
            starter.communicate(timeout=30)
        stored = await backend.adapter.get_checkpoint("crash-1")
        assert stored is not None and stored.status == "running"
        assert stored.chains == ("one",)

        worker = _worker(url, marks, "ops_flows:crashy")
        try:

            async def completed() -> bool:
                cp = await backend.adapter.get_checkpoint("crash-1")
                return cp is not None and cp.status == "completed"

            await _until(completed, "the worker to finish the run")
        finally:
            code, out, err = _stop(worker)
        assert code == 0, err
        assert "recovered 1 run(s)" in out and "siglo worker stopped" in out
        assert _marks(marks) == Counter({"one": 1, "two": 2, "hanging": 1, "three": 1})
        manager = siglo.StorageManager(backend, error_mode="strict")
        from ops_flows import crashy

        assert await crashy.run(1, manager=manager, stack_id="crash-1") == 25


async def test_a_deadline_fires_once_with_two_workers(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = tmp_path / "marks"
    monkeypatch.setenv("SIGLO_TEST_MARKS", str(marks))
    from ops_flows import deadline

    runs = [str(i) for i in range(6)]
    async with shared_store(kind) as backend:
        url = with_option(backend.url, "workflow_lock_ttl_ms", LEASE_MS)
        manager = siglo.StorageManager(backend, error_mode="strict")
        workers = [_worker(url, marks, "ops_flows:deadline") for _ in range(2)]
        try:
            for worker in workers:  # both up: each can take the SIGTERM below
                await _started(worker)
            for i in runs:
                with pytest.raises(WorkflowSuspended):
                    await deadline.run(i, manager=manager, stack_id=f"deadline-{i}")

            async def all_done() -> bool:
                for i in runs:
                    cp = await backend.adapter.get_checkpoint(f"deadline-{i}")
                    if cp is None or cp.status != "completed":
                        return False
                return True

            await _until(all_done, "every deadline to fire")
            await asyncio.sleep(0.5)  # time for a second firing, were there one
        finally:
            results = [_stop(w) for w in workers]
        for code, _, err in results:
            assert code == 0, err
        counted = _marks(marks)
        assert counted == Counter(
            {**{f"timeout {i}": 1 for i in runs}, **{f"after {i}": 1 for i in runs}}
        )
        for i in runs:
            assert await deadline.run(i, manager=manager, stack_id=f"deadline-{i}") == "late"
