"""Fixtures of the backend tests: each backend's specifics against its real server.

The shared Redis server's fixtures live here; SQL helpers are in
tests/support/sql_support.py, Redis helpers (servers of a test's own, clusters) in
tests/support/_redis_helpers.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo_redis import isolated


@pytest.fixture
async def redis_backend() -> AsyncIterator[siglo.Backend]:
    """A Redis backend on the shared server under a fresh prefix, removed afterwards."""
    require_redis()
    async with isolated(REDIS_URL) as backend:
        yield backend


@pytest.fixture
async def raw_redis() -> AsyncIterator[Any]:
    """A plain redis-py client (str replies) on the shared server."""
    require_redis()
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()
