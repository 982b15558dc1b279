"""Measured concurrent single-row writes on PostgreSQL: a connection each, a pipeline with a
Sync after each, a pipeline with one Sync.

``python -m benchmarks.experiments.postgres_write_sync_ab [ROUNDS]``: on
``$SIGLO_POSTGRES_URL``, in a schema of its own, 32 callers each upsert a 1 KB row 150
times (``INSERT … ON CONFLICT DO UPDATE … WHERE revision < new RETURNING``), three ways,
interleaved each round: **pool**, a pooled connection (10) per write, as siglo wrote
before group commit; **sync each**, the writes asked in one turn of the loop sent on one
connection in pipeline mode with a Sync after each (each its own implicit transaction,
so each its own commit and WAL flush); **one sync**, the same with one Sync for the turn
(one transaction: what ``PostgresDatabase.write`` sends). Prints writes a second per way,
median (min–max) of the rounds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")
SCHEMA = "siglo_write_sync_ab"
CALLERS = 32
WRITES = 150
DOC = b"x" * 1024
UPSERT = (
    f"INSERT INTO {SCHEMA}.t (id, rev, doc) VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
    f"SET rev = excluded.rev, doc = excluded.doc WHERE {SCHEMA}.t.rev < excluded.rev RETURNING 1"
)


class _Together:
    """The writes asked in one turn of the loop, sent in one pipeline on one connection."""

    def __init__(self, pool: AsyncConnectionPool[Any], sync_each: bool) -> None:
        self.pool = pool
        self.sync_each = sync_each
        self.queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def write(self, params: tuple[Any, ...]) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.queue.append((params, future))
        if len(self.queue) == 1:
            task = asyncio.ensure_future(self._send())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return await future

    async def _send(self) -> None:
        batch, self.queue = self.queue, []
        async with self.pool.connection() as conn:
            async with conn.pipeline() as pipeline:
                cursors = []
                for params, _ in batch:
                    cursors.append(await conn.execute(UPSERT, params, binary=True))
                    if self.sync_each:
                        await pipeline.sync()
            for (_, future), cursor in zip(batch, cursors, strict=True):
                future.set_result(await cursor.fetchall())


async def _timed(write: Any, tag: str) -> float:
    async def caller(n: int) -> None:
        for j in range(WRITES):
            await write((f"{tag}-{n}", j + 1, DOC))

    started = time.perf_counter()
    await asyncio.gather(*(caller(n) for n in range(CALLERS)))
    return CALLERS * WRITES / (time.perf_counter() - started)


async def main(rounds: int = 5) -> None:
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.execute(f"CREATE SCHEMA {SCHEMA}")
        await conn.execute(f"CREATE TABLE {SCHEMA}.t (id text PRIMARY KEY, rev int, doc bytea)")
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        URL, min_size=10, max_size=10, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)

    async def pooled(params: tuple[Any, ...]) -> Any:
        async with pool.connection() as conn:
            return await (await conn.execute(UPSERT, params, binary=True)).fetchall()

    ways: dict[str, Any] = {
        "pool": pooled,
        "sync each": _Together(pool, True).write,
        "one sync": _Together(pool, False).write,
    }
    speeds: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for r in range(rounds):
            for name, write in ways.items():
                speeds[name].append(await _timed(write, f"{name}-{r}"))
    finally:
        await pool.close()
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    for name, values in speeds.items():
        print(
            f"{name}: {statistics.median(values):,.0f} writes/s "
            f"({min(values):,.0f}–{max(values):,.0f}), {CALLERS} callers"
        )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
