"""Offloaded values in PostgreSQL (``blob_url = "postgresql://…?schema=app"``): one row a
blob in ``<schema>.<table_prefix>blobs`` (``digest`` text primary key, ``body`` bytea,
``keep_until`` bigint), made when the store is first used (SPEC §13, :mod:`siglo.blobs`).

Each change is one statement: a put that finds the blob only raises its keep-until (no
bytes sent), one that does not inserts it (``ON CONFLICT`` raises the keep-until of a
concurrent put's row); the collector's removal is a ``DELETE … WHERE keep_until < …``, so
a blob refreshed since the collector looked stays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any, Final

import psycopg
from psycopg_pool import AsyncConnectionPool

from siglo import urls
from siglo.blobs import BlobStore, check_digest
from siglo.errors import OutcomeUnknownError, StorageAdapterError
from siglo.settings import DEFAULTS
from siglo.validation import ms_as_seconds
from siglo_postgres.connect import (
    _conninfo,
    _libpq_parameters,
    _pgbouncer,
    check_pool_options,
    check_pool_sizes,
)
from siglo_postgres.liveness import closed_while_idle, lost_in_flight
from siglo_postgres.watches import SEVER_AFTER_MS, Watches
from siglo_sql.connect import split_url_options
from siglo_sql.schema import DEFAULT_PREFIX, check_identifier

__all__ = ["PostgresBlobStore", "open_store"]

BACKSTOP_S: Final = 1.0
"""How long past a call's own end at its bound (the server's cancel, the cut a second
later) the wrapper waits before cancelling it."""
POOL_MAX: Final = DEFAULTS.pool_max_size
"""The most connections a blob store opens (the backend's default pool size)."""


class PostgresBlobStore(BlobStore):
    """Blobs in one PostgreSQL table (see the module), through a pool of connections
    opened on first use: calls run side by side, so one held up (a row another session
    locks, a large upload) delays no other, and a call cut off by its bound takes only
    its own connection with it.

    The table is made on first use only where it is missing: a role allowed to read and
    write it but not to create anything (``CREATE … IF NOT EXISTS`` still needs the
    privilege to create) uses a table an administrator made, and processes that meet a
    fresh store at once make it one at a time (an advisory lock of the table's name:
    concurrent ``IF NOT EXISTS`` DDL is not race-safe in PostgreSQL)."""

    def __init__(
        self,
        conninfo: str,
        table: str,
        url: str,
        *,
        max_size: int = POOL_MAX,
        min_size: int = 1,
        pool_timeout_s: float = DEFAULTS.pool_timeout_ms / 1000,
        prepare_threshold: int | None = 5,
    ) -> None:
        self._conninfo = conninfo
        self._table = table
        self.url = url
        self._max_size = max_size
        self._min_size = min_size
        self._pool_timeout_s = pool_timeout_s
        self._prepare_threshold = prepare_threshold
        self._pool: AsyncConnectionPool[Any] | None = None
        self._opening = asyncio.Lock()
        self._watches: Watches | None = None

    def use_bound(self, command_timeout_ms: int) -> float:
        # A call cut off by a cancellation at the bound left psycopg waiting up to 10 s
        # for a stalled server (a black-box auditor: 10.3 s at a bound of 300 ms): the
        # call is ended here instead, as the backend's are — cancelled on the server,
        # its connection cut SEVER_AFTER_MS later — and cancelled only as a backstop.
        self._watches = Watches(ms_as_seconds(command_timeout_ms))
        return SEVER_AFTER_MS / 1000 + BACKSTOP_S

    async def _opened(self) -> AsyncConnectionPool[Any]:
        pool = self._pool
        if pool is not None:
            return pool
        async with self._opening:
            if self._pool is None:
                pool = AsyncConnectionPool(
                    self._conninfo,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    timeout=self._pool_timeout_s,
                    kwargs={"autocommit": True, "prepare_threshold": self._prepare_threshold},
                    check=_check,
                    open=False,
                    name="siglo-blobs",
                )
                await pool.open(wait=False)
                try:
                    async with pool.connection() as conn:
                        await self._make_table(conn)
                except BaseException:
                    # Not waiting for a worker stuck connecting to a stalled server
                    # (psycopg_pool's default waits 5 s past the call's bound).
                    await pool.close(timeout=0.1)
                    raise
                self._pool = pool
            return self._pool

    async def _make_table(self, conn: Any) -> None:
        """Make the table (and its schema) unless it exists, one process at a time."""
        cursor = await conn.execute("SELECT to_regclass(%s)", (self._table,))
        if (await cursor.fetchone())[0] is not None:
            return
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._table,))
            cursor = await conn.execute("SELECT to_regclass(%s)", (self._table,))
            if (await cursor.fetchone())[0] is not None:
                return  # made by another process while this one waited
            schema = self._table.rpartition(".")[0]
            if schema:
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._table} (digest text PRIMARY KEY, "
                "body bytea NOT NULL, keep_until bigint NOT NULL)"
            )

    async def _run(
        self, doing: str, sql: str, params: tuple[Any, ...], *, writes: bool = True
    ) -> list[Any]:
        conn = None
        try:
            pool = await self._opened()
            async with pool.connection() as conn:
                watches = self._watches
                if watches is None:
                    cursor = await conn.execute(sql, params)
                    return list(await cursor.fetchall()) if cursor.description else []
                watch = watches.start(asyncio.get_running_loop())
                watch.conn = conn
                try:
                    cursor = await conn.execute(sql, params)
                    rows = list(await cursor.fetchall()) if cursor.description else []
                except psycopg.Error as exc:
                    if watch.expired:
                        # Cancelled on the server or cut at the bound: the wrapper
                        # (BoundedBlobStore) says it timed out, and what that means.
                        raise TimeoutError(f"{doing} past its bound") from exc
                    raise
                finally:
                    watches.end(watch)
                    if watch.expired:
                        # A cancel sent for it may land later: not given back to the pool.
                        with suppress(Exception):
                            await conn.close()
                if watch.expired:
                    raise TimeoutError(f"{doing} past its bound")  # done, but too late
                return rows
        except psycopg.Error as exc:
            if writes and lost_in_flight(exc, conn):
                raise OutcomeUnknownError(
                    f"blob store {self.url}: {doing}",
                    f"the connection was lost with it in flight, and the server may have run "
                    f"it ({exc!r})",
                ) from exc
            raise StorageAdapterError(f"blob store {self.url}: {doing} failed: {exc!r}") from exc

    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        keep = max(int(time.time() * 1000), keep_until_ms or 0)
        t = self._table
        refreshed = await self._run(
            "a put",
            f"UPDATE {t} SET keep_until = GREATEST(keep_until, %s) WHERE digest = %s RETURNING 1",
            (keep, check_digest(digest)),
        )
        if not refreshed:
            await self._run(
                "a put",
                f"INSERT INTO {t} (digest, body, keep_until) VALUES (%s, %s, %s) "
                f"ON CONFLICT (digest) DO UPDATE SET keep_until = "
                f"GREATEST({t}.keep_until, excluded.keep_until)",
                (digest, data, keep),
            )

    async def get(self, digest: str) -> bytes | None:
        rows = await self._run(
            "a get",
            f"SELECT body FROM {self._table} WHERE digest = %s",
            (check_digest(digest),),
            writes=False,
        )
        return bytes(rows[0][0]) if rows else None

    async def delete(self, digest: str) -> bool:
        rows = await self._run(
            "a delete",
            f"DELETE FROM {self._table} WHERE digest = %s RETURNING 1",
            (check_digest(digest),),
        )
        return bool(rows)

    async def delete_stale(self, digest: str, kept_before_ms: int) -> bool:
        rows = await self._run(
            "a removal",
            f"DELETE FROM {self._table} WHERE digest = %s AND keep_until < %s RETURNING 1",
            (check_digest(digest), kept_before_ms),
        )
        return bool(rows)

    async def scan(self) -> AsyncIterator[tuple[str, int]]:
        rows = await self._run(
            "a scan", f"SELECT digest, keep_until FROM {self._table}", (), writes=False
        )
        for digest, keep in rows:
            yield str(digest), int(keep)

    async def aclose(self) -> None:
        if self._pool is not None:
            # Its connections closed at once; a worker still connecting to a stalled
            # server is not waited for (psycopg_pool's default waits 5 s).
            await self._pool.close(timeout=0.1)
            self._pool = None


async def _check(conn: Any) -> None:
    """The pool's check of a connection it hands out: one the server closed meanwhile
    (a restart) is replaced, not handed out to fail. Closed here first: psycopg_pool
    puts a connection that failed its check back when it still looks usable, and then
    hands the same dead one out again until the call's bound (a black-box auditor: no
    offloaded value read again after a restart)."""
    if closed_while_idle(conn):
        await conn.close()
        raise psycopg.OperationalError("closed by the server while idle")


BLOB_OPTIONS: Final = frozenset(
    {
        "schema",
        "table_prefix",
        "pool_min_size",
        "pool_max_size",
        "pool_timeout_ms",
        "connect_timeout_ms",
        "prepare_threshold",
        "pgbouncer",
    }
)
"""The backend options a blob store URL takes, each applied as the backend applies it.
The others a backend URL takes (``command_timeout_ms``: the blob store has its backend's
bound; ``checkpoint_ttl_ms`` …) are refused: accepted and ignored, they looked applied
(a black-box auditor: ``?pool_max_size=1`` opened ten connections)."""


def open_store(url: str) -> PostgresBlobStore:
    """The store at ``postgresql://…[?schema=S][&table_prefix=P]`` (table ``P + "blobs"``,
    in the connection's schema when none is named), with the pool options
    (``pool_min_size``, ``pool_max_size``, ``pool_timeout_ms``, ``connect_timeout_ms``)
    and ``prepare_threshold`` / ``pgbouncer`` of a backend URL; the other query
    parameters are libpq's, and any other name is refused."""
    urls.refuse_unknown(
        url,
        BLOB_OPTIONS,
        backend="postgresql blob store",
        driver=_libpq_parameters(),
        also="and libpq's connection parameters (sslmode, application_name, …)",
    )
    base, options = split_url_options(url, BLOB_OPTIONS)
    check_pool_options(options)
    # As a backend's (docs/backends/postgres.md): the minimum was lowered to the maximum.
    check_pool_sizes(options, least=1, most=POOL_MAX)
    _pgbouncer(options)  # pgbouncer=transaction: no prepared statements
    schema = options.get("schema")
    prefix = str(options.get("table_prefix", DEFAULT_PREFIX))
    check_identifier("table prefix", prefix)
    table = f'"{prefix}blobs"'
    if schema:
        table = f'"{check_identifier("schema", str(schema))}".{table}'
    max_size = int(options.get("pool_max_size", POOL_MAX))
    min_size = int(options.get("pool_min_size", 1))
    return PostgresBlobStore(
        _conninfo(base, int(options.get("connect_timeout_ms", DEFAULT_CONNECT_MS))),
        table,
        url,
        max_size=max_size,
        min_size=min_size,
        pool_timeout_s=ms_as_seconds(int(options.get("pool_timeout_ms", DEFAULTS.pool_timeout_ms))),
        prepare_threshold=options.get("prepare_threshold", 5),
    )


DEFAULT_CONNECT_MS = DEFAULTS.connect_timeout_ms
