"""Flows: steps run in order, checkpointed after each, resumable anywhere."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

from siglo import telemetry
from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.checkpoint import TERMINAL_STATUSES
from siglo.codec import private_copy, refuse_reserved_value, stored_event, stored_form
from siglo.errors import (
    CapabilityNotSupportedError,
    CheckpointConflictError,
    DocumentTooLargeError,
    InvalidArgumentError,
    InvalidStateTransitionError,
    NotJSONError,
    ReservedFormError,
    StorageAdapterError,
    WaitRecordClaimError,
    WorkflowVersionMismatchError,
)
from siglo.manager import StorageManager, default_storage_manager
from siglo.masking import logger
from siglo.moments import describe_ms, iso_ms
from siglo.records import CacheEvent, WaitRecord, another_record_of_its_key, embedded_wait_record
from siglo.sealing import refuse_unopened_value
from siglo.sentinel import MISSING, Missing
from siglo.stack import ExecutionStack
from siglo.validation import require_id, require_optional_id
from siglo.wait_keys import (
    cancel_own_wait,
    complete_lapsed_claim,
    complete_later,
    place_wait,
    release_own_claim,
    renew_own_claim,
)
from siglo.wait_keys import claim_for_delivery as _claim
from siglo.wire import later_ms
from siglo.workflow.claim_keeper import ClaimKeeper
from siglo.workflow.outcomes import (
    EVENT,
    TIMED_OUT,
    WAITING_FOR,
    answer_of,
    is_sleep,
    wait_outcome,
)
from siglo.workflow.step import Step, StepRun, _Suspend, current_step

__all__ = ["STEP_CACHE_KEY", "Flow", "WorkflowSuspended", "flow", "run_cache_namespace"]

log = logger("siglo.workflow")

_RESUMING: Final[ContextVar[ClaimKeeper | None]] = ContextVar("siglo_resuming", default=None)
"""The claim of the wait a delivery (or a timer) is resuming the current run from."""

REFUSED_UNWRITTEN: Final = (DocumentTooLargeError, ReservedFormError, NotJSONError)
"""A run's checkpoint refused before anything was written, whatever is retried: too
large, holding a value of a form siglo reserves, or a value that is not JSON data. The
flow fails the run on any, as a step that raised, rather than leave it running or
waiting (for a worker to run the step, and its side effects, again at every pass)."""

_NO_SPAN: Final = contextlib.nullcontext()

OUTPUT: Final = "output"
STEP_CACHE_KEY: Final = "stepCache"
"""Checkpoint metadata key of the run's cached steps: per step name, ``{"result": "hit" |
"miss", "key": <cache key>, "at": <look-up, epoch ms>, "ttlMs": <the entry's TTL>}``
(a miss's entry is written with the step's checkpoint: it expires ``ttlMs`` after
``at``). Recorded in the checkpoint the step's output is saved in, so it costs no write
of its own; ``siglo ui`` shows it on the run's page."""

Migration = Callable[[ExecutionStack], None]
T = TypeVar("T")


class WorkflowSuspended(Exception):
    """A run stopped to wait for an event; deliver it with :meth:`Flow.deliver`.

    Not named ``…Error``: like ``StopIteration`` it is a signal, not a failure.
    """

    siglo_signal = True
    """Not a failure to :mod:`siglo.telemetry`: a span it ends is not an error."""

    def __init__(
        self, stack_id: str, correlation_key: str, step: str, *, until_ms: int | None = None
    ) -> None:
        self.stack_id = stack_id
        self.correlation_key = correlation_key
        self.step = step
        self.until_ms = until_ms
        """The wait's deadline (a sleep's end), epoch ms; ``None`` if it has none."""
        if is_sleep(correlation_key):
            # A sleep's key is siglo's own: say what the run does instead.
            until = "" if until_ms is None else f" until {iso_ms(until_ms)}"
            text = f"workflow {stack_id!r} is sleeping in step {step!r}{until}"
        else:
            text = (
                f"workflow {stack_id!r} is waiting in step {step!r} for event {correlation_key!r}"
            )
        super().__init__(text)


@dataclass(frozen=True)
class Flow:
    """Steps that run in order, each output the next one's input.

    ``version`` fingerprints the step names: a checkpoint written by a flow with other
    steps is refused on resume unless :meth:`with_migration` registered a migration from
    its version.
    """

    steps: tuple[Step, ...]
    name: str
    migrations: Mapping[str, Migration] = field(default_factory=dict)

    @functools.cached_property
    def version(self) -> str:
        """A fingerprint of the flow's step names, in order (worked out once: every run
        stores it)."""
        names = "\x1f".join(step.name for step in self.steps)
        return hashlib.sha256(names.encode()).hexdigest()[:16]

    def with_migration(self, from_version: str, migrate: Migration) -> Flow:
        """A copy that resumes checkpoints of ``from_version`` after ``migrate(stack)``."""
        # Checked here, at import, not when a run of that version is first taken up.
        if type(from_version) is not str or not from_version:
            raise InvalidArgumentError(
                f"from_version must be a flow's version (its .version: text), got {from_version!r}"
            )
        if not callable(migrate):
            raise InvalidArgumentError(
                f"migrate must be a callable taking the restored ExecutionStack, got {migrate!r}"
            )
        return replace(self, migrations={**self.migrations, from_version: migrate})

    # -- running --------------------------------------------------------------------

    async def run(
        self,
        input: Any = None,
        *,
        manager: StorageManager | None = None,
        stack_id: str | None = None,
        namespace: str | None = None,
    ) -> Any:
        """Run the flow and return the last step's output: run-or-continue.

        Without ``stack_id`` (a new UUID) or with one not stored yet, the run starts from
        the first step with ``input``. With the ``stack_id`` of a run already stored, that
        run is taken up instead (its own input is kept): a completed run returns its
        output, a run waiting for an event raises :class:`WorkflowSuspended` again, a run
        left ``running`` by a crashed process continues after its last finished step, and
        a run that failed or was cancelled raises
        :class:`~siglo.errors.InvalidStateTransitionError` saying so. So a script may run
        twice on a persistent store and get the same answer.

        The run holds the stack's workflow lock (where the backend has one), so two
        callers never execute one run at once, and a ``siglo worker`` can tell a crashed
        run (lock lease lapsed) from a live one. Raises :class:`WorkflowSuspended` if a
        step waits; a failing step's exception propagates after the stack is
        checkpointed as ``failed``.
        """
        manager = _manager_of(manager)
        run_id = require_id("stack_id", stack_id if stack_id is not None else str(uuid.uuid4()))
        require_optional_id("namespace", namespace)

        async def start_or_continue() -> Any:
            # Without a namespace the creation's compare-and-set (expected revision 0) is
            # the look-up: it stores nothing where a run is stored, and a new run, the
            # usual case, costs no read first (one round trip fewer a run). A namespaced
            # run reads first: its look-up falls back to the stack without a namespace,
            # which the creation does not see.
            if namespace is None or (
                await manager.load_checkpoint(run_id, namespace=namespace) is None
            ):
                stack = manager.create_stack(
                    run_id,
                    workflow_id=self.name,
                    namespace=namespace,
                    # As a resume reads it (a datetime as text …): the first step sees
                    # the same input either way.
                    metadata={
                        "flowVersion": self.version,
                        "input": stored_form(input, "the input of run", run_id),
                    },
                )
                try:
                    if telemetry.current() is None:
                        await manager.save(stack, expected_revision=0)
                    else:
                        with telemetry.conflict_expected():  # the look-up: not a failure
                            await manager.save(stack, expected_revision=0)
                except CheckpointConflictError:
                    # Stored already (or created meanwhile by a caller without the
                    # lock): take that run up.
                    manager.discard_stack(stack)
                except BaseException:
                    # Cancelled (a request's timeout), or the save failed: the manager
                    # must not keep the live stack, or the next run of this id in this
                    # process would meet it.
                    manager.discard_stack(stack)
                    raise
                else:
                    try:
                        return await self._execute(manager, stack, unlock=True)
                    finally:
                        # The checkpoint holds the run now; a long-lived manager must
                        # not keep every finished or suspended run's live stack.
                        manager.discard_stack(stack)
            return await self._take_up(manager, run_id, namespace)

        if telemetry.current() is None:  # nothing listens: no span's name nor attributes
            return await _locked(manager, run_id, namespace, start_or_continue)
        with telemetry.workflow_span(
            f"run {self.name}", self._attributes(run_id, namespace), run=True
        ):
            return await _locked(manager, run_id, namespace, start_or_continue)

    async def resume(
        self, stack_id: str, *, manager: StorageManager | None = None, namespace: str | None = None
    ) -> Any:
        """Continue a run from its last checkpoint (after a crash, in any process).

        A completed run returns its output; a run still waiting raises
        :class:`WorkflowSuspended` again. Holds the workflow lock like :meth:`run`.
        """
        manager = _manager_of(manager)
        require_id("stack_id", stack_id)
        require_optional_id("namespace", namespace)
        with telemetry.workflow_span(
            f"resume {self.name}", self._attributes(stack_id, namespace), run=True
        ):
            return await _locked(
                manager, stack_id, namespace, lambda: self._take_up(manager, stack_id, namespace)
            )

    async def recover(
        self, stack_id: str, *, manager: StorageManager | None = None, namespace: str | None = None
    ) -> bool:
        """Continue a run left ``running`` by a process that died; ``True`` if it was.

        Only a run whose workflow lock is free is taken: a live process renews its
        lease, so a free lock on a ``running`` run means its process is gone (or its
        lease lapsed). Raises :class:`~siglo.errors.LockNotAcquiredError` at once when
        the lock is held. Finished steps are not run again; the step that was running
        when the process died runs again from its start. What ``siglo worker`` calls.
        """
        manager = _manager_of(manager)
        require_id("stack_id", stack_id)
        require_optional_id("namespace", namespace)
        adapter = _require(manager, Capability.WORKFLOW_LOCK)

        answered: list[_Answered] = []

        async def take_over() -> bool:
            with telemetry.lock_held_expected(False):  # the steps' own locks are not
                stack = await self._restore(manager, stack_id, namespace)
                try:
                    if stack.status != "running":
                        return False  # finished, or suspended, since it was listed
                    await self._execute(manager, stack, unlock=True)
                    return True
                finally:
                    answered[:] = _answered_waits(stack)
                    manager.discard_stack(stack)

        try:
            # A held lock is the run alive elsewhere: an answer, not a failure (spans).
            with (
                telemetry.lock_held_expected(),
                telemetry.workflow_span(
                    f"recover {self.name}", self._attributes(stack_id, namespace), run=True
                ),
            ):
                recovered = await adapter.with_workflow_lock(
                    stack_id, take_over, timeout_ms=1, namespace=namespace
                )
        except WorkflowSuspended:
            recovered = True
        if recovered:
            await _complete_lapsed_answers(manager, stack_id, namespace, answered)
        return recovered

    async def fire_timeout(
        self,
        correlation_key: str,
        *,
        manager: StorageManager | None = None,
        claimant_id: str | None = None,
        namespace: str | None = None,
    ) -> Any:
        """Resume the run whose wait ``correlation_key`` is past its deadline, as timed out.

        Claims the wait (with ``allow_expired``) exactly like :meth:`deliver`, so of two
        workers firing one timer, or a timer racing a late event, one wins and the other
        gets :class:`~siglo.errors.WaitRecordClaimError`. In the step,
        :func:`~siglo.workflow.wait_for_event` raises
        :class:`~siglo.errors.WaitTimeoutError` and :func:`~siglo.workflow.sleep` returns.
        """
        manager = _manager_of(manager)
        _check_claim_arguments(correlation_key, claimant_id, namespace)
        adapter = _require(manager, Capability.WAIT_RECORDS)
        with self._resume_span(correlation_key, namespace):
            record = await _claim(
                adapter,
                correlation_key,
                claimant_id,
                namespace,
                allow_expired=True,
                # No event: a payload an earlier delivery's lapsed claim left in the record
                # was not used (the run times out now, or keeps its own answer).
                event_payload=None,
            )
            if record is None:
                raise WaitRecordClaimError(
                    await _why_unclaimable(
                        adapter, correlation_key, namespace, manager.clock.now_ms()
                    )
                )
            if not record.is_expired(manager.clock.now_ms()):
                assert record.claimant_id is not None  # a successful claim names its claimant
                await adapter.release_wait_record(
                    correlation_key, record.claimant_id, namespace=record.namespace
                )
                raise InvalidArgumentError(f"the wait {correlation_key!r} is not past its deadline")
            return await self._resume_claimed(
                manager, adapter, record, lambda stack, step: stack.set(step, TIMED_OUT, True)
            )

    async def deliver(
        self,
        correlation_key: str,
        payload: Any = None,
        *,
        manager: StorageManager | None = None,
        claimant_id: str | None = None,
        allow_expired: bool = False,
        namespace: str | None = None,
    ) -> Any:
        """Deliver an event to the run waiting for it, resume that run here, and return
        its output (or raise :class:`WorkflowSuspended` if it waits again).

        The wait record is claimed atomically, so an event delivered twice, or by two
        processes at once, resumes the run once; the other delivery raises
        :class:`~siglo.errors.WaitRecordClaimError`. ``namespace`` is the namespace of
        the waiting run (wait records never cross namespaces).
        """
        manager = _manager_of(manager)
        _check_claim_arguments(correlation_key, claimant_id, namespace)
        if type(allow_expired) is not bool:
            # Its truth would be taken: "false" would claim a wait past its deadline.
            raise InvalidArgumentError(
                f"allow_expired must be True or False, got {allow_expired!r}"
            )
        adapter = _require(manager, Capability.WAIT_RECORDS)
        if is_sleep(correlation_key):
            # A durable sleep's wait, ended by the worker at its deadline: an event would
            # end the sleep at once.
            raise InvalidArgumentError(
                f"{correlation_key!r} is a durable sleep, not a wait for an event: "
                "`siglo worker` ends it at its deadline"
            )
        # Before the claim, which would otherwise complete the wait for a run that then
        # cannot be checkpointed with it.
        payload = stored_event(payload, correlation_key)
        with self._resume_span(correlation_key, namespace):
            record = await _claim(
                adapter,
                correlation_key,
                claimant_id,
                namespace,
                # The payload becomes context: what leaves the process is redacted.
                event_payload=await manager.redact_event(
                    correlation_key, payload, namespace=namespace
                ),
                allow_expired=allow_expired,
            )
            if record is None:
                raise WaitRecordClaimError(
                    await _why_unclaimable(
                        adapter, correlation_key, namespace, manager.clock.now_ms()
                    )
                )
            return await self._resume_claimed(
                manager,
                adapter,
                record,
                lambda stack, step: stack.set(step, EVENT, payload),
                delivering=True,
            )

    def _resume_span(
        self, correlation_key: str, namespace: str | None
    ) -> AbstractContextManager[None]:
        """The ``resume FLOW`` span of a delivery or a timer (when anything listens): it
        covers the claim too, so the claim is in the run's trace; the run's id is added
        once the claim names it."""
        return telemetry.workflow_span(
            f"resume {self.name}",
            {**self._attributes(None, namespace), "siglo.wait.correlation_key": correlation_key},
            run=True,
        )

    async def _resume_claimed(
        self,
        manager: StorageManager,
        adapter: StorageAdapter,
        record: WaitRecord,
        outcome: Callable[[ExecutionStack, str], None],
        *,
        delivering: bool = False,
    ) -> Any:
        """Resume the run of a wait this process claimed, after ``outcome`` marked the
        waiting step (an event, or a timeout); complete the wait afterwards.

        A run that already holds an answer to this wait (an earlier claimant's event or
        timeout, stored with the run, whose claimant stopped before completing the wait
        and whose claim then lapsed) goes on with that answer, not this one: the wait is
        completed as it was answered (a delivery's claim puts the answer's payload back
        in the record), and a delivery then raises
        :class:`~siglo.errors.WaitRecordClaimError`: its event was not used."""
        correlation_key = record.correlation_key
        claimant = record.claimant_id
        assert claimant is not None  # a successful claim always names its claimant
        started = False
        # The restored stack and the revision it was restored at: a run cut off before it
        # took a snapshot (which moves the revision before it is written) stored nothing
        # of this claim, whatever it ran meanwhile.
        restored: ExecutionStack | None = None
        restored_at = 0
        completing = False
        # An earlier claim's answer found in the run (EVENT or TIMED_OUT), and its event.
        answered: str | None = None
        answered_event: Any = None

        # The claim is renewed while the run goes on (a run longer than the lease lost it
        # to a retried delivery): claim_keeper.
        keeper = ClaimKeeper(adapter, record)

        async def complete() -> None:
            nonlocal completing
            completing = True
            try:
                await keeper.stop()
                await complete_claim()
            except BaseException as exc:
                if isinstance(exc, Exception):
                    raise
                # Cut off (the caller's deadline) after the run's checkpoint took the
                # answer: the wait is completed in the background, or it would stay
                # claimed by nobody — a run gone on to its next wait is recovered by no
                # worker, and a wait without a deadline is fired by no timer (a
                # black-box auditor: its key then refused every other run's wait).
                complete_later(adapter, correlation_key, complete_claim)
                raise

        async def complete_claim() -> None:
            if answered is not None:
                # This claim wrote its own payload into the record (a timer's, none), or
                # an earlier claim that lapsed did: the run used the earlier event (or
                # none: it timed out). A claim of the current claimant
                # renews it and puts that back, atomically, before the wait completes —
                # only while the key's record is still the one claimed (a key freed by
                # the run's cancellation may hold another run's wait by now).
                renewed = await renew_own_claim(
                    adapter,
                    record,
                    event_payload=await manager.redact_event(
                        correlation_key, answered_event, namespace=record.namespace
                    ),
                )
                if renewed is None:
                    raise WaitRecordClaimError(
                        f"wait record {correlation_key!r} is not this delivery's claim any more"
                    )
            await adapter.complete_wait_record(
                correlation_key, claimant, namespace=record.namespace
            )

        async def resume_with_outcome() -> Any:
            nonlocal started, answered, answered_event, restored, restored_at
            stack = await self._restore(manager, record.stack_id, record.namespace)
            restored, restored_at = stack, stack.revision
            try:
                step = self._step_for(stack, record)
            except BaseException:
                manager.discard_stack(stack)
                raise
            context = stack.contexts.get(step, {})
            if _waits_on_another_record(stack, record) and OUTPUT not in context:
                # The run waits on another record of the key: the claimed one went with a
                # run removed meanwhile, and this is a new run of the same id (a black-box
                # auditor: the old event, or the old timer, was handed to it, and its own
                # wait left open for ever). Nothing of this claim is its.
                manager.discard_stack(stack)
                raise WaitRecordClaimError(
                    f"no claimable wait for {correlation_key!r}: the wait claimed went with "
                    f"its run, and run {record.stack_id!r} now waits on a wait of its own; "
                    "nothing was delivered"
                )
            answered = answer_of(context)
            if answered is None:
                outcome(stack, step)
            else:
                answered_event = context.get(EVENT)
            if stack.status == "waiting" and OUTPUT not in context:
                stack.transition("running")
            # A run that went on past this answered wait and waits for another is left as
            # it is: _continue says what it waits for now, and the wait is completed.
            started = True
            # A run that waits again on this key (a later step's wait) replaces this
            # claim with its new wait: it is no delivery in flight (_suspend, place_wait).
            resuming = _RESUMING.set(keeper)
            try:
                # Not the action's last write: the wait's completion comes after it.
                result = await self._continue(manager, stack, unlock=False)
            except Exception as exc:
                manager.discard_stack(stack)
                waits_again = (
                    isinstance(exc, WorkflowSuspended) and exc.correlation_key == correlation_key
                )
                # A run that waits again on the same key replaced the claimed record with
                # its new wait: that one is not this delivery's to complete.
                if not isinstance(exc, StorageAdapterError) and not waits_again:
                    # A record gone meanwhile (the run removed: `siglo rm`): the run's
                    # own failure says what happened, not the completion's "no wait
                    # record" (a black-box auditor).
                    with contextlib.suppress(WaitRecordClaimError):
                        await complete()
                # A storage failure may have kept the run's outcome from being stored,
                # and a cancelled run (a worker stopped at once, the process ending) has
                # none: the wait stays claimed, and when the claim's lease lapses the
                # timer is due again or the event can be delivered again (the step runs
                # again from its start, as after a crash).
                raise
            except BaseException:
                manager.discard_stack(stack)
                raise
            finally:
                _RESUMING.reset(resuming)
            manager.discard_stack(stack)
            try:
                await complete()
            except WaitRecordClaimError:
                if answered is not None:
                    raise
                # This claim's outcome was used — the run's checkpoints hold it — but the
                # wait is no longer this claim's to complete. The delivery did what it was
                # for; the log says why (a black-box auditor: it blamed another claimant
                # for a cancel).
                try:
                    there = await adapter.get_wait_record(
                        correlation_key, namespace=record.namespace
                    )
                except StorageAdapterError:
                    there = None  # not known which: the delivery still returns its output
                if there is not None and there.status == "cancelled":
                    # The run was cancelled (cancel_workflow, siglo cancel) after its
                    # checkpoint took the event, before this completion: the cancel ended
                    # the wait, and no transition leads from cancelled to completed.
                    log.warning(
                        "wait %r: the run went on with this claim's %s, but the wait was "
                        "cancelled (cancel_workflow) before the delivery completed it; the "
                        "run keeps the %s and the wait stays cancelled",
                        correlation_key,
                        "event" if delivering else "timeout",
                        "event" if delivering else "timeout",
                    )
                    return result
                # The claim lapsed meanwhile (a step blocked the event loop past the
                # lease, and no renewal ran) and another claimant holds the wait: that
                # one finds the run answered and completes it.
                log.warning(
                    "wait %r: the run went on with this claim's %s, but the claim lapsed "
                    "meanwhile (a step blocked the event loop past claim_lease_ms?) and "
                    "another claimant completes the wait",
                    correlation_key,
                    "event" if delivering else "timeout",
                )
            return result

        telemetry.note_run_id(record.stack_id)  # on the resume span (Flow._resume_span)
        try:
            try:
                if adapter.supports(Capability.WORKFLOW_LOCK):
                    result = await adapter.with_workflow_lock(
                        record.stack_id, resume_with_outcome, namespace=record.namespace
                    )
                else:
                    result = await resume_with_outcome()
            except Exception as exc:
                if delivering and answered is not None:
                    raise _not_used(correlation_key, answered) from exc
                raise
            if delivering and answered is not None:
                raise _not_used(correlation_key, answered)
            return result
        except BaseException as refused:
            await keeper.stop()
            unsaved = restored is not None and restored.revision == restored_at and not completing
            if not started or unsaved:
                # Refused before the run began (a changed flow, no checkpoint, a busy
                # lock), or cut off (cancelled: a caller's deadline; a storage error)
                # before the run took a snapshot: the event was not stored, so the wait
                # must not stay claimed for the whole lease. Put it back to waiting for
                # the next delivery.
                try:
                    # Only its own claim: the key may hold another run's wait by now.
                    await release_own_claim(adapter, record)
                except Exception as exc:
                    refused.add_note(
                        f"the claim on {correlation_key!r} could not be released ({exc}); "
                        "it frees itself when its lease ends"
                    )
            raise

    # -- internals ------------------------------------------------------------------

    async def _restore(
        self, manager: StorageManager, stack_id: str, namespace: str | None
    ) -> ExecutionStack:
        try:
            return await self._restored(manager, stack_id, namespace)
        except Exception as exc:
            mark_left_as_stored(exc)
            raise

    async def _restored(
        self, manager: StorageManager, stack_id: str, namespace: str | None
    ) -> ExecutionStack:
        require_id("stack_id", stack_id)
        checkpoint = await manager.load_checkpoint(stack_id, namespace=namespace)
        if checkpoint is None:
            raise InvalidArgumentError(f"no checkpoint of workflow {stack_id!r} to resume")
        stored_version = str((checkpoint.metadata or {}).get("flowVersion"))
        if (
            checkpoint.workflow_id is not None
            and checkpoint.workflow_id != self.name
            and stored_version not in self.migrations
        ):
            # The version fingerprints step names only: a flow with steps of the same
            # names would take up, and finish, another flow's run. A migration from the
            # run's version says the run is this flow's (a flow made without name= is
            # named after its steps, so a changed one has another name).
            raise InvalidArgumentError(
                f"workflow {stack_id!r} is a run of flow {checkpoint.workflow_id!r}, not of "
                f"{self.name!r}: resume it with that flow, or register a migration from its "
                f"version with flow.with_migration({stored_version!r}, fn) (a flow made "
                "without name= is named after its steps: name both versions alike)"
            )
        if checkpoint.namespace != namespace and checkpoint.status != "completed":
            # Found through namespace_fallback: another run, of no namespace. Its output is
            # readable (a completed run); continuing it here would copy its input and
            # state into this namespace and run its steps beside its own process, under
            # another workflow lock.
            raise InvalidStateTransitionError(
                f"workflow {stack_id!r} has no run in namespace {namespace!r}; the run of no "
                f"namespace with that id (read through namespace_fallback) is "
                f"{checkpoint.status}, and a run is never continued in another namespace: "
                "start this one under another stack_id, or turn namespace_fallback off"
            )
        stack = manager.restore_checkpoint(checkpoint, expected_namespace=namespace)
        if stack.status not in TERMINAL_STATUSES:
            # A run taken up again links to the run that suspended it; one that ended
            # (its stored output read) is not resuming anything.
            telemetry.link_to_suspender(stack.metadata)
        stored = stack.metadata.get("flowVersion")
        if stored != self.version and stack.status not in TERMINAL_STATUSES:
            # A run that ended is not continued: its output is read as stored
            # (_last_output), and a failed or cancelled one says so (_continue).
            migrate = self.migrations.get(str(stored))
            if migrate is None:
                raise WorkflowVersionMismatchError(
                    f"workflow {stack_id!r} was checkpointed by flow version {stored!r}; "
                    f"this flow is version {self.version!r} (its steps changed). Register "
                    f"a migration with flow.with_migration({stored!r}, fn), or resume it "
                    "with the flow that wrote it; a pending event stays deliverable."
                )
            migrate(stack)
            # What the migration set is handed on as a resume from its checkpoint reads
            # it (a datetime as text …), as every step output and event is.
            for step_id, context in stack.contexts.items():
                for key in (OUTPUT, EVENT):
                    if key in context:
                        context[key] = stored_form(context[key], f"{key} of step", step_id)
            if "input" in stack.metadata:
                stack.metadata["input"] = stored_form(
                    stack.metadata["input"], "the input of run", stack.stack_id
                )
            stack.metadata["flowVersion"] = self.version
        return stack

    async def _take_up(self, manager: StorageManager, stack_id: str, namespace: str | None) -> Any:
        stack = await self._restore(manager, stack_id, namespace)
        # Only a run continued here (one left running: a crash) may hold answers whose
        # delivery died; a completed or waiting run taken up (`run` of a stored id, a
        # retried request) is read and returned, with no look-up of its waits.
        continued = stack.status == "running"
        try:
            result = await self._continue(manager, stack, unlock=True)
        except Exception:
            # Suspended again, or failed: the answers its checkpoint holds are stored.
            await self._done_taking_up(manager, stack, continued=continued)
            raise
        except BaseException:
            manager.discard_stack(stack)  # cut off: no more storage work
            raise
        await self._done_taking_up(manager, stack, continued=continued)
        return result

    async def _done_taking_up(
        self, manager: StorageManager, stack: ExecutionStack, *, continued: bool
    ) -> None:
        """Discard a resumed run's stack, and, if it was ``continued``, complete the waits
        it holds answers to whose delivery's claim lapsed (:func:`_complete_lapsed_answers`)."""
        answered = _answered_waits(stack) if continued else []
        manager.discard_stack(stack)
        await _complete_lapsed_answers(manager, stack.stack_id, stack.namespace, answered)

    async def _continue(
        self, manager: StorageManager, stack: ExecutionStack, *, unlock: bool
    ) -> Any:
        if stack.status == "completed":
            return self._last_output(stack)
        if stack.status == "waiting":
            step, key = self._waiting_step(stack)
            raise WorkflowSuspended(stack.stack_id, key, step, until_ms=_deadline(stack))
        if stack.status != "running":
            raise InvalidStateTransitionError(
                f"workflow {stack.stack_id!r} already ended {stack.status}; it cannot be "
                "continued. Start a new run under another stack_id, or remove this one "
                f"(siglo rm URL {stack.stack_id})"
            )
        return await self._execute(manager, stack, unlock=unlock)

    def _attributes(self, run_id: str | None, namespace: str | None) -> dict[str, Any]:
        return {
            "siglo.workflow.name": self.name,
            "siglo.run.id": run_id,
            "siglo.namespace": namespace,
        }

    def _last_output(self, stack: ExecutionStack) -> Any:
        """The run's output: its last step's. A run another version of the flow
        completed is read in the order its steps ran (its contexts' order), not by this
        version's steps."""
        value = stack.metadata.get("input")
        if stack.metadata.get("flowVersion") == self.version:
            names: Iterable[str] = (step.name for step in self.steps)
        else:
            names = list(stack.contexts)
        for name in names:
            ctx = stack.contexts.get(name, {})
            if OUTPUT in ctx:
                value = ctx[OUTPUT]
        return value

    def _step_for(self, stack: ExecutionStack, record: WaitRecord) -> str:
        """The step a claimed wait's event (or timeout) goes to: the one of this flow
        that waits for its key — after a migration that renamed the waiting step, not
        the step the wait record names. A waiting run with no step waiting for the key
        is refused (before the event is consumed: the claim is released)."""
        key = record.correlation_key
        named = stack.contexts.get(record.step_id) if record.step_id is not None else None
        if (
            named is not None
            and OUTPUT in named
            and named.get(WAITING_FOR) == key
            and answer_of(named) is not None
        ):
            # The claimed record is of a wait its step answered and went past: not the
            # run's later wait on the same key (whose record replaces it once placed).
            assert record.step_id is not None
            return record.step_id
        for step in self.steps:
            ctx = stack.contexts.get(step.name, {})
            if OUTPUT not in ctx and ctx.get(WAITING_FOR) == key:
                return step.name
        for step in self.steps:
            ctx = stack.contexts.get(step.name, {})
            if OUTPUT in ctx and ctx.get(WAITING_FOR) == key and answer_of(ctx) is not None:
                # Answered, and the run went on past it (to another wait, say): a
                # claimant that stopped before completing the wait left it claimed.
                return step.name
        if stack.status == "waiting":
            raise mark_left_as_stored(
                InvalidStateTransitionError(
                    f"workflow {stack.stack_id!r}: no step of flow {self.name!r} waits for "
                    f"{key!r} (its wait was made in step {record.step_id!r}); a migration "
                    "that renames or moves a waiting step must move its context, "
                    "waitingFor included, to the step that waits now. The event stays "
                    "deliverable."
                )
            )
        # Not waiting any more (a delivery cut off after the run went on): as stored.
        return record.step_id or self._waiting_step(stack)[0]

    def _waiting_step(self, stack: ExecutionStack) -> tuple[str, str]:
        for step in self.steps:
            ctx = stack.contexts.get(step.name, {})
            if OUTPUT not in ctx and WAITING_FOR in ctx:
                return step.name, str(ctx[WAITING_FOR])
        raise InvalidStateTransitionError(f"workflow {stack.stack_id!r} waits for nothing")

    async def _execute(
        self, manager: StorageManager, stack: ExecutionStack, *, unlock: bool
    ) -> Any:
        """:meth:`_run_steps`; a checkpoint refused because the run was cancelled
        meanwhile (``cancel_workflow`` from elsewhere) says so, rather than ask to
        "reconcile and retry" a run that cannot be continued."""
        try:
            return await self._run_steps(manager, stack, unlock=unlock)
        except CheckpointConflictError as conflict:
            try:
                stored = await manager.load_checkpoint(stack.stack_id, namespace=stack.namespace)
            except Exception:
                stored = None  # the conflict is the answer then
            if stored is None or stored.status != "cancelled":
                raise
            raise InvalidStateTransitionError(
                f"workflow {stack.stack_id!r} was cancelled while it ran: what its steps did "
                "since the cancellation was not stored, and it cannot be continued"
            ) from conflict

    async def _run_steps(
        self, manager: StorageManager, stack: ExecutionStack, *, unlock: bool
    ) -> Any:
        """Run the steps not finished yet, checkpointing each; the last step's output.

        ``unlock``: the run's last checkpoint (completed, failed or waiting) is the last
        write of the action holding the workflow lock, so the lock may be released with
        it (``StorageManager.save_checkpoint(…, unlock=True)``).
        """
        value = stack.metadata.get("input")
        last = self.steps[-1]
        ahead: _LookAhead | None = None
        traced = telemetry.current() is not None
        for index, step in enumerate(self.steps):
            ctx = stack.contexts.get(step.name, {})
            if OUTPUT in ctx:  # finished before a crash or a wait
                value = ctx[OUTPUT]
                continue
            try:
                with (
                    telemetry.workflow_span(
                        f"step {step.name}",
                        {
                            **self._attributes(stack.stack_id, stack.namespace),
                            "siglo.step.name": step.name,
                        },
                    )
                    if traced
                    else _NO_SPAN  # nothing listens: no span's name nor attributes
                ):
                    value, entry, cached = await self._run_step(
                        manager,
                        stack,
                        step,
                        value,
                        ctx.get(EVENT, MISSING),
                        bool(ctx.get(TIMED_OUT)),
                        ahead,
                        waited_for=ctx.get(WAITING_FOR),
                    )
            except _Suspend as wait:
                stored = stack.revision
                try:
                    await self._suspend(manager, stack, step, wait, unlock=unlock)
                except _WaitRefused as taken:
                    # Nothing was written: the run fails here, as a step that raised,
                    # rather than stay running for a worker to rerun the step.
                    await _save_failed(manager, stack, step, stored, unlock=unlock)
                    raise InvalidArgumentError(str(taken)) from None
                except REFUSED_UNWRITTEN:
                    # The waiting checkpoint is too large, or holds a reserved form (its
                    # wait is cancelled): the run fails, as when a step's output is,
                    # instead of staying running.
                    stack.delete(step.name, WAITING_FOR)
                    stack.metadata.pop("waitRecord", None)
                    stack.status = "running"  # the refused "waiting", taken back
                    await _save_failed(manager, stack, step, stored, unlock=unlock)
                    raise
                raise WorkflowSuspended(
                    stack.stack_id, wait.correlation_key, step.name, until_ms=_deadline(stack)
                ) from None
            except Exception:
                await _save_failed(manager, stack, step, stack.revision, unlock=unlock)
                raise
            stack.set(step.name, OUTPUT, value)
            stack.push_chain(step.name)
            if cached is not None:
                stack.metadata.setdefault(STEP_CACHE_KEY, {})[step.name] = cached
            if step is last:
                # The last step's outcome and the completion are one checkpoint: nothing
                # runs between them, so a separate save would only cost a commit (a
                # crash before it reruns the step, as before any step's checkpoint).
                stack.transition("completed")
            # The next step's cache look-up goes beside this checkpoint, unless this step
            # writes a cache entry, which a look-up of the same key must see.
            ahead = (
                None
                if step is last or entry is not None
                else _look_ahead(manager, stack, self.steps[index + 1], value)
            )
            stored = stack.revision
            try:
                await _save_with(manager, stack, entry, unlock=unlock and step is last)
            except BaseException as exc:
                if ahead is not None:
                    await ahead.discard()
                if entry is not None and isinstance(exc, CheckpointConflictError):
                    # The entry is stored whatever the compare-and-set decided.
                    await self._cache_event(manager, "set", entry.key, stack, step)
                if isinstance(exc, REFUSED_UNWRITTEN):
                    # Nothing was written (the guard refuses first). The step's output
                    # cannot be stored (too large, or of a form siglo reserves): the run
                    # fails as if the step had raised, instead of staying "running" for a
                    # worker to rerun the step, and its side effects, at every pass.
                    stack.delete(step.name, OUTPUT)
                    if stack.chains and stack.chains[-1] == step.name:
                        stack.chains.pop()
                    stack.metadata.get(STEP_CACHE_KEY, {}).pop(step.name, None)
                    if stack.status == "completed":  # the last step's, refused with it
                        stack.status = "running"
                    await _save_failed(manager, stack, step, stored, unlock=unlock)
                raise
            if entry is not None:
                await self._cache_event(manager, "set", entry.key, stack, step)
        if stack.status != "completed":
            # Every step's output was stored already (a run checkpointed by a version that
            # saved the last step and the completion apart): only the completion is left.
            stack.transition("completed")
            await manager.save(stack, expected_revision=stack.revision, unlock=unlock)
        return value

    async def _run_step(
        self,
        manager: StorageManager,
        stack: ExecutionStack,
        step: Step,
        value: Any,
        event: Any | Missing,
        timed_out: bool = False,
        ahead: _LookAhead | None = None,
        *,
        waited_for: Any = None,
    ) -> tuple[Any, CacheEntry | None, dict[str, Any] | None]:
        """The step's output, its cache entry if one is due, and what its cache look-up
        found (for :data:`STEP_CACHE_KEY`; ``None`` for an uncached step).

        The cache entry is not written here: the caller writes it with the step's
        checkpoint (:func:`_save_with`), in one write where the backend can. ``ahead``:
        this step's cache look-up, already sent beside the previous step's checkpoint.
        """
        cache = _step_cache(manager)
        looked_up: dict[str, Any] | None = None
        if ahead is not None:
            key: str | None = ahead.key
        else:
            key = step.cache_key_for(value) if step.cache_ttl_ms is not None else None
        if cache is not None and key is not None:
            cached = await (
                ahead.lookup
                if ahead is not None
                else cache.get_cached_step(key, **_cache_namespace(stack))
            )
            kind = "miss" if cached is MISSING else "hit"
            telemetry.note_step_cache(kind)
            await self._cache_event(manager, kind, key, stack, step)
            looked_up = {
                "result": kind,
                "key": key,
                "at": manager.clock.now_ms(),
                "ttlMs": step.cache_ttl_ms,
            }
            if cached is not MISSING:
                # Opened (and resolved) below on a connection with the keys (and the blob
                # store): here it would be taken for the step's output (refuse_unopened,
                # for a checkpoint).
                refuse_unopened_value(cached, f"cached step {key!r}")
                return cached, None, looked_up
        # The step is handed copies (run_input() and wait_for_event() make theirs when
        # called): the same objects are the run's stored input, the previous step's
        # stored output and the event in this step's context, and a step changing its
        # input in place changed them — the next checkpoint then stored the previous
        # step's output as this step had changed it, and a resume handed it on so (a
        # black-box auditor).
        run = StepRun(
            stack.stack_id,
            step.name,
            stack.namespace,
            stack.metadata.get("input"),
            event,
            timed_out,
            manager,
            stack.redact_fields,
            waited_for if isinstance(waited_for, str) else None,
        )
        token = current_step.set(run)
        try:
            output = await step.fn(private_copy(value))
        finally:
            current_step.reset(token)
        # Handed on as a resume reads it from the checkpoint (a datetime as text, a tuple
        # as a list …), so the next step sees the same whether this one ran here or
        # before a wait or a crash; an output that is not JSON fails the run here.
        output = stored_form(output, "the output of step", step.name)
        if cache is None or key is None:
            return output, None, None
        # The output becomes context, so it is stored redacted like context: a later
        # cache hit returns "[REDACTED]" under the redacted keys, as a resume does.
        # By this run's stack itself: another tenant's run of the same id may be live in
        # this manager (or none, its own keys then lost).
        cached_output = manager.redact(output, stack)
        refuse_reserved_value(cached_output, f"the output of step {step.name!r}")
        entry = CacheEntry(key, cached_output, step.cache_ttl_ms, stack.namespace)
        return output, entry, looked_up

    async def _cache_event(
        self,
        manager: StorageManager,
        kind: str,
        key: str,
        stack: ExecutionStack,
        step: Step,
    ) -> None:
        adapter = manager.adapter
        if adapter is None or not adapter.supports(Capability.CACHE_EVENTS):
            return
        event = CacheEvent(
            type=kind,  # type: ignore[arg-type]  # one of the literal kinds above
            key=key,
            timestamp=manager.clock.now_ms(),
            stack_id=stack.stack_id,
            step_id=step.name,
            ttl_ms=step.cache_ttl_ms,
        )
        await adapter.on_cache_event(event)

    async def _suspend(
        self,
        manager: StorageManager,
        stack: ExecutionStack,
        step: Step,
        wait: _Suspend,
        *,
        unlock: bool,
    ) -> None:
        adapter = _require(manager, Capability.WAIT_RECORDS)
        retention = _retention_ms(adapter)
        if wait.timeout_ms is not None and retention is not None and wait.timeout_ms >= retention:
            # The store forgets the wait (and the run) checkpoint_ttl_ms after it is saved:
            # a deadline at or past that is a timer that never fires, and a run that
            # vanishes without a word.
            raise _WaitRefused(
                f"run {stack.stack_id!r} cannot wait {wait.timeout_ms} ms for "
                f"{wait.correlation_key!r}: this backend keeps a run and its wait for "
                f"{retention} ms (checkpoint_ttl_ms), so the timer would never fire; connect "
                "it with a checkpoint_ttl_ms longer than the longest timeout (or none), or "
                "wait less"
            )
        now = manager.clock.now_ms()
        record = WaitRecord(
            correlation_key=wait.correlation_key,
            stack_id=stack.stack_id,
            namespace=stack.namespace,
            step_id=step.name,
            created_at=now,
            expires_at=None if wait.timeout_ms is None else later_ms(now, wait.timeout_ms),
        )
        # The wait record goes first: a crash before the checkpoint leaves a wait that an
        # event can still resume (from the previous checkpoint), never a checkpoint
        # waiting for a record that does not exist. Created only where no other run's
        # pending wait holds the key (one create-if-absent; a record of this run — a
        # rerun after a crash — or one whose wait ended is replaced): a second run
        # waiting on the key would take the first's wait, and the first would never
        # resume.
        resuming = _RESUMING.get()
        if resuming is not None and resuming.keeps(record.correlation_key, record.namespace):
            # The run waits again on the key it was resumed from: the new wait replaces
            # the claim, which no renewal may take back afterwards.
            await resuming.stop()
        placed, there = await place_wait(
            adapter,
            record,
            now_ms=now,
            resuming_claimant=None if resuming is None else resuming.claimant,
        )
        if placed == "taken" and await _completed_as_answered(manager, there):
            # The key was held by another run's wait that run had taken its answer to,
            # claimed by a delivery that stopped before completing it: completed now,
            # the key is free.
            placed, there = await place_wait(
                adapter,
                record,
                now_ms=now,
                resuming_claimant=None if resuming is None else resuming.claimant,
            )
        if placed == "present":
            # This run's own wait, which a delivery has claimed and is resuming the run
            # from (it waits for the run's lock): kept, so that the delivery completes it;
            # the run waits on it as it was placed.
            assert there is not None
            record = there.replace(
                status="waiting",
                claimant_id=None,
                claimed_at=None,
                lease_expires_at=None,
                event_payload=None,
            )
        if placed == "taken":
            assert there is not None
            raise _WaitRefused(
                f"run {stack.stack_id!r} cannot wait for {wait.correlation_key!r}: "
                f"run {there.stack_id!r} of {_describe_namespace(stack.namespace)} "
                "waits for it already (a correlation key names one waiting run; "
                "make it unique, e.g. with the run's id)"
            )
        stack.set(step.name, WAITING_FOR, wait.correlation_key)
        stack.metadata["waitRecord"] = record.to_wire()
        traceparent = telemetry.suspending_traceparent()
        if traceparent is not None:
            # The run that resumes this one (in any process) links its span to ours.
            stack.metadata[telemetry.TRACEPARENT_KEY] = traceparent
        stack.transition("waiting")
        try:
            await manager.save(stack, expected_revision=stack.revision, unlock=unlock)
        except (CheckpointConflictError, *REFUSED_UNWRITTEN):
            # Refused, nothing written: another writer changed the run since it was read
            # — deleted it (`siglo rm`, `prune`), cancelled it — or the waiting checkpoint
            # is too large. The wait just written waits for nothing: cancelled, it neither
            # holds its key against another run nor fires as a timer.
            # Only if it is still this run's: the key may be another run's by now.
            with contextlib.suppress(Exception):
                await cancel_own_wait(adapter, record)
            raise


def _waits_on_another_record(stack: ExecutionStack, record: WaitRecord) -> bool:
    """Whether waiting ``stack`` waits on a record of ``record``'s key other than it (by
    its creation time: where either does not say it, a TypeScript worker's or an older
    siglo's, it is taken for the same)."""
    return stack.status == "waiting" and another_record_of_its_key(stack.metadata, record)


@dataclass(frozen=True)
class _Answered:
    """A wait a run's step waited on and was answered: its key, the step, and the event
    the run used (``None`` for a timeout, which used none)."""

    correlation_key: str
    step: str
    event: Any


def _answered_waits(stack: ExecutionStack) -> list[_Answered]:
    """The waits ``stack``'s steps waited on and were answered (an event, or a timeout)."""
    return _answered_in(stack.contexts)


def _answered_in(contexts: Mapping[str, Mapping[str, Any]]) -> list[_Answered]:
    """The waits the steps of ``contexts`` waited on and were answered."""
    return [
        _Answered(
            str(context[WAITING_FOR]),
            step,
            context.get(EVENT) if answer_of(context) == EVENT else None,
        )
        for step, context in contexts.items()
        if WAITING_FOR in context and answer_of(context) is not None
    ]


async def _completed_as_answered(manager: StorageManager, there: WaitRecord | None) -> bool:
    """Whether ``there`` — the wait of another run holding a key a run would wait on —
    was claimed by a delivery whose claim lapsed after that run's checkpoint took its
    answer, and is now completed as it was answered (:func:`_complete_lapsed_answers`).
    The delivery stopped before it completed the wait (its process died, or a save
    whose outcome was unknown), and a run gone on to its next wait is recovered by no
    worker: without this its key refused every other run's wait until a retried
    delivery of it."""
    adapter = manager.adapter
    if (
        there is None
        or adapter is None
        or there.status != "claimed"
        or not there.lease_expired(manager.clock.now_ms())
    ):
        return False
    try:
        # That run's own checkpoint, never the un-namespaced stack of its id.
        checkpoint = await adapter.get_checkpoint(there.stack_id, there.namespace, fallback=False)
    except Exception as exc:
        log.warning("wait %r: its run could not be read (%s)", there.correlation_key, exc)
        return False
    if checkpoint is None:
        return False
    answered = [
        wait
        for wait in _answered_in(checkpoint.contexts)
        if wait.correlation_key == there.correlation_key and wait.step == there.step_id
    ]
    if not answered:
        return False
    await _complete_lapsed_answers(manager, there.stack_id, there.namespace, answered)
    return True


async def _complete_lapsed_answers(
    manager: StorageManager,
    stack_id: str,
    namespace: str | None,
    answered: list[_Answered],
) -> None:
    """Complete the waits ``answered`` (a run's, which a recovery or a resume just
    continued) that a delivery claimed and never completed: its process died after the
    run took the event, and the claim's lease lapsed. A wait without a deadline is fired
    by no timer, so nothing else would complete it, and its key would refuse every other
    run's wait for as long as the store keeps it. Only this run's record of the answered
    step, still claimed and lapsed (:func:`~siglo.wait_keys.complete_lapsed_claim`),
    with the answer the run used put back in the record (the event, redacted as a
    delivery stores it, or none for a timeout): a later delivery's claim that lapsed
    too wrote its own payload there, which the run never used. A failure is logged, not
    raised: the run's own work is done and stored."""
    adapter = manager.adapter
    if not answered or adapter is None or not adapter.supports(Capability.WAIT_RECORDS):
        return
    for wait in answered:
        correlation_key, step = wait.correlation_key, wait.step
        try:
            record = await adapter.get_wait_record(correlation_key, namespace=namespace)
            if (
                record is None
                or record.correlation_key != correlation_key
                or record.stack_id != stack_id
                or record.step_id != step
                or record.status != "claimed"
                or not record.lease_expired(manager.clock.now_ms())
            ):
                continue
            used = (
                None
                if wait.event is None
                else await manager.redact_event(correlation_key, wait.event, namespace=namespace)
            )
            if await complete_lapsed_claim(
                adapter, record, uuid.uuid4().hex, event_payload=used, now_ms=manager.clock.now_ms
            ):
                log.info(
                    "wait %r of run %r completed: its delivery's claim lapsed after the run "
                    "took the event",
                    correlation_key,
                    stack_id,
                )
        except Exception as exc:
            log.warning(
                "wait %r of run %r: the run holds its answer, but its lapsed claim could "
                "not be completed (%s); a retried delivery completes it",
                correlation_key,
                stack_id,
                exc,
            )


def _deadline(stack: ExecutionStack) -> int | None:
    """The deadline of the wait a suspended stack keeps in its metadata, if any."""
    embedded = embedded_wait_record(stack.metadata)
    return None if embedded is None else embedded.expires_at


def _not_used(correlation_key: str, answer: str) -> WaitRecordClaimError:
    """A delivery whose claim found the run already answered (see
    ``Flow._resume_claimed``): the run went on, and this event was not used."""
    what = "an event" if answer == EVENT else "its timeout"
    return WaitRecordClaimError(
        f"no claimable wait for event {correlation_key!r}: its run had already received "
        f"{what} from an earlier claim, whose claimant stopped before completing the wait; "
        "the run went on with that, and this event was not used"
    )


async def _why_unclaimable(
    adapter: StorageAdapter, correlation_key: str, namespace: str | None, now: int
) -> str:
    """The reason a claim was refused, and what to do about it, for the error message."""
    record = await adapter.get_wait_record(correlation_key, namespace=namespace)
    if record is not None and record.correlation_key != correlation_key:
        record = None  # the latest wait of a stack with this id, not the wait of this key
    head = f"no claimable wait for event {correlation_key!r}"
    if record is None:
        return f"{head}: no wait has this correlation key (never saved, or past its retention)"
    if record.status == "completed":
        checkpoint = None
        if adapter.supports(Capability.CHECKPOINTS):
            checkpoint = await adapter.get_checkpoint(record.stack_id, namespace, fallback=False)
        if wait_outcome(record, checkpoint, now) == "timed out":
            return (
                f"{head}: it timed out: its deadline {describe_ms(record.expires_at, now)} "
                "passed and its run went on without the event"
            )
        return f"{head}: it was already delivered"
    if record.status == "cancelled":
        return f"{head}: the wait was cancelled"
    if record.status == "claimed" and not record.lease_expired(now):
        return (
            f"{head}: another delivery holds its claim until "
            f"{describe_ms(record.lease_expires_at, now)}; deliver again after that if it "
            "does not complete"
        )
    if record.status == "claimed" and record.expires_at is not None:
        # The claim lapsed (its claimant stopped): what refuses it now is the deadline.
        return (
            f"{head}: an earlier delivery's claim lapsed "
            f"{describe_ms(record.lease_expires_at, now)} and it passed its deadline "
            f"{describe_ms(record.expires_at, now)}; pass allow_expired=True to deliver it "
            "late"
        )
    if record.expires_at is not None:
        return (
            f"{head}: it passed its deadline {describe_ms(record.expires_at, now)}; "
            "pass allow_expired=True to deliver it late"
        )
    return f"{head}: it changed while being claimed; deliver again"


def _retention_ms(adapter: StorageAdapter) -> int | None:
    """How long the backend under ``adapter`` keeps a run and its wait after a save
    (its ``checkpoint_ttl_ms``; ``None``: until removed)."""
    inner: Any = adapter
    while isinstance(getattr(inner, "inner", None), StorageAdapter):
        inner = inner.inner
    retention = getattr(inner, "checkpoint_ttl_ms", None)
    return retention if isinstance(retention, int) and not isinstance(retention, bool) else None


class _WaitRefused(Exception):
    """A wait refused before anything was written (see ``Flow._suspend``): another run's
    pending wait holds the correlation key, or its deadline is past the store's
    retention."""


def _describe_namespace(namespace: str | None) -> str:
    return "no namespace" if namespace is None else f"namespace {namespace!r}"


async def _save_failed(
    manager: StorageManager, stack: ExecutionStack, step: Step, stored: int, *, unlock: bool
) -> None:
    """Checkpoint the run failed at ``step``. When that checkpoint is too large to store
    (:class:`~siglo.errors.DocumentTooLargeError`: the event delivered to the step, or
    its output, made it so), it is stored without them, and if still too large without
    anything else of the step's context (what the step set, the context itself: a run
    stored just under the limit before the step went over it by the step's empty
    context): the run ends failed rather than stays running or waiting, which a worker
    would take up again, rerunning the step's side effects, at every pass (and a wait
    would stay claimed with nothing to resume). ``stored``: the revision stored (a
    refused save has moved the stack past it)."""
    stack.transition("failed")
    stack.revision = stored
    try:
        await manager.save(stack, expected_revision=stored, unlock=unlock)
        return
    except REFUSED_UNWRITTEN:
        if step.name not in stack.contexts:
            raise
    context = stack.contexts[step.name]
    for taken in [key for key in (OUTPUT, EVENT) if key in context]:
        stack.delete(step.name, taken)
    try:
        if context:  # else only the context itself is left to drop
            stack.revision = stored
            await manager.save(stack, expected_revision=stored, unlock=unlock)
            return
    except REFUSED_UNWRITTEN:
        pass
    for left in list(context):
        stack.delete(step.name, left)
    del stack.contexts[step.name]
    if stack.metadata.get(STEP_CACHE_KEY) == {}:
        del stack.metadata[STEP_CACHE_KEY]  # made for this step's entry, and emptied
    stack.revision = stored
    await manager.save(stack, expected_revision=stored, unlock=unlock)


async def _save_with(
    manager: StorageManager,
    stack: ExecutionStack,
    entry: CacheEntry | None,
    *,
    unlock: bool,
) -> None:
    """Checkpoint ``stack``, with a step's cache entry.

    Both go to the adapter in one call (:meth:`StorageAdapter.save_checkpoint_caching`):
    one transaction on SQL (with the context changes and, ``unlock``, the lock's
    release), one script on Redis; an adapter that does not write them together sends
    them at once, and the lock is then released when the action ends. Either way the
    entry is stored whatever the compare-and-set decides: a cache entry without the
    checkpoint makes the rerun step a cache hit. ``unlock``: the checkpoint is the
    action's last write (:meth:`StorageManager.save_checkpoint`).
    """
    await manager.save(stack, expected_revision=stack.revision, unlock=unlock, cache_entry=entry)


def _step_cache(manager: StorageManager) -> StorageAdapter | None:
    """The manager's adapter if it has a step cache."""
    adapter = manager.adapter
    return adapter if adapter is not None and adapter.supports(Capability.STEP_CACHE) else None


def _cache_namespace(stack: ExecutionStack) -> dict[str, Any]:
    """The namespace of a run's cache entries (:func:`run_cache_namespace`)."""
    return run_cache_namespace(stack.namespace)


def run_cache_namespace(namespace: str | None) -> dict[str, Any]:
    """The keyword a run in ``namespace`` passes to every call on its cache entries:
    their namespace is the run's own. The same step and input in two tenants are two
    entries — never one tenant's output served to another — each encrypted under its
    tenant's key, so erasing the tenant leaves its entries unreadable
    (docs/encryption.md). Left out without a namespace, so an adapter that predates
    namespaced entries is called as before. Every path that looks a run's entries up
    (the flow, the dashboard's run page) takes it from here."""
    return {} if namespace is None else {"namespace": namespace}


class _LookAhead:
    """A cached step's look-up, sent while the step before it is being checkpointed.

    The step's input is the previous step's output, known before that output's
    checkpoint is sent, so the look-up need not wait for the checkpoint: both are in
    flight at once, one round trip of a server's instead of two one after the other
    (tests/workflows/test_flow_statements.py). Nothing is decided from it earlier than before: the
    step awaits it where it would have sent it, and its outcome (a hit, a miss, an
    error) is taken there, after the checkpoint has landed.
    """

    __slots__ = ("key", "lookup")

    def __init__(self, key: str, lookup: asyncio.Future[Any]) -> None:
        self.key = key
        self.lookup = lookup

    async def discard(self) -> None:
        """Drop a look-up whose step will not run now (the checkpoint before it failed)."""
        self.lookup.cancel()
        await asyncio.gather(self.lookup, return_exceptions=True)


def _look_ahead(
    manager: StorageManager, stack: ExecutionStack, step: Step, value: Any
) -> _LookAhead | None:
    """Start ``step``'s cache look-up for the input ``value``, if it has a cache and is
    still to run."""
    cache = _step_cache(manager)
    if cache is None or step.cache_ttl_ms is None or OUTPUT in stack.contexts.get(step.name, {}):
        return None
    try:
        key = step.cache_key_for(value)
    except Exception:
        # Not sent ahead: the key is worked out again where the step runs, and its error
        # is raised there, after the previous step's checkpoint, as without a look-ahead.
        return None
    lookup = cache.get_cached_step(key, **_cache_namespace(stack))
    return _LookAhead(key, asyncio.ensure_future(lookup))


async def _locked(
    manager: StorageManager,
    stack_id: str,
    namespace: str | None,
    action: Callable[[], Awaitable[T]],
) -> T:
    """``action`` under the run's workflow lock (its namespace is part of the key: another
    tenant's run under the same id never waits for it), where the backend has one."""
    adapter = manager.adapter
    if adapter is not None and adapter.supports(Capability.WORKFLOW_LOCK):
        return await adapter.with_workflow_lock(stack_id, action, namespace=namespace)
    return await action()


def _manager_of(manager: object) -> StorageManager:
    """The manager a flow's call runs with: ``manager``, else the default one. Anything
    else is refused where it is given: it failed later on a missing attribute (an
    ``AttributeError`` naming no argument — a black-box auditor), and ``manager or``
    would have taken a falsy one for none."""
    if manager is None:
        return default_storage_manager
    if not isinstance(manager, StorageManager):
        raise InvalidArgumentError(
            f"manager must be a siglo.StorageManager or None (the default one), got "
            f"{type(manager).__name__}"
        )
    return manager


def _check_claim_arguments(correlation_key: object, claimant_id: object, namespace: object) -> None:
    """The arguments of a delivery's (or a timer's) claim, checked before anything is
    read or claimed (a key that is not text failed as an ``AttributeError``)."""
    require_id("correlation_key", correlation_key)
    require_optional_id("claimant_id", claimant_id)
    require_optional_id("namespace", namespace)


def _require(manager: StorageManager, capability: Capability) -> StorageAdapter:
    adapter = manager.adapter
    if adapter is None or not adapter.supports(capability):
        name = "no adapter" if adapter is None else f"adapter {adapter.name!r}"
        raise CapabilityNotSupportedError(
            f"this workflow needs the {capability.value} capability, which {name} lacks"
        )
    return adapter


def flow(*steps: Step, name: str | None = None) -> Flow:
    """A flow of ``steps`` (seed 001 §9's ``flow(a, b)``); ``name`` defaults to theirs."""
    if not steps:
        raise InvalidArgumentError("a flow needs at least one step")
    for index, step in enumerate(steps):
        if not isinstance(step, Step):
            raise InvalidArgumentError(
                f"flow() takes siglo.Step objects (Step.create(name, fn)); argument {index} "
                f"is {type(step).__name__}"
            )
    if name is not None:
        require_id("name", name)  # it is the runs' workflow_id
    names = [step.name for step in steps]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"step names in a flow must be unique: {names}")
    return Flow(steps=tuple(steps), name=name or "+".join(names))


def mark_left_as_stored(exc: BaseException) -> BaseException:
    """Mark ``exc`` as raised before the run was taken up: the run is left as stored
    (unreadable, of another flow or version, waiting on another key), so ``siglo
    worker`` counts it as no work done (:func:`left_as_stored`)."""
    exc.siglo_left_as_stored = True  # type: ignore[attr-defined]
    return exc


def left_as_stored(exc: BaseException) -> bool:
    """Whether ``exc`` left its run as stored (raised before the run was taken up)."""
    return getattr(exc, "siglo_left_as_stored", False) is True
