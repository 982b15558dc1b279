"""Callers in other processes, for the concurrency rules of backends shared across processes.

A worker is a process of its own, ``python -m siglo_contract.workers``: it never imports
the script that runs the suite (as ``multiprocessing``'s spawn would, which re-runs a
script without a ``__main__`` guard), so ``run_contract`` works from any script. It reads
one request per line on stdin (JSON: ``kind``, ``url``, ``options``, ``start_at``,
``args``) and answers each with one line on stdout: ``{"result": …}`` or
``{"error": "…"}``. For each request it connects to the run's storage by URL
(``Backend.url`` of the isolated backend), waits until the common start time so the
callers really overlap, makes its call and answers with plain JSON data.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import traceback
from typing import Any

import orjson

from siglo.checkpoint import Checkpoint
from siglo.clock import ManualClock
from siglo.errors import CheckpointConflictError
from siglo_contract.target import connect_url

__all__ = ["run_worker", "serve"]


def run_worker(
    kind: str, url: str, options: dict[str, Any], start_at: float, args: dict[str, Any]
) -> Any:
    """One request: connect, wait for ``start_at``, make the call, return its result."""
    if options.pop("manual_clock_ms", None) is not None:
        options["clock"] = ManualClock(args["now_ms"])
    return asyncio.run(_work(kind, url, options, start_at, args))


def serve() -> None:
    """Answer requests from stdin until it closes (the process's main loop)."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            request = orjson.loads(line)
            result = run_worker(
                request["kind"],
                request["url"],
                request["options"],
                request["start_at"],
                request["args"],
            )
            answer = orjson.dumps({"result": result})
        except Exception as exc:
            detail = "".join(traceback.format_exception(exc, limit=-3))
            answer = orjson.dumps({"error": f"{type(exc).__name__}: {exc}\n{detail}"})
        out.write(answer + b"\n")
        out.flush()


async def _work(
    kind: str, url: str, options: dict[str, Any], start_at: float, args: dict[str, Any]
) -> Any:
    backend = connect_url(url, **options)
    try:
        # Warm the connection first, so the race is between calls, not connects.
        if kind == "cas_save" or kind == "workflow_lock":
            await backend.adapter.get_checkpoint(args["stack_id"]) if kind == "cas_save" else None
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == "cas_save":
            # Several rounds, each a race of every process on the next revision.
            outcomes: list[str] = []
            for i in range(args["rounds"]):
                delay = start_at + i * 0.05 - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                doc = dict(args["checkpoint"], revision=args["expected"] + i + 1)
                try:
                    await backend.adapter.save_checkpoint(
                        Checkpoint.from_wire(doc), expected_revision=args["expected"] + i
                    )
                    outcomes.append("won")
                except CheckpointConflictError:
                    outcomes.append("conflict")
            return outcomes
        if kind == "wait_claim":
            rec = await backend.adapter.claim_wait_record(args["key"], args["claimant"])
            return None if rec is None else rec.claimant_id
        if kind == "idem_claim":
            assert backend.idempotency is not None
            return await backend.idempotency.claim(args["key"])
        if kind == "nonce_claim":
            assert backend.nonces is not None
            return await backend.nonces.claim(args["key"], 60)
        if kind == "lock_acquire":
            assert backend.lock is not None
            return (await backend.lock.acquire(args["key"], 60_000)).acquired
        if kind == "workflow_lock":
            intervals: list[tuple[float, float]] = []

            async def action() -> int:
                entered = time.time()
                await asyncio.sleep(args["hold_s"])
                intervals.append((entered, time.time()))
                return os.getpid()

            for _ in range(args["rounds"]):
                pid = await backend.adapter.with_workflow_lock(args["stack_id"], action)
                assert pid == os.getpid()
            return intervals
        raise ValueError(f"unknown worker kind {kind!r}")
    finally:
        await backend.aclose()


if __name__ == "__main__":
    serve()
