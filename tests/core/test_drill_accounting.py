"""What ``siglo drill`` (:mod:`siglo.drill`) reports, against real servers.

Each test stands for a defect a black-box auditor found: ``--expect`` printed as the
table's promise (and a ``FAIL`` line contradicting itself); the replication setting read
from the URL's text instead of the connected client (``wait_replicas=00`` is no WAIT);
the check after the run counting a lost acknowledgement as honoured when the check's own
write had an unknown outcome; the "first failure" figure being when the failed operation
began, not when it failed. Servers of their own (a master with a replica, a server to
pause) are started on loopback ports from the ledger (tests/support/ports.py); the shared
Redis is only read.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, RedisServer, require_redis, wait_for_replica_links
from click.testing import CliRunner
from ports import free_ports

import siglo
from siglo.cli import cli
from siglo.drill import Drill, DrillReport, Violation, detect_setting
from siglo.errors import OutcomeUnknownError


@dataclass
class Replicated:
    """A master with one replica, both of our own."""

    master: RedisServer
    replica: RedisServer


@pytest.fixture(scope="module")
def replicated() -> Iterator[Replicated]:
    master_port, replica_port = free_ports(30600, 30700, 2)
    # No delay before the first full sync (5 s by default): the replica links at once.
    master = RedisServer(master_port, "--repl-diskless-sync-delay", "0").start()
    replica = RedisServer(replica_port, "--replicaof", "127.0.0.1", str(master_port))
    try:
        replica.start()
        wait_for_replica_links([replica_port], replicas=1)
        _until_acknowledged_by_the_replica(master_port)
        yield Replicated(master, replica)
    finally:
        replica.stop()
        master.stop()


def _until_acknowledged_by_the_replica(port: int) -> None:
    """Until a write on the master is confirmed by ``WAIT``: a replica just linked may
    acknowledge nothing for a moment, and a drill's first writes under
    ``wait_replicas=1`` then had unknown outcomes (its only lock key held by a token
    nobody had, no lock acknowledged)."""
    import redis

    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 30
        client.set("drill-accounting-test:warm", 1)
        while int(client.wait(1, 200)) < 1:
            assert time.monotonic() < deadline, "the replica confirmed no write in 30 s"
        client.delete("drill-accounting-test:warm")
    finally:
        client.close()


def _delete(port: int, pattern: str) -> int:
    """Every key matching ``pattern`` deleted on the server at ``port``: what a failover
    to a replica that lacked them does to what was acknowledged."""
    import redis

    client = redis.Redis(port=port)
    try:
        return sum(int(client.delete(key)) for key in client.scan_iter(pattern))
    finally:
        client.close()


# -- --expect: the table's promise, and apart from it the expectation applied -----------


def test_expect_is_said_apart_from_the_tables_promise_and_the_fail_line_agrees(
    replicated: Replicated,
) -> None:
    """A master with a replica and no WAIT: the table says acknowledgements may be lost.
    With ``--expect nothing-lost`` the report printed ``no WAIT (the table promises:
    nothing-lost)`` and, on a loss, ``where the setting (no WAIT: may-lose) promises
    none is lost``. It says the table's promise, and that the verdict applies the
    expectation of --expect instead; the FAIL line names that expectation and source."""
    url = f"{replicated.master.url}?command_timeout_ms=3000"
    lost: list[int] = []
    # The drill's checkpoints removed on the master mid-run: acknowledged saves lost.
    timer = threading.Timer(
        1.0, lambda: lost.append(_delete(replicated.master.port, "*siglo-drill-*:checkpoint:*"))
    )
    timer.start()
    try:
        result = CliRunner().invoke(
            cli,
            ["drill", url, "--rate", "200", "--duration", "2", "--expect", "nothing-lost"],
            env={"COLUMNS": "250"},
        )
    finally:
        timer.join()
    assert lost and lost[0] > 0, "nothing was removed: no loss to report"
    assert result.exit_code == 3, result.output
    setting = next(line for line in result.stdout.splitlines() if "│ setting" in line)
    assert (
        "no WAIT (the table promises: may-lose); the verdict applies nothing-lost, from "
        "--expect" in setting
    ), setting
    fail = next(line for line in result.stderr.splitlines() if line.startswith("verdict: FAIL"))
    assert "expected nothing-lost, from --expect (the table promises may-lose for no WAIT)" in (
        fail
    ), fail
    assert "(no WAIT: may-lose) promises none is lost" not in result.output


def test_expect_may_lose_on_a_single_server_is_said_alike_in_json() -> None:
    """The reverse, on SQLite: the table promises nothing-lost, --expect says may-lose;
    --json carries the table's promise, the expectation applied and its source, and the
    same sentence as the FAIL line would."""
    args = ["drill", "sqlite://", "--duration", "0.6", "--rate", "100", "--expect", "may-lose"]
    result = CliRunner().invoke(cli, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    setting = next(line for line in result.stdout.splitlines() if "│ setting" in line)
    assert (
        "single server (the table promises: nothing-lost); the verdict applies may-lose, "
        "from --expect" in setting
    ), setting
    as_json = CliRunner().invoke(cli, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    assert document["setting"] == "single server"
    assert document["table_promise"] == "nothing-lost"
    assert document["expectation"] == "may-lose"
    assert document["expectation_source"] == "--expect"
    assert document["verdict"] == "pass"
    assert document["verdict_reason"] == (
        "every acknowledgement honoured: expected may-lose, from --expect (the table "
        "promises nothing-lost for single server)"
    )
    # A loss under that expectation: allowed, and said with the same source.
    report = DrillReport(**{k: document[k] for k in ("drill_id", "setting", "expectation")})
    report.expectation_source = "--expect"
    report.lost_saves = 2
    report.violations.append(Violation("lost save", "s", "revision 3 …", 1.0))
    assert report.verdict == "losses allowed"
    assert report.as_json()["verdict_reason"] == (
        "2 acknowledgement(s) not honoured, as may happen: expected may-lose, from --expect "
        "(the table promises nothing-lost for single server)"
    )
    # Without --expect the table's own promise is applied, and said to be the table's.
    table = DrillReport(drill_id="d", setting="wait_replicas", expectation="nothing-lost")
    table.nonce_replays = 1
    assert table.verdict_reason == (
        "1 acknowledgement(s) not honoured where none may be lost: expected nothing-lost "
        "(the table's promise for wait_replicas)"
    )
    assert ("setting", "wait_replicas (the table promises: nothing-lost)") in table.summary()


# -- the setting: from the connected client, not the URL's text ------------------------


async def test_the_setting_is_what_the_client_does_not_what_the_url_spells() -> None:
    """``wait_replicas=00`` and ``+0`` are 0 to siglo.connect (no WAIT is sent); the
    drill compared the URL's text with "0" and claimed the wait_replicas setting, whose
    verdict fails on losses the table allows. A client given to connect() carries its
    own WAIT and cluster, which the URL does not say at all."""
    require_redis()
    from siglo_redis.client import client_from_url, close_client
    from siglo_redis.connect import connect

    base = f"{REDIS_URL}?prefix=drill-accounting-test:&command_timeout_ms=3000"
    async with siglo.connect(base) as plain:
        expected = await detect_setting(plain)
    assert expected in ("single server", "no WAIT")  # the shared server's own replicas
    for value in ("00", "+0"):
        async with siglo.connect(f"{base}&wait_replicas={value}") as backend:
            assert await detect_setting(backend) == expected, value
    waiting = client_from_url(f"{REDIS_URL}?wait_replicas=1")
    cluster = client_from_url(f"{REDIS_URL}?cluster=true")
    try:
        given = connect(base, client=waiting)
        assert await detect_setting(given) == "wait_replicas"
        await given.aclose()
        # Never connected: a cluster client is known by its class, no call made.
        given = connect(base, client=cluster)
        assert await detect_setting(given) == "cluster without WAIT"
        await given.aclose()
    finally:
        await close_client(waiting)
        await close_client(cluster)


# -- the check after the run, its own writes' outcome unknown ---------------------------


class _AfterTheRun:
    """A store passed through, but for its first call after the run (the check's): the
    replica paused first (so the write's WAIT fails: an unknown outcome, the write
    applied on the master), and the drill's keys of that primitive removed from the
    master (the acknowledgements lost, as in a failover to a replica lacking them)."""

    def __init__(self, inner: Any, over: Callable[[], bool], fault: Callable[[], None]) -> None:
        self._inner = inner
        self._over = over
        self._fault = fault
        self.fired = False
        self.first_error: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            first = self._over() and not self.fired
            if first:
                self.fired = True
                self._fault()
            try:
                return await attr(*args, **kwargs)
            except BaseException as exc:
                if first:
                    self.first_error = exc
                raise

        return call


async def test_a_check_whose_own_write_had_an_unknown_outcome_never_passes_a_loss(
    replicated: Replicated,
) -> None:
    """The check after the run is itself a write (a nonce claimed, a lock taken). Under
    ``wait_replicas=1`` with the replica paused, the first check write lands on the
    master and its WAIT fails: an unknown outcome. The drill retried it, the retry was
    refused by the check's own write, and the lost acknowledgement counted as honoured
    with "re-checked after the run: yes". Now a lock's check is told apart by its own
    token (``inspect``), an idempotency key's by the acknowledged claim's owner token
    (``extend``, which creates nothing), and a nonce, which has neither, is counted as
    not re-checked: every lost acknowledgement is a violation or unchecked, and the
    report says the re-check is incomplete."""
    master, replica = replicated.master, replicated.replica
    url = f"{master.url}?wait_replicas=1&wait_timeout_ms=200&command_timeout_ms=3000"
    loop = asyncio.get_running_loop()
    async with siglo.connect(url) as backend:
        assert await detect_setting(backend) == "wait_replicas"
        drill_box: list[Drill] = []

        def over() -> bool:
            return bool(drill_box) and drill_box[0].report.duration_s > 0

        def fault(kind: str) -> Callable[[], None]:
            def pause_and_lose() -> None:
                replica.pause()
                # Shorter than the lease (1 s) the old check took a lock for: a retry
                # after the replica is back met the check's own grant still held.
                loop.call_later(0.5, replica.resume)
                removed[kind] = _delete(master.port, f"*{drill_box[0].id}:{kind}:*")

            return pause_and_lose

        removed: dict[str, int] = {}
        hooks = {
            "idem": _AfterTheRun(backend.idempotency, over, fault("idem")),
            "nonce": _AfterTheRun(backend.nonces, over, fault("nonce")),
            "lock": _AfterTheRun(backend.lock, over, fault("lock")),
        }
        backend.idempotency = hooks["idem"]  # type: ignore[assignment]
        backend.nonces = hooks["nonce"]  # type: ignore[assignment]
        backend.lock = hooks["lock"]  # type: ignore[assignment]
        # Two workers: one lock key, held by its first winner through the end of the run
        # (hold_s), so the check meets a live acknowledged lease once the key is lost.
        drill = Drill(
            backend, rate=200, workers=2, hold_s=60.0, setting="wait_replicas", settle_s=10.0
        )
        drill_box.append(drill)
        try:
            report = await drill.run(asyncio.Event(), duration_s=1.5)
        finally:
            replica.resume()
    assert all(hook.fired for hook in hooks.values()), removed
    # The check writes met a real unknown outcome (the WAIT after them failed).
    assert isinstance(hooks["nonce"].first_error, OutcomeUnknownError), hooks["nonce"].first_error
    assert isinstance(hooks["lock"].first_error, OutcomeUnknownError), hooks["lock"].first_error
    acknowledged = report.acknowledged
    assert removed["nonce"] == acknowledged["nonce"] > 0, (removed, acknowledged)
    assert removed["lock"] == acknowledged["lock"] == 1, (removed, acknowledged)
    assert acknowledged["idempotency"] > 0
    # Every lost acknowledgement is seen, or said to be unchecked: none passes as kept.
    assert report.double_lock_holders == 1, report.violations[-3:]
    assert report.double_idempotency_claims == acknowledged["idempotency"], report
    assert not report.rechecked, "a nonce whose check could not be decided counted as kept"
    unchecked_nonces = [s for s in report.sample_unchecked if s.startswith("nonce ")]
    assert report.unchecked == len(unchecked_nonces) >= 1, report.sample_unchecked
    assert report.nonce_replays + report.unchecked == acknowledged["nonce"], report
    assert report.recheck_failure and "unknown outcome" in report.recheck_failure
    assert ("re-checked after the run", f"no: {report.recheck_failure}") in report.summary()
    assert report.verdict == "fail"
    assert report.cleaned_up


def test_an_acknowledgement_left_unchecked_is_never_a_pass() -> None:
    report = DrillReport(drill_id="d", setting="wait_replicas", expectation="nothing-lost")
    report.unchecked = 1
    report.rechecked = False
    report.recheck_failure = "1 acknowledgement(s) whose check had an unknown outcome …"
    assert report.verdict == "incomplete"


# -- the first failure: when it failed, and when its operation began --------------------


async def test_the_first_failure_is_when_it_failed_and_says_when_its_operation_began() -> None:
    """A paused master fails a call only at ``command_timeout_ms``: the figure was the
    start of the failed operation, ~the timeout early. Now it is when the call failed,
    with its operation's start beside it (the time to recover counts from there)."""
    server = RedisServer(free_ports(30600, 30700, 1)[0]).start()
    try:
        async with siglo.connect(f"{server.url}?command_timeout_ms=500") as backend:
            drill = Drill(backend, rate=100, workers=2, settle_s=5.0)
            stop = asyncio.Event()
            run = asyncio.create_task(drill.run(stop))
            try:
                await asyncio.sleep(0.3)
                server.pause()
                paused_at = drill.elapsed_s
                await _until(lambda: drill.report.first_failure_s is not None, 5.0)
                server.resume()
                resumed_at = drill.elapsed_s
                await _until(lambda: drill.recovered(since=resumed_at + 0.1), 5.0)
            finally:
                server.resume()
                stop.set()
                report = await run
    finally:
        server.stop()
    failed = report.first_failure_s
    assert failed is not None and paused_at + 0.45 <= failed, (paused_at, failed)
    began = report.first_failure_began_s
    assert began is not None and began < paused_at + 0.1, (paused_at, began)
    row = dict(report.summary())["first failure"]
    assert row == f"{failed:.2f} s (its operation began at {began:.2f} s)", row
    assert report.recovered_s is not None and report.recovered_s > failed - began
    document = report.as_json()
    assert document["first_failure_s"] == failed
    assert document["first_failure_began_s"] == began


async def _until(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time given"
        await asyncio.sleep(0.02)
