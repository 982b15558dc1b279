"""The Redis commands siglo sends, with one error policy and one timeout.

Any client with the async methods of seed 001 §4 works: ``redis.asyncio.Redis``,
``redis.asyncio.RedisCluster``, valkey's client, or anything shaped like them. Every
call is bounded by ``command_timeout_ms`` (a stalled server never hangs the caller) and
every driver exception is re-raised as :class:`~siglo.errors.StorageAdapterError` with
the original as ``__cause__``: :class:`~siglo.errors.OutcomeUnknownError` for a call
whose reply did not arrive in time (a script may have run), for a write whose
connection failed after it was sent (:mod:`siglo_redis.sent_once`), and for a write that
fewer replicas than ``wait_replicas`` confirmed.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from siglo.errors import (
    MalformedRecordError,
    OutcomeUnknownError,
    SigloError,
    StorageAdapterError,
    past_its_bound,
)
from siglo.validation import ms_as_seconds
from siglo_redis.deadlines import Deadlines
from siglo_redis.scripts import Script

__all__ = [
    "MAX_PX_MS",
    "Commands",
    "RedisClientInterface",
    "clamp_px",
    "sha1",
    "text",
]

MAX_PX_MS: Final = 2**53
"""The longest TTL sent to Redis (~285,000 years): its clock plus a longer ``PX`` would
overflow, and every expiry written into a document is still checked when read."""


def clamp_px(ms: int) -> int:
    """``ms`` capped at :data:`MAX_PX_MS`."""
    return min(ms, MAX_PX_MS)


@runtime_checkable
class RedisClientInterface(Protocol):
    """The client methods seed 001 §4 requires (``hgetall``, ``expire``, ``pexpire`` and
    ``eval`` are optional there). siglo's atomic operations need ``eval``/``evalsha``."""

    async def get(self, key: str) -> Any: ...
    async def set(self, key: str, value: Any, *args: Any, **kwargs: Any) -> Any: ...
    async def delete(self, *keys: str) -> Any: ...
    async def hset(self, key: str, *args: Any, **kwargs: Any) -> Any: ...


def text(value: Any) -> str | None:
    """A reply as ``str`` (clients differ in ``decode_responses``)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode()
    return str(value)


def raw(value: Any) -> bytes | None:
    """A reply as ``bytes``."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def sha1(value: bytes | None) -> str:
    """What ``redis.sha1hex`` says of a value; ``''`` stands for "absent"."""
    return "" if value is None else hashlib.sha1(value).hexdigest()


def _is_noscript(exc: BaseException) -> bool:
    return type(exc).__name__ == "NoScriptError" or str(exc).startswith("NOSCRIPT")


class Commands:
    """A client plus the policy every siglo Redis class applies to it."""

    def __init__(self, client: Any, *, command_timeout_ms: int | None) -> None:
        self.client = client
        self.timeout_s = None if command_timeout_ms is None else ms_as_seconds(command_timeout_ms)
        self._deadlines = Deadlines(self.timeout_s)
        evalsha = getattr(client, "evalsha", None)
        self._evalsha = evalsha if callable(evalsha) else None
        self.has_eval = callable(getattr(client, "eval", None))
        """Whether the client can run Lua (seed 001 §4: ``eval`` is optional)."""

    async def call(self, what: str, awaitable: Awaitable[Any]) -> Any:
        """Await one client call under the timeout, wrapping any driver failure."""
        try:
            return await self._deadlines.run(awaitable)
        except SigloError:
            raise
        except Exception as exc:
            raise self._failure(what, exc) from exc

    def _failure(self, what: str, exc: Exception) -> SigloError:
        """The siglo error a driver failure of ``what`` is raised as."""
        if isinstance(exc, TimeoutError):
            # The command may have been written and run: only its reply is missing.
            return past_its_bound(
                OutcomeUnknownError(
                    f"redis {what}",
                    f"timed out after {self.timeout_s} s (command_timeout_ms): no reply, "
                    "and the server may have run it",
                )
            )
        if getattr(exc, "outcome_unknown", False):
            # A write sent and unanswered (siglo_redis.sent_once), or written on the
            # master and not confirmed by replicas (siglo_redis.replication).
            return OutcomeUnknownError(f"redis {what}", str(exc))
        if str(exc).startswith("SIGLO_MALFORMED"):
            return MalformedRecordError("checkpoint", "revision", str(exc)[16:])
        return StorageAdapterError(f"redis {what} failed: {type(exc).__name__}: {exc}")

    async def get(self, key: str) -> bytes | None:
        return raw(await self.call("GET", self.client.get(key)))

    async def set(
        self, key: str, value: bytes | str, *, px: int | None = None, nx: bool = False
    ) -> bool:
        kwargs: dict[str, Any] = {}
        if px is not None:
            kwargs["px"] = clamp_px(px)
        if nx:
            kwargs["nx"] = True
        return bool(await self.call("SET", self.client.set(key, value, **kwargs)))

    async def delete(self, *keys: str) -> int:
        return int(await self.call("DEL", self.client.delete(*keys)) or 0)

    async def script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run ``script`` by SHA, sending its source again after a ``NOSCRIPT``: one call,
        under one ``command_timeout_ms`` for both round trips."""
        if not self.has_eval:
            raise StorageAdapterError(
                f"the redis client {type(self.client).__name__} has no eval(): siglo's "
                f"{script.name} must run as a Lua script to be atomic"
            )
        argv = [a if type(a) is bytes or type(a) is str else str(a) for a in args]
        evalsha = self._evalsha
        began = time.monotonic()
        if evalsha is not None:
            try:
                return await self._deadlines.run(evalsha(script.sha, len(keys), *keys, *argv))
            except SigloError:
                raise
            except Exception as exc:
                if not _is_noscript(exc):
                    raise self._failure(script.name, exc) from exc
        # EVAL also caches the script, so the next EVALSHA finds it. It gets what is left
        # of the bound: a server that lost its scripts (a replica just promoted; with
        # WAIT, the NOSCRIPT's round trip waits for the replicas too) made a storage call
        # of 4 s under a 3 s command_timeout_ms when the EVAL had a bound of its own.
        sent = self.client.eval(script.source, len(keys), *keys, *argv)
        if self.timeout_s is None:
            return await self.call(script.name, sent)
        left = self.timeout_s - (time.monotonic() - began)
        return await self.call(script.name, _within(left, sent))


async def _within(seconds: float, awaitable: Awaitable[Any]) -> Any:
    async with asyncio.timeout(max(seconds, 0.0)):
        return await awaitable
