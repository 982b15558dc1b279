"""The shared layer of siglo's SQL backends (SQLite and PostgreSQL).

SQLAlchemy Core describes the tables (:mod:`~siglo_sql.schema`) and compiles
the DDL of the versioned migrations (:mod:`~siglo_sql.migrations`); the hot
statements (:mod:`~siglo_sql.statements`) run on the driver connection of a
:class:`~siglo_sql.database.Database`. The adapter and the idempotency store,
lock and nonce store are written once here; ``siglo_sqlite`` and
``siglo_postgres`` only connect.
"""

from siglo_sql.adapter import SqlStorageAdapter
from siglo_sql.coordination import SqlIdempotencyStore, SqlLock, SqlNonceStore
from siglo_sql.database import Database
from siglo_sql.migrations import MIGRATIONS, ensure_schema, migrate, read_version
from siglo_sql.schema import SCHEMA_VERSION, build_tables

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Database",
    "SqlIdempotencyStore",
    "SqlLock",
    "SqlNonceStore",
    "SqlStorageAdapter",
    "build_tables",
    "ensure_schema",
    "migrate",
    "read_version",
]
