"""``memory://`` URLs: a private store, or ``memory://NAME`` shared within the process."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from siglo.backend import Backend
from siglo.clock import Clock
from siglo.errors import InvalidArgumentError
from siglo.urls import mask_credentials
from siglo_memory.adapter import MemoryStorageAdapter
from siglo_memory.coordination import MemoryIdempotencyStore, MemoryLock, MemoryNonceStore

__all__ = ["connect"]

_named: dict[str, Backend] = {}


def connect(url: str = "memory://", *, clock: Clock | None = None, **options: Any) -> Backend:
    """A memory backend. Options go to :class:`MemoryStorageAdapter`.

    ``memory://`` is a new, private store; ``memory://NAME`` returns the same store for
    the same name for the life of the process (options apply when it is first made).
    """
    parts = urlsplit(url)
    if parts.scheme != "memory":
        raise InvalidArgumentError(f"not a memory:// URL: {mask_credentials(url)!r}")
    name = unquote(parts.netloc + parts.path)
    if name and name in _named:
        return _named[name]
    backend = Backend(
        name="memory",
        url=url,
        adapter=MemoryStorageAdapter(clock=clock, **options),
        idempotency=MemoryIdempotencyStore(clock=clock),
        lock=MemoryLock(clock=clock),
        nonces=MemoryNonceStore(clock=clock),
        url_shares_storage=bool(name),
    )
    if name:
        _named[name] = backend
    return backend
