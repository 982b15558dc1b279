"""Stores that several processes (and the CLI) share, on each durable backend, for the
tests of operating what is stored (SPEC §9)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sql_support import POSTGRES_URL, require_postgres

import siglo

DURABLE_KINDS = ("sqlite", "postgres", "redis")


@asynccontextmanager
async def shared_store(kind: str, **options: Any) -> AsyncIterator[siglo.Backend]:
    """A backend of ``kind`` on private storage that ``siglo.connect(backend.url)``
    reaches again from any process; removed afterwards."""
    if kind == "sqlite":
        from siglo_sqlite import isolated

        with tempfile.TemporaryDirectory(prefix="siglo-ops-") as directory:
            async with isolated(f"sqlite:///{directory}/ops.db", **options) as backend:
                yield backend
        return
    if kind == "postgres":
        require_postgres()
        from siglo_postgres import isolated as pg_isolated

        async with pg_isolated(POSTGRES_URL, **options) as backend:
            yield backend
        return
    if kind == "redis":
        from _redis_helpers import REDIS_URL, require_redis

        require_redis()
        from siglo_redis import isolated as redis_isolated

        async with redis_isolated(REDIS_URL, **options) as backend:
            yield backend
        return
    raise ValueError(kind)


def with_option(url: str, name: str, value: object) -> str:
    """``url`` with one more query option."""
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"
