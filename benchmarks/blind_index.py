"""A filtered listing at 10,000 stacks: the blind index (list_checkpoints_by_index) against
reading each stack the walk passes (siglo.blind.list_matching, what every backend did
before schema 7). Interleaved rounds; prints medians and ranges in milliseconds.

    python benchmarks/blind_index.py sqlite:///tmp/bi.db [postgresql://…] [--stacks 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import time
from typing import Any

import siglo
from siglo.blind import list_matching
from siglo.checkpoint import Checkpoint
from siglo.config import Settings
from siglo.pipeline import Pipeline, PipelineAdapter, pipeline_parts


async def _walk(list_page: Any) -> int:
    count, cursor = 0, None
    while True:
        page = await list_page(cursor)
        count += len(page.items)
        if page.next_cursor is None:
            return count
        cursor = page.next_cursor


async def run(url: str, stacks: int, rounds: int) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    settings = Settings(encryption_keys={"k1": key}, blind_index_fields=["customer"])
    async with siglo.connect(url, settings=Settings(), checkpoint_ttl_ms=None) as backend:
        piped, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
        assert isinstance(piped, PipelineAdapter)
        saves = [
            piped.save_checkpoint(
                Checkpoint(
                    stack_id=f"s{i:05}",
                    namespace="bench",
                    revision=1,
                    timestamp=1,
                    contexts={"step": {"payload": "x" * 200}},
                    metadata={"customer": f"c{i % 1000}"},
                ),
                expected_revision=0,
            )
            for i in range(stacks)
        ]
        for n in range(0, len(saves), 200):
            await asyncio.gather(*saves[n : n + 200])
        wanted = {"customer": "c7"}
        codecs = piped.codecs

        async def indexed(cursor: str | None) -> Any:
            return await piped.list_checkpoints(metadata=wanted, namespace="bench", cursor=cursor)

        async def scanned(cursor: str | None) -> Any:
            return await list_matching(
                piped.inner,
                wanted,
                indexed=codecs.indexed,
                index_key=codecs.index_key,
                namespace="bench",
                cursor=cursor,
            )

        times: dict[str, list[float]] = {"index": [], "scan": []}
        for _ in range(rounds):
            for name, fn in (("index", indexed), ("scan", scanned)):
                start = time.perf_counter()
                found = await _walk(fn)
                times[name].append((time.perf_counter() - start) * 1000)
                assert found == stacks // 1000, found
        load = os.getloadavg()
        print(f"{backend.name}, {stacks} stacks, {rounds} interleaved rounds, load {load}")
        for name, ms in times.items():
            print(
                f"  {name}: median {statistics.median(ms):.2f} ms "
                f"(range {min(ms):.2f}–{max(ms):.2f})"
            )
        await backend.raw_adapter.clean_expired_checkpoints()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--stacks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for url in args.urls:
        asyncio.run(run(url, args.stacks, args.rounds))


if __name__ == "__main__":
    main()
