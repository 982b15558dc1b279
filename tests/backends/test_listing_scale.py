"""Listing many checkpoints while writers run, on SQLite, PostgreSQL and Redis: a walk
returns every stack that lived through it exactly once (SPEC §9, rule list.concurrent).

5,000 stacks by default; ``SIGLO_TEST_LISTING_STACKS=100000`` for the long run.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from ops_support import DURABLE_KINDS, shared_store

from siglo import Checkpoint

STACKS = int(os.environ.get("SIGLO_TEST_LISTING_STACKS", "5000"))
PAGE = 500


@pytest.mark.parametrize("kind", DURABLE_KINDS)
@pytest.mark.rule("list.concurrent", "list.walk")
@pytest.mark.timeout(max(300, STACKS // 100))
async def test_a_walk_under_writers_lists_each_stack_once(kind: str) -> None:
    async with shared_store(kind) as backend:
        a = backend.adapter
        names = [f"stack-{i:07}" for i in range(STACKS)]
        revisions = dict.fromkeys(names, 1)
        sem = asyncio.Semaphore(32)

        async def save(name: str, revision: int, namespace: str | None = None) -> None:
            async with sem:
                await a.save_checkpoint(
                    Checkpoint(
                        stack_id=name, revision=revision, timestamp=revision, namespace=namespace
                    )
                )

        await asyncio.gather(*(save(n, 1, "tenant") for n in names))
        rng = random.Random(3)
        doomed = set(rng.sample(names, min(200, STACKS // 10)))
        deleted: set[str] = set()
        stop = asyncio.Event()

        async def writer(seed: int) -> int:
            own = random.Random(seed)
            writes = 0
            while not stop.is_set():
                name = own.choice(names)
                if name in doomed and name not in deleted:
                    deleted.add(name)
                    await a.delete_checkpoint(name, "tenant")
                elif name not in deleted:
                    revisions[name] += 1
                    await save(name, revisions[name], "tenant")
                await save(f"new-{seed}-{writes:07}", 1, "tenant")
                writes += 1
                await asyncio.sleep(0)
            return writes

        writers = [asyncio.create_task(writer(s)) for s in range(2)]
        seen: list[str] = []
        cursor = None
        try:
            while True:
                page = await a.list_checkpoints(namespace="tenant", limit=PAGE, cursor=cursor)
                seen.extend(s.stack_id for s in page.items)
                if (cursor := page.next_cursor) is None:
                    break
        finally:
            stop.set()
            writes = sum(await asyncio.gather(*writers))
        assert writes > 0
        counts: dict[str, int] = {}
        for name in seen:
            counts[name] = counts.get(name, 0) + 1
        twice = [n for n, c in counts.items() if c > 1]
        assert not twice, f"{len(twice)} stacks listed twice, e.g. {twice[:5]}"
        survivors = set(names) - doomed
        missing = survivors - counts.keys()
        assert not missing, f"{len(missing)} stacks never listed, e.g. {sorted(missing)[:5]}"
