"""Telemetry never changes what a call raises or returns (docs/observability.md): an
exception whose text cannot be made, and an SDK span processor that raises, cost a
span's details at most — the call's outcome is the one it has without an SDK."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import siglo
from siglo import StorageManager, telemetry

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)


class Detached:
    """An object whose ``repr`` raises, as an ORM object detached from its session's."""

    def __repr__(self) -> str:
        raise RuntimeError("instance is not bound to a session")


async def _lookup(order: Any) -> Any:
    raise KeyError(Detached())  # str(KeyError(x)) is repr(x): it raises


async def _double(n: int) -> int:
    return n * 2


async def _refuse(n: int) -> int:
    raise ValueError(f"order {n} refused")


class Failing(sdk_trace.SpanProcessor):  # type: ignore[misc]
    """A span processor of the application's that raises where it is told of a span."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "on_start":
            raise RuntimeError("enrichment processor failed")

    def on_end(self, span: Any) -> None:
        if self.where == "on_end":
            raise RuntimeError("enrichment processor failed")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry.use(provider)
    try:
        yield spans
    finally:
        telemetry.use()


async def _outcome(flow: Any) -> tuple[str, str]:
    """What ``flow.run`` raised and the status stored for the run."""
    async with siglo.connect("memory://") as backend:
        manager = StorageManager(backend)
        try:
            await flow.run(1, manager=manager, stack_id="r-1")
        except Exception as exc:  # whichever it is: the test compares them
            raised = type(exc).__name__
        else:
            raised = "nothing"
        stored = await manager.load_checkpoint("r-1")
        assert stored is not None
        return raised, stored.status


async def test_an_exception_whose_text_fails_is_raised_as_without_an_sdk(
    exporter: InMemorySpanExporter,
) -> None:
    """A step raising ``KeyError(obj)`` whose ``repr`` fails: with an SDK the run raises
    that ``KeyError`` and stores the run failed, as without one (it raised the SDK's
    ``RuntimeError``); the step's span records the failure under the type's name."""
    lookups = siglo.flow(siglo.Step.create("lookup", _lookup), name="lookups")
    with_sdk = await _outcome(lookups)
    telemetry.use()
    without = await _outcome(lookups)
    assert with_sdk == without == ("KeyError", "failed")
    (step,) = [s for s in exporter.get_finished_spans() if s.name == "step lookup"]
    (event,) = [e for e in step.events if e.name == "exception"]
    attributes = dict(event.attributes or {})
    assert attributes["exception.type"] == "KeyError"
    assert attributes["exception.message"] == "KeyError"
    assert "KeyError" in str(attributes["exception.stacktrace"])
    assert step.status.status_code.name == "ERROR"
    assert step.status.description == "KeyError: KeyError"


@pytest.mark.parametrize("where", ["on_start", "on_end"])
async def test_a_span_processor_that_raises_changes_no_outcome(
    where: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A processor raising in ``on_start`` or ``on_end``: a save that lands returns, a
    read returns what is stored, a run returns its output and a step's exception is the
    one its run raises; the durations are still recorded, and the failure is logged once."""
    # Logged once a process: this test starts from "not yet".
    monkeypatch.setattr(telemetry, "_sdk_failure_reported", False, raising=False)
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(Failing(where))
    reader = InMemoryMetricReader()
    telemetry.use(provider, MeterProvider(metric_readers=[reader]))
    doubling = siglo.flow(siglo.Step.create("double", _double), name="doubling")
    refusing = siglo.flow(siglo.Step.create("refuse", _refuse), name="refusing")
    try:
        with caplog.at_level(logging.WARNING, logger="siglo.telemetry"):
            async with siglo.connect("memory://") as backend:
                manager = StorageManager(backend, error_mode="strict")
                stack = manager.create_stack("s-1")
                stack.set("a", "b", 1)
                await manager.save(stack, expected_revision=0)
                stored = await backend.adapter.get_checkpoint("s-1")
                assert stored is not None and stored.revision == 1
                assert await doubling.run(21, manager=manager, stack_id="r-1") == 42
                with pytest.raises(ValueError, match="order 2 refused"):
                    await refusing.run(2, manager=manager, stack_id="r-2")
    finally:
        telemetry.use()
    data = reader.get_metrics_data()
    assert data is not None
    timed = {
        point.attributes["db.operation.name"]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "db.client.operation.duration"
        for point in metric.data.data_points
    }
    assert {"save_checkpoint", "get_checkpoint", "with_workflow_lock"} <= timed
    logged = [r for r in caplog.records if r.name == "siglo.telemetry"]
    assert len(logged) == 1
    assert "enrichment processor failed" in logged[0].getMessage()
