"""PostgreSQL primary failover: a primary and a streaming replica of our own, the
primary killed mid-run and the replica promoted.

The fixture runs ``initdb`` and ``pg_basebackup`` into a temporary directory and starts
both servers on free loopback ports in 30300-30399 (a few seconds). The backend's URL
names both hosts with ``target_session_attrs=read-write``, so libpq connects to
whichever accepts writes: the same backend object carries on against the promoted
replica. With ``synchronous_commit=on`` and the replica as synchronous standby, a commit
is acknowledged only once the replica has it, so no acknowledged save is lost. Set
``SIGLO_TEST_TOPOLOGIES=1`` for the asynchronous replica as well, whose losses are
measured and reported rather than asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from _failover import Figures, run_through_failover
from _pg_topologies import PostgresPair, free_ports

from siglo_postgres.connect import connect


def pair_of(synchronous: bool) -> Iterator[PostgresPair]:
    pair = PostgresPair(free_ports(30310, 30400, 2), synchronous=synchronous)
    try:
        yield pair.start()
    finally:
        pair.stop()


@pytest.fixture
def sync_pair() -> Iterator[PostgresPair]:
    yield from pair_of(True)


@pytest.fixture
def async_pair() -> Iterator[PostgresPair]:
    yield from pair_of(False)


async def _kill_and_promote(pair: PostgresPair) -> None:
    pair.primary.kill()
    await asyncio.to_thread(pair.promote)


async def _failover(pair: PostgresPair, name: str) -> Figures:
    # Short bounds, so that a call to the dead primary fails fast and the pool does not
    # wait long for a connection while no host accepts writes.
    url = pair.url + "&command_timeout_ms=3000&pool_timeout_ms=3000&connect_timeout_ms=2000"
    async with connect(url) as backend:
        figures = await run_through_failover(backend, lambda: _kill_and_promote(pair), limit_s=60)
        print(figures.line(name))
        role = pair.replica.sql("SELECT pg_is_in_recovery()")
        assert role == "f"  # the replica is the primary now
        assert figures.recovery_s < 30
        assert figures.longest_failed_call_s < 10
        return figures


async def test_multi_host_url_reaches_the_primary(sync_pair: PostgresPair) -> None:
    async with connect(sync_pair.url) as backend:
        await backend.adapter.set_cached_step("k", 1)
        assert await backend.adapter.get_cached_step("k") == 1
        assert "127.0.0.1:" in backend.adapter.database.description  # type: ignore[attr-defined]
    # Streamed to the replica (synchronous_commit=on waits for its flush, not for its
    # replay, so the row may take a moment to be visible there).
    # The bound only stops a test that would wait forever: replay is slow on a loaded
    # machine (over 5 s seen with the rest of the suite running beside it).
    deadline = time.monotonic() + 60
    while sync_pair.replica.sql("SELECT count(*) FROM siglo_step_cache") != "1":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_failover_loses_no_synchronously_committed_save(sync_pair: PostgresPair) -> None:
    figures = await _failover(sync_pair, "postgres, synchronous replica")
    assert figures.lost == 0


@pytest.mark.measured_losses
async def test_failover_with_an_asynchronous_replica_is_measured(async_pair: PostgresPair) -> None:
    await _failover(async_pair, "postgres, asynchronous replica")
