"""Expiry on the SQL backends, by the injected clock: reads never return expired rows,
and clean-ups delete in bounded batches and return the count.

Rules: checkpoint.expiry.hidden, checkpoint.expiry.clean, cache.expiry,
idempotency.expiry, nonce.expiry, lock.expiry.
"""

from __future__ import annotations

import pytest
from sql_support import KINDS, open_backend

import siglo
from siglo import Checkpoint, ContextChangeEvent, ManualClock, WaitRecord

pytestmark = pytest.mark.parametrize("kind", KINDS)


async def test_clean_in_batches_returns_the_count(kind: str) -> None:
    clock = ManualClock(1_000)
    async with open_backend(kind, clock=clock, clean_batch_size=100) as backend:
        a = backend.adapter
        db = a.database  # type: ignore[attr-defined]
        cp = a._s.cp_insert_if_absent  # type: ignore[attr-defined]
        # 250 checkpoints expiring at 1_500, 10 kept: written directly, in one transaction.
        from siglo_sql.keys import row_id

        async with db.transaction() as tx:
            for i in range(260):
                gone = 1_500 if i < 250 else None
                doc = Checkpoint(stack_id=f"s{i}", revision=1, timestamp=1).to_json()
                row = {"id": row_id("", f"s{i}"), "namespace": "", "stack_id": f"s{i}"}
                row.update(revision=1, status="running", gone_at=gone, document=doc)
                row.update(workflow_id=None, updated_at=1, expires_at=None, parts=None, now=0)
                await tx.fetch(cp, row)
        assert await a.clean_expired_checkpoints() == 0
        clock.advance(499)
        assert await a.get_checkpoint("s0") is not None
        clock.advance(1)
        assert await a.get_checkpoint("s0") is None  # hidden before any clean-up
        assert await a.clean_expired_checkpoints() == 250
        assert await a.clean_expired_checkpoints() == 0
        assert await a.get_checkpoint("s255") is not None


async def test_expired_rows_are_gone_everywhere(kind: str) -> None:
    clock = ManualClock(1_000)
    async with open_backend(kind, clock=clock, checkpoint_ttl_ms=1_000) as backend:
        a = backend.adapter
        assert backend.idempotency
        assert backend.lock
        assert backend.nonces
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=5, timestamp=1))
        await a.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"))
        await a.set_cached_step("c", 1, ttl_ms=1_000)
        event = ContextChangeEvent(stack_id="s", step_id="p", key="f", value=1, timestamp=1)
        await a.on_context_change(event)
        assert await backend.idempotency.claim("i", 1_000) == "claimed"
        assert (await backend.lock.acquire("l", 1_000)).fencing_token == 1
        assert await backend.nonces.claim("n", 1)
        clock.advance(1_000)
        assert await a.get_checkpoint("s") is None
        assert await a.get_wait_record("k") is None
        assert await a.get_cached_step("c") is siglo.MISSING
        assert await a.get_context_changes("s", "p") == {}
        # An expired checkpoint counts as none: a save with a lower revision is fine.
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        counts = await a.clean_expired()  # type: ignore[attr-defined]
        assert counts == {
            "checkpoints": 0,
            "wait_records": 1,
            "step_cache": 1,
            "context_changes": 1,
            "idempotency_keys": 1,
            "locks": 1,
            "nonces": 1,
        }
        assert await backend.idempotency.claim("i") == "claimed"
        assert await backend.nonces.claim("n", 1) is True
        # The freed lock row keeps its fencing counter.
        assert (await backend.lock.acquire("l")).fencing_token == 2


async def test_far_future_times_do_not_overflow(kind: str) -> None:
    """Times past what a BIGINT holds mean "never", as they do for the memory model."""
    async with open_backend(kind) as backend:
        a = backend.adapter
        far = 10**20
        beyond = 2**63 + 5  # past BIGINT, still JSON (orjson writes up to 64-bit unsigned)
        cp = Checkpoint(stack_id="s", revision=1, timestamp=1, expires_at=beyond)
        await a.save_checkpoint(cp)
        assert await a.get_checkpoint("s") == cp
        await a.set_cached_step("c", 1, ttl_ms=far)
        assert await a.get_cached_step("c") == 1
        await a.save_wait_record(WaitRecord(correlation_key="k", stack_id="s", expires_at=beyond))
        record = await a.get_wait_record("k")
        assert record is not None
        assert record.expires_at == beyond
        assert backend.lock
        assert backend.nonces
        assert backend.idempotency
        assert (await backend.lock.acquire("l", far)).acquired
        assert await backend.nonces.claim("n", 1e17)
        assert await backend.idempotency.claim("i", far) == "claimed"
