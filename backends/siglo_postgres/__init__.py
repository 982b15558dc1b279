"""The PostgreSQL backend: ``postgresql://…`` and ``postgresql+psycopg://…``.

See ``docs/backends/postgres.md``. This package imports no driver: the plugin loads with
the core alone (``siglo backends`` then says ``pip install 'siglo[postgres]>=0.1,<1'``), and the
names below are imported on first use. The connect function is
``siglo_postgres.connect.connect`` (``siglo.connect(url)`` finds it through the plugin).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from siglo_postgres.connect import (
        PostgresStorageAdapter,
        connect_engine,
        drop_schema,
        isolated,
    )

__all__ = ["PostgresStorageAdapter", "connect_engine", "drop_schema", "isolated"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing siglo_postgres.plugin never imports SQLAlchemy or psycopg.
    if name in __all__:
        return getattr(importlib.import_module("siglo_postgres.connect"), name)
    raise AttributeError(f"module 'siglo_postgres' has no attribute {name!r}")
