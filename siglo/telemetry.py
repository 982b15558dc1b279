"""OpenTelemetry spans and metrics for every storage call and workflow step (``siglo[otel]``).

siglo depends on ``opentelemetry-api`` only (the extra ``siglo[otel]``); the application
installs and configures an SDK (a ``TracerProvider`` / ``MeterProvider`` and exporters)
as it does for any instrumented library. What siglo emits is documented field by field
in ``docs/observability.md``.

No cost when nothing listens: :func:`current` is ``None`` unless the API is importable
*and* an SDK provider is installed (globally, or for siglo with :func:`use`). The
storage pipeline (:mod:`siglo.pipeline`) asks once, when :func:`siglo.connect` builds it,
and adds its tracing stage only then: a backend connected without an SDK is the same
object, with the same calls, as one connected without the API installed. So an
application configures OpenTelemetry before it connects, as with any instrumentation.

Never payloads, never credentials: attributes are the OTel database conventions
(``db.system.name``, ``db.operation.name``, ``db.namespace``, ``server.address``,
``server.port``), siglo's routing fields (its namespace, a workflow's name, a run's id,
a step's name) and outcomes (``error.type``). A URL's user and password never reach an
attribute.

Telemetry never changes what a call raises or returns: an SDK component that fails (a
span processor raising in ``on_start`` or ``on_end``, an instrument that raises) and an
exception whose text cannot be formatted (``str()`` raising) are absorbed here — the
first such failure is logged on the ``siglo.telemetry`` logger, once per process — and
the call's own outcome goes on to its caller as it would without an SDK.
"""

from __future__ import annotations

import os
import time
import traceback
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from contextvars import ContextVar
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl, urlsplit

from siglo.errors import CheckpointConflictError, LockLostError, LockNotAcquiredError
from siglo.masking import logger, scrub
from siglo.records import WaitRecord

try:  # the optional API (siglo[otel]); siglo works the same without it
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.metrics import _internal as _otel_metrics_internal
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised by the overhead benchmark's "absent" cell
    otel_context = None  # type: ignore[assignment]
    otel_metrics = None  # type: ignore[assignment]
    otel_trace = None  # type: ignore[assignment]
    _otel_metrics_internal = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

__all__ = [
    "INSTRUMENTATION_NAME",
    "TRACEPARENT_KEY",
    "Telemetry",
    "current",
    "db_attributes",
    "use",
]

INSTRUMENTATION_NAME: Final = "siglo"
"""The instrumentation scope of every span and instrument siglo makes."""

TRACEPARENT_KEY: Final = "traceparent"
"""Checkpoint metadata key where a suspending run leaves its span's W3C ``traceparent``,
so the run that resumes it (in any process) links to it."""

# The OTel names of the backends siglo ships; any other backend reports its own name.
_DB_SYSTEMS: Final = {"postgres": "postgresql", "sqlite": "sqlite", "redis": "redis"}

_PROVIDER_VARIABLES: Final = frozenset(
    {"OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER"}
)

# Read once: they are set before a process starts (auto-instrumentation), not in it.
_PROVIDERS_FROM_ENVIRONMENT: Final = any(name in os.environ for name in _PROVIDER_VARIABLES)

_override: tuple[Any, Any] | None = None
_cache: dict[tuple[int, int], Telemetry] = {}
_queues: weakref.WeakSet[_Sized] = weakref.WeakSet()
_run_span: ContextVar[Any] = ContextVar("siglo_run_span", default=None)
_log = logger("siglo.telemetry")
_sdk_failure_reported = False
_COUNTED_MARK: Final = "_siglo_timeout_counted"
"""Set on a timed-out exception once ``siglo.timeouts`` counted it: a lock's call counted
where it failed (:meth:`Telemetry.failure_observer`) is not counted again by a traced
call it propagates out of."""


class _Sized(Protocol):
    def pending(self) -> int: ...


def use(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Make siglo report to these providers instead of the global ones (``use()`` with
    neither goes back to the global providers). For tests, and for applications that keep
    siglo's telemetry apart; backends connected afterwards pick it up."""
    global _override
    _override = (
        None
        if tracer_provider is None and meter_provider is None
        else (
            tracer_provider,
            meter_provider,
        )
    )
    _cache.clear()


def _is_sdk(provider: Any) -> bool:
    # The API's defaults are a proxy (until an SDK is set) or a no-op provider; anything
    # else is an SDK (or a vendor's) that records.
    return provider is not None and type(provider).__name__ not in {
        "ProxyTracerProvider",
        "NoOpTracerProvider",
        "_ProxyMeterProvider",
        "NoOpMeterProvider",
    }


def _nothing_set() -> bool:
    # The fast answer for the common case, no SDK (a workflow step asks once per step):
    # the API keeps its global providers in these module variables until an SDK sets
    # them (in code, or through the OTEL_PYTHON_*_PROVIDER variables, which the public
    # getters read). Any other API layout takes the public getters.
    if _PROVIDERS_FROM_ENVIRONMENT:
        return False
    tracer = getattr(otel_trace, "_TRACER_PROVIDER", False)
    meter = getattr(_otel_metrics_internal, "_METER_PROVIDER", False)
    return tracer is None and meter is None


def current() -> Telemetry | None:
    """The telemetry siglo reports to now, or ``None`` when no SDK listens (or the API is
    not installed)."""
    if otel_trace is None:
        return None
    if _override is not None:
        tracer_provider, meter_provider = _override
    else:
        if _nothing_set():
            return None
        tracer_provider = otel_trace.get_tracer_provider()
        meter_provider = otel_metrics.get_meter_provider()
    if not _is_sdk(tracer_provider) and not _is_sdk(meter_provider):
        return None
    key = (id(tracer_provider), id(meter_provider))
    found = _cache.get(key)
    if found is None:
        try:
            found = _cache[key] = Telemetry(tracer_provider, meter_provider)
        except Exception as exc:
            # A provider that cannot make siglo's tracer or instruments: nothing is
            # traced, rather than every connect and run failing on it.
            _sdk_failed("making siglo's tracer and instruments", exc)
            return None
    return found


def db_attributes(backend: str, url: str) -> dict[str, Any]:
    """The OTel database attributes of a backend connected at ``url``: its system, the
    database (``db.namespace``) and server — never its user or password."""
    attrs: dict[str, Any] = {"db.system.name": _DB_SYSTEMS.get(backend, backend)}
    if backend == "redis":
        redis_db = _redis_db(url)
        if redis_db is not None:  # a socket or Sentinel URL: no server of its own to name
            return {**attrs, "db.namespace": redis_db}
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return attrs
    if backend == "postgres" and not host:
        # libpq's URL may name its server in the query (postgresql:///db?host=h&port=p);
        # a host that is a directory is a Unix socket: no server address.
        query = dict(parse_qsl(parts.query))
        named = query.get("host") or query.get("hostaddr")
        if named and not named.startswith("/"):
            host = named
            given = query.get("port", "")
            port = int(given) if given.isdigit() else port
    if "," in parts.netloc or (host and "," in host):  # a host list: no single server
        host, port = None, None
    if host:
        attrs["server.address"] = host
    if port:
        attrs["server.port"] = port
    path = parts.path.lstrip("/")
    if backend == "sqlite":
        path = parts.path[1:] or ":memory:"  # sqlite:///app.db, sqlite:////abs/app.db
    if backend == "redis":
        # ?db=N wins over the path, as in redis-py.
        query_db = next((v for k, v in parse_qsl(parts.query) if k == "db"), None)
        path = query_db or path or "0"
    if path:
        attrs["db.namespace"] = path
    return attrs


def _redis_db(url: str) -> str | None:
    """The db number of a ``unix://`` URL (``?db=N``) or a Sentinel one
    (``redis+sentinel://sentinels/master/N``), ``"0"`` when it names none; ``None`` for
    a URL of another form (``redis://host:port/N``: read as any URL). A Sentinel URL's
    hosts are the Sentinels, not the server that answers the calls, and a socket has no
    host: neither gives a ``server.address``."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    path, _, query = rest.partition("?")
    db = next((v for k, v in parse_qsl(query) if k == "db"), None)
    if scheme == "unix":
        return db or "0"
    if scheme.endswith("+sentinel"):
        segments = [s for s in path.split("/")[1:] if s]  # after the host list
        return segments[1] if len(segments) > 1 else db or "0"
    return None


def register_queue(queue: _Sized) -> None:
    """Count ``queue``'s pending jobs in the background-save queue depth gauge."""
    _queues.add(queue)


def _queue_depth(_options: Any) -> Iterator[Any]:
    assert otel_metrics is not None
    yield otel_metrics.Observation(sum(q.pending() for q in list(_queues)))


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a call that ran past its bound: marked so by the backend
    (:func:`siglo.errors.past_its_bound`), or a ``TimeoutError`` in its chain (another
    backend's). A lost lease is not (``siglo.lock.lease_losses`` counts it): its
    renewal, not the call, ran out of time."""
    if isinstance(exc, LockLostError):
        return False
    if getattr(exc, "timed_out", False) is True:
        return True
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Telemetry:
    """siglo's tracer and instruments on one pair of providers."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        assert otel_trace is not None
        assert otel_metrics is not None
        self.tracer = otel_trace.get_tracer(INSTRUMENTATION_NAME, tracer_provider=tracer_provider)
        meter = otel_metrics.get_meter(INSTRUMENTATION_NAME, meter_provider=meter_provider)
        self.duration = meter.create_histogram(
            "db.client.operation.duration",
            unit="s",
            description="Duration of a storage call, by backend and operation.",
        )
        self.conflicts = meter.create_counter(
            "siglo.checkpoint.conflicts",
            unit="{conflict}",
            description="Saves refused by compare-and-set (CheckpointConflictError).",
        )
        self.retries = meter.create_counter(
            "siglo.retries",
            unit="{retry}",
            description="Calls siglo retried by itself (lease renewals and releases).",
        )
        self.timeouts = meter.create_counter(
            "siglo.timeouts",
            unit="{timeout}",
            description="Storage calls that ran past their bound (command_timeout_ms).",
        )
        self.lease_losses = meter.create_counter(
            "siglo.lock.lease_losses",
            unit="{loss}",
            description="Workflow-lock leases lost while their action ran.",
        )
        self.due_waits = meter.create_counter(
            "siglo.waits.due",
            unit="{wait}",
            description="Waits past their deadline that a worker found.",
        )
        self.lateness = meter.create_histogram(
            "siglo.wait.lateness",
            unit="s",
            description="How long past its deadline a due wait was when a worker found it.",
        )
        self.step_cache = meter.create_counter(
            "siglo.step.cache",
            unit="{lookup}",
            description="Step cache look-ups of workflow steps, by result (hit, miss).",
        )
        self.recoveries = meter.create_counter(
            "siglo.worker.recoveries",
            unit="{run}",
            description="Crashed runs a worker took over.",
        )
        meter.create_observable_up_down_counter(
            "siglo.background.queue_depth",
            callbacks=[_queue_depth],
            unit="{job}",
            description="Background saves submitted and not finished yet.",
        )

    async def call(
        self,
        attributes: Mapping[str, Any],
        operation: str,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        action_raised: Callable[[BaseException], bool] | None = None,
        **kwargs: Any,
    ) -> Any:
        """``await fn(*args, **kwargs)`` inside a client span named ``operation``, timed
        into the duration histogram; a conflict or a timeout is counted. ``attributes``
        are the backend's, with ``db.operation.name`` or without (then it is added).

        Not failures of the call, so no error status, ``error.type`` or count: a signal
        (a run suspending: ``siglo.outcome: suspended``); a conflict inside
        :func:`conflict_expected` (``exists``: a creation that is a look-up); an
        exception ``action_raised`` says the call's action raised (``with_workflow_lock``
        runs the workflow's steps: ``action failed``, the step's and run's spans carry
        the failure)."""
        attrs = (
            attributes
            if "db.operation.name" in attributes
            else {
                **attributes,
                "db.operation.name": operation,
            }
        )
        failed: dict[str, Any] | None = None
        started = time.perf_counter()
        # Started, made current and ended by hand rather than with the SDK's
        # start_as_current_span: its end (a processor's on_end) runs in a `finally` and
        # would replace the call's outcome with its own exception.
        span = self._start(operation, otel_trace.SpanKind.CLIENT, attrs)
        token = _enter(span)
        try:
            return await fn(*args, **kwargs)
        except BaseException as exc:
            failed = self._call_failed(span, exc, attrs, action_raised)
            raise
        finally:
            _leave(token)
            _end(span)
            # Recorded after the span has ended: inside it the SDK also offers each
            # measurement to the exemplar reservoir (measured: a call went from 95 to
            # 79 µs with an SDK on a loaded 2-core machine, against 39 µs for a bare span).
            try:
                self.duration.record(time.perf_counter() - started, failed or attrs)
            except Exception as error:
                _sdk_failed("recording a call's duration", error)

    def _start(self, name: str, kind: Any, attributes: Any, links: Sequence[Any] = ()) -> Any:
        """A started span, or ``None`` when the SDK failed to start one (a processor's
        ``on_start`` raised): the call goes on untraced, its storage calls the children of
        the span that was current."""
        try:
            return self.tracer.start_span(
                name, kind=kind, attributes=attributes, links=list(links) if links else None
            )
        except Exception as exc:
            _sdk_failed("starting a span", exc)
            return None

    def _call_failed(
        self,
        span: Any,
        exc: BaseException,
        attrs: Mapping[str, Any],
        action_raised: Callable[[BaseException], bool] | None,
    ) -> dict[str, Any] | None:
        """Note on ``span`` and in the counters how a storage call ended with ``exc``;
        the failed duration's attributes, or ``None`` when ``exc`` is an answer rather
        than a failure (:meth:`call`). Never raises: ``exc`` is what the caller gets."""
        try:
            if _is_signal(exc):
                _set_attribute(span, "siglo.outcome", "suspended")
                return None
            if isinstance(exc, CheckpointConflictError) and _CONFLICT_EXPECTED.get():
                _set_attribute(span, "siglo.outcome", "exists")
                return None
            if action_raised is not None and action_raised(exc):
                _set_attribute(span, "siglo.outcome", "action failed")
                return None
            if _held_elsewhere(exc):
                _set_attribute(span, "siglo.outcome", "held elsewhere")
                return None
        except Exception as error:
            _sdk_failed("recording a failed call", error)
            return None
        _record_failure(span, exc)
        kind = type(exc).__qualname__
        _set_attribute(span, "error.type", kind)
        try:
            if isinstance(exc, CheckpointConflictError):
                self.conflicts.add(1, attrs)
            else:
                self._count_timeout(exc, attrs)
        except Exception as error:
            _sdk_failed("counting a failed call", error)
        return {**attrs, "error.type": kind}

    def _count_timeout(self, exc: BaseException, attrs: Mapping[str, Any]) -> None:
        """Count ``exc`` under ``siglo.timeouts`` if it is a call that ran past its bound,
        once whichever layer sees it first (:data:`_COUNTED_MARK`)."""
        if not _timed_out(exc) or getattr(exc, _COUNTED_MARK, False):
            return
        self.timeouts.add(1, attrs)
        with suppress(Exception):  # an exception that takes no attributes: counted, unmarked
            setattr(exc, _COUNTED_MARK, True)

    def failure_observer(
        self, attributes: Mapping[str, Any]
    ) -> Callable[[str, BaseException], None]:
        """What a backend's lock and nonce store are given at connect
        (:attr:`siglo.coordination.LockBase.failure_observer`): called with each of their
        calls that raised (its operation's name, ``lock.acquire``, ``nonces.claim`` …,
        and the exception), it counts one that ran past its bound under
        ``siglo.timeouts`` with ``attributes`` (the backend's) and the operation's name.
        Those calls are not traced; their timeouts are counted all the same. Never
        raises."""
        per_operation: dict[str, dict[str, Any]] = {}

        def observe(operation: str, exc: BaseException) -> None:
            try:
                if not _timed_out(exc):
                    return
                attrs = per_operation.get(operation)
                if attrs is None:
                    attrs = per_operation[operation] = {
                        **attributes,
                        "db.operation.name": operation,
                    }
                self._count_timeout(exc, attrs)
            except Exception as error:
                _sdk_failed("counting a timeout", error)

        return observe

    @contextmanager
    def span(
        self, name: str, attributes: Mapping[str, Any], *, links_from: str | None = None
    ) -> Iterator[Any]:
        """An internal span (a workflow run or step), linked to the span whose W3C
        ``traceparent`` is ``links_from`` (the run that suspended this one). Yields the
        span, or ``None`` when the SDK failed to start it."""
        links = []
        if links_from:
            try:
                linked = _span_context(links_from)
                if linked is not None:
                    links.append(otel_trace.Link(linked, {"siglo.link": "suspended_by"}))
            except Exception as exc:
                _sdk_failed("reading a suspended run's traceparent", exc)
        span = self._start(name, otel_trace.SpanKind.INTERNAL, dict(attributes), links)
        token = _enter(span)
        try:
            yield span
        except BaseException as exc:
            try:
                if _is_signal(exc):
                    _set_attribute(span, "siglo.outcome", "suspended")
                elif _held_elsewhere(exc):
                    _set_attribute(span, "siglo.outcome", "held elsewhere")
                else:
                    _record_failure(span, exc)
            except Exception as error:
                _sdk_failed("recording a failed span", error)
            raise
        finally:
            _leave(token)
            _end(span)

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` of the current workflow run's span (else of the current
        span; ``None`` outside a recording one, or when the SDK fails to tell)."""
        assert TraceContextTextMapPropagator is not None
        assert otel_trace is not None
        carrier: dict[str, str] = {}
        try:
            run = _run_span.get()
            context = None if run is None else otel_trace.set_span_in_context(run)
            TraceContextTextMapPropagator().inject(carrier, context=context)
        except Exception as exc:
            _sdk_failed("reading the run's traceparent", exc)
            return None
        return carrier.get("traceparent")

    def lost_lease(self) -> None:
        """Count a lost workflow-lock lease."""
        try:
            self.lease_losses.add(1)
        except Exception as exc:
            _sdk_failed("counting a lost lease", exc)

    def retried(self, kind: str) -> None:
        """Count one retry of ``kind``."""
        try:
            self.retries.add(1, {"siglo.retry.kind": kind})
        except Exception as exc:
            _sdk_failed("counting a retry", exc)


def _sdk_failed(what: str, exc: BaseException) -> None:
    """An SDK component (or an exception's text) failed while siglo recorded telemetry:
    absorbed, so the call's outcome stays its own; logged the first time in the process
    only (a broken processor fails every span, and a log line per call would flood)."""
    global _sdk_failure_reported
    if _sdk_failure_reported:
        return
    _sdk_failure_reported = True
    # A logging handler's failure is no more the call's than the SDK's.
    with suppress(Exception):
        _log.warning(
            "OpenTelemetry failed %s (%s); siglo's calls go on as without it, their "
            "outcomes unchanged (further such failures in this process are not logged)",
            what,
            _described(exc),
        )


def _message(exc: BaseException) -> str:
    """``str(exc)`` with secrets masked, or the type's name when ``str()`` itself raises
    (a ``KeyError`` of an object whose ``repr`` fails: a detached ORM object)."""
    try:
        return scrub(str(exc))
    except Exception:
        return type(exc).__name__


def _described(exc: BaseException) -> str:
    message = _message(exc)
    name = type(exc).__name__
    return name if message == name else f"{name}: {message}"


def _enter(span: Any) -> Any:
    """Make ``span`` current (a token for :func:`_leave`); nothing for no span."""
    if span is None:
        return None
    try:
        return otel_context.attach(otel_trace.set_span_in_context(span))
    except Exception as exc:
        _sdk_failed("making a span current", exc)
        return None


def _leave(token: Any) -> None:
    if token is not None:
        try:
            otel_context.detach(token)
        except Exception as exc:
            _sdk_failed("restoring the current span", exc)


def _end(span: Any) -> None:
    """End ``span``: the SDK hands it to its processors (``on_end``), whose failure is
    theirs, not the call's."""
    if span is not None:
        try:
            span.end()
        except Exception as exc:
            _sdk_failed("ending a span", exc)


def _set_attribute(span: Any, key: str, value: Any) -> None:
    if span is not None:
        try:
            span.set_attribute(key, value)
        except Exception as exc:
            _sdk_failed("setting a span attribute", exc)


_CONFLICT_EXPECTED: ContextVar[bool] = ContextVar("siglo_conflict_expected", default=False)


@contextmanager
def conflict_expected() -> Iterator[None]:
    """Inside it, a storage call refused by compare-and-set is an answer, not a failure:
    ``flow.run`` creates a run with ``expected_revision=0`` as its look-up, and a
    conflict means the run is stored (run-or-continue). Its span carries
    ``siglo.outcome: exists``; no error status, conflict count or failed duration."""
    token = _CONFLICT_EXPECTED.set(True)
    try:
        yield
    finally:
        _CONFLICT_EXPECTED.reset(token)


_LOCK_HELD_EXPECTED: ContextVar[bool] = ContextVar("siglo_lock_held_expected", default=False)


@contextmanager
def lock_held_expected(expected: bool = True) -> Iterator[None]:
    """Inside it, a workflow lock held by another process is an answer, not a failure:
    ``siglo worker`` recovers a ``running`` run only if its lock is free, and a held one
    means the run is alive elsewhere (or its lease has not lapsed). Its spans carry
    ``siglo.outcome: held elsewhere``; no error status, ``error.type`` or failed
    duration. ``expected=False`` ends that for what runs inside (the run's own steps)."""
    token = _LOCK_HELD_EXPECTED.set(expected)
    try:
        yield
    finally:
        _LOCK_HELD_EXPECTED.reset(token)


def _held_elsewhere(exc: BaseException) -> bool:
    return isinstance(exc, LockNotAcquiredError) and _LOCK_HELD_EXPECTED.get()


def _is_signal(exc: BaseException) -> bool:
    """Whether ``exc`` is a signal rather than a failure: a run suspending to wait for
    an event (``WorkflowSuspended``, marked ``siglo_signal``) ends its spans without an
    error status, ``error.type`` or a failed duration."""
    return getattr(type(exc), "siglo_signal", False) is True


def _record_failure(span: Any, exc: BaseException) -> None:
    """What the SDK records of an exception that ends a span — its event (type, message,
    traceback) and the span's error status — with the secrets of URLs and options masked
    (:mod:`siglo.masking`): a driver's exception in the traceback may quote one. An
    exception whose ``str()`` raises is recorded under its type's name; any failure here
    is absorbed (:func:`_sdk_failed`): the exception goes on to the caller unchanged."""
    if span is None or isinstance(exc, GeneratorExit):
        return  # no span (the SDK failed to start it), or a generator closed: no failure
    assert otel_trace is not None
    kind = type(exc).__name__
    message = _message(exc)
    try:
        stacktrace = scrub("".join(traceback.format_exception(exc)))
    except Exception:
        stacktrace = kind
    attributes = {"exception.message": message, "exception.stacktrace": stacktrace}
    try:
        span.record_exception(exc, attributes=attributes)
    except Exception:
        # The SDK's record_exception formats str(exc) itself, before it takes ours: the
        # same event, made here from the text that could be formatted.
        try:
            module, name = type(exc).__module__, type(exc).__qualname__
            span.add_event(
                "exception",
                {
                    "exception.type": f"{module}.{name}" if module != "builtins" else name,
                    **attributes,
                    "exception.escaped": "False",
                },
            )
        except Exception as error:
            _sdk_failed("recording an exception", error)
    try:
        span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, f"{kind}: {message}"))
    except Exception as error:
        _sdk_failed("setting a span's status", error)


def _span_context(traceparent: str) -> Any:
    assert TraceContextTextMapPropagator is not None
    assert otel_trace is not None
    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    span_context = otel_trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def note_lease_lost(error: BaseException) -> None:
    """Count a lost lease (``LockLostError``) if anything listens."""
    telemetry = current()
    if telemetry is not None and isinstance(error, LockLostError):
        telemetry.lost_lease()  # never raises


def note_retry(kind: str) -> None:
    """Count one retry of ``kind`` if anything listens."""
    telemetry = current()
    if telemetry is not None:
        telemetry.retried(kind)


def workflow_span(
    name: str, attributes: Mapping[str, Any], *, run: bool = False
) -> AbstractContextManager[None]:
    """A workflow run's (``run``) or step's span when anything listens; nothing otherwise.

    A run's span is the one :func:`link_to_suspender` links, whichever storage call's span
    is current when the checkpoint is read."""
    telemetry = current()
    if telemetry is None:
        return _NOTHING  # one shared, reusable no-op: no generator per step
    return _workflow_span(telemetry, name, attributes, run)


_NOTHING: Final = nullcontext()


@contextmanager
def _workflow_span(
    telemetry: Telemetry, name: str, attributes: Mapping[str, Any], run: bool
) -> Iterator[None]:
    with telemetry.span(name, {k: v for k, v in attributes.items() if v is not None}) as span:
        if not run:
            yield
            return
        token = _run_span.set(span)
        try:
            yield
        finally:
            _run_span.reset(token)


def link_to_suspender(metadata: Mapping[str, Any]) -> None:
    """Link the current span to the span of the run that suspended this one (its
    ``traceparent`` in the checkpoint's metadata), if anything listens."""
    traceparent = metadata.get(TRACEPARENT_KEY)
    if not isinstance(traceparent, str) or current() is None:
        return
    try:
        linked = _span_context(traceparent)
        span = _run_span.get()
        if linked is not None and span is not None and span.is_recording():
            span.add_link(linked, {"siglo.link": "suspended_by"})
    except Exception as exc:
        _sdk_failed("linking a run to the run that suspended it", exc)


def note_run_id(run_id: str) -> None:
    """Name the run on the current run span (``siglo.run.id``), if anything listens: a
    delivery's span starts before its claim says which run it resumes."""
    if current() is None:
        return
    span = _run_span.get()
    try:
        if span is not None and span.is_recording():
            span.set_attribute("siglo.run.id", run_id)
    except Exception as exc:
        _sdk_failed("naming a run on its span", exc)


def suspending_traceparent() -> str | None:
    """The ``traceparent`` a suspending run leaves in its metadata (``None`` when nothing
    listens)."""
    telemetry = current()
    return None if telemetry is None else telemetry.traceparent()


def note_due_waits(due: Sequence[WaitRecord], now_ms: int) -> None:
    """Count the due waits a worker found, and how late each is, if anything listens."""
    telemetry = current()
    if telemetry is None or not due:
        return
    try:
        telemetry.due_waits.add(len(due))
        for record in due:
            if record.expires_at is not None:
                telemetry.lateness.record(max(0, now_ms - record.expires_at) / 1000)
    except Exception as exc:
        _sdk_failed("counting due waits", exc)


def note_recovery(workflow_id: str | None) -> None:
    """Count a crashed run a worker took over, if anything listens."""
    telemetry = current()
    if telemetry is not None:
        try:
            telemetry.recoveries.add(1, {"siglo.workflow.name": workflow_id or ""})
        except Exception as exc:
            _sdk_failed("counting a recovery", exc)


def note_step_cache(result: str) -> None:
    """Count a step's cache look-up (``hit`` / ``miss``) and mark the step's span, if
    anything listens."""
    telemetry = current()
    if telemetry is None:
        return
    try:
        telemetry.step_cache.add(1, {"siglo.step.cache": result})
        span = otel_trace.get_current_span()
        if span.is_recording():
            span.set_attribute("siglo.step.cache", result)
    except Exception as exc:
        _sdk_failed("counting a step cache look-up", exc)
