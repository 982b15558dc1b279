"""``memory://`` URLs: a private store, or ``memory://NAME`` shared within the process."""

from __future__ import annotations

import copy
import inspect
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from siglo import urls
from siglo.backend import Backend
from siglo.clock import Clock
from siglo.errors import InvalidArgumentError
from siglo.urls import mask_credentials, refuse_unknown, unknown_option_error
from siglo_memory.adapter import MemoryStorageAdapter
from siglo_memory.coordination import MemoryIdempotencyStore, MemoryLock, MemoryNonceStore

__all__ = ["CONVERTERS", "KEYWORD_OPTIONS", "connect"]

KEYWORD_OPTIONS: frozenset[str] = frozenset(
    name
    for name, param in inspect.signature(MemoryStorageAdapter.__init__).parameters.items()
    if param.kind is inspect.Parameter.KEYWORD_ONLY and name != "clock"
)
"""The options ``connect`` takes as keyword arguments: :class:`MemoryStorageAdapter`'s
(besides ``clock``, a parameter of its own)."""

CONVERTERS: Final[dict[str, urls.Converter]] = {
    "checkpoint_ttl_ms": urls.optional_integer,  # none: kept until removed
    "cache_ttl_ms": urls.integer,
    "claim_lease_ms": urls.integer,
    "workflow_lock_timeout_ms": urls.integer,
}
"""How a text value of each option reads (a settings file's ``[options]``: ``"none"``),
as the other backends read theirs from a URL's query."""

_named: dict[str, Backend] = {}


def connect(url: str = "memory://", *, clock: Clock | None = None, **options: Any) -> Backend:
    """A memory backend. Options go to :class:`MemoryStorageAdapter`
    (:data:`KEYWORD_OPTIONS`; any other raises :class:`~siglo.errors.InvalidArgumentError`
    naming it).

    ``memory://`` is a new, private store; ``memory://NAME`` reaches the same store for
    the same name for the life of the process (options apply when it is first made).
    The URL takes no query options: one raises
    :class:`~siglo.errors.InvalidArgumentError` naming it.
    Each call returns a backend of its own, as a connection to a server is: closing one
    leaves the others working.
    """
    parts = urlsplit(url)
    if parts.scheme != "memory":
        raise InvalidArgumentError(f"not a memory:// URL: {mask_credentials(url)!r}")
    # Options go as keyword arguments: a query parameter here would be ignored, so it
    # is refused (a typo must not pass for a setting).
    refuse_unknown(url, (), backend="memory", also="pass options as keyword arguments")
    # A keyword the adapter does not take (a siglo.toml's [options] meant for another
    # backend, a typo) is named like a URL option, not a TypeError of the constructor.
    unknown = set(options) - KEYWORD_OPTIONS
    if unknown:
        raise unknown_option_error("memory", unknown, KEYWORD_OPTIONS, where="keyword")
    options = urls.typed_keywords(options, CONVERTERS)
    name = unquote(parts.netloc + parts.path)
    if name:
        if name not in _named:
            _named[name] = _new(url, clock, options, shared=True)
        return _handle(_named[name])
    return _new(url, clock, options, shared=False)


def _handle(store: Backend) -> Backend:
    """A new backend on ``store``'s data, closed on its own.

    Shallow copies: each part's state is containers that are only ever changed in place
    (dicts of records, locks, fences; the cache-event list), so every copy reads and
    changes the same data, while its closed flag is its own.
    """
    return Backend(
        name=store.name,
        url=store.url,
        adapter=copy.copy(store.adapter),
        idempotency=copy.copy(store.idempotency),
        lock=copy.copy(store.lock),
        nonces=copy.copy(store.nonces),
        url_shares_storage=True,
    )


def _new(url: str, clock: Clock | None, options: dict[str, Any], *, shared: bool) -> Backend:
    return Backend(
        name="memory",
        url=url,
        adapter=MemoryStorageAdapter(clock=clock, **options),
        idempotency=MemoryIdempotencyStore(clock=clock),
        lock=MemoryLock(clock=clock),
        nonces=MemoryNonceStore(clock=clock),
        url_shares_storage=shared,
    )
