"""The shared layer of siglo's SQL backends (SQLite and PostgreSQL).

SQLAlchemy Core describes the tables (:mod:`~siglo.backends.sql.schema`) and compiles
the DDL of the versioned migrations (:mod:`~siglo.backends.sql.migrations`); the hot
statements (:mod:`~siglo.backends.sql.statements`) run on the driver connection of a
:class:`~siglo.backends.sql.database.Database`. The adapter and the idempotency store,
lock and nonce store are written once here; ``siglo.backends.sqlite`` and
``siglo.backends.postgres`` only connect.
"""

from siglo.backends.sql.adapter import SqlStorageAdapter
from siglo.backends.sql.coordination import SqlIdempotencyStore, SqlLock, SqlNonceStore
from siglo.backends.sql.database import Database
from siglo.backends.sql.migrations import MIGRATIONS, ensure_schema, migrate, read_version
from siglo.backends.sql.schema import SCHEMA_VERSION, build_tables

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
