"""Measured SQLite saves and compare-and-sets written on the loop's thread and through aiosqlite.

``python -m benchmarks.experiments.sqlite_writes_ab [ROUNDS [CALLERS]]``: two siglo SQLite
backends on two files in one temporary directory, one with its inline writer connection
removed (every write takes the hop to aiosqlite's thread); each round times 1,000 saves
and 1,000 compare-and-sets of a 1 KB and of a 16 KB checkpoint on each, by one caller or
by CALLERS concurrent ones on stacks of their own (the order turns every round). Prints,
per workload, the per-round ratio of the inline backend's speed to the other's as
median (min–max).
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


async def _time(
    backend: siglo.Backend, workload: str, size: str, revision: list[int], callers: int
) -> float:
    ctx = contexts_of(size)
    adapter: Any = backend.adapter

    async def caller(n: int) -> None:
        # One stack per caller: at several callers the saves do not contend.
        for _ in range(OPS // callers):
            revision[n] += 1
            cp = Checkpoint(stack_id=f"{size}-{n}", revision=revision[n], timestamp=1, contexts=ctx)
            expected = revision[n] - 1 if workload == "cas" else None
            await adapter.save_checkpoint(cp, expected_revision=expected)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(n) for n in range(callers)))
    return time.perf_counter() - t0


async def main(rounds: int, callers: int) -> None:
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
            revisions = {
                (name, s): [0] * callers for name in ("inline", "hop") for s in ("1k", "16k")
            }
            ratios: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
            for n in range(rounds):
                for workload, size in cells:
                    took: dict[str, float] = {}
                    order = [("inline", inline), ("hop", hop)]
                    for name, backend in order if n % 2 == 0 else order[::-1]:
                        took[name] = await _time(
                            backend, workload, size, revisions[name, size], callers
                        )
                    ratios[workload, size].append(took["hop"] / took["inline"])
            for (workload, size), values in ratios.items():
                print(
                    f"{workload} {size}: inline / through the driver, speed, {callers} "
                    f"caller(s), {rounds} rounds of {OPS}: median {statistics.median(values):.2f} "
                    f"({min(values):.2f}–{max(values):.2f})"
                )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0] if args else 7, args[1] if len(args) > 1 else 1))
