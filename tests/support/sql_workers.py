"""Jobs the multi-process SQL tests run in worker processes (spawned, so importable).

Each job connects with ``siglo.connect(url)`` — the URL carries the private schema or
file of the test — opens the backend before the common start time, so that every
process races from the same instant, and returns what it won and any error it saw.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import siglo
from siglo import Checkpoint


def exit_with_parent() -> None:
    """The pool's initializer: end this worker when the process that made the pool ends
    without shutting it down (an xdist worker interrupted at the end of the run: its
    atexit never ran, and its pool's processes were left behind, idle, for good)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


async def _start(url: str, start_at: float) -> siglo.Backend:
    backend = siglo.connect(url)
    await backend.adapter.open()  # type: ignore[attr-defined]
    await asyncio.sleep(max(0.0, start_at - time.time()))
    return backend


async def _cas(backend: siglo.Backend, worker: int, rounds: int) -> list[Any]:
    a = backend.adapter
    wins: list[Any] = []
    for r in range(rounds):
        deadline = time.monotonic() + 20
        while True:  # every process tries round r once the stored revision is r
            cp = await a.get_checkpoint("race")
            if (cp.revision if cp else 0) >= r or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.001)
        try:
            await a.save_checkpoint(
                Checkpoint(stack_id="race", revision=r + 1, timestamp=1,
                           contexts={"w": {"worker": worker}}),
                expected_revision=r,
            )  # fmt: skip
            wins.append(r)
        except siglo.CheckpointConflictError:
            pass
    return wins


async def _claims(backend: siglo.Backend, worker: int, keys: list[str]) -> list[Any]:
    out = []
    for key in keys:
        if await backend.adapter.claim_wait_record(key, f"w{worker}") is not None:
            out.append(key)
    return out


async def _idempotency(backend: siglo.Backend, worker: int, keys: list[str]) -> list[Any]:
    assert backend.idempotency is not None
    return [k for k in keys if await backend.idempotency.claim(k) == "claimed"]


async def _idempotency_owned(backend: siglo.Backend, worker: int, keys: list[str]) -> list[Any]:
    assert backend.idempotency is not None
    out = []
    for key in keys:
        claim = await backend.idempotency.claim_owned(key)
        if claim.state == "claimed":
            out.append([key, claim.token])
    return out


async def _nonces(backend: siglo.Backend, worker: int, keys: list[str]) -> list[Any]:
    assert backend.nonces is not None
    return [k for k in keys if await backend.nonces.claim(k, 60)]


async def _locks(backend: siglo.Backend, worker: int, keys: list[str]) -> list[Any]:
    assert backend.lock is not None
    out = []
    for key in keys:
        result = await backend.lock.acquire(key, 60_000)
        if result.acquired:
            out.append([key, result.fencing_token])
    return out


async def _workflow(backend: siglo.Backend, worker: int, count: int) -> list[Any]:
    a = backend.adapter
    spans: list[Any] = []

    async def action() -> None:
        began = time.time()
        value = await a.get_cached_step("counter")
        await asyncio.sleep(0.002)
        await a.set_cached_step("counter", (0 if value is siglo.MISSING else value) + 1)
        spans.append([began, time.time()])

    for _ in range(count):
        await a.with_workflow_lock("wf", action, timeout_ms=30_000)
    return spans


async def _first(x: int) -> dict[str, int]:
    return {"x": x}


async def _second(x: dict[str, int]) -> dict[str, int]:
    return {**x, "y": 1}


_RUNS = siglo.flow(
    siglo.Step.create("first", _first).cache(ttl_ms=60_000, key=lambda x: f"k:{x}"),
    siglo.Step.create("second", _second),
    name="runs",
)


async def _runs(backend: siglo.Backend, worker: int, ids: int, at_once: int) -> list[Any]:
    """Every process runs the same stack ids, ``at_once`` runs of each at a time (a web
    app's duplicate requests): each run ends with the flow's output, whoever ran it."""
    manager = siglo.StorageManager(backend)

    async def one(i: int) -> Any:
        return await _RUNS.run(i, manager=manager, stack_id=f"s-{i}", namespace=f"ns-{i % 7}")

    return list(await asyncio.gather(*(one(i) for i in range(ids) for _ in range(at_once))))


async def _migrate(backend: siglo.Backend, worker: int) -> list[Any]:
    return list(await backend.adapter.migrate())  # type: ignore[attr-defined]


JOBS: dict[str, Any] = {
    "cas": _cas,
    "claims": _claims,
    "idempotency": _idempotency,
    "idempotency_owned": _idempotency_owned,
    "nonces": _nonces,
    "locks": _locks,
    "workflow": _workflow,
    "runs": _runs,
}


async def _run(job: str, url: str, start_at: float, worker: int, args: dict[str, Any]) -> Any:
    errors: list[str] = []
    result: Any = None
    try:
        if job == "migrate":
            backend = siglo.connect(url, auto_migrate=False)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            result = await _migrate(backend, worker)
        else:
            backend = await _start(url, start_at)
            result = await JOBS[job](backend, worker, **args)
        await backend.aclose()
    except Exception as exc:  # reported to the test, which fails on any
        errors.append(f"{type(exc).__name__}: {exc}")
    return {"worker": worker, "result": result, "errors": errors}


def run_job(job: str, url: str, start_at: float, worker: int, args: dict[str, Any]) -> Any:
    """Entry point in the worker process."""
    return asyncio.run(_run(job, url, start_at, worker, args))
