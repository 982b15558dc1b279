"""Seed 001 §9's production example, its Redis half (lock, idempotency, nonces), in Python.

The classes are built the way the seed builds them — one user-made client shared by all
four — and reached through ``siglo``'s top-level names. Keys live under a random prefix
instead of ``siglo:`` so the shared server stays clean.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo_redis.connect import delete_prefix

pytestmark = pytest.mark.rule("lock.with-lock", "idempotency.complete", "nonce.claim.once")


class Example:
    """The seed's module-level objects and functions, as one object."""

    def __init__(self, redis: Any, prefix: str) -> None:
        # 2. Register Global Storage Adapter
        self.storage_adapter = siglo.RedisStorageAdapter(
            redis,
            checkpoint_ttl_ms=86_400_000,  # 24 hours
            cache_ttl_ms=300_000,  # 5 minutes
            record_context_changes=True,
            key_prefix=prefix,
        )
        siglo.use_storage(self.storage_adapter)
        # 3. Initialize Idempotency, Mutex Lock & Webhook Dedup
        self.idempotency_store = siglo.RedisIdempotencyStore(
            redis, key_prefix=f"{prefix}idempotency:"
        )
        self.redis_lock = siglo.RedisLock(redis, f"{prefix}lock:", strict_atomicity=True)
        self.nonce_store = siglo.RedisNonceStore(redis, key_prefix=f"{prefix}wh:dedup:")
        self.rate_fetches = 0

    # 4. The workflow's steps; fetchRates is cached for 5 minutes under a fixed key.
    async def fetch_exchange_rates(self) -> dict[str, float]:
        cached = await self.storage_adapter.get_cached_step("currency-rates-latest")
        if cached is not siglo.MISSING:
            return cached  # type: ignore[no-any-return]
        self.rate_fetches += 1
        rates = {"EUR": 1.08, "GBP": 1.27, "JPY": 154.2}
        await self.storage_adapter.set_cached_step("currency-rates-latest", rates, 300_000)
        return rates

    async def settle_invoice(self, invoice: dict[str, Any]) -> dict[str, Any]:
        return {"invoiceId": invoice["invoiceId"], "settled": True,
                "amountUSD": invoice["amount"] * 1.08}  # fmt: skip

    async def billing_flow_run(self, invoice: dict[str, Any]) -> dict[str, Any]:
        await self.fetch_exchange_rates()
        await asyncio.sleep(0.05)  # long enough for a second runner to collide
        return await self.settle_invoice(invoice)

    # 5. Single-Flight Execution Runner with Distributed Lock
    async def process_daily_settlement(self) -> dict[str, Any]:
        return await self.redis_lock.with_lock(
            "lock:daily-settlement",
            lambda: self.billing_flow_run(
                {"invoiceId": "INV-2026-10", "amount": 5000, "currency": "EUR"}
            ),
            15_000,
        )  # 15-second lock timeout

    # 6. Webhook Ingestion with Replay Protection & Idempotency
    async def handle_webhook(self, signature: str, payload: dict[str, Any]) -> Any:
        fresh = await self.nonce_store.claim(signature, 300)
        if not fresh:
            raise RuntimeError("Duplicate or replayed webhook signature detected")
        claim_state = await self.idempotency_store.claim(payload["id"])
        if claim_state == "completed":
            return await self.idempotency_store.get_result(payload["id"])
        if claim_state == "in-progress":
            raise RuntimeError("Concurrent execution already in progress")
        try:
            result = {"processed": True, "id": payload["id"]}
            await self.idempotency_store.complete(payload["id"], result)
            return result
        except Exception as err:
            await self.idempotency_store.fail(payload["id"], err)
            raise


@pytest.fixture
async def example() -> AsyncIterator[Example]:
    require_redis()
    import redis.asyncio

    # 1. Initialize Redis Client
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    prefix = f"siglo-test-{uuid.uuid4().hex[:16]}:"
    try:
        yield Example(client, prefix)
    finally:
        siglo.use_storage(None)
        await delete_prefix(client, prefix)
        # 7. Graceful Shutdown
        await client.aclose()


async def test_single_flight_settlement(example: Example) -> None:
    runs = await asyncio.gather(
        example.process_daily_settlement(),
        example.process_daily_settlement(),
        return_exceptions=True,
    )
    done = [r for r in runs if isinstance(r, dict)]
    refused = [r for r in runs if isinstance(r, siglo.LockNotAcquiredError)]
    assert len(done) == 1 and len(refused) == 1
    assert done[0] == {"invoiceId": "INV-2026-10", "settled": True, "amountUSD": 5400.0}
    assert "lock:daily-settlement" in str(refused[0])
    # The lock was released; the rates came from the step cache the second time.
    assert await example.process_daily_settlement() == done[0]
    assert example.rate_fetches == 1
    assert siglo.default_storage_manager.adapter is example.storage_adapter


async def test_webhook_replay_and_idempotency(example: Example) -> None:
    payload = {"id": "evt-1", "amount": 10}
    first = await example.handle_webhook("sig-1", payload)
    assert first == {"processed": True, "id": "evt-1"}
    with pytest.raises(RuntimeError, match="replayed"):
        await example.handle_webhook("sig-1", payload)
    # A new delivery (new signature) of the same event returns the stored result.
    assert await example.handle_webhook("sig-2", payload) == first


async def test_concurrent_deliveries_process_once(example: Example) -> None:
    payload = {"id": "evt-2", "amount": 10}
    results = await asyncio.gather(
        *(example.handle_webhook(f"sig-{i}", payload) for i in range(10)),
        return_exceptions=True,
    )
    processed = [r for r in results if isinstance(r, dict)]
    assert processed and all(r == {"processed": True, "id": "evt-2"} for r in processed)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert all("in progress" in str(e) for e in errors)
    assert await example.idempotency_store.get("evt-2") == {"processed": True, "id": "evt-2"}
