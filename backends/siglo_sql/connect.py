"""Options shared by the SQL backends, and assembling a :class:`~siglo.Backend`.

Options are keyword arguments of ``connect`` or query parameters of the URL (read by
:mod:`siglo.urls` with :data:`CONVERTERS`); a keyword argument wins over the URL. Every
option given either way that a URL can say (all but ``clock``) is written back into
:attr:`Backend.url` (:func:`travelling`), so ``siglo.connect(backend.url)`` in another
process reaches the same tables with the same settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from siglo import urls
from siglo.backend import Backend
from siglo.clock import Clock
from siglo.errors import InvalidArgumentError
from siglo.settings import DEFAULTS
from siglo_sql.adapter import SqlStorageAdapter
from siglo_sql.coordination import (
    SqlIdempotencyStore,
    SqlLock,
    SqlNonceStore,
)
from siglo_sql.database import Database
from siglo_sql.migrations import ensure_schema
from siglo_sql.schema import DEFAULT_PREFIX, build_tables, check_identifier
from siglo_sql.statements import build_statements

__all__ = [
    "ADAPTER_OPTIONS",
    "CONVERTERS",
    "SqlSettings",
    "assemble_backend",
    "split_url_options",
    "take_options",
    "timeout_option",
    "travelling",
]

ADAPTER_OPTIONS: Final = frozenset(
    {
        "checkpoint_ttl_ms",
        "cache_ttl_ms",
        "claim_lease_ms",
        "workflow_lock_timeout_ms",
        "workflow_lock_ttl_ms",
        "clean_batch_size",
        "incremental_min_bytes",
    }
)
COMMON_OPTIONS: Final = ADAPTER_OPTIONS | {
    "clock",
    "auto_migrate",
    "table_prefix",
    "idempotency_ttl_ms",
    "idempotency_lease_ms",
    "command_timeout_ms",
}
CONVERTERS: Final[dict[str, urls.Converter]] = {
    **dict.fromkeys(ADAPTER_OPTIONS, urls.integer),
    "checkpoint_ttl_ms": urls.optional_integer,  # none: kept until removed
    "incremental_min_bytes": urls.optional_integer,  # none: every document whole
    "idempotency_ttl_ms": urls.optional_integer,  # none: the default, as on Redis
    "idempotency_lease_ms": urls.optional_integer,
    "busy_timeout_ms": urls.integer,
    "pool_min_size": urls.integer,
    "pool_max_size": urls.integer,
    "pool_timeout_ms": urls.integer,
    "connect_timeout_ms": urls.integer,
    "prepare_threshold": urls.optional_integer,  # none: never prepare
    "command_timeout_ms": urls.optional_integer,  # none: calls are not bounded
    "auto_migrate": urls.boolean,
}
"""How each SQL option given in a URL's query is read (any other option is text)."""


def split_url_options(url: str, known: frozenset[str]) -> tuple[str, dict[str, Any]]:
    """``url`` without the query parameters in ``known``, and those parameters typed."""
    return urls.split_options(url, {name: CONVERTERS.get(name, urls.text) for name in known})


def travelling(options: Mapping[str, Any], url_options: frozenset[str]) -> dict[str, Any]:
    """The options given (the URL's and the keywords, merged) that ride in
    :attr:`Backend.url`: each one a URL can say (``url_options``), so that a worker
    connected with ``backend.url`` runs as the process that connected first. A text
    option given ``None`` (``table_prefix``, ``schema``) is left to
    :meth:`SqlSettings.url_options`, which writes what it means: written as it is, it
    would read back as the text ``none``."""
    return {
        name: value
        for name, value in options.items()
        if name in url_options and not (value is None and name not in CONVERTERS)
    }


def timeout_option(db: Database) -> dict[str, Any]:
    """``command_timeout_ms`` for the backend's URL when it is not the default, so that
    ``siglo.connect(backend.url)`` in another process bounds its calls alike."""
    timeout = db.command_timeout_ms
    if timeout == DEFAULTS.command_timeout_ms:
        return {}
    return {"command_timeout_ms": "none" if timeout is None else timeout}


def take_options(
    options: dict[str, Any],
    url_options: Mapping[str, Any],
    allowed: frozenset[str],
    *,
    backend: str,
) -> dict[str, Any]:
    """Keyword options over URL options, a text value read as the URL's query would be
    (:func:`siglo.urls.typed_keywords`: ``checkpoint_ttl_ms="none"`` in a settings
    file's ``[options]``); an unknown keyword is an error naming it and the closest
    known one, as a URL option's is (:func:`siglo.urls.unknown_option_error`)."""
    unknown = set(options) - allowed
    if unknown:
        raise urls.unknown_option_error(backend, unknown, allowed, where="keyword")
    merged = dict(url_options)
    merged.update(urls.typed_keywords(options, CONVERTERS))
    return merged


class SqlSettings:
    """The options every SQL backend takes, validated."""

    def __init__(self, options: dict[str, Any], *, schema: str | None = None) -> None:
        self.clock: Clock | None = options.pop("clock", None)
        self.auto_migrate = options.pop("auto_migrate", True)
        if not isinstance(self.auto_migrate, bool):
            raise InvalidArgumentError(
                f"auto_migrate must be True or False, got {self.auto_migrate!r}"
            )
        prefix = options.pop("table_prefix", DEFAULT_PREFIX)
        # None or "" is no prefix; any other value is checked (a falsy 0 or False was
        # taken for no prefix, and the tables of another application used: an auditor).
        self.prefix = (
            "" if prefix is None or prefix == "" else check_identifier("table_prefix", prefix)
        )
        self.schema = check_identifier("schema", schema) if schema is not None else None
        # None (`none` in a URL or a settings file) is the default, as on Redis: before,
        # it reached the store as "default_ttl_ms is required", naming no option given.
        ttl = options.pop("idempotency_ttl_ms", None)
        lease = options.pop("idempotency_lease_ms", None)
        self.idempotency_ttl_ms = DEFAULTS.idempotency_ttl_ms if ttl is None else ttl
        self.idempotency_lease_ms = DEFAULTS.idempotency_lease_ms if lease is None else lease
        self.adapter_options = {k: options.pop(k) for k in list(options) if k in ADAPTER_OPTIONS}

    def url_options(self) -> dict[str, Any]:
        """What must travel in the URL for another process to reach the same tables."""
        options: dict[str, Any] = {}
        if self.prefix != DEFAULT_PREFIX:
            options["table_prefix"] = self.prefix
        if self.schema is not None:
            options["schema"] = self.schema
        return options

    async def on_open(self, db: Database) -> None:
        """The start-up schema check (and migration when ``auto_migrate``)."""
        await ensure_schema(db, self.prefix, self.schema, auto_migrate=self.auto_migrate)


def assemble_backend(
    name: str,
    url: str,
    db: Database,
    settings: SqlSettings,
    adapter_cls: type[SqlStorageAdapter],
) -> Backend:
    """The adapter, idempotency store, lock and nonce store over one database."""
    tables = build_tables(settings.prefix, settings.schema)
    postgres = db.dialect_name == "postgresql"
    statements = build_statements(
        tables,
        db.sa_dialect,
        for_update=" FOR UPDATE" if postgres else "",
        writable_ctes=postgres,
        style=db.sql,
    )
    clock = settings.clock
    adapter = adapter_cls(
        db,
        statements,
        clock=clock,
        table_prefix=settings.prefix,
        schema=settings.schema,
        **settings.adapter_options,
    )
    return Backend(
        name=name,
        url=url,
        adapter=adapter,
        idempotency=SqlIdempotencyStore(
            db,
            statements,
            clock=clock,
            default_ttl_ms=settings.idempotency_ttl_ms,
            default_lease_ms=settings.idempotency_lease_ms,
        ),
        lock=SqlLock(db, statements, clock=clock),
        nonces=SqlNonceStore(db, statements, clock=clock),
        # The adapter closes the database too; closing twice is harmless.
        on_close=[db.aclose],
    )
