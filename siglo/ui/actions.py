"""The dashboard's actions: cancel a run, deliver an event to its wait, delete it.

Each goes through the backend :func:`siglo.connect` opened with the one configuration
(its pipeline: an event's payload is stored redacted like any other), and each is
compare-and-set or a claim, so an action confirmed on a page that has gone stale since
is refused instead of undoing what happened meanwhile.

An action is the store write: each learns of every failure of the store, whatever the
error mode of the settings (their ``best-effort`` or ``warn`` is for an application's
own saves), and raises it, so that the page says the store failed instead of "Done".
"""

from __future__ import annotations

import uuid
from typing import Any

from siglo.adapter import Capability
from siglo.checkpoint import TERMINAL_STATUSES, Checkpoint
from siglo.codec import stored_event
from siglo.errors import CheckpointConflictError, SigloError, WaitRecordClaimError
from siglo.manager import StorageManager
from siglo.masking import logger
from siglo.records import WaitRecord, another_record_of_its_key, embedded_wait_record
from siglo.sealing import refuse_unopened
from siglo.sentinel import MISSING
from siglo.stack import ExecutionStack
from siglo.wait_keys import claim_for_delivery, give_back_later, renew_own_claim
from siglo.workflow.claim_keeper import ClaimKeeper
from siglo.workflow.flow import OUTPUT
from siglo.workflow.outcomes import EVENT, WAITING_FOR, answer_of, is_sleep

__all__ = ["ActionRefused", "cancel_run", "delete_run", "deliver_event"]

log = logger("siglo.ui")


class ActionRefused(SigloError):
    """An action that was not carried out; nothing stored changed. The message says why."""


def _strict(manager: StorageManager) -> StorageManager:
    """``manager``, or, when its error mode would swallow a store failure
    (``best-effort``) or only log it (``warn``), a manager like it — the same store,
    settings, redacted keys, clock and namespace fallback — that raises every failure.

    The dashboard's manager follows the settings' error mode; under ``best-effort`` a
    delivery's refused save was swallowed, the wait completed and "Done" answered,
    though the run never received the event, and the wait could not be delivered to
    again (a black-box auditor). Its own manager, not the caller's with its mode
    changed: the dashboard's is shared by concurrent requests."""
    if manager.error_mode == "strict":
        return manager
    return StorageManager(
        manager.backend if manager.backend is not None else manager.adapter,
        settings=manager.settings,
        error_mode="strict",
        clock=manager.clock,
        namespace_fallback=manager.namespace_fallback,
        redact_fields=manager.redact_fields,
    )


def _require(manager: StorageManager, capability: Capability, what: str) -> None:
    adapter = manager.adapter
    if adapter is None or not adapter.supports(capability):
        raise ActionRefused(f"this backend cannot {what} (no {capability.value} capability)")


async def cancel_run(
    manager: StorageManager, stack_id: str, namespace: str | None, expected_revision: int
) -> str:
    """Cancel the run (its open waits too), if it is still at ``expected_revision`` and
    not finished."""
    _require(manager, Capability.WAIT_RECORDS, "cancel a run")
    adapter = manager.adapter
    assert adapter is not None
    stored = await adapter.get_checkpoint(stack_id, namespace, fallback=False)
    if stored is None:
        raise ActionRefused(f"no run {stack_id!r} to cancel")
    if stored.revision != expected_revision:
        raise ActionRefused(
            f"run {stack_id!r} changed since the page was shown (revision {stored.revision}, "
            f"not {expected_revision}); nothing was cancelled: look again"
        )
    if stored.status in TERMINAL_STATUSES:
        raise ActionRefused(f"run {stack_id!r} already ended {stored.status}")
    # The decision is one compare-and-set on the revision the page showed: the run
    # marked cancelled as ``cancel_workflow`` marks it, its step's next checkpoint then
    # refused. ``cancel_workflow`` alone cancels whatever revision is stored by then (a
    # delivery from another tab, a deletion: "cancelled" said of a run that moved on or
    # was gone, a black-box auditor).
    cancelled = stored.replace(
        status="cancelled", revision=stored.revision + 1, timestamp=manager.clock.now_ms()
    )
    try:
        await adapter.save_checkpoint(cancelled, expected_revision=expected_revision)
    except CheckpointConflictError as exc:
        if exc.current_revision is None:
            raise ActionRefused(f"no run {stack_id!r} to cancel (it is gone)") from exc
        raise ActionRefused(
            f"run {stack_id!r} changed since the page was shown (revision "
            f"{exc.current_revision}, not {expected_revision}); nothing was cancelled: "
            "look again"
        ) from exc
    # Its open waits: the checkpoint has ended, so this cancels the waits alone.
    await adapter.cancel_workflow(stack_id, namespace)
    return f"cancelled {stack_id}"


async def delete_run(
    manager: StorageManager, stack_id: str, namespace: str | None, expected_revision: int
) -> str:
    """Delete the run with its wait records and context streams, if it is still at
    ``expected_revision`` (compare-and-set)."""
    _require(manager, Capability.DELETION, "delete a run")
    adapter = manager.adapter
    assert adapter is not None
    try:
        deleted = await adapter.delete_checkpoint(
            stack_id, namespace, expected_revision=expected_revision
        )
    except CheckpointConflictError as exc:
        if exc.current_revision is None:
            raise ActionRefused(f"no run {stack_id!r} to delete (it is gone)") from exc
        raise ActionRefused(
            f"run {stack_id!r} is at revision {exc.current_revision}, not {expected_revision}; "
            "nothing was deleted: look again"
        ) from exc
    if not deleted:
        raise ActionRefused(f"no run {stack_id!r} to delete")
    return f"deleted {stack_id}"


def _answered(checkpoint: Checkpoint, record: WaitRecord) -> Any:
    """The event ``checkpoint``'s run answered the claimed wait ``record`` with, when the
    step the record names holds one and ran (``MISSING`` otherwise, a timeout included)."""
    context = checkpoint.contexts.get(record.step_id) if record.step_id else None
    if (
        context is None
        or OUTPUT not in context
        or context.get(WAITING_FOR) != record.correlation_key
        or answer_of(context) != EVENT
    ):
        return MISSING
    return context[EVENT]


def _waiting_step(stack: ExecutionStack, correlation_key: str) -> str | None:
    for step, ctx in stack.contexts.items():
        if OUTPUT not in ctx and ctx.get(WAITING_FOR) == correlation_key:
            return step
    return None


async def deliver_event(
    manager: StorageManager,
    correlation_key: str,
    namespace: str | None,
    payload: Any,
    *,
    run_id: str | None = None,
    expected_revision: int | None = None,
) -> str:
    """Deliver ``payload`` to the wait ``correlation_key``: claim the wait (so the event
    is delivered once, whoever else delivers it), store the event in the waiting step's
    context and mark the run ``running`` (one compare-and-set save), then complete the
    wait. The dashboard does not run the application's steps: the next ``siglo worker``
    pass with the run's flow continues it, as it continues any run whose process is
    gone, and the waiting step's ``wait_for_event`` returns ``payload``. Refused
    (nothing changed) if the wait is not open, is not a wait of the run ``run_id`` (the
    run the confirmation named), or the run moved on (``expected_revision``: the
    revision the confirmation showed; a run that went on and waits again on the same key
    is not the run that page was about)."""
    _require(manager, Capability.WAIT_RECORDS, "deliver an event")
    # Its reads and its save raise whatever the store does: a failure swallowed here
    # was a delivery reported done that stored nothing (see _strict).
    manager = _strict(manager)
    adapter = manager.adapter
    assert adapter is not None
    if is_sleep(correlation_key):
        # A durable sleep's wait: the worker ends it at its deadline; an event would end
        # the sleep at once (a black-box auditor).
        raise ActionRefused(
            f"{correlation_key!r} is a durable sleep, not a wait for an event: the next "
            "`siglo worker` pass after its deadline ends it; nothing was delivered"
        )
    payload = stored_event(payload, correlation_key)  # as Flow.deliver takes it

    def refuse_changed(revision: int) -> None:
        if expected_revision is not None and revision != expected_revision:
            raise ActionRefused(
                f"run {run_id or ''!r} changed since the page was shown (revision "
                f"{revision}, not {expected_revision}); nothing was delivered: look again"
            )

    def refuse_other_run(stack_id: str) -> None:
        if run_id is not None and stack_id != run_id:
            raise ActionRefused(
                f"the wait {correlation_key!r} is a wait of run {stack_id!r}, not of run "
                f"{run_id!r}; nothing was delivered"
            )

    # The run is looked at before the claim, so that a delivery bound to be refused
    # claims nothing. (The same checks run again under the workflow lock below, for a run
    # that moves meanwhile; a refusal there gives the claim back as it found the wait.)
    waiting = await adapter.get_wait_record(correlation_key, namespace=namespace)
    if waiting is not None:
        refuse_other_run(waiting.stack_id)
    if waiting is not None and waiting.status == "waiting":
        found = await manager.load_checkpoint(waiting.stack_id, namespace=namespace)
        if found is not None:
            refuse_changed(found.revision)
        if found is not None and found.status != "waiting":
            raise ActionRefused(
                f"run {waiting.stack_id!r} is {found.status}, not waiting for "
                f"{correlation_key!r}; nothing was delivered"
            )
    claimant = f"siglo-ui-{uuid.uuid4().hex[:12]}"
    # As a flow's delivery claims (siglo.wait_keys.claim_for_delivery): a claim whose
    # reply was lost (a store timing out) is given back in the background with the
    # claimant made here; claimed directly, it held the wait for the whole lease (60 s)
    # with nothing to give it back with (a black-box auditor).
    record = await claim_for_delivery(
        adapter,
        correlation_key,
        claimant,
        namespace,
        event_payload=await manager.redact_event(correlation_key, payload, namespace=namespace),
    )
    if record is None:
        raise ActionRefused(
            f"the wait {correlation_key!r} is not open (delivered, cancelled, timed out, or "
            "claimed by another process); nothing was delivered"
        )

    # What the record held before this claim wrote the payload into it: put back with the
    # claim when the delivery is refused (a released claim keeps its payload, rule
    # wait.release), so that a refused delivery leaves the wait as it was — not holding an
    # event never delivered (one the size guard refused, say: a black-box auditor).
    before = (
        waiting.event_payload
        if waiting is not None and waiting.created_at == record.created_at
        else None
    )

    async def give_back() -> None:
        # Only while the key's record is still the one claimed: a run removed meanwhile
        # frees its key, and another run's wait on it is not this claim's to touch.
        try:
            if await renew_own_claim(adapter, record, event_payload=before) is not None:
                await adapter.release_wait_record(
                    correlation_key, claimant, namespace=record.namespace
                )
        except BaseException:
            # The store failing here too (or the request cut off): released in the
            # background by its claimant, as a claim whose reply was lost is, rather
            # than left claimed for its lease (its payload then stays in the record,
            # as a released claim's does, until the next delivery's claim).
            give_back_later(adapter, correlation_key, claimant, record.namespace)
            raise

    if run_id is not None and record.stack_id != run_id:
        # A wait saved again under the same key since the look above: given back.
        await give_back()
        refuse_other_run(record.stack_id)

    used = False  # the claim settled (the event stored with the run): never given back

    async def mark() -> None:
        # The run of the claimed wait, in its namespace only (never a run of no namespace
        # through namespace_fallback: a tenant's run removed meanwhile was brought back
        # from another's, a black-box auditor), and still waiting on that very record (a
        # run removed and started again under its id waits on a record of its own).
        checkpoint = await adapter.get_checkpoint(record.stack_id, record.namespace, fallback=False)
        nonlocal used
        answered = MISSING if checkpoint is None else _answered(checkpoint, record)
        if answered is not MISSING:
            # A wait the run answered (a delivery whose claim lapsed under a blocking
            # step, say): completed as it was answered, its event put back, as a flow's
            # delivery does — given back, it waited again for a run that went on (a
            # black-box auditor).
            used = True
            await keeper.stop()
            event = await manager.redact_event(
                correlation_key, answered, namespace=record.namespace
            )
            if await renew_own_claim(adapter, record, event_payload=event) is not None:
                await adapter.complete_wait_record(
                    correlation_key, claimant, namespace=record.namespace
                )
            raise ActionRefused(
                f"run {record.stack_id!r} already received an event for {correlation_key!r} "
                "and went on; this one was not delivered"
            )
        # Decided as a flow's delivery decides (records.another_record_of_its_key): a
        # run that does not say which record it waits on (a TypeScript worker's, an
        # older siglo's) is taken to wait on this one.
        embedded = None if checkpoint is None else embedded_wait_record(checkpoint.metadata)
        if (
            checkpoint is None
            or (embedded is not None and embedded.correlation_key != correlation_key)
            or another_record_of_its_key(checkpoint.metadata, record)
        ):
            raise ActionRefused(
                f"the run {record.stack_id!r} of this wait is gone, or waits on another wait "
                "now; nothing was delivered"
            )
        refuse_unopened(checkpoint)
        stack = manager.restore_checkpoint(checkpoint, expected_namespace=record.namespace)
        try:
            refuse_changed(stack.revision)
            # The step that waits for the key now, unanswered — never the step the record
            # names once that one ran (a wait answered and gone past, whose claim lapsed):
            # the event would have been written over the one the step used, or into a
            # step that runs no more (a black-box auditor).
            named = stack.contexts.get(record.step_id) if record.step_id else None
            step = (
                None
                if named is not None and OUTPUT in named
                else _waiting_step(stack, correlation_key)
            )
            if step is not None and answer_of(stack.contexts[step]) is not None:
                step = None  # answered already: its run goes on with that answer
            if step is None or stack.status != "waiting":
                raise ActionRefused(
                    f"run {record.stack_id!r} is {stack.status}, not waiting for "
                    f"{correlation_key!r}; nothing was delivered"
                )
            stack.set(step, EVENT, payload)
            stack.transition("running")
            await manager.save(stack, expected_revision=stack.revision)
        finally:
            manager.discard_stack(stack)
        used = True
        # Completed under the run's lock, before a worker can take the run up.
        await keeper.stop()
        try:
            await adapter.complete_wait_record(
                correlation_key, claimant, namespace=record.namespace
            )
        except WaitRecordClaimError:
            # The event is stored with the run: delivered. The claim lapsed meanwhile (a
            # store too slow to renew it) and another claimant holds the wait; it finds
            # the run answered and completes the wait.
            log.warning(
                "wait %r: the event was stored with run %r, but the claim lapsed meanwhile "
                "and another claimant completes the wait",
                correlation_key,
                record.stack_id,
            )

    # The claim is renewed while the delivery waits for the run's lock and marks it
    # (siglo.workflow.claim_keeper): lapsed, a retry took it over, and both were refused
    # though this event was used (a black-box auditor).
    keeper = ClaimKeeper(adapter, record)
    try:
        if adapter.supports(Capability.WORKFLOW_LOCK):
            await adapter.with_workflow_lock(
                record.stack_id, mark, timeout_ms=2_000, namespace=record.namespace
            )
        else:
            await mark()
    except BaseException as failed:
        await keeper.stop()
        if not used:
            # Not delivered (refused, or its save failed): the wait goes back to waiting
            # for the next delivery, as it was.
            try:
                await give_back()
            except Exception as exc:
                # What the caller is told is why nothing was delivered, not this.
                failed.add_note(
                    f"the claim of {correlation_key!r} could not be given back at once "
                    f"({exc}); it is being given back in the background"
                )
        raise
    return (
        f"delivered to {correlation_key}: run {record.stack_id} continues on the next "
        "`siglo worker` pass"
    )
