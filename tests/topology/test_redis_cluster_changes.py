"""The Redis backend on a Redis Cluster that changes under a contended run.

Each test starts its own cluster (three masters, each with a replica: six servers on
free loopback ports in 30200-30299, their bus ports there too) and stops it. Two
backends (two clients) with eight tasks contend on a few checkpoints (compare-and-set
increments), wait records (claims) and locks whose keys all sit in the slots being
changed, while

* ``redis-cli --cluster reshard`` moves those slots to another master key by key (the
  clients meet ``MOVED`` and, mid-migration, ``ASK``/``TRYAGAIN``), and then
* ``CLUSTER FAILOVER`` promotes the new owner's replica (a graceful failover: the
  replica catches up before it takes over, so nothing acknowledged is lost).

Afterwards: no checkpoint revision was won twice and none is missing (no lost update),
no wait record or lock was won twice (no double claim), and every operation still
succeeds. Every script touches one slot, or the cluster would refuse it (``CROSSSLOT``).
``SIGLO_TEST_TOPOLOGIES=1`` also kills a master outright (its replica takes over after
the node timeout): losses there are Redis's asynchronous replication, measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest
from _failover import LoopLag, run_through_failover
from _redis_helpers import RedisServer, redis_cli, start_cluster
from ports import free_ports

import siglo
from siglo import Checkpoint, CheckpointConflictError, StorageAdapterError, WaitRecord
from siglo_redis.connect import connect
from siglo_redis.keys import KeySpace, hash_slot

pytestmark = pytest.mark.redis_cluster
MOVED_SLOTS = 64  # reshard moves this many slots, the source's lowest


@dataclass
class Node:
    id: str
    port: int
    master: bool
    master_id: str
    slots: set[int]


def cluster_nodes(port: int) -> list[Node]:
    nodes = []
    for line in redis_cli(port, "cluster", "nodes").splitlines():
        parts = line.split()
        if len(parts) < 8 or "fail" in parts[2] or "noaddr" in parts[2]:
            continue
        slots: set[int] = set()
        for item in parts[8:]:
            if item.startswith("["):
                continue  # a slot being migrated or imported
            low, _, high = item.partition("-")
            slots.update(range(int(low), int(high or low) + 1))
        address = parts[1].split("@")[0]
        nodes.append(
            Node(parts[0], int(address.rsplit(":", 1)[1]), "master" in parts[2], parts[3], slots)
        )
    return nodes


def wait_cluster_ok(ports: list[int], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not all("cluster_state:ok" in redis_cli(p, "cluster", "info") for p in ports):
        if time.monotonic() > deadline:
            down = [p for p in ports if "cluster_state:ok" not in redis_cli(p, "cluster", "info")]
            seen = down[0] if down else ports[0]
            # What redis-cli says when the node answers nothing (a CI run saw an empty
            # CLUSTER NODES from a node left running: refused, or not answering?).
            ping = subprocess.run(
                ["redis-cli", "-p", str(seen), "ping"], capture_output=True, text=True, timeout=10
            )
            raise RuntimeError(
                f"the cluster did not settle in {seconds} s: down on {down}; "
                f"{seen} answers PING with {(ping.stdout + ping.stderr).strip()!r}; as "
                f"{seen} sees it:\n" + redis_cli(seen, "cluster", "nodes")
            )
        time.sleep(0.1)


def settle_after_promotion(ports: list[int]) -> bool:
    """Wait for the cluster on ``ports`` to settle after a replica took a master's place
    (a failover, or the master killed); if it does not because a slot has no owner,
    have ``redis-cli --cluster fix`` assign it, as an operator would, and wait again.
    Whether the fix was needed.

    A replica promoted just after a reshard can claim the slots of its master's older
    map: the slot moved last is then owned by nobody and the cluster stays down (seen
    after a `CLUSTER FAILOVER`: slot 63, though every node had shown the new owner of the
    moved slots before it). That is Redis Cluster's doing, not the client's.
    """
    try:
        wait_cluster_ok(ports)
        return False
    except RuntimeError:
        owned: set[int] = set()
        for node in cluster_nodes(ports[0]):
            if node.master:
                owned |= node.slots
        if len(owned) == 16384:
            raise  # every slot has an owner: something else keeps it down
    subprocess.run(
        ["redis-cli", "--cluster", "fix", f"127.0.0.1:{ports[0]}", "--cluster-yes"],
        capture_output=True,
        text=True,
        timeout=60,
        # Covering a slot asks to type "yes" even with --cluster-yes (redis-cli 7.0).
        input="yes\n" * 4,
    )
    wait_cluster_ok(ports)
    return True


@pytest.fixture
def cluster() -> Iterator[list[RedisServer]]:
    yield from _started_cluster(free_ports(30200, 30300, 12))


def _started_cluster(ports: list[int]) -> Iterator[list[RedisServer]]:
    for servers in start_cluster(ports[:6], ports[6:], replicas=1):
        # All three replicas known as such (roles spread by gossip: read too early, the
        # list was empty and the wait passed at once) and synced with their masters. A
        # master killed before its replica's first sync leaves a replica with no data,
        # which never stands for election: "the replica was not promoted".
        deadline = time.monotonic() + 30
        while True:
            replicas = [n for n in cluster_nodes(ports[0]) if not n.master]
            if len(replicas) == 3 and all(
                "master_link_status:up" in redis_cli(n.port, "info", "replication")
                for n in replicas
            ):
                break
            assert time.monotonic() < deadline, f"replicas did not sync: {replicas}"
            time.sleep(0.1)
        yield servers


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[list[RedisServer]]:
    """One cluster with replicas for the tests that leave it usable (a reshard, a
    stopped replica resumed, a killed master restarted as a replica: the last)."""
    yield from _started_cluster(free_ports(30200, 30300, 12))


def pick_ids(keyspace: Callable[[str], str], slots: set[int], count: int, tag: str) -> list[str]:
    """``count`` ids whose key (``keyspace(id)``) falls in ``slots``."""
    found = []
    for i in range(1_000_000):
        candidate = f"{tag}-{i}"
        if hash_slot(keyspace(candidate)) in slots:
            found.append(candidate)
            if len(found) == count:
                return found
    raise AssertionError("no ids in those slots")


@dataclass
class Outcome:
    cas_wins: Counter[tuple[str, int]] = field(default_factory=Counter)
    cas_maybe: set[tuple[str, int]] = field(default_factory=set)
    claims: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    claim_maybe: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    locks: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    ok: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def line(self, name: str) -> str:
        top = ", ".join(f"{k} ×{n}" for k, n in self.errors.most_common(3))
        return f"CLUSTER {name}: {self.ok} operations succeeded, {self.failed} failed" + (
            f" ({top})" if top else ""
        )


async def contend(
    backends: list[siglo.Backend],
    stacks: list[str],
    waits: list[str],
    locks: list[str],
    change: Callable[[], Awaitable[None]],
    tasks_per_backend: int = 4,
) -> Outcome:
    """Contend until ``change()`` is done and a second after."""
    out = Outcome()
    stop = asyncio.Event()

    async def worker(backend: siglo.Backend, name: str, rng: random.Random) -> None:
        adapter, lock = backend.adapter, backend.lock
        assert lock is not None
        while not stop.is_set():
            what = rng.random()
            try:
                if what < 0.5:
                    stack = rng.choice(stacks)
                    current = await adapter.get_checkpoint(stack)
                    revision = 0 if current is None else current.revision
                    attempt = (stack, revision + 1)
                    try:
                        await adapter.save_checkpoint(
                            Checkpoint(stack_id=stack, revision=revision + 1, timestamp=1),
                            expected_revision=revision,
                        )
                    except CheckpointConflictError:
                        pass
                    except StorageAdapterError:
                        out.cas_maybe.add(attempt)
                        raise
                    else:
                        out.cas_wins[attempt] += 1
                elif what < 0.8:
                    key = rng.choice(waits)
                    try:
                        won = await adapter.claim_wait_record(key, name, lease_ms=600_000)
                    except StorageAdapterError:
                        out.claim_maybe[key].add(name)
                        raise
                    if won is not None:
                        out.claims[key].append(name)
                else:
                    key = rng.choice(locks)
                    held = await lock.acquire(key, 600_000)
                    if held.acquired:
                        out.locks[key].append(held.fencing_token or 0)
                out.ok += 1
            except StorageAdapterError as exc:
                out.failed += 1
                out.errors[str(exc.__cause__ or exc).split(":")[0][:60]] += 1
                await asyncio.sleep(0.02)

    running = [
        asyncio.create_task(worker(b, f"w{i}-{j}", random.Random(i * 100 + j)))
        for i, b in enumerate(backends)
        for j in range(tasks_per_backend)
    ]
    try:
        await asyncio.sleep(0.5)
        await change()
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        await asyncio.gather(*running)
    return out


async def check(out: Outcome, backend: siglo.Backend, stacks: list[str]) -> None:
    # No lost update: each revision of each checkpoint was won once, and the stored
    # revision is the last one won (or a later one whose save failed but was applied).
    assert all(n == 1 for n in out.cas_wins.values()), out.cas_wins.most_common(3)
    for stack in stacks:
        stored = await backend.adapter.get_checkpoint(stack)
        won = [r for s, r in out.cas_wins if s == stack]
        final = 0 if stored is None else stored.revision
        assert final >= max(won, default=0)
        for revision in range(1, final + 1):
            assert (stack, revision) in out.cas_wins or (stack, revision) in out.cas_maybe
    # No double claim: one winner per record, and the record names it.
    for key, winners in out.claims.items():
        assert len(set(winners)) == 1, (key, winners)  # a claimant may claim again
        record = await backend.adapter.get_wait_record(key)
        assert record is not None and record.claimant_id == winners[0]
    # No lock held twice; fencing tokens only go up.
    for key, tokens in out.locks.items():
        assert len(tokens) == 1, (key, tokens)


def reshard(port: int, source: Node, target: Node) -> None:
    subprocess.run(
        [
            "redis-cli", "--cluster", "reshard", f"127.0.0.1:{port}",
            "--cluster-from", source.id, "--cluster-to", target.id,
            "--cluster-slots", str(MOVED_SLOTS), "--cluster-yes",
            "--cluster-pipeline", "1",  # one key per MIGRATE: a longer window for ASK
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip


async def _run(cluster: list[RedisServer], fault: str, pipelined: bool = True) -> None:
    ports = [s.port for s in cluster]
    masters = sorted(
        (n for n in cluster_nodes(ports[0]) if n.master and n.slots), key=lambda n: min(n.slots)
    )
    source, target = masters[0], masters[1]
    moving = set(sorted(source.slots)[:MOVED_SLOTS])
    prefix = f"siglo-chg-{uuid.uuid4().hex[:8]}:"
    keys = KeySpace(prefix)
    stacks = pick_ids(keys.checkpoint, moving, 4, "stack")
    waits = pick_ids(keys.wait, moving, 60, "wait")
    locks = pick_ids(lambda k: keys.lock_prefix + k, moving, 60, "lock")
    url = f"redis://127.0.0.1:{ports[0]}/0?cluster=true&prefix={prefix}"
    url += "" if pipelined else "&auto_pipeline=false"
    async with connect(url) as first, connect(url) as second:
        for key in waits:
            await first.adapter.save_wait_record(WaitRecord(correlation_key=key, stack_id="s"))

        async def change() -> None:
            await asyncio.to_thread(reshard, ports[0], source, target)
            owners = cluster_nodes(target.port)
            new_owner = next(n for n in owners if n.id == target.id)
            assert moving <= new_owner.slots  # the hot slots moved
            # The new owner's replica, once the nodes' gossip shows it healthy again (a
            # node busy with the migration can be flagged ``fail?`` for a moment).
            deadline = time.monotonic() + 30
            while (replica := next((n for n in owners if n.master_id == target.id), None)) is None:
                assert time.monotonic() < deadline, "no healthy replica of the new owner"
                await asyncio.sleep(0.1)
                owners = cluster_nodes(target.port)
            # Every node, the replica included, must know the moved slots' new owner
            # before the failover: a replica promoted while it still had the old slot map
            # claims only the slots it knew of, and a slot moved last is then owned by
            # nobody (seen: slot 63 orphaned, the cluster down for good).
            deadline = time.monotonic() + 30
            while not all(
                moving <= next((n.slots for n in cluster_nodes(p) if n.id == target.id), set())
                for p in ports
            ):
                assert time.monotonic() < deadline, "the new slot map did not reach every node"
                await asyncio.sleep(0.1)
            if fault == "none":
                return
            if fault == "failover":
                redis_cli(replica.port, "cluster", "failover")
            else:
                next(s for s in cluster if s.port == target.port).kill()
            deadline = time.monotonic() + 60
            while not any(n.master and n.port == replica.port for n in cluster_nodes(replica.port)):
                assert time.monotonic() < deadline, "the replica was not promoted"
                await asyncio.sleep(0.1)
            alive = [p for p in ports if fault == "failover" or p != target.port]
            if await asyncio.to_thread(settle_after_promotion, alive):
                print(f"a slot had no owner after the {fault}: redis-cli --cluster fix")

        out = await contend([first, second], stacks, waits, locks, change)
        client = "auto-pipelined" if pipelined else "plain"
        print(out.line(f"reshard {MOVED_SLOTS} slots + {fault}, {client} client"))
        assert out.ok > 100
        alive = [p for p in ports if fault != "kill" or p != target.port]
        await asyncio.to_thread(wait_cluster_ok, alive)
        if fault != "kill":
            await check(out, first, stacks)
        # Everything works afterwards, through both clients.
        for backend in (first, second):
            await backend.adapter.set_cached_step("after", 1)
            assert await backend.adapter.get_cached_step("after") == 1
        with contextlib.suppress(StorageAdapterError):
            assert await second.adapter.get_checkpoint(stacks[0]) is not None


@pytest.mark.parametrize("pipelined", [True, False], ids=["auto-pipelined", "plain"])
async def test_reshard_and_failover_under_contention(
    cluster: list[RedisServer], pipelined: bool
) -> None:
    """Before the auto-pipeline let redis-py's own topology refreshes (every few MOVED
    replies) drain its written calls instead of failing them, this lost acknowledged
    compare-and-sets and handed locks out twice while the slots moved."""
    await _run(cluster, "failover", pipelined)


@pytest.mark.measured_losses
async def test_reshard_and_master_killed_under_contention(cluster: list[RedisServer]) -> None:
    await _run(cluster, "kill")


def _shard_of(cluster: list[RedisServer], slot: int) -> tuple[Node, Node]:
    """The master serving ``slot`` and its replica."""
    nodes = cluster_nodes(cluster[0].port)
    master = next(n for n in nodes if n.master and slot in n.slots)
    replica = next(n for n in nodes if n.master_id == master.id)
    return master, replica


def _server(cluster: list[RedisServer], port: int) -> RedisServer:
    return next(s for s in cluster if s.port == port)


async def test_wait_replicas_confirms_each_write_on_its_own_shard(
    shared_cluster: list[RedisServer],
) -> None:
    """Issue 32: ``wait_replicas`` with ``cluster=true`` (refused before). Each write
    waits for the replica of its own slot's master: with one shard's replica stopped,
    writes there fail with OutcomeUnknownError (applied on the master, not confirmed)
    while the other shards' writes are confirmed."""
    cluster = shared_cluster
    prefix = f"siglo-wait-{uuid.uuid4().hex[:8]}:"
    keys = KeySpace(prefix)
    url = f"redis://127.0.0.1:{cluster[0].port}/0?cluster=true&prefix={prefix}"
    # The writes that must be confirmed get seconds (a busy machine can hold a replica's
    # acknowledgement past 300 ms); the ones that must not be, 300 ms.
    async with (
        connect(url + "&wait_replicas=1&wait_timeout_ms=300") as backend,
        connect(url + "&wait_replicas=1&wait_timeout_ms=5000") as confirming,
    ):
        stacks = [f"stack-{i}" for i in range(32)]
        for stack in stacks:  # every shard confirms
            await confirming.adapter.save_checkpoint(
                Checkpoint(stack_id=stack, revision=1, timestamp=1)
            )
        stalled = stacks[0]
        master, replica = _shard_of(cluster, hash_slot(keys.checkpoint(stalled)))
        elsewhere = next(
            s
            for s in stacks
            if _shard_of(cluster, hash_slot(keys.checkpoint(s)))[0].id != master.id
        )
        # The 300 ms client's first save into a slot first records the slot for walks
        # (a ZADD that must be confirmed too): made here, where the replicas run, with a
        # stack of its own in each slot, tried again (with another) should a busy machine
        # hold an acknowledgement past 300 ms.
        warm: list[str] = []
        for stack in (stalled, elsewhere):
            slot = hash_slot(keys.checkpoint(stack))
            for attempt, spare in enumerate(pick_ids(keys.checkpoint, {slot}, 10, f"warm{slot}")):
                warm.append(spare)
                try:
                    await backend.adapter.save_checkpoint(
                        Checkpoint(stack_id=spare, revision=1, timestamp=1)
                    )
                    break
                except siglo.OutcomeUnknownError:
                    assert attempt < 9, "a running replica did not confirm in ten tries"
        _server(cluster, replica.port).pause()
        try:
            started = time.monotonic()
            with pytest.raises(siglo.OutcomeUnknownError, match="confirmed by 0 of the 1"):
                await backend.adapter.save_checkpoint(
                    Checkpoint(stack_id=stalled, revision=2, timestamp=1), expected_revision=1
                )
            assert time.monotonic() - started < 2
            await confirming.adapter.save_checkpoint(
                Checkpoint(stack_id=elsewhere, revision=2, timestamp=1), expected_revision=1
            )
            assert backend.lock is not None
            lock_key = pick_ids(lambda k: keys.lock_prefix + k, master.slots, 1, "lock")[0]
            with pytest.raises(siglo.OutcomeUnknownError):
                await backend.lock.acquire(lock_key, 5_000)
        finally:
            _server(cluster, replica.port).resume()
        # Applied on the master all the same: not acknowledged is not "not written".
        stored = await confirming.adapter.get_checkpoint(stalled)
        assert stored is not None and stored.revision == 2
        for stack in [*stacks, *warm]:
            await confirming.adapter.delete_checkpoint(stack)


async def test_reinitialize_steps_in_the_url_follows_moved_slots(
    shared_cluster: list[RedisServer],
) -> None:
    """Issue 32: ``reinitialize_steps=0`` given in the URL reached redis-py as the
    string ``"0"``, and every call meeting ``MOVED`` then failed (a TypeError)."""
    cluster = shared_cluster
    ports = [s.port for s in cluster]
    masters = sorted(
        (n for n in cluster_nodes(ports[0]) if n.master and n.slots), key=lambda n: min(n.slots)
    )
    source, target = masters[0], masters[1]
    moving = set(sorted(source.slots)[:MOVED_SLOTS])
    prefix = f"siglo-reinit-{uuid.uuid4().hex[:8]}:"
    stacks = pick_ids(KeySpace(prefix).checkpoint, moving, 4, "stack")
    url = f"redis://127.0.0.1:{ports[0]}/0?cluster=true&reinitialize_steps=0&prefix={prefix}"
    async with connect(url) as backend:
        assert backend.adapter.client.reinitialize_steps == 0  # type: ignore[attr-defined]
        for stack in stacks:
            await backend.adapter.save_checkpoint(
                Checkpoint(stack_id=stack, revision=1, timestamp=1)
            )
        await asyncio.to_thread(reshard, ports[0], source, target)
        for stack in stacks:  # the client's slot map is stale: MOVED
            await backend.adapter.save_checkpoint(
                Checkpoint(stack_id=stack, revision=2, timestamp=1), expected_revision=1
            )
            stored = await backend.adapter.get_checkpoint(stack)
            assert stored is not None and stored.revision == 2
            await backend.adapter.delete_checkpoint(stack)


async def test_master_killed_with_wait_loses_nothing_acknowledged(
    shared_cluster: list[RedisServer],
) -> None:
    """A master dies mid-drill; its replica takes over after the node timeout, and the
    old master, restarted empty as a supervisor would, rejoins as the new master's
    replica. With ``wait_replicas=1`` every acknowledged write was on the replica that
    took over: no save lost, no lock granted twice, no fencing token going back, no
    claim won twice."""
    cluster = shared_cluster
    ports = [s.port for s in cluster]
    victim = next(n for n in cluster_nodes(ports[0]) if n.master and n.slots)
    replica = next(n for n in cluster_nodes(ports[0]) if n.master_id == victim.id)
    seed = next(p for p in ports if p != victim.port)
    url = (
        f"redis://127.0.0.1:{seed}/0?cluster=true&wait_replicas=1&wait_timeout_ms=1000"
        "&command_timeout_ms=3000"
    )

    restarted: list[str] = []  # what became of the old master, for the failure message

    async def restart_once_replaced() -> None:
        # Off the loop (redis-cli and the start wait block), and patient: a busy machine
        # can make one look slow, and a victim never restarted leaves its promoted
        # replica without the replica that wait_replicas=1 needs.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                nodes = await asyncio.to_thread(cluster_nodes, seed)
            except subprocess.SubprocessError as exc:
                restarted.append(f"cluster nodes: {exc!r}")
                nodes = []
            if any(n.master and n.port == replica.port for n in nodes):
                break
            await asyncio.sleep(0.1)
        else:
            restarted.append("the replica was not promoted in 60 s; restarting anyway")
        await asyncio.to_thread(_server(cluster, victim.port).start)
        restarted.append(f"restarted at {time.monotonic():.2f}")

    restart: asyncio.Task[None] | None = None

    async def kill_and_restart() -> None:
        nonlocal restart
        _server(cluster, victim.port).kill()
        restart = asyncio.get_running_loop().create_task(restart_once_replaced())

    def describe() -> str:
        return (
            f"victim {victim.port}, replica {replica.port}, restart: {restarted or 'pending'}"
            f"\n{redis_cli(seed, 'cluster', 'nodes')}"
        )

    lag = LoopLag()
    async with connect(url) as backend:
        try:
            report = await run_through_failover(
                backend, kill_and_restart, limit_s=60, describe=describe, lag=lag
            )
        finally:
            if restart is not None:
                await restart  # its failure, if any, is the test's
        print(report.line("redis cluster, wait_replicas=1, a master killed"))
        for violation in report.violations[:10]:
            print("  ", violation)
        assert report.setting == "cluster with WAIT"
        assert report.failed_calls > 0  # the kill was met
        assert report.violations == [], report.violations
        assert report.cleaned_up
        # Each call within command_timeout_ms (3 s) and 1.5 s, and however late the
        # loaded machine's event loop ran a timer meanwhile.
        assert report.longest_failed_call_s < 4.5 + lag.longest_s, (report, lag)


async def test_a_client_that_lost_every_node_at_once_reconnects() -> None:
    """redis-py forgets each node a command failed on (its "startup nodes"), and reads the
    topology again only from the nodes it has not forgotten: with every node forgotten,
    every later call fails with "Redis Cluster cannot be connected" for the life of the
    process, the cluster healthy again (redis-py #3693, #3221). Every master failing at
    once with calls in flight on each does that: the whole cluster restarted, a network
    partition, a proxy dropping its connections. siglo's clients (auto-pipelined, plain,
    waiting for replicas) keep the URL's node and the last topology's to read it from,
    and reconnect."""
    ports = free_ports(30200, 30300, 6)
    prefix = f"siglo-seeds-{uuid.uuid4().hex[:8]}:"
    keys = KeySpace(prefix)
    with contextlib.contextmanager(start_cluster)(ports[:3], ports[3:]) as servers:
        masters = [n for n in cluster_nodes(ports[0]) if n.master and n.slots]
        assert len(masters) == 3
        stacks = [
            stack
            for node in masters
            for stack in pick_ids(keys.checkpoint, node.slots, 4, f"on-{node.port}")
        ]
        # wait_replicas=1 on a cluster without replicas: a write would fail unconfirmed;
        # the loads counted here go alone.
        for options in ("", "&auto_pipeline=false", "&wait_replicas=1"):
            url = (
                f"redis://127.0.0.1:{ports[0]}/0?cluster=true&prefix={prefix}"
                f"&command_timeout_ms=2000{options}"
            )
            async with connect(url) as backend:
                await _lose_every_node_and_reconnect(backend, servers, stacks)


async def _lose_every_node_and_reconnect(
    backend: siglo.Backend, servers: list[RedisServer], stacks: list[str]
) -> None:
    for stack in stacks:  # connected to every master
        assert await backend.adapter.get_checkpoint(stack) is None
    for server in servers:
        server.pause()  # calls wait for replies that do not come …
    calls = [asyncio.create_task(backend.adapter.get_checkpoint(stack)) for stack in stacks]
    await asyncio.sleep(0.3)
    for server in servers:
        server.kill()  # … and fail at once on every master
    failed = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(x, StorageAdapterError) for x in failed), failed
    for server in servers:
        server.start()  # its nodes.conf: the same cluster, its data gone
    deadline = time.monotonic() + 30
    errors: list[str] = []
    while True:
        try:
            for stack in stacks:
                assert await backend.adapter.get_checkpoint(stack) is None
            return
        except StorageAdapterError as exc:
            errors.append(str(exc))
            assert time.monotonic() < deadline, (
                f"no call succeeded in 30 s; the last errors: {errors[-3:]}"
            )
            await asyncio.sleep(0.2)
