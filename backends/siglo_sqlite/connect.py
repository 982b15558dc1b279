"""``sqlite:///path.db`` (a file, shared by processes) and ``sqlite://`` (private memory)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import unquote, urlsplit

from siglo import urls
from siglo.backend import Backend
from siglo.errors import InvalidArgumentError, StorageAdapterError
from siglo.settings import DEFAULTS
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
from siglo_sqlite.database import SqliteDatabase

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["SqliteStorageAdapter", "connect", "connect_engine", "isolated", "is_memory_url"]

SCHEMES: Final = ("sqlite", "sqlite+aiosqlite")
SQLITE_OPTIONS: Final = COMMON_OPTIONS | {"busy_timeout_ms", "synchronous"}
URL_OPTIONS: Final = SQLITE_OPTIONS - {"clock"}
"""The options an ``sqlite://`` URL's query may set; any other name is refused."""


class SqliteStorageAdapter(SqlStorageAdapter):
    """The SQL storage adapter on SQLite."""

    name: ClassVar[str] = "sqlite"
    max_document_bytes: int | None = 1_000_000_000
    """SQLite's default SQLITE_MAX_LENGTH: the longest value one column holds."""


def _path_of(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidArgumentError(f"not an sqlite:// URL: {urls.mask_credentials(url)!r}")
    if parts.netloc and parts.netloc != "localhost":
        raise InvalidArgumentError(
            f"sqlite URLs have no host: use sqlite:///relative.db or sqlite:////absolute.db, "
            f"got {urls.mask_credentials(url)!r}"
        )
    # SQLAlchemy's convention: sqlite:///rel.db is relative, sqlite:////abs.db absolute.
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else unquote(parts.path)
    if parts.netloc:  # sqlite://localhost/abs.db
        path = unquote(parts.path)
    return None if path in ("", ":memory:") else path


def is_memory_url(url: str) -> bool:
    """Whether ``url`` names a private in-memory database (one process only)."""
    return _path_of(url) is None


def connect(url: str = "sqlite://", **options: Any) -> Backend:
    """An SQLite backend. Connects lazily: the first call opens the file and checks
    (or, with ``auto_migrate=True``, the default, migrates) the schema.

    Options (keyword, or URL query parameter): ``table_prefix`` (default ``siglo_``),
    ``auto_migrate``, ``busy_timeout_ms`` (default 10000), ``command_timeout_ms`` (default
    10000, as Redis; ``None`` for none: the bound on each call's waits), ``synchronous`` (default
    ``NORMAL``), ``clock``, ``checkpoint_ttl_ms``, ``cache_ttl_ms``, ``claim_lease_ms``,
    ``workflow_lock_timeout_ms``, ``workflow_lock_ttl_ms``, ``idempotency_ttl_ms``,
    ``idempotency_lease_ms``,
    ``clean_batch_size``.
    """
    # SQLite has no driver parameters in the URL: any other name is a typo that would
    # otherwise be ignored.
    urls.refuse_unknown(url, URL_OPTIONS, backend="sqlite")
    base, url_options = split_url_options(url, URL_OPTIONS)
    path = _path_of(base)
    merged = take_options(options, url_options, SQLITE_OPTIONS, backend="sqlite")
    return _build(url, base, path, merged, engine=None, given=travelling(merged, URL_OPTIONS))


def connect_engine(engine: AsyncEngine, **options: Any) -> Backend:
    """An SQLite backend on an application's own ``sqlite+aiosqlite`` ``AsyncEngine``.

    siglo checks one connection out of the engine for its lifetime and returns it on
    close; it never disposes the engine. Options as for :func:`connect`.
    """
    url = engine.url.render_as_string(hide_password=True)
    if engine.dialect.name != "sqlite" or engine.dialect.driver != "aiosqlite":
        raise InvalidArgumentError(
            "connect_engine() needs an sqlite+aiosqlite AsyncEngine, "
            f"got {urls.mask_credentials(url)!r}"
        )
    merged = take_options(options, {}, SQLITE_OPTIONS, backend="sqlite")
    database = engine.url.database
    path = None if database in (None, "", ":memory:") else database
    return _build(url, url, path, merged, engine=engine)


def _build(
    url: str,
    base: str,
    path: str | None,
    options: dict[str, Any],
    *,
    engine: AsyncEngine | None,
    given: Mapping[str, Any] | None = None,
) -> Backend:
    """The backend; ``given``: the options that ride in its URL (:func:`travelling`)."""
    settings = SqlSettings(options)
    db = SqliteDatabase(
        path,
        busy_timeout_ms=options.pop("busy_timeout_ms", DEFAULTS.busy_timeout_ms),
        synchronous=options.pop("synchronous", "NORMAL"),
        engine=engine,
        on_open=settings.on_open,
        command_timeout_ms=options.pop("command_timeout_ms", DEFAULTS.command_timeout_ms),
    )
    backend_url = (
        urls.with_options(base, {**(given or {}), **settings.url_options(), **timeout_option(db)})
        if engine is None
        else url
    )
    backend = assemble_backend("sqlite", backend_url, db, settings, SqliteStorageAdapter)
    backend.url_shares_storage = path is not None
    return backend


@asynccontextmanager
async def isolated(url: str = "sqlite://", **options: Any) -> AsyncIterator[Backend]:
    """A backend on private storage: a new temporary file in a new directory beside the
    URL's file (both removed afterwards; the URL's file is not touched), a new private
    in-memory database for ``sqlite://``."""
    urls.refuse_unknown(url, URL_OPTIONS, backend="sqlite")
    base, url_options = split_url_options(url, URL_OPTIONS)
    given = _path_of(base)
    if given is None:
        backend = connect(url, **options)
        try:
            yield backend
        finally:
            await backend.aclose()
        return
    # Beside the file the URL names, so that a directory siglo cannot write is found
    # here (the file itself is never touched).
    beside = os.path.dirname(os.path.abspath(given))  # noqa: ASYNC240  (string work, no I/O)
    try:
        directory = tempfile.mkdtemp(prefix="siglo-sqlite-", dir=beside)
    except OSError as exc:
        raise StorageAdapterError(
            f"sqlite: cannot create a database in {beside!r} (for {given!r}): {exc.strerror or exc}"
        ) from exc
    path = os.path.join(directory, "siglo.db")
    try:
        # path is absolute, so the URL reads sqlite:////tmp/…: any process finds it.
        backend = connect(urls.with_options(f"sqlite:///{path}", url_options), **options)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        yield backend
    finally:
        await backend.aclose()
        shutil.rmtree(directory, ignore_errors=True)
