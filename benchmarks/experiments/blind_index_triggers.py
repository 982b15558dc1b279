"""Measured for the blind index: what its schema-7 triggers cost the saves of a store
that has them (docs/encryption.md, "The index on each backend"): a store with the
triggers made before its first save beside one with them dropped (a store that never
held a token has none: they come with its first token).

    # SQLite, instructions: run under callgrind with 200 and 2,200 saves, subtract
    PYTHONHASHSEED=0 valgrind --tool=callgrind \\
        python -m benchmarks.experiments.blind_index_triggers sqlite triggers|none 0|1 200
    # PostgreSQL, the server's execution time of the UPDATE (EXPLAIN ANALYZE, interleaved)
    python -m benchmarks.experiments.blind_index_triggers postgres
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
from typing import Any

from benchmarks.blind_index import _create_triggers, _drop_triggers
from siglo.checkpoint import Checkpoint

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TOKEN = {"customer": "AAAAAAAAAAAAAAAAAAAAAA=="}


def _metadata(tokens: bool) -> dict[str, Any]:
    return {"customer": "x", **({"$sigloIndex": TOKEN} if tokens else {})}


async def sqlite_saves(mode: str, tokens: bool, saves: int) -> None:
    """``saves`` saves of a 1 KB checkpoint that changes each time."""
    from siglo_sqlite import isolated

    async with isolated("sqlite:////tmp/siglo-blind-index-triggers.db") as backend:
        adapter = backend.raw_adapter
        if mode == "none":
            await _drop_triggers(adapter)
        else:
            await _create_triggers(adapter)
        for revision in range(1, saves + 1):
            await adapter.save_checkpoint(
                Checkpoint(
                    stack_id="s",
                    revision=revision,
                    timestamp=1,
                    contexts={"step": {"v": "x" * 1_000, "r": revision}},
                    metadata=_metadata(tokens),
                )
            )


async def postgres_updates(rounds: int = 25) -> None:
    import psycopg

    from siglo_postgres import isolated

    async with (
        isolated(POSTGRES_URL, checkpoint_ttl_ms=None) as first,
        isolated(POSTGRES_URL, checkpoint_ttl_ms=None) as second,
    ):
        await _create_triggers(first.raw_adapter)
        await _drop_triggers(second.raw_adapter)
        stores: dict[str, Any] = {"triggers": first.raw_adapter, "none": second.raw_adapter}
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn:
            for size in (1_000, 256_000):
                for tokens in (False, True):
                    stack = f"s{size}{tokens}"
                    for adapter in stores.values():
                        await adapter.save_checkpoint(
                            Checkpoint(
                                stack_id=stack,
                                revision=1,
                                timestamp=1,
                                contexts={"step": {"v": "x" * size}},
                                metadata=_metadata(tokens),
                            )
                        )
                    document = Checkpoint(
                        stack_id=stack,
                        revision=2,
                        timestamp=1,
                        contexts={"step": {"v": "y" * size}},
                        metadata=_metadata(tokens),
                    ).to_json()
                    times: dict[str, list[float]] = {name: [] for name in stores}
                    for _ in range(rounds):
                        for name, adapter in stores.items():
                            async with conn.transaction(force_rollback=True):
                                cursor = await conn.execute(
                                    "EXPLAIN (ANALYZE, FORMAT TEXT) UPDATE "
                                    f"{adapter.schema}.siglo_checkpoints SET document = %s "
                                    "WHERE stack_id = %s",
                                    (document, stack),
                                )
                                plan = "\n".join(r[0] for r in await cursor.fetchall())
                                found = re.search(r"Execution Time: ([\d.]+)", plan)
                                assert found is not None, plan
                                times[name].append(float(found.group(1)) * 1000)
                    print(
                        f"{size // 1000} KB, tokens={tokens}: "
                        + "; ".join(
                            f"{name} median {statistics.median(us):.0f} µs "
                            f"(range {min(us):.0f}–{max(us):.0f})"
                            for name, us in times.items()
                        )
                    )


def main() -> None:
    if sys.argv[1] == "postgres":
        asyncio.run(postgres_updates())
    else:
        asyncio.run(sqlite_saves(sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])))


if __name__ == "__main__":
    main()
