"""Steps: named async functions, optionally cached, that may wait for an event."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from siglo.codec import private_copy
from siglo.errors import InvalidArgumentError, InvalidStateTransitionError, WaitTimeoutError
from siglo.redaction import redact
from siglo.sentinel import MISSING
from siglo.validation import require_id, require_ttl_ms
from siglo.workflow.outcomes import SLEEP_PREFIX

if TYPE_CHECKING:  # the manager imports nothing of the workflow; only its type is named
    from siglo.backend import Backend
    from siglo.coordination import IdempotencyStore
    from siglo.manager import StorageManager

__all__ = [
    "Step",
    "StepRun",
    "current_backend",
    "current_manager",
    "run_input",
    "sleep",
    "wait_for_event",
]

StepFn = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class Step:
    """A named unit of work: ``await fn(input)`` returns the step's output.

    Create with :meth:`create`; :meth:`cache` returns a copy whose output is kept in the
    backend's step cache. A step is the unit of retry: after a crash, or when the event
    it waited for arrives, a step runs again from its start, so its effects before a
    wait should be idempotent (an idempotency key helps).
    """

    name: str
    fn: StepFn
    cache_ttl_ms: int | None = None
    cache_key: Callable[[Any], str] | None = None

    @classmethod
    def create(cls, name: str, fn: StepFn) -> Step:
        """A step called ``name`` running ``fn``."""
        require_id("step name", name)
        if not callable(fn):
            raise InvalidArgumentError(f"step {name!r}: fn must be an async callable")
        return cls(name=name, fn=fn)

    def cache(
        self, *, ttl_ms: int, key: Callable[[Any], str] | Callable[[], str] | None = None
    ) -> Step:
        """A copy whose output is cached for ``ttl_ms`` under ``key(input)``.

        ``key`` may also take no argument (the seed's ``key: () => 'rates-latest'``).
        Without ``key`` the cache key is the step's name (one entry for all inputs).
        """
        require_ttl_ms("ttl_ms", ttl_ms)
        if key is not None and not _takes_an_argument(key):
            no_arg = cast(Callable[[], str], key)
            key = lambda _input: no_arg()  # noqa: E731 - adapts the seed's form
        return replace(self, cache_ttl_ms=ttl_ms, cache_key=cast(Callable[[Any], str], key))

    def cache_key_for(self, value: Any) -> str:
        """The step-cache key of this step for ``value``."""
        key = self.name if self.cache_key is None else self.cache_key(value)
        return require_id(f"cache key of step {self.name!r}", key)


def _takes_an_argument(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): assume the documented form
        return True
    return True


@dataclass
class StepRun:
    """What a running step knows: its stack and step, and an event already delivered."""

    stack_id: str
    step: str
    namespace: str | None
    input: Any = None
    event: Any = MISSING
    timed_out: bool = False
    """The step's wait passed its timeout (a worker fired the timer) with no event."""
    manager: StorageManager | None = None
    """The manager running the step (the application's, or ``siglo worker``'s)."""
    redact_fields: frozenset[str] = frozenset()
    """The run's own redacted keys (its checkpoint's ``redactFields``: they travel with
    the data), which a process without the application's settings still applies."""
    waited_for: str | None = None
    """The correlation key the step waited for, whose event (or timeout) it carries."""
    answered: bool = False
    """Whether a wait of this run of the step has returned (a step waits at most once)."""


def _answer(run: StepRun, correlation_key: str, what: str) -> None:
    """Let the step's wait for ``correlation_key`` return what the run carries — once,
    and only for the key the step waited for: a second wait in the step would be handed
    the first one's event."""
    if run.answered:
        raise InvalidStateTransitionError(
            f"{what} in step {run.step!r}: the step already waited (for "
            f"{run.waited_for!r}), and a step waits at most once; wait in a step of its own"
        )
    if run.waited_for is not None and run.waited_for != correlation_key:
        # Resumed with the outcome of the wait it suspended on, the step now asks for
        # another key: its code changed since the run waited (a deploy), or the key is
        # made of something that changed. Handed on, the other wait's event would be
        # taken for this one's.
        raise InvalidStateTransitionError(
            f"{what} in step {run.step!r}: the run suspended in this step waiting for "
            f"{run.waited_for!r} and was resumed with that wait's outcome, but the step "
            "now waits for another key — its code or its key's parts changed since. A "
            "step must ask for the same key when it runs again: keep the key's form for "
            "the runs already waiting (a migration does not change it), and wait for a "
            "new key in a step of its own"
        )
    run.answered = True


current_step: contextvars.ContextVar[StepRun] = contextvars.ContextVar("siglo_current_step")


class _Suspend(Exception):
    """Raised inside a step to unwind it to the flow runner; never seen by users."""

    siglo_signal = True
    """Not a failure to :mod:`siglo.telemetry` (see ``WorkflowSuspended``)."""

    def __init__(self, correlation_key: str, timeout_ms: int | None) -> None:
        super().__init__(correlation_key)
        self.correlation_key = correlation_key
        self.timeout_ms = timeout_ms


def _current(what: str) -> StepRun:
    try:
        return current_step.get()
    except LookupError:
        raise InvalidArgumentError(f"{what} can only be used inside a step") from None


def current_manager() -> StorageManager:
    """Inside a step: the :class:`~siglo.StorageManager` running it.

    Whoever runs the step — the application's ``flow.run``, a delivery, or ``siglo
    worker`` firing a timer or recovering a crashed run — sets it, so a step reaches the
    same storage, with the same settings, wherever it runs.
    """
    return _manager("current_manager()")


def _manager(what: str) -> StorageManager:
    manager = _current(what).manager
    if manager is None:  # a StepRun built by hand (tests); the runner always sets it
        raise InvalidArgumentError(f"{what}: this step was run without a manager")
    return manager


def current_backend() -> Backend:
    """Inside a step: the :class:`~siglo.Backend` the running manager stores through —
    its idempotency store, lock and nonce store included::

        async def charge(order):
            payments = siglo.current_backend().require_idempotency()
            claim = await payments.claim(f"charge:{order['id']}")
            ...

    In ``siglo worker`` this is the worker's backend (the application's settings, its
    redaction and timeouts). Raises :class:`~siglo.errors.InvalidArgumentError` outside a
    step, or when the manager was given a bare adapter instead of the backend that
    :func:`siglo.connect` returns.
    """
    manager = _manager("current_backend()")
    backend = manager.backend
    if backend is None:
        raise InvalidArgumentError(
            "current_backend(): the manager running this step was given a bare storage "
            "adapter; build it from the backend siglo.connect() returns "
            "(StorageManager(backend)) to reach its idempotency store, lock and nonces"
        )
    fields = manager.redact_fields | _current("current_backend()").redact_fields
    if not fields or backend.idempotency is None:
        return backend
    # A result the step stores is redacted as its context is — by the run's own keys
    # too, which travel with the data: a worker started without the application's
    # settings must not store in clear what the application redacts.
    return replace(
        backend, idempotency=cast("IdempotencyStore", _Redacting(backend.idempotency, fields))
    )


class _Redacting:
    """An idempotency store whose completed results are stored redacted by ``fields``;
    everything else is the store's own."""

    def __init__(self, inner: IdempotencyStore, fields: frozenset[str]) -> None:
        self._inner = inner
        self._fields = fields

    async def complete(
        self, key: str, result: Any, ttl_ms: int | None = None, *, token: str | None = None
    ) -> None:
        await self._inner.complete(key, redact(result, self._fields), ttl_ms, token=token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def run_input() -> Any:
    """Inside a step: the input the run was started with (each step receives the
    previous step's output; this is the original input). A copy: changing it changes
    nothing the run stores."""
    return private_copy(_current("run_input()").input)


async def wait_for_event(correlation_key: str, *, timeout_ms: int | None = None) -> Any:
    """Inside a step: the payload of the event with ``correlation_key``.

    The first time, this records a durable wait and suspends the run (the flow's ``run``
    raises :class:`~siglo.workflow.WorkflowSuspended`). When the event is delivered, the
    step runs again from its start and this call returns the event's payload.
    ``timeout_ms`` sets the wait's deadline; a late event is refused unless delivered
    with ``allow_expired``. Once the deadline passes, a ``siglo worker`` (or
    :class:`~siglo.workflow.Worker`) resumes the run and this call raises
    :class:`~siglo.errors.WaitTimeoutError` in the step, which may catch it. A step
    waits at most once (one ``wait_for_event`` or one :func:`sleep`).
    """
    require_id("correlation_key", correlation_key)
    require_ttl_ms("timeout_ms", timeout_ms, optional=True)
    run = _current("wait_for_event()")
    if run.event is not MISSING or run.timed_out:
        _answer(run, correlation_key, f"wait_for_event({correlation_key!r})")
        if run.timed_out:
            raise WaitTimeoutError(correlation_key)
        # A copy: the event stays in the step's context as it was delivered.
        return private_copy(run.event)
    raise _Suspend(correlation_key, timeout_ms)


def sleep_key(namespace: str | None, stack_id: str, step: str) -> str:
    """The correlation key of a step's durable sleep (unique per namespace, stack, step)."""
    return SLEEP_PREFIX + "\x1f".join((namespace or "", stack_id, step))


async def sleep(ms: int) -> None:
    """Inside a step: suspend the run durably for ``ms`` milliseconds.

    The run is checkpointed as ``waiting`` on a wait record whose deadline is now +
    ``ms``; when it has passed, a ``siglo worker`` resumes the run in any process, the
    step runs again from its start and this call returns. Nothing is held in memory
    meanwhile: the process may exit. A step sleeps (or waits) at most once.
    """
    require_ttl_ms("ms", ms)
    run = _current("sleep()")
    key = sleep_key(run.namespace, run.stack_id, run.step)
    if run.event is not MISSING or run.timed_out:
        _answer(run, key, f"sleep({ms})")
        return
    raise _Suspend(key, ms)
