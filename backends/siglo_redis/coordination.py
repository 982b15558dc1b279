"""``RedisIdempotencyStore``, ``RedisLock`` and ``RedisNonceStore`` (seed 001 §6–§8)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

import orjson

from siglo import codec
from siglo.closing import Closable
from siglo.coordination import (
    IdempotencyStoreBase,
    LockBase,
    LockResult,
    LockState,
    NonceStoreBase,
    OwnedClaimReply,
    holder_label,
    new_lock_token,
)
from siglo.errors import InvalidArgumentError, StorageAdapterError
from siglo.payloads import StoredPayload
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.validation import require_ttl_ms
from siglo_redis.client import client_for, close_client
from siglo_redis.commands import Commands, clamp_px, text
from siglo_redis.keys import (
    DEFAULT_PREFIX,
    KeySpace,
    check_prefix,
    default_fence_prefix,
    default_owner_prefix,
    fence_key,
    idempotency_owner_key,
    legacy_fence_key,
)
from siglo_redis.listing import scan_keys
from siglo_redis.scripts import (
    COMPARE_AND_DELETE,
    IDEMPOTENCY_CLAIM_OWNED,
    IDEMPOTENCY_COMPLETE,
    IDEMPOTENCY_EXTEND,
    IDEMPOTENCY_FAIL,
    LOCK_ACQUIRE,
    LOCK_EXTEND,
    LOCK_INSPECT,
)
from siglo_redis.waits import swap

__all__ = [
    "RedisIdempotencyStore",
    "RedisLock",
    "RedisNonceStore",
]

IN_PROGRESS: Final = "in-progress"
COMPLETED_PREFIX: Final = "COMPLETED:"
_DEFAULT_KEYS: Final = KeySpace(DEFAULT_PREFIX)


class _ClientOwner(Closable):
    """Holds a client, or builds (and later closes) one from a URL."""

    def __init__(self, client: Any, command_timeout_ms: int | None) -> None:
        require_ttl_ms("command_timeout_ms", command_timeout_ms, optional=True)
        self._owns_client = isinstance(client, str)
        client = client_for(client, command_timeout_ms=command_timeout_ms)
        self.client: Any = client
        self._redis = Commands(client, command_timeout_ms=command_timeout_ms)

    async def aclose(self) -> None:
        """Close the client if it was built here from a URL (a passed-in one stays
        open); either way the store refuses every call from now on."""
        try:
            if self._owns_client:
                self._owns_client = False
                await self._redis.call("close", close_client(self.client))
        finally:
            self.mark_closed()


class RedisIdempotencyStore(_ClientOwner, IdempotencyStoreBase):
    """Single-flight claims with a remembered result (seed 001 §6), with owners.

    Keys are ``<key_prefix><key>`` (default ``siglo:idempotency:``) holding
    ``in-progress`` while claimed and ``COMPLETED:<json>`` once done, exactly the seed's
    values, so the TypeScript side reads them. A claim lasts ``default_lease_ms`` (30 s)
    unless it passes ``ttl_ms``; a result ``default_ttl_ms`` (24 h). The owner token and
    the fingerprint digest live in a sibling key in the same cluster slot,
    ``<owner_prefix>{<slot tag>}<key>`` (default prefix ``siglo:idempotency-owner:``),
    holding ``<token>:<digest>`` and expiring with the key. ``claim``, ``complete`` and
    ``fail`` are one Lua script each over both keys.
    """

    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = _DEFAULT_KEYS.idempotency_prefix,
        owner_prefix: str | None = None,
        default_ttl_ms: int = DEFAULTS.idempotency_ttl_ms,
        default_lease_ms: int = DEFAULTS.idempotency_lease_ms,
        command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    ) -> None:
        self.key_prefix = check_prefix("key_prefix", key_prefix)
        self.owner_prefix = check_prefix(
            "owner_prefix", owner_prefix or default_owner_prefix(key_prefix)
        )
        if self.owner_prefix == self.key_prefix:
            raise InvalidArgumentError("owner_prefix must differ from key_prefix")
        self.default_ttl_ms = require_ttl_ms("default_ttl_ms", default_ttl_ms)
        self.default_lease_ms = require_ttl_ms("default_lease_ms", default_lease_ms)
        super().__init__(client, command_timeout_ms)

    def _keys(self, key: str) -> list[str]:
        full = self.key_prefix + key
        return [full, idempotency_owner_key(self.owner_prefix, full, key)]

    async def _do_claim_owned(
        self, key: str, ttl_ms: int | None, token: str | None, fingerprint: str | None
    ) -> OwnedClaimReply:
        lease = clamp_px(ttl_ms or self._default_claim_ms(token))
        reply = await self._redis.script(
            IDEMPOTENCY_CLAIM_OWNED, self._keys(key), [lease, token or "", fingerprint or ""]
        )
        state = text(reply)
        if state not in ("claimed", "completed", "in-progress", "mismatch"):
            raise StorageAdapterError(f"unexpected idempotency claim reply {reply!r}")
        return state  # type: ignore[return-value]

    async def _do_complete_owned(
        self, key: str, result: Any, ttl_ms: int | None, token: str | None
    ) -> bool:
        encoded = codec.dumps_str(result, what=f"result of {key!r}")
        px = clamp_px(ttl_ms or self.default_ttl_ms)
        reply = await self._redis.script(
            IDEMPOTENCY_COMPLETE,
            self._keys(key),
            [COMPLETED_PREFIX + encoded, px, token or ""],
        )
        return int(reply) == 1

    async def _do_fail_owned(
        self, key: str, error: BaseException | None, token: str | None
    ) -> bool:
        """Delete the key only while it is ``in-progress`` and the caller owns it (or, token-
        less, nobody does): one script."""
        return int(await self._redis.script(IDEMPOTENCY_FAIL, self._keys(key), [token or ""])) == 1

    async def _do_extend(self, key: str, token: str, ttl_ms: int) -> bool:
        reply = await self._redis.script(
            IDEMPOTENCY_EXTEND, self._keys(key), [token, clamp_px(ttl_ms)]
        )
        return int(reply) == 1

    async def _do_get_result(self, key: str) -> Any | Missing:
        value = text(await self._redis.get(self.key_prefix + key))
        if value is None or not value.startswith(COMPLETED_PREFIX):
            return MISSING
        try:
            return orjson.loads(value[len(COMPLETED_PREFIX) :])
        except orjson.JSONDecodeError:
            return MISSING  # seed 001 §6: unparseable is "no result"

    async def _do_scan_results(self) -> AsyncIterator[StoredPayload]:
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self.key_prefix) + "*"
        start = len(self.key_prefix)
        async for full in scan_keys(self._redis, self.client, pattern):
            kind = text(await self._redis.call("TYPE", self.client.type(full)))
            data = await self._redis.get(full) if kind == "string" else None
            if data is None or not data.startswith(COMPLETED_PREFIX.encode()):
                continue  # in progress, or a key of another kind under the prefix
            try:
                result = orjson.loads(data[len(COMPLETED_PREFIX) :])
            except orjson.JSONDecodeError:
                continue  # unparseable is "no result" (seed 001 §6): nothing to rekey
            yield StoredPayload("idempotency", full[start:], None, {"result": result}, data)

    async def _do_swap_result(self, item: StoredPayload, result: Any) -> bool:
        new = COMPLETED_PREFIX + codec.dumps_str(result, what=f"result of {item.key!r}")
        # The swap script: written only if the key still holds the bytes read, TTL kept.
        return await swap(self._redis, self.key_prefix + item.key, item.token, new.encode())


class RedisLock(_ClientOwner, LockBase):
    """A distributed mutex with per-holder tokens and fencing tokens (seed 001 §7).

    ``RedisLock(client)`` or ``RedisLock(client, "siglo:lock:")``; the lock lives at
    ``<key_prefix><lock_key>`` holding the token. Every successful acquire also
    increments the counter of the lock key's cluster slot, ``<fence_prefix>{<slot tag>}``
    (default prefix ``siglo:lock-fence:``), and returns it as ``fencing_token``: a key's
    tokens only grow, and there are at most 16,384 counters however many lock keys are
    used (:func:`~siglo_redis.keys.fence_key`).

    Release and extend are Lua scripts checking the token. For a client without
    ``eval`` the seed's rule applies: with ``strict_atomicity=True`` release raises,
    otherwise it falls back to ``GET`` then ``DEL`` (which can race an expiry).
    """

    def __init__(
        self,
        client: Any,
        key_prefix: str = _DEFAULT_KEYS.lock_prefix,
        *,
        strict_atomicity: bool = False,
        fence_prefix: str | None = None,
        command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    ) -> None:
        self.key_prefix = check_prefix("key_prefix", key_prefix)
        self.fence_prefix = check_prefix(
            "fence_prefix", fence_prefix or default_fence_prefix(key_prefix)
        )
        if not isinstance(strict_atomicity, bool):
            # bool() of the text "false" is True (a black-box auditor).
            raise InvalidArgumentError(f"strict_atomicity must be a bool, got {strict_atomicity!r}")
        self.strict_atomicity = strict_atomicity
        super().__init__(client, command_timeout_ms)

    def _keys(self, lock_key: str) -> tuple[str, str, str]:
        full = self.key_prefix + lock_key
        return (
            full,
            fence_key(self.fence_prefix, full),
            legacy_fence_key(self.fence_prefix, lock_key, full),
        )

    def _require_eval(self, what: str) -> bool:
        if self._redis.has_eval:
            return True
        if self.strict_atomicity:
            raise StorageAdapterError(
                f"RedisLock: client.eval is required for atomic {what} "
                "to prevent TOCTOU race condition."
            )
        return False

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        token = custom_token or new_lock_token()
        key, fence, legacy = self._keys(lock_key)
        if self._redis.has_eval:
            reply = int(
                await self._redis.script(
                    LOCK_ACQUIRE, [key, fence, legacy], [token, clamp_px(ttl_ms)]
                )
            )
            if reply == 0:
                return LockResult(acquired=False, token=token)
            return LockResult(acquired=True, token=token, fencing_token=reply)
        if not await self._redis.set(key, token, px=ttl_ms, nx=True):
            return LockResult(acquired=False, token=token)
        incr = getattr(self.client, "incr", None)
        fencing = int(await self._redis.call("INCR", incr(fence))) if callable(incr) else None
        return LockResult(acquired=True, token=token, fencing_token=fencing)

    async def _do_release(self, lock_key: str, token: str) -> bool:
        key = self.key_prefix + lock_key
        if self._require_eval("release"):
            return int(await self._redis.script(COMPARE_AND_DELETE, [key], [token])) == 1
        if text(await self._redis.get(key)) != token:
            return False
        return await self._redis.delete(key) == 1

    async def _do_inspect(self, lock_key: str) -> LockState | None:
        key = self.key_prefix + lock_key
        if self._require_eval("inspect"):
            reply = await self._redis.script(LOCK_INSPECT, [key], [])
            if not reply:
                return None
            token, left = text(reply[0]), int(reply[1])
        else:  # the seed's fallback for a client without eval: two reads, may race
            token = text(await self._redis.get(key))
            left = int(await self._redis.call("PTTL", self.client.pttl(key)))
        if token is None or left <= 0:
            return None  # gone between the two reads, or a key without a lease
        # The fencing counter is per cluster slot, not per lock key: no per-key number.
        return LockState(holder_label(token), left, None)

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        key = self.key_prefix + lock_key
        if self._require_eval("extend"):
            return int(await self._redis.script(LOCK_EXTEND, [key], [token, clamp_px(ttl_ms)])) == 1
        if text(await self._redis.get(key)) != token:
            return False
        return bool(await self._redis.call("PEXPIRE", self.client.pexpire(key, clamp_px(ttl_ms))))


class RedisNonceStore(_ClientOwner, NonceStoreBase):
    """Webhook replay protection (seed 001 §8): ``SET <prefix><key> "1" PX <ttl> NX``.

    The default prefix is the seed's ``siglo:wh:dedup:``.
    """

    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = _DEFAULT_KEYS.nonce_prefix,
        command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    ) -> None:
        self.key_prefix = check_prefix("key_prefix", key_prefix)
        super().__init__(client, command_timeout_ms)

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        return await self._redis.set(self.key_prefix + key, "1", px=ttl_ms, nx=True)
