"""The worker: fires durable timers and recovers runs whose process died.

``siglo worker URL --flows module:attr`` runs :meth:`Worker.run`. Each pass does bounded
work — at most ``batch`` due timers and ``batch`` listed runs — so one pass never holds a
process for long, and several workers side by side share the work safely:

- a due timer is claimed atomically before it fires (``claim_wait_record`` with
  ``allow_expired``), so of several workers exactly one fires it;
- a crashed run is taken only with its workflow lock, which a live process renews while
  it runs, so a run is never executed by two processes at once, and a free lock on a
  ``running`` run means its process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from siglo import telemetry
from siglo.adapter import Capability
from siglo.errors import InvalidArgumentError, LockNotAcquiredError, WaitRecordClaimError
from siglo.listing import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from siglo.manager import StorageManager
from siglo.workflow.flow import Flow, WorkflowSuspended

__all__ = ["DEFAULT_INTERVAL_S", "Worker", "WorkerPass"]

DEFAULT_INTERVAL_S: Final = 1.0
_LOOK_AHEAD: Final = 10

log = logging.getLogger("siglo.worker")


@dataclass
class WorkerPass:
    """What one pass did."""

    timers_fired: int = 0
    runs_recovered: int = 0
    failures: list[str] = field(default_factory=list)
    """One line per run that raised (its exception was logged; the run is ``failed``)."""

    @property
    def busy(self) -> bool:
        """Whether the pass found work (the next pass should not wait)."""
        return bool(self.timers_fired or self.runs_recovered)


class Worker:
    """Fires due timers and recovers crashed runs of ``flows`` through ``manager``.

    Runs are matched to flows by the checkpoint's ``workflow_id`` (the flow's ``name``);
    others are left alone. ``batch`` bounds each pass's work.
    """

    def __init__(
        self,
        manager: StorageManager,
        flows: Iterable[Flow],
        *,
        batch: int = DEFAULT_PAGE_SIZE,
        worker_id: str | None = None,
    ) -> None:
        self.manager = manager
        self.flows: dict[str, Flow] = {}
        for f in flows:
            if not isinstance(f, Flow):
                raise InvalidArgumentError(f"flows must be siglo.workflow.Flow, got {f!r}")
            self.flows[f.name] = f
        if not self.flows:
            raise InvalidArgumentError("a worker needs at least one flow")
        if type(batch) is not int or batch < 1:
            raise InvalidArgumentError(f"batch must be a positive integer, got {batch!r}")
        self.batch = batch
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self._cursor: str | None = None
        adapter = manager.adapter
        if adapter is None:
            raise InvalidArgumentError("the worker's storage manager has no storage adapter")
        self.adapter = adapter

    async def run_once(self) -> WorkerPass:
        """One bounded pass: fire due timers, then recover crashed runs."""
        done = WorkerPass()
        if self.adapter.supports(Capability.DUE_WAITS):
            await self._fire_timers(done)
        if self.adapter.supports(Capability.LISTING) and self.adapter.supports(
            Capability.WORKFLOW_LOCK
        ):
            await self._recover(done)
        return done

    async def run(
        self, *, interval_s: float = DEFAULT_INTERVAL_S, stop: asyncio.Event | None = None
    ) -> None:
        """Pass after pass until ``stop`` is set; waits ``interval_s`` after an idle pass.

        Setting ``stop`` ends the loop after the run in progress: a run is never cut off
        in the middle by a graceful stop (SIGTERM in ``siglo worker``).
        """
        stop = stop or asyncio.Event()
        while not stop.is_set():
            done = await self.run_once()
            if done.busy:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    async def _fire_timers(self, done: WorkerPass) -> None:
        # Due waits of flows this worker does not run (another worker's, or waits used
        # without a flow) are skipped; reading several batches' worth keeps them from
        # filling every pass. (More than that many foreign due waits still would: run a
        # worker for every flow of a store.)
        due = await self.adapter.list_due_waits(limit=min(self.batch * _LOOK_AHEAD, MAX_PAGE_SIZE))
        telemetry.note_due_waits(due, self.manager.clock.now_ms())
        fired = 0
        for record in due:
            if fired == self.batch:
                return
            checkpoint = await self.manager.load_checkpoint(
                record.stack_id, namespace=record.namespace
            )
            flow = None if checkpoint is None else self.flows.get(checkpoint.workflow_id or "")
            if flow is None:
                continue  # not a run of ours (or gone): another worker's, or nobody's
            try:
                await flow.fire_timeout(
                    record.correlation_key,
                    manager=self.manager,
                    claimant_id=self.worker_id,
                    namespace=record.namespace,
                )
            except (WaitRecordClaimError, LockNotAcquiredError):
                continue  # another worker, or a late event, got there first
            except WorkflowSuspended:
                pass
            except Exception as exc:
                self._failed(done, record.stack_id, exc)
            fired += 1
            done.timers_fired += 1

    async def _recover(self, done: WorkerPass) -> None:
        page = await self.adapter.list_checkpoints(
            status="running", limit=self.batch, cursor=self._cursor
        )
        # The next pass goes on from here; a finished walk starts over.
        self._cursor = page.next_cursor
        for summary in page.items:
            flow = self.flows.get(summary.workflow_id or "")
            if flow is None:
                continue
            try:
                if await flow.recover(
                    summary.stack_id, manager=self.manager, namespace=summary.namespace
                ):
                    done.runs_recovered += 1
                    telemetry.note_recovery(summary.workflow_id)
            except LockNotAcquiredError:
                continue  # alive in some process
            except Exception as exc:
                done.runs_recovered += 1
                self._failed(done, summary.stack_id, exc)

    @staticmethod
    def _failed(done: WorkerPass, stack_id: str, exc: BaseException) -> None:
        line = f"run {stack_id!r} failed: {type(exc).__name__}: {exc}"
        log.warning(line, exc_info=exc)
        done.failures.append(line)
