"""The workloads: each times one operation of a :class:`~benchmarks.subject.Subject`.

A measurement runs ``concurrency`` workers (asyncio tasks) that together perform about
``ops`` operations, and returns operations per second. Keys are fresh per measurement
(``tag``), so repeats never see each other's data. Setup (pre-saving what a load reads,
creating the wait records a claim takes) happens before the clock starts, and so does a
warm-up: every worker first performs :data:`WARMUP` operations of the same kind,
untimed, so that connection pools have opened their connections and statements are
prepared on them before anything is timed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from benchmarks.client_cpu import ClientClock, Reading
from benchmarks.payloads import SIZES, make_contexts
from benchmarks.subject import Conflict, Subject

SEQ: Final = 1
CONC: Final = 32
CAS_WRITERS: Final = 8
"""CAS with this many writers shares one stack (they contend); at :data:`CONC` each
writer updates a stack of its own (read-modify-write without contention)."""
WARMUP: Final = 3
"""Untimed operations per worker before the clock starts."""


@dataclass(frozen=True)
class Workload:
    """One thing to time: an operation, a document size and a number of callers."""

    name: str
    """``save``, ``load``, ``cas``, ``wait_claim``, ``idempotency``, ``lock`` or ``cache``."""
    size: str | None
    concurrency: int
    ops: int

    @property
    def id(self) -> str:
        size = f"/{self.size}" if self.size else ""
        return f"{self.name}{size}/c{self.concurrency}"


@dataclass
class Measurement:
    """The outcome of one timed run."""

    ops_per_s: float
    ops: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    cpu_s: float = 0.0
    """The process's CPU time during the timed operations (benchmarks/client_cpu.py)."""
    gc_s: float = 0.0
    """Of the timed wall time, the part spent in the cyclic garbage collector."""


_contexts_cache: dict[str, dict[str, Any]] = {}


def contexts_of(size: str) -> dict[str, Any]:
    """The contexts of a ``size`` checkpoint, built once per process."""
    if size not in _contexts_cache:
        _contexts_cache[size] = make_contexts(SIZES[size])
    return _contexts_cache[size]


def default_workloads(
    sizes: list[str], *, ops_scale: float = 1.0, names: set[str] | None = None
) -> list[Workload]:
    """The standard set: checkpoints at every size (sequential, 32 callers, 8 contending
    CAS writers), then the coordination workloads sequential and at 32 callers."""
    # Larger documents take longer per operation and their rounds are more exposed to
    # single pauses (a full garbage collection is tens of milliseconds): more of them.
    base = {"1k": 2000, "16k": 2000, "256k": 450}

    def n(x: float) -> int:
        return max(1, int(x * ops_scale))

    out: list[Workload] = []
    for size in sizes:
        ops = base[size]
        out += [
            Workload("save", size, SEQ, n(ops)),
            Workload("save", size, CONC, n(ops)),
            Workload("load", size, SEQ, n(ops)),
            Workload("load", size, CONC, n(ops)),
            Workload("cas", size, SEQ, n(ops / 2)),
            Workload("cas", size, CAS_WRITERS, n(ops / 2)),
            Workload("cas", size, CONC, n(ops / 2)),
        ]
    for name in ("wait_claim", "idempotency", "lock", "cache"):
        out += [Workload(name, None, SEQ, n(1000)), Workload(name, None, CONC, n(1000))]
    if names:
        out = [w for w in out if w.name in names]
    return out


async def _workers(
    concurrency: int, per_worker: int, op: Callable[[int, int], Awaitable[None]]
) -> Reading:
    """Warm up (:data:`WARMUP` untimed ops per worker, ``j`` = 0 …), then time
    ``per_worker`` ops per worker (``j`` = WARMUP …); return what the timed part took."""

    async def worker(w: int, start: int, stop: int) -> None:
        for j in range(start, stop):
            await op(w, j)

    await asyncio.gather(*(worker(w, 0, WARMUP) for w in range(concurrency)))
    clock = ClientClock()
    clock.start()
    await asyncio.gather(*(worker(w, WARMUP, WARMUP + per_worker) for w in range(concurrency)))
    return clock.stop()


async def measure(subject: Subject, workload: Workload, tag: str) -> Measurement:
    """Time ``workload`` on ``subject`` once. Raises :class:`NotImplementedError` when the
    subject does not offer the operation."""
    c = workload.concurrency
    k = max(1, math.ceil(workload.ops / c))
    total = k * c
    extra: dict[str, Any] = {}
    name = workload.name

    if name == "save":
        ctx = contexts_of(workload.size or "1k")
        # Revision 1 first, untimed: the timed saves are updates of existing stacks.
        for w in range(c):
            await subject.save(f"{tag}-{w}", 1, ctx)

        async def op(w: int, j: int) -> None:
            await subject.save(f"{tag}-{w}", j + 2, ctx)

    elif name == "load":
        ctx = contexts_of(workload.size or "1k")
        for w in range(c):
            await subject.save(f"{tag}-{w}", 1, ctx)

        async def op(w: int, j: int) -> None:
            assert await subject.load(f"{tag}-{w}") == 1

    elif name == "cas":
        # Read-modify-write: load, then save with expected_revision; a writer that
        # loses reloads and retries; one op is one successful update. Up to
        # CAS_WRITERS writers share one stack (they contend); more each have their own.
        ctx = contexts_of(workload.size or "1k")
        shared = c <= CAS_WRITERS
        stacks = [f"{tag}-cas"] if shared else [f"{tag}-cas-{w}" for w in range(c)]
        for stack in stacks:
            await subject.save(stack, 1, ctx, expected_revision=0)
        conflicts = 0

        async def op(w: int, j: int) -> None:
            nonlocal conflicts
            stack = stacks[0] if shared else stacks[w]
            while True:
                current = await subject.load(stack)
                assert current is not None
                try:
                    await subject.save(stack, current + 1, ctx, expected_revision=current)
                    return
                except Conflict:
                    if j >= WARMUP:  # the timed updates' conflicts, not the warm-up's
                        conflicts += 1

        took = await _workers(c, k, op)
        finals = [await subject.load(stack) for stack in stacks]
        done = (total + WARMUP * c) // len(stacks)
        assert finals == [1 + done] * len(stacks), f"lost updates: {finals} != {1 + done}"
        return _measurement(total, took, {"conflicts": conflicts})

    elif name == "wait_claim":
        per = WARMUP + k
        for i in range(per * c):
            await subject.put_wait(f"{tag}-{i}", f"{tag}-stack-{i}")

        async def op(w: int, j: int) -> None:
            assert await subject.claim_wait(f"{tag}-{w * per + j}", f"claimant-{w}")

    elif name == "idempotency":
        result = {"status": "ok", "id": 12345, "items": [1, 2, 3]}

        async def op(w: int, j: int) -> None:
            await subject.idempotency_claim_complete(f"{tag}-{w}-{j}", result)

    elif name == "lock":

        async def op(w: int, j: int) -> None:
            await subject.lock_pair(f"{tag}-{w}")

    elif name == "cache":
        value = contexts_of("1k")

        async def op(w: int, j: int) -> None:
            await subject.cache_set_get(f"{tag}-{w}", value)

    else:
        raise ValueError(f"unknown workload {name!r}")

    return _measurement(total, await _workers(c, k, op), extra)


def _measurement(total: int, took: Reading, extra: dict[str, Any]) -> Measurement:
    return Measurement(
        total / took.seconds, total, took.seconds, extra, cpu_s=took.cpu_s, gc_s=took.gc_s
    )
