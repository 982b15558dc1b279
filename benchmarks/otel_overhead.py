"""What siglo[otel] costs on sequential 1 KB saves and loads (docs/observability.md).

``python -m benchmarks.otel_overhead [--backends memory,sqlite,redis,postgres]
[--rounds 7] [--ops 400]`` times one stack's sequential compare-and-set saves and its
loads (1 KB), and runs of a three-step flow (``flow``: its run and step spans, and its
checkpoints), on each backend, under three conditions built exactly as :func:`siglo.connect`
builds them (the settings' pipeline in front of the backend's own adapter):

- ``absent``: as if ``opentelemetry-api`` were not installed (siglo's telemetry module
  sees no API);
- ``api``: the API installed and no SDK configured (the API's default providers);
- ``sdk``: the OpenTelemetry SDK recording every span (a batch processor handing them to
  an exporter that drops them, so the figure is siglo's and the SDK's, not an
  exporter's network) and every metric (an in-memory reader).

Rounds are interleaved: each is ten short passes over the three conditions, the order
turning every pass, and each cell reports the median per-operation time over the rounds,
with its range, and the ratio of each condition's median to ``absent``'s. Every backend
works on private data (its isolation factory: own key prefix, schema or file) and removes
it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import siglo
from benchmarks.payloads import SIZES, make_contexts, now_ms
from siglo import telemetry
from siglo.adapter import StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.config import current_settings
from siglo.pipeline import Pipeline, pipeline_adapter
from siglo.plugins import get_registry

URLS = {
    "memory": "memory://",
    "sqlite": "sqlite:///{tmp}/otel-overhead.db",
    "redis": os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "postgres": os.environ.get("SIGLO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
}
CONDITIONS = ("absent", "api", "sdk")
SLICES = 10


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _adapter(raw: StorageAdapter, condition: str, url: str, name: str) -> StorageAdapter:
    settings = current_settings()
    module = vars(telemetry)
    saved_api = module["otel_trace"]
    if condition == "absent":
        module["otel_trace"] = None  # what siglo.telemetry holds without the API
    try:
        pipeline = Pipeline(settings)
    finally:
        module["otel_trace"] = saved_api
    if condition == "sdk":
        assert pipeline.telemetry is not None
    else:
        assert pipeline.telemetry is None
    return pipeline_adapter(raw, pipeline, telemetry.db_attributes(name, url))


async def _time(
    adapter: StorageAdapter, stack: str, ops: int, contexts: Any, rev: int
) -> tuple[float, float, int]:
    started = time.perf_counter()
    for _ in range(ops):
        rev += 1
        cp = Checkpoint(stack_id=stack, revision=rev, timestamp=now_ms(), contexts=contexts)
        await adapter.save_checkpoint(cp, expected_revision=rev - 1)
    saved = time.perf_counter()
    for _ in range(ops):
        await adapter.get_checkpoint(stack)
    loaded = time.perf_counter()
    return (saved - started) / ops, (loaded - saved) / ops, rev


async def _step(value: Any) -> Any:
    return {"seen": value}


FLOW = siglo.flow(
    siglo.Step.create("a", _step),
    siglo.Step.create("b", _step),
    siglo.Step.create("c", _step),
    name="otel-overhead",
)


@contextmanager
def _condition(condition: str, sdk: tuple[Any, Any]) -> Iterator[None]:
    """While a flow runs: the workflow spans see what they would see under ``condition``."""
    module = vars(telemetry)
    saved_api = module["otel_trace"]
    if condition == "absent":
        module["otel_trace"] = None
    elif condition == "sdk":
        telemetry.use(*sdk)
    try:
        yield
    finally:
        module["otel_trace"] = saved_api
        telemetry.use()


async def _time_flows(
    manager: siglo.StorageManager, prefix: str, runs: int, first: int, condition: str, sdk: Any
) -> float:
    with _condition(condition, sdk):
        started = time.perf_counter()
        for n in range(first, first + runs):
            await FLOW.run(n, manager=manager, stack_id=f"{prefix}-{n}")
        return (time.perf_counter() - started) / runs


async def bench(name: str, url: str, rounds: int, ops: int) -> dict[str, dict[str, list[float]]]:
    spec = get_registry().for_url(url)
    isolated = spec.load_isolated()
    contexts = make_contexts(SIZES["1k"])
    sdk_tracer = TracerProvider()
    sdk_tracer.add_span_processor(BatchSpanProcessor(_Drop()))
    sdk_meter = MeterProvider(metric_readers=[InMemoryMetricReader()])
    results: dict[str, dict[str, list[float]]] = {
        c: {"save": [], "load": [], "flow": []} for c in CONDITIONS
    }
    context = isolated(url) if isolated is not None else siglo.connect(url)
    async with context as backend:
        raw = backend.raw_adapter
        adapters: dict[str, StorageAdapter] = {}
        for condition in CONDITIONS:
            if condition == "sdk":
                telemetry.use(sdk_tracer, sdk_meter)
            try:
                adapters[condition] = _adapter(raw, condition, url, name)
            finally:
                telemetry.use()
        managers = {c: siglo.StorageManager(adapters[c]) for c in CONDITIONS}
        flows = max(1, ops // 8)
        started_flows = dict.fromkeys(CONDITIONS, 0)
        revisions = dict.fromkeys(CONDITIONS, 0)
        # A warm-up round, not counted: connections, statement caches, the JIT-less
        # interpreter's first calls.
        for condition in CONDITIONS:
            *_, revisions[condition] = await _time(
                adapters[condition], f"otel-{condition}", ops // 4, contexts, 0
            )
        order = list(CONDITIONS)
        per_slice = max(1, ops // SLICES)
        flows_per_slice = max(1, flows // SLICES)
        for _ in range(rounds):
            # A round is SLICES short passes over the conditions, the order turning every
            # pass, so a burst of load from elsewhere on the machine falls on all alike.
            totals = {c: {"save": 0.0, "load": 0.0, "flow": 0.0} for c in CONDITIONS}
            for _slice in range(SLICES):
                for condition in order:
                    save, load, revisions[condition] = await _time(
                        adapters[condition],
                        f"otel-{condition}",
                        per_slice,
                        contexts,
                        revisions[condition],
                    )
                    flow = await _time_flows(
                        managers[condition],
                        f"flow-{condition}",
                        flows_per_slice,
                        started_flows[condition],
                        condition,
                        (sdk_tracer, sdk_meter),
                    )
                    started_flows[condition] += flows_per_slice
                    totals[condition]["save"] += save / SLICES
                    totals[condition]["load"] += load / SLICES
                    totals[condition]["flow"] += flow / SLICES
                order.append(order.pop(0))
                if _slice % 2:
                    order.reverse()
            for condition in CONDITIONS:
                for op, value in totals[condition].items():
                    results[condition][op].append(value)
    sdk_tracer.shutdown()
    sdk_meter.shutdown()
    return results


def report(name: str, results: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = []
    for op in ("save", "load", "flow"):
        base = statistics.median(results["absent"][op])
        for condition in CONDITIONS:
            runs = results[condition][op]
            med = statistics.median(runs)
            lines.append(
                f"| {name} | {op} | {condition} | {med * 1e6:.1f} µs "
                f"| {min(runs) * 1e6:.1f}–{max(runs) * 1e6:.1f} | {med / base:.3f} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="memory,sqlite,redis,postgres")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--tmp", default="/tmp")
    args = parser.parse_args(argv)
    print("| backend | op | condition | median per op | range over rounds | / absent |")
    print("|---|---|---|---|---|---|")
    for name in args.backends.split(","):
        url = URLS[name].format(tmp=args.tmp)
        try:
            results = asyncio.run(bench(name, url, args.rounds, args.ops))
        except Exception as exc:  # a server that is not there: say so, go on
            print(f"| {name} | skipped: {type(exc).__name__}: {exc} |")
            continue
        print("\n".join(report(name, results)), flush=True)


if __name__ == "__main__":
    main()
