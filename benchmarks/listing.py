"""``python -m benchmarks.listing``: the cost of listing checkpoints (SPEC §9).

Fills each durable backend with N checkpoints in ten namespaces (90 % completed, 9 %
running, 1 % failed) by its fastest bulk path — rows written exactly as a save writes
them, listing columns and Redis index included — then times the first page
(``limit=100``) of three walks: every namespace, one namespace, and every namespace
filtered on the rare status ``failed`` (a filter the walk checks row by row). Prints the
median of repeated calls, in milliseconds, as a Markdown table.

    python -m benchmarks.listing --stacks 1000 --stacks 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import siglo
from siglo import Checkpoint

NAMESPACES = 10
BATCH = 10_000
REPEAT = 21
POSTGRES_URL = "postgresql://127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


def _rows(n: int) -> Iterator[tuple[str, str, str, Checkpoint]]:
    for i in range(n):
        status = "failed" if i % 100 == 0 else ("running" if i % 10 == 1 else "completed")
        namespace = f"tenant-{i % NAMESPACES}"
        cp = Checkpoint(
            stack_id=f"run-{i:08}",
            namespace=namespace,
            workflow_id="orders",
            status=status,  # type: ignore[arg-type]
            revision=3,
            timestamp=1_700_000_000_000 + i,
            contexts={"reserve": {"output": {"order": i, "amount": 1200}}},
            metadata={"input": i},
        )
        yield namespace, cp.stack_id, status, cp


async def _fill_sql(backend: siglo.Backend, n: int) -> None:
    from siglo_sql.keys import row_id

    adapter: Any = backend.adapter
    await adapter.open()
    db = adapter.database
    from siglo_sql.schema import build_tables

    tables = build_tables(adapter.table_prefix, adapter.schema)
    table = db.sa_dialect.identifier_preparer.format_table(tables.checkpoints)
    columns = (
        "(id, namespace, stack_id, revision, status, gone_at, document, workflow_id, "
        "updated_at, expires_at)"
    )
    rows_per_statement = 500
    batch: list[Any] = []

    async def flush() -> None:
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * (len(batch) // 10))
        await db.fetch(db.sql(f"INSERT INTO {table} {columns} VALUES {values}"), batch)
        batch.clear()

    for namespace, stack_id, status, cp in _rows(n):
        batch += [row_id(namespace, stack_id), namespace, stack_id, 3, status, None,
                  cp.to_json(), "orders", cp.timestamp, None]  # fmt: skip
        if len(batch) == rows_per_statement * 10:
            await flush()
    if batch:
        await flush()


async def _fill_redis(backend: siglo.Backend, n: int) -> None:
    from siglo_redis.listing import member_of

    adapter: Any = backend.adapter
    client = adapter.client
    pipe = client.pipeline(transaction=False)
    for count, (namespace, stack_id, _, cp) in enumerate(_rows(n), start=1):
        key = adapter.keys.checkpoint(stack_id, namespace)
        pipe.set(key, cp.to_json())
        pipe.zadd(
            adapter._index.key(adapter._index.shard_of(key)), {member_of(stack_id, namespace): 0}
        )
        if count % BATCH == 0:
            await pipe.execute()
            pipe = client.pipeline(transaction=False)
    await pipe.execute()


@asynccontextmanager
async def _store(kind: str) -> AsyncIterator[siglo.Backend]:
    if kind == "sqlite":
        from siglo_sqlite import isolated

        with tempfile.TemporaryDirectory(prefix="siglo-listing-") as directory:
            async with isolated(f"sqlite:///{directory}/listing.db") as backend:
                yield backend
    elif kind == "postgres":
        from siglo_postgres import isolated as pg

        async with pg(POSTGRES_URL) as backend:
            yield backend
    else:
        from siglo_redis import isolated as rd

        async with rd(REDIS_URL, checkpoint_ttl_ms=None) as backend:
            yield backend


async def _median_ms(call: Callable[[], Any]) -> float:
    await call()  # warm
    times = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def measure(kind: str, n: int) -> dict[str, float]:
    async with _store(kind) as backend:
        start = time.perf_counter()
        await (_fill_redis if kind == "redis" else _fill_sql)(backend, n)
        fill_s = time.perf_counter() - start
        a = backend.adapter
        out = {"fill_s": fill_s}
        out["all"] = await _median_ms(lambda: a.list_checkpoints(limit=100))
        out["namespace"] = await _median_ms(
            lambda: a.list_checkpoints(namespace="tenant-3", limit=100)
        )
        out["failed"] = await _median_ms(lambda: a.list_checkpoints(status="failed", limit=100))
        page = await a.list_checkpoints(limit=100)
        assert len(page.items) == 100
        assert page.next_cursor is not None
        return out


async def main(sizes: list[int], kinds: list[str]) -> None:
    print(f"run {uuid.uuid4().hex[:6]}: first page (limit=100), median of {REPEAT}, ms")
    print("| backend | stacks | every namespace | one namespace | status=failed (1 %) | fill |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in kinds:
        for n in sizes:
            r = await measure(kind, n)
            print(
                f"| {kind} | {n:,} | {r['all']:.2f} | {r['namespace']:.2f} | "
                f"{r['failed']:.2f} | {r['fill_s']:.0f} s |",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stacks", type=int, action="append", default=None)
    parser.add_argument("--backend", action="append", default=None)
    args = parser.parse_args()
    asyncio.run(
        main(args.stacks or [1_000, 1_000_000], args.backend or ["sqlite", "postgres", "redis"])
    )
