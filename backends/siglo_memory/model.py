"""Read-only views of what the reference model stores, for the contract suite.

The suite's state machines compare a backend with the reference and, when they differ,
name the rule that explains the reference's answer: was the key never stored, or stored
and past its expiry? The public API cannot say (an expired entry reads as absent), so each
part of the memory backend offers a ``model`` property: a view that reads its stored
entries, expired ones included, and changes nothing — not even the purge of an expired
entry that a read through the store does. The machines talk to the reference through its
public API and these views only, as zarr's stateful tests talk to their model
(``tests/suite/test_reference_model_view.py`` checks that they do).

A view is live: it reads the store's dicts at each call, so it always shows their
current state. Values come back decoded, as new objects: nothing a caller does to them
reaches the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from siglo import codec
from siglo.checkpoint import Checkpoint
from siglo.records import WaitRecord

__all__ = ["ExpiringKeysModel", "StorageModel", "Stored", "WaitKey", "wait_key"]

T = TypeVar("T")

WaitKey = str | tuple[str, str]
"""Where the model keeps a wait record: the seed's plain key for an un-namespaced stack,
``(namespace, key)`` for a namespaced one (wait records never cross namespaces)."""


def wait_key(namespace: str | None, key: str) -> WaitKey:
    """The model's key of the wait record (or stack index) ``key`` in ``namespace``."""
    return key if namespace is None else (namespace, key)


class StoredJSON(Protocol):
    """What the adapter keeps per entry: the JSON document and when it is gone."""

    @property
    def data(self) -> bytes: ...

    @property
    def gone_at(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Stored(Generic[T]):
    """One stored entry: its value and the time it is gone (``None``: kept until removed).

    An entry past ``gone_at`` is still stored until something removes it; the contract
    treats it as absent (:meth:`live` says which).
    """

    value: T
    gone_at: int | None

    def live(self, now: int) -> bool:
        """Whether the entry is still there for a read at ``now`` (ms)."""
        return self.gone_at is None or now < self.gone_at


class StorageModel:
    """A read-only view of a :class:`~siglo_memory.MemoryStorageAdapter`'s entries.

    Returned by ``MemoryStorageAdapter.model``; checkpoints are keyed by
    ``(namespace, stack id)``, wait records and the stack index by :func:`wait_key`.
    """

    __slots__ = ("_cache", "_checkpoints", "_latest_wait_of_stack", "_waits")

    def __init__(
        self,
        *,
        checkpoints: Mapping[tuple[str | None, str], StoredJSON],
        waits: Mapping[WaitKey, StoredJSON],
        latest_wait_of_stack: Mapping[WaitKey, WaitKey],
        cache: Mapping[str, StoredJSON],
    ) -> None:
        self._checkpoints = checkpoints
        self._waits = waits
        self._latest_wait_of_stack = latest_wait_of_stack
        self._cache = cache

    def checkpoint(self, key: tuple[str | None, str]) -> Stored[Checkpoint] | None:
        """The checkpoint stored under ``(namespace, stack id)``, live or expired."""
        entry = self._checkpoints.get(key)
        if entry is None:
            return None
        return Stored(Checkpoint.from_json(entry.data), entry.gone_at)

    def live_checkpoint(self, key: tuple[str | None, str], now: int) -> Checkpoint | None:
        """The checkpoint a read at ``now`` finds under ``key`` (no namespace fallback)."""
        stored = self.checkpoint(key)
        return stored.value if stored is not None and stored.live(now) else None

    def expired_checkpoints(self, now: int) -> list[tuple[str | None, str]]:
        """The keys of the checkpoints stored but past their expiry at ``now``: those a
        clean-up at ``now`` removes."""
        return [
            key
            for key, entry in self._checkpoints.items()
            if entry.gone_at is not None and now >= entry.gone_at
        ]

    def wait_record(self, key: WaitKey) -> Stored[WaitRecord] | None:
        """The wait record stored under correlation key ``key``, live or expired."""
        entry = self._waits.get(key)
        if entry is None:
            return None
        return Stored(WaitRecord.from_json(entry.data), entry.gone_at)

    def live_wait_record(self, key: WaitKey, now: int) -> WaitRecord | None:
        """The wait record a read at ``now`` finds under correlation key ``key`` (the
        record's own key only: neither the stack index nor a checkpoint answers)."""
        stored = self.wait_record(key)
        return stored.value if stored is not None and stored.live(now) else None

    def latest_wait_of_stack(self, key: WaitKey) -> WaitKey | None:
        """The key of the wait record saved last for stack ``key``, if any was saved."""
        return self._latest_wait_of_stack.get(key)

    def cached_step(self, key: str) -> Stored[Any] | None:
        """The step-cache value stored under ``key``, live or expired."""
        entry = self._cache.get(key)
        if entry is None:
            return None
        return Stored(codec.loads(entry.data, what="cached step"), entry.gone_at)


class ExpiringKeysModel:
    """A read-only view of keys that expire: idempotency keys, lock holders, nonces.

    Returned by the ``model`` property of the memory idempotency store, lock and nonce
    store. A key past its expiry stays stored until a read through the store purges it;
    this view shows it and purges nothing.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, tuple[str, int]]) -> None:
        self._items = items

    def expires_at(self, key: str) -> int | None:
        """When the entry stored under ``key`` expires (ms), ``None`` if none is stored."""
        item = self._items.get(key)
        return None if item is None else item[1]

    def lapsed(self, key: str, now: int) -> bool:
        """Whether ``key`` is stored but past its expiry at ``now``: a claim or acquire
        at ``now`` finds it gone by expiry rather than never taken."""
        expires_at = self.expires_at(key)
        return expires_at is not None and now >= expires_at
