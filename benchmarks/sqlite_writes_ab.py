"""Sequential SQLite writes on the loop's thread and through aiosqlite's, interleaved.

``python -m benchmarks.sqlite_writes_ab [ROUNDS]``: two siglo SQLite backends on two
files in one temporary directory, one with its inline writer connection removed (every
write takes the hop to aiosqlite's thread, as before ``SqliteDatabase.write``); each round
times 1,000 sequential saves and 1,000 compare-and-sets of a 1 KB and of a 16 KB
checkpoint on each (the order turns every round). Prints, per workload, the per-round
ratio of the inline backend's speed to the other's as median (min–max).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from typing import Any

import siglo
from benchmarks.workloads import contexts_of
from siglo.checkpoint import Checkpoint

OPS = 1_000


async def _time(backend: siglo.Backend, workload: str, size: str, revision: list[int]) -> float:
    ctx = contexts_of(size)
    adapter: Any = backend.adapter
    t0 = time.perf_counter()
    for _ in range(OPS):
        revision[0] += 1
        cp = Checkpoint(stack_id=size, revision=revision[0], timestamp=1, contexts=ctx)
        expected = revision[0] - 1 if workload == "cas" else None
        await adapter.save_checkpoint(cp, expected_revision=expected)
    return time.perf_counter() - t0


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            siglo.connect(f"sqlite:///{tmp}/inline.db") as inline,
            siglo.connect(f"sqlite:///{tmp}/hop.db") as hop,
        ):
            for backend in (inline, hop):
                await backend.adapter.open()  # type: ignore[attr-defined]
            db: Any = hop.adapter.database  # type: ignore[attr-defined]
            db._writer.close()
            db._writer = None  # every write through aiosqlite's thread
            cells = [(w, s) for w in ("save", "cas") for s in ("1k", "16k")]
            revisions = {(name, s): [0] for name in ("inline", "hop") for s in ("1k", "16k")}
            ratios: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
            for n in range(rounds):
                for workload, size in cells:
                    took: dict[str, float] = {}
                    order = [("inline", inline), ("hop", hop)]
                    for name, backend in order if n % 2 == 0 else order[::-1]:
                        took[name] = await _time(backend, workload, size, revisions[name, size])
                    ratios[workload, size].append(took["hop"] / took["inline"])
            for (workload, size), values in ratios.items():
                print(
                    f"{workload} {size}: inline / through the driver, speed, sequential, "
                    f"{rounds} rounds of {OPS}: median {statistics.median(values):.2f} "
                    f"({min(values):.2f}–{max(values):.2f})"
                )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 7))
