"""Measured the instructions of a 256 KB SQLite save or load, whole or in parts
(docs/benchmarks-large-state.md, "The 256 KB cells"): one process makes 102 documents of
16 contexts of 16 KB (as ``benchmarks.large_state latency`` does), saves two, loads one,
then runs ``N`` operations; a run of 100 less a run of 0, divided by 100, is the cost of
one, every thread of the process counted::

    valgrind --tool=callgrind --dump-instr=no \\
        python -m benchmarks.experiments.large_state_callgrind whole|parts load|save|cycle N

``load`` loads the document the process saved last ``N`` times; ``save`` saves ``N``
documents, one context changed each time (the one changed before going back); ``cycle``
saves then loads, as the latency rounds do; ``resume`` saves, then another adapter on
the same database (another process's: its own memory of bodies) loads and saves one
context changed, and it prints the median times of that load and that save. It prints
the median time of an operation (meaningless under valgrind; indicative without it).

    python -m benchmarks.experiments.large_state_callgrind parts resume 40

Two more arguments, ``SIZE`` and ``KIND``, measure another document size (16 contexts
of a sixteenth each) and PostgreSQL (``postgres``: the instructions are the client's,
the server being another process)::

    python -m benchmarks.experiments.large_state_callgrind whole save 100 16384 postgres
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from benchmarks.large_state import _document, open_kind
from siglo_sql.adapter import SqlStorageAdapter

SIZE = 262_144
DOCUMENTS = 102


async def run(mode: str, op: str, n: int, size: int = SIZE, kind: str = "sqlite") -> float:
    """The median milliseconds of ``n`` operations ``op`` on a store in ``mode``."""
    if mode not in ("whole", "parts") or op not in ("load", "save", "cycle", "resume"):
        raise SystemExit(f"usage: whole|parts load|save|cycle|resume N, got {mode} {op}")
    if not 0 <= n <= DOCUMENTS - 2:
        raise SystemExit(f"N must be between 0 and {DOCUMENTS - 2}, got {n}")
    options = {"incremental_min_bytes": None} if mode == "whole" else {}
    async with open_kind(kind, **options) as backend:
        a = backend.adapter
        docs = [_document(size, r, (r - 1) % 16) for r in range(1, DOCUMENTS + 1)]
        for cp in docs:
            cp.to_json()  # encoded beforehand, as in the latency rounds
        await a.save_checkpoint(docs[0], expected_revision=0)
        await a.save_checkpoint(docs[1], expected_revision=1)
        await a.get_checkpoint("lat")
        times: list[float] = []
        if op == "resume":
            return await _resume(backend.raw_adapter, docs, n)
        for i in range(n):
            t = time.perf_counter()
            if op != "load":
                await a.save_checkpoint(docs[i + 2], expected_revision=i + 2)
            if op != "save":
                got = await a.get_checkpoint("lat")
                assert got is not None
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3 if times else 0.0


async def _resume(a: SqlStorageAdapter, docs: list[Any], n: int) -> float:
    """``n`` loads by a fresh adapter of what ``a`` saved, each followed by its save of
    the next document; prints both medians, returns the load's."""
    loads: list[float] = []
    saves: list[float] = []
    revision = 2
    for i in range(n // 2):
        await a.save_checkpoint(docs[2 + 2 * i], expected_revision=revision)
        other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        t = time.perf_counter()
        got = await other.get_checkpoint("lat")
        loads.append(time.perf_counter() - t)
        assert got is not None
        t = time.perf_counter()
        await other.save_checkpoint(docs[3 + 2 * i], expected_revision=revision + 1)
        saves.append(time.perf_counter() - t)
        revision += 2
    load, save = (statistics.median(v) * 1e3 if v else 0.0 for v in (loads, saves))
    print(f"another process's load {load:.4f} ms, its save after it {save:.4f} ms")
    return load


if __name__ == "__main__":
    mode, op, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    size = int(sys.argv[4]) if len(sys.argv) > 4 else SIZE
    kind = sys.argv[5] if len(sys.argv) > 5 else "sqlite"
    print(f"{mode} {op}: median {asyncio.run(run(mode, op, count, size, kind)):.4f} ms")
