"""Wire compatibility with the TypeScript ``@siglo/redis`` (seed 001 §5–§8), both ways.

siglo writes, a plain Redis client reads the raw keys: exact names, TTLs and JSON. Then a
plain client writes keys the way the seed's TypeScript adapter does, and siglo reads them.
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
import pytest

import siglo
from siglo import MISSING, Checkpoint, ContextChangeEvent, WaitRecord
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.keys import KeySpace, fence_key, hash_slot, legacy_fence_key

pytestmark = pytest.mark.rule("wire.checkpoint")


def prefix_of(backend: siglo.Backend) -> str:
    adapter = backend.adapter
    assert isinstance(adapter, RedisStorageAdapter)
    return adapter.keys.prefix


def within(actual: int, expected: int, slack: int = 2_000) -> bool:
    return expected - slack <= actual <= expected


def test_default_key_names_are_the_seeds() -> None:
    keys = KeySpace()
    assert keys.checkpoint("s1") == "siglo:checkpoint:s1"
    assert keys.checkpoint("s1", "tenant-a") == "siglo:tenant-a:checkpoint:s1"
    assert keys.wait("order-42") == "siglo:wait:order-42"
    assert keys.cache("currency-rates-latest") == "siglo:cache:currency-rates-latest"
    assert keys.context("s1", "step1") == "siglo:context:s1:step1"
    assert keys.context("s1", "step1", "tenant-a") == "siglo:tenant-a:context:s1:step1"
    assert keys.lock_prefix == "siglo:lock:"
    assert keys.nonce_prefix == "siglo:wh:dedup:"


@pytest.mark.rule("ids.hostile")
def test_ambiguous_ids_get_distinct_keys() -> None:
    keys = KeySpace()
    # The seed's names would make these pairs the same key; siglo escapes just enough.
    assert keys.context("a:b", "c") != keys.context("a", "b:c")
    assert keys.checkpoint("x", "wait") != keys.wait("checkpoint:x")
    assert keys.checkpoint("c", "a:checkpoint:b") != keys.checkpoint("b:checkpoint:c", "a")
    assert keys.checkpoint("checkpoint:x") != keys.checkpoint("x", "checkpoint")
    assert keys.checkpoint("s", "wait") != keys.checkpoint("s", "%77ait")


def test_fence_key_shares_the_lock_keys_slot() -> None:
    for lock_key in ["daily", "lock:daily-settlement", "a{b}c", "x}y{", "{}", "ü" * 50]:
        full = "siglo:lock:" + lock_key
        assert hash_slot(fence_key("siglo:lock-fence:", full)) == hash_slot(full)
        legacy = legacy_fence_key("siglo:lock-fence:", lock_key, full)
        assert hash_slot(legacy) == hash_slot(full)


async def test_siglo_writes_the_seeds_keys(redis_backend: siglo.Backend, raw_redis: Any) -> None:
    p = prefix_of(redis_backend)
    adapter = redis_backend.adapter
    now = time.time_ns() // 1_000_000

    cp = Checkpoint(
        stack_id="s1",
        revision=1,
        timestamp=now,
        workflow_id="billing",
        status="waiting",
        chains=("fetchRates", "settleInvoice"),
        contexts={"fetchRates": {"EUR": 1.08}},
        expires_at=now + 60_000,
        metadata={"attempt": 1},
    )
    await adapter.save_checkpoint(cp)
    raw = await raw_redis.get(f"{p}checkpoint:s1")
    assert orjson.loads(raw) == {
        "version": 2,
        "schemaVersion": "2.0.0",
        "stackId": "s1",
        "workflowId": "billing",
        "type": "execution",
        "status": "waiting",
        "revision": 1,
        "chains": ["fetchRates", "settleInvoice"],
        "contexts": {"fetchRates": {"EUR": 1.08}},
        "timestamp": now,
        "expiresAt": now + 60_000,
        "metadata": {"attempt": 1},
    }
    # PX is the earlier of expiresAt and checkpoint_ttl_ms (24 h by default).
    assert within(await raw_redis.pttl(f"{p}checkpoint:s1"), 60_000)

    await adapter.save_checkpoint(cp.replace(namespace="tenant-a", expires_at=None))
    raw = await raw_redis.get(f"{p}tenant-a:checkpoint:s1")
    assert orjson.loads(raw)["namespace"] == "tenant-a"
    assert within(await raw_redis.pttl(f"{p}tenant-a:checkpoint:s1"), 86_400_000)

    record = WaitRecord(
        correlation_key="order-42", stack_id="s1", step_id="await-payment", created_at=now
    )
    await adapter.save_wait_record(record)
    expected = {
        "correlationKey": "order-42",
        "stackId": "s1",
        "status": "waiting",
        "stepId": "await-payment",
        "createdAt": now,
    }
    # Dual-indexed under the correlation key and the stack id, with checkpointTtlMs.
    for key in (f"{p}wait:order-42", f"{p}wait:s1"):
        assert orjson.loads(await raw_redis.get(key)) == expected
        assert within(await raw_redis.pttl(key), 86_400_000)
    # siglo's own index of a stack's waits (for cancel_workflow): documented extra key.
    assert await raw_redis.zrange(f"{p}wait-index:s1", 0, -1) == ["order-42"]

    await adapter.set_cached_step("currency-rates-latest", {"EUR": 1.08}, 300_000)
    await adapter.set_cached_step("answer", 42, 5_000)
    await adapter.set_cached_step("nothing", None)
    await adapter.set_cached_step("wrapper-like", {"value": 1})
    assert orjson.loads(await raw_redis.get(f"{p}cache:currency-rates-latest")) == {"EUR": 1.08}
    assert orjson.loads(await raw_redis.get(f"{p}cache:answer")) == {"value": 42}
    assert orjson.loads(await raw_redis.get(f"{p}cache:nothing")) == {"value": None}
    assert orjson.loads(await raw_redis.get(f"{p}cache:wrapper-like")) == {"value": {"value": 1}}
    assert within(await raw_redis.pttl(f"{p}cache:currency-rates-latest"), 300_000)
    assert within(await raw_redis.pttl(f"{p}cache:answer"), 5_000)
    assert within(await raw_redis.pttl(f"{p}cache:nothing"), 300_000)  # cache_ttl_ms

    await adapter.on_context_change(
        ContextChangeEvent(stack_id="s1", step_id="step1", key="total", value=5000, timestamp=now)
    )
    await adapter.on_context_change(
        ContextChangeEvent(
            stack_id="s1",
            step_id="step1",
            key="who",
            value={"name": "Ada"},
            namespace="tenant-a",
            timestamp=now,
        )
    )
    assert await raw_redis.hgetall(f"{p}context:s1:step1") == {"total": "5000"}
    assert await raw_redis.hgetall(f"{p}tenant-a:context:s1:step1") == {"who": '{"name":"Ada"}'}
    assert within(await raw_redis.pttl(f"{p}context:s1:step1"), 86_400_000)

    assert redis_backend.lock is not None
    held = await redis_backend.lock.acquire("daily-settlement", 15_000)
    assert re.fullmatch(r"lock_\d{13}_[0-9a-f]{32}", held.token)
    assert await raw_redis.get(f"{p}lock:daily-settlement") == held.token
    assert within(await raw_redis.pttl(f"{p}lock:daily-settlement"), 15_000)

    assert redis_backend.idempotency is not None
    await redis_backend.idempotency.claim("evt-1")
    assert await raw_redis.get(f"{p}idempotency:evt-1") == "in-progress"
    assert within(await raw_redis.pttl(f"{p}idempotency:evt-1"), 86_400_000)
    await redis_backend.idempotency.complete("evt-1", {"processed": True, "id": "evt-1"})
    assert (
        await raw_redis.get(f"{p}idempotency:evt-1") == 'COMPLETED:{"processed":true,"id":"evt-1"}'
    )
    await redis_backend.idempotency.complete("evt-2", None)
    assert await raw_redis.get(f"{p}idempotency:evt-2") == "COMPLETED:null"

    assert redis_backend.nonces is not None
    assert await redis_backend.nonces.claim("sig-abc", 300)
    assert await raw_redis.get(f"{p}wh:dedup:sig-abc") == "1"
    assert within(await raw_redis.pttl(f"{p}wh:dedup:sig-abc"), 300_000)


async def test_siglo_reads_keys_written_the_seeds_way(
    redis_backend: siglo.Backend, raw_redis: Any
) -> None:
    p = prefix_of(redis_backend)
    adapter = redis_backend.adapter
    now = time.time_ns() // 1_000_000
    ttl = 86_400_000
    # As @siglo/redis writes them: SET key JSON PX checkpointTtlMs, extra fields and all.
    doc = {
        "version": 2,
        "schemaVersion": "2.0.0",
        "stackId": "ts-1",
        "type": "execution",
        "status": "running",
        "revision": 3,
        "chains": ["a"],
        "contexts": {"a": {"n": 1}},
        "timestamp": now,
        "tsOnly": {"kept": True},
    }
    await raw_redis.set(f"{p}checkpoint:ts-1", orjson.dumps(doc), px=ttl)
    await raw_redis.set(
        f"{p}tenant-b:checkpoint:ts-1", orjson.dumps({**doc, "namespace": "tenant-b"}), px=ttl
    )
    got = await adapter.get_checkpoint("ts-1")
    assert got is not None and got.revision == 3 and got.extra == {"tsOnly": {"kept": True}}
    assert got.to_wire() == doc
    ns = await adapter.get_checkpoint("ts-1", "tenant-b")
    assert ns is not None and ns.namespace == "tenant-b"
    # A TypeScript checkpoint whose expiresAt passed is gone, whatever PX its key has.
    await raw_redis.set(
        f"{p}checkpoint:ts-old",
        orjson.dumps({**doc, "stackId": "ts-old", "expiresAt": now - 1}),
        px=ttl,
    )
    assert await adapter.get_checkpoint("ts-old") is None
    # ...and siglo's compare-and-set continues from the stored revision.
    with pytest.raises(siglo.CheckpointConflictError) as conflict:
        await adapter.save_checkpoint(Checkpoint.from_wire(doc), expected_revision=2)
    assert conflict.value.current_revision == 3
    await adapter.save_checkpoint(Checkpoint.from_wire({**doc, "revision": 4}), expected_revision=3)
    # Resumed through the manager, changed and saved: the fields siglo does not know are
    # kept (docs/backends/redis.md), redacted like the rest, whichever way it is saved.
    manager = siglo.StorageManager(redis_backend, redact_fields=["secret"])
    await raw_redis.set(
        f"{p}checkpoint:ts-3",
        orjson.dumps({**doc, "stackId": "ts-3", "tsMeta": {"by": "ts", "secret": "s3cr3t"}}),
        px=ttl,
    )
    stack = await manager.resume("ts-3")
    assert stack is not None
    stack.set("a", "n", 2)
    await manager.save(stack)
    manager.discard_stack(stack)
    stack = await manager.resume("ts-3")
    assert stack is not None
    stack.set("a", "n", 3)
    manager.checkpoint(stack)  # a background save
    await manager.flush()
    stored = orjson.loads(await raw_redis.get(f"{p}checkpoint:ts-3"))
    assert stored["tsOnly"] == {"kept": True}, stored
    assert stored["tsMeta"] == {"by": "ts", "secret": "[REDACTED]"}, stored
    assert stored["contexts"] == {"a": {"n": 3}} and stored["revision"] == 5

    # Wait records, dual-indexed, without siglo's index key.
    record = {
        "correlationKey": "pay-7",
        "stackId": "ts-1",
        "status": "waiting",
        "eventType": "paid",
    }
    for key in (f"{p}wait:pay-7", f"{p}wait:ts-1"):
        await raw_redis.set(key, orjson.dumps(record), px=ttl)
    by_key = await adapter.get_wait_record("pay-7")
    by_stack = await adapter.get_wait_record("ts-1")
    assert by_key is not None and by_key.to_wire() == record
    assert by_stack == by_key
    claimed = await adapter.claim_wait_record("pay-7", "py-worker", event_payload={"amount": 5})
    assert claimed is not None and claimed.status == "claimed"
    # The stack lookup follows the copy to the record's current state.
    assert (await adapter.get_wait_record("ts-1")) == claimed
    await adapter.cancel_workflow("ts-1")
    cancelled = await adapter.get_wait_record("pay-7")
    assert cancelled is not None and cancelled.status == "cancelled"

    # A wait record kept in the checkpoint's metadata (the seed's last fallback).
    await raw_redis.set(
        f"{p}checkpoint:ts-2",
        orjson.dumps(
            {
                **doc,
                "stackId": "ts-2",
                "metadata": {
                    "waitRecord": {"correlationKey": "k2", "stackId": "ts-2", "status": "waiting"}
                },
            }
        ),
        px=ttl,
    )
    embedded = await adapter.get_wait_record("ts-2")
    assert embedded is not None and embedded.correlation_key == "k2"

    # Step cache: objects directly, primitives wrapped, and a non-JSON string raw.
    await raw_redis.set(f"{p}cache:obj", '{"EUR":1.08}', px=300_000)
    await raw_redis.set(f"{p}cache:num", '{"value":0}', px=300_000)
    await raw_redis.set(f"{p}cache:null", '{"value":null}', px=300_000)
    await raw_redis.set(f"{p}cache:plain", "not json", px=300_000)
    assert await adapter.get_cached_step("obj") == {"EUR": 1.08}
    assert await adapter.get_cached_step("num") == 0
    assert await adapter.get_cached_step("null") is None
    assert await adapter.get_cached_step("plain") == "not json"
    assert await adapter.get_cached_step("absent") is MISSING

    # Context stream: HSET of JSON values.
    await raw_redis.hset(f"{p}context:ts-1:a", mapping={"n": "2", "who": '"Ada"'})
    assert await adapter.get_context_changes("ts-1", "a") == {"n": 2, "who": "Ada"}

    # Idempotency values, lock tokens and nonces of a TypeScript worker.
    assert redis_backend.idempotency is not None
    await raw_redis.set(f"{p}idempotency:evt-9", 'COMPLETED:{"ok":1}', px=60_000)
    await raw_redis.set(f"{p}idempotency:evt-10", "in-progress", px=60_000)
    assert await redis_backend.idempotency.claim("evt-9") == "completed"
    assert await redis_backend.idempotency.get_result("evt-9") == {"ok": 1}
    assert await redis_backend.idempotency.claim("evt-10") == "in-progress"
    await redis_backend.idempotency.fail("evt-10")
    assert await redis_backend.idempotency.claim("evt-10") == "claimed"

    assert redis_backend.lock is not None
    ts_token = f"lock_{now}_{'ab' * 16}"
    await raw_redis.set(f"{p}lock:daily-settlement", ts_token, px=15_000)
    assert not (await redis_backend.lock.acquire("daily-settlement")).acquired
    assert not await redis_backend.lock.release("daily-settlement", "someone-else")
    assert await redis_backend.lock.release("daily-settlement", ts_token)
    assert await raw_redis.exists(f"{p}lock:daily-settlement") == 0

    assert redis_backend.nonces is not None
    await raw_redis.set(f"{p}wh:dedup:sig-ts", "1", px=300_000)
    assert not await redis_backend.nonces.claim("sig-ts", 300)
