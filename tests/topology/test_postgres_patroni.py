"""siglo on a real HA PostgreSQL: Patroni with etcd (the Debian packages), two nodes in
Patroni's ``synchronous_mode``, through a switchover and through a failover.

The fixture starts one etcd and two Patroni nodes on free loopback ports in
30400-30499 (about 11 s: Patroni bootstraps the leader, then clones the standby) and
stops them. The backend's URL names both nodes with ``target_session_attrs=read-write``,
so the same backend object follows the leader. The drill's accounting
(:mod:`siglo.drill`) runs through each change: with a synchronous standby nothing
acknowledged may be lost — no save, no lock granted twice, no fencing token going back,
no claim won twice. Slow (a failover waits for the leader key's TTL): run with
``SIGLO_TEST_TOPOLOGIES=1``; each prints a ``FAILOVER …`` line under ``-s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest
from _failover import LoopLag, run_through_failover
from _patroni import TTL_S, PatroniCluster
from _pg_topologies import free_ports

from siglo.drill import DrillReport
from siglo_postgres.connect import connect

pytestmark = pytest.mark.measured_losses


@pytest.fixture
def patroni() -> Iterator[PatroniCluster]:
    cluster = PatroniCluster(free_ports(30400, 30500, 6))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


async def _drill(
    cluster: PatroniCluster, name: str, change: Callable[[], Awaitable[object]]
) -> DrillReport:
    url = cluster.url + "&command_timeout_ms=3000&pool_timeout_ms=3000&connect_timeout_ms=2000"
    async with connect(url) as backend:
        lag = LoopLag()
        report = await run_through_failover(backend, change, limit_s=90, lag=lag)
    print(report.line(name))
    for violation in report.violations[:10]:
        print("  ", violation)
    assert report.setting == "synchronous standby"
    assert report.violations == [], report.violations
    assert report.verdict == "pass"
    assert report.cleaned_up
    # Each call within command_timeout_ms (3 s) and 1.5 s, and however late the loaded
    # machine's event loop ran a timer meanwhile.
    assert report.longest_failed_call_s < 4.5 + lag.longest_s, (report, lag)
    return report


async def test_siglo_through_a_patroni_switchover(patroni: PatroniCluster) -> None:
    old = patroni.leader()
    report = await _drill(
        patroni, "patroni switchover", lambda: asyncio.to_thread(patroni.switchover)
    )
    assert patroni.leader() is not old
    assert report.outage_s < 30


async def test_siglo_through_a_patroni_failover(patroni: PatroniCluster) -> None:
    old = patroni.leader()
    report = await _drill(
        patroni,
        "patroni failover (leader node killed)",
        lambda: asyncio.to_thread(patroni.kill_leader),
    )
    new = patroni.leader()
    assert new is not None and new is not old
    assert report.failed_calls > 0
    # The leader key lapses after its TTL; the standby then promotes.
    assert report.outage_s < TTL_S + 20
