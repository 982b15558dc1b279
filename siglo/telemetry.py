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
"""

from __future__ import annotations

import os
import time
import traceback
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl, urlsplit

from siglo.errors import CheckpointConflictError, LockLostError, LockNotAcquiredError
from siglo.masking import scrub
from siglo.records import WaitRecord

try:  # the optional API (siglo[otel]); siglo works the same without it
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.metrics import _internal as _otel_metrics_internal
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised by the overhead benchmark's "absent" cell
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
        found = _cache[key] = Telemetry(tracer_provider, meter_provider)
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
        try:
            with self.tracer.start_as_current_span(
                operation,
                kind=otel_trace.SpanKind.CLIENT,
                attributes=attrs,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    return await fn(*args, **kwargs)
                except BaseException as exc:
                    if _is_signal(exc):
                        span.set_attribute("siglo.outcome", "suspended")
                        raise
                    if isinstance(exc, CheckpointConflictError) and _CONFLICT_EXPECTED.get():
                        span.set_attribute("siglo.outcome", "exists")
                        raise
                    if action_raised is not None and action_raised(exc):
                        span.set_attribute("siglo.outcome", "action failed")
                        raise
                    if _held_elsewhere(exc):
                        span.set_attribute("siglo.outcome", "held elsewhere")
                        raise
                    _record_failure(span, exc)
                    kind = type(exc).__qualname__
                    span.set_attribute("error.type", kind)
                    failed = {**attrs, "error.type": kind}
                    if isinstance(exc, CheckpointConflictError):
                        self.conflicts.add(1, attrs)
                    elif _timed_out(exc):
                        self.timeouts.add(1, attrs)
                    raise
        finally:
            # Recorded after the span has ended: inside it the SDK also offers each
            # measurement to the exemplar reservoir (measured: a call went from 95 to
            # 79 µs with an SDK on a loaded 2-core machine, against 39 µs for a bare span).
            self.duration.record(time.perf_counter() - started, failed or attrs)

    @contextmanager
    def span(
        self, name: str, attributes: Mapping[str, Any], *, links_from: str | None = None
    ) -> Iterator[Any]:
        """An internal span (a workflow run or step), linked to the span whose W3C
        ``traceparent`` is ``links_from`` (the run that suspended this one)."""
        links = []
        if links_from:
            linked = _span_context(links_from)
            if linked is not None:
                links.append(otel_trace.Link(linked, {"siglo.link": "suspended_by"}))
        with self.tracer.start_as_current_span(
            name,
            attributes=dict(attributes),
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                if _is_signal(exc):
                    span.set_attribute("siglo.outcome", "suspended")
                elif _held_elsewhere(exc):
                    span.set_attribute("siglo.outcome", "held elsewhere")
                else:
                    _record_failure(span, exc)
                raise

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` of the current workflow run's span (else of the current
        span; ``None`` outside a recording one)."""
        assert TraceContextTextMapPropagator is not None
        assert otel_trace is not None
        carrier: dict[str, str] = {}
        run = _run_span.get()
        context = None if run is None else otel_trace.set_span_in_context(run)
        TraceContextTextMapPropagator().inject(carrier, context=context)
        return carrier.get("traceparent")

    def lost_lease(self) -> None:
        self.lease_losses.add(1)

    def retried(self, kind: str) -> None:
        self.retries.add(1, {"siglo.retry.kind": kind})


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
    (:mod:`siglo.masking`): a driver's exception in the traceback may quote one."""
    if isinstance(exc, GeneratorExit):
        return  # a generator closed, not a failure
    assert otel_trace is not None
    message = scrub(str(exc))
    span.record_exception(
        exc,
        attributes={
            "exception.message": message,
            "exception.stacktrace": scrub("".join(traceback.format_exception(exc))),
        },
    )
    span.set_status(
        otel_trace.Status(otel_trace.StatusCode.ERROR, f"{type(exc).__name__}: {message}")
    )


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
        telemetry.lost_lease()


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
    linked = _span_context(traceparent)
    span = _run_span.get()
    if linked is not None and span is not None and span.is_recording():
        span.add_link(linked, {"siglo.link": "suspended_by"})


def note_run_id(run_id: str) -> None:
    """Name the run on the current run span (``siglo.run.id``), if anything listens: a
    delivery's span starts before its claim says which run it resumes."""
    if current() is None:
        return
    span = _run_span.get()
    if span is not None and span.is_recording():
        span.set_attribute("siglo.run.id", run_id)


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
    telemetry.due_waits.add(len(due))
    for record in due:
        if record.expires_at is not None:
            telemetry.lateness.record(max(0, now_ms - record.expires_at) / 1000)


def note_recovery(workflow_id: str | None) -> None:
    """Count a crashed run a worker took over, if anything listens."""
    telemetry = current()
    if telemetry is not None:
        telemetry.recoveries.add(1, {"siglo.workflow.name": workflow_id or ""})


def note_step_cache(result: str) -> None:
    """Count a step's cache look-up (``hit`` / ``miss``) and mark the step's span, if
    anything listens."""
    telemetry = current()
    if telemetry is None:
        return
    telemetry.step_cache.add(1, {"siglo.step.cache": result})
    span = otel_trace.get_current_span()
    if span.is_recording():
        span.set_attribute("siglo.step.cache", result)
