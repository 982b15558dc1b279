"""Real concurrent callers: several tasks on several connections, and several processes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from siglo.backend import Backend
from siglo_contract.registry import CheckContext
from siglo_contract.target import PROCESSES

__all__ = ["PROCESSES", "TASKS", "contenders", "in_processes"]

TASKS = 8
"""How many tasks race in the in-process concurrency checks."""


@contextlib.asynccontextmanager
async def contenders(ctx: CheckContext, n: int = TASKS) -> AsyncIterator[list[Backend]]:
    """``n`` backends on the check's storage: separate connections when the storage is
    reachable by URL (so the race goes through the server), else the same object."""
    if ctx.session.shared_url is None:
        yield [ctx.backend] * n
        return
    extra = [ctx.session.open_backend() for _ in range(n - 1)]
    try:
        yield [ctx.backend, *extra]
    finally:
        for backend in extra:
            await backend.aclose()


def shares_across_processes(ctx: CheckContext) -> bool:
    """Whether the backend's storage is shared by processes connecting to its URL."""
    return ctx.session.target.multiprocess and ctx.session.shared_url is not None


async def in_processes(ctx: CheckContext, kind: str, args: list[dict[str, Any]]) -> list[Any]:
    """Run one ``kind`` of call in worker processes at the same moment; their results."""
    url = ctx.session.shared_url
    assert url is not None
    options = dict(ctx.session.target.options)
    for a in args:
        a.setdefault("now_ms", ctx.now_ms())
    if ctx.session.clock is not None:
        options["manual_clock_ms"] = ctx.now_ms()
    workers = await ctx.session.worker_processes()
    if not ctx.session.workers_warm:
        # The first calls pay for starting and importing: give them time to be ready.
        start_at = time.time() + 3.0
        ctx.session.workers_warm = True
    else:
        start_at = time.time() + 0.3
    requests = [
        {"kind": kind, "url": url, "options": options, "start_at": start_at, "args": a}
        for a in args
    ]
    return await workers.run(requests)


__all__ += ["shares_across_processes"]
