"""The SQLite backend: ``sqlite:///path.db`` and ``sqlite://`` (private, in memory).

See ``docs/backends/sqlite.md``.
"""

from siglo_sqlite.connect import (
    SqliteStorageAdapter,
    connect,
    connect_engine,
    is_memory_url,
    isolated,
)

__all__ = ["SqliteStorageAdapter", "connect", "connect_engine", "is_memory_url", "isolated"]
