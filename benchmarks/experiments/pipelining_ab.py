"""Measured sequential Redis saves and loads a second with auto-pipelining and without.

``python -m benchmarks.experiments.pipelining_ab [REDIS_URL]``: two siglo Redis backends
on one server, one built with ``auto_pipeline=False``; each round times 500 sequential
saves and 500 loads of a 1 KB checkpoint on each (the order turns every round), and the
per-round ratio of the pipelined one's speed to the other's is printed as median
(min–max). Auto-pipelining must not make a lone caller slower (docs/backends/redis.md).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from benchmarks.workloads import contexts_of
from siglo.checkpoint import Checkpoint
from siglo_redis import isolated
from siglo_redis.pipelining import AutoPipelinedRedis

ROUNDS = 7
OPS = 500


async def main(url: str) -> None:
    ctx = contexts_of("1k")
    async with (
        isolated(url) as on,
        isolated(url, auto_pipeline=False) as off,
    ):
        assert isinstance(on.adapter.client, AutoPipelinedRedis)  # type: ignore[attr-defined]
        assert not isinstance(off.adapter.client, AutoPipelinedRedis)  # type: ignore[attr-defined]
        revision = {"on": 1, "off": 1}
        for backend in (on, off):
            cp = Checkpoint(stack_id="s", revision=1, timestamp=1, contexts=ctx)
            await backend.adapter.save_checkpoint(cp)
        ratios: dict[str, list[float]] = {"save": [], "load": []}
        for n in range(ROUNDS):
            seconds: dict[str, tuple[float, float]] = {}
            order = [("on", on), ("off", off)]
            for name, backend in order if n % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                for _ in range(OPS):
                    revision[name] += 1
                    cp = Checkpoint(
                        stack_id="s", revision=revision[name], timestamp=1, contexts=ctx
                    )
                    await backend.adapter.save_checkpoint(cp)
                t1 = time.perf_counter()
                for _ in range(OPS):
                    await backend.adapter.get_checkpoint("s")
                seconds[name] = (t1 - t0, time.perf_counter() - t1)
            ratios["save"].append(seconds["off"][0] / seconds["on"][0])
            ratios["load"].append(seconds["off"][1] / seconds["on"][1])
        for op, values in ratios.items():
            print(
                f"{op}: pipelined / unpipelined speed, sequential, per round: median "
                f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"
            )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0"))
