"""PostgreSQL calls wait for a free connection at siglo's gate in front of psycopg's pool
(siglo_postgres.checkout) and are bounded by one timer per database for all calls in
flight (siglo_postgres.watches): the waits keep their order and their bounds, a cancelled
or timed-out caller leaks no connection, and each of many calls held up at once fails
at its own deadline. Against the real server: connections held in open transactions,
and a row lock held by another connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo import Checkpoint
from siglo_postgres import isolated
from siglo_postgres.checkout import Gate

POOL = 2
WAIT_MS = 400


def cp(revision: int, stack_id: str = "s") -> Checkpoint:
    return Checkpoint(stack_id=stack_id, revision=revision, timestamp=1)


@pytest.fixture
async def pg() -> AsyncIterator[siglo.Backend]:
    require_postgres()
    async with isolated(
        POSTGRES_URL, pool_min_size=POOL, pool_max_size=POOL, pool_timeout_ms=WAIT_MS
    ) as backend:
        await backend.adapter.save_checkpoint(cp(1))
        yield backend


async def hold_connection(backend: siglo.Backend, release: asyncio.Event) -> None:
    """Keep one of the pool's connections in an open transaction until ``release``."""
    async with backend.adapter.database.transaction() as tx:  # type: ignore[attr-defined]
        await tx.fetch("SELECT 1")
        await release.wait()


async def test_a_caller_finding_every_connection_taken_waits_its_bound_then_fails(
    pg: siglo.Backend,
) -> None:
    release = asyncio.Event()
    holders = [asyncio.create_task(hold_connection(pg, release)) for _ in range(POOL)]
    await asyncio.sleep(0.1)
    began = time.monotonic()
    with pytest.raises(siglo.StorageAdapterError, match="couldn't get a connection"):
        await pg.adapter.save_checkpoint(cp(2))
    took = time.monotonic() - began
    assert WAIT_MS / 1000 - 0.05 <= took < WAIT_MS / 1000 + 1.0, took
    release.set()
    await asyncio.gather(*holders)
    got = await pg.adapter.get_checkpoint("s")
    assert got is not None and got.revision == 1  # the refused save stored nothing
    # No connection was lost to the refused call: the pool serves POOL holders again.
    release = asyncio.Event()
    holders = [asyncio.create_task(hold_connection(pg, release)) for _ in range(POOL)]
    await asyncio.sleep(0.1)
    assert all(not h.done() for h in holders)
    release.set()
    await asyncio.gather(*holders)
    await pg.adapter.save_checkpoint(cp(2), expected_revision=1)


async def test_waiting_callers_are_served_in_the_order_they_came(pg: siglo.Backend) -> None:
    release = asyncio.Event()
    holders = [asyncio.create_task(hold_connection(pg, release)) for _ in range(POOL)]
    await asyncio.sleep(0.1)
    served: list[int] = []

    async def call(i: int) -> None:
        await pg.adapter.get_checkpoint("s", fallback=False, namespace=f"n{i}")
        served.append(i)

    waiting = []
    for i in range(6):
        waiting.append(asyncio.create_task(call(i)))
        await asyncio.sleep(0.01)  # they come one after another
    release.set()
    await asyncio.gather(*holders, *waiting)
    assert served == sorted(served), served


async def test_a_cancelled_waiter_leaks_no_connection(pg: siglo.Backend) -> None:
    release = asyncio.Event()
    holders = [asyncio.create_task(hold_connection(pg, release)) for _ in range(POOL)]
    await asyncio.sleep(0.1)
    waiters = [asyncio.create_task(pg.adapter.get_checkpoint("s")) for _ in range(3)]
    await asyncio.sleep(0.05)
    for w in waiters:
        w.cancel()
    release.set()
    await asyncio.gather(*holders)
    for w in waiters:
        with pytest.raises(asyncio.CancelledError):
            await w
    # Every connection is free again: POOL holders at once, and a call beside them waits.
    release = asyncio.Event()
    holders = [asyncio.create_task(hold_connection(pg, release)) for _ in range(POOL)]
    await asyncio.sleep(0.1)
    assert all(not h.done() for h in holders)
    with pytest.raises(siglo.StorageAdapterError, match="couldn't get a connection"):
        await pg.adapter.get_checkpoint("s")
    release.set()
    await asyncio.gather(*holders)


async def test_calls_held_up_at_once_each_fail_at_their_own_deadline() -> None:
    """One timer serves every call in flight: calls started 150 ms apart behind a row
    lock each fail at their own bound — 150 ms apart, not together and not one after
    another — and the backend works afterwards."""
    require_postgres()
    bound_ms = 600
    async with isolated(POSTGRES_URL, command_timeout_ms=bound_ms) as pg:
        await pg.adapter.save_checkpoint(cp(1))
        schema = pg.adapter.schema  # type: ignore[attr-defined]
        began = time.monotonic()

        async def save(delay: float, revision: int) -> tuple[float, float]:
            await asyncio.sleep(delay)
            started = time.monotonic()
            with pytest.raises(siglo.StorageAdapterError, match="timed out"):
                await pg.adapter.save_checkpoint(cp(revision))
            return started - began, time.monotonic() - began

        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as other:
            await other.execute(f'SELECT 1 FROM "{schema}".siglo_checkpoints FOR UPDATE')
            spans = await asyncio.gather(*(save(0.15 * i, 2 + i) for i in range(4)))
            await other.rollback()
        # Each call ends at its own start plus the bound: never before it, and late by
        # less than the 150 ms between calls plus a loaded machine's stall (a shared timer
        # that served only the first deadline, or calls that waited for each other, end
        # their later calls a bound or more late).
        late = [end - start - bound_ms / 1000 for start, end in spans]
        assert all(-0.05 <= x < 0.4 for x in late), (spans, late)
        await pg.adapter.save_checkpoint(cp(2), expected_revision=1)


# -- the gate itself -----------------------------------------------------------------------


async def test_the_gate_hands_a_permit_on_when_its_waiter_was_cancelled_after_it() -> None:
    """A waiter given a permit and cancelled before it ran passes the permit on."""
    gate = Gate(1, 5.0)
    assert await gate.acquire() is None
    first = asyncio.create_task(gate.acquire())
    second = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0)
    gate.release()  # the permit goes to `first`...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1) is not None  # it got the permit
    gate.release()
    assert await gate.acquire() is None  # and it came back


async def test_the_gate_times_out_each_waiter_at_its_own_deadline() -> None:
    gate = Gate(1, 0.3)
    await gate.acquire()
    loop = asyncio.get_running_loop()
    began = loop.time()

    async def wait(delay: float) -> float:
        await asyncio.sleep(delay)
        with pytest.raises(Exception, match="couldn't get a connection"):
            await gate.acquire()
        return loop.time() - began

    ends: list[Any] = await asyncio.gather(*(wait(0.1 * i) for i in range(3)))
    for i, end in enumerate(ends):
        assert 0.3 + 0.1 * i - 0.02 <= end < 0.3 + 0.1 * i + 0.2, ends
    gate.release()
    assert await gate.acquire() is None  # the timed-out waiters took no permit


async def test_a_connection_whose_call_timed_out_is_not_given_to_another_call() -> None:
    """An expired call's cancel goes on a connection of its own and may reach the server
    after the call ended: its connection, given back to the pool, had the next caller's
    statement cancelled ("canceling statement due to user request", a black-box auditor,
    a few rounds in a hundred). The connection is closed instead; the next call gets a
    new session, and every call after it runs."""
    require_postgres()
    async with isolated(
        POSTGRES_URL, pool_min_size=1, pool_max_size=1, command_timeout_ms=300
    ) as backend:
        assert await backend.adapter.get_checkpoint("s") is None  # opened
        db: Any = backend.adapter.database
        before = (await db.raw_fetch("SELECT pg_backend_pid()"))[0][0]
        with pytest.raises(siglo.StorageAdapterError, match="timed out"):
            await db.raw_fetch("SELECT pg_sleep(5)")
        after = (await db.raw_fetch("SELECT pg_backend_pid()"))[0][0]
        assert after != before
        for _ in range(20):
            assert (await db.raw_fetch("SELECT 1"))[0][0] == 1
