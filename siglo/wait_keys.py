"""A correlation key names one open wait: placing a run's wait record without taking
another run's (the workflow runtime's suspension, ``siglo import``), and claiming it for
a delivery (a flow's, a timer's, the dashboard's)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

from siglo.adapter import Capability, StorageAdapter
from siglo.coordination import undo_later
from siglo.errors import CapabilityNotSupportedError, InvalidArgumentError, WaitRecordClaimError
from siglo.records import WaitRecord
from siglo.sentinel import MISSING
from siglo.settings import DEFAULTS

__all__ = [
    "WAIT_KEY_LOCK",
    "cancel_own_wait",
    "claim_for_delivery",
    "complete_lapsed_claim",
    "give_back_later",
    "place_wait",
    "release_own_claim",
    "renew_own_claim",
]

WAIT_KEY_LOCK: Final = "siglo-wait-key:"
"""The workflow lock a writer takes on a correlation key to replace its record."""

OPEN: Final = ("waiting", "claimed")

Placed = Literal["stored", "present", "taken"]


async def place_wait(
    adapter: StorageAdapter,
    record: WaitRecord,
    *,
    replace_own: bool = True,
    now_ms: int | None = None,
    resuming_claimant: str | None = None,
) -> tuple[Placed, WaitRecord | None]:
    """Store ``record`` as its key's wait unless another run's wait of that key is open.

    All of it under the key's lock, where the backend has one: a create-if-absent, and
    where a record is there, a look at it — another run's open wait (``waiting`` or
    ``claimed``) is left as it is (``"taken"``, with it: replaced, that run would never
    resume); this run's own record is replaced (``"stored"``), or, without
    ``replace_own``, left (``"present"``, with it); a record whose wait ended is
    replaced. Given ``now_ms``, this run's own record of the same wait (its step's)
    claimed by a delivery whose lease has not lapsed is left too (``"present"``), unless
    ``resuming_claimant`` holds the claim (the delivery resuming this run, which waits
    again on the key): a run rerun after a crash, reaching the wait a delivery is about
    to resume it from, replaced the claim, and the delivery, which then resumed the run
    with its event, could not complete the wait (a black-box auditor). A claim of another
    step's wait on the key (an earlier, answered one) is replaced: kept, the later wait
    would have taken its deadline, and its event.
    The create under the lock too: a run creating the key's record while
    another, holding the lock, replaced an ended record that a deletion (``siglo rm``)
    removed in between had its fresh wait overwritten, and waited for ever (a black-box
    auditor, three processes). A backend without ``create_wait_record`` is looked up,
    then saved; one without a workflow lock, not atomically."""
    placed: tuple[Placed, WaitRecord | None] = ("stored", None)

    async def place() -> None:
        nonlocal placed
        try:
            if await adapter.create_wait_record(record):
                return
        except CapabilityNotSupportedError:
            pass
        there = await adapter.get_wait_record(record.correlation_key, namespace=record.namespace)
        if there is not None and there.stack_id != record.stack_id and there.status in OPEN:
            placed = ("taken", there)
            return
        if there is not None and there.stack_id == record.stack_id and not replace_own:
            placed = ("present", there)
            return
        if (
            there is not None
            and there.stack_id == record.stack_id
            and there.step_id == record.step_id
            and now_ms is not None
            and _claim_held(there, now_ms)
            and there.claimant_id != resuming_claimant
        ):
            placed = ("present", there)
            return
        await adapter.save_wait_record(record)

    await _under_key_lock(adapter, record, place)
    return placed


async def claim_for_delivery(
    adapter: StorageAdapter,
    correlation_key: str,
    claimant_id: str | None,
    namespace: str | None,
    *,
    allow_expired: bool = False,
    event_payload: Any = MISSING,
) -> WaitRecord | None:
    """A delivery's (or a timer's) claim of a wait, with a claimant named here: a claim
    cut off by its caller (a request's timeout) or of unknown outcome is given back in
    the background (:func:`siglo.coordination.undo_later`), so the event is deliverable
    again at once, not after the claim's lease.

    Every claim made to deliver (``Flow.deliver``, ``Flow.fire_timeout``, the
    dashboard's ``deliver_event``) goes through here: a caller claiming the wait itself
    had no token to give the claim back with once the reply was lost, and the wait
    stayed claimed by nobody for the whole lease (the dashboard's, a black-box
    auditor). The claimed record, or ``None`` (the wait cannot be claimed)."""
    # Made before the call: the token that gives the claim back must not be in the
    # reply, which is what goes missing.
    claimant = claimant_id or uuid.uuid4().hex
    try:
        return await adapter.claim_wait_record(
            correlation_key,
            claimant,
            allow_expired=allow_expired,
            event_payload=event_payload,
            namespace=namespace,
        )
    except InvalidArgumentError:
        raise  # refused before anything was sent
    except BaseException:
        give_back_later(adapter, correlation_key, claimant, namespace)
        raise


def give_back_later(
    adapter: StorageAdapter, correlation_key: str, claimant: str, namespace: str | None
) -> None:
    """Release the claim ``claimant`` may hold on ``correlation_key``'s wait, in the
    background (:func:`siglo.coordination.undo_later`): at once and a few times more,
    until a release answers or the claim's lease has lapsed by itself. A release by a
    claimant changes nothing where the claim is not that claimant's (contract rule
    ``wait.release``), so a try that comes late takes no other delivery's claim."""
    lease = getattr(adapter, "claim_lease_ms", None)
    undo_later(
        f"the claim of wait {correlation_key!r}",
        lambda: adapter.release_wait_record(correlation_key, claimant, namespace=namespace),
        lapses_in_ms=lease if isinstance(lease, int) else DEFAULTS.claim_lease_ms,
    )


def complete_later(
    adapter: StorageAdapter, correlation_key: str, complete: Callable[[], Awaitable[None]]
) -> None:
    """Complete a wait whose run's checkpoint holds its answer, in the background
    (:func:`siglo.coordination.undo_later`): ``complete()`` — the delivery's own
    completion, cut off by its caller — at once and a few times more, until it answers
    or the claim's lease has lapsed (then a retried delivery, or a worker recovering the
    run, completes it). A claim that is not the delivery's any more
    (:class:`~siglo.errors.WaitRecordClaimError`: completed already, or another
    claimant's) ends the tries: completing is that claimant's."""

    async def attempt() -> bool | None:
        try:
            await complete()
        except WaitRecordClaimError:
            return None
        return True

    lease = getattr(adapter, "claim_lease_ms", None)
    undo_later(
        f"wait {correlation_key!r}",
        attempt,
        lapses_in_ms=lease if isinstance(lease, int) else DEFAULTS.claim_lease_ms,
        done="completed",
    )


async def renew_own_claim(
    adapter: StorageAdapter, record: WaitRecord, *, event_payload: Any = MISSING
) -> WaitRecord | None:
    """Claim ``record``'s wait again for its claimant — renewing the lease, and putting
    ``event_payload`` in the record if given — only if the key's record is still that
    one (the same run's, created at the same time) and claimed by that claimant, under
    the key's lock: a claim by key alone took the wait another run placed on the key
    once this one was cancelled, and completed it (a black-box auditor). The record
    renewed, or ``None`` (the claim is not this claimant's any more)."""
    claimant = record.claimant_id
    assert claimant is not None  # a claimed record names its claimant
    renewed: WaitRecord | None = None

    async def renew() -> None:
        nonlocal renewed
        there = await adapter.get_wait_record(record.correlation_key, namespace=record.namespace)
        if not _same_claim(there, record):
            return
        renewed = await adapter.claim_wait_record(
            record.correlation_key,
            claimant,
            allow_expired=True,
            event_payload=event_payload,
            namespace=record.namespace,
        )

    await _under_key_lock(adapter, record, renew)
    return renewed


async def release_own_claim(adapter: StorageAdapter, record: WaitRecord) -> bool:
    """Release ``record``'s claim (back to waiting, for the next delivery) only if the
    key's record is still that one and claimed by its claimant (see
    :func:`renew_own_claim`); whether it was."""
    released = False

    async def release() -> None:
        nonlocal released
        there = await adapter.get_wait_record(record.correlation_key, namespace=record.namespace)
        if _same_claim(there, record):
            assert record.claimant_id is not None
            await adapter.release_wait_record(
                record.correlation_key, record.claimant_id, namespace=record.namespace
            )
            released = True

    await _under_key_lock(adapter, record, release)
    return released


async def complete_lapsed_claim(
    adapter: StorageAdapter,
    record: WaitRecord,
    claimant: str,
    *,
    event_payload: Any,
    now_ms: Callable[[], int],
) -> bool:
    """Complete ``record``'s wait for ``claimant`` — claimed by a claimant whose lease
    lapsed, of a run that holds its answer — only if the key's record is still that one
    (the same run's, created at the same time: a record that does not say when it was
    created is left), still claimed and still lapsed, under the key's lock, so that no
    wait placed on the key meanwhile is taken. The lapsed claim is taken over (one
    atomic claim: a delivery taking it first wins, and this does nothing) and completed,
    with ``event_payload`` in the record (the answer the run used: a later delivery's
    lapsed claim may have written its own payload there). Whether it was completed."""
    completed = False

    async def complete() -> None:
        nonlocal completed
        there = await adapter.get_wait_record(record.correlation_key, namespace=record.namespace)
        if (
            there is None
            or record.created_at is None
            or there.stack_id != record.stack_id
            or there.created_at != record.created_at
            or there.status != "claimed"
            or _claim_held(there, now_ms())
        ):
            return
        taken = await adapter.claim_wait_record(
            record.correlation_key,
            claimant,
            allow_expired=True,
            event_payload=event_payload,
            namespace=record.namespace,
        )
        if taken is None or taken.created_at != record.created_at:
            return  # another claimant took it first (the key's lock keeps others out)
        await adapter.complete_wait_record(
            record.correlation_key, claimant, namespace=record.namespace
        )
        completed = True

    await _under_key_lock(adapter, record, complete)
    return completed


def _same_claim(there: WaitRecord | None, record: WaitRecord) -> bool:
    """Whether ``there`` (the key's record now) is ``record``, claimed by its claimant."""
    return (
        there is not None
        and there.status == "claimed"
        and there.claimant_id == record.claimant_id
        and there.stack_id == record.stack_id
        and there.created_at == record.created_at
    )


def _claim_held(record: WaitRecord, now_ms: int) -> bool:
    """Whether ``record`` is claimed and its claim's lease has not lapsed at ``now_ms``."""
    return (
        record.status == "claimed"
        and record.lease_expires_at is not None
        and now_ms < record.lease_expires_at
    )


async def cancel_own_wait(
    adapter: StorageAdapter, record: WaitRecord, *, statuses: tuple[str, ...] = OPEN
) -> bool:
    """Cancel the wait of ``record``'s key only if it is still that record — the same
    run's, created at the same time — under the key's lock (a writer replacing the key's
    record takes it; one creating it finds it there, as long as it is). Cancelled by key
    alone, a run's clean-up cancelled the wait another run had placed on the key once
    the first's was cancelled or removed, and that run waited for ever (a black-box
    auditor). ``statuses``: the ones it is cancelled in (default: open). Whether it was
    cancelled."""
    cancelled = False

    async def cancel() -> None:
        nonlocal cancelled
        there = await adapter.get_wait_record(record.correlation_key, namespace=record.namespace)
        if (
            there is not None
            and there.stack_id == record.stack_id
            and there.created_at == record.created_at
            and there.status in statuses
        ):
            cancelled = await adapter.cancel_wait_record(
                record.correlation_key, namespace=record.namespace
            )

    await _under_key_lock(adapter, record, cancel)
    return cancelled


async def _under_key_lock(
    adapter: StorageAdapter, record: WaitRecord, action: Callable[[], Awaitable[None]]
) -> None:
    """``action`` under the lock of ``record``'s correlation key (its workflow lock named
    :data:`WAIT_KEY_LOCK` + key), where the backend has one."""
    if adapter.supports(Capability.WORKFLOW_LOCK):
        await adapter.with_workflow_lock(
            WAIT_KEY_LOCK + record.correlation_key, action, namespace=record.namespace
        )
    else:
        await action()
