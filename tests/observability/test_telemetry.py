"""siglo[otel]: a span and a timing per storage call with the OTel database conventions,
counted conflicts, nothing when no SDK listens (docs/observability.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from _redis_helpers import require_redis
from _tcp_proxy import TcpProxy
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo import StorageManager, telemetry
from siglo.errors import CheckpointConflictError, LockLostError
from siglo.lease_release import releases_pending
from siglo.locking import current_lease
from siglo.pipeline import PipelineAdapter, TracedPipelineAdapter
from siglo.workflow import Worker
from siglo_postgres import drop_schema
from siglo_redis.connect import delete_prefix

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")
CHECKPOINT = siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)


class Sdk:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = sdk_trace.TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        telemetry.use(tracer_provider, self.meter_provider)

    def metrics(self) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found


@contextlib.asynccontextmanager
async def _isolated(name: str, tmp_path: Path, **options: Any) -> AsyncIterator[siglo.Backend]:
    """A real backend on private storage (a file, a schema, a key prefix), removed after."""
    schema = f"siglo_test_otel_{os.urandom(4).hex()}"
    prefix = f"siglo-test-otel-{os.urandom(4).hex()}:"
    if name == "memory":
        backend = siglo.connect("memory://", **options)
    elif name == "sqlite":
        pytest.importorskip("aiosqlite")
        backend = siglo.connect(f"sqlite:///{tmp_path / 'otel.db'}", **options)
    elif name == "postgres":
        require_postgres()
        backend = siglo.connect(POSTGRES_URL, schema=schema, **options)
    else:
        require_redis()
        backend = siglo.connect(REDIS_URL, prefix=prefix, **options)
    try:
        yield backend
    finally:
        await backend.aclose()
        if name == "postgres":
            await drop_schema(POSTGRES_URL, schema)
        elif name == "redis":
            await _cleanup(prefix)


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    made = Sdk()
    try:
        yield made
    finally:
        telemetry.use()


def test_without_an_sdk_connect_adds_nothing() -> None:
    telemetry.use()
    assert telemetry.current() is None
    backend = siglo.connect("memory://")
    assert not isinstance(backend.adapter, PipelineAdapter)
    assert backend.adapter is backend.raw_adapter


async def test_every_storage_call_is_a_client_span_with_db_attributes(sdk: Sdk) -> None:
    async with siglo.connect("memory://") as backend:
        assert isinstance(backend.adapter, TracedPipelineAdapter)
        manager = StorageManager(backend)
        stack = manager.create_stack("run-1", namespace="tenant-a")
        stack.set("pay", "card", "4111 1111 1111 1111")
        await manager.save(stack, expected_revision=0)
        assert await backend.adapter.get_checkpoint("run-1", "tenant-a") is not None
        assert await backend.adapter.get_cached_step("k") is siglo.MISSING
    spans = sdk.spans.get_finished_spans()
    names = [s.name for s in spans]
    assert "get_checkpoint" in names and "get_cached_step" in names
    (get,) = [s for s in spans if s.name == "get_checkpoint"]
    assert dict(get.attributes or {}) == {
        "db.system.name": "memory",
        "db.operation.name": "get_checkpoint",
    }
    assert get.kind.name == "CLIENT"
    assert all("4111" not in str(s.attributes) for s in spans)
    histogram = sdk.metrics()["db.client.operation.duration"]
    operations = {p.attributes["db.operation.name"] for p in histogram}
    assert {"get_checkpoint", "get_cached_step"} <= operations
    assert all(p.count >= 1 for p in histogram)


async def test_a_conflict_is_counted_and_marked_on_its_span(sdk: Sdk) -> None:
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        await manager.save(manager.create_stack("run-2"), expected_revision=0)
        cp = await backend.adapter.get_checkpoint("run-2")
        assert cp is not None
        with pytest.raises(CheckpointConflictError):
            # A second writer that read nothing: the stored revision 1 refuses it.
            await backend.adapter.save_checkpoint(cp, expected_revision=0)
    (conflicts,) = sdk.metrics()["siglo.checkpoint.conflicts"]
    assert conflicts.value == 1
    assert conflicts.attributes["db.operation.name"] == "save_checkpoint"
    failed = [s for s in sdk.spans.get_finished_spans() if s.status.status_code.name == "ERROR"]
    assert [(s.attributes or {})["error.type"] for s in failed] == ["CheckpointConflictError"]


async def test_a_url_password_never_reaches_an_attribute(sdk: Sdk) -> None:
    pytest.importorskip("redis")
    url = REDIS_URL.replace("redis://", "redis://default:s3cret-pw@", 1)
    if "@" in REDIS_URL:
        pytest.skip("the test Redis URL carries credentials of its own")
    backend = siglo.connect(url, prefix="siglo-otel-test:")
    try:
        # No call needs to reach the server: the attributes are decided at connect.
        assert isinstance(backend.adapter, TracedPipelineAdapter)
        attributes = backend.adapter.attributes
    finally:
        await backend.aclose()
    assert attributes["db.system.name"] == "redis"
    assert attributes["server.address"] == "127.0.0.1"
    assert "s3cret-pw" not in repr(attributes) and "default" not in repr(attributes)


def test_db_attributes_name_the_database_not_the_credentials() -> None:
    assert telemetry.db_attributes("postgres", "postgresql://app:pw@db.internal:5433/shop") == {
        "db.system.name": "postgresql",
        "server.address": "db.internal",
        "server.port": 5433,
        "db.namespace": "shop",
    }
    assert telemetry.db_attributes("sqlite", "sqlite:///var/app.db") == {
        "db.system.name": "sqlite",
        "db.namespace": "var/app.db",
    }
    assert telemetry.db_attributes("redis", "redis://:pw@h:6380/2")["db.namespace"] == "2"
    # ?db=N picks the database (redis-py): it wins over the path.
    assert telemetry.db_attributes("redis", "redis://h:6379?db=5")["db.namespace"] == "5"
    assert telemetry.db_attributes("redis", "redis://h:6379/1?db=5")["db.namespace"] == "5"
    # A socket has no host, and a Sentinel URL's hosts are the Sentinels, not the server
    # that answers: the db number alone.
    for url, db in (
        ("unix:///run/redis.sock?db=2", "2"),
        ("unix:///run/redis.sock", "0"),
        ("redis+sentinel://:pw@10.0.0.1:26379/mymaster/2", "2"),
        ("redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/0", "0"),
        ("rediss+sentinel://10.0.0.1:26379/mymaster", "0"),
    ):
        assert telemetry.db_attributes("redis", url) == {
            "db.system.name": "redis",
            "db.namespace": db,
        }, url


@pytest.mark.parametrize("backend_name", ["memory", "sqlite", "postgres", "redis"])
async def test_background_saves_show_in_the_queue_depth_gauge(
    sdk: Sdk, backend_name: str, tmp_path: Path
) -> None:
    async with _isolated(backend_name, tmp_path) as backend:
        manager = StorageManager(backend)
        stack = manager.create_stack("run-3")
        manager.checkpoint(stack)
        depth = sdk.metrics()["siglo.background.queue_depth"]
        assert sum(p.value for p in depth) >= 1
        await manager.flush()
    depth = sdk.metrics()["siglo.background.queue_depth"]
    assert sum(p.value for p in depth) == 0


# Redis takes no clock (its leases and deadlines run on the server's): the memory, SQLite
# and PostgreSQL backends run on the manual clock that puts the wait 2.5 s past due.
@pytest.mark.parametrize("backend_name", ["memory", "sqlite", "postgres"])
async def test_the_worker_counts_due_waits_their_lateness_and_recoveries(
    sdk: Sdk, backend_name: str, tmp_path: Path
) -> None:
    clock = siglo.ManualClock(1_000_000)

    async def remind(_: Any) -> Any:
        try:
            return await siglo.wait_for_event("remind:1", timeout_ms=1_000)
        except siglo.WaitTimeoutError:
            return "timed out"

    async def noop(value: Any) -> Any:
        return value

    reminders = siglo.flow(siglo.Step.create("remind", remind), name="reminders")
    jobs = siglo.flow(siglo.Step.create("noop", noop), name="jobs")
    async with _isolated(backend_name, tmp_path, clock=clock) as backend:
        manager = StorageManager(backend, clock=clock)
        with pytest.raises(siglo.WorkflowSuspended):
            await reminders.run(None, manager=manager, stack_id="r-1")
        # A run left running by a process that died (its lock is free).
        crashed = manager.create_stack(
            "j-1", workflow_id="jobs", metadata={"flowVersion": jobs.version}
        )
        await manager.save(crashed, expected_revision=0)
        manager.discard_stack(crashed)
        clock.advance(3_500)  # 2.5 s past the deadline
        done = await Worker(manager, [reminders, jobs]).run_once()
        assert (done.timers_fired, done.runs_recovered) == (1, 1)
    metrics = sdk.metrics()
    assert [p.value for p in metrics["siglo.waits.due"]] == [1]
    (lateness,) = metrics["siglo.wait.lateness"]
    assert (lateness.count, lateness.sum) == (1, 2.5)
    (recoveries,) = metrics["siglo.worker.recoveries"]
    assert recoveries.value == 1
    assert recoveries.attributes == {"siglo.workflow.name": "jobs"}


async def test_a_step_cache_hit_is_counted_and_marked_on_the_step(sdk: Sdk) -> None:
    async def price(order: Any) -> int:
        return 42

    pricing = siglo.flow(
        siglo.Step.create("price", price).cache(ttl_ms=60_000, key=lambda _: "p"), name="pricing"
    )
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        await pricing.run("a", manager=manager, stack_id="p-1")
        await pricing.run("a", manager=manager, stack_id="p-2")
    steps = [s for s in sdk.spans.get_finished_spans() if s.name == "step price"]
    assert [dict(s.attributes or {}).get("siglo.step.cache") for s in steps] == ["miss", "hit"]
    counted = {p.attributes["siglo.step.cache"]: p.value for p in sdk.metrics()["siglo.step.cache"]}
    assert counted == {"miss": 1, "hit": 1}


async def test_a_run_that_waits_for_its_event_is_not_an_error(sdk: Sdk) -> None:
    """Suspending on ``wait_for_event`` is control flow: no span it ends (the run, the
    step, the workflow lock) has an error status or ``error.type``, and no duration is
    recorded as failed; the spans say ``siglo.outcome: suspended``."""

    async def approve(_: Any) -> Any:
        return await siglo.wait_for_event("approve:1", timeout_ms=60_000)

    orders = siglo.flow(siglo.Step.create("approve", approve), name="orders")
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        with pytest.raises(siglo.WorkflowSuspended):
            await orders.run(None, manager=manager, stack_id="order-1")
        await orders.deliver("approve:1", "ada", manager=manager)
    spans = sdk.spans.get_finished_spans()
    suspended = {s.name for s in spans if (s.attributes or {}).get("siglo.outcome") == "suspended"}
    assert {"run orders", "step approve", "with_workflow_lock"} <= suspended
    for span in spans:
        assert span.status.status_code.name != "ERROR", (span.name, span.status)
        assert "error.type" not in (span.attributes or {}), span.name
        assert not span.events, (span.name, span.events)
    for point in sdk.metrics()["db.client.operation.duration"]:
        assert "error.type" not in point.attributes, point.attributes


async def test_a_delivery_claims_in_its_resume_span(sdk: Sdk) -> None:
    """``flow.deliver``'s claim of the wait is a child of its ``resume FLOW`` span, in
    the run's trace — not a trace of its own — and the span names the run it resumed."""

    async def approve(_: Any) -> Any:
        return await siglo.wait_for_event("approve:2", timeout_ms=60_000)

    orders = siglo.flow(siglo.Step.create("approve", approve), name="orders")
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        with pytest.raises(siglo.WorkflowSuspended):
            await orders.run(None, manager=manager, stack_id="order-2")
        sdk.spans.clear()
        await orders.deliver("approve:2", "ada", manager=manager)
    spans = sdk.spans.get_finished_spans()
    (resume,) = [s for s in spans if s.name == "resume orders"]
    (claim,) = [s for s in spans if s.name == "claim_wait_record"]
    assert claim.parent is not None and claim.parent.span_id == resume.context.span_id
    assert {s.context.trace_id for s in spans} == {resume.context.trace_id}
    assert dict(resume.attributes or {})["siglo.run.id"] == "order-2"
    assert dict(resume.attributes or {})["siglo.wait.correlation_key"] == "approve:2"


async def test_a_lost_lease_is_counted(sdk: Sdk, tmp_path: Path) -> None:
    pytest.importorskip("aiosqlite")
    url = f"sqlite:///{tmp_path / 'lease.db'}"
    # A lease long enough that the action takes it over before it lapses on a busy
    # machine (at 300 ms, the release below found it lapsed once); the keeper's next
    # renewal then finds another holder.
    async with siglo.connect(url, workflow_lock_ttl_ms=2_000) as backend:
        lock = backend.adapter.workflow_lock
        assert lock is not None

        async def action() -> None:
            lease = current_lease()
            assert lease is not None
            # Another holder takes the lock from under the action.
            assert await lock.release(lease.key, lease.token)
            assert (await lock.acquire(lease.key, 60_000)).acquired
            await asyncio.sleep(10)

        with pytest.raises(LockLostError):
            await backend.adapter.with_workflow_lock("s-1", action)
    (losses,) = sdk.metrics()["siglo.lock.lease_losses"]
    assert losses.value == 1


# -- metrics under real faults: a server that goes away or stalls, a lease that lapses ---


def _redis_through(proxy: Any, prefix: str, **options: Any) -> siglo.Backend:
    parts = urlsplit(REDIS_URL)
    return siglo.connect(f"redis://{proxy.url_host}{parts.path or '/0'}", prefix=prefix, **options)


def _retries(sdk: Sdk) -> dict[str, int]:
    return {
        p.attributes["siglo.retry.kind"]: p.value for p in sdk.metrics().get("siglo.retries", [])
    }


@pytest.fixture
def redis_proxy() -> Iterator[tuple[Any, str]]:
    require_redis()
    parts = urlsplit(REDIS_URL)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    try:
        yield proxy, f"siglo-test-otel-{os.urandom(4).hex()}:"
    finally:
        proxy.close()


async def _cleanup(prefix: str) -> None:
    async with siglo.connect(REDIS_URL, prefix=prefix) as other:
        await delete_prefix(other.adapter.client, prefix)  # type: ignore[attr-defined]


async def test_renewals_that_fail_are_retries_and_the_lapsed_lease_a_loss(
    sdk: Sdk, redis_proxy: tuple[Any, str]
) -> None:
    """The server goes away while an action holds a 600 ms lease: every failed renewal
    is a ``lease_renewal`` retry, and the lease that lapsed is one lease loss. The keeper
    gives up a tenth of the lease before it lapses; the release after it may be retried
    in that tenth (``lease_release``), never once the lease has lapsed."""
    proxy, prefix = redis_proxy
    holder = _redis_through(proxy, prefix, workflow_lock_ttl_ms=600, command_timeout_ms=200)
    try:
        await holder.adapter.save_checkpoint(CHECKPOINT)

        async def action() -> None:
            proxy.cut()
            await asyncio.sleep(5)

        with pytest.raises(LockLostError):
            await holder.adapter.with_workflow_lock("s", action)
        await asyncio.sleep(0.7)  # past the lapse, whenever the keeper gave up
        assert releases_pending(asyncio.get_running_loop()) == 0
        at_lapse = _retries(sdk).get("lease_release", 0)
        proxy.restore()
    finally:
        await holder.aclose()
    try:
        async with siglo.connect(REDIS_URL, prefix=prefix) as other:
            # Lapsed for real: another holder takes the lock at once.
            assert (await other.adapter.with_workflow_lock("s", _ran, timeout_ms=100)) == "ran"
    finally:
        await _cleanup(prefix)
    assert _retries(sdk).get("lease_renewal", 0) >= 1
    # The lapsed lease is not released again.
    assert _retries(sdk).get("lease_release", 0) == at_lapse
    (losses,) = sdk.metrics()["siglo.lock.lease_losses"]
    assert (losses.value, dict(losses.attributes or {})) == (1, {})


async def test_a_release_that_fails_is_retried_and_counted(
    sdk: Sdk, redis_proxy: tuple[Any, str]
) -> None:
    """The server goes away during the action: the release after it fails, and each
    background attempt until the server is back is a ``lease_release`` retry."""
    proxy, prefix = redis_proxy
    holder = _redis_through(proxy, prefix, workflow_lock_ttl_ms=20_000, command_timeout_ms=500)
    try:
        await holder.adapter.save_checkpoint(CHECKPOINT)

        async def action() -> str:
            proxy.cut()
            return "done"

        assert await holder.adapter.with_workflow_lock("s", action) == "done"
        assert releases_pending(asyncio.get_running_loop()) >= 1
        assert "lease_release" not in _retries(sdk)  # the first attempt is no retry
        await asyncio.sleep(0.3)  # a few attempts against a server that is away
        proxy.restore()
        for _ in range(100):
            if releases_pending(asyncio.get_running_loop()) == 0:
                break
            await asyncio.sleep(0.05)
        assert releases_pending(asyncio.get_running_loop()) == 0
    finally:
        await holder.aclose()
    try:
        async with siglo.connect(REDIS_URL, prefix=prefix) as other:
            assert (await other.adapter.with_workflow_lock("s", _ran, timeout_ms=100)) == "ran"
    finally:
        await _cleanup(prefix)
    retries = _retries(sdk)
    assert retries.get("lease_release", 0) >= 2
    assert "lease_renewal" not in retries


async def test_a_call_past_command_timeout_is_counted_with_its_attributes(
    sdk: Sdk, redis_proxy: tuple[Any, str]
) -> None:
    """The server stalls (the proxy stops forwarding): the load runs past
    ``command_timeout_ms``, is counted once under ``siglo.timeouts`` with the database
    attributes, and timed with its ``error.type``."""
    proxy, prefix = redis_proxy
    holder = _redis_through(proxy, prefix, command_timeout_ms=300)
    try:
        await holder.adapter.save_checkpoint(CHECKPOINT)
        proxy.freeze()
        with pytest.raises(siglo.StorageAdapterError) as raised:
            await holder.adapter.get_checkpoint("s")
        proxy.restore()
    finally:
        proxy.cut()  # the stalled connection: closed, not drained
        await holder.aclose()
        await _cleanup(prefix)
    metrics = sdk.metrics()
    (timeouts,) = metrics["siglo.timeouts"]
    assert timeouts.value == 1
    assert dict(timeouts.attributes or {}) == {
        "db.system.name": "redis",
        "db.operation.name": "get_checkpoint",
        "db.namespace": "0",
        "server.address": "127.0.0.1",
        "server.port": proxy.port,
    }
    failed = [
        p
        for p in metrics["db.client.operation.duration"]
        if p.attributes["db.operation.name"] == "get_checkpoint"
    ]
    assert [(p.attributes or {}).get("error.type") for p in failed] == [
        type(raised.value).__qualname__
    ]
    assert failed[0].sum >= 0.3


@pytest.mark.parametrize("backend_name", ["sqlite", "postgres", "redis"])
async def test_a_conflict_on_a_real_backend_is_counted(
    sdk: Sdk, backend_name: str, tmp_path: Path
) -> None:
    """Two writers of one run on a real server: the second save at the same revision is
    refused by compare-and-set and counted with the backend's attributes."""
    async with _isolated(backend_name, tmp_path) as backend:
        await backend.adapter.save_checkpoint(CHECKPOINT, expected_revision=0)
        with pytest.raises(CheckpointConflictError):
            await backend.adapter.save_checkpoint(CHECKPOINT, expected_revision=0)
    (conflicts,) = sdk.metrics()["siglo.checkpoint.conflicts"]
    assert conflicts.value == 1
    system = {"sqlite": "sqlite", "postgres": "postgresql", "redis": "redis"}[backend_name]
    assert conflicts.attributes["db.system.name"] == system
    assert conflicts.attributes["db.operation.name"] == "save_checkpoint"


async def _ran() -> str:
    return "ran"


async def test_a_failed_calls_span_never_records_a_urls_secret(sdk: Sdk) -> None:
    """redis-py's "no master found" quotes its Sentinel clients' ``password=…``: the span
    of the failed call records the exception — its message, its traceback (the driver's
    exception is the cause) and the span's status — with the secret masked."""
    require_redis()
    from ports import free_port

    secret = "otel-Sentinel-Sekr3t-5d1"
    port = free_port(30400, 30500)  # no Sentinel answers here
    url = f"redis+sentinel://127.0.0.1:{port}/mymaster?sentinel_password={secret}"
    async with siglo.connect(url, command_timeout_ms=10_000) as backend:
        with pytest.raises(siglo.StorageAdapterError):
            await backend.adapter.get_checkpoint("s")
    spans = [s for s in sdk.spans.get_finished_spans() if s.name == "get_checkpoint"]
    assert spans
    for span in spans:
        events = [dict(e.attributes or {}) for e in span.events if e.name == "exception"]
        assert events and "MasterNotFoundError" in events[0]["exception.stacktrace"]
        recorded = repr(events) + (span.status.description or "")
        assert secret not in recorded and "***" in recorded


@pytest.mark.parametrize("backend_name", ["sqlite", "postgres"])
async def test_a_sql_call_past_command_timeout_is_counted(
    sdk: Sdk, backend_name: str, tmp_path: Path
) -> None:
    """Another session holds the checkpoints table: the save runs past
    ``command_timeout_ms`` and is counted under ``siglo.timeouts``, as on Redis — the
    SQL drivers raise no ``TimeoutError`` (PostgreSQL cancels the statement, SQLite
    reports its lock busy)."""
    async with _isolated(backend_name, tmp_path, command_timeout_ms=1_500) as backend:
        await backend.adapter.save_checkpoint(CHECKPOINT)
        raw: Any = backend.raw_adapter
        if backend_name == "sqlite":
            import sqlite3

            other = sqlite3.connect(tmp_path / "otel.db", isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            release: Any = other.close
        else:
            import psycopg

            other_pg = await psycopg.AsyncConnection.connect(POSTGRES_URL)
            await other_pg.execute(
                f'LOCK TABLE "{raw.schema}".{raw.table_prefix}checkpoints IN ACCESS EXCLUSIVE MODE'
            )
            release = other_pg.close
        try:
            with pytest.raises(siglo.StorageAdapterError, match="timed out") as raised:
                await backend.adapter.save_checkpoint(CHECKPOINT.replace(revision=2))
            assert getattr(raised.value, "timed_out", False) is True
        finally:
            done = release()
            if asyncio.iscoroutine(done):
                await done
    (timeouts,) = sdk.metrics()["siglo.timeouts"]
    assert timeouts.value == 1
    assert timeouts.attributes["db.operation.name"] == "save_checkpoint"


async def test_a_lost_lease_is_not_a_timeout(sdk: Sdk, redis_proxy: tuple[Any, str]) -> None:
    """The server stalls while an action holds its lease: the renewals time out and the
    lease is lost — ``siglo.lock.lease_losses``. The ``with_workflow_lock`` call did not
    run past ``command_timeout_ms`` (its renewals did), so ``siglo.timeouts`` does not
    count it."""
    proxy, prefix = redis_proxy
    holder = _redis_through(proxy, prefix, workflow_lock_ttl_ms=600, command_timeout_ms=200)
    try:
        await holder.adapter.save_checkpoint(CHECKPOINT)

        async def action() -> None:
            proxy.freeze()
            await asyncio.sleep(5)

        with pytest.raises(LockLostError) as lost:
            await holder.adapter.with_workflow_lock("s", action)
        proxy.restore()
    finally:
        proxy.cut()
        await holder.aclose()
        await _cleanup(prefix)
    seen: BaseException | None = lost.value
    chain = []
    while seen is not None:
        chain.append(type(seen))
        seen = seen.__cause__ or seen.__context__
    assert TimeoutError in chain or any(issubclass(t, TimeoutError) for t in chain), chain
    metrics = sdk.metrics()
    assert [p.value for p in metrics["siglo.lock.lease_losses"]] == [1]
    assert [
        p
        for p in metrics.get("siglo.timeouts", [])
        if p.attributes["db.operation.name"] == "with_workflow_lock"
    ] == []


async def test_running_a_stored_run_again_is_no_failure(sdk: Sdk) -> None:
    """Run-or-continue: ``flow.run`` of a stored id creates with ``expected_revision=0``
    as its look-up, and the conflict means "stored": its span says ``exists``, with no
    error status, no conflict counted and no failed duration."""

    async def one(x: int) -> int:
        return x + 1

    f = siglo.flow(siglo.Step.create("one", one), name="again")
    async with siglo.connect("memory://") as backend:
        assert await f.run(1, manager=StorageManager(backend), stack_id="r1") == 2
        sdk.spans.clear()
        assert await f.run(1, manager=StorageManager(backend), stack_id="r1") == 2
    looked_up = [s for s in sdk.spans.get_finished_spans() if s.name == "save_checkpoint"]
    assert looked_up and all(s.attributes.get("siglo.outcome") == "exists" for s in looked_up)
    assert all(s.status.is_ok for s in sdk.spans.get_finished_spans())
    metrics = sdk.metrics()
    assert "siglo.checkpoint.conflicts" not in metrics
    assert not [p for p in metrics["db.client.operation.duration"] if "error.type" in p.attributes]


async def test_a_step_that_raises_is_no_failure_of_the_lock(sdk: Sdk) -> None:
    """``with_workflow_lock`` spans the run's steps: a step's exception ends it as the
    action's outcome (``siglo.outcome: action failed``), not as a failed storage call —
    the step's and the run's spans carry the failure."""

    async def boom(_: Any) -> Any:
        raise ValueError("the step's own")

    f = siglo.flow(siglo.Step.create("boom", boom), name="failing")
    async with siglo.connect("memory://") as backend:
        with pytest.raises(ValueError, match="the step's own"):
            await f.run(1, manager=StorageManager(backend), stack_id="r1")
    spans = {s.name: s for s in sdk.spans.get_finished_spans()}
    lock = spans["with_workflow_lock"]
    assert lock.status.is_ok and lock.attributes.get("siglo.outcome") == "action failed"
    assert "error.type" not in lock.attributes
    assert not spans["step boom"].status.is_ok and not spans["run failing"].status.is_ok
    durations = sdk.metrics()["db.client.operation.duration"]
    assert not [p for p in durations if "error.type" in p.attributes]


async def test_a_worker_pass_over_a_run_alive_elsewhere_is_no_failure(sdk: Sdk) -> None:
    """``siglo worker`` takes up a ``running`` run only if its workflow lock is free; a
    held lock is the run alive in another process. Each pass over such a run ended its
    ``recover`` and ``with_workflow_lock`` spans with an error and recorded a failed
    duration (a black-box auditor): they now say ``siglo.outcome: held elsewhere``. A
    lock a recovered run's own step cannot take is still a failure."""
    release = asyncio.Event()

    async def slow(_: Any) -> Any:
        await release.wait()
        return "done"

    f = siglo.flow(siglo.Step.create("slow", slow), name="livef")
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        running = asyncio.create_task(f.run(None, manager=manager, stack_id="live-1"))
        for _ in range(200):
            stored = await backend.adapter.get_checkpoint("live-1")
            if stored is not None and stored.status == "running":
                break
            await asyncio.sleep(0.01)
        sdk.spans.clear()
        with pytest.raises(siglo.errors.LockNotAcquiredError):
            await f.recover("live-1", manager=manager)
        release.set()
        assert await running == "done"
    finished = sdk.spans.get_finished_spans()
    (recover,) = [s for s in finished if s.name == "recover livef"]
    (lock_span,) = [
        s
        for s in finished
        if s.name == "with_workflow_lock"
        and s.parent is not None
        and s.parent.span_id == recover.context.span_id
    ]
    for span in (recover, lock_span):
        assert span.status.is_ok, (span.name, span.status)
        assert span.attributes.get("siglo.outcome") == "held elsewhere", span.name
        assert "error.type" not in span.attributes and not span.events, span.name
    assert all(s.status.is_ok for s in finished), [(s.name, s.status) for s in finished]
    durations = sdk.metrics()["db.client.operation.duration"]
    assert not [p for p in durations if "error.type" in p.attributes]

    # Outside a worker's recovery, a held lock is the caller's failure, as before.
    async with siglo.connect("memory://") as backend:
        holding, done = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            holding.set()
            await done.wait()

        async def nothing() -> None:
            return None

        holder = asyncio.create_task(backend.adapter.with_workflow_lock("x", hold))
        await holding.wait()
        sdk.spans.clear()
        with pytest.raises(siglo.errors.LockNotAcquiredError):
            await backend.adapter.with_workflow_lock("x", nothing, timeout_ms=1)
        failed_spans = [s for s in sdk.spans.get_finished_spans() if s.name == "with_workflow_lock"]
        done.set()
        await holder
    (failed,) = failed_spans
    assert not failed.status.is_ok and failed.attributes.get("error.type") == (
        "LockNotAcquiredError"
    )


async def test_a_finished_run_read_again_links_to_no_suspension(sdk: Sdk) -> None:
    """The ``suspended_by`` link is the resuming run's. A run that suspended once and
    then completed kept linking every later ``run`` (its stored output read) to that old
    suspension (a black-box auditor); the resume still links."""

    async def approve(_: Any) -> Any:
        return await siglo.wait_for_event("approve:9", timeout_ms=60_000)

    orders = siglo.flow(siglo.Step.create("approve", approve), name="linked")
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        with pytest.raises(siglo.WorkflowSuspended):
            await orders.run(None, manager=manager, stack_id="order-9")
        sdk.spans.clear()
        await orders.deliver("approve:9", "ada", manager=manager)
        resumed = [s for s in sdk.spans.get_finished_spans() if s.name == "resume linked"]
        assert [dict(link.attributes or {}) for link in resumed[0].links] == [
            {"siglo.link": "suspended_by"}
        ]
        sdk.spans.clear()
        assert await orders.run(None, manager=manager, stack_id="order-9") == "ada"
    (again,) = [s for s in sdk.spans.get_finished_spans() if s.name == "run linked"]
    assert list(again.links) == []


def test_a_postgres_server_named_in_the_query_is_the_server_address() -> None:
    """libpq's URL may name its server in the query: ``server.address`` and
    ``server.port`` were missing then (a black-box auditor); a socket directory or a
    host list names no single server."""
    assert telemetry.db_attributes(
        "postgres", "postgresql:///shop?host=db.internal&port=5433&user=app"
    ) == {
        "db.system.name": "postgresql",
        "server.address": "db.internal",
        "server.port": 5433,
        "db.namespace": "shop",
    }
    for url in ("postgresql:///shop?host=/var/run/postgresql", "postgresql:///shop?host=a,b"):
        assert "server.address" not in telemetry.db_attributes("postgres", url), url


def _changes_per_parent(sdk: Sdk) -> dict[str, int]:
    spans = sdk.spans.get_finished_spans()
    names = {s.context.span_id: s.name for s in spans}
    found: dict[str, int] = {}
    for span in spans:
        if span.name == "on_context_change":
            parent = names.get(span.parent.span_id, "<none>") if span.parent else "<none>"
            found[parent] = found.get(parent, 0) + 1
    return found


@pytest.mark.parametrize("name", ["memory", "sqlite", "redis"])
async def test_a_streamed_change_is_in_the_trace_of_the_request_that_made_it(
    sdk: Sdk, name: str, tmp_path: Path
) -> None:
    """A context change is streamed by a job deferred to the loop's next turn; every job
    deferred in one turn started in the context of the first caller that deferred one,
    so another request's (another tenant's) change was recorded in that caller's trace
    (a black-box auditor). Each job now runs in its own caller's context."""
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(sdk.spans))
    tracer = provider.get_tracer("app")
    async with _isolated(name, tmp_path) as backend:
        manager = StorageManager(backend)

        async def request(n: int) -> None:
            with tracer.start_as_current_span(f"request-{n}"):
                stack = manager.create_stack(f"a-{n}", namespace=f"tenant-{n}")
                for j in range(5):
                    stack.set("step", f"k{j}", j)
                    await asyncio.sleep(0.005)

        await asyncio.gather(*(request(n) for n in range(4)))
        await manager.flush()
    assert _changes_per_parent(sdk) == {f"request-{n}": 5 for n in range(4)}


def test_a_streamed_change_through_sync_threads_is_in_its_threads_trace(sdk: Sdk) -> None:
    """The same through :mod:`siglo.sync`, four threads changing their stacks at once."""
    import threading

    from siglo import sync

    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(sdk.spans))
    tracer = provider.get_tracer("app")
    with sync.connect("memory://") as backend:
        manager = sync.StorageManager(backend)
        barrier = threading.Barrier(4)

        def request(n: int) -> None:
            with tracer.start_as_current_span(f"request-{n}"):
                stack = manager.create_stack(f"s-{n}", namespace=f"tenant-{n}")
                barrier.wait()
                for j in range(5):
                    stack.set("step", f"k{j}", j)

        threads = [threading.Thread(target=request, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        manager.flush()
    assert _changes_per_parent(sdk) == {f"request-{n}": 5 for n in range(4)}


# -- where a cached step's look-up is, what times out off the tracing stage, a backend's
# own calls ---------------------------------------------------------------------------


async def _take(order: Any) -> str:
    return f"took {order}"


async def test_a_cached_steps_look_up_started_ahead_is_beside_its_step(sdk: Sdk) -> None:
    """docs/observability.md: a cached step that follows a step run in the same pass has
    its look-up started ahead, beside the previous step's checkpoint save — a sibling of
    its step's span under ``with_workflow_lock`` — and inside its span otherwise (the
    pass's first step; after a step that stored a cache entry)."""

    async def reserve(order: Any) -> Any:
        return order

    cached = siglo.Step.create("take", _take).cache(ttl_ms=60_000, key=lambda o: f"take:{o}")
    ahead = siglo.flow(siglo.Step.create("reserve", reserve), cached, name="ahead")
    packing = siglo.Step.create("pack", _take).cache(ttl_ms=60_000, key=lambda o: f"pack:{o}")
    inside = siglo.flow(cached, packing, name="inside")
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        await ahead.run(7, manager=manager, stack_id="r-ahead")
        ran = len(sdk.spans.get_finished_spans())
        await inside.run(8, manager=manager, stack_id="r-inside")
    spans = sdk.spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    def parent(span: Any) -> Any:
        return by_id[span.parent.span_id]

    first, second = spans[:ran], spans[ran:]
    (lookup,) = [s for s in first if s.name == "get_cached_step"]
    (take,) = [s for s in first if s.name == "step take"]
    (reserve_step,) = [s for s in first if s.name == "step reserve"]
    (lock,) = [s for s in first if s.name == "with_workflow_lock"]
    (reserve_save,) = [
        s
        for s in first
        if s.name.startswith("save_checkpoint")
        and s.start_time >= reserve_step.end_time
        and s.end_time <= take.start_time
    ]
    assert parent(lookup) is lock and parent(take) is lock and parent(reserve_save) is lock
    # Sent once the previous step ran. (Its span begins when its task first runs: on the
    # memory backend, whose save does not wait, after `step take` began — still not in it.)
    assert lookup.start_time >= reserve_step.end_time
    assert dict(take.attributes or {})["siglo.step.cache"] == "miss"
    assert [s.name for s in first if s.parent and s.parent.span_id == take.context.span_id] == [
        "on_cache_event"  # the record of the look-up's result is made in the step
    ]

    # The pass's first step looks up inside its span; so does a step after one that
    # stored a cache entry (the look-up waits for that save).
    lookups = [s for s in second if s.name == "get_cached_step"]
    assert sorted(parent(s).name for s in lookups) == ["step pack", "step take"]


@pytest.mark.parametrize("backend_name", ["sqlite", "postgres"])
async def test_a_nonce_or_lock_call_past_command_timeout_is_counted(
    sdk: Sdk, backend_name: str, tmp_path: Path
) -> None:
    """The backend's ``nonces`` and ``lock`` are not traced, but a call of theirs past
    ``command_timeout_ms`` is counted under ``siglo.timeouts`` like a traced call's, with
    the backend's attributes and the operation's name — once (``with_lock`` acquires)."""
    async with _isolated(backend_name, tmp_path) as made:
        assert await made.require_nonces().claim("warm-up", 60)  # the tables, made unhurried
        # The same store, its calls bounded to 300 ms.
        async with siglo.connect(made.url, command_timeout_ms=300) as backend:
            await _time_out_a_nonce_and_a_lock(backend, backend_name, tmp_path)
    counted = {
        p.attributes["db.operation.name"]: (p.value, dict(p.attributes))
        for p in sdk.metrics()["siglo.timeouts"]
    }
    assert set(counted) == {"nonces.claim", "lock.acquire"}
    system = {"sqlite": "sqlite", "postgres": "postgresql"}[backend_name]
    for operation, (value, attributes) in counted.items():
        assert value == 1, operation
        assert attributes["db.system.name"] == system
        assert "db.namespace" in attributes


async def _time_out_a_nonce_and_a_lock(
    backend: siglo.Backend, backend_name: str, tmp_path: Path
) -> None:
    """A nonce claim and a ``with_lock`` while another session holds what they write."""
    nonces, lock = backend.require_nonces(), backend.require_lock()
    raw: Any = backend.raw_adapter
    if backend_name == "sqlite":
        import sqlite3

        other = sqlite3.connect(tmp_path / "otel.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        release: Any = other.close
    else:
        import psycopg

        other_pg = await psycopg.AsyncConnection.connect(POSTGRES_URL)
        for table in ("nonces", "locks"):
            await other_pg.execute(
                f'LOCK TABLE "{raw.schema}".{raw.table_prefix}{table} IN ACCESS EXCLUSIVE MODE'
            )
        release = other_pg.close
    try:
        with pytest.raises(siglo.StorageAdapterError) as claim:
            await nonces.claim("n-1", 60)
        with pytest.raises(siglo.StorageAdapterError) as locked:
            await lock.with_lock("k-1", _ran)
    finally:
        done = release()
        if asyncio.iscoroutine(done):
            await done
    assert claim.value.timed_out and locked.value.timed_out


async def test_a_backends_own_call_through_the_pipeline_is_traced(sdk: Sdk, tmp_path: Path) -> None:
    """``siglo clean`` calls ``backend.adapter.clean_expired()``, the SQL backends' own
    method, past the pipeline's contract calls: a span and a duration named by it, with
    the backend's attributes; what is not a coroutine method is handed on as it is."""
    async with _isolated("sqlite", tmp_path) as backend:
        clean = backend.adapter.clean_expired  # type: ignore[attr-defined]
        assert asyncio.iscoroutinefunction(clean)
        counts = await clean()
        assert counts["checkpoints"] == 0
        raw: Any = backend.raw_adapter
        assert backend.adapter.table_prefix == raw.table_prefix  # type: ignore[attr-defined]
    (span,) = [s for s in sdk.spans.get_finished_spans() if s.name == "clean_expired"]
    assert span.kind.name == "CLIENT"
    attributes = dict(span.attributes or {})
    assert attributes["db.system.name"] == "sqlite"
    assert attributes["db.operation.name"] == "clean_expired"
    timed = [
        p
        for p in sdk.metrics()["db.client.operation.duration"]
        if p.attributes["db.operation.name"] == "clean_expired"
    ]
    assert [p.count for p in timed] == [1]
