"""A fault injected into the drill's accounting workload (:mod:`siglo.drill`).

:func:`run_through_failover` runs :class:`siglo.drill.Drill` against a backend, injects
``fault()`` after ``before_s``, and stops the drill once every worker has succeeded
again after its last failure and is still doing so ``after_s`` later (a failover's
first failures can come after the first successes). The drill then sweeps and cleans
up; its :class:`~siglo.drill.DrillReport` counts lost saves, double lock holders, fence
regressions and double claims, each traced to its operation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import siglo
from siglo.drill import Drill, DrillReport, detect_setting
from siglo.errors import StorageAdapterError

__all__ = ["LoopLag", "run_through_failover"]


class LoopLag:
    """How late this event loop ran a timer, at worst, while a drill ran: a call bounded
    by ``command_timeout_ms`` ends when the loop gets to its timer, so on a loaded machine
    (a CI run's other workers on the same two cores) it ends that much later than its
    bound; a test adds this to the bound it asserts rather than guessing a slack."""

    PERIOD_S = 0.02

    def __init__(self) -> None:
        self.longest_s = 0.0

    async def probe(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            asked = time.monotonic()
            await asyncio.sleep(self.PERIOD_S)
            self.longest_s = max(self.longest_s, time.monotonic() - asked - self.PERIOD_S)

    def __repr__(self) -> str:
        return f"LoopLag(longest_s={self.longest_s:.3f})"


async def run_through_failover(
    backend: siglo.Backend,
    fault: Callable[[], Awaitable[None]],
    *,
    workers: int = 8,
    rate: float = 400.0,
    before_s: float = 1.0,
    after_s: float = 1.0,
    limit_s: float = 60.0,
    setting: str | None = None,
    describe: Callable[[], str] | None = None,
    lag: LoopLag | None = None,
) -> DrillReport:
    """Drill through ``fault()`` until every worker has recovered for ``after_s``;
    ``describe()`` says, should they not, what the topology looked like then; ``lag``
    measures the event loop's lag meanwhile."""
    drill = Drill(
        backend,
        rate=rate,
        workers=workers,
        setting=setting or await _detected(backend),
        window_s=limit_s + 600,
    )
    stop = asyncio.Event()
    run = asyncio.create_task(drill.run(stop))
    probe = asyncio.create_task(lag.probe(stop)) if lag is not None else None
    try:
        await asyncio.sleep(before_s)
        fault_at = drill.elapsed_s
        await fault()
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not run.done():
            if drill.recovered(since=fault_at):
                window = drill.elapsed_s
                await asyncio.sleep(after_s)
                # Recovered and no call failed meanwhile: reads alone can look recovered
                # while writes still wait for a replica that is syncing. And every worker
                # ended a call well in that second: a worker whose writes still wait
                # (for a replica's confirmation) has not, and stopping then failed them.
                if drill.recovered(since=window) and drill.last_failure_s < window:
                    break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
    late = describe is not None and not drill.recovered(since=fault_at)
    topology = await asyncio.to_thread(describe) if late and describe else ""
    report = await run
    if probe is not None:
        await probe
    # Anything but a store failing is a defect, reported before the stragglers it makes.
    assert report.unexpected_errors == 0, report.sample_unexpected_errors
    stragglers = drill.stragglers(since=fault_at)
    # The topology first: a CI log keeps the end of a long message.
    assert not stragglers, (
        f"{topology}\nnot every worker recovered in {limit_s} s (fault at {fault_at:.2f} s, "
        f"the drill {report.duration_s:.2f} s long): {stragglers}; "
        f"first failures {report.sample_failures}"
    )
    return report


async def _detected(backend: siglo.Backend) -> str:
    """The drill's setting, read before any fault: a first call of a fresh pool under a
    tight ``command_timeout_ms`` on a loaded machine (a CI run) may time out, which says
    nothing of the failover the test is about: read again, up to three times."""
    for attempt in range(3):
        try:
            return await detect_setting(backend)
        except StorageAdapterError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")
