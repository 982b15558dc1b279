"""What siglo[otel] costs, counted in instructions (docs/observability.md, "What it costs").

``python -m benchmarks.otel_callgrind [--backends memory,sqlite] [--conditions
absent,api,sdk] [--ops 200] [--warmup 50] [--repeat 2]`` runs, for each backend and
condition, ``--repeat`` child Python processes under ``valgrind --tool=callgrind``. Each
connects with :func:`siglo.connect` (the settings' pipeline in front of the backend's own
adapter, as an application gets it), makes ``warmup`` sequential compare-and-set saves
of a 1 KB checkpoint and ``warmup`` loads of it, then ``ops`` saves and ``ops`` loads.
The saves and the loads are each counted alone: the child marks their boundaries with a
call callgrind is told to dump its counts before (``--dump-before=getppid``), so the
interpreter's start, the imports, the connection and the warm-up, which differ between
conditions and are paid once per process, are not in the figures. Every thread's
instructions are counted (SQLite's driver thread too).

The conditions:

- ``absent``: ``opentelemetry`` cannot be imported at all in the child (its entry in
  ``sys.modules`` is ``None`` before siglo is imported), as without ``siglo[otel]``;
- ``api``: the API installed and no SDK configured;
- ``sdk``: the OpenTelemetry SDK recording every span (a simple processor handing each to
  an exporter that drops it: no thread, so the count repeats) and every metric (an
  in-memory reader), set globally before ``siglo.connect``.

With the hash seed fixed, two runs of a memory cell count the same to the instruction
(an SDK's cells within 0.1 %), whatever the machine's load. SQLite's do not quite: its
driver thread and the event loop take turns (valgrind runs one thread at a time, and when
a thread blocks depends on time), and what a run allocates before its counted stretch
varies, so a full garbage collection falls inside it or not: a run's saves then count
about 164,000 or 175,000 instructions each (the table shows each run). ``--freeze-gc``
(``gc.freeze()`` after the warm-up) takes what the process imported out of the
collector's reach, and the counts of the calls themselves remain. Each line is the
median count per operation over the runs, and its ratio to ``absent``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("memory", "sqlite")
CONDITIONS = ("absent", "api", "sdk")
_TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def _mark() -> None:
    """A boundary of a measured stretch: callgrind (``--dump-before=getppid``) writes the
    counts so far and starts again from zero. Nothing else in the child calls getppid."""
    os.getppid()


def _child(
    backend: str, condition: str, warmup: int, ops: int, tmp: str, freeze: bool = False
) -> None:
    """The measured process: set the condition up, connect, warm up, then ``ops`` saves
    and ``ops`` loads, each stretch between two marks."""
    if condition == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import fails
    elif condition == "sdk":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(Drop()))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))

    import siglo
    from benchmarks.payloads import SIZES, make_contexts, now_ms
    from siglo import telemetry
    from siglo.checkpoint import Checkpoint

    assert (vars(telemetry)["otel_trace"] is None) == (condition == "absent")
    assert (telemetry.current() is not None) == (condition == "sdk")
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp}/otel-callgrind.db"
    contexts = make_contexts(SIZES["1k"])

    async def run() -> None:
        async with siglo.connect(url) as connected:
            adapter = connected.adapter
            revision = 0

            async def saves(n: int) -> None:
                nonlocal revision
                for _ in range(n):
                    revision += 1
                    cp = Checkpoint(
                        stack_id="otel", revision=revision, timestamp=now_ms(), contexts=contexts
                    )
                    await adapter.save_checkpoint(cp, expected_revision=revision - 1)

            async def loads(n: int) -> None:
                for _ in range(n):
                    assert await adapter.get_checkpoint("otel") is not None

            await saves(warmup)
            await loads(warmup)
            if freeze:
                # Everything alive now (the imports among it) out of the collector's
                # reach: a full collection in the counted stretch then costs what the
                # stretch allocated, not what the process imported.
                gc.freeze()
            _mark()
            await saves(ops)
            _mark()
            await loads(ops)
            _mark()

    asyncio.run(run())


def count(
    backend: str, condition: str, warmup: int, ops: int, freeze: bool = False
) -> tuple[int, int]:
    """Instructions (callgrind's ``Ir``, every thread) of ``ops`` saves and of ``ops``
    loads on ``backend`` under ``condition``, in one child process after ``warmup`` of
    each."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--dump-before=getppid",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "benchmarks.otel_callgrind",
                "--child",
                f"{backend},{condition},{warmup},{ops},{int(freeze)},{tmp}",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{backend}/{condition} failed:\n{proc.stderr[-3000:]}")
        # One dump per mark (the stretch before it), numbered in order, and the rest at exit.
        dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != 3:
            raise RuntimeError(f"expected 3 dumps (one per mark), found {len(dumps)}")
        totals = []
        for dump in dumps:
            found = _TOTALS.search(dump.read_text())
            assert found is not None, f"callgrind wrote no summary in {dump}"
            totals.append(int(found.group(1)))
        return totals[1], totals[2]  # [0]: start, imports, connect and the warm-up


def measure(
    backend: str, condition: str, ops: int, warmup: int, repeat: int, freeze: bool = False
) -> list[tuple[float, float]]:
    """Instructions per save and per load, once per repetition (a process each)."""
    figures = []
    for _ in range(repeat):
        saves, loads = count(backend, condition, warmup, ops, freeze)
        figures.append((saves / ops, loads / ops))
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="gc.freeze() after the warm-up: count the calls without the collection of "
        "what the process imported",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        backend, condition, warmup, ops, freeze, tmp = args.child.split(",", 5)
        _child(backend, condition, int(warmup), int(ops), tmp, freeze == "1")
        return
    conditions = args.conditions.split(",")
    print("| backend | operation | condition | instructions per op (each run) | / absent |")
    print("|---|---|---|---:|---:|")
    for backend in args.backends.split(","):
        figures = {
            c: measure(backend, c, args.ops, args.warmup, args.repeat, args.freeze_gc)
            for c in conditions
        }
        for index, operation in enumerate(("save 1 KB", "load 1 KB")):
            base = (
                statistics.median(run[index] for run in figures["absent"])
                if "absent" in figures
                else None
            )
            for condition in conditions:
                runs = [run[index] for run in figures[condition]]
                value = statistics.median(runs)
                each = ", ".join(f"{r:,.0f}" for r in runs)
                ratio = f"{value / base:.4f}" if base else "–"
                print(f"| {backend} | {operation} | {condition} | {each} | {ratio} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
