"""One process of the cross-process trace test (tests/observability/test_trace_export.py).

``python traced_flow.py URL SPANS_JSON start|deliver``: installs the OpenTelemetry SDK
with an in-memory exporter, runs the flow's part (``start`` runs until the run waits,
``deliver`` delivers the event and completes it), and writes every finished span as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import siglo
from siglo import Step, StorageManager, WorkflowSuspended, flow, wait_for_event

RUN_ID = "order-42"
KEY = "approve:order-42"


async def reserve(order: Any) -> dict[str, Any]:
    return {"order": order, "card": "4111 1111 1111 1111"}


async def approve(reserved: Any) -> Any:
    event = await wait_for_event(KEY)
    return {**reserved, "approved_by": event["by"]}


async def ship(approved: Any) -> str:
    return f"shipped {approved['order']}"


FLOW = flow(
    Step.create("reserve", reserve),
    Step.create("approve", approve),
    Step.create("ship", ship),
    name="orders",
)


async def main(url: str, part: str) -> dict[str, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    result: Any = None
    async with siglo.connect(url) as backend:
        manager = StorageManager(backend)
        if part == "start":
            try:
                await FLOW.run("o-42", manager=manager, stack_id=RUN_ID)
            except WorkflowSuspended:
                result = "suspended"
        else:
            result = await FLOW.deliver(KEY, {"by": "ops"}, manager=manager)
    spans = [
        {
            "name": s.name,
            "trace_id": f"{s.context.trace_id:032x}",
            "span_id": f"{s.context.span_id:016x}",
            "parent": None if s.parent is None else f"{s.parent.span_id:016x}",
            "kind": s.kind.name,
            "attributes": dict(s.attributes or {}),
            "links": [
                {
                    "trace_id": f"{link.context.trace_id:032x}",
                    "span_id": f"{link.context.span_id:016x}",
                    "attributes": dict(link.attributes or {}),
                }
                for link in s.links
            ],
        }
        for s in exporter.get_finished_spans()
    ]
    return {"result": result, "spans": spans}


if __name__ == "__main__":
    url, out, part = sys.argv[1:4]
    Path(out).write_text(json.dumps(asyncio.run(main(url, part))))
