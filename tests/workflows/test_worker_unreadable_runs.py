"""A run whose stored checkpoint or wait record cannot be read (written past siglo,
here by plain sqlite3 or a plain Redis client) is that run's failure in a worker pass,
named and logged, never the worker's: the pass goes on with the other runs' timers and
recoveries (a listing leaves such a record out: siglo.unreadable), and a run that fails
the same way at every pass is said once and is no work done (docs/operating.md)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from ops_support import shared_store

import siglo
from siglo import Step, StorageManager, WorkflowSuspended, flow
from siglo.cli import cli
from siglo.workflow import Worker, sleep
from siglo.workflow.step import sleep_key


async def _nap(_: Any) -> str:
    await sleep(1)
    return "woke"


def _corrupt(path: Path, stack_id: str) -> None:
    raw = sqlite3.connect(path)
    with raw:
        changed = raw.execute(
            "UPDATE siglo_checkpoints SET document = ? WHERE stack_id = ?", (b"{not", stack_id)
        ).rowcount
    raw.close()
    assert changed == 1


async def test_a_due_timer_of_an_unreadable_run_fails_that_run_alone(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    napping = flow(Step.create("nap", _nap), name="napping")
    async with siglo.connect(f"sqlite:///{path}") as backend:
        manager = StorageManager(backend)
        for stack_id in ("broken", "fine"):
            with pytest.raises(WorkflowSuspended):
                await napping.run(None, manager=manager, stack_id=stack_id)
        _corrupt(path, "broken")
        await asyncio.sleep(0.05)  # both timers due
        done = await Worker(manager, [napping]).run_once()
        assert done.timers_fired == 1
        assert len(done.failures) == 1
        assert "'broken'" in done.failures[0] and "MalformedRecordError" in done.failures[0]
        fine = await manager.load_checkpoint("fine")
        assert fine is not None and fine.status == "completed"


class _Crash(BaseException):
    """Stands for the process dying mid-step."""


class _CrashingSteps:
    """A flow of two steps (``flow``) whose runs :meth:`crash` leaves `running`, the
    process dying in the second step; and ``changed``: the same flow with its second
    step renamed, without a migration (a deploy with those runs in flight)."""

    def __init__(self) -> None:
        self._crashing = True
        self.flow = flow(Step.create("one", self._one), Step.create("two", self._two), name="steps")
        self.changed = flow(
            Step.create("one", self._one), Step.create("three", self._two), name="steps"
        )

    @staticmethod
    async def _one(x: int) -> int:
        return x + 1

    async def _two(self, x: int) -> int:
        if self._crashing:
            raise _Crash
        return x * 10

    async def crash(self, manager: StorageManager, *stack_ids: str) -> None:
        """Runs of ``stack_ids``, each crashed in its second step; later runs finish."""
        for stack_id in stack_ids:
            with pytest.raises(_Crash):
                await self.flow.run(1, manager=manager, stack_id=stack_id)
        self._crashing = False


@asynccontextmanager
async def _crashed_and_broken(
    tmp_path: Path, other: str
) -> AsyncIterator[tuple[StorageManager, _CrashingSteps]]:
    """A SQLite store with two runs crashed in their second step, ``broken`` (its
    checkpoint then written past siglo) and ``other``."""
    path = tmp_path / "w.db"
    steps = _CrashingSteps()
    async with siglo.connect(f"sqlite:///{path}") as backend:
        manager = StorageManager(backend)
        await steps.crash(manager, "broken", other)
        _corrupt(path, "broken")
        yield manager, steps


async def test_recovering_an_unreadable_run_fails_that_run_alone(tmp_path: Path) -> None:
    async with _crashed_and_broken(tmp_path, "fine") as (manager, steps):
        done = await Worker(manager, [steps.flow]).run_once()
        assert len(done.failures) == 1 and "'broken'" in done.failures[0]
        fine = await manager.load_checkpoint("fine")
        assert fine is not None and fine.status == "completed"


async def _passes_for(worker: Worker, seconds: float) -> list[Any]:
    passes: list[Any] = []
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(interval_s=0.2, stop=stop, on_pass=passes.append))
    await asyncio.sleep(seconds)
    stop.set()
    await task
    return passes


async def test_a_run_that_fails_the_same_way_is_said_once_and_the_worker_waits(
    tmp_path: Path,
) -> None:
    """A run left as stored fails the same way at every pass: an unreadable one, and one
    whose flow changed without a migration. The worker said it at every pass and counted
    it as work done, so it started the next pass at once: thousands a second. It says
    each once, and waits its interval between passes."""
    async with _crashed_and_broken(tmp_path, "old") as (manager, steps):
        passes = await _passes_for(Worker(manager, [steps.changed]), 1.0)
        assert len(passes) <= 8, len(passes)  # an interval of 0.2 s: about 5
        failures = [line for done in passes for line in done.failures]
        assert len(failures) == 2, failures
        assert any("'broken'" in f and "MalformedRecordError" in f for f in failures)
        assert any("'old'" in f and "WorkflowVersionMismatchError" in f for f in failures)


async def test_a_due_timer_of_an_unreadable_run_is_said_once(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    napping = flow(Step.create("nap", _nap), name="napping")
    async with siglo.connect(f"sqlite:///{path}") as backend:
        manager = StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await napping.run(None, manager=manager, stack_id="broken")
        _corrupt(path, "broken")
        await asyncio.sleep(0.05)
        passes = await _passes_for(Worker(manager, [napping]), 1.0)
        assert len(passes) <= 8, len(passes)
        assert [line for done in passes for line in done.failures] == [passes[0].failures[0]]


async def test_a_due_timer_whose_flow_changed_is_said_once_and_the_worker_waits(
    tmp_path: Path,
) -> None:
    """A waiting run whose flow changed without a migration: its resume is refused and
    the wait stays due. The worker counted the refusal as a timer fired, so it started
    its next pass at once (a thousand a second); it says it once and waits."""

    async def more(_: Any) -> int:
        return 2

    before = flow(Step.create("nap", _nap), name="napping")
    after = flow(Step.create("nap", _nap), Step.create("more", more), name="napping")
    async with siglo.connect(f"sqlite:///{tmp_path / 'w.db'}") as backend:
        manager = StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await before.run(None, manager=manager, stack_id="r1")
        await asyncio.sleep(0.05)
        passes = await _passes_for(Worker(manager, [after]), 1.0)
        assert len(passes) <= 8, len(passes)
        failures = [line for done in passes for line in done.failures]
        assert len(failures) == 1 and "WorkflowVersionMismatchError" in failures[0]
        # Left as stored: no timer fired (docs/operating.md), in any pass.
        assert sum(done.timers_fired for done in passes) == 0
        stored = await manager.load_checkpoint("r1")
        assert stored is not None and stored.status == "waiting"  # left as stored


async def _corrupt_wait(backend: siglo.Backend, kind: str, stack_id: str) -> None:
    """The stored document of ``stack_id``'s sleep, written past siglo."""
    key = sleep_key(None, stack_id, "nap")
    if kind == "sqlite":
        raw = sqlite3.connect(urlsplit(backend.url).path)
        with raw:
            raw.execute(
                "UPDATE siglo_wait_records SET document = ? WHERE correlation_key = ?",
                (b"{not", key),
            )
        raw.close()
    else:
        import redis.asyncio as redis

        client = redis.from_url(backend.url.split("?", 1)[0])
        try:
            assert await client.set(backend.adapter.keys.wait(key, None), b"{not", xx=True)
        finally:
            await client.aclose()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_due_wait_record_that_cannot_be_read_is_left_out_and_the_others_fire(
    kind: str,
) -> None:
    """A due wait record written past siglo is left out of the listing of due timers
    (siglo.unreadable): the other runs' timers fire in the same pass, and the worker
    says once, as that run's failure, which record it left out (and its stack; on
    Redis, where only the key is known before the document is read, the key)."""
    napping = flow(Step.create("nap", _nap), name="napping")
    async with shared_store(kind) as backend:
        manager = StorageManager(backend)
        for stack_id in ("broken", "fine"):
            with pytest.raises(WorkflowSuspended):
                await napping.run(None, manager=manager, stack_id=stack_id)
        await _corrupt_wait(backend, kind, "broken")
        await asyncio.sleep(0.05)
        worker = Worker(manager, [napping])
        first, second = await worker.run_once(), await worker.run_once()
        assert first.timers_fired == 1 and len(first.failures) == 1, first.failures
        line = first.failures[0]
        assert line.startswith("due timer left out: MalformedRecordError"), line
        assert "in the stored wait record 'siglo-sleep" in line
        if kind == "sqlite":
            assert "of stack 'broken'" in line
        fine = await manager.load_checkpoint("fine")
        assert fine is not None and fine.status == "completed"
        assert second.failures == [] and second.timers_fired == 0  # said once
        assert await backend.adapter.delete_checkpoint("broken")  # what `siglo rm` does
        third = await worker.run_once()
        assert third.failures == [] and third.timers_fired == 0
        # A new run under that id whose wait is unreadable again is said again.
        with pytest.raises(WorkflowSuspended):
            await napping.run(None, manager=manager, stack_id="broken")
        await _corrupt_wait(backend, kind, "broken")
        await asyncio.sleep(0.05)
        fourth = await worker.run_once()
        assert len(fourth.failures) == 1 and "due timer left out" in fourth.failures[0]


async def test_a_listing_leaves_an_unreadable_checkpoint_out_on_redis() -> None:
    """Redis's listing reads the documents it lists: one written past siglo is left
    out (siglo.unreadable), named to whoever lists. The worker recovers the other
    crashed runs in the same pass and says the one left out once; `siglo ls` lists the
    others, names it on standard error with the `siglo rm` that removes it, and exits 1."""
    steps = _CrashingSteps()
    async with shared_store("redis") as backend:
        manager = StorageManager(backend)
        await steps.crash(manager, "broken", "fine")
        import redis.asyncio as redis

        client = redis.from_url(backend.url.split("?", 1)[0])
        try:
            key = backend.adapter.keys.checkpoint("broken", None)
            # It still reads as a running one to the listing's status filter.
            assert await client.set(key, b'{"status":"running", not JSON', xx=True)
        finally:
            await client.aclose()
        worker = Worker(manager, [steps.flow])
        first, second = await worker.run_once(), await worker.run_once()
        assert first.runs_recovered == 1 and len(first.failures) == 1, first.failures
        assert first.failures[0].startswith("running run left out: MalformedRecordError")
        assert "in the stored checkpoint of stack 'broken'" in first.failures[0]
        fine = await manager.load_checkpoint("fine")
        assert fine is not None and fine.status == "completed"
        assert second.failures == [] and second.runs_recovered == 0  # said once
        listed = await asyncio.to_thread(CliRunner().invoke, cli, ["ls", backend.url])
        assert listed.exit_code == 1
        assert "fine" in listed.stdout and "broken" not in listed.stdout
        assert listed.stderr.startswith("Left out: MalformedRecordError")
        assert "stack 'broken'" in listed.stderr and "`siglo rm URL broken`" in listed.stderr
        assert await backend.adapter.delete_checkpoint("broken")  # what `siglo rm` does
        listed = await asyncio.to_thread(CliRunner().invoke, cli, ["ls", backend.url])
        assert listed.exit_code == 0 and listed.stderr == ""


async def test_a_run_that_fails_another_way_is_said_again(tmp_path: Path) -> None:
    """Said once per kind of failure: the same run unreadable, then readable again but
    of a flow that changed, is said twice."""
    path = tmp_path / "w.db"
    steps = _CrashingSteps()
    async with siglo.connect(f"sqlite:///{path}") as backend:
        manager = StorageManager(backend)
        await steps.crash(manager, "run")
        raw = sqlite3.connect(path)
        (document,) = raw.execute(
            "SELECT document FROM siglo_checkpoints WHERE stack_id = 'run'"
        ).fetchone()
        raw.close()
        _corrupt(path, "run")
        worker = Worker(manager, [steps.changed])
        said = [line for _ in range(3) for line in (await worker.run_once()).failures]
        raw = sqlite3.connect(path)
        with raw:
            raw.execute(
                "UPDATE siglo_checkpoints SET document = ? WHERE stack_id = 'run'", (document,)
            )
        raw.close()
        said += [line for _ in range(3) for line in (await worker.run_once()).failures]
        assert [line.split(": ")[1] for line in said] == [
            "MalformedRecordError",
            "WorkflowVersionMismatchError",
        ], said


async def test_a_run_whose_offloaded_value_is_gone_fails_that_run_alone(tmp_path: Path) -> None:
    """A crashed run whose step output went to a blob store the worker's does not hold
    (another ``blob_url``, a restore, a collector run elsewhere): the missing value was
    a ``StorageAdapterError``, an outage to the worker, which retried the whole pass and
    gave up (exit 3), the other runs never reached (a black-box auditor). It is that
    run's failure (``DanglingReferenceError``), left as stored; the others recover."""
    from siglo.config import Settings

    url = f"sqlite:///{tmp_path / 'w.db'}"
    steps = _CrashingSteps()
    big = "x" * 5_000

    async def large(x: int) -> str:
        return big

    offloading = flow(Step.create("one", large), Step.create("two", steps._two), name="big")

    def blobs(name: str) -> Settings:
        return siglo.load_settings(blob_url=(tmp_path / name).as_uri(), offload_min_bytes=1024)

    async with siglo.connect(url, settings=blobs("app")) as backend:
        manager = StorageManager(backend, settings=blobs("app"))
        with pytest.raises(_Crash):
            await offloading.run(1, manager=manager, stack_id="gone")
        await steps.crash(manager, "fine")  # its output small: in the checkpoint
    async with siglo.connect(url, settings=blobs("elsewhere")) as backend:
        manager = StorageManager(backend, settings=blobs("elsewhere"))
        done = await Worker(manager, [offloading, steps.flow]).run_once()
        assert len(done.failures) == 1, done.failures
        assert "'gone'" in done.failures[0] and "DanglingReferenceError" in done.failures[0]
        fine = await manager.load_checkpoint("fine")
        assert fine is not None and fine.status == "completed"
