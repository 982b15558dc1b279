"""A filtered listing at 10,000 stacks: the blind index (list_checkpoints_by_index) against
reading each stack the walk passes (siglo.blind.list_matching, what every backend did
before schema 7). Interleaved rounds; prints medians and ranges in milliseconds.

    python benchmarks/blind_index.py sqlite:///tmp/bi.db [postgresql://…] [--stacks 10000]

``--saves``: what the triggers of schema 7 cost a save instead — the same stack saved
again (1 KB and 256 KB documents, without and with tokens) on a store with the triggers
and on one without them (dropped), interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import time
from typing import Any

import siglo
from siglo.blind import list_matching
from siglo.checkpoint import Checkpoint
from siglo.config import Settings
from siglo.pipeline import Pipeline, PipelineAdapter, pipeline_parts


async def _walk(list_page: Any) -> int:
    count, cursor = 0, None
    while True:
        page = await list_page(cursor)
        count += len(page.items)
        if page.next_cursor is None:
            return count
        cursor = page.next_cursor


async def run(url: str, stacks: int, rounds: int) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    settings = Settings(encryption_keys={"k1": key}, blind_index_fields=frozenset({"customer"}))
    async with siglo.connect(url, settings=Settings(), checkpoint_ttl_ms=None) as backend:
        piped, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
        assert isinstance(piped, PipelineAdapter)
        saves = [
            piped.save_checkpoint(
                Checkpoint(
                    stack_id=f"s{i:05}",
                    namespace="bench",
                    revision=1,
                    timestamp=1,
                    contexts={"step": {"payload": "x" * 200}},
                    metadata={"customer": f"c{i % 1000}"},
                ),
                expected_revision=0,
            )
            for i in range(stacks)
        ]
        for n in range(0, len(saves), 200):
            await asyncio.gather(*saves[n : n + 200])
        wanted = {"customer": "c7"}
        codecs = piped.codecs

        async def indexed(cursor: str | None) -> Any:
            return await piped.list_checkpoints(metadata=wanted, namespace="bench", cursor=cursor)

        async def scanned(cursor: str | None) -> Any:
            return await list_matching(
                piped.inner,
                wanted,
                indexed=codecs.indexed,
                index_key=codecs.index_key,
                namespace="bench",
                cursor=cursor,
            )

        times: dict[str, list[float]] = {"index": [], "scan": []}
        for _ in range(rounds):
            for name, fn in (("index", indexed), ("scan", scanned)):
                start = time.perf_counter()
                found = await _walk(fn)
                times[name].append((time.perf_counter() - start) * 1000)
                assert found == stacks // 1000, found
        load = os.getloadavg()
        print(f"{backend.name}, {stacks} stacks, {rounds} interleaved rounds, load {load}")
        for name, ms in times.items():
            print(
                f"  {name}: median {statistics.median(ms):.2f} ms "
                f"(range {min(ms):.2f}–{max(ms):.2f})"
            )
        await backend.raw_adapter.clean_expired_checkpoints()


async def _create_triggers(adapter: Any) -> None:
    """A store with the token triggers before its first save with tokens (a store that
    has held one): what the triggers cost the saves without tokens of such a store."""
    from siglo_sql.migrations import ensure_token_triggers

    await adapter.database.open()
    await ensure_token_triggers(adapter.database, adapter.table_prefix, adapter.schema)
    adapter._token_triggers = True


async def _drop_triggers(adapter: Any) -> None:
    """A store without the token triggers, even after a save with tokens (which would
    create them): the cost of the triggers is the difference to a store with them."""
    adapter._token_triggers = True
    prefix, schema = adapter.table_prefix, adapter.schema
    table = f"{schema}.{prefix}checkpoints" if schema else f"{prefix}checkpoints"
    for name in ("added", "changed", "gone"):
        trigger = f"{prefix}checkpoint_tokens_{name}"
        on = f" ON {table}" if schema else ""
        await adapter.database.fetch(f"DROP TRIGGER IF EXISTS {trigger}{on}")


async def saves(url: str, rounds: int, per_round: int) -> None:
    from siglo.plugins import get_registry

    isolated = get_registry().for_url(url).load_isolated()
    assert isolated is not None
    async with (
        isolated(url, checkpoint_ttl_ms=None) as with_triggers,
        isolated(url, checkpoint_ttl_ms=None) as without,
    ):
        await _create_triggers(with_triggers.raw_adapter)
        await _drop_triggers(without.raw_adapter)
        stores = {"triggers": with_triggers.raw_adapter, "none": without.raw_adapter}
        revision = {name: 0 for name in stores}
        for size in (1_000, 256_000):
            for tokens in (False, True):
                metadata: dict[str, Any] = {"customer": "x"}
                if tokens:
                    metadata["$sigloIndex"] = {"customer": "AAAAAAAAAAAAAAAAAAAAAA=="}
                times: dict[str, list[float]] = {name: [] for name in stores}
                for _ in range(rounds):
                    for name, adapter in stores.items():
                        start = time.perf_counter()
                        for _ in range(per_round):
                            revision[name] += 1
                            await adapter.save_checkpoint(
                                Checkpoint(
                                    stack_id="s",
                                    revision=revision[name],
                                    timestamp=1,
                                    contexts={"step": {"v": "x" * size}},
                                    metadata=metadata,
                                )
                            )
                        times[name].append((time.perf_counter() - start) * 1e6 / per_round)
                load = os.getloadavg()
                print(f"{url.split(':')[0]} {size // 1000} KB, tokens={tokens}, load {load}")
                for name, us in times.items():
                    print(
                        f"  {name}: median {statistics.median(us):.0f} µs "
                        f"(range {min(us):.0f}–{max(us):.0f})"
                    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--stacks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--saves", action="store_true")
    args = parser.parse_args()
    for url in args.urls:
        if args.saves:
            asyncio.run(saves(url, args.rounds, 200))
        else:
            asyncio.run(run(url, args.stacks, args.rounds))


if __name__ == "__main__":
    main()
