"""The blind index on Redis: a sorted set per (namespace, field, token), written by the
checkpoint's compare-and-set script, walked by ``list_checkpoints_by_index`` instead of
reading every document of the namespace; members whose checkpoint is gone or holds
another value now (a later save, or a TypeScript writer that keeps no sets) are dropped
when a walk meets them. No set exists unless a checkpoint has tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo import Checkpoint
from siglo.blind import INDEX_KEY
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.connect import isolated

pytestmark = pytest.mark.rule("list.by-index")


@asynccontextmanager
async def _backend(**options: Any) -> AsyncIterator[siglo.Backend]:
    require_redis()
    async with isolated(REDIS_URL, checkpoint_ttl_ms=None, **options) as backend:
        yield backend


def _adapter(backend: siglo.Backend) -> RedisStorageAdapter:
    adapter = backend.raw_adapter
    assert isinstance(adapter, RedisStorageAdapter)
    return adapter


def _cp(stack: str, revision: int = 1, ns: str = "t", **tokens: str) -> Checkpoint:
    metadata: dict[str, Any] = {"n": stack}
    if tokens:
        metadata[INDEX_KEY] = tokens
    return Checkpoint(
        stack_id=stack,
        namespace=ns,
        revision=revision,
        timestamp=1,
        contexts={"s": {"x": "y" * 50}},
        metadata=metadata,
    )


async def _keys(adapter: RedisStorageAdapter) -> set[str]:
    found = await adapter.client.keys(adapter.keys.prefix + "*")
    return {k.decode() if isinstance(k, bytes) else k for k in found}


async def _members(adapter: RedisStorageAdapter, key: str) -> list[str]:
    found = await adapter.client.zrange(key, 0, -1)
    return [m.decode() if isinstance(m, bytes) else m for m in found]


async def _ids(adapter: Any, tokens: dict[str, str], ns: str = "t", **query: Any) -> list[str]:
    out: list[str] = []
    cursor = None
    while True:
        page = await adapter.list_checkpoints_by_index(tokens, namespace=ns, cursor=cursor, **query)
        out.extend(s.stack_id for s in page.items)
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


@pytest.mark.parametrize("incremental", [False, True])
async def test_the_sets_follow_the_saves(incremental: bool) -> None:
    options = {"incremental_min_bytes": 16} if incremental else {}
    async with _backend(**options) as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_cp("plain"))
        # Without tokens: the seed's keys and siglo's listing index only.
        assert not any("checkpoint-token" in k for k in await _keys(a))
        await a.save_checkpoint(_cp("s1", customer="A"))
        await a.save_checkpoint(_cp("s2", customer="A", plan="P"))
        key = f"{a.keys.prefix}t:checkpoint-token:{{}}customer:A"
        assert key in await _keys(a)
        assert await _members(a, key) == ["t\x00s1", "t\x00s2"]
        assert await _ids(a, {"customer": "A"}) == ["s1", "s2"]
        assert await _ids(a, {"customer": "A"}, limit=1) == ["s1", "s2"]
        assert await _ids(a, {"customer": "A", "plan": "P"}) == ["s2"]
        # The value changes: not listed under the old token, and the walk drops it.
        await a.save_checkpoint(_cp("s1", 2, customer="B"))
        assert await _ids(a, {"customer": "A"}) == ["s2"]
        assert await _members(a, key) == ["t\x00s2"]
        assert await _ids(a, {"customer": "B"}) == ["s1"]
        # A delete: the walk drops the member of the gone checkpoint.
        await a.delete_checkpoint("s2", "t")
        assert await _ids(a, {"customer": "A"}) == []
        assert await _members(a, key) == []
        # A TypeScript writer keeps no sets: its document without the token is not
        # listed (and its member goes); one that keeps the metadata as read still is.
        await a.save_checkpoint(_cp("s3", customer="C"))
        await a.save_checkpoint(_cp("s4", customer="C"))
        ts = _cp("s3", 2).to_json()
        await a.client.set(a.keys.checkpoint("s3", "t"), ts)
        kept = _cp("s4", 2, customer="C").to_json()
        await a.client.set(a.keys.checkpoint("s4", "t"), kept)
        assert await _ids(a, {"customer": "C"}) == ["s4"]


async def test_expired_members_are_dropped_when_met() -> None:
    async with _backend() as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_cp("s1", customer="A"))
        await a.save_checkpoint(_cp("s2", customer="A"))
        await a.client.delete(a.keys.checkpoint("s1", "t"))  # as when Redis expires it
        key = f"{a.keys.prefix}t:checkpoint-token:{{}}customer:A"
        assert await _ids(a, {"customer": "A"}) == ["s2"]
        assert await _members(a, key) == ["t\x00s2"]


async def test_a_walk_reads_the_matching_documents_only() -> None:
    """2,000 stacks of which 4 hold the token: the walk reads those 4 documents, where
    reading the namespace's listing would read all of them."""
    async with _backend() as backend:
        a = _adapter(backend)
        for i in range(2_000):
            await a.save_checkpoint(_cp(f"s{i:04}", customer=f"c{i % 500}"))
        read: list[int] = []
        original = a._redis.call

        async def call(name: str, awaitable: Any) -> Any:
            reply = await original(name, awaitable)
            if name == "MGET":
                read.append(len(reply or ()))
            return reply

        a._redis.call = call  # type: ignore[method-assign,assignment]
        try:
            assert await _ids(a, {"customer": "c7"}) == ["s0007", "s0507", "s1007", "s1507"]
        finally:
            del a._redis.call
        assert sum(read) == 4, read


def test_cluster_sets_share_the_slot_of_their_checkpoints() -> None:
    """On a cluster a set is per slot, tagged to it; where braces in the namespace or
    prefix make a hash tag of their own the walk reads stack by stack instead."""
    from siglo_redis.keys import KeySpace, hash_slot
    from siglo_redis.listing import CheckpointIndex

    for prefix in ("siglo:", "{siglo}:"):
        keys = KeySpace(prefix)
        index = CheckpointIndex(None, object(), keys)  # type: ignore[arg-type]
        index.cluster = True
        for ns in (None, "t", "checkpoint-token", "a{b}c"):
            assert index.indexable(ns)
            for stack in ("s1", "x{y}z", "q"):
                checkpoint = _cp(stack, ns=ns or "t", customer="A:%B")
                checkpoint = checkpoint.replace(namespace=ns)
                key = keys.checkpoint(stack, ns)
                (token_key,) = index.token_keys_of(checkpoint, key)
                assert hash_slot(token_key) == hash_slot(key)
                assert token_key.endswith("customer:A%3A%25B")
        # A whole tag in the prefix pins every key to one slot; else an opening brace in
        # the namespace without its closing one (or an empty tag) gives the checkpoint
        # keys another slot than their sets'.
        tagged = prefix.startswith("{")
        assert index.indexable("a{b") == tagged
        assert index.indexable("a{}b") == tagged
        odd = _cp("s}1", ns="a{b", customer="A")
        key = keys.checkpoint("s}1", "a{b")
        found = index.token_keys_of(odd, key)
        assert found == [] if not tagged else hash_slot(found[0]) == hash_slot(key)
    index = CheckpointIndex(None, object(), KeySpace())  # type: ignore[arg-type]
    assert not index.cluster and index.indexable("a{b")
