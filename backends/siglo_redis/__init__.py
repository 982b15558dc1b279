"""The Redis backend (seed 001): ``redis://``, ``rediss://`` and ``unix://`` URLs.

Keys and JSON are exactly those of the TypeScript ``@siglo/redis``, so workers in both
languages can share one Redis; where siglo is stricter (SPEC §4) it uses Lua scripts,
each touching keys of one cluster slot. See ``docs/backends/redis.md``.
"""

from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.connect import connect, isolated
from siglo_redis.coordination import RedisIdempotencyStore, RedisLock, RedisNonceStore

__all__ = [
    "RedisIdempotencyStore",
    "RedisLock",
    "RedisNonceStore",
    "RedisStorageAdapter",
    "connect",
    "isolated",
]
