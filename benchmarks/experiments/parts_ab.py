"""Measured siglo's 16 KB saves, loads and compare-and-sets in parts and whole, and raw-fast's.

``python -m benchmarks.experiments.parts_ab sqlite|postgres [ROUNDS [OPS]]``: three subjects
on the backend, in interleaved rounds (the order turns every round): siglo with its default
``incremental_min_bytes`` (16,384: the benchmark's 16 KB document, 16,387 bytes encoded, is
stored in parts), siglo with ``incremental_min_bytes=None`` (every document whole, as the raw
baselines store it) and the raw-fast baseline. Each round times OPS operations of save (1 and
32 callers), load and compare-and-set (1 caller) on fresh keys; then each subject's
statements an operation are counted at the driver (benchmarks/statements.py). Prints per
cell each subject's ops/s median (min–max of rounds), client CPU an operation (ms) and
statements an operation, and whole / parts per round as min–max and median.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import sys
import tempfile
from typing import Any

import orjson

from benchmarks.payloads import SIZES, make_contexts, wire_document
from benchmarks.siglo_subject import SigloSubject
from benchmarks.statements import SqliteConnections, statements_per_op
from benchmarks.subject import Subject
from benchmarks.workloads import Workload, measure

CELLS = (("save", 1), ("save", 32), ("load", 1), ("cas", 1))


def _subjects(backend: str, tmp: str) -> dict[str, Subject]:
    if backend == "sqlite":
        from benchmarks.raw_fast_sqlite import RawFastSqliteSubject

        return {
            "parts": SigloSubject("sqlite", f"sqlite:///{tmp}/parts.db"),
            "whole": SigloSubject(
                "sqlite", f"sqlite:///{tmp}/whole.db", incremental_min_bytes=None
            ),
            "raw-fast": RawFastSqliteSubject(os.path.join(tmp, "raw-fast.db")),
        }
    from benchmarks.raw_fast_postgres import RawFastPostgresSubject

    url = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")
    return {
        "parts": SigloSubject("postgres", url),
        "whole": SigloSubject("postgres", url, incremental_min_bytes=None),
        "raw-fast": RawFastPostgresSubject(url, pool_size=10, doc_type="bytea"),
    }


async def run(backend: str, rounds: int, ops: int) -> list[str]:
    """The printed lines (see the module's doc)."""
    doc = orjson.dumps(wire_document("x", 1, make_contexts(SIZES["16k"]), expires_at=None))
    lines = [f"{backend}: the 16k document is {len(doc):,} bytes encoded"]
    conns = SqliteConnections()
    with tempfile.TemporaryDirectory(prefix="siglo-parts-") as tmp, conns.tracking():
        subjects = _subjects(backend, tmp)
        for s in subjects.values():
            await s.open()
        try:
            for name, callers in CELLS:
                w = Workload(name, "16k", callers, ops)
                speed: dict[str, list[float]] = {k: [] for k in subjects}
                cpu: dict[str, list[float]] = {k: [] for k in subjects}
                for r in range(rounds):
                    order = list(subjects) if r % 2 == 0 else list(reversed(subjects))
                    for k in order:
                        m = await measure(subjects[k], w, f"p{secrets.token_hex(3)}")
                        speed[k].append(m.ops_per_s)
                        cpu[k].append(m.cpu_s / m.ops * 1e3)
                parts: list[str] = []
                for k, s in subjects.items():
                    st = await statements_per_op(s, w, backend, sqlite_conns=conns)
                    parts.append(
                        f"{k} {statistics.median(speed[k]):,.0f} ops/s "
                        f"({min(speed[k]):,.0f}-{max(speed[k]):,.0f}), "
                        f"CPU {statistics.median(cpu[k]):.3f} ms, statements {_fmt(st)}"
                    )
                ratio = [a / b for a, b in zip(speed["whole"], speed["parts"], strict=True)]
                parts.append(
                    f"whole / parts {statistics.median(ratio):.2f} "
                    f"({min(ratio):.2f}-{max(ratio):.2f})"
                )
                lines.append(f"{backend} {w.id}: " + "; ".join(parts))
        finally:
            for s in subjects.values():
                await s.close()
    return lines


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    backend = sys.argv[1] if len(sys.argv) > 1 else "sqlite"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    ops = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    for line in asyncio.run(run(backend, rounds, ops)):
        print(line, flush=True)
