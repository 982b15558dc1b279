"""Several processes racing on one SQLite file and one PostgreSQL schema: exactly one
winner each time, and no "database is locked" (or any other error) leaking out.

Rules: checkpoint.occ.atomic, wait.claim.once, idempotency.claim.once,
nonce.claim.once, lock.acquire.exclusive, lock.fencing, lock.workflow.exclusive — across
processes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sql_support import SHARED_KINDS, open_backend, spawn_pool
from sql_support import race as sql_race

from siglo import WaitRecord

PROCESSES = 4
pytestmark = pytest.mark.parametrize("kind", SHARED_KINDS)


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    with spawn_pool(PROCESSES) as p:
        yield p


async def race(pool: Any, job: str, url: str, **args: Any) -> list[Any]:
    return await sql_race(pool, PROCESSES, job, url, **args)


async def test_cas_saves_race(kind: str, pool: Any) -> None:
    rounds = 15
    async with open_backend(kind) as backend:
        wins = await race(pool, "cas", backend.url, rounds=rounds)
        per_round = Counter(r for w in wins for r in w)
        assert per_round == Counter(range(rounds))  # each round won exactly once
        stored = await backend.adapter.get_checkpoint("race")
        assert stored is not None
        assert stored.revision == rounds
        winner = next(i for i, w in enumerate(wins) if rounds - 1 in w)
        assert stored.contexts == {"w": {"worker": winner}}


async def test_claims_race(kind: str, pool: Any) -> None:
    keys = [f"k{i}" for i in range(25)]
    async with open_backend(kind) as backend:
        for key in keys:
            await backend.adapter.save_wait_record(WaitRecord(correlation_key=key, stack_id="s"))
        won = await race(pool, "claims", backend.url, keys=keys)
        assert Counter(k for w in won for k in w) == Counter(keys)
        for worker, keys_won in enumerate(won):
            for key in keys_won:
                record = await backend.adapter.get_wait_record(key)
                assert record is not None
                assert record.claimant_id == f"w{worker}"


@pytest.mark.parametrize("job", ["idempotency", "nonces"])
async def test_key_claims_race(kind: str, job: str, pool: Any) -> None:
    keys = [f"k{i}" for i in range(25)]
    async with open_backend(kind) as backend:
        won = await race(pool, job, backend.url, keys=keys)
        assert Counter(k for w in won for k in w) == Counter(keys)


async def test_locks_race(kind: str, pool: Any) -> None:
    keys = [f"k{i}" for i in range(25)]
    async with open_backend(kind) as backend:
        won = await race(pool, "locks", backend.url, keys=keys)
        acquired = [tuple(x) for w in won for x in w]
        assert Counter(k for k, _ in acquired) == Counter(keys)
        assert all(fence == 1 for _, fence in acquired)


async def test_workflow_lock_across_processes(kind: str, pool: Any) -> None:
    count = 8
    async with open_backend(kind) as backend:
        spans = await race(pool, "workflow", backend.url, count=count)
        # No lost update: every action read the counter alone.
        assert await backend.adapter.get_cached_step("counter") == PROCESSES * count
        flat = sorted(tuple(s) for w in spans for s in w)
        for (_, end), (begin, _) in itertools.pairwise(flat):
            assert end <= begin + 0.001  # never overlapping (1 ms for clock resolution)
