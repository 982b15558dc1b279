"""Measured the client instructions of one durable workflow run (issue 36): the
end-to-end benchmark's siglo subject (:class:`benchmarks.e2e.SigloWorkflow`: a flow of
3 steps, one cached, on a strict manager), opened on one backend, runs ``WARMUP``
workflows, then ``N`` more one after the other. A run of 100 less a run of 0, divided
by 100, is the cost of one workflow run, every thread of the process counted::

    valgrind --tool=callgrind --dump-instr=no \\
        python -m benchmarks.experiments.flow_callgrind sqlite 100
    valgrind --tool=callgrind --dump-instr=no \\
        python -m benchmarks.experiments.flow_callgrind sqlite 0

``KIND`` is ``sqlite`` (a fresh file in a temporary directory) or ``memory``; ``postgres``
and ``redis`` (the local servers, or ``SIGLO_PG_URL`` / ``SIGLO_REDIS_URL``) count the
client's instructions only, the server being another process. Opening and closing a
backend on a shared server costs what the server holds (Redis: the isolated prefix is
deleted by a scan of every key), so there the counted runs are read alone: with
``--dump-before=os_getppid`` callgrind writes them as a dump of their own, the second
(``callgrind.out.<pid>.2``), and that dump of a run of 100, divided by 100, is one run
(less the same dump of a run of 0, a few thousand instructions). Where the instructions go:
``callgrind_annotate --inclusive=yes callgrind.out.<pid>`` on the N=100 run. Without
valgrind it prints the median milliseconds of a run (meaningless under valgrind;
indicative without it).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time

from benchmarks.e2e import SigloWorkflow

WARMUP = 20
"""Runs before the counted ones: imports, the schema, caches and the first WAL
checkpoint land there, in both the N=0 and the N=100 run."""


def _url(kind: str, tmp: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{os.path.join(tmp, 'flow.db')}"
    if kind == "memory":
        return "memory://"
    if kind == "postgres":
        return os.environ.get("SIGLO_PG_URL", "postgresql://127.0.0.1/test")
    if kind == "redis":
        return os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")
    raise SystemExit(f"usage: sqlite|memory|postgres|redis N, got {kind}")


async def run(kind: str, n: int) -> float:
    """The median milliseconds of ``n`` sequential workflow runs on ``kind``."""
    with tempfile.TemporaryDirectory(prefix="siglo-flow-") as tmp:
        subject = SigloWorkflow(kind, _url(kind, tmp))
        await subject.open()
        try:
            tag = os.urandom(4).hex()
            for i in range(WARMUP):
                await subject.run(f"flow-{tag}-w{i}")
            times: list[float] = []
            os.getppid()  # under --dump-before=os_getppid: the counted runs, a dump of their own
            for i in range(n):
                t = time.perf_counter()
                await subject.run(f"flow-{tag}-{i}")
                times.append(time.perf_counter() - t)
            os.getppid()
        finally:
            await subject.close()
    return statistics.median(times) * 1e3 if times else 0.0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.experiments.flow_callgrind KIND N")
    kind, count = sys.argv[1], int(sys.argv[2])
    print(f"{kind} workflow run: median {asyncio.run(run(kind, count)):.4f} ms")
