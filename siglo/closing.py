"""What a closed part of a backend does: refuse every call, with one clear error.

A backend's adapter and its coordination stores (idempotency, lock, nonces) share this
base. :meth:`Backend.aclose` marks each of them closed after releasing their
connections, and every public call checks it, after its argument checks. Without it a
closed backend's behaviour depended on its driver: SQLite and PostgreSQL refused, the
Redis client reconnected (a connection nobody would close again) and the memory backend
answered, so code that kept using a backend it had closed worked on one backend and
failed on another (contract rule ``backend.closed``).
"""

from __future__ import annotations

from siglo.errors import StorageAdapterError

__all__ = ["Closable"]


class Closable:
    """A part of a backend that refuses every call once closed."""

    _closed: bool = False

    @property
    def closed(self) -> bool:
        """Whether this part was closed; every call then raises
        :class:`~siglo.errors.StorageAdapterError`."""
        return self._closed

    def mark_closed(self) -> None:
        """Refuse every call from now on (the backend's ``aclose()`` calls this)."""
        self._closed = True

    def _describe_part(self) -> str:
        return type(self).__name__

    def _require_open(self) -> None:
        if self._closed:
            raise StorageAdapterError(
                f"{self._describe_part()} is closed (aclose() was called): "
                "connect a new backend to use the storage again"
            )
