"""``python -m benchmarks.encryption``: what encryption at rest costs per save and load.

Saves (compare-and-set, each at the next revision) and loads one checkpoint through
``siglo.connect``'s pipeline, with encryption off, on (AES-256-GCM, keys in the
settings) and on with zstd compression above 4 KB, at two document sizes (the
benchmark payloads of 1 KB and 256 KB, :mod:`benchmarks.payloads`), on the in-memory
backend (the codec chain alone) and a SQLite file (a real store). The configurations
run interleaved — every round measures each of them once, in an order that rotates — so
a change in the machine's load shows in all of them alike. Prints, per cell, the median
microseconds per operation over the rounds and their range, as a Markdown table.

    python -m benchmarks.encryption --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import siglo
from benchmarks.payloads import SIZES, make_contexts
from siglo import Checkpoint

CONFIGS: Final = {
    "off": {},
    "aes-256-gcm": {"encryption_keys": {"k1": base64.b64encode(bytes(range(32))).decode()}},
    "aes-256-gcm + zstd": {
        "encryption_keys": {"k1": base64.b64encode(bytes(range(32))).decode()},
        "compression_min_bytes": 4096,
    },
}
OPS: Final = {"1k": 300, "256k": 20}


@dataclass
class Cell:
    backend: str
    size: str
    config: str
    save_us: list[float]
    load_us: list[float]


async def _round(url: str, config: str, size: str, stack: str) -> tuple[float, float]:
    settings = siglo.Settings(**CONFIGS[config])  # type: ignore[arg-type]
    contexts = make_contexts(SIZES[size])
    n = OPS[size]
    async with siglo.connect(url, settings=settings) as backend:
        adapter = backend.adapter
        start = time.perf_counter()
        for revision in range(n):
            cp = Checkpoint(
                stack_id=stack,
                revision=revision + 1,
                timestamp=1,
                contexts=contexts,
                metadata={"input": {"order": 7}},
            )
            await adapter.save_checkpoint(cp, expected_revision=revision)
        saved = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(n):
            found = await adapter.get_checkpoint(stack)
            assert found is not None
        loaded = time.perf_counter() - start
    return saved / n * 1e6, loaded / n * 1e6


async def run(rounds: int, backends: list[str], sizes: list[str]) -> list[Cell]:
    with tempfile.TemporaryDirectory(prefix="siglo-bench-enc-") as directory:
        urls = {"memory": "memory://", "sqlite": f"sqlite:///{Path(directory) / 'b.db'}"}
        cells = {(b, s, c): Cell(b, s, c, [], []) for b in backends for s in sizes for c in CONFIGS}
        names = list(CONFIGS)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for b in backends:
                for s in sizes:
                    for c in order:
                        save, load = await _round(urls[b], c, s, f"bench-{r}-{s}-{c}")
                        cells[(b, s, c)].save_us.append(save)
                        cells[(b, s, c)].load_us.append(load)
    return list(cells.values())


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def table(cells: list[Cell]) -> str:
    """The Markdown table of ``cells``."""
    lines = [
        "| backend | size | encryption | save, µs | load, µs |",
        "|---|---|---|---:|---:|",
    ]
    for cell in cells:
        lines.append(
            f"| {cell.backend} | {cell.size} | {cell.config} | {_fmt(cell.save_us)} | "
            f"{_fmt(cell.load_us)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backends", default="memory,sqlite")
    parser.add_argument("--sizes", default="1k,256k")
    args = parser.parse_args()
    cells = asyncio.run(run(args.rounds, args.backends.split(","), args.sizes.split(",")))
    print(table(cells))


if __name__ == "__main__":
    main()
