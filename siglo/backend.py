"""``Backend``: everything one URL connects to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from siglo.adapter import StorageAdapter
from siglo.coordination import IdempotencyStore, Lock, NonceStore

__all__ = ["Backend"]


@dataclass(eq=False)
class Backend:
    """A backend's storage adapter and coordination primitives, sharing its connections.

    Returned by :func:`siglo.connect`. Use it as an async context manager, or call
    :meth:`aclose`, to release its connections.
    """

    name: str
    """The registered backend name (``"memory"``, ``"redis"`` …)."""
    url: str
    adapter: StorageAdapter
    idempotency: IdempotencyStore | None = None
    lock: Lock | None = None
    nonces: NonceStore | None = None
    url_shares_storage: bool = True
    """Whether :func:`siglo.connect` of :attr:`url` reaches this same storage again (a
    server or a file does; ``memory://`` and ``sqlite://`` are private to this object)."""
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list, repr=False)

    async def aclose(self) -> None:
        """Close the adapter and release every connection this backend opened."""
        await self.adapter.aclose()
        callbacks, self.on_close = self.on_close, []
        for close in reversed(callbacks):
            await close()

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
