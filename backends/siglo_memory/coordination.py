"""In-memory idempotency store, lock and nonce store (reference model of seed 001 §6–§8)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import MappingProxyType
from typing import Any, Final

from siglo import codec
from siglo.clock import Clock, clock_or_system
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
from siglo.payloads import StoredPayload
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.validation import require_ttl_ms
from siglo_memory.model import ExpiringKeysModel

__all__ = [
    "MemoryIdempotencyStore",
    "MemoryLock",
    "MemoryNonceStore",
]

IN_PROGRESS: Final = "in-progress"
COMPLETED_PREFIX: Final = "COMPLETED:"


class _ExpiringDict:
    """A dict whose entries vanish at their expiry time by the given clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._items: dict[str, tuple[str, int]] = {}

    def get(self, key: str) -> str | None:
        item = self._items.get(key)
        if item is None:
            return None
        if self.clock.now_ms() >= item[1]:
            del self._items[key]
            return None
        return item[0]

    def remaining_ms(self, key: str) -> int | None:
        """How long the live entry ``key`` has left, ``None`` without one."""
        if self.get(key) is None:
            return None
        return self._items[key][1] - self.clock.now_ms()

    def set(self, key: str, value: str, ttl_ms: int) -> None:
        self._items[key] = (value, self.clock.now_ms() + ttl_ms)

    def delete(self, key: str) -> None:
        self._items.pop(key, None)

    def snapshot(self) -> list[str]:
        """A snapshot of the keys (expired ones included until read)."""
        return list(self._items)

    def replace(self, key: str, value: str) -> None:
        """A new value for a present key, its expiry kept."""
        self._items[key] = (value, self._items[key][1])

    def view(self) -> ExpiringKeysModel:
        """A read-only view of the entries, expired ones not yet purged included."""
        return ExpiringKeysModel(MappingProxyType(self._items))


class MemoryIdempotencyStore(IdempotencyStoreBase):
    """Values as in Redis: ``in-progress`` while claimed, ``COMPLETED:<json>`` when done.

    Beside each value, as Redis keeps it in a sibling key, ``<owner token>:<fingerprint
    digest>`` (either part empty when absent), set and expiring with the value.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        default_ttl_ms: int = DEFAULTS.idempotency_ttl_ms,
        default_lease_ms: int = DEFAULTS.idempotency_lease_ms,
    ) -> None:
        self.default_ttl_ms = require_ttl_ms("default_ttl_ms", default_ttl_ms)
        self.default_lease_ms = require_ttl_ms("default_lease_ms", default_lease_ms)
        self._keys = _ExpiringDict(clock_or_system(clock))
        self._meta = _ExpiringDict(clock_or_system(clock))

    @property
    def model(self) -> ExpiringKeysModel:
        """A read-only view of the keys (claims and results) and their expiries, for the
        contract suite's state machines (see :mod:`siglo_memory.model`)."""
        return self._keys.view()

    def _owner_and_fingerprint(self, key: str) -> tuple[str, str]:
        """The live key's owner token and fingerprint digest (``""`` for none)."""
        meta = self._meta.get(key) if self._keys.get(key) is not None else None
        owner, _, fingerprint = (meta or ":").partition(":")
        return owner, fingerprint

    def _set_meta(self, key: str, owner: str, fingerprint: str, ttl_ms: int) -> None:
        if owner or fingerprint:
            self._meta.set(key, f"{owner}:{fingerprint}", ttl_ms)
        else:
            self._meta.delete(key)

    def _held_by_owner(self, key: str) -> str:
        """The owner token of a live in-progress claim, ``""`` when none holds the key."""
        if self._keys.get(key) != IN_PROGRESS:
            return ""
        return self._owner_and_fingerprint(key)[0]

    async def _do_claim_owned(
        self, key: str, ttl_ms: int | None, token: str | None, fingerprint: str | None
    ) -> OwnedClaimReply:
        value = self._keys.get(key)
        if value is None:
            lease = ttl_ms or self._default_claim_ms(token)
            self._keys.set(key, IN_PROGRESS, lease)
            self._set_meta(key, token or "", fingerprint or "", lease)
            return "claimed"
        stored = self._owner_and_fingerprint(key)[1]
        if fingerprint and stored and stored != fingerprint:
            return "mismatch"
        return "completed" if value.startswith(COMPLETED_PREFIX) else "in-progress"

    async def _do_complete(self, key: str, result: Any, ttl_ms: int | None) -> None:
        encoded = codec.dumps_str(result, what=f"result of {key!r}")
        ttl = ttl_ms or self.default_ttl_ms
        fingerprint = self._owner_and_fingerprint(key)[1]
        self._keys.set(key, COMPLETED_PREFIX + encoded, ttl)
        # The fingerprint stays with the result; the claim's owner is done.
        self._set_meta(key, "", fingerprint, ttl)

    async def _do_complete_owned(
        self, key: str, result: Any, ttl_ms: int | None, token: str | None
    ) -> bool:
        if self._held_by_owner(key) != (token or ""):
            return False
        await self._do_complete(key, result, ttl_ms)
        return True

    async def _do_fail(self, key: str, error: BaseException | None) -> None:
        if self._keys.get(key) == IN_PROGRESS:
            self._keys.delete(key)
            self._meta.delete(key)

    async def _do_fail_owned(
        self, key: str, error: BaseException | None, token: str | None
    ) -> bool:
        if token is None:
            if self._held_by_owner(key):
                return False
        elif self._held_by_owner(key) != token:
            return False
        await self._do_fail(key, error)
        return True

    async def _do_extend(self, key: str, token: str, ttl_ms: int) -> bool:
        if self._held_by_owner(key) != token:
            return False
        fingerprint = self._owner_and_fingerprint(key)[1]
        self._keys.set(key, IN_PROGRESS, ttl_ms)
        self._set_meta(key, token, fingerprint, ttl_ms)
        return True

    async def _do_get_result(self, key: str) -> Any | Missing:
        value = self._keys.get(key)
        if value is None or not value.startswith(COMPLETED_PREFIX):
            return MISSING
        return codec.loads(value[len(COMPLETED_PREFIX) :], what="idempotency result")

    async def _do_scan_results(self) -> AsyncIterator[StoredPayload]:
        for key in self._keys.snapshot():
            value = self._keys.get(key)
            if value is not None and value.startswith(COMPLETED_PREFIX):
                result = codec.loads(value[len(COMPLETED_PREFIX) :], what="idempotency result")
                yield StoredPayload("idempotency", key, None, {"result": result}, value)

    async def _do_swap_result(self, item: StoredPayload, result: Any) -> bool:
        # No await between the comparison and the write: atomic on the event loop.
        if self._keys.get(item.key) != item.token:
            return False
        encoded = codec.dumps_str(result, what=f"result of {item.key!r}")
        self._keys.replace(item.key, COMPLETED_PREFIX + encoded)
        return True


class MemoryLock(LockBase):
    """Token-checked locks with a TTL and a fencing counter per key."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock = clock_or_system(clock)
        self._holders = _ExpiringDict(self.clock)
        self._fences: dict[str, int] = {}

    @property
    def model(self) -> ExpiringKeysModel:
        """A read-only view of the held lock keys and their expiries, for the contract
        suite's state machines (see :mod:`siglo_memory.model`)."""
        return self._holders.view()

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        token = custom_token or new_lock_token(self.clock.now_ms())
        if self._holders.get(lock_key) is not None:
            return LockResult(acquired=False, token=token)
        self._holders.set(lock_key, token, ttl_ms)
        fence = self._fences.get(lock_key, 0) + 1
        self._fences[lock_key] = fence
        return LockResult(acquired=True, token=token, fencing_token=fence)

    async def _do_release(self, lock_key: str, token: str) -> bool:
        if self._holders.get(lock_key) != token:
            return False
        self._holders.delete(lock_key)
        return True

    async def _do_inspect(self, lock_key: str) -> LockState | None:
        token = self._holders.get(lock_key)
        remaining = self._holders.remaining_ms(lock_key)
        if token is None or remaining is None:
            return None
        return LockState(holder_label(token), remaining, self._fences.get(lock_key))

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        if self._holders.get(lock_key) != token:
            return False
        self._holders.set(lock_key, token, ttl_ms)
        return True


class MemoryNonceStore(NonceStoreBase):
    """First claim of a key within its window wins; later ones are replays."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._seen = _ExpiringDict(clock_or_system(clock))

    @property
    def model(self) -> ExpiringKeysModel:
        """A read-only view of the claimed nonces and their expiries, for the contract
        suite's state machines (see :mod:`siglo_memory.model`)."""
        return self._seen.view()

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        if self._seen.get(key) is not None:
            return False
        self._seen.set(key, "1", ttl_ms)
        return True
