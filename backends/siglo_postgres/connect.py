"""``postgresql://…`` and ``postgresql+psycopg://…`` URLs, or an application's engine."""

from __future__ import annotations

import functools
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import urlsplit

from siglo import urls
from siglo.backend import Backend
from siglo.errors import InvalidArgumentError
from siglo.settings import DEFAULTS
from siglo.validation import require_count
from siglo_postgres.database import PostgresDatabase
from siglo_sql.adapter import SqlStorageAdapter
from siglo_sql.connect import (
    COMMON_OPTIONS,
    SqlSettings,
    assemble_backend,
    split_url_options,
    take_options,
    timeout_option,
    travelling,
)
from siglo_sql.schema import check_identifier

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["PostgresStorageAdapter", "connect", "connect_engine", "drop_schema", "isolated"]

SCHEMES: Final = ("postgresql", "postgresql+psycopg", "postgres")
POSTGRES_OPTIONS: Final = COMMON_OPTIONS | {
    "schema",
    "pool_min_size",
    "pool_max_size",
    "pool_timeout_ms",
    "connect_timeout_ms",
    "prepare_threshold",
    "command_timeout_ms",
    "pgbouncer",
}
URL_OPTIONS: Final = POSTGRES_OPTIONS - {"clock"}
"""siglo's options a ``postgresql://`` URL's query may set; libpq's parameters pass on."""
PGBOUNCER_MODES: Final = ("transaction", "session")
_MAX_CONNECT_TIMEOUT_S: Final = 2**31 - 1
"""The longest ``connect_timeout`` libpq reads (seconds, a C ``int``)."""


class PostgresStorageAdapter(SqlStorageAdapter):
    """The SQL storage adapter on PostgreSQL."""

    name: ClassVar[str] = "postgres"
    max_document_bytes: int | None = 1_073_741_823
    """PostgreSQL's largest field value (1 GiB less a byte): the document is one bytea."""


def _conninfo(base: str, connect_timeout_ms: int) -> str:
    """A libpq URI: the driver suffix dropped, a connect timeout added if none is set."""
    scheme, rest = base.split("://", 1)
    if scheme.lower() not in SCHEMES:
        raise InvalidArgumentError(f"not a postgresql:// URL: {base!r}")
    conninfo = "postgresql://" + rest
    if "connect_timeout=" not in urlsplit(conninfo).query:
        # libpq wants whole seconds, in a C int: a longer timeout is refused as a "bad
        # value" at the first connection, so it is capped (about 68 years).
        seconds = min(max(1, -(-connect_timeout_ms // 1000)), _MAX_CONNECT_TIMEOUT_S)
        conninfo = urls.with_options(conninfo, {"connect_timeout": seconds})
    return conninfo


def _describe(url: str) -> str:
    parts = urlsplit(url)
    # The hosts as written: a multi-host URL (h1:p1,h2:p2) has no single port.
    hosts = parts.netloc.rpartition("@")[2] or "localhost"
    return f"postgresql {hosts}{parts.path or ''}"


def _pgbouncer(options: dict[str, Any]) -> dict[str, Any]:
    """Settings for a server reached through PgBouncer (``pgbouncer=transaction``).

    In transaction pooling each transaction may run on a different server connection, so
    nothing may outlive one: PgBouncer before 1.21 does not carry prepared statements
    across, hence none are prepared unless ``prepare_threshold`` says otherwise. siglo
    uses no other session state (no ``SET``, no session advisory lock, no ``LISTEN``).
    Returns what must travel in :attr:`Backend.url` for another process to connect alike.
    """
    mode = options.pop("pgbouncer", None)
    explicit = "prepare_threshold" in options
    if mode is not None and mode not in PGBOUNCER_MODES:
        raise InvalidArgumentError(
            f"pgbouncer must be one of {', '.join(PGBOUNCER_MODES)}, got {mode!r} "
            "(statement pooling cannot run siglo's transactions)"
        )
    if mode == "transaction" and not explicit:
        options["prepare_threshold"] = None
    travel: dict[str, Any] = {}
    if mode is not None:
        travel["pgbouncer"] = mode
    if explicit:
        threshold = options["prepare_threshold"]
        travel["prepare_threshold"] = "none" if threshold is None else threshold
    return travel


def connect(url: str, **options: Any) -> Backend:
    """A PostgreSQL backend. Connects lazily: the first call opens the pool and checks
    (or, with ``auto_migrate=True``, the default, migrates) the schema.

    Options (keyword, or URL query parameter): ``schema`` (default: the connection's
    ``search_path``, normally ``public``), ``table_prefix`` (default ``siglo_``),
    ``auto_migrate``, ``pool_min_size`` (1), ``pool_max_size`` (10), ``pool_timeout_ms``
    (10000: the wait for a free connection), ``connect_timeout_ms`` (10000),
    ``command_timeout_ms`` (10000, as Redis; ``None`` for none: the bound on every call),
    ``prepare_threshold`` (0; ``None`` to never prepare), ``pgbouncer``
    (``transaction`` behind a transaction-pooling PgBouncer: prepares nothing unless
    ``prepare_threshold`` is given; ``session``: as direct), ``clock``,
    ``checkpoint_ttl_ms``, ``cache_ttl_ms``, ``claim_lease_ms``,
    ``workflow_lock_timeout_ms``, ``workflow_lock_ttl_ms``, ``idempotency_ttl_ms``,
    ``idempotency_lease_ms``,
    ``clean_batch_size``. Other query parameters go to libpq (``sslmode`` …).
    """
    refuse_unknown_options(url)
    base, url_options = split_url_options(url, URL_OPTIONS)
    merged = take_options(options, url_options, POSTGRES_OPTIONS, backend="postgres")
    check_pool_options(merged)
    check_pool_sizes(merged)
    given = travelling(merged, URL_OPTIONS)
    conninfo = _conninfo(base, merged.pop("connect_timeout_ms", DEFAULTS.connect_timeout_ms))
    return _build(base, conninfo, merged, engine=None, given=given)


def check_pool_options(options: Mapping[str, Any]) -> None:
    """Refuse a pool option given a value psycopg's pool would take badly (a negative
    wait fails every connection as a pool timeout, ``True`` waits a millisecond), naming
    the option; the blob store's URL is read by the same rules."""
    for name, minimum in (
        ("pool_min_size", 0),
        ("pool_max_size", 1),
        ("pool_timeout_ms", 1),
        ("connect_timeout_ms", 1),
    ):
        if name in options:
            require_count(name, options[name], minimum=minimum)
    if options.get("prepare_threshold") is not None:
        require_count("prepare_threshold", options["prepare_threshold"], minimum=0)


def check_pool_sizes(
    options: Mapping[str, Any],
    *,
    least: int = DEFAULTS.pool_min_size,
    most: int = DEFAULTS.pool_max_size,
) -> None:
    """Refuse a ``pool_min_size`` above the ``pool_max_size`` (either given or the
    default: ``least`` and ``most``), which psycopg's pool refuses only when it opens."""
    low = options.get("pool_min_size", least)
    high = options.get("pool_max_size", most)
    if low > high:
        raise InvalidArgumentError(
            f"pool_min_size ({low}) must not be larger than pool_max_size ({high})"
        )


def refuse_unknown_options(url: str) -> None:
    """Refuse a query parameter that is neither siglo's nor libpq's, naming it (libpq
    would fail on it only at the first connection, as a connection error)."""
    libpq = _libpq_parameters()
    urls.refuse_unknown(
        url,
        URL_OPTIONS,
        backend="postgresql",
        driver=libpq,
        also="and libpq's connection parameters (sslmode, application_name, …)",
    )


@functools.cache
def _libpq_parameters() -> frozenset[str] | None:
    """The connection parameters of the installed libpq, or ``None`` without the driver
    (connecting then says which extra to install)."""
    try:
        from psycopg import pq
    except ImportError:
        return None
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def connect_engine(engine: AsyncEngine, **options: Any) -> Backend:
    """A PostgreSQL backend on an application's own ``postgresql+psycopg`` ``AsyncEngine``.

    Each operation checks a connection out of the engine's pool (so the engine's own
    connection settings apply); siglo never disposes the engine. ``schema`` and
    ``table_prefix`` choose the tables; other options as for :func:`connect`, except the
    pool settings, which are the engine's.
    """
    if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
        raise InvalidArgumentError(
            "connect_engine() needs a postgresql+psycopg AsyncEngine, got "
            f"{engine.url.render_as_string(hide_password=True)!r}"
        )
    allowed = POSTGRES_OPTIONS - {
        "pool_min_size",
        "pool_max_size",
        "pool_timeout_ms",
        "connect_timeout_ms",
        "prepare_threshold",
        "pgbouncer",  # the engine's connections are configured by the application
    }
    merged = take_options(options, {}, allowed, backend="postgres")
    base = engine.url.render_as_string(hide_password=True)
    return _build(base, "", merged, engine=engine)


def _build(
    base: str,
    conninfo: str,
    options: dict[str, Any],
    *,
    engine: AsyncEngine | None,
    given: Mapping[str, Any] | None = None,
) -> Backend:
    """The backend; ``given``: the options that ride in its URL (:func:`travelling`)."""
    schema = options.pop("schema", None)
    travel = _pgbouncer(options)
    settings = SqlSettings(options, schema=schema)
    db = PostgresDatabase(
        conninfo,
        description=_describe(base),
        pool_min_size=options.pop("pool_min_size", DEFAULTS.pool_min_size),
        pool_max_size=options.pop("pool_max_size", DEFAULTS.pool_max_size),
        pool_timeout_ms=options.pop("pool_timeout_ms", DEFAULTS.pool_timeout_ms),
        prepare_threshold=options.pop("prepare_threshold", 0),
        engine=engine,
        on_open=settings.on_open,
        command_timeout_ms=options.pop("command_timeout_ms", DEFAULTS.command_timeout_ms),
    )
    url = urls.with_options(
        base, {**(given or {}), **settings.url_options(), **timeout_option(db), **travel}
    )
    return assemble_backend("postgres", url, db, settings, PostgresStorageAdapter)


async def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (used by :func:`isolated` and tests)."""
    import psycopg  # the optional driver (siglo[postgres]): imported when used

    check_identifier("schema", schema)
    base, _ = split_url_options(url, POSTGRES_OPTIONS)
    conninfo = _conninfo(base, DEFAULTS.connect_timeout_ms)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@asynccontextmanager
async def isolated(url: str, **options: Any) -> AsyncIterator[Backend]:
    """A backend in a fresh schema ``siglo_test_<random>``, dropped afterwards."""
    schema = f"siglo_test_{secrets.token_hex(6)}"
    options["schema"] = schema
    if "command_timeout_ms" in options:
        # The schema is made under the default bound: a test's tight bound is for the
        # calls it times, and a busy machine can take longer to create the tables.
        setup = connect(url, schema=schema)
        try:
            await setup.adapter.open()  # type: ignore[attr-defined]
        finally:
            await setup.aclose()
    backend = connect(url, **options)
    try:
        yield backend
    finally:
        await backend.aclose()
        await drop_schema(url, schema)
