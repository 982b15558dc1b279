"""Offloaded values in Redis (``blob_url = "redis://…?prefix=app:"``): one string key a
blob, ``<prefix>blob:<sha256>``, and their keep-until times in one sorted set,
``<prefix>blobs`` (SPEC §13, :mod:`siglo.blobs`).

Every change is one Lua script, so a put that refreshes a blob and the collector's
removal of it never interleave: a blob is removed only if its keep-until is still stale
when the script runs. A put of a blob already stored sends no bytes: it refreshes the
keep-until and says so, and only a put that finds no blob sends the value. A change
whose connection fails after it was sent raises :class:`~siglo.errors.OutcomeUnknownError`
and is not sent again (:mod:`siglo_redis.sent_once`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

import redis.asyncio as aioredis

from siglo import urls
from siglo.blobs import BlobStore, check_digest
from siglo.errors import OutcomeUnknownError, StorageAdapterError
from siglo_redis.client import _driver_parameters, check_driver_numbers, split_url
from siglo_redis.sent_once import SentOnceRedis

__all__ = ["RedisBlobStore", "open_store"]

# KEYS: blob key, keep-until set; ARGV: digest, keep-until (ms). 1 if refreshed, 0 if absent.
_REFRESH: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local kept = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
if kept < tonumber(ARGV[2]) then redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1]) end
return 1
"""
# KEYS: blob key, keep-until set; ARGV: digest, keep-until (ms), bytes.
_PUT: Final = """
redis.call('SET', KEYS[1], ARGV[3], 'NX')
local kept = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
if kept < tonumber(ARGV[2]) then redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1]) end
return 1
"""
# KEYS: blob key, keep-until set; ARGV: digest, kept-before (ms). 1 if removed.
_DELETE_STALE: Final = """
local kept = redis.call('ZSCORE', KEYS[2], ARGV[1])
if kept and tonumber(kept) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
"""


class RedisBlobStore(BlobStore):
    """Blobs under ``prefix`` in the Redis at ``url`` (see the module)."""

    def __init__(self, client: Any, prefix: str, url: str) -> None:
        self._client = client
        self.prefix = prefix
        self.url = url
        self._set = f"{prefix}blobs"
        self._refresh = client.register_script(_REFRESH)
        self._put = client.register_script(_PUT)
        self._delete_stale = client.register_script(_DELETE_STALE)

    def _key(self, digest: str) -> str:
        return f"{self.prefix}blob:{check_digest(digest)}"

    async def _call(self, doing: str, awaitable: Any) -> Any:
        try:
            return await awaitable
        except (aioredis.RedisError, OSError) as exc:
            if getattr(exc, "outcome_unknown", False):  # a change sent and unanswered
                raise OutcomeUnknownError(f"blob store {self.url}: {doing}", str(exc)) from exc
            raise StorageAdapterError(f"blob store {self.url}: {doing} failed: {exc!r}") from exc

    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        keep = max(int(time.time() * 1000), keep_until_ms or 0)
        keys = [self._key(digest), self._set]
        if not await self._call("a put", self._refresh(keys=keys, args=[digest, keep])):
            await self._call("a put", self._put(keys=keys, args=[digest, keep, data]))

    async def get(self, digest: str) -> bytes | None:
        found = await self._call("a get", self._client.get(self._key(digest)))
        return None if found is None else bytes(found)

    async def delete(self, digest: str) -> bool:
        removed = await self._call("a delete", self._client.delete(self._key(digest)))
        await self._call("a delete", self._client.zrem(self._set, digest))
        return bool(removed)

    async def delete_stale(self, digest: str, kept_before_ms: int) -> bool:
        keys = [self._key(digest), self._set]
        args = [digest, kept_before_ms]
        return bool(await self._call("a removal", self._delete_stale(keys=keys, args=args)))

    async def scan(self) -> AsyncIterator[tuple[str, int]]:
        cursor = 0
        while True:
            cursor, page = await self._call(
                "a scan", self._client.zscan(self._set, cursor=cursor, count=500)
            )
            for member, score in page:
                digest = member.decode() if isinstance(member, bytes) else str(member)
                yield digest, int(score)
            if int(cursor) == 0:
                return

    async def aclose(self) -> None:
        await self._client.aclose()


def open_store(url: str) -> RedisBlobStore:
    """The store at ``redis://host:port/db?prefix=P`` (prefix default ``siglo:``); the
    other query parameters are redis-py's (``client_name``, ``socket_timeout`` …), and
    any other name is refused, as in a backend URL."""
    urls.refuse_unknown(
        url,
        BLOB_OPTIONS,
        backend="redis blob store",
        driver=_driver_parameters(),
        also="and redis-py's connection parameters (db, socket_timeout, client_name, …)",
    )
    # The URL's database read as a backend URL's is (a path that is not a number, or a
    # path and a `db` that differ, refused): redis-py took `/app` for database 0, and
    # `/11?db=12` for 12, silently (a black-box auditor).
    split_url(url)
    base, options = urls.split_options(url, BLOB_OPTIONS)
    check_driver_numbers(dict(parse_qsl(urlsplit(base).query)), url)
    # A change whose reply is lost is not sent again (siglo_redis.sent_once): a removal
    # sent twice would say "nothing removed" of the blob it removed.
    client = SentOnceRedis.from_url(base)
    return RedisBlobStore(client, options.get("prefix", "siglo:"), url)


BLOB_OPTIONS: Final[dict[str, urls.Converter]] = {"prefix": urls.text}
"""The blob store's own options; the rest of the query goes to redis-py."""
