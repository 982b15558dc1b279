"""siglo[otel]: a span and a timing per storage call with the OTel database conventions,
counted conflicts, nothing when no SDK listens (docs/observability.md)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import siglo
from siglo import StorageManager, telemetry
from siglo.errors import CheckpointConflictError, LockLostError
from siglo.locking import current_lease
from siglo.pipeline import PipelineAdapter, TracedPipelineAdapter
from siglo.workflow import Worker

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")


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
    assert [s.attributes["error.type"] for s in failed] == ["CheckpointConflictError"]


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


async def test_background_saves_show_in_the_queue_depth_gauge(sdk: Sdk) -> None:
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        stack = manager.create_stack("run-3")
        manager.checkpoint(stack)
        depth = sdk.metrics()["siglo.background.queue_depth"]
        assert sum(p.value for p in depth) >= 1
        await manager.flush()
    depth = sdk.metrics()["siglo.background.queue_depth"]
    assert sum(p.value for p in depth) == 0


async def test_the_worker_counts_due_waits_their_lateness_and_recoveries(sdk: Sdk) -> None:
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
    async with siglo.connect("memory://", clock=clock) as backend:
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


async def test_a_lost_lease_is_counted(sdk: Sdk, tmp_path: Path) -> None:
    pytest.importorskip("aiosqlite")
    url = f"sqlite:///{tmp_path / 'lease.db'}"
    async with siglo.connect(url, workflow_lock_ttl_ms=300) as backend:
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
