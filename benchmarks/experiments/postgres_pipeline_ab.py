"""Measured the µs of a PostgreSQL write of several statements, pipelined and in a transaction.

``python -m benchmarks.experiments.postgres_pipeline_ab [ROUNDS]``: one siglo PostgreSQL
backend (its own schema, ``checkpoint_ttl_ms`` set) on ``$SIGLO_POSTGRES_URL``; each
round times 200 context changes (three statements each under a retention) and 200
checkpoint deletes (four statements each), once with ``Database.fetch_all`` as
PostgreSQL sends it (pipeline mode, one round trip) and once as the base class runs it
(``BEGIN``, each statement, ``COMMIT``), the order turning every round. Prints the
median (min–max) µs of each.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

from siglo import Checkpoint, ContextChangeEvent
from siglo_postgres import isolated
from siglo_postgres.database import PostgresDatabase
from siglo_sql.database import Database

OPS = 200
URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")


async def _round(adapter: Any) -> tuple[float, float]:
    """µs a context change and µs a delete, over :data:`OPS` stacks."""
    now = adapter.clock.now_ms()
    for i in range(OPS):
        await adapter.save_checkpoint(Checkpoint(stack_id=f"s{i}", revision=1, timestamp=now))
    t0 = time.perf_counter()
    for i in range(OPS):
        event = ContextChangeEvent(stack_id=f"s{i}", step_id="p", key="f", value=i, timestamp=now)
        await adapter.on_context_change(event)
    t1 = time.perf_counter()
    for i in range(OPS):
        await adapter.delete_checkpoint(f"s{i}")
    t2 = time.perf_counter()
    return (t1 - t0) / OPS * 1e6, (t2 - t1) / OPS * 1e6


async def main(rounds: int) -> None:
    async with isolated(URL, checkpoint_ttl_ms=3_600_000) as backend:
        adapter: Any = backend.adapter
        await adapter.open()
        db = adapter.database
        ways = {
            "pipelined": PostgresDatabase.fetch_all,
            "transaction": Database.fetch_all,
        }
        took: dict[tuple[str, str], list[float]] = {}
        for n in range(rounds):
            order = list(ways.items())
            for name, fetch_all in order if n % 2 == 0 else order[::-1]:
                db.fetch_all = fetch_all.__get__(db)
                change, delete = await _round(adapter)
                took.setdefault(("context change", name), []).append(change)
                took.setdefault(("delete", name), []).append(delete)
        for (what, name), values in took.items():
            print(
                f"{what}, {name}: {rounds} rounds of {OPS}, µs median "
                f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"
            )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
