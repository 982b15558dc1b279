"""Incremental saves on Redis (SPEC §13, issue 34), opt-in with ``incremental_min_bytes``:
a large document's skeleton at the checkpoint key and its context bodies in a parts hash
in the same slot, written by the compare-and-set's one script; loads assemble the saved
bytes; delete, expiry and clean leave nothing behind. Off by default: the key then holds
the whole document TypeScript reads."""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo import Checkpoint, CheckpointConflictError
from siglo.adapter import CacheEntry
from siglo.clock import system_clock
from siglo.config import Settings
from siglo.errors import InvalidArgumentError
from siglo.pipeline import Pipeline, pipeline_adapter
from siglo.records import ContextChangeEvent
from siglo.transfer import export_lines, import_lines
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.connect import connect, isolated
from siglo_redis.scripts import CHECKPOINT_LOAD, CHECKPOINT_PARTS_CAS, Script

pytestmark = pytest.mark.rule("checkpoint.incremental")

LEAST = 16_384


def _doc(revision: int, steps: int, *, stack: str = "run", changed: int = -1) -> Checkpoint:
    contexts = {
        f"step-{i}": {"output": ("o" if i != changed else "c") * 3_000, "i": i}
        for i in range(steps)
    }
    return Checkpoint(stack_id=stack, revision=revision, timestamp=revision, contexts=contexts)


@asynccontextmanager
async def _backend(**options: Any) -> AsyncIterator[siglo.Backend]:
    require_redis()
    async with isolated(REDIS_URL, **{"incremental_min_bytes": LEAST, **options}) as backend:
        yield backend


def _adapter(backend: siglo.Backend) -> RedisStorageAdapter:
    adapter = backend.raw_adapter
    assert isinstance(adapter, RedisStorageAdapter)
    return adapter


async def _keys(adapter: RedisStorageAdapter) -> set[str]:
    found = await adapter.client.keys(adapter.keys.prefix + "*")
    return {k.decode() if isinstance(k, bytes) else k for k in found}


class _Sent:
    """Records the scripts an adapter runs (the real scripts run): their names, and the
    bytes each compare-and-set call carries."""

    def __init__(self, adapter: RedisStorageAdapter) -> None:
        self.inner = adapter._redis
        self.calls: list[int] = []
        self.names: list[str] = []
        adapter._redis = self  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        self.names.append(script.name)
        if script is CHECKPOINT_PARTS_CAS:
            self.calls.append(sum(len(a) for a in args if isinstance(a, bytes)))
        return await self.inner.script(script, keys, args)


async def test_a_save_sends_only_the_contexts_that_changed() -> None:
    async with _backend() as backend:
        a = _adapter(backend)
        sent = _Sent(a)
        first = _doc(1, 10)
        await a.save_checkpoint(first)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == first.to_json()
        parts = a.keys.checkpoint_parts("run")
        stored = await a.client.get(a.keys.checkpoint("run"))
        assert b'"contexts":{}' in stored  # the skeleton: the bodies are in the hash
        assert len([f for f in await a.client.hkeys(parts) if not f.startswith(b"@")]) == 10
        # One context changed, one added: two bodies sent, one dropped, eight untouched.
        second = _doc(2, 11, changed=3)
        await a.save_checkpoint(second, expected_revision=1)
        assert sent.calls[1] < 3 * 3_100 + len(stored) + 1_000, sent.calls
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == second.to_json()
        assert len([f for f in await a.client.hkeys(parts) if not f.startswith(b"@")]) == 11


async def test_with_encryption_a_save_sends_only_the_contexts_that_changed() -> None:
    # Every save sealed every context with a fresh nonce: each was new bytes, and every
    # save sent (and wrote) all of them. Sealed, an unchanged context keeps its bytes.
    async with _backend(incremental_min_bytes=0) as backend:
        a = _adapter(backend)
        sent = _Sent(a)
        key = base64.b64encode(bytes(range(32))).decode()
        sealed: Any = pipeline_adapter(a, Pipeline(Settings(encryption_keys={"k1": key})))
        await sealed.save_checkpoint(_doc(1, 10))
        parts = a.keys.checkpoint_parts("run")

        async def bodies() -> dict[bytes, bytes]:
            found = await a.client.hgetall(parts)
            return {f: v for f, v in found.items() if not f.startswith(b"@")}

        first = await bodies()
        one = max(len(v) for v in first.values())
        assert len(first) == 10 and one > 4_000  # a context's ciphertext, base64
        # One context changed: its body alone is sent, beside the skeleton and the list.
        await sealed.save_checkpoint(_doc(2, 10, changed=3), expected_revision=1)
        assert sent.calls[1] < one + 2_000, sent.calls
        second = await bodies()
        assert len(second.keys() - first.keys()) == 1 and len(first.keys() - second.keys()) == 1
        # Saved again as it is: no body sent, the bodies unchanged.
        await sealed.save_checkpoint(_doc(3, 10, changed=3), expected_revision=2)
        assert sent.calls[2] < 2_000, sent.calls
        assert await bodies() == second
        got = await sealed.get_checkpoint("run")
        assert got is not None and got.to_json() == _doc(3, 10, changed=3).to_json()


async def test_the_script_read_agrees_with_the_transaction() -> None:
    # A cluster client reads with the checkpoint_load script, a plain one with MULTI/EXEC
    # of GET and HGETALL: the same head, parts list and bodies.
    async with _backend() as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 10))
        key, parts = a.keys.checkpoint("run"), a.keys.checkpoint_parts("run")
        found = await a._head_and_parts(key, parts)
        assert found is not None and found[1] is not None
        reply = await a._redis.script(CHECKPOINT_LOAD, [key, parts], [])
        bodies = {bytes.fromhex(reply[i].decode()): reply[i + 1] for i in range(2, len(reply), 2)}
        assert (reply[0], reply[1], bodies) == found
        # Parts of another head (a whole save by a writer without the option): neither
        # path assembles them.
        plain = connect(backend.url, incremental_min_bytes=None)
        try:
            await plain.adapter.save_checkpoint(_doc(2, 10, changed=1), expected_revision=1)
        finally:
            await plain.aclose()
        assert await a._redis.script(CHECKPOINT_LOAD, [key, parts], []) == [
            _doc(2, 10, changed=1).to_json()
        ]
        assert await a._head_and_parts(key, parts) == (_doc(2, 10, changed=1).to_json(), None, {})


async def test_a_refused_save_changes_nothing() -> None:
    async with _backend() as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 10))
        parts = a.keys.checkpoint_parts("run")
        before = (await a.client.get(a.keys.checkpoint("run")), await a.client.hgetall(parts))
        with pytest.raises(CheckpointConflictError):
            await a.save_checkpoint(_doc(9, 12, changed=5), expected_revision=7)
        after = (await a.client.get(a.keys.checkpoint("run")), await a.client.hgetall(parts))
        assert after == before
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == _doc(1, 10).to_json()


class _Commands:
    """Records the names of the commands an adapter sends through ``call``."""

    def __init__(self, adapter: RedisStorageAdapter) -> None:
        self.inner = adapter._redis
        self.names: list[str] = []
        adapter._redis = self  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def call(self, what: str, awaitable: Any) -> Any:
        self.names.append(what)
        return await self.inner.call(what, awaitable)


async def test_a_load_of_what_it_saved_or_loaded_reads_no_bodies() -> None:
    # The bodies kept from its save (or its load) are the ones the hash's @order names:
    # the load reads the key and the hash's @len, @head and @order, and assembles the
    # saved bytes from the bodies kept.
    async with _backend() as backend:
        a = _adapter(backend)
        mine = _doc(1, 10)
        await a.save_checkpoint(mine)
        sent = _Commands(a)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()
        assert "HMGET" in sent.names and "HGETALL" not in sent.names
        fresh = connect(backend.url, incremental_min_bytes=LEAST)
        try:
            f = _adapter(fresh)
            cold = _Commands(f)
            for _ in range(2):  # the first load reads the bodies, the second does not
                got = await f.get_checkpoint("run")
                assert got is not None and got.to_json() == mine.to_json()
            assert cold.names.count("HGETALL") == 1 and cold.names.count("HMGET") == 1
        finally:
            await fresh.aclose()


async def test_a_body_another_writer_replaced_is_never_served_from_memory() -> None:
    # Another adapter (its own memory, as another process) changes a context: the
    # @order it stored names another digest, so the bodies are read. Saved with the
    # bodies this one keeps, the load assembles them from memory.
    async with _backend() as backend:
        a = _adapter(backend)
        other = connect(backend.url, incremental_min_bytes=LEAST)
        try:
            await a.save_checkpoint(_doc(1, 8))
            theirs = _doc(2, 8, changed=3)
            await other.adapter.save_checkpoint(theirs, expected_revision=1)
            sent = _Commands(a)
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == theirs.to_json()
            # The changed body alone is read, in a second HMGET.
            assert sent.names.count("HMGET") == 2 and "HGETALL" not in sent.names
            again = _doc(3, 8, changed=3)  # the bodies it loaded last, a new revision
            await other.adapter.save_checkpoint(again, expected_revision=2)
            sent.names.clear()
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == again.to_json()
            assert "HGETALL" not in sent.names
            # A save of it sends the changed body alone and is read back exactly.
            mine = _doc(4, 8, changed=6)
            await a.save_checkpoint(mine, expected_revision=3)
            for reader in (a, _adapter(other)):
                got = await reader.get_checkpoint("run")
                assert got is not None and got.to_json() == mine.to_json()
            small = _doc(5, 1)  # stored whole
            await other.adapter.save_checkpoint(small, expected_revision=4)
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == small.to_json()
        finally:
            await other.aclose()


async def test_a_save_between_the_parts_list_and_its_bodies_reads_again() -> None:
    # The load reads the key and the parts list (another writer changed step-3), then
    # that writer's next save replaces the hash before the load reads the body: "@head"
    # no longer matches, the key and the whole hash are read, the newest document.
    async with _backend() as backend:
        a = _adapter(backend)
        other = connect(backend.url, incremental_min_bytes=LEAST)
        try:
            await a.save_checkpoint(_doc(1, 8))
            await other.adapter.save_checkpoint(_doc(2, 8, changed=3), expected_revision=1)
            newest = _doc(3, 8, changed=4)
            sent = _Commands(a)
            call = sent.call

            async def racing(what: str, awaitable: Any) -> Any:
                got = await call(what, awaitable)
                if sent.names == ["HMGET"]:
                    await other.adapter.save_checkpoint(newest, expected_revision=2)
                return got

            sent.call = racing  # type: ignore[method-assign]
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == newest.to_json()
            assert sent.names == ["HMGET", "HMGET", "HGETALL"]
        finally:
            await other.aclose()


async def test_another_writer_dropping_parts_is_noticed() -> None:
    # This adapter believes the hash holds its bodies; another one replaced them with a
    # small (whole) document: the save sends every body again, and reads are whole.
    async with _backend() as backend:
        a = _adapter(backend)
        other = connect(backend.url, incremental_min_bytes=LEAST)
        try:
            await a.save_checkpoint(_doc(1, 10))
            await other.adapter.save_checkpoint(_doc(2, 1), expected_revision=1)
            assert await a.client.exists(a.keys.checkpoint_parts("run")) == 0
            third = _doc(3, 10, changed=2)
            await a.save_checkpoint(third, expected_revision=2)
            for reader in (a, other.adapter):
                got = await reader.get_checkpoint("run")
                assert got is not None and got.to_json() == third.to_json()
        finally:
            await other.aclose()


async def test_shrinking_saves_whole_and_growing_again_in_parts() -> None:
    async with _backend() as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 10))
        small = _doc(2, 2)
        assert len(small.to_json()) < LEAST
        await a.save_checkpoint(small, expected_revision=1)
        assert await a.client.get(a.keys.checkpoint("run")) == small.to_json()
        assert await a.client.exists(a.keys.checkpoint_parts("run")) == 0
        again = _doc(3, 12)
        await a.save_checkpoint(again, expected_revision=2)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == again.to_json()


async def test_a_reader_without_the_option_reads_parts_and_writes_whole() -> None:
    async with _backend() as backend:
        a = _adapter(backend)
        plain = connect(backend.url, incremental_min_bytes=None)
        try:
            await a.save_checkpoint(_doc(1, 10))
            got = await plain.adapter.get_checkpoint("run")
            assert got is not None and got.to_json() == _doc(1, 10).to_json()
            page = await plain.adapter.list_checkpoints()
            assert [s.stack_id for s in page.items] == ["run"]
            # Its save is whole; the parts hash it leaves belongs to no head: ignored.
            whole = _doc(2, 10, changed=1)
            await plain.adapter.save_checkpoint(whole, expected_revision=1)
            assert await a.client.get(a.keys.checkpoint("run")) == whole.to_json()
            for reader in (a, plain.adapter):
                got = await reader.get_checkpoint("run")
                assert got is not None and got.to_json() == whole.to_json()
            # The next incremental save or the delete drops it.
            assert await a.delete_checkpoint("run")
            assert await a.client.exists(a.keys.checkpoint_parts("run")) == 0
        finally:
            await plain.aclose()


async def test_delete_leaves_nothing() -> None:
    async with _backend() as backend:
        a = _adapter(backend)
        before = await _keys(a)
        await a.save_checkpoint(_doc(1, 10))
        # The context stream of one of its steps: the delete finds the steps in the
        # assembled document (the skeleton names none).
        await a.on_context_change(
            ContextChangeEvent(stack_id="run", step_id="step-1", key="k", timestamp=1, value=1)
        )
        assert {a.keys.checkpoint_parts("run"), a.keys.context("run", "step-1")} <= (await _keys(a))
        assert await a.delete_checkpoint("run")
        assert await _keys(a) == before
        assert await a.get_checkpoint("run") is None


async def test_expiry_leaves_nothing() -> None:
    async with _backend(checkpoint_ttl_ms=300) as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 10))
        assert a.keys.checkpoint_parts("run") in await _keys(a)
        await asyncio.sleep(0.6)
        assert await a.get_checkpoint("run") is None
        await a.clean_expired()
        assert await _keys(a) == set()


async def test_export_and_import_carry_the_document() -> None:
    async with _backend() as source, _backend() as target:
        doc = _doc(4, 10, stack="moved")
        await source.adapter.save_checkpoint(doc)
        lines = [line async for line in export_lines(source.raw_adapter)]
        assert any(b"step-9" in line for line in lines)
        await import_lines(target.raw_adapter, lines)
        back = await target.adapter.get_checkpoint("moved")
        assert back is not None and back.to_json() == doc.to_json()
        t = _adapter(target)
        assert a_parts(t, "moved") in await _keys(t)


def a_parts(adapter: RedisStorageAdapter, stack: str) -> str:
    """The parts hash of ``stack``'s checkpoint."""
    return adapter.keys.checkpoint_parts(stack)


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_threshold_is_refused_by_name(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match="incremental_min_bytes"):
        connect(f"{REDIS_URL}?incremental_min_bytes={value}")


def test_off_by_default() -> None:
    backend = connect(REDIS_URL)
    adapter = backend.raw_adapter
    assert isinstance(adapter, RedisStorageAdapter)
    assert adapter.incremental_min_bytes is None
    assert connect(f"{REDIS_URL}?incremental_min_bytes=0").adapter is not None


async def test_reads_during_saves_are_never_torn() -> None:
    # A reader racing a writer sees, at each read, exactly one saved document: the key
    # and the hash read side by side prove themselves, or the atomic read decides.
    async with _backend() as backend:
        a = _adapter(backend)
        reader = connect(backend.url, incremental_min_bytes=LEAST)
        docs = [_doc(r, 8 + r % 3, changed=r % 8) for r in range(1, 41)]
        saved = {d.to_json() for d in docs}
        await a.save_checkpoint(docs[0])
        done = False

        async def write() -> None:
            nonlocal done
            for previous, doc in itertools.pairwise(docs):
                await a.save_checkpoint(doc, expected_revision=previous.revision)
            done = True

        async def read() -> int:
            reads = 0
            while not done:
                got = await reader.adapter.get_checkpoint("run")
                assert got is not None and got.to_json() in saved
                reads += 1
            return reads

        try:
            _, reads = await asyncio.gather(write(), read())
        finally:
            await reader.aclose()
        assert reads > 0


async def test_cancel_workflow_keeps_the_parts_in_step() -> None:
    async with _backend() as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 10))
        await a.cancel_workflow("run")
        got = await a.get_checkpoint("run")
        assert got is not None and got.status == "cancelled" and got.revision == 2
        assert got.contexts == _doc(1, 10).contexts


@pytest.mark.parametrize("least", [LEAST, None])
async def test_cancel_workflow_keeps_the_checkpoints_ttl(least: int | None) -> None:
    """As the reference model keeps the checkpoint's expiry when it cancels, and as the
    whole write keeps the key's TTL: in parts too (the retention started again there)."""
    async with _backend(checkpoint_ttl_ms=600_000, incremental_min_bytes=least) as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 10))
        key, parts = a.keys.checkpoint("run"), a.keys.checkpoint_parts("run")
        assert parts is not None
        # What ten minutes of the retention gone by leave: 5 s.
        await a.client.pexpire(key, 5_000)
        if least is not None:
            await a.client.pexpire(parts, 5_000)
        await a.cancel_workflow("run")
        got = await a.get_checkpoint("run")
        assert got is not None and got.status == "cancelled"
        assert 0 < await a.client.pttl(key) <= 5_000
        if least is not None:
            assert 0 < await a.client.pttl(parts) <= 5_000
        else:
            assert parts not in await _keys(a)


async def test_revisions_past_two_to_the_53_are_saved_whole_and_drop_the_parts() -> None:
    # Lua's doubles cannot compare them: the exact path decides and writes the document
    # whole, then drops the parts hash that no longer belongs to the key.
    async with _backend() as backend:
        a = _adapter(backend)
        big = 2**53
        await a.save_checkpoint(_doc(big - 5, 10))
        assert await a.client.exists(a.keys.checkpoint_parts("run")) == 1
        doc = _doc(big + 1, 10, changed=2)
        await a.save_checkpoint(doc, expected_revision=big - 5)
        assert await a.client.get(a.keys.checkpoint("run")) == doc.to_json()
        assert await a.client.exists(a.keys.checkpoint_parts("run")) == 0
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == doc.to_json()


@pytest.mark.parametrize("namespace", ["{}", "{x", "t{}"])
async def test_a_namespace_whose_braces_move_the_hash_tag_is_stored_whole(
    namespace: str,
) -> None:
    """Braces in a namespace can give the checkpoint key another hash tag than the parts
    hash's (a Redis Cluster refuses a script over two slots): such a stack has no parts
    hash, and is saved, read and deleted whole — in a cluster as on one server."""
    async with _backend() as backend:
        a = _adapter(backend)
        assert a.keys.checkpoint_parts("run", namespace) is None
        before = await _keys(a)
        saved = _doc(1, 10).replace(namespace=namespace)
        await a.save_checkpoint(saved, expected_revision=0)
        assert await a.get_checkpoint("run", namespace, fallback=False) == saved
        assert not [k for k in await _keys(a) if "checkpoint-parts" in k]  # stored whole
        await a.save_checkpoint(_doc(2, 10, changed=3).replace(namespace=namespace))
        assert await a.delete_checkpoint("run", namespace)
        assert await _keys(a) == before


# -- the parts hash never outlives its key -------------------------------------------------


async def _ttls(adapter: RedisStorageAdapter, stack: str = "run") -> tuple[int, int]:
    """The PTTLs of a checkpoint's key and its parts hash (-2: no such key, -1: none)."""
    key, parts = adapter.keys.checkpoint(stack), adapter.keys.checkpoint_parts(stack)
    return int(await adapter.client.pttl(key)), int(await adapter.client.pttl(parts))


@pytest.mark.parametrize("how", ["save", "streamed", "caching", "exact"])
async def test_a_whole_save_over_parts_drops_the_parts_hash(how: str) -> None:
    """A process without the option saves whole, with an expiry, a stack another saved in
    parts (without one): its script drops the parts hash, which kept its own TTL (here
    none) and, once the key expired, held the bodies of a gone checkpoint forever — not
    even `siglo clean` removed it (an auditor's finding). Every whole write: a plain save,
    a step's one script (with its changes, with its cache entry), the exact path of
    revisions past 2**53."""
    async with _backend(checkpoint_ttl_ms=None) as backend:
        a = _adapter(backend)
        start = 2**53 - 5 if how == "exact" else 1
        await a.save_checkpoint(_doc(start, 10))
        assert await _ttls(a) == (-1, -1)  # stored in parts, kept until removed
        plain = connect(backend.url, incremental_min_bytes=None)
        try:
            p: Any = plain.raw_adapter
            whole = _doc(start + 6, 10, changed=2).replace(expires_at=system_clock.now_ms() + 800)
            change = ContextChangeEvent(stack_id="run", step_id="step-2", key="k", timestamp=1)
            if how == "streamed":
                await p.save_checkpoint_streamed(whole, [change], expected_revision=start)
            elif how == "caching":
                entry = CacheEntry("price", {"v": 1}, 60_000)
                await p.save_checkpoint_caching(whole, [change], entry, expected_revision=start)
            else:
                await p.save_checkpoint(whole, expected_revision=start)
        finally:
            await plain.aclose()
        assert await a.client.get(a.keys.checkpoint("run")) == whole.to_json()
        key_ttl, parts_ttl = await _ttls(a)
        assert 0 < key_ttl <= 800 and parts_ttl == -2
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == whole.to_json()
        await asyncio.sleep(1.0)
        await a.clean_expired()
        assert not {k for k in await _keys(a) if "checkpoint" in k}


async def test_cancel_over_a_whole_key_drops_a_parts_hash_left_beside_it() -> None:
    # siglo before whole writes dropped the hash left one beside a key stored whole:
    # cancel_workflow writes that key whole again (keeping its TTL) and drops the hash.
    async with _backend(incremental_min_bytes=None) as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 3).replace(expires_at=system_clock.now_ms() + 60_000))
        parts = a.keys.checkpoint_parts("run")
        await a.client.hset(parts, mapping={"@len": "1", "@head": "x", "@order": "[]"})
        await a.cancel_workflow("run")
        got = await a.get_checkpoint("run")
        assert got is not None and got.status == "cancelled"
        assert await a.client.exists(parts) == 0
        assert 0 < (await _ttls(a))[0] <= 60_000  # the key's TTL kept


async def test_clean_drops_the_parts_hashes_no_stored_checkpoint_owns() -> None:
    """A parts hash whose key is gone (removed past siglo: by hand, evicted, or left by
    siglo before whole writes dropped it) or holds another head is dropped by `siglo
    clean`, whatever the cleaning process's option; one the key stored holds stays, and
    so does any key whose name merely reads as one."""
    async with _backend() as backend:
        a = _adapter(backend)
        for stack in ("kept", "evicted", "rewritten"):
            await a.save_checkpoint(_doc(1, 10, stack=stack))
        ns = "wait"  # a namespace escaped in key names
        await a.save_checkpoint(_doc(1, 10, stack="n:s").replace(namespace=ns))
        await a.client.delete(a.keys.checkpoint("evicted"), a.keys.checkpoint("n:s", ns))
        await a.client.set(a.keys.checkpoint("rewritten"), _doc(2, 10, stack="rewritten").to_json())
        # Keys whose names hold "checkpoint-parts:" but are not parts hashes: left alone.
        stream = a.keys.context("kept", "checkpoint-parts:{0}kept")
        await a.client.hset(stream, "k", "1")
        fake = a.keys.checkpoint_parts("stringy")
        await a.client.set(fake, "not a hash")  # named as one, of another type
        plain = connect(backend.url, incremental_min_bytes=None)
        try:
            counts = await plain.raw_adapter.clean_expired()  # type: ignore[attr-defined]
        finally:
            await plain.aclose()
        assert counts["checkpoint_parts"] == 3
        left = {k for k in await _keys(a) if "checkpoint-parts" in k}
        assert left == {a.keys.checkpoint_parts("kept"), stream, fake}
        for stack in ("kept", "rewritten"):
            got = await a.get_checkpoint(stack)
            want = _doc(1 if stack == "kept" else 2, 10, stack=stack)
            assert got is not None and got.to_json() == want.to_json()
        assert (await a.clean_expired())["checkpoint_parts"] == 0


def test_a_parts_hash_names_its_checkpoint() -> None:
    keys = RedisStorageAdapter(REDIS_URL, key_prefix="p:").keys
    for stack, namespace in [("run", None), ("a:b}c{d", "t"), ("x", "wait"), ("y", "a%b:c")]:
        name = keys.checkpoint_parts(stack, namespace)
        assert name is not None and keys.checkpoint_parts_of(name) == (stack, namespace)
    for other in ["p:checkpoint:run", "p:checkpoint-parts:run", "q:checkpoint-parts:{0}r"]:
        assert keys.checkpoint_parts_of(other) is None
    wrong_tag = keys.checkpoint_parts("run").replace("{", "{0")  # type: ignore[union-attr]
    assert keys.checkpoint_parts_of(wrong_tag) is None


# -- a save the size guard refuses streams nothing -----------------------------------------


@pytest.mark.parametrize("least", [LEAST, 0, None])
async def test_a_refused_save_streams_none_of_the_changes_it_carries(least: int | None) -> None:
    """A change set in the same turn as a save goes with that save: when the size guard
    refuses the save, none is written (docs/large-state.md). With incremental saves on,
    the manager streamed it first and the guard refused only the save (an auditor's
    finding): the step's writes now go in the parts script too."""
    async with _backend(incremental_min_bytes=least) as backend:
        backend.raw_adapter.max_document_bytes = 20_000
        manager = siglo.StorageManager(backend, error_mode="best-effort")
        stack = manager.create_stack("st")
        stack.set("base", "v", "b" * 12_000)
        await manager.save_checkpoint("st")
        stack.set("new", "v", "n" * 12_000)  # under the limit alone, the document over
        with pytest.raises(siglo.DocumentTooLargeError):
            await manager.save_checkpoint("st")
        assert await backend.adapter.get_context_changes("st", "new") == {}
        stored = await backend.adapter.get_checkpoint("st")
        assert stored is not None and stored.revision == 1
        stack.set("new", "v", "short")  # the next save that fits writes the stream
        await manager.save_checkpoint("st")
        assert await backend.adapter.get_context_changes("st", "new") == {"v": "short"}


async def test_a_step_saved_in_parts_is_one_script() -> None:
    """A step's changes, its cache entry and its checkpoint saved in parts go in one
    script, the changes and the entry written whatever the compare-and-set decides (as
    the whole save's step_save); a body believed stored and gone makes it write nothing
    the first time and everything with every body."""
    async with _backend() as backend:
        a = _adapter(backend)
        await a.save_checkpoint(_doc(1, 10))
        sent = _Sent(a)
        change = ContextChangeEvent(stack_id="run", step_id="step-1", key="k", timestamp=1)
        entry = CacheEntry("price", {"v": 1}, 60_000)
        with pytest.raises(CheckpointConflictError):
            await a.save_checkpoint_caching(
                _doc(3, 10, changed=1), [change], entry, expected_revision=2
            )
        assert sent.names == ["parts_step_save"]
        assert await a.get_context_changes("run", "step-1") == {"k": None}
        assert await a.get_cached_step("price") == {"v": 1}
        assert (await a.get_checkpoint("run")).to_json() == _doc(1, 10).to_json()  # type: ignore[union-attr]
        # A body it believes stored is gone: refused with nothing written, then sent whole.
        await a.client.hdel(
            a.keys.checkpoint_parts("run"),
            *[
                f
                for f in await a.client.hkeys(a.keys.checkpoint_parts("run"))
                if not f.startswith(b"@")
            ][:1],
        )
        sent.names.clear()
        other = ContextChangeEvent(stack_id="run", step_id="step-2", key="j", value=2, timestamp=1)
        doc = _doc(2, 10, changed=1)
        await a.save_checkpoint_streamed(doc, [other], expected_revision=1)
        assert sent.names == ["parts_step_save", "parts_step_save"]
        assert await a.get_context_changes("run", "step-2") == {"j": 2}
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == doc.to_json()
