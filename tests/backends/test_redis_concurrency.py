"""Real concurrency against Redis: many clients and several processes race; one wins."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo import Checkpoint, WaitRecord
from siglo_redis import isolated

rule = pytest.mark.rule
N = 16


@pytest.fixture
async def clients(redis_backend: siglo.Backend) -> AsyncIterator[list[siglo.Backend]]:
    """N backends with their own connections, all on the same keys."""
    backends = [siglo.connect(redis_backend.url) for _ in range(N)]
    try:
        yield backends
    finally:
        for backend in backends:
            await backend.aclose()


@rule("checkpoint.occ.atomic", "wait.claim.once", "idempotency.claim.once",
      "nonce.claim.once", "lock.acquire.exclusive")  # fmt: skip
async def test_many_clients_race_one_winner(clients: list[siglo.Backend]) -> None:
    first = clients[0]
    await first.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
    await first.adapter.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"))

    async def race(i: int, b: siglo.Backend) -> dict[str, bool]:
        assert b.idempotency is not None and b.nonces is not None and b.lock is not None
        try:
            await b.adapter.save_checkpoint(
                Checkpoint(stack_id="s", revision=2, timestamp=1, metadata={"w": i}),
                expected_revision=1,
            )
            saved = True
        except siglo.CheckpointConflictError:
            saved = False
        return {
            "save": saved,
            "claim": await b.adapter.claim_wait_record("k", f"c{i}") is not None,
            "idempotency": await b.idempotency.claim("evt") == "claimed",
            "nonce": await b.nonces.claim("sig", 60),
            "lock": (await b.lock.acquire("L", 5_000)).acquired,
        }

    outcomes = await asyncio.gather(*(race(i, b) for i, b in enumerate(clients)))
    for name in ("save", "claim", "idempotency", "nonce", "lock"):
        assert sum(o[name] for o in outcomes) == 1, name


def _process_worker(url: str, worker: int, start_at: float) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with siglo.connect(url) as b:
            assert b.idempotency is not None and b.nonces is not None and b.lock is not None
            await b.adapter.get_checkpoint("warm-up")  # connect before the start line
            await asyncio.sleep(max(0.0, start_at - time.time()))
            try:
                await b.adapter.save_checkpoint(
                    Checkpoint(stack_id="s", revision=2, timestamp=1, metadata={"w": worker}),
                    expected_revision=1,
                )
                saved = True
            except siglo.CheckpointConflictError:
                saved = False
            claimed = await b.adapter.claim_wait_record("k", f"p{worker}") is not None
            idem = await b.idempotency.claim("evt") == "claimed"
            nonce = await b.nonces.claim("sig", 60)
            lock = await b.lock.acquire("L", 5_000)
            # Workflow lock: a read-modify-write with a gap, safe only if exclusive.
            redis_client: Any = b.adapter.client  # type: ignore[attr-defined]
            counter = b.adapter.keys.cache("counter")  # type: ignore[attr-defined]
            peak = 0

            async def increment() -> None:
                nonlocal peak
                value = int(await redis_client.get(counter) or 0)
                await asyncio.sleep(0.002)
                await redis_client.set(counter, value + 1)

            for _ in range(5):
                await b.adapter.with_workflow_lock("wf", increment)
            return {
                "save": saved,
                "claim": claimed,
                "idempotency": idem,
                "nonce": nonce,
                "lock": lock.acquired,
                "fence": lock.fencing_token,
            }

    return asyncio.run(main())


@rule("checkpoint.occ.atomic", "wait.claim.once", "lock.workflow.exclusive",
      "lock.acquire.exclusive", "idempotency.claim.once", "nonce.claim.once")  # fmt: skip
async def test_processes_race_one_winner() -> None:
    require_redis()
    workers = 4
    async with isolated(REDIS_URL) as b:
        await b.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        await b.adapter.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"))
        start_at = time.time() + 1.5
        ctx = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        with ctx.Pool(workers) as pool:
            pending = pool.starmap_async(
                _process_worker, [(b.url, i, start_at) for i in range(workers)]
            )
            outcomes = await loop.run_in_executor(None, pending.get, 60)
        for name in ("save", "claim", "idempotency", "nonce", "lock"):
            assert sum(o[name] for o in outcomes) == 1, (name, outcomes)
        winner = next(o for o in outcomes if o["save"])
        stored = await b.adapter.get_checkpoint("s")
        assert stored is not None and stored.metadata == {"w": outcomes.index(winner)}
        assert await b.adapter.client.get(b.adapter.keys.cache("counter")) == b"20"  # type: ignore[attr-defined]
