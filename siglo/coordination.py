"""Coordination primitives beside storage (seed 001 §6–§8), for every backend.

These are protocols: each backend provides an implementation, obtained from the same
URL as its storage adapter (:func:`siglo.connect`). The base classes
:class:`IdempotencyStoreBase`, :class:`LockBase` and :class:`NonceStoreBase` check every
argument once and call the backend's ``_do_…`` hooks, as
:class:`~siglo.adapter.StorageAdapter` does.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar, runtime_checkable

from siglo.errors import CapabilityNotSupportedError, InvalidArgumentError, LockNotAcquiredError
from siglo.sentinel import Missing
from siglo.settings import DEFAULTS
from siglo.validation import require_id, require_ttl_ms

__all__ = [
    "DEFAULT_LOCK_TTL_MS",
    "ClaimState",
    "IdempotencyStore",
    "IdempotencyStoreBase",
    "Lock",
    "LockBase",
    "LockResult",
    "NonceStore",
    "NonceStoreBase",
    "new_lock_token",
    "nonce_ttl_ms",
]

T = TypeVar("T")

ClaimState = Literal["claimed", "completed", "in-progress"]
DEFAULT_LOCK_TTL_MS: Final = DEFAULTS.lock_ttl_ms
"""The lease of :meth:`Lock.acquire` when the caller names none (seed 001 §7: 10 s)."""


@runtime_checkable
class IdempotencyStore(Protocol):
    """Single-flight execution claims with a remembered result (seed 001 §6)."""

    async def claim(self, key: str, ttl_ms: int | None = None) -> ClaimState:
        """``"claimed"`` for exactly one caller; then ``"in-progress"`` until completed
        or failed; ``"completed"`` once a result is stored."""
        ...

    async def complete(self, key: str, result: Any, ttl_ms: int | None = None) -> None:
        """Store ``result`` (JSON data) and mark the key completed."""
        ...

    async def fail(self, key: str, error: BaseException | None = None) -> None:
        """Free an in-progress key for retry; a completed result is kept."""
        ...

    async def get_result(self, key: str) -> Any | Missing:
        """The completed result, or :data:`~siglo.MISSING`."""
        ...

    async def get(self, key: str) -> Any | Missing:
        """Alias of :meth:`get_result`."""
        ...


@dataclass(frozen=True, slots=True)
class LockResult:
    """The outcome of :meth:`Lock.acquire`.

    ``fencing_token`` goes up with every successful acquire of a key, so a resource can
    refuse writes from a holder whose lock has since passed to another.
    """

    acquired: bool
    token: str
    fencing_token: int | None = None


@runtime_checkable
class Lock(Protocol):
    """A distributed mutex with per-holder tokens (seed 001 §7)."""

    async def acquire(
        self, lock_key: str, ttl_ms: int = DEFAULT_LOCK_TTL_MS, custom_token: str | None = None
    ) -> LockResult:
        """Try once to take the lock for ``ttl_ms``."""
        ...

    async def release(self, lock_key: str, token: str) -> bool:
        """Release if ``token`` still holds the lock; ``True`` if released."""
        ...

    async def extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        """Reset the TTL if ``token`` still holds the lock; ``True`` if extended."""
        ...

    async def with_lock(
        self, lock_key: str, fn: Callable[[], Awaitable[T]], ttl_ms: int = DEFAULT_LOCK_TTL_MS
    ) -> T:
        """Run ``fn`` under the lock, or raise :class:`~siglo.errors.LockNotAcquiredError`."""
        ...


@runtime_checkable
class NonceStore(Protocol):
    """Single-use tokens for webhook replay protection (seed 001 §8)."""

    async def claim(self, key: str, ttl_seconds: float) -> bool:
        """``True`` for the first claim within the window, ``False`` for a replay."""
        ...


def new_lock_token(now_ms: int | None = None) -> str:
    """A lock token in the seed's format: ``lock_<epoch ms>_<32 hex digits>``."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return f"lock_{ms}_{secrets.token_hex(16)}"


def nonce_ttl_ms(ttl_seconds: float) -> int:
    """The seed's window: ``max(1, floor(ttl_seconds * 1000))`` milliseconds."""
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise InvalidArgumentError(f"ttl_seconds must be a number, got {ttl_seconds!r}")
    if not math.isfinite(ttl_seconds) or ttl_seconds <= 0:
        raise InvalidArgumentError(f"ttl_seconds must be positive and finite, got {ttl_seconds!r}")
    return max(1, math.floor(ttl_seconds * 1000))


class IdempotencyStoreBase:
    """Base class of idempotency stores: argument checks once, then the ``_do_…`` hooks.

    Subclasses implement :meth:`_do_claim`, :meth:`_do_complete`, :meth:`_do_fail` and
    :meth:`_do_get_result`; each receives arguments already checked.
    """

    async def claim(self, key: str, ttl_ms: int | None = None) -> ClaimState:
        """``"claimed"`` for exactly one caller; then ``"in-progress"`` until completed
        or failed; ``"completed"`` once a result is stored."""
        require_id("key", key)
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        return await self._do_claim(key, ttl_ms)

    async def complete(self, key: str, result: Any, ttl_ms: int | None = None) -> None:
        """Store ``result`` (JSON data) and mark the key completed."""
        require_id("key", key)
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        await self._do_complete(key, result, ttl_ms)

    async def fail(self, key: str, error: BaseException | None = None) -> None:
        """Free an in-progress key for retry; a completed result is kept."""
        require_id("key", key)
        await self._do_fail(key, error)

    async def get_result(self, key: str) -> Any | Missing:
        """The completed result, or :data:`~siglo.MISSING`."""
        require_id("key", key)
        return await self._do_get_result(key)

    async def get(self, key: str) -> Any | Missing:
        """Alias of :meth:`get_result`."""
        return await self.get_result(key)

    async def _do_claim(self, key: str, ttl_ms: int | None) -> ClaimState:
        raise _unsupported(self, "claim")

    async def _do_complete(self, key: str, result: Any, ttl_ms: int | None) -> None:
        raise _unsupported(self, "complete")

    async def _do_fail(self, key: str, error: BaseException | None) -> None:
        raise _unsupported(self, "fail")

    async def _do_get_result(self, key: str) -> Any | Missing:
        raise _unsupported(self, "get_result")


class LockBase:
    """Base class of locks: argument checks once, then the ``_do_…`` hooks, and
    :meth:`with_lock` built on :meth:`acquire` and :meth:`release`.

    Subclasses implement :meth:`_do_acquire`, :meth:`_do_release` and :meth:`_do_extend`;
    each receives arguments already checked.
    """

    async def acquire(
        self, lock_key: str, ttl_ms: int = DEFAULT_LOCK_TTL_MS, custom_token: str | None = None
    ) -> LockResult:
        """Try once to take the lock for ``ttl_ms``."""
        require_id("lock_key", lock_key)
        require_ttl_ms("ttl_ms", ttl_ms)
        if custom_token is not None:
            require_id("custom_token", custom_token)
        return await self._do_acquire(lock_key, ttl_ms, custom_token)

    async def release(self, lock_key: str, token: str) -> bool:
        """Release if ``token`` still holds the lock; ``True`` if released."""
        require_id("lock_key", lock_key)
        require_id("token", token)
        return await self._do_release(lock_key, token)

    async def extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        """Reset the TTL if ``token`` still holds the lock; ``True`` if extended."""
        require_id("lock_key", lock_key)
        require_id("token", token)
        require_ttl_ms("ttl_ms", ttl_ms)
        return await self._do_extend(lock_key, token, ttl_ms)

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        raise _unsupported(self, "acquire")

    async def _do_release(self, lock_key: str, token: str) -> bool:
        raise _unsupported(self, "release")

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        raise _unsupported(self, "extend")

    async def with_lock(
        self, lock_key: str, fn: Callable[[], Awaitable[T]], ttl_ms: int = DEFAULT_LOCK_TTL_MS
    ) -> T:
        """Run ``fn`` under the lock, or raise :class:`~siglo.errors.LockNotAcquiredError`.

        The lock is released in a ``finally`` (a failed release is ignored: the TTL frees
        the key anyway), so an exception in ``fn`` does not leak the lock.
        """
        result = await self.acquire(lock_key, ttl_ms)
        if not result.acquired:
            raise LockNotAcquiredError(
                f"Failed to acquire lock for key: {lock_key} (in-use or concurrent execution)"
            )
        try:
            return await fn()
        finally:
            # The seed swallows release failures: the TTL frees the key anyway.
            with contextlib.suppress(Exception):
                await self.release(lock_key, result.token)


class NonceStoreBase:
    """Base class of nonce stores: argument checks once, then :meth:`_do_claim`.

    The hook receives the window already converted to milliseconds (:func:`nonce_ttl_ms`).
    """

    async def claim(self, key: str, ttl_seconds: float) -> bool:
        """``True`` for the first claim within the window, ``False`` for a replay."""
        require_id("key", key)
        return await self._do_claim(key, nonce_ttl_ms(ttl_seconds))

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        raise _unsupported(self, "claim")


def _unsupported(part: object, method: str) -> CapabilityNotSupportedError:
    return CapabilityNotSupportedError(f"{type(part).__name__} does not implement {method}()")
