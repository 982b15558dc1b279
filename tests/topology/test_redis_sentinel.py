"""The Redis backend behind Redis Sentinel: 1 master, 1 replica, 3 Sentinels on loopback.

Each test starts its own group on free ports in 30100-30199 (about a second) and stops
it. The failover test kills the master with SIGKILL in the middle of a write load: the
Sentinels promote the replica, and the same backend object (no restart) writes to it.
Set ``SIGLO_TEST_TOPOLOGIES=1`` for the run without ``WAIT`` as well, whose losses are
measured and reported rather than asserted (Redis replication is asynchronous).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _failover import LoopLag, run_through_failover
from _redis_helpers import SentinelGroup, redis_cli
from ports import free_ports
from siglo_check import run_siglo_check

import siglo
from siglo import InvalidArgumentError, OutcomeUnknownError
from siglo_redis import connect
from siglo_redis.connect import client_from_url


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    own = SentinelGroup(free_ports(30100, 30200, 5))
    try:
        yield own.start()
    finally:
        own.stop()


@pytest.fixture
def two_replicas() -> Iterator[SentinelGroup]:
    """The deployment docs/deploying.md recommends with ``wait_replicas=1``."""
    own = SentinelGroup(free_ports(30100, 30200, 6), replicas=2)
    try:
        yield own.start()
    finally:
        own.stop()


async def test_the_url_names_the_sentinels_the_service_and_the_db() -> None:
    client = client_from_url(
        "redis+sentinel://:secret@127.0.0.1:30111,[::1],h3:7/my%20svc/3"
        "?sentinel_password=s3&socket_timeout=2"
    )
    try:
        pool = client.connection_pool
        assert pool.service_name == "my svc"
        assert pool.connection_kwargs["db"] == 3
        assert pool.connection_kwargs["password"] == "secret"
        assert pool.connection_kwargs["socket_timeout"] == 2.0
        sentinels = pool.sentinel_manager.sentinels
        kwargs = [s.connection_pool.connection_kwargs for s in sentinels]
        assert [(k["host"], k["port"]) for k in kwargs] == [
            ("127.0.0.1", 30111),
            ("::1", 26379),
            ("h3", 7),
        ]
        assert all(k["password"] == "s3" for k in kwargs)
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/svc/0/extra",
        "redis+sentinel://127.0.0.1:x/svc",
        "redis+sentinel://127.0.0.1:26379/svc/notadb",
        "redis+sentinel:///svc",
        "redis://127.0.0.1:6379/0?wait_replicas=-1",
        "redis://127.0.0.1:6379/0?reinitialize_steps=0",
        "redis://127.0.0.1:6379/0?cluster=true&reinitialize_steps=-1",
    ],
)
def test_bad_sentinel_and_wait_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgumentError):
        connect(url)


async def test_siglo_connect_reaches_the_master(group: SentinelGroup) -> None:
    async with siglo.connect(group.url) as backend:
        await backend.adapter.set_cached_step("k", 1)
        assert await backend.adapter.get_cached_step("k") == 1
        info = await backend.adapter.client.info("server")  # type: ignore[attr-defined]
        assert info["tcp_port"] == group.master.port


@pytest.mark.contract_sweep
def test_siglo_check_passes_against_the_sentinel_url(group: SentinelGroup, tmp_path: Path) -> None:
    run_siglo_check(group.url, tmp_path)


async def test_wait_replicas_fails_a_write_no_replica_confirms(group: SentinelGroup) -> None:
    async with siglo.connect(group.url + "?wait_replicas=1&wait_timeout_ms=200") as backend:
        await backend.adapter.set_cached_step("k", 1)  # the replica confirms
        group.replica.pause()
        try:
            started = time.monotonic()
            with pytest.raises(OutcomeUnknownError, match="confirmed by 0 of the 1 replica"):
                await backend.adapter.set_cached_step("k", 2)
            assert time.monotonic() - started < 2
            # The write did reach the master: not acknowledged is not "not written".
            assert await backend.adapter.get_cached_step("k") == 2
        finally:
            group.replica.resume()


async def test_wait_replicas_never_waits_on_a_read(group: SentinelGroup) -> None:
    """docs/deploying.md: with ``wait_replicas`` each write waits for its replicas, and
    reads go as usual — the sorted-set reads of the wait records, the listings and the
    due timers, and the read-only scripts (a checkpoint's load, a lock's inspection)
    included. With the replica stalled, every read answers at once; before, those went
    with a WAIT and failed with "written on the master"."""
    from siglo import Checkpoint, WaitRecord

    url = group.url + "?wait_replicas=1&wait_timeout_ms=300"
    async with siglo.connect(url) as backend:
        adapter = backend.adapter
        await adapter.save_checkpoint(Checkpoint(stack_id="r", revision=1, timestamp=1))
        await adapter.save_checkpoint(
            Checkpoint(stack_id="r2", revision=1, timestamp=1, contexts={"a": {"n": 1}})
        )
        await adapter.save_wait_record(WaitRecord(correlation_key="w", stack_id="r"))
        lock = backend.require_lock()
        group.replica.pause()
        try:
            reads = {
                "get_checkpoint": lambda: adapter.get_checkpoint("r"),
                "get_checkpoint (contexts)": lambda: adapter.get_checkpoint("r2"),
                "get_wait_record by stack": lambda: adapter.get_wait_record("r"),
                "get_wait_record": lambda: adapter.get_wait_record("w"),
                "list_checkpoints": lambda: adapter.list_checkpoints(limit=5),
                "list_due_waits": lambda: adapter.list_due_waits(limit=5),
                "get_cached_step": lambda: adapter.get_cached_step("nothing"),
                "lock inspect": lambda: lock.inspect("k"),
            }
            for name, read in reads.items():
                try:
                    await read()  # with a WAIT, no replica would confirm: an error
                except siglo.StorageAdapterError as exc:
                    raise AssertionError(f"{name} waited for a replica: {exc}") from exc
        finally:
            group.replica.resume()


async def test_the_driver_error_under_a_siglo_error_is_masked_when_raised(
    group: SentinelGroup,
) -> None:
    """docs/safety.md: the driver's exception chained below a siglo error shows ``***``
    for a URL's secrets. A wrong ``sentinel_password`` puts it in redis-py's
    ``MasterNotFoundError`` text; it is masked when the siglo error is raised — code (an
    error tracker) that reads ``__cause__`` before printing the siglo error saw it."""
    secret = "WRONGsent-5d2a"
    url = group.url + f"?sentinel_password={secret}&command_timeout_ms=2000"
    async with siglo.connect(url) as backend:
        with pytest.raises(siglo.StorageAdapterError) as caught:
            await backend.adapter.save_checkpoint(
                siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
            )
        link: BaseException | None = caught.value.__cause__
        texts = []
        while link is not None:  # read before str() of the siglo error, as a tracker may
            texts.append(repr(link) + str(link))
            link = link.__cause__ or link.__context__
        assert texts and not any(secret in text for text in texts), texts


async def _kill_master(group: SentinelGroup) -> None:
    """Kill the master (SIGKILL), and leave it dead."""
    group.master.kill()


async def _named_other_than(group: SentinelGroup, ports: tuple[int, ...]) -> int:
    """The master's port once the first Sentinel names one not in ``ports``."""
    for _ in range(600):
        port = group.master_port()
        if port is not None and port not in ports:
            return port
        await asyncio.sleep(0.1)
    raise AssertionError(f"the Sentinels named no new master:\n{group.log_tails()}")


async def _two_failovers(group: SentinelGroup, masters: list[int]) -> None:
    """Kill the master; once a Sentinel names the new one, restart the old one (empty),
    as a supervisor would, and stall the new master (SIGSTOP, a loaded machine's stall
    past ``down-after-milliseconds``) until the Sentinels have failed over again. The
    masters named, in turn, go to ``masters``."""
    old = group.master.port
    group.master.kill()
    first = await _named_other_than(group, (old,))
    masters.append(first)
    group.master.start()
    promoted = next(r for r in group.replicas if r.port == first)
    promoted.pause()
    try:
        masters.append(await _named_other_than(group, (first,)))
    finally:
        promoted.resume()


# Each client and each kind of failover by default, one pairing each; the other two
# pairings with SIGLO_TEST_TOPOLOGIES=1 (8-13 s each on two cores).
@pytest.mark.parametrize(
    ("client", "failover"),
    [
        ("auto_pipeline", "paused"),
        ("pooled", "planned"),
        pytest.param("pooled", "paused", marks=pytest.mark.topology_variant),
        pytest.param("auto_pipeline", "planned", marks=pytest.mark.topology_variant),
    ],
)
async def test_writes_follow_the_promotion_of_a_replica_over_a_live_master(
    two_replicas: SentinelGroup, client: str, failover: str
) -> None:
    """A master paused while the Sentinels promote a replica comes back a master, and
    stays one until they turn it into a replica (their next look, seconds later); after
    a planned ``SENTINEL FAILOVER`` it stays one as long, and the Sentinels name it the
    master until the failover ends (with two replicas, on its timeout). Connections made
    before the failover kept writing to it, every save confirmed and then lost (black-box
    auditors lost them for 4.3 s and more). The client asks the Sentinels again while it
    is used, the one failing the master over first, and the promoted replica itself
    (siglo_redis.master_watch): a save confirmed a second after the promotion is never
    lost — the revisions confirmed from then on never go back (a save the old master
    confirmed is met by a conflict on the new one, whose stored revision is older) —
    and the new master holds the last one."""
    group = two_replicas
    options = "" if client == "auto_pipeline" else "&auto_pipeline=false"
    confirmed: list[tuple[float, int]] = []
    promoted_at = float("inf")
    stop = asyncio.Event()

    async def write(adapter: Any) -> None:
        revision = None
        while not stop.is_set():
            try:
                if revision is None:
                    stored = await adapter.get_checkpoint("live")
                    revision = 0 if stored is None else stored.revision
                nxt = siglo.Checkpoint(stack_id="live", revision=revision + 1, timestamp=1)
                await adapter.save_checkpoint(nxt, expected_revision=revision)
                revision += 1
                confirmed.append((time.monotonic() - promoted_at, revision))
            except siglo.SigloError:
                revision = None  # a conflict, a failed or unknown call: read it again
                await asyncio.sleep(0.01)

    async with siglo.connect(group.url + "?command_timeout_ms=2000" + options) as backend:
        writer = asyncio.ensure_future(write(backend.adapter))
        await asyncio.sleep(0.5)
        if failover == "paused":
            group.master.pause()
        else:
            group.sentinels[0].ask("sentinel", "failover", group.service)
        try:
            deadline = time.monotonic() + 30
            promoted = None
            while promoted is None:  # the replica's own word, not the Sentinels'
                assert time.monotonic() < deadline, group.log_tails()
                await asyncio.sleep(0.05)
                for replica in group.replicas:
                    if "role:master" in redis_cli(replica.port, "info", "replication"):
                        promoted = replica
            promoted_at = time.monotonic()
        finally:
            if failover == "paused":
                group.master.resume()
        await asyncio.sleep(3)
        stop.set()
        await writer
    late = [(at, revision) for at, revision in confirmed if at > 1.0]
    assert late, confirmed[-5:]
    lowest_after = float("inf")
    lost = []
    for at, revision in reversed(late):
        if revision >= lowest_after:
            lost.append((at, revision))
        lowest_after = min(lowest_after, revision)
    assert lost == [], (lost[-5:], len(lost))
    async with siglo.connect(f"redis://127.0.0.1:{promoted.port}/0") as on_promoted:
        stored = await on_promoted.adapter.get_checkpoint("live")
    assert stored is not None and stored.revision == confirmed[-1][1], (stored, confirmed[-5:])


async def test_a_sentinel_that_does_not_answer_holds_no_new_connection(
    group: SentinelGroup,
) -> None:
    """Every Sentinel is asked for the master (the one failing it over knows first), at
    once: one paused is not waited for once another has answered — it would hold every
    new connection for its timeout (1 s), where asking one after another did."""
    import signal

    sentinel = group.sentinels[0]
    assert sentinel.process is not None
    sentinel.process.send_signal(signal.SIGSTOP)
    try:
        async with siglo.connect(group.url) as backend:
            began = time.monotonic()
            await backend.adapter.get_checkpoint("nothing")  # the first connection
            took = time.monotonic() - began
        assert took < 1.0, took
    finally:
        sentinel.process.send_signal(signal.SIGCONT)


async def test_two_failovers_with_wait_lose_no_acknowledged_save(
    two_replicas: SentinelGroup,
) -> None:
    """Two replicas and ``wait_replicas=1``: the master dies mid-run, and the replica
    promoted stalls until the Sentinels fail over again, the old master restarted empty
    meanwhile. Calls fail for a bounded time, then the same backend writes to the last
    master, and nothing a replica confirmed is lost: no save, no lock granted twice, no
    fencing token going back, no claim won twice (the Sentinels promote the replica
    furthest along, which holds every write any replica confirmed)."""
    group = two_replicas
    url = group.url + "?wait_replicas=1&wait_timeout_ms=1000&command_timeout_ms=3000"
    masters: list[int] = []
    lag = LoopLag()
    async with siglo.connect(url) as backend:
        report = await run_through_failover(
            backend, lambda: _two_failovers(group, masters), limit_s=40, lag=lag
        )
        print(report.line("redis sentinel, 2 replicas, wait_replicas=1, two failovers"))
        seen = group.log_tails()  # what the Sentinels saw, for the messages below
        assert report.setting == "wait_replicas"
        replicas = [r.port for r in group.replicas]
        assert len(masters) == 2 and set(masters) == set(replicas), (masters, seen)
        assert group.master_port() == masters[-1], seen
        assert report.violations == [], (report.violations, seen)
        assert report.outage_s < 30
        # Each storage call within command_timeout_ms (3 s) and 1.5 s, and however late
        # the loaded machine's event loop ran a timer meanwhile.
        assert report.longest_failed_call_s < 4.5 + lag.longest_s, lag
        assert report.cleaned_up
        assert "role:master" in redis_cli(masters[-1], "info", "replication")


@pytest.mark.measured_losses
async def test_one_replica_restarted_empty_can_be_promoted_empty() -> None:
    """Why two replicas: with one, the old master restarted (empty) is the only replica
    left, and until its first sync it holds nothing; a second failover then promotes it
    and every write is gone, WAIT or not (Sentinel's choice, not siglo's: shown with
    plain redis-cli)."""
    group = SentinelGroup(free_ports(30100, 30200, 5)).start()
    try:
        for i in range(100):
            redis_cli(group.master.port, "set", f"k{i}", "v")
        assert redis_cli(group.master.port, "wait", "1", "1000").strip() == "1"
        masters: list[int] = []
        await _two_failovers(group, masters)
        assert masters == [group.replica.port, group.master.port], group.log_tails()
        assert redis_cli(group.master.port, "dbsize").strip() == "0"
    finally:
        group.stop()


@pytest.mark.measured_losses
async def test_failover_without_wait_is_measured(group: SentinelGroup) -> None:
    """Without WAIT a write the master acknowledged may not have reached the replica:
    the losses are counted (and reported), not asserted away."""
    async with siglo.connect(group.url + "?command_timeout_ms=3000") as backend:
        lag = LoopLag()
        report = await run_through_failover(
            backend, lambda: _kill_master(group), limit_s=40, lag=lag
        )
        print(report.line("redis sentinel, no WAIT"))
        for violation in report.violations[:10]:
            print("  ", violation)
        assert report.setting == "no WAIT"
        assert group.master_port() == group.replica.port
        assert report.outage_s < 30
        assert report.longest_failed_call_s < 5 + lag.longest_s, lag
