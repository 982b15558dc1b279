"""PostgreSQL: a clean-up that meets a row written over while it runs leaves it.

A clean deletes (or frees, for locks) the rows its subquery found expired. Under READ
COMMITTED, a row written over after the statement's snapshot — a save over an expired
checkpoint, a new holder of an expired lock — is re-checked against the statement's
outer WHERE alone: with the expiry only in the subquery, the live row was deleted, and a
lock taken again was freed under its new holder (a black-box auditor: live checkpoints
and open waits lost, two holders of one lock, during `siglo clean`). Here the write
holds the row while the clean waits for it, then commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import psycopg
from sql_support import POSTGRES_URL, open_backend, require_postgres

from siglo import Checkpoint, ManualClock


def _table(adapter: Any, name: str) -> str:
    return f'"{adapter.schema}".{adapter.table_prefix}{name}'


async def _while_held(sql: str, params: dict[str, Any], clean: Awaitable[Any]) -> Any:
    """Run ``clean`` while another session's transaction holds what ``sql`` writes; let
    the clean wait for it, then commit."""
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as other:
        async with other.transaction():
            await other.execute(sql, params)
            task = asyncio.ensure_future(clean)
            await asyncio.sleep(0.3)
            assert not task.done()  # waiting for the row
        return await task


async def test_a_checkpoint_saved_over_while_a_clean_runs_stays() -> None:
    require_postgres()
    clock = ManualClock(1_000)
    async with open_backend("postgres", clock=clock) as backend:
        a: Any = backend.raw_adapter
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1, expires_at=1_500))
        clock.advance(1_000)  # expired, not cleaned yet
        saved_over = f"UPDATE {_table(a, 'checkpoints')} SET gone_at = NULL WHERE stack_id = 's'"
        assert await _while_held(saved_over, {}, a.clean_expired_checkpoints()) == 0
        assert await a.get_checkpoint("s") is not None


async def test_a_lock_taken_again_while_a_clean_runs_keeps_its_holder() -> None:
    require_postgres()
    clock = ManualClock(1_000)
    async with open_backend("postgres", clock=clock) as backend:
        a: Any = backend.raw_adapter
        lock = backend.require_lock()
        assert await lock.acquire("k", 500) is not None
        clock.advance(1_000)  # its lease lapsed, not freed yet
        taken = (
            f"UPDATE {_table(a, 'locks')} SET token = 'next-holder', gone_at = %(until)s "
            "WHERE key = 'k' AND scope = 'lock'"
        )
        freed = await _while_held(taken, {"until": 1_000_000}, a.clean_expired())
        assert freed["locks"] == 0
        rows = await a.database.fetch(
            f"SELECT token FROM {_table(a, 'locks')} WHERE key = 'k' AND scope = 'lock'"
        )
        assert [r[0] for r in rows] == ["next-holder"]
