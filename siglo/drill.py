"""``siglo drill``: an accounting workload run through a failover of your own topology.

Start it, fail the primary over by whatever means you have, stop it: every
acknowledged operation is accounted for. Workers go round the five primitives, each
call bounded by the store's own timeouts and all of them together by ``rate``:

save
    each worker saves its own checkpoint with revisions 1, 2, 3 …, each a
    compare-and-set on the one before. A conflict makes it read the stored revision:
    below the acknowledged one, acknowledged saves were **lost**; above it, a failed
    save had been applied after all (*ambiguous*, the expected outcome of a failure).
lock
    two workers contend on each lock key, hold a lock they win for ``hold_s`` while they
    go on with other work, then release it. A lock granted while another worker holds
    an acknowledged lease of the same key (acquired before this call began, its lease
    not run out and its release not started when this call ended) is a **double lock
    holder**; a fencing token not above every token acknowledged for the key before the
    call began is a **fence regression**.
wait claim, idempotency claim, nonce
    a worker creates a wait record and claims it, claims an idempotency key, claims a
    nonce, and claims each a second time at once: a second win is a **double claim**
    (a **nonce replay** for a nonce).

When it stops it sweeps what was acknowledged, once the store answers again: every
acknowledged save must be stored, every acknowledged claim must refuse one more
claimant, every lock still held must refuse another holder, and each lock key's next
fencing token must be above all acknowledged ones. Those checks are writes themselves,
and one whose outcome is unknown (its write may have landed) is never retried as if
nothing had happened: a retry refused by the check's own write would pass a lost
acknowledgement as honoured. So each check carries an identity of its own where the
primitive takes one (a wait claim is claimed by the sweep's claimant, which may claim
again; an idempotency key is renewed with the owner token of the acknowledged claim,
which creates nothing; a lock is taken with a token of the sweep's, told apart by
:meth:`~siglo.coordination.LockBase.inspect`), and a nonce, which has neither an
identity nor a read, is counted as not re-checked when its check's outcome stays
unknown. Then it removes what it wrote
(checkpoints with their wait records, locks, idempotency claims; nonces have no delete
and expire after the drill's window). Everything it writes is under its own id
(``siglo-drill-<hex>``: the namespace of its checkpoints and wait records, the prefix
of its keys), so it never touches an application's data.

The verdict compares the violations with what docs/deploying.md promises for the
setting (:data:`GUARANTEES`), or with the expectation its caller gave instead (``siglo
drill --expect``, for a managed service that replicates where the server cannot see
it): where an acknowledgement is expected to survive, any violation fails the drill.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, TypeVar, cast

from siglo.backend import Backend
from siglo.checkpoint import Checkpoint
from siglo.connect import command_timeout_ms
from siglo.coordination import LockState, holder_label
from siglo.errors import (
    CapabilityNotSupportedError,
    CheckpointConflictError,
    InvalidArgumentError,
    OutcomeUnknownError,
    SigloError,
    StorageAdapterError,
)
from siglo.records import WaitRecord
from siglo.validation import ms_as_seconds

__all__ = [
    "GUARANTEES",
    "KINDS",
    "Drill",
    "DrillReport",
    "Expectation",
    "Violation",
    "detect_setting",
]

T = TypeVar("T")
_S = TypeVar("_S")

Kind = Literal["save", "lock", "wait", "idempotency", "nonce"]
KINDS: Final[tuple[Kind, ...]] = ("save", "lock", "wait", "idempotency", "nonce")
"""The primitives the workload goes round, in order."""

Expectation = Literal["nothing-lost", "may-lose"]

GUARANTEES: Final[dict[str, Expectation]] = {
    "single server": "nothing-lost",
    "synchronous standby": "nothing-lost",
    "wait_replicas": "nothing-lost",
    "cluster with WAIT": "nothing-lost",
    "asynchronous replica": "may-lose",
    "no WAIT": "may-lose",
    "cluster without WAIT": "may-lose",
}
"""What docs/deploying.md ("What an acknowledgement survives") promises per setting, for
every primitive alike: ``nothing-lost``, or ``may-lose`` (saves lost, locks and claims
granted twice, fencing tokens going back)."""

VIOLATIONS: Final = (
    "lost save",
    "double lock holder",
    "fence regression",
    "double wait claim",
    "double idempotency claim",
    "nonce replay",
)
"""The kinds of :class:`Violation`, as reported."""

_CLOCK_MARGIN_S: Final = 0.05
"""Slack on the client's own clock before two leases count as overlapping."""
_KEPT_VIOLATIONS: Final = 200
"""Violations listed one by one in a report (all are counted)."""
_SWEEP_LEASE_MS: Final = 60_000
"""The lease of a lock the check after the run takes (and releases at once): long enough
that a grant whose outcome was unknown still holds the key when the check looks who
does, however long the store takes to answer that."""


@dataclass(frozen=True)
class Violation:
    """One acknowledgement the store did not honour, traced to its operation."""

    kind: str
    """One of :data:`VIOLATIONS`."""
    key: str
    """The stack id or key concerned."""
    detail: str
    """What was acknowledged when, and what the store did instead."""
    at_s: float
    """When it was found, in seconds since the drill began."""


@dataclass
class DrillReport:
    """What a drill measured (``--json`` prints it as a document)."""

    drill_id: str
    setting: str
    """The replication setting detected (:func:`detect_setting`), a column of the table."""
    expectation: Expectation
    """What the verdict compares with: the table's promise for ``setting``, or what the
    caller gave instead (:attr:`expectation_source`)."""
    expectation_source: str = "the table"
    """Where :attr:`expectation` comes from: ``the table`` (docs/deploying.md, for
    ``setting``), ``--expect`` (the command's option), or whoever else gave it."""
    duration_s: float = 0.0
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    outcome_unknown: int = 0
    """Failed calls that were :class:`~siglo.errors.OutcomeUnknownError`."""
    acknowledged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    ambiguous_saves: int = 0
    """Failed saves found applied afterwards (a retry conflicted with them)."""
    first_failure_s: float | None = None
    """When the first call failed (its error reached the drill), in seconds since the
    drill began."""
    first_failure_began_s: float | None = None
    """When the operation that failed first began: up to ``command_timeout_ms`` (times
    the calls it makes) before :attr:`first_failure_s`, and possibly before the fault."""
    recovered_s: float | None = None
    """From the start of the first failed operation (:attr:`first_failure_began_s`) to
    the end of the first successful call begun after the last failure (``None`` when
    nothing failed, or nothing succeeded after the last failure)."""
    longest_failed_call_s: float = 0.0
    """The longest failed storage call: from the start of the call that failed (an
    operation of the drill makes up to three) to its failure — what ``command_timeout_ms``
    and the pool's and connection's timeouts bound."""
    outage_s: float = 0.0
    """The longest stretch in which no call succeeded (failed calls, and calls held up
    waiting for a server, alike): what a failover cost the workload."""
    lost_saves: int = 0
    double_lock_holders: int = 0
    fence_regressions: int = 0
    double_wait_claims: int = 0
    double_idempotency_claims: int = 0
    nonce_replays: int = 0
    violations: list[Violation] = field(default_factory=list)
    sample_failures: list[str] = field(default_factory=list)
    unexpected_errors: int = 0
    """Calls that raised something other than a
    :class:`~siglo.errors.StorageAdapterError`: a store failing is expected in a drill,
    anything else is a defect to report. Each also counts as a failed call, and its
    worker goes on."""
    sample_unexpected_errors: list[str] = field(default_factory=list)
    """The first five of them, each with its exception's type."""
    rechecked: bool = True
    """Whether every acknowledgement was checked against the store after the run; not
    when the store still failed then (a replica still missing under ``wait_replicas``,
    a master not back), nor when a check's own write had an unknown outcome that could
    not be told apart (:attr:`unchecked`): the losses counted are then only those seen
    during the run and by the checks that were made."""
    recheck_failure: str | None = None
    """Why not every acknowledgement was re-checked (``rechecked`` false)."""
    unchecked: int = 0
    """Acknowledgements whose check after the run could not be decided: the check's own
    write had an unknown outcome, and a retry refused could have been refused by it (a
    nonce, which has neither an identity of its claimant nor a read)."""
    sample_unchecked: list[str] = field(default_factory=list)
    """The first five of them (the primitive and the key)."""
    cleaned_up: bool = False

    @property
    def failed_calls(self) -> int:
        return sum(self.failures.values())

    @property
    def table_promise(self) -> Expectation | None:
        """What the table of docs/deploying.md promises for :attr:`setting` (``None``:
        a setting it has no column for), whatever the verdict compares with."""
        return GUARANTEES.get(self.setting)

    def expectation_said(self) -> str:
        """What the verdict compares with and where that comes from, the table's promise
        beside it when the caller's expectation was applied instead."""
        if self.expectation_source == "the table":
            return f"{self.expectation} (the table's promise for {self.setting})"
        promise = self.table_promise
        table = (
            f"the table promises {promise} for {self.setting}"
            if promise is not None
            else f"the table has no column for {self.setting}"
        )
        return f"{self.expectation}, from {self.expectation_source} ({table})"

    @property
    def verdict_reason(self) -> str:
        """Why the verdict is what it is, naming the expectation applied and its source
        (the command's ``verdict: FAIL`` line, and ``--json``'s ``verdict_reason``)."""
        lost = f"{self.total_violations} acknowledgement(s) not honoured"
        expected = self.expectation_said()
        if self.verdict == "fail":
            return f"{lost} where none may be lost: expected {expected}"
        if self.verdict == "losses allowed":
            return f"{lost}, as may happen: expected {expected}"
        if self.verdict == "pass":
            return f"every acknowledgement honoured: expected {expected}"
        if not self.rechecked:
            return f"nothing seen lost, but not everything re-checked: {self.recheck_failure}"
        return (
            f"nothing seen lost, but {self.unexpected_errors} call(s) raised an error that "
            "is not a store failing: their operations are not accounted for"
        )

    @property
    def total_violations(self) -> int:
        return (
            self.lost_saves
            + self.double_lock_holders
            + self.fence_regressions
            + self.double_wait_claims
            + self.double_idempotency_claims
            + self.nonce_replays
        )

    @property
    def verdict(self) -> Literal["pass", "fail", "losses allowed", "incomplete"]:
        """``pass``: nothing acknowledged was lost; ``fail``: something was, where the
        setting promises nothing is; ``losses allowed``: something was, as the setting
        allows; ``incomplete``: nothing was seen lost, but not everything could be
        accounted for — the store still failed when the drill checked every
        acknowledgement after the run, or calls raised unexpected errors (not a store
        failing), whose operations the drill could not account for."""
        if self.total_violations == 0:
            return "pass" if self.rechecked and not self.unexpected_errors else "incomplete"
        return "fail" if self.expectation == "nothing-lost" else "losses allowed"

    def as_json(self) -> dict[str, Any]:
        """The report as JSON data."""
        document = asdict(self)
        document.update(
            table_promise=self.table_promise,
            failed_calls=self.failed_calls,
            total_violations=self.total_violations,
            verdict=self.verdict,
            verdict_reason=self.verdict_reason,
        )
        return document

    def summary(self) -> list[tuple[str, str]]:
        """The report as (label, value) lines, for a terminal."""

        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f} s"

        calls = ", ".join(f"{k} {self.calls[k]}" for k in KINDS)
        failed = ", ".join(f"{k} {self.failures[k]}" for k in KINDS if self.failures[k])
        # The table's promise, and apart from it what the verdict applies when the
        # caller said otherwise (--expect): one was printed as the other.
        setting = f"{self.setting} (the table promises: {self.table_promise or 'no column'})"
        if self.expectation_source != "the table":
            setting += f"; the verdict applies {self.expectation}, from {self.expectation_source}"
        first_failure = seconds(self.first_failure_s)
        if self.first_failure_began_s is not None:
            first_failure += f" (its operation began at {self.first_failure_began_s:.2f} s)"
        return [
            ("drill", self.drill_id),
            ("setting", setting),
            ("ran", seconds(self.duration_s)),
            ("calls", f"{sum(self.calls.values())} ({calls})"),
            (
                "failed calls",
                f"{self.failed_calls}"
                + (f" ({failed})" if failed else "")
                + f", {self.outcome_unknown} with an unknown outcome",
            ),
            ("unexpected errors", str(self.unexpected_errors)),
            ("first failure", first_failure),
            ("time to recover", seconds(self.recovered_s)),
            ("longest stretch without a success", seconds(self.outage_s)),
            ("longest failed call", seconds(self.longest_failed_call_s)),
            ("acknowledged", ", ".join(f"{k} {self.acknowledged[k]}" for k in KINDS)),
            ("ambiguous saves", str(self.ambiguous_saves)),
            ("acknowledged saves lost", str(self.lost_saves)),
            ("double lock holders", str(self.double_lock_holders)),
            ("fence regressions", str(self.fence_regressions)),
            ("double wait claims", str(self.double_wait_claims)),
            ("double idempotency claims", str(self.double_idempotency_claims)),
            ("nonce replays", str(self.nonce_replays)),
            (
                "re-checked after the run",
                "yes" if self.rechecked else f"no: {self.recheck_failure}",
            ),
            ("cleaned up", "yes" if self.cleaned_up else "no"),
            ("verdict", self.verdict),
        ]

    def line(self, name: str) -> str:
        """One ``FAILOVER …`` line (the topology tests print it under ``-s``)."""
        return (
            f"FAILOVER {name}: no call succeeded for {self.outage_s:.2f} s, recovered "
            f"{self.recovered_s or 0.0:.2f} s after the first failure, "
            f"{self.failed_calls} calls failed ({self.outcome_unknown} unknown, longest "
            f"{self.longest_failed_call_s:.2f} s), {sum(self.acknowledged.values())} "
            f"acknowledged ({self.acknowledged['save']} saves), {self.ambiguous_saves} "
            f"ambiguous, {self.lost_saves} saves lost, {self.double_lock_holders} double "
            f"lock holders, {self.fence_regressions} fence regressions, "
            f"{self.double_wait_claims + self.double_idempotency_claims} double claims, "
            f"{self.nonce_replays} nonce replays"
        )


@dataclass
class _Hold:
    """One acknowledged lease of a lock key."""

    worker: int
    token: str
    fencing: int | None
    began: float
    acked: float
    lease_end: float
    release_at: float
    """When its holder plans to release it."""
    released: float | None = None
    """When its release call began (the lease may end there, whatever the call said)."""

    def end(self) -> float:
        return self.lease_end if self.released is None else min(self.lease_end, self.released)


@dataclass
class _Stack:
    """One worker's checkpoint: the revision it builds on and the last acknowledged."""

    stack_id: str
    revision: int = 0
    acked: int = 0
    acked_at: float = 0.0


_CALL_BEGAN: ContextVar[float] = ContextVar("siglo_drill_call_began", default=0.0)
"""When this task's latest storage call began (drill time, seconds)."""


class _Timed:
    """A store of the backend whose calls note when they began (:data:`_CALL_BEGAN`, in
    the calling task): the drill's longest failed call is then one storage call, not an
    operation of several."""

    def __init__(self, inner: object, now: Callable[[], float]) -> None:
        self._inner = inner
        self._now = now

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        now = self._now

        def timed(*args: Any, **kwargs: Any) -> Any:
            _CALL_BEGAN.set(now())  # as the call is made: its coroutine is awaited next
            return attr(*args, **kwargs)

        return timed


class _TimedStores:
    """The stores the drill's operations call, each :class:`_Timed`."""

    def __init__(self, backend: Backend, now: Callable[[], float]) -> None:
        def timed(store: _S) -> _S:
            return store if store is None else cast(_S, _Timed(store, now))

        self.adapter = timed(backend.adapter)
        self.lock = timed(backend.lock)
        self.idempotency = timed(backend.idempotency)
        self.nonces = timed(backend.nonces)


class Drill:
    """The workload; :meth:`run` it until ``stop`` is set, then read :attr:`report`.

    ``rate`` bounds the calls per second of all workers together (the sweep and the
    cleanup come on top); ``lock_ttl_ms`` is the lease of each lock it takes, held for
    ``hold_s``; ``window_s`` is how long claims and nonces must be remembered (the
    drill's planned length plus the sweep); ``settle_s`` is how long each call of the
    check after the run is tried again while the store settles (a Sentinel naming no
    master for a moment) before the check is given up as incomplete. ``expectation``
    replaces the table's promise for ``setting`` in the verdict, said to come from
    ``expectation_source`` (``siglo drill`` passes ``--expect``).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        rate: float = 100.0,
        workers: int = 8,
        setting: str = "single server",
        expectation: Expectation | None = None,
        expectation_source: str = "the caller",
        hold_s: float = 1.0,
        lock_ttl_ms: int = 10_000,
        window_s: float = 3600.0,
        drill_id: str | None = None,
        settle_s: float = 30.0,
    ) -> None:
        if not rate > 0 or workers < 2:
            raise InvalidArgumentError(
                f"a drill needs a positive rate and at least 2 workers, got rate={rate!r}, "
                f"workers={workers!r}"
            )
        self.backend = backend
        self._stores = _TimedStores(backend, self._now)
        self.rate = rate
        self.workers = workers
        self.hold_s = hold_s
        self.lock_ttl_ms = lock_ttl_ms
        self.window_s = window_s
        self.settle_s = settle_s
        self.id = drill_id or f"siglo-drill-{secrets.token_hex(4)}"
        if expectation is not None:
            source = expectation_source
        elif setting in GUARANTEES:
            expectation, source = GUARANTEES[setting], "the table"
        else:
            # A setting the table has no column for: the strict reading.
            expectation, source = "nothing-lost", "the default"
        self.report = DrillReport(
            drill_id=self.id,
            setting=setting,
            expectation=expectation,
            expectation_source=source,
        )
        self._t0 = time.monotonic()
        self._next_due = 0.0
        self._last_success = 0.0
        self._stacks = [_Stack(f"{self.id}-s{i}") for i in range(workers)]
        self._lock_keys = [f"{self.id}:lock:{i}" for i in range(max(1, workers // 2))]
        self._holds: dict[str, list[_Hold]] = {k: [] for k in self._lock_keys}
        self._fences: dict[str, list[tuple[float, int]]] = {k: [] for k in self._lock_keys}
        self._claims: list[tuple[str, float]] = []  # wait records acknowledged claimed
        self._idempotency: list[tuple[str, str, float]] = []  # key, owner token, when
        self._nonces: list[tuple[str, float]] = []
        self._counter = itertools.count()
        self._failures: list[tuple[float, float]] = []  # (began, ended) of failed calls
        self._last_failure_end = -1.0
        self._first_success_after_last_failure: float | None = None
        self._worker_failure: dict[int, float] = {}
        self._worker_error: dict[int, str] = {}
        self._worker_success: dict[int, float] = {}
        self._sweep_grants: list[tuple[str, str]] = []  # lock key, token: for the cleanup

    # -- time -----------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def recovered(self, since: float | None = None) -> bool:
        """Whether every worker has succeeded since its last failure (and, with
        ``since``, since that moment, in seconds since the drill began)."""
        return not self.stragglers(since)

    def stragglers(self, since: float | None = None) -> dict[int, str]:
        """The workers :meth:`recovered` waits for, each with its last failure (or
        ``"no call has ended yet"``)."""
        late = {}
        for worker in range(self.workers):
            success = self._worker_success.get(worker)
            failure = self._worker_failure.get(worker, -1.0)
            if success is None or success < failure or (since is not None and success < since):
                late[worker] = self._worker_error.get(worker, "no call has ended yet")
        return late

    @property
    def last_failure_s(self) -> float:
        """When the latest failed call ended, in seconds since the drill began (``-1.0``:
        none has failed)."""
        return self._last_failure_end

    @property
    def elapsed_s(self) -> float:
        """Seconds since the drill began."""
        return self._now()

    # -- the run --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, duration_s: float | None = None) -> DrillReport:
        """Run the workload until ``stop`` is set (or ``duration_s`` passed), sweep,
        clean up, and return the report."""
        self._t0 = time.monotonic()
        tasks = [asyncio.create_task(self._worker(i, stop)) for i in range(self.workers)]
        try:
            if duration_s is None:
                await stop.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), duration_s)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.report.duration_s = self._now()
        # A store that never came back: the stretch runs to the end.
        self.report.outage_s = max(
            self.report.outage_s, self.report.duration_s - self._last_success
        )
        self._settle_recovery()
        try:
            await self._sweep()
        except StorageAdapterError as exc:
            # The store still failing after its patience: the measurement of the run
            # stands, said to be unchecked afterwards, rather than thrown away.
            self.report.rechecked = False
            self.report.recheck_failure = (
                f"the store still failed: {type(exc).__name__}: {str(exc)[:300]}"
            )
        finally:
            self._say_unchecked()
            self.report.cleaned_up = await self._clean_up()
        return self.report

    def _say_unchecked(self) -> None:
        """Acknowledgements whose check could not be decided make the re-check
        incomplete, said with the rest of why."""
        report = self.report
        if not report.unchecked:
            return
        more = " …" if report.unchecked > len(report.sample_unchecked) else ""
        said = (
            f"{report.unchecked} acknowledgement(s) whose check had an unknown outcome "
            "that no retry could tell from the check's own write ("
            + ", ".join(report.sample_unchecked)
            + more
            + ")"
        )
        report.rechecked = False
        report.recheck_failure = (
            said if report.recheck_failure is None else f"{report.recheck_failure}; {said}"
        )

    async def _worker(self, worker: int, stop: asyncio.Event) -> None:
        operations: dict[Kind, Callable[[int], Awaitable[None]]] = {
            "save": self._save,
            "lock": self._lock,
            "wait": self._wait,
            "idempotency": self._idempotency_claim,
            "nonce": self._nonce,
        }
        for kind in itertools.cycle(KINDS[worker % len(KINDS) :] + KINDS[: worker % len(KINDS)]):
            if stop.is_set():
                break
            # The rate: calls of all workers together start 1 / rate apart, and calls
            # held up (a stalled server) do not make up for lost time in a burst.
            now = self._now()
            due = max(self._next_due, now)
            self._next_due = due + 1 / self.rate
            delay = due - now
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            began = self._now()
            self.report.calls[kind] += 1
            try:
                await operations[kind](worker)
            except StorageAdapterError as exc:
                self._failed(worker, kind, began, exc)
            except Exception as exc:
                # Not a store failing: a defect. Said, not swallowed with the worker's
                # task (which would stop the worker and leave the drill waiting for it).
                self._unexpected(kind, exc)
                self._failed(worker, kind, began, exc)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if stop.is_set() or (task is not None and task.cancelling()):
                    raise  # the drill itself is being stopped
                # A call's own deadline must end as an error, never as a cancellation
                # of the caller that nobody asked for.
                self._unexpected(kind, exc)
                self._failed(worker, kind, began, exc)
            else:
                self._succeeded(worker)
                continue
            # Failures during a failover come fast (a refused connection): no spin.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
        # Locks still held stay held for the sweep, which checks that the store still
        # refuses them to another holder; the cleanup releases them.

    def _failed(self, worker: int, kind: Kind, began: float, exc: BaseException) -> None:
        ended = self._now()
        report = self.report
        report.failures[kind] += 1
        if isinstance(exc, OutcomeUnknownError):
            report.outcome_unknown += 1
        # The call that failed began last in this operation (this worker's task).
        call_began = max(began, _CALL_BEGAN.get())
        report.longest_failed_call_s = max(report.longest_failed_call_s, ended - call_began)
        if report.first_failure_s is None:
            # Both: when it failed, and when its operation began (a stalled master fails
            # a call only at command_timeout_ms; the time to recover counts from there).
            report.first_failure_s = ended
            report.first_failure_began_s = began
        if len(report.sample_failures) < 5:
            report.sample_failures.append(f"{kind}: {str(exc)[:300]}")
        self._failures.append((began, ended))
        self._worker_failure[worker] = ended
        self._worker_error[worker] = f"{kind} at {ended:.2f} s: {str(exc)[:300]}"
        if ended > self._last_failure_end:
            self._last_failure_end = ended
            self._first_success_after_last_failure = None

    def _unexpected(self, kind: Kind, exc: BaseException) -> None:
        self.report.unexpected_errors += 1
        errors = self.report.sample_unexpected_errors
        if len(errors) < 5:
            errors.append(f"{kind}: {type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:400])

    def _succeeded(self, worker: int) -> None:
        ended = self._now()
        self._worker_success[worker] = ended
        report = self.report
        report.outage_s = max(report.outage_s, ended - self._last_success)
        self._last_success = ended
        if self._failures and self._first_success_after_last_failure is None:
            self._first_success_after_last_failure = ended

    def _settle_recovery(self) -> None:
        report = self.report
        began = report.first_failure_began_s
        if began is None or self._first_success_after_last_failure is None:
            return
        report.recovered_s = self._first_success_after_last_failure - began

    def _violation(self, kind: str, key: str, detail: str) -> None:
        report = self.report
        attribute = {
            "lost save": "lost_saves",
            "double lock holder": "double_lock_holders",
            "fence regression": "fence_regressions",
            "double wait claim": "double_wait_claims",
            "double idempotency claim": "double_idempotency_claims",
            "nonce replay": "nonce_replays",
        }[kind]
        if kind != "lost save":  # lost saves are counted by revision, where found
            setattr(report, attribute, getattr(report, attribute) + 1)
        if len(report.violations) < _KEPT_VIOLATIONS:
            report.violations.append(Violation(kind, key, detail, round(self._now(), 3)))

    # -- the primitives ---------------------------------------------------------------------

    async def _save(self, worker: int) -> None:
        stack = self._stacks[worker]
        adapter = self._stores.adapter
        revision = stack.revision + 1
        try:
            await adapter.save_checkpoint(
                Checkpoint(
                    stack_id=stack.stack_id,
                    revision=revision,
                    timestamp=revision,
                    namespace=self.id,
                ),
                expected_revision=stack.revision,
            )
        except CheckpointConflictError:
            stored = await adapter.get_checkpoint(stack.stack_id, self.id, fallback=False)
            self._account_stored(stack, 0 if stored is None else stored.revision, during=True)
            return
        stack.revision = stack.acked = revision
        stack.acked_at = self._now()
        self.report.acknowledged["save"] += 1

    def _account_stored(self, stack: _Stack, stored: int, *, during: bool) -> None:
        if stored < stack.acked:
            lost = stack.acked - stored
            self.report.lost_saves += lost
            self._violation(
                "lost save",
                stack.stack_id,
                f"revision {stack.acked} acknowledged at {stack.acked_at:.2f} s; the store "
                f"has {stored or 'no checkpoint'}"
                + ("" if during else " after the drill")
                + f" ({lost} acknowledged save(s) lost)",
            )
            stack.acked = stored
        elif during and stored > stack.revision:
            self.report.ambiguous_saves += 1
        stack.revision = stored

    async def _lock(self, worker: int) -> None:
        await self._release_due(worker)
        lock = self._stores.lock
        if lock is None:
            return
        key = self._lock_keys[worker % len(self._lock_keys)]
        if any(h.worker == worker and h.released is None for h in self._holds[key]):
            return  # still holding it
        began = self._now()
        result = await lock.acquire(key, self.lock_ttl_ms)
        if not result.acquired:
            return
        acked = self._now()
        self.report.acknowledged["lock"] += 1
        self._check_grant(key, began, acked, result.fencing_token, "")
        self._holds[key].append(
            _Hold(
                worker=worker,
                token=result.token,
                fencing=result.fencing_token,
                began=began,
                acked=acked,
                lease_end=began + ms_as_seconds(self.lock_ttl_ms),
                release_at=acked + self.hold_s,
            )
        )

    def _check_grant(
        self,
        key: str,
        began: float,
        acked: float,
        fencing: int | None,
        who: str,
        *,
        holders: bool = True,
    ) -> None:
        """A lock of ``key`` granted by a call from ``began`` to ``acked`` (``holders``
        false: its holders already checked, by a grant to the same caller before)."""
        for hold in self._holds[key] if holders else ():
            if hold.acked <= began and acked + _CLOCK_MARGIN_S < hold.end():
                self._violation(
                    "double lock holder",
                    key,
                    f"granted{who} at {acked:.2f} s while worker {hold.worker} held it "
                    f"(acquired at {hold.acked:.2f} s, fencing token {hold.fencing}, lease "
                    f"to {hold.lease_end:.2f} s, not released)",
                )
                break
        if fencing is None:
            return
        before = [(at, token) for at, token in self._fences[key] if at <= began]
        if before:
            at, highest = max(before, key=lambda item: item[1])
            if fencing <= highest:
                self._violation(
                    "fence regression",
                    key,
                    f"fencing token {fencing} granted{who} at {acked:.2f} s; token {highest} "
                    f"had been acknowledged at {at:.2f} s",
                )
        self._fences[key].append((acked, fencing))

    async def _release_due(self, worker: int) -> None:
        lock = self._stores.lock
        if lock is None:
            return
        now = self._now()
        for key, holds in self._holds.items():
            for hold in list(holds):
                if hold.worker != worker or hold.released is not None:
                    continue
                if now < hold.release_at:
                    continue
                hold.released = self._now()
                with contextlib.suppress(StorageAdapterError):
                    await lock.release(key, hold.token)
            # Keep what can still overlap a grant, and what the sweep checks.
            holds[:] = [h for h in holds if h.released is None or h.end() > now - 1]

    async def _wait(self, worker: int) -> None:
        adapter = self._stores.adapter
        n = next(self._counter)
        key = f"{self.id}-w{n}"
        stack = self._stacks[worker].stack_id
        await adapter.save_wait_record(
            WaitRecord(correlation_key=key, stack_id=stack, namespace=self.id)
        )
        lease_ms = int(self.window_s * 1000)
        first = await adapter.claim_wait_record(
            key, f"{self.id}-a{worker}", lease_ms=lease_ms, namespace=self.id
        )
        if first is None:
            return
        acked = self._now()
        self.report.acknowledged["wait"] += 1
        self._claims.append((key, acked))
        second = await adapter.claim_wait_record(
            key, f"{self.id}-b{worker}", lease_ms=lease_ms, namespace=self.id
        )
        if second is not None:
            self._violation(
                "double wait claim",
                key,
                f"claimed again by a second claimant; first claim acknowledged at {acked:.2f} s",
            )

    async def _idempotency_claim(self, worker: int) -> None:
        store = self._stores.idempotency
        if store is None:
            return
        key = f"{self.id}:idem:{next(self._counter)}"
        ttl_ms = int(self.window_s * 1000)
        claim = await store.claim_owned(key, ttl_ms)
        if not claim.claimed:
            return
        acked = self._now()
        self.report.acknowledged["idempotency"] += 1
        assert claim.token is not None
        self._idempotency.append((key, claim.token, acked))
        again = await store.claim_owned(key, ttl_ms)
        if again.claimed:
            self._violation(
                "double idempotency claim",
                key,
                f"claimed again; first claim acknowledged at {acked:.2f} s",
            )
            # The second claim holds the key now: the one the check after the run
            # renews (the first's loss is counted once) and the cleanup frees.
            assert again.token is not None
            self._idempotency[self._idempotency.index((key, claim.token, acked))] = (
                key,
                again.token,
                self._now(),
            )

    async def _nonce(self, worker: int) -> None:
        store = self._stores.nonces
        if store is None:
            return
        key = f"{self.id}:nonce:{next(self._counter)}"
        if not await store.claim(key, self.window_s):
            return
        acked = self._now()
        self.report.acknowledged["nonce"] += 1
        self._nonces.append((key, acked))
        if await store.claim(key, self.window_s):
            self._violation(
                "nonce replay", key, f"accepted again; first claim acknowledged at {acked:.2f} s"
            )

    # -- after the run ----------------------------------------------------------------------

    async def _patiently(
        self,
        call: Callable[..., Awaitable[T]],
        *args: Any,
        seconds: float | None = None,
        retry_unknown: bool = True,
        **kwargs: Any,
    ) -> T:
        """``call(*args, **kwargs)``, tried again while the store is still settling
        after a failover (a Sentinel may name no master for a moment), for ``seconds``
        (the drill's ``settle_s`` by default).

        A read, or a write that may be repeated (one with an identity of its own: a
        release, a renewal by the owner's token), is tried again whatever failed. With
        ``retry_unknown`` false an :class:`~siglo.errors.OutcomeUnknownError` is raised
        at once: the write may have landed, and what a retry answers may then be the
        write's own doing (a check's claim refusing its own retry)."""
        deadline = time.monotonic() + (self.settle_s if seconds is None else seconds)
        while True:
            try:
                return await call(*args, **kwargs)
            except OutcomeUnknownError:
                if not retry_unknown or time.monotonic() > deadline:
                    raise
            except StorageAdapterError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)

    def _remembered(self, acked: float) -> bool:
        """Whether a claim acknowledged at ``acked`` is still within the drill's window
        (leases and nonces of a longer run lapse by design: not checked)."""
        return self._now() - acked < self.window_s - 60

    def _unchecked(self, kind: Kind, key: str) -> None:
        """An acknowledgement whose check after the run could not be decided."""
        report = self.report
        report.unchecked += 1
        if len(report.sample_unchecked) < 5:
            report.sample_unchecked.append(f"{kind} {key}")

    async def _sweep(self) -> None:
        """Every acknowledgement checked once more against the store."""
        adapter = self.backend.adapter
        self._claims = [(k, at) for k, at in self._claims if self._remembered(at)]
        self._idempotency = [c for c in self._idempotency if self._remembered(c[2])]
        self._nonces = [(k, at) for k, at in self._nonces if self._remembered(at)]
        for stack in self._stacks:
            stored = await self._patiently(
                adapter.get_checkpoint, stack.stack_id, self.id, fallback=False
            )
            self._account_stored(stack, 0 if stored is None else stored.revision, during=False)
        sweeper = f"{self.id}-sweeper"
        for key, acked in self._claims:
            # Retried whatever failed: a claimant may claim again what it holds, so a
            # retry after the sweep's own claim landed unseen wins again (the loss is
            # seen), and one refused was refused by another claimant, the one
            # acknowledged.
            again = await self._patiently(
                adapter.claim_wait_record, key, sweeper, lease_ms=60_000, namespace=self.id
            )
            if again is not None:
                self._violation(
                    "double wait claim",
                    key,
                    f"claimed again after the drill; the claim acknowledged at {acked:.2f} s "
                    "was lost",
                )
        idempotency = self.backend.idempotency
        if idempotency is not None:
            for key, token, acked in self._idempotency:
                # Not a claim of the sweep's (a retry after its unknown outcome would be
                # refused by the sweep's own claim, and the loss pass as honoured): the
                # acknowledged claim's own token renewing it answers whether it still
                # holds the key, creates nothing, and may be repeated.
                held = await self._patiently(idempotency.extend, key, token, 60_000)
                if not held:
                    self._violation(
                        "double idempotency claim",
                        key,
                        f"the claim acknowledged at {acked:.2f} s no longer held the key "
                        "after the drill (free for another claimant): it was lost",
                    )
        nonces = self.backend.nonces
        if nonces is not None:
            for key, acked in self._nonces:
                if await self._nonce_replayed(nonces, key):
                    self._violation(
                        "nonce replay",
                        key,
                        "accepted again after the drill; first claim acknowledged at "
                        f"{acked:.2f} s",
                    )
        await self._sweep_locks()

    async def _nonce_replayed(self, nonces: Any, key: str) -> bool:
        """Whether ``key`` is accepted once more (its acknowledged claim lost). A nonce's
        claim has no claimant to tell and no read beside it: after a check whose outcome
        is unknown, a retry accepted still says the key was free (no earlier try
        landed), but one refused may be refused by the check's own claim — the key is
        then counted as not re-checked, never as honoured."""
        try:
            return bool(
                await self._patiently(nonces.claim, key, self.window_s, retry_unknown=False)
            )
        except OutcomeUnknownError:
            pass
        if await self._patiently(nonces.claim, key, self.window_s):
            return True
        self._unchecked("nonce", key)
        return False

    async def _sweep_locks(self) -> None:
        lock = self.backend.lock
        if lock is None:
            return
        for key in self._lock_keys:
            await self._sweep_lock(lock, key)

    async def _sweep_lock(self, lock: Any, key: str) -> None:
        """Take ``key`` once: refused while a lease of ours still holds it (or one whose
        release was lost in a failover, which lapses by itself); granted, the grant is
        checked like any other (a live acknowledged lease: a double holder; its fencing
        token above every acknowledged one).

        Each try takes it with a token of the sweep's own: a try whose outcome is unknown
        is told by who holds the key (:meth:`~siglo.coordination.LockBase.inspect`, a
        read), since a retry would be refused by that try's own grant, and a lost lease
        would pass as still held."""
        deadline = time.monotonic() + self.settle_s
        ours: set[str] = set()
        holders_checked = False
        for attempt in itertools.count():
            token = f"{self.id}-sweep-{attempt}-{secrets.token_hex(4)}"
            began = self._now()
            try:
                result = await lock.acquire(key, _SWEEP_LEASE_MS, token)
            except OutcomeUnknownError as unknown:
                self._sweep_grants.append((key, token))
                ours.add(holder_label(token))
                state = await self._holder(lock, key)
                if state is False:
                    self._unchecked("lock", key)
                    return
                if state is None:
                    # Not granted (its lease, far longer than this, would hold it): again,
                    # as after any failure, while the store settles.
                    if time.monotonic() > deadline:
                        raise unknown
                    continue
                if state.holder not in ours:
                    return  # refused: a lease of ours still holds it
                # Granted after all: a grant to the sweep, whose fencing token only the
                # inspection may give (Redis keeps none per key).
                self._check_grant(
                    key,
                    began,
                    self._now(),
                    state.fencing_token,
                    " to the sweep",
                    holders=not holders_checked,
                )
                holders_checked = True
                await self._patiently(lock.release, key, token)
                if state.fencing_token is not None:
                    return
                if time.monotonic() > deadline:
                    # Every grant's outcome unknown: its fencing token never checked.
                    self._unchecked("lock", key)
                    return
                continue  # for a grant whose fencing token is known
            except StorageAdapterError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            if not result.acquired:
                return
            self._sweep_grants.append((key, result.token))
            self._check_grant(
                key,
                began,
                self._now(),
                result.fencing_token,
                " to the sweep",
                holders=not holders_checked,
            )
            await self._quietly(lock.release(key, result.token))
            return

    async def _holder(self, lock: Any, key: str) -> LockState | Literal[False] | None:
        """Who holds ``key`` (``None``: nobody), or ``False`` when the lock cannot say (a
        lock class without :meth:`~siglo.coordination.LockBase.inspect`)."""
        inspect = getattr(lock, "inspect", None)
        if inspect is None:
            return False
        try:
            state: LockState | None = await self._patiently(inspect, key)
        except CapabilityNotSupportedError:
            return False
        return state

    @staticmethod
    async def _quietly(call: Awaitable[Any]) -> None:
        with contextlib.suppress(SigloError):
            await call

    async def _clean_up(self) -> bool:
        """Remove what the drill wrote; whether every removal succeeded."""
        clean = True
        adapter = self.backend.adapter
        lock = self.backend.lock
        idempotency = self.backend.idempotency
        try:
            for stack in self._stacks:
                # Its wait records go with it.
                await self._patiently(
                    adapter.delete_checkpoint,
                    stack.stack_id,
                    self.id,
                    seconds=min(10.0, self.settle_s),
                )
            if lock is not None:
                tokens = [(key, hold.token) for key, holds in self._holds.items() for hold in holds]
                # The check's own grants too: one whose release failed, or whose outcome
                # was unknown, would hold a drill's key for the check's long lease.
                for key, token in tokens + self._sweep_grants:
                    await self._patiently(
                        lock.release, key, token, seconds=min(10.0, self.settle_s)
                    )
            if idempotency is not None:
                for key, token, _acked in self._idempotency:
                    with contextlib.suppress(SigloError):
                        await idempotency.fail(key, token=token)
        except StorageAdapterError:
            clean = False
        return clean


async def detect_setting(backend: Backend) -> str:
    """The replication setting of ``backend``, as a column of docs/deploying.md's table.

    Redis: ``wait_replicas`` and ``cluster`` as the connected client applies them (its
    ``WAIT`` replicas, a cluster client), else a client of a Sentinel's master or a
    server with replicas (``INFO replication``) is ``no WAIT``. PostgreSQL: a standby
    named in ``synchronous_standby_names`` with ``synchronous_commit`` ``on``,
    ``remote_write`` or ``remote_apply`` is a synchronous standby, else a server with
    replicas (``pg_stat_replication``) has an asynchronous one. Anything else (SQLite,
    memory, a lone server) is a single server. A managed service may replicate where
    the server cannot see it (``--expect`` then says what its provider promises).
    """
    if backend.name == "redis":
        return await _redis_setting(backend)
    if backend.name == "postgres":
        return await _postgres_setting(backend)
    return "single server"


async def _redis_setting(backend: Backend) -> str:
    # What the connected client does, not the URL's text: siglo.connect reads
    # `wait_replicas=00` or `+0` as 0 (no WAIT sent), which a test of the text took for
    # the wait_replicas setting (a verdict of `fail` on losses the table allows), and a
    # client passed to connect() carries its own. siglo_redis's clients say both
    # (duck-typed: the driver is optional, and a plugin's client may be of its own).
    client = getattr(backend.raw_adapter, "client", None)
    replicas = getattr(client, "wait_replicas", 0)
    waits = isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 0
    # A cluster client routes keys to nodes (siglo_redis.listing.is_cluster).
    if callable(getattr(client, "get_node_from_key", None)):
        return "cluster with WAIT" if waits else "cluster without WAIT"
    if waits:
        return "wait_replicas"
    # A Sentinel's master: its pool asks the Sentinels (it may be unreachable now).
    if getattr(getattr(client, "connection_pool", None), "sentinel_manager", None) is not None:
        return "no WAIT"
    # The driver's client is called directly here, outside siglo's bounded calls: bounded
    # by the backend's command_timeout_ms too (a drill is run when a primary may be silent).
    with contextlib.suppress(Exception):
        info = await asyncio.wait_for(
            client.info("replication"),  # type: ignore[union-attr]
            _bound_s(backend),
        )
        if int(info.get("connected_slaves", 0)) > 0:
            return "no WAIT"
    return "single server"


def _bound_s(backend: Backend) -> float | None:
    """The backend's ``command_timeout_ms``, in seconds (``None``: unbounded)."""
    bound = command_timeout_ms(backend.url, {})
    return None if bound is None else ms_as_seconds(bound)


async def _postgres_setting(backend: Backend) -> str:
    database = getattr(backend.raw_adapter, "database", None)
    raw_fetch = getattr(database, "raw_fetch", None)
    if raw_fetch is None:
        return "single server"
    bound = _bound_s(backend)
    try:
        await asyncio.wait_for(database.open(), bound)  # type: ignore[union-attr]
        rows = await asyncio.wait_for(
            raw_fetch(
                "SELECT current_setting('synchronous_standby_names'), "
                "current_setting('synchronous_commit'), "
                "(SELECT count(*) FROM pg_stat_replication)"
            ),
            bound,
        )
    except TimeoutError:
        raise StorageAdapterError(
            f"the server did not answer within command_timeout_ms ({bound} s) while the "
            "drill read its replication settings"
        ) from None
    names, commit, replicas = rows[0]
    if str(names).strip() and str(commit) in ("on", "remote_write", "remote_apply"):
        return "synchronous standby"
    return "asynchronous replica" if int(replicas) > 0 else "single server"
