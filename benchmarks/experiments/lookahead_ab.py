"""Measured a flow's runs/s with its cached step's look-up sent ahead and sent after.

``python -m benchmarks.experiments.lookahead_ab BACKEND [CONCURRENCY [RUNS [BLOCKS]]]``:
the end-to-end benchmark's 3-step flow (``benchmarks.e2e``, the second step cached) on
siglo's BACKEND, in BLOCKS blocks (default 16) of RUNS runs (default 60) by CONCURRENCY
concurrent runs (default 1), every block timed once with the cached step's look-up sent
beside the checkpoint before it (``siglo.workflow.flow._look_ahead``) and once with it
sent after that checkpoint has landed; the order turns every block. Prints runs/s of
each and the per-block ratio, ahead / after, as median (min–max).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from typing import Any

from benchmarks.cli import build_parser
from benchmarks.e2e import SigloWorkflow, measure_runs


def _flow_module() -> Any:
    # ``siglo.workflow.flow`` the attribute is the ``flow`` function; the module is this.
    return sys.modules["siglo.workflow.flow"]


async def main(backend: str, concurrency: int, runs: int, blocks: int) -> None:
    import siglo.workflow.flow  # noqa: F401  (loads the module _flow_module reads)

    flow_module = _flow_module()
    look_ahead = flow_module._look_ahead
    with tempfile.TemporaryDirectory(prefix="siglo-lookahead-ab-") as tmp:
        args = build_parser().parse_args([])  # the servers of SIGLO_REDIS_URL / _POSTGRES_URL
        urls = {
            "memory": "memory://",
            "redis": args.redis_url,
            "postgres": args.postgres_url,
            "sqlite": f"sqlite:///{tmp}/lookahead.db",
        }
        subject = SigloWorkflow(backend, urls[backend])
        await subject.open()
        speeds: dict[str, list[float]] = {"ahead": [], "after": []}
        try:
            await measure_runs(subject, concurrency, max(concurrency, runs // 2))  # warm
            for block in range(blocks):
                order = ("after", "ahead") if block % 2 == 0 else ("ahead", "after")
                for name in order:
                    flow_module._look_ahead = (
                        look_ahead if name == "ahead" else (lambda *_args, **_kw: None)
                    )
                    m = await measure_runs(subject, concurrency, runs)
                    speeds[name].append(m["runs_per_s"])
        finally:
            flow_module._look_ahead = look_ahead
            await subject.close()
    ratios = [a / b for a, b in zip(speeds["ahead"], speeds["after"], strict=True)]
    print(
        f"{backend} c{concurrency}: runs/s sent after {statistics.median(speeds['after']):.1f}, "
        f"sent ahead {statistics.median(speeds['ahead']):.1f}; per block ahead / after "
        f"{statistics.median(ratios):.3f} ({min(ratios):.2f}–{max(ratios):.2f}), "
        f"{blocks} blocks of {runs} runs"
    )


if __name__ == "__main__":
    argv = sys.argv[1:]
    asyncio.run(
        main(
            argv[0],
            int(argv[1]) if len(argv) > 1 else 1,
            int(argv[2]) if len(argv) > 2 else 60,
            int(argv[3]) if len(argv) > 3 else 16,
        )
    )
