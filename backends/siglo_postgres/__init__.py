"""The PostgreSQL backend: ``postgresql://…`` and ``postgresql+psycopg://…``.

See ``docs/backends/postgres.md``.
"""

from siglo_postgres.connect import (
    PostgresStorageAdapter,
    connect,
    connect_engine,
    drop_schema,
    isolated,
)

__all__ = ["PostgresStorageAdapter", "connect", "connect_engine", "drop_schema", "isolated"]
