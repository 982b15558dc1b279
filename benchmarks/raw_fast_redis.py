"""The raw-fast Redis baseline: redis-py (+hiredis) with auto-pipelining.

What a competent user writes in about forty lines: callers do not send their commands
themselves but enqueue them; one flusher task, started when the first command of a loop
tick is queued, sends everything queued by the time the loop comes round as one pipeline
(no ``MULTI``), one pipeline in flight at a time, and hands each caller its reply.
Commands queued while a pipeline is in flight go in the next one. The same documents and
the same single compare-and-set script as :mod:`benchmarks.raw_redis`, sent as
``EVALSHA`` (loaded once at open).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from benchmarks.payloads import now_ms, wire_document
from benchmarks.raw_redis import _CLAIM, _SAVE
from benchmarks.subject import Conflict, Subject

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class AutoPipeline:
    """Coalesce concurrent callers' commands into one pipeline per event-loop tick."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.pipelines = 0
        """Pipelines sent (commands per pipeline = commands / pipelines)."""
        self.commands = 0

    def call(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command; the future is its reply (or its error)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((args, future))
        if self._flusher is None:
            # Runs when the loop comes round: every caller of this tick has queued by then.
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                pipe = self.client.pipeline(transaction=False)
                for args, _ in batch:
                    pipe.execute_command(*args)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                except Exception as exc:  # the connection failed: every caller learns it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.pipelines += 1
                self.commands += len(batch)
                for (_, future), reply in zip(batch, replies, strict=True):
                    if future.done():
                        continue
                    if isinstance(reply, Exception):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        finally:
            self._flusher = None


class RawFastRedisSubject(Subject):
    """redis-py + hiredis behind :class:`AutoPipeline`."""

    kind = "raw-fast"
    backend = "redis"

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"siglo-bench:{secrets.token_hex(4)}:"
        self.detail = (
            "redis-py asyncio + hiredis, auto-pipelined (one pipeline per loop tick); "
            "EVALSHA CAS, HGET"
        )
        self.r: Redis | None = None

    async def open(self) -> None:
        self.r = Redis.from_url(self.url)
        self.pipe = AutoPipeline(self.r)
        self._scripts = {
            src: str(await cast(Awaitable[str], self.r.script_load(src)))
            for src in (_SAVE, _CLAIM, _RELEASE)
        }

    async def server_version(self) -> str | None:
        assert self.r is not None
        info = await self.r.info("server")
        return f"Redis {info.get('redis_version')}"

    async def close(self) -> None:
        assert self.r is not None
        keys = [k async for k in self.r.scan_iter(match=self.prefix + "*", count=1000)]
        for i in range(0, len(keys), 1000):
            await self.r.unlink(*keys[i : i + 1000])
        await self.r.aclose()

    async def _script(self, src: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self.pipe.call("EVALSHA", self._scripts[src], len(keys), *keys, *args)
        except NoScriptError:  # the server's script cache was flushed: send it whole
            return await self.pipe.call("EVAL", src, len(keys), *keys, *args)

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
        result = await self._script(
            _SAVE,
            [self.prefix + "cp:" + stack_id],
            [
                revision,
                data,
                "" if expected_revision is None else expected_revision,
                "" if expires_at is None else expires_at,
            ],
        )
        if result != -2:
            raise Conflict

    async def load(self, stack_id: str) -> int | None:
        data = await self.pipe.call("HGET", self.prefix + "cp:" + stack_id, "d")
        if data is None:
            return None
        revision: int = orjson.loads(data)["revision"]
        return revision

    async def clean_expired(self) -> int:
        return 0  # native expiry (PEXPIREAT), as the contract allows

    async def put_wait(self, key: str, stack_id: str) -> None:
        doc = {"correlationKey": key, "stackId": stack_id, "status": "waiting"}
        data = orjson.dumps({**doc, "createdAt": now_ms()})
        await self.pipe.call("HSET", self.prefix + "wait:" + key, "s", "waiting", "d", data)

    async def claim_wait(self, key: str, claimant: str) -> bool:
        now = now_ms()
        doc = await self._script(
            _CLAIM,
            [self.prefix + "wait:" + key],
            [now, claimant, now + 60_000, orjson.dumps({"approved": True})],
        )
        if doc is None:
            return False
        orjson.loads(doc)
        return True

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        k = self.prefix + "idem:" + key
        assert await self.pipe.call("SET", k, "in-progress", "NX", "PX", 86_400_000)
        await self.pipe.call("SET", k, b"COMPLETED:" + orjson.dumps(result), "PX", 86_400_000)

    async def lock_pair(self, key: str) -> None:
        k = self.prefix + "lock:" + key
        token = secrets.token_hex(16)
        assert await self.pipe.call("SET", k, token, "NX", "PX", 10_000)
        assert await self._script(_RELEASE, [k], [token]) == 1

    async def cache_set_get(self, key: str, value: Any) -> None:
        k = self.prefix + "cache:" + key
        await self.pipe.call("SET", k, orjson.dumps(value), "PX", 300_000)
        data = await self.pipe.call("GET", k)
        assert data is not None
        orjson.loads(data)
