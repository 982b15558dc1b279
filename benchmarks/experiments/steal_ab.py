"""Measured how a pass's speed follows the CPU time the hypervisor stole (interference.py).

``python -m benchmarks.experiments.steal_ab BACKEND WORKLOAD SIZE CONCURRENCY [ROUNDS]``
(SIZE ``-`` for the coordination workloads): siglo and the raw driver of BACKEND, ROUNDS
rounds (default 10) of three passes in alternating order, as the benchmark times them.
Every attempt of a pass is kept here: the first, and those timed again while the stolen
share was over :data:`~benchmarks.interference.STEAL_LIMIT`. Prints

* per subject, the correlation of a first attempt's log ops/s with its stolen share,
  and of the pair's log ratio with the difference of their shares;
* the rounds' siglo / raw ratios from the first attempts alone and from the kept ones,
  as median (min–max), and how many passes were timed again.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import statistics
import sys
import tempfile
from typing import Any

from benchmarks.cli import build_parser, make_subjects
from benchmarks.interference import PAUSE_S, RETIMES, STEAL_LIMIT
from benchmarks.machine import cpu_times, steal_share
from benchmarks.slices import round_order, slice_size
from benchmarks.subject import Subject
from benchmarks.workloads import Measurement, Workload, default_workloads, measure


async def _attempt(subject: Subject, part: Workload) -> tuple[Measurement, float]:
    before = cpu_times()
    m = await measure(subject, part, f"s{secrets.token_hex(3)}")
    share = steal_share(before, cpu_times())
    return m, share or 0.0


def _corr(xs: list[float], ys: list[float]) -> str:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return "–"
    return f"{statistics.correlation(xs, ys):.2f}"


def _rounds(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


async def main(
    backend: str, name: str, size: str | None, concurrency: int, rounds: int, pause_s: float
) -> None:
    args = build_parser().parse_args(["--no-langgraph"])
    ops = next(w.ops for w in default_workloads([size or "1k"], names={name}) if w.size == size)
    part = Workload(name, size, concurrency, slice_size(ops, 3, concurrency))
    with tempfile.TemporaryDirectory(prefix="siglo-steal-ab-") as tmp:
        made = make_subjects(backend, args, tmp)
        subjects = [s for s in made if not isinstance(s, str)][:2]
        if len(subjects) < 2 or subjects[0].kind != "siglo" or subjects[1].kind != "raw":
            raise SystemExit(f"{backend}: siglo and raw are needed; got {made}")
        for s in subjects:
            await s.open()
        first: list[list[tuple[float, float]]] = [[], []]  # per subject: (ops/s, share)
        by_round: dict[str, list[list[list[float]]]] = {"first": [], "kept": []}
        retimed = passes = 0
        try:
            for r in range(rounds):
                sums: dict[str, list[list[float]]] = {k: [[0.0, 0.0], [0.0, 0.0]] for k in by_round}
                for order in round_order(2, r, 3):
                    for i in order:
                        m, share = await _attempt(subjects[i], part)
                        passes += 1
                        first[i].append((m.ops_per_s, share))
                        sums["first"][i][0] += m.ops
                        sums["first"][i][1] += m.seconds
                        for _ in range(RETIMES):
                            if share <= STEAL_LIMIT:
                                break
                            retimed += 1
                            await asyncio.sleep(pause_s)
                            m, share = await _attempt(subjects[i], part)
                        sums["kept"][i][0] += m.ops
                        sums["kept"][i][1] += m.seconds
                for k in by_round:
                    by_round[k].append(sums[k])
        finally:
            for s in subjects:
                await s.close()
    label = f"{backend} {part.id}"
    for i, s in enumerate(subjects):
        ops_s = [math.log(x) for x, _ in first[i]]
        shares = [y for _, y in first[i]]
        print(
            f"{label}: {s.kind} first attempts: stolen share median "
            f"{statistics.median(shares):.0%}, max {max(shares):.0%}; "
            f"correlation of log ops/s with it {_corr(ops_s, shares)}"
        )
    pair_ratio = [math.log(a[0] / b[0]) for a, b in zip(first[0], first[1], strict=True)]
    pair_diff = [a[1] - b[1] for a, b in zip(first[0], first[1], strict=True)]
    print(
        f"{label}: log ratio of a pass pair with the difference of their shares "
        f"{_corr(pair_ratio, pair_diff)}"
    )
    for k, rows in by_round.items():
        ratios = [(a[0] / a[1]) / (b[0] / b[1]) for a, b in rows]
        print(f"{label}: siglo / raw, {k} attempts, {rounds} rounds: {_rounds(ratios)}")
    print(f"{label}: passes timed again: {retimed} of {passes}")


def _cli(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.steal_ab")
    p.add_argument("backend", choices=("memory", "redis", "postgres", "sqlite"))
    p.add_argument("workload")
    p.add_argument("size", help="1k, 16k, 256k, or - for the coordination workloads")
    p.add_argument("concurrency", type=int)
    p.add_argument("rounds", type=int, nargs="?", default=10)
    return p.parse_args(argv)


if __name__ == "__main__":
    a: Any = _cli(sys.argv[1:])
    asyncio.run(
        main(a.backend, a.workload, None if a.size == "-" else a.size, a.concurrency, a.rounds,
             PAUSE_S)
    )  # fmt: skip
