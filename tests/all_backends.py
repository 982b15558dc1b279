"""Every built-in backend on private storage, for tests that must hold on all of them.

``open_any(kind)`` yields a backend of ``kind`` (``memory``, ``sqlite``, ``postgres``,
``redis``) on storage of its own (a fresh in-memory store, temporary file, schema or key
prefix), removed afterwards; PostgreSQL and Redis are skipped with a plain message when
unreachable (failed under ``CI=true``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import siglo

KINDS = ("memory", "sqlite", "postgres", "redis")


@asynccontextmanager
async def open_any(kind: str, **options: Any) -> AsyncIterator[siglo.Backend]:
    """A backend of ``kind`` on private storage, removed afterwards."""
    if kind == "memory":
        backend = siglo.connect("memory://", **options)
        try:
            yield backend
        finally:
            await backend.aclose()
        return
    if kind == "sqlite":
        from siglo_sqlite import isolated as sqlite_isolated

        async with sqlite_isolated("sqlite:///siglo-test.db", **options) as backend:
            yield backend
        return
    if kind == "postgres":
        from sql_support import POSTGRES_URL, require_postgres

        from siglo_postgres import isolated as postgres_isolated

        require_postgres()
        async with postgres_isolated(POSTGRES_URL, **options) as backend:
            yield backend
        return
    if kind == "redis":
        from _redis_helpers import REDIS_URL, require_redis

        from siglo_redis import isolated as redis_isolated

        require_redis()
        async with redis_isolated(REDIS_URL, **options) as backend:
            yield backend
        return
    raise ValueError(f"no backend kind {kind!r}")
