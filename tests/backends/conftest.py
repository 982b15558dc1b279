"""Fixtures of the backend tests: each backend's specifics against its real server.

The shared Redis server's fixtures live here; SQL helpers are in
tests/support/sql_support.py, Redis helpers (servers of a test's own, clusters) in
tests/support/_redis_helpers.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis, start_cluster
from ports import free_ports

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


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """The URL of a 3-master loopback Redis Cluster of the module's own (started from the
    binaries on spare ports, stopped after the module)."""
    ports = free_ports(30200, 30300, 6)
    for _ in start_cluster(ports[:3], ports[3:]):
        yield f"redis://127.0.0.1:{ports[0]}/0?cluster=true"
