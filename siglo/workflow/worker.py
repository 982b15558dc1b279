"""The worker: fires durable timers and recovers runs whose process died.

``siglo worker URL --flows module:attr`` runs :meth:`Worker.run`. Each pass does bounded
work — at most ``batch`` due timers and ``batch`` listed runs — so one pass never holds a
process for long, and several workers side by side share the work safely:

- a due timer is claimed atomically before it fires (``claim_wait_record`` with
  ``allow_expired``), so of several workers exactly one fires it;
- a crashed run is taken only with its workflow lock, which a live process renews while
  it runs, so a run is never executed by two processes at once, and a free lock on a
  ``running`` run means its process is gone.

:meth:`Worker.run` is a supervised loop: a storage failure (the server unreachable or
restarting, a call past its time limit, an outcome left unknown) does not end it; it
waits with exponential backoff and jitter (:class:`RetryPolicy`) and tries again, until
the storage has been failing for longer than the policy's bound, and says what it is
waiting for. A stop request (SIGTERM in ``siglo worker``) is honoured between runs: no
run starts after it, the one in progress finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from siglo import masking, telemetry
from siglo.adapter import Capability
from siglo.checkpoint import Checkpoint
from siglo.errors import (
    CapabilityNotSupportedError,
    InvalidArgumentError,
    LockNotAcquiredError,
    StorageAdapterError,
    WaitRecordClaimError,
)
from siglo.listing import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from siglo.manager import StorageManager
from siglo.records import WaitRecord
from siglo.unreadable import collecting_unreadable
from siglo.validation import capped_seconds, ms_as_seconds, require_optional_id, require_seconds
from siglo.workflow.flow import Flow, WorkflowSuspended, left_as_stored, mark_left_as_stored
from siglo.workflow.outcomes import EVENT, answer_of

__all__ = [
    "DEFAULT_INTERVAL_S",
    "WORKER_LOG",
    "RETRYABLE",
    "RetryPolicy",
    "Worker",
    "WorkerPass",
]

DEFAULT_INTERVAL_S: Final = 1.0
_LOOK_AHEAD: Final = 10

_T = TypeVar("_T")

_DUE_TIMERS: Final = (None, "\x00due timers")
"""The key under which a failed listing of the due timers is said once (no run's key)."""

_RUNNING: Final = (None, "\x00running runs")
"""The key under which a failed listing of the running runs is said once."""

RETRYABLE: Final = (StorageAdapterError, OSError)
"""The failures the worker's loop rides out: a storage call that failed or timed out
(:class:`~siglo.errors.StorageAdapterError`, its :class:`~siglo.errors.OutcomeUnknownError`
included) and, should a driver's ever escape unwrapped, a connection error or a timeout."""

WORKER_LOG: Final = "siglo.worker"
"""The logger of what a worker does (its runs' failures, what it waits for)."""

log = masking.logger(WORKER_LOG)
_RANDOM: Final = random.Random()


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often the worker's loop retries while the storage fails.

    The n-th retry in a row waits ``min(max_delay_s, initial_delay_s * 2**n)`` seconds,
    of which a random half is jitter (so workers that lost one server together do not
    return together); a pass that succeeds starts over. Once the storage has been
    failing for ``give_up_after_s`` seconds (``None``: never) the loop gives up and
    raises the last error.
    """

    initial_delay_s: float = 0.5
    max_delay_s: float = 30.0
    give_up_after_s: float | None = 300.0

    def __post_init__(self) -> None:
        for name in ("initial_delay_s", "max_delay_s"):
            value = getattr(self, name)
            if not _positive(value):
                raise InvalidArgumentError(f"{name} must be a positive number, got {value!r}")
        if self.give_up_after_s is not None and not (
            _positive(self.give_up_after_s) or self.give_up_after_s == 0
        ):
            raise InvalidArgumentError(
                f"give_up_after_s must be a number >= 0 or None, got {self.give_up_after_s!r}"
            )

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before retry number ``attempt`` (0 for the first), jitter included."""
        # Capped first: an initial delay of 10**400 s, doubled as a float, overflows.
        initial, most = capped_seconds(self.initial_delay_s), capped_seconds(self.max_delay_s)
        ceiling = min(most, initial * 2.0 ** min(attempt, 60))
        jitter: float = (rng or _RANDOM).uniform(0, ceiling / 2)
        return ceiling / 2 + jitter


def _positive(value: object) -> bool:
    # isfinite of floats only: an int is finite however large, and converting 10**400
    # to a float for it raises OverflowError.
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (not isinstance(value, float) or math.isfinite(value))
        and value > 0
    )


@dataclass
class WorkerPass:
    """What one pass did."""

    timers_fired: int = 0
    """Due timers fired: their runs resumed (a timer whose run was left as stored — not
    readable here, changed without a migration — is not counted, nor one whose run
    failed again as it did before, nor one whose run already held its event: that run
    was recovered)."""
    runs_recovered: int = 0
    """Crashed runs taken up: continued, or failed by their step (a run left as stored,
    or whose recovery failed again as it did before, is not counted), and the runs of due
    waits that already held their event (resumed with it, no timeout fired)."""
    failures: list[str] = field(default_factory=list)
    """One line per run that raised, or that was left as stored (its checkpoint could
    not be read, its flow changed without a migration): each logged, and said once
    while the run fails the same way."""
    stopped: bool = False
    """The pass ended early because a stop was requested (the run in progress finished)."""

    @property
    def busy(self) -> bool:
        """Whether the pass found work (the next pass should not wait)."""
        return bool(self.timers_fired or self.runs_recovered)


class Worker:
    """Fires due timers and recovers crashed runs of ``flows`` through ``manager``.

    Runs are matched to flows by the checkpoint's ``workflow_id`` (the flow's ``name``);
    others are left alone. Several versions of one flow may be given (a deploy in
    progress): a run goes to the one of its version, else to one with a migration from
    it, else to the last given. ``batch`` bounds each pass's work.
    """

    def __init__(
        self,
        manager: StorageManager,
        flows: Iterable[Flow],
        *,
        batch: int = DEFAULT_PAGE_SIZE,
        worker_id: str | None = None,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        # Every argument is checked here, where it is given: a wrong one taken as it was
        # failed later at every pass, far from its cause — a batch over the listing's
        # maximum failed each listing of running runs (no crash was ever recovered), a
        # worker_id that is not text each timer's claim, a manager that is not one an
        # AttributeError (a black-box auditor).
        if not isinstance(manager, StorageManager):
            raise InvalidArgumentError(
                f"manager must be a siglo.StorageManager (the async one: a worker runs on an "
                f"event loop), got {_type_name(manager)}"
            )
        if isinstance(flows, Flow) or not isinstance(flows, Iterable):
            raise InvalidArgumentError(
                f"flows must be a list of siglo.workflow.Flow (one flow: [flow]), got "
                f"{type(flows).__name__}"
            )
        if type(batch) is not int or not 1 <= batch <= MAX_PAGE_SIZE:
            # The bound of a listing (the running runs are listed `batch` at a time), as
            # `siglo worker --batch` says.
            raise InvalidArgumentError(
                f"batch must be an integer from 1 to {MAX_PAGE_SIZE}, got {batch!r}"
            )
        # The worker claims due timers under this id: checked as a claimant id is (the
        # value quoted when it is not text at all: the id check names only its type).
        if worker_id is not None and not isinstance(worker_id, str):
            raise InvalidArgumentError(
                f"worker_id must be text (the id the worker claims timers under) or None, "
                f"got {worker_id!r}"
            )
        require_optional_id("worker_id", worker_id)
        if notify is not None and not callable(notify):
            raise InvalidArgumentError(
                f"notify must be a callable taking a line of text, or None, got {notify!r}"
            )
        self.manager = manager
        # What the worker is waiting for goes to its log, and to ``notify`` (siglo worker
        # prints it) so an operator sees why nothing happens.
        self._notify = notify
        self.flows: dict[str, Flow] = {}
        """The flow of each name given last: the one a new run of the name would use."""
        self._versions: dict[str, dict[str, Flow]] = {}
        """Every flow given, by name, then version (the last given of each)."""
        for f in flows:
            if not isinstance(f, Flow):
                raise InvalidArgumentError(f"flows must be siglo.workflow.Flow, got {f!r}")
            self.flows[f.name] = f
            versions = self._versions.setdefault(f.name, {})
            versions.pop(f.version, None)
            versions[f.version] = f
        if not self.flows:
            raise InvalidArgumentError("a worker needs at least one flow")
        self.batch = batch
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self._cursor: str | None = None
        # Runs found `running` with their lock held: when first seen (monotonic s), and
        # whether the lease has since outlived a crashed holder's (the holder is alive).
        self._held: dict[tuple[str | None, str], tuple[float, bool]] = {}
        self._seen_this_walk: set[tuple[str | None, str]] = set()
        self._failing: dict[tuple[str | None, str], str] = {}
        """The runs whose recovery failed, with the kind of failure: said once."""
        self._failing_timers: dict[tuple[str | None, str], str] = {}
        """The runs whose due timer failed, with the kind of failure: said once."""
        self._left_out_timers: set[tuple[str | None, str]] = set()
        """The runs whose due wait record the last listing left out (unreadable)."""
        adapter = manager.adapter
        if adapter is None:
            raise InvalidArgumentError("the worker's storage manager has no storage adapter")
        self.adapter = adapter
        lacking = self.missing()
        if len(lacking) == 2:
            # A worker that can do neither would look healthy and do nothing, forever:
            # refused here, so `siglo worker` and a worker built in Python agree.
            raise CapabilityNotSupportedError(
                f"backend {adapter.name!r} cannot {' nor '.join(lacking)}: a worker has "
                "nothing to do on it"
            )

    def missing(self) -> list[str]:
        """What this backend keeps the worker from doing, each with the capabilities it
        lacks (empty: it fires timers and recovers crashed runs)."""
        supports = self.adapter.supports
        lacking = []
        if not supports(Capability.DUE_WAITS):
            lacking.append("fire due timers (capability due_waits)")
        if not (supports(Capability.LISTING) and supports(Capability.WORKFLOW_LOCK)):
            lacking.append("recover crashed runs (capabilities listing and workflow_lock)")
        return lacking

    async def run_once(self, *, stop: asyncio.Event | None = None) -> WorkerPass:
        """One bounded pass: fire due timers, then recover crashed runs.

        With ``stop`` set (before or during the pass), no further timer fires and no
        further run is taken up; the run in progress finishes first. A storage failure
        is raised (:data:`RETRYABLE`); :meth:`run` retries it.
        """
        _check_stop(stop)
        done = WorkerPass()
        if self.adapter.supports(Capability.DUE_WAITS):
            await self._fire_timers(done, stop)
        if (
            not done.stopped
            and self.adapter.supports(Capability.LISTING)
            and self.adapter.supports(Capability.WORKFLOW_LOCK)
        ):
            await self._recover(done, stop)
        return done

    async def run(
        self,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        stop: asyncio.Event | None = None,
        retry: RetryPolicy | None = None,
        on_pass: Callable[[WorkerPass], None] | None = None,
    ) -> None:
        """Pass after pass until ``stop`` is set; waits ``interval_s`` after an idle pass.

        Setting ``stop`` ends the loop after the run in progress: a run is never cut off
        in the middle by a graceful stop (SIGTERM in ``siglo worker``), and none starts
        after it. A storage failure (:data:`RETRYABLE`) is retried with backoff as
        ``retry`` says (default :class:`RetryPolicy`); past its bound the last error is
        raised. ``on_pass`` is called with each pass's :class:`WorkerPass`.
        """
        # Checked before the first pass: a wrong one would fail only after it (interval_s
        # at the first idle wait, on_pass once a pass is done, retry at the first outage).
        require_seconds("interval_s", interval_s)
        _check_stop(stop)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgumentError(
                f"retry must be a siglo.workflow.RetryPolicy or None, got {type(retry).__name__}"
            )
        if on_pass is not None and not callable(on_pass):
            raise InvalidArgumentError(
                f"on_pass must be a callable taking a WorkerPass, or None, got {on_pass!r}"
            )
        stop = stop or asyncio.Event()
        retry = retry or RetryPolicy()
        failing_since: float | None = None
        attempt = 0
        while not stop.is_set():
            try:
                done = await self.run_once(stop=stop)
            except RETRYABLE as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                failing_for = now - failing_since
                delay = retry.delay_s(attempt)
                attempt += 1
                reason = f"{type(exc).__name__}: {exc}"
                if (
                    retry.give_up_after_s is not None
                    and failing_for + delay > retry.give_up_after_s
                ):
                    self._say(
                        f"storage unreachable ({reason}); giving up: it has failed for "
                        f"{failing_for:.1f} s and a retry in {delay:.1f} s would pass the "
                        f"bound of {retry.give_up_after_s:g} s",
                        logging.ERROR,
                    )
                    raise
                self._say(
                    f"storage unreachable ({reason}); retrying in {delay:.1f} s "
                    f"(failing for {failing_for:.1f} s)",
                    logging.WARNING,
                )
                await _wait(stop, delay)
                continue
            if failing_since is not None:
                self._say(f"storage reachable again after {time.monotonic() - failing_since:.1f} s")
                failing_since, attempt = None, 0
            if on_pass is not None:
                on_pass(done)
            if done.busy:
                continue
            await _wait(stop, interval_s)

    def _say(self, line: str, level: int = logging.INFO) -> None:
        # One place each line goes: the caller's ``notify`` (siglo worker prints it), or
        # else the log (where logging's last-resort handler would print it a second time).
        if self._notify is not None:
            log.debug(line)
            self._notify(line)
        else:
            log.log(level, line)

    async def _fire_timers(self, done: WorkerPass, stop: asyncio.Event | None) -> None:
        # Due waits of flows this worker does not run (another worker's, or waits used
        # without a flow) are skipped; reading several batches' worth keeps them from
        # filling every pass. (More than that many foreign due waits still would: run a
        # worker for every flow of a store.)
        due = await self._listed(
            done,
            self.adapter.list_due_waits(limit=min(self.batch * _LOOK_AHEAD, MAX_PAGE_SIZE)),
            _DUE_TIMERS,
            self._failing_timers,
            "due timers not listed",
            "due timer left out",
        )
        if due is None:
            return
        telemetry.note_due_waits(due, self.manager.clock.now_ms())
        fired = 0
        for record in due:
            if fired == self.batch:
                return
            if stop is not None and stop.is_set():
                done.stopped = True
                return
            timer_key = (record.namespace, record.stack_id)
            try:
                checkpoint = await self.manager.load_checkpoint(
                    record.stack_id, namespace=record.namespace
                )
            except StorageAdapterError:
                raise  # the storage failed, not the run: the loop backs off and retries
            except Exception as exc:
                # Its checkpoint cannot be read (not a checkpoint, of a newer schema, its
                # key erased): that run's failure, named once; the other timers still fire.
                self._failed(done, timer_key, exc, self._failing_timers)
                continue
            flow = None if checkpoint is None else self._flow_for(checkpoint)
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
            except StorageAdapterError:
                # The storage failed, not the run: the loop backs off and retries. The
                # claim's lease lapses and the timer fires again then. (An OSError here
                # is the step's own, a failure of the run: siglo wraps a driver's.)
                raise
            except Exception as exc:
                new = self._failed(done, timer_key, exc, self._failing_timers)
                if not new or left_as_stored(exc):
                    # Left as stored (its flow changed without a migration: the wait
                    # stays due), or failed again as before: no work done, or the next
                    # pass would start at once.
                    continue
            else:
                self._failing_timers.pop(timer_key, None)
            fired += 1
            if _answered(checkpoint, record):
                # Its run already held its event (the delivering process stopped before
                # completing the wait): fire_timeout resumed it with that event, as a
                # recovery; no timeout fired.
                done.runs_recovered += 1
            else:
                done.timers_fired += 1

    async def _recover(self, done: WorkerPass, stop: asyncio.Event | None) -> None:
        page = await self._listed(
            done,
            self.adapter.list_checkpoints(status="running", limit=self.batch, cursor=self._cursor),
            _RUNNING,
            self._failing,
            "running runs not listed",
            "running run left out",
        )
        if page is None:
            return
        # The next pass goes on from here; a finished walk starts over.
        self._cursor = page.next_cursor
        for summary in page.items:
            versions = self._versions.get(summary.workflow_id or "")
            if not versions:
                continue
            if stop is not None and stop.is_set():
                done.stopped = True
                return
            key = (summary.namespace, summary.stack_id)
            self._seen_this_walk.add(key)
            try:
                flow = await self._recovering(summary.stack_id, summary.namespace, versions)
                recovered = await flow.recover(
                    summary.stack_id, manager=self.manager, namespace=summary.namespace
                )
            except LockNotAcquiredError:
                self._lock_held(key, summary.workflow_id or "")
                continue  # alive in some process, or its lease has not lapsed yet
            except StorageAdapterError:
                raise  # the storage failed, not the run: the loop backs off and retries
            except Exception as exc:
                self._held.pop(key, None)
                # A run left as stored (unreadable, its flow changed without a
                # migration), or failing as before, is no work done: counted as such,
                # the pass would be busy and the next one start at once, again and again.
                if self._failed(done, key, exc, self._failing) and not left_as_stored(exc):
                    done.runs_recovered += 1
                continue
            self._failing.pop(key, None)
            if recovered:
                if key in self._held:
                    self._say(f"run {_name(key)} recovered: its lease had lapsed")
                self._held.pop(key, None)
                done.runs_recovered += 1
                telemetry.note_recovery(summary.workflow_id)
        if page.next_cursor is None:
            # A full walk: forget runs no longer `running` (finished in their process).
            for gone in set(self._held) - self._seen_this_walk:
                del self._held[gone]
            for gone in set(self._failing) - self._seen_this_walk:
                del self._failing[gone]
            self._seen_this_walk.clear()

    def _flow_for(self, checkpoint: Checkpoint) -> Flow | None:
        """The flow given for ``checkpoint``'s run (:meth:`_pick`), or ``None``."""
        versions = self._versions.get(checkpoint.workflow_id or "")
        return None if not versions else _pick(versions, checkpoint)

    async def _recovering(
        self, stack_id: str, namespace: str | None, versions: dict[str, Flow]
    ) -> Flow:
        """The flow to recover a listed run with: with several versions of its flow
        given, its checkpoint says which (one read more)."""
        if len(versions) == 1:
            return next(iter(versions.values()))
        try:
            checkpoint = await self.manager.load_checkpoint(stack_id, namespace=namespace)
        except StorageAdapterError:
            raise
        except Exception as exc:
            mark_left_as_stored(exc)  # it cannot be read here: no work done
            raise
        if checkpoint is None:
            return next(reversed(versions.values()))  # gone since: recover finds nothing
        return _pick(versions, checkpoint)

    async def _listed(
        self,
        done: WorkerPass,
        listing: Awaitable[_T],
        key: tuple[None, str],
        said: dict[tuple[str | None, str], str],
        what: str,
        left_out: str,
    ) -> _T | None:
        """What ``listing`` (the due timers, or a page of the running runs) found.

        A record in it that cannot be read (written past siglo, sealed under a key this
        process lacks) is left out by the listing (:mod:`siglo.unreadable`), and said
        here once as that run's failure (``left_out``, its error naming the record):
        the other runs' timers fire and their recoveries go on. Any other failure of
        the listing but a storage one skips that part of the pass, said once (``what``);
        a storage failure is raised: the loop backs off and retries."""
        try:
            with collecting_unreadable() as unreadable:
                found = await listing
        except StorageAdapterError:
            raise
        except Exception as exc:
            self._failed(done, key, exc, said, what)
            return None
        said.pop(key, None)
        met: set[tuple[str | None, str]] = set()
        for error in unreadable:
            record = _record_key(error)
            met.add(record)
            if said is self._failing:
                self._seen_this_walk.add(record)  # forgotten once a walk no longer meets it
            self._failed(done, record, error, said, left_out)
        if said is self._failing_timers:
            # The due timers are listed whole at every pass, so a record left out before
            # and not met now is gone (removed, or readable again): forgotten, and said
            # again should it come back.
            for gone in self._left_out_timers - met:
                said.pop(gone, None)
            self._left_out_timers = met
        return found

    def _lock_held(self, key: tuple[str | None, str], flow_name: str) -> None:
        """Say once what the worker waits for on a `running` run whose lock is held."""
        now = time.monotonic()
        lease_s = ms_as_seconds(self.adapter.workflow_lock_ttl_ms)
        first, alive = self._held.get(key, (now, False))
        if key not in self._held:
            # Its holder renewed the lease before now if at all, so a crashed holder's
            # lease lapses within one lease of now (with this worker's lease setting).
            self._say(
                f"run {_name(key)} ({flow_name}) is running with its workflow lock held: "
                f"alive in another process, or crashed; if crashed, its lease lapses in "
                f"{lease_s:.0f} s at most and this worker recovers it then"
            )
        elif not alive and now - first > lease_s + 1:
            alive = True
            self._say(
                f"run {_name(key)} ({flow_name}) is alive in another process (its lease "
                f"was renewed past {lease_s:.0f} s); not recovering it"
            )
        self._held[key] = (first, alive)

    @staticmethod
    def _failed(
        done: WorkerPass,
        key: tuple[str | None, str],
        exc: BaseException,
        said: dict[tuple[str | None, str], str],
        what: str | None = None,
    ) -> bool:
        """Log and list a run's failure, unless ``said`` holds its kind as the one this
        run failed with last (a run left as stored fails the same way at every pass; by
        its kind, not its message, which may differ each time). ``True`` if new."""
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        if said.get(key) == kind:
            return False
        said[key] = kind
        line = f"{what or f'run {key[1]!r} failed'}: {type(exc).__name__}: {exc}"
        log.warning(line, exc_info=exc)
        done.failures.append(line)
        return True


def _record_key(exc: Exception) -> tuple[str | None, str]:
    """The run an unreadable record's error names (``siglo.errors.naming_stack`` or
    ``naming_wait``): its namespace and stack id, else the wait's correlation key."""
    stack_id = getattr(exc, "stack_id", None) or getattr(exc, "correlation_key", None)
    return getattr(exc, "namespace", None), str(stack_id or exc)


def _name(key: tuple[str | None, str]) -> str:
    namespace, stack_id = key
    return repr(stack_id) if namespace is None else f"{stack_id!r} (namespace {namespace!r})"


def _type_name(value: object) -> str:
    """``value``'s type as an error names it: with its module unless a builtin, so that
    ``siglo.sync.StorageManager`` is not taken for the ``siglo.StorageManager`` asked for."""
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _check_stop(stop: object) -> None:
    """``stop`` of :meth:`Worker.run` and :meth:`Worker.run_once`: an event, or none."""
    if stop is not None and not isinstance(stop, asyncio.Event):
        raise InvalidArgumentError(f"stop must be an asyncio.Event or None, got {stop!r}")


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    """Up to ``seconds``, or until ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), capped_seconds(seconds))


def _pick(versions: dict[str, Flow], checkpoint: Checkpoint) -> Flow:
    """Of the versions of a flow (by version, in the order given), the one for
    ``checkpoint``'s run: its own version, else the last with a migration from it, else
    the last given (which refuses it, naming the versions)."""
    stored = str((checkpoint.metadata or {}).get("flowVersion"))
    found = versions.get(stored)
    if found is not None:
        return found
    given = list(versions.values())
    for flow in reversed(given):
        if stored in flow.migrations:
            return flow
    return given[-1]


def _answered(checkpoint: Checkpoint | None, record: WaitRecord) -> bool:
    """Whether the run of a due wait already held an event for it when the worker read
    it: its timer resumes it without timing it out."""
    if checkpoint is None or record.step_id is None:
        return False
    return answer_of(checkpoint.contexts.get(record.step_id, {})) == EVENT
