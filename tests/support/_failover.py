"""A write load that runs through a failover and accounts for every acknowledged save.

Each of ``writers`` tasks owns one stack and saves its checkpoint with revisions 1, 2,
3 …, each a compare-and-set on the revision before. A save that returns is
*acknowledged*: its revision is recorded. A save that fails is counted and tried again
with the same revision. When a save meets a ``CheckpointConflictError`` the writer reads
the stored revision: above the acknowledged one, the failed save had in fact been
applied (ambiguous); below it, acknowledged saves were lost (counted, and the writer
carries on from what is stored). At the end every stack's stored revision must be at
least its last acknowledged one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import siglo
from siglo import Checkpoint, CheckpointConflictError, StorageAdapterError


@dataclass
class Figures:
    """What a failover run measured."""

    acknowledged: int = 0
    failed_calls: int = 0
    ambiguous: int = 0
    """Failed saves that had been applied (found by the retry's conflict)."""
    lost: int = 0
    """Acknowledged saves missing afterwards."""
    recovery_s: float = 0.0
    """From the fault to the moment every writer had saved again after its last failure
    (0 when no call failed)."""
    longest_failed_call_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    def line(self, name: str) -> str:
        return (
            f"FAILOVER {name}: recovered in {self.recovery_s:.2f} s, "
            f"{self.failed_calls} calls failed (longest {self.longest_failed_call_s:.2f} s), "
            f"{self.acknowledged} saves acknowledged, {self.ambiguous} ambiguous, "
            f"{self.lost} lost"
        )


async def run_through_failover(
    backend: siglo.Backend,
    fault: Callable[[], Awaitable[None]],
    *,
    writers: int = 8,
    before_s: float = 1.0,
    after_s: float = 1.0,
    limit_s: float = 60.0,
    pause_s: float = 0.0,
) -> Figures:
    """Write through ``fault()`` until every writer has saved for ``after_s`` past it."""
    adapter = backend.adapter
    figures = Figures()
    acked: dict[str, int] = {}
    fault_at: float | None = None
    recovered: dict[str, float] = {}
    stop = asyncio.Event()
    all_recovered = asyncio.Event()

    async def writer(stack: str) -> None:
        revision = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await adapter.save_checkpoint(
                    Checkpoint(stack_id=stack, revision=revision + 1, timestamp=revision + 1),
                    expected_revision=revision,
                )
            except CheckpointConflictError:
                try:
                    stored = await adapter.get_checkpoint(stack)
                except StorageAdapterError:
                    continue
                now = 0 if stored is None else stored.revision
                if now < acked.get(stack, 0):
                    # Acknowledged saves the store no longer has.
                    figures.lost += acked[stack] - now
                    acked[stack] = now
                else:
                    # The previous failed save had been applied after all.
                    figures.ambiguous += 1
                revision = now
                continue
            except StorageAdapterError as exc:
                figures.failed_calls += 1
                elapsed = time.monotonic() - started
                figures.longest_failed_call_s = max(figures.longest_failed_call_s, elapsed)
                if len(figures.failures) < 5:
                    figures.failures.append(str(exc)[:200])
                # Recovered means: saving again after the last failure.
                recovered.pop(stack, None)
                all_recovered.clear()
                # Failures during a failover come fast (a refused connection): do not spin.
                await asyncio.sleep(0.05)
                continue
            revision += 1
            acked[stack] = revision
            figures.acknowledged += 1
            if fault_at is not None and stack not in recovered:
                recovered[stack] = time.monotonic()
                if len(recovered) == writers:
                    all_recovered.set()
            if pause_s:
                await asyncio.sleep(pause_s)

    stacks = [f"failover-{i}" for i in range(writers)]
    tasks = [asyncio.create_task(writer(s)) for s in stacks]
    try:
        await asyncio.sleep(before_s)
        fault_at = time.monotonic()
        await fault()
        deadline = fault_at + limit_s
        # Every writer saving again, and still so ``after_s`` later (a failover's first
        # failures can come after the first successes).
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_recovered.wait(), max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(after_s)
            if all_recovered.is_set() or time.monotonic() > deadline:
                break
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert len(recovered) == writers, f"not every writer recovered: {figures.failures}"
    figures.recovery_s = max(recovered.values()) - fault_at if figures.failed_calls else 0.0
    for stack in stacks:
        stored = await _settled_read(adapter, stack)
        if stored is None or stored.revision < acked.get(stack, 0):
            figures.lost += acked.get(stack, 0) - (0 if stored is None else stored.revision)
    return figures


async def _settled_read(adapter: siglo.StorageAdapter, stack: str) -> Checkpoint | None:
    """The stored checkpoint, read again while the topology is still settling (a Sentinel
    may briefly name no master just after a failover); at most 10 s."""
    for _ in range(100):
        try:
            return await adapter.get_checkpoint(stack)
        except StorageAdapterError:
            await asyncio.sleep(0.1)
    return await adapter.get_checkpoint(stack)
