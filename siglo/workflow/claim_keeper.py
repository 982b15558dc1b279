"""Keeping a delivery's claim of a wait while the run it resumes goes on.

A delivery (or a worker's timer) claims a wait for a lease (``claim_lease_ms``), then
resumes the run under its workflow lock and completes the wait when the run stops. A run
whose later steps take longer than the lease lost the claim to a retried webhook that
took it over meanwhile: the first delivery's event was used, yet its completion was
refused, and the retry was told its claimant had stopped — neither caller learnt that
the event was accepted (a black-box auditor). So the claimant renews its claim every
third of the lease while it resumes the run, as the workflow lock's keeper renews the
lock — only while the key's record is still the one it claimed
(:func:`siglo.wait_keys.renew_own_claim`: a run cancelled meanwhile frees its key for
another run's wait) — and stops before the run places a new wait on the same key and
before it completes or releases the claim. A step that blocks the event loop past the
lease still loses it (no renewal runs): the delivery then says its event was used.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from siglo.adapter import StorageAdapter
from siglo.masking import logger
from siglo.records import WaitRecord
from siglo.wait_keys import renew_own_claim

__all__ = ["ClaimKeeper"]

log = logger("siglo.workflow")

_RENEWALS_PER_LEASE: Final = 3
"""How many renewals a lease sees: a renewal lost to a slow store leaves two more."""


class ClaimKeeper:
    """Renews ``record``'s claim (this process's) every third of its lease until
    :meth:`stop`. Started at once; the first renewal is a timer, not a task, so a
    resume shorter than a third of the lease costs no task."""

    def __init__(self, adapter: StorageAdapter, record: WaitRecord) -> None:
        assert record.claimant_id is not None  # a claimed record names its claimant
        self.adapter = adapter
        self.record = record
        self.claimant: str = record.claimant_id
        lease_ms = (record.lease_expires_at or 0) - (record.claimed_at or 0)
        self._every_s = max(lease_ms, _RENEWALS_PER_LEASE) / _RENEWALS_PER_LEASE / 1000
        self._stopped = False
        self._renewing = False
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(self._every_s, self._start)

    def keeps(self, correlation_key: str, namespace: str | None) -> bool:
        """Whether this is the claim of ``correlation_key``'s wait in ``namespace``."""
        return (correlation_key, namespace) == (self.record.correlation_key, self.record.namespace)

    def _start(self) -> None:
        if not self._stopped:
            self._task = asyncio.ensure_future(self._renew())

    async def _renew(self) -> None:
        record = self.record
        while not self._stopped:
            self._renewing = True
            try:
                renewed = await renew_own_claim(self.adapter, record)
            except Exception as exc:  # the store unreachable for now: the next tick tries
                log.debug("renewing the claim of wait %r failed: %s", record.correlation_key, exc)
                renewed = record
            finally:
                self._renewing = False
            if renewed is None or self._stopped:
                return  # taken by another claimant, completed or removed: nothing to keep
            await asyncio.sleep(self._every_s)

    async def stop(self) -> None:
        """No renewal from now on; one in flight is let finish (it may have been sent:
        cut off, it could still land after what the caller does next)."""
        self._stopped = True
        self._timer.cancel()
        task = self._task
        if task is None or task.done():
            return
        if self._renewing:
            await asyncio.wait({task})
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
