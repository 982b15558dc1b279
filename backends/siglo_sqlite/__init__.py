"""The SQLite backend: ``sqlite:///path.db`` and ``sqlite://`` (private, in memory).

See ``docs/backends/sqlite.md``. This package imports no driver: the plugin loads with
the core alone (``siglo backends`` then says ``pip install 'siglo[sqlite]>=0.1,<1'``), and the
names below are imported on first use. The connect function is
``siglo_sqlite.connect.connect`` (``siglo.connect(url)`` finds it through the plugin).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from siglo_sqlite.connect import (
        SqliteStorageAdapter,
        connect_engine,
        is_memory_url,
        isolated,
    )

__all__ = ["SqliteStorageAdapter", "connect_engine", "is_memory_url", "isolated"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing siglo_sqlite.plugin never imports SQLAlchemy or aiosqlite.
    if name in __all__:
        return getattr(importlib.import_module("siglo_sqlite.connect"), name)
    raise AttributeError(f"module 'siglo_sqlite' has no attribute {name!r}")
