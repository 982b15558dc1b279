"""The Redis backend on a real 3-master Redis Cluster started on loopback.

The session fixture starts three ``redis-server --cluster-enabled yes`` on free ports
in 30010-30099 (cluster bus ports there too), joins them with ``redis-cli --cluster
create`` and stops them afterwards (about two seconds). ``siglo check`` runs the
whole contract suite against it: every multi-key script must keep its keys in one slot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _redis_helpers import start_cluster
from ports import free_ports
from siglo_check import run_siglo_check

import siglo
from siglo_redis import isolated
from siglo_redis.keys import hash_slot

pytestmark = pytest.mark.redis_cluster


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    ports = free_ports(30010, 30100, 6)
    for _ in start_cluster(ports[:3], ports[3:]):
        yield f"redis://127.0.0.1:{ports[0]}/0?cluster=true"


@pytest.fixture
async def backend(cluster_url: str) -> AsyncIterator[siglo.Backend]:
    async with isolated(cluster_url) as cluster_backend:
        yield cluster_backend


async def test_connected_to_a_cluster(backend: siglo.Backend) -> None:
    from redis.asyncio import RedisCluster

    client = backend.adapter.client  # type: ignore[attr-defined]
    assert isinstance(client, RedisCluster)
    assert await backend.adapter.get_checkpoint("s") is None  # connects lazily
    assert len(client.get_primaries()) == 3


@pytest.mark.rule("checkpoint.incremental")
async def test_incremental_saves_over_many_slots(cluster_url: str) -> None:
    # The checkpoint key, its listing index and its parts hash share a slot: the parts
    # script touches all three, and the cluster's read is the checkpoint_load script.
    from siglo import Checkpoint

    def doc(stack: str, revision: int) -> Checkpoint:
        contexts = {f"s{i}": {"out": f"{i}-{revision if i == 0 else 0}" * 1_000} for i in range(8)}
        return Checkpoint(stack_id=stack, revision=revision, timestamp=revision, contexts=contexts)

    async with isolated(cluster_url, incremental_min_bytes=1_024) as backend:
        a: Any = backend.raw_adapter
        stacks = [f"run-{i}" for i in range(24)] + ["a{b}c", "x}y{", "{}"]
        assert len({hash_slot(a.keys.checkpoint(s)) for s in stacks}) > 10
        for stack in stacks:
            assert hash_slot(a.keys.checkpoint_parts(stack)) == hash_slot(a.keys.checkpoint(stack))
            await a.save_checkpoint(doc(stack, 1))
            await a.save_checkpoint(doc(stack, 2), expected_revision=1)
            got = await a.get_checkpoint(stack)
            assert got is not None and got.to_json() == doc(stack, 2).to_json()
            assert await a.delete_checkpoint(stack)
            assert await a.client.exists(a.keys.checkpoint_parts(stack)) == 0


@pytest.mark.rule("checkpoint.incremental")
async def test_a_whole_save_drops_the_parts_hash_in_every_slot(cluster_url: str) -> None:
    # The whole save's script takes the parts hash (tagged to the checkpoint's slot) and
    # drops it; `siglo clean` finds a hash left on any master (SCAN of each primary).
    from siglo import Checkpoint

    def doc(stack: str, revision: int) -> Checkpoint:
        contexts = {f"s{i}": {"out": f"{i}-{revision}" * 1_000} for i in range(4)}
        return Checkpoint(stack_id=stack, revision=revision, timestamp=revision, contexts=contexts)

    async with isolated(cluster_url, incremental_min_bytes=0) as backend:
        a: Any = backend.raw_adapter
        stacks = [f"run-{i}" for i in range(12)]
        async with siglo.connect(backend.url, incremental_min_bytes=None) as plain:
            for stack in stacks:
                await a.save_checkpoint(doc(stack, 1))
                await plain.adapter.save_checkpoint(doc(stack, 2), expected_revision=1)
                assert await a.client.exists(a.keys.checkpoint_parts(stack)) == 0
        for stack in stacks:  # left as siglo before this fix left them: key gone
            await a.save_checkpoint(doc(stack, 3))
            await a.client.delete(a.keys.checkpoint(stack))
        counts = await a.clean_expired()
        assert counts["checkpoint_parts"] == len(stacks)
        assert not [k async for k in a.client.scan_iter(match=a.keys.prefix + "*checkpoint-parts*")]


async def test_a_refused_save_streams_nothing_on_a_cluster(cluster_url: str) -> None:
    # On a cluster a step's writes cannot be one script (their keys span slots): the
    # adapter takes the changes and sends them after the size guard, not before it.
    for least in (None, 0):
        async with isolated(cluster_url, incremental_min_bytes=least) as backend:
            backend.raw_adapter.max_document_bytes = 20_000
            manager = siglo.StorageManager(backend)
            stack = manager.create_stack("st")
            stack.set("base", "v", "b" * 12_000)
            await manager.save_checkpoint("st")
            stack.set("new", "v", "n" * 12_000)
            with pytest.raises(siglo.DocumentTooLargeError):
                await manager.save_checkpoint("st")
            assert await backend.adapter.get_context_changes("st", "new") == {}
            stack.set("new", "v", "short")
            await manager.save_checkpoint("st")
            assert await backend.adapter.get_context_changes("st", "new") == {"v": "short"}


@pytest.mark.rule("lock.fencing", "lock.acquire.exclusive")
async def test_locks_over_many_slots(backend: siglo.Backend) -> None:
    lock = backend.lock
    assert lock is not None
    keys = [f"lock-{i}" for i in range(64)] + ["a{b}c", "x}y{", "{}", "ü"]
    assert len({hash_slot(k) for k in keys}) > 30  # spread over all three masters
    # The fencing counter is one per cluster slot (siglo_redis.keys.fence_key): two of
    # these keys in one slot (about one run in eight, the prefix being random) share it.
    last: dict[str, int] = {}
    for key in keys:
        fence = lock._keys(key)[1]  # type: ignore[attr-defined]
        first = await lock.acquire(key, 5_000)
        assert first.acquired and first.fencing_token == last.get(fence, 0) + 1, key
        assert await lock.extend(key, first.token, 5_000)
        assert await lock.release(key, first.token)
        again = await lock.acquire(key, 5_000)
        assert again.fencing_token == first.fencing_token + 1, key
        last[fence] = again.fencing_token
    # A key in the slot of one used above continues that slot's tokens.
    slot = hash_slot(lock._keys("lock-0")[0])  # type: ignore[attr-defined]
    mate = next(
        f"mate-{n}"
        for n in range(1_000_000)
        if hash_slot(lock._keys(f"mate-{n}")[0]) == slot  # type: ignore[attr-defined]
    )
    fence = lock._keys(mate)[1]  # type: ignore[attr-defined]
    assert fence == lock._keys("lock-0")[1]  # type: ignore[attr-defined]
    mated = await lock.acquire(mate, 5_000)
    assert mated.acquired and mated.fencing_token == last[fence] + 1


@pytest.mark.rule("idempotency.owner", "idempotency.lease", "idempotency.fingerprint")
async def test_owned_idempotency_keys_over_many_slots(backend: siglo.Backend) -> None:
    """Each owned-claim script touches the seed's key and its owner sibling: one slot.
    After the first owners' leases lapse, concurrent claimers get one new owner per key
    and the stale owners' complete is refused."""
    import asyncio

    from siglo.errors import IdempotencyOwnershipError

    idem = backend.idempotency
    assert idem is not None
    keys = [f"pay-{i}" for i in range(64)] + ["a{b}c", "x}y{", "{}", "ü"]
    assert len({hash_slot(k) for k in keys}) > 30
    stale = {k: (await idem.claim_owned(k, 100, fingerprint=k)).token for k in keys}
    await asyncio.sleep(0.25)
    for key in keys:
        claims = await asyncio.gather(
            *(idem.claim_owned(key, 5_000, fingerprint=key) for _ in range(4))
        )
        (claim,) = [c for c in claims if c.state == "claimed"]
        assert claim.token is not None
        with pytest.raises(IdempotencyOwnershipError):
            await idem.complete(key, "stale", token=stale[key])
        assert await idem.extend(key, claim.token, 5_000)
        await idem.complete(key, {"k": key}, token=claim.token)
        assert await idem.claim(key, fingerprint=key) == "completed"
        other = await idem.claim_owned(f"{key}-f", 5_000)
        await idem.fail(f"{key}-f", token=other.token)


async def test_isolated_cleans_every_master(cluster_url: str) -> None:
    async with isolated(cluster_url) as b:
        for i in range(50):
            await b.adapter.set_cached_step(f"k{i}", i)
        url = b.url
        client = b.adapter.client  # type: ignore[attr-defined]
        prefix = b.adapter.keys.prefix  # type: ignore[attr-defined]
        assert len([k async for k in client.scan_iter(match=prefix + "*")]) == 50
    async with siglo.connect(url) as again:
        client = again.adapter.client  # type: ignore[attr-defined]
        assert [k async for k in client.scan_iter(match=prefix + "*")] == []


@pytest.mark.rule("capability.declared")
@pytest.mark.contract_sweep
def test_siglo_check_passes_on_the_cluster(cluster_url: str, tmp_path: Path) -> None:
    """Issue 4: `siglo check` against the loopback cluster passes every rule."""
    run_siglo_check(cluster_url, tmp_path)
