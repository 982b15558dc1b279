"""The raw redis-py (+hiredis) baseline: the fewest round trips the contract needs.

Equivalence, per operation (see docs/benchmarks.md):

* save: one ``EVALSHA`` of a compare-and-set script that reads the stored revision (not
  the document), compares, and writes revision + document with ``PEXPIREAT``/``PERSIST``.
  A plain ``SET`` cannot refuse a backwards revision, which the contract requires.
* load: one ``HGET`` of the document, decoded with orjson.
* wait claim: one ``EVALSHA`` that checks status/lease/deadline and writes the claim.
* idempotency: ``SET NX PX`` then ``SET PX`` of ``COMPLETED:<json>`` (seed 001 §6).
* lock: redis-py's own :class:`redis.asyncio.lock.Lock` (``SET NX PX`` + Lua release).
* step cache: ``SET PX`` then ``GET`` + orjson.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable
from typing import Any, cast

import orjson
from redis.asyncio import Redis

from benchmarks.payloads import now_ms, wire_document
from benchmarks.subject import Conflict, Subject

_SAVE = """
local cur = redis.call('HGET', KEYS[1], 'r')
if cur then cur = tonumber(cur) else cur = -1 end
if ARGV[3] ~= '' then
  local expected = tonumber(ARGV[3])
  if (cur < 0 and expected ~= 0) or (cur >= 0 and cur ~= expected) then return cur end
elseif cur >= 0 and tonumber(ARGV[1]) <= cur then
  return cur
end
redis.call('HSET', KEYS[1], 'r', ARGV[1], 'd', ARGV[2])
if ARGV[4] ~= '' then redis.call('PEXPIREAT', KEYS[1], ARGV[4])
else redis.call('PERSIST', KEYS[1]) end
return -2
"""

_CLAIM = """
local s = redis.call('HMGET', KEYS[1], 's', 'l', 'x', 'd')
if not s[1] then return false end
local now = tonumber(ARGV[1])
if s[1] == 'claimed' then
  if tonumber(s[2]) > now then return false end
elseif s[1] ~= 'waiting' then return false end
if s[3] and tonumber(s[3]) <= now then return false end
redis.call('HSET', KEYS[1], 's', 'claimed', 'c', ARGV[2], 'l', ARGV[3], 'p', ARGV[4])
return s[4]
"""


class RawRedisSubject(Subject):
    """redis-py with hiredis, one client (its connection pool) per subject."""

    kind = "raw"
    backend = "redis"

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"siglo-bench:{secrets.token_hex(4)}:"
        self.detail = "redis-py asyncio + hiredis; EVALSHA CAS, HGET"
        self.r: Redis | None = None

    async def open(self) -> None:
        self.r = Redis.from_url(self.url)
        self._save = self.r.register_script(_SAVE)
        self._claim = self.r.register_script(_CLAIM)
        await cast(Awaitable[bool], self.r.ping())

    async def server_version(self) -> str | None:
        assert self.r is not None
        info = await self.r.info("server")
        return f"Redis {info.get('redis_version')}"

    async def close(self) -> None:
        assert self.r is not None
        batch: list[bytes] = []
        async for key in self.r.scan_iter(match=self.prefix + "*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await self.r.unlink(*batch)
                batch.clear()
        if batch:
            await self.r.unlink(*batch)
        await self.r.aclose()

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        data = orjson.dumps(wire_document(stack_id, revision, contexts, expires_at=expires_at))
        result = await self._save(
            keys=[self.prefix + "cp:" + stack_id],
            args=[
                revision,
                data,
                "" if expected_revision is None else expected_revision,
                "" if expires_at is None else expires_at,
            ],
        )
        if result != -2:
            raise Conflict

    async def load(self, stack_id: str) -> int | None:
        assert self.r is not None
        data = await cast(Awaitable[bytes | None], self.r.hget(self.prefix + "cp:" + stack_id, "d"))
        if data is None:
            return None
        revision: int = orjson.loads(data)["revision"]
        return revision

    async def clean_expired(self) -> int:
        return 0  # native expiry (PEXPIREAT), as the contract allows

    async def put_wait(self, key: str, stack_id: str) -> None:
        assert self.r is not None
        doc = {
            "correlationKey": key,
            "stackId": stack_id,
            "status": "waiting",
            "createdAt": now_ms(),
        }
        await cast(
            Awaitable[int],
            self.r.hset(
                self.prefix + "wait:" + key, mapping={"s": "waiting", "d": orjson.dumps(doc)}
            ),
        )

    async def claim_wait(self, key: str, claimant: str) -> bool:
        now = now_ms()
        doc = await self._claim(
            keys=[self.prefix + "wait:" + key],
            args=[now, claimant, now + 60_000, orjson.dumps({"approved": True})],
        )
        if doc is None:
            return False
        orjson.loads(doc)
        return True

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        assert self.r is not None
        k = self.prefix + "idem:" + key
        assert await self.r.set(k, "in-progress", nx=True, px=86_400_000)
        await self.r.set(k, b"COMPLETED:" + orjson.dumps(result), px=86_400_000)

    async def lock_pair(self, key: str) -> None:
        assert self.r is not None
        lock = self.r.lock(self.prefix + "lock:" + key, timeout=10.0, blocking=False)
        assert await lock.acquire()
        await lock.release()

    async def cache_set_get(self, key: str, value: Any) -> None:
        assert self.r is not None
        k = self.prefix + "cache:" + key
        await self.r.set(k, orjson.dumps(value), px=300_000)
        data = await self.r.get(k)
        assert data is not None
        orjson.loads(data)
