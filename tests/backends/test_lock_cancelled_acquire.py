"""A lock acquire cancelled by its caller does not strand the lock for its lease.

A web handler puts a timeout around its work (``asyncio.wait_for``); the timeout can
cancel a lock's acquire after the store granted the lock and before the reply came
back, and the token that releases it was in the lost reply: the lock stayed held by
nobody for its whole lease (30 s for a workflow lock), and every retry of the run was
refused until then (found from outside: 8 of 40 timed-out runs on PostgreSQL, 2 on
Redis). The acquire now carries a token made before the call, and a cancelled one is
released with it in the background (siglo.coordination.acquire_undone_on_cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random

import pytest
from background import background_settled
from raw_storage import any_backend

from siglo.locking import workflow_lock_key

LEASE_MS = 60_000
"""Far longer than the test waits: a lock freed only by its lease fails the test."""

RUNS_OF = {"sqlite": 40, "postgres": 100, "redis": 150}
"""Timed-out calls a test makes on each kind: Redis's calls are cut off mid-flight most
often (its commands go out at the end of the loop's turn), SQLite's least (inline)."""

TIMEOUTS_S = {"sqlite": (0.00002, 0.001), "postgres": (0.0002, 0.004), "redis": (0.00005, 0.0015)}
"""Each kind's timeouts: from before its acquire is sent to after its reply is read."""


async def _settle() -> None:
    """Wait for the background releases of the cancelled acquires to finish."""
    assert await background_settled(10) == 0  # the last undo is 3 s after its cancellation


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_timed_out_with_lock_leaves_no_lock_held(kind: str) -> None:
    RUNS = RUNS_OF[kind]
    async with any_backend(kind) as backend:
        lock = backend.require_lock()
        ran: list[int] = []
        rng = random.Random(7)
        for i in range(RUNS):

            async def action(i: int = i) -> None:
                ran.append(i)

            timeout = rng.uniform(*TIMEOUTS_S[kind])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lock.with_lock(f"key-{i}", action, LEASE_MS), timeout)
        await _settle()
        held = [i for i in range(RUNS) if await lock.inspect(f"key-{i}") is not None]
        assert held == [], f"{len(held)} of {RUNS} locks held by nobody: {held}"
        # And each key is free at once for the next caller.
        for i in range(RUNS):

            async def again() -> str:
                return "ran"

            assert await lock.with_lock(f"key-{i}", again, LEASE_MS) == "ran"


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_timed_out_workflow_lock_leaves_no_lock_held(kind: str) -> None:
    RUNS = RUNS_OF[kind]
    async with any_backend(kind, workflow_lock_ttl_ms=LEASE_MS) as backend:
        adapter = backend.adapter
        rng = random.Random(11)
        for i in range(RUNS):

            async def action() -> str:
                return "done"

            timeout = rng.uniform(*TIMEOUTS_S[kind])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(adapter.with_workflow_lock(f"run-{i}", action), timeout)
        await _settle()
        lock = adapter.workflow_lock
        assert lock is not None
        held = [
            i
            for i in range(RUNS)
            if await lock.inspect(workflow_lock_key(f"run-{i}", None)) is not None  # type: ignore[attr-defined]
        ]
        assert held == [], f"{len(held)} of {RUNS} workflow locks held by nobody: {held}"


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_timed_out_owned_claim_leaves_no_key_held(kind: str) -> None:
    """An idempotency ``claim_owned`` cut off by its caller: a claim the store granted
    is freed with the token made before the call, so the request's retry claims the
    key at once instead of meeting "in progress" for the claim's whole lease."""
    RUNS = RUNS_OF[kind]
    async with any_backend(kind) as backend:
        store = backend.require_idempotency()
        rng = random.Random(13)
        owned: dict[str, str] = {}
        for i in range(RUNS):
            with contextlib.suppress(TimeoutError):
                claim = await asyncio.wait_for(
                    store.claim_owned(f"pay-{i}", LEASE_MS), rng.uniform(*TIMEOUTS_S[kind])
                )
                assert claim.token is not None
                owned[f"pay-{i}"] = claim.token  # not cut off: this request holds it
        for key, token in owned.items():
            await store.fail(key, token=token)  # the requests that got their claim end
        await _settle()
        held = [i for i in range(RUNS) if (await store.claim_owned(f"pay-{i}")).state != "claimed"]
        assert held == [], f"{len(held)} of {RUNS} keys held by nobody: {held}"


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_timed_out_delivery_leaves_no_wait_claimed_by_nobody(kind: str) -> None:
    """``flow.deliver`` cut off by its caller while it claims the wait: the claim is given
    back, so no wait stays claimed while its run still waits (a delivery cut off after
    its run's first snapshot keeps its claim, as documented: that run may not be waiting
    any more)."""
    RUNS = RUNS_OF[kind]
    from siglo import Step, StorageManager, WorkflowSuspended, flow, wait_for_event

    async def wait(order: int) -> object:
        return await wait_for_event(f"go:{order}")

    f = flow(Step.create("wait", wait), name="waits")
    async with any_backend(kind) as backend:
        manager = StorageManager(backend)
        runs = RUNS // 3
        for i in range(runs):
            with contextlib.suppress(WorkflowSuspended):
                await f.run(i, manager=manager, stack_id=f"w-{i}")
        rng = random.Random(17)
        low, high = TIMEOUTS_S[kind]
        for i in range(runs):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    f.deliver(f"go:{i}", "x", manager=manager), rng.uniform(low, high * 2)
                )
        await _settle()
        stranded = []
        for i in range(runs):
            record = await backend.adapter.get_wait_record(f"go:{i}")
            stored = await manager.load_checkpoint(f"w-{i}")
            assert record is not None and stored is not None
            if record.status == "claimed" and stored.status == "waiting":
                stranded.append(i)
        assert stranded == [], f"{len(stranded)} of {runs} waits claimed by nobody: {stranded}"


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_with_lock_cut_off_in_its_release_leaves_no_lock_held(kind: str) -> None:
    """The caller's deadline ends after ``fn`` returned, while ``with_lock`` releases:
    the release is made again in the background, not left to the TTL (Redis stranded 2
    of some 40 such cut-offs in 300 calls before)."""
    RUNS = RUNS_OF[kind]
    async with any_backend(kind) as backend:
        lock = backend.require_lock()
        rng = random.Random(19)
        top = 0.003 if kind == "redis" else 0.02
        cut_after_fn: list[str] = []
        for i in range(2 * RUNS):
            ran: list[bool] = []

            async def fn(ran: list[bool] = ran) -> str:
                ran.append(True)
                return "done"

            deadline = math.exp(rng.uniform(math.log(50e-6), math.log(top)))
            try:
                async with asyncio.timeout(deadline):
                    await lock.with_lock(f"rel-{i}", fn, LEASE_MS)
            except TimeoutError:
                if ran:
                    cut_after_fn.append(f"rel-{i}")
        await _settle()
        held = [key for key in cut_after_fn if await lock.inspect(key) is not None]
        assert held == [], f"{len(held)} of {len(cut_after_fn)} locks held by nobody: {held}"


async def test_a_connection_closed_right_after_a_cut_off_acquire_strands_no_lock() -> None:
    """A script (or a request with a connection of its own) that closes its connection
    at once after a cut-off ``with_lock``: ``aclose`` first waits (bounded) for the
    undo, so the lock is not left held by nobody for its lease."""
    import os

    from _redis_helpers import REDIS_URL, require_redis

    import siglo
    from siglo_redis.connect import delete_prefix

    require_redis()
    prefix = f"siglo-test-undo-{os.urandom(4).hex()}:"
    rng = random.Random(23)
    try:
        for i in range(60):
            async with siglo.connect(REDIS_URL, prefix=prefix) as backend:
                lock = backend.require_lock()

                async def fn() -> None:
                    return None

                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        lock.with_lock(f"c-{i}", fn, LEASE_MS), rng.uniform(*TIMEOUTS_S["redis"])
                    )
        async with siglo.connect(REDIS_URL, prefix=prefix) as fresh:
            lock = fresh.require_lock()
            held = [i for i in range(60) if await lock.inspect(f"c-{i}") is not None]
        assert held == [], f"{len(held)} of 60 locks held by nobody: {held}"
    finally:
        async with siglo.connect(REDIS_URL, prefix=prefix) as other:
            await delete_prefix(other.adapter.client, prefix)  # type: ignore[attr-defined]
