"""The aiosqlite connection: statements on its thread, each bounded, and transactions.

aiosqlite runs every call on the connection's own thread, so each statement costs a
thread hop: one ``execute_fetchall`` per operation keeps it to one. The connection is
shared by the backend's tasks: a transaction holds an :class:`asyncio.Lock` from its
``BEGIN`` to its end, so no other task's statement runs inside it; single statements
outside a transaction go straight to the connection. Across processes SQLite's own locking
serialises writers: ``BEGIN IMMEDIATE`` takes the write lock up front where a read and a
write must be atomic, the busy timeout makes a writer wait for another, and a
"database is locked" that still comes back is retried until the call's deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Final, Protocol

import aiosqlite

from siglo.errors import SigloError, StorageAdapterError
from siglo_sql.database import Executor, Params, Row
from siglo_sqlite.connections import is_busy

__all__ = ["Bounds", "Driver"]

_SHORTEN_SLACK_MS: Final = 50
"""A call with less than its full busy wait left by this much sets a shorter one."""


class Bounds(Protocol):
    """What the driver takes from its database: the bound on a call's waits, and the
    errors that name the database."""

    @property
    def description(self) -> str: ...

    @property
    def busy_ms(self) -> int:
        """The longest one call may wait for the write lock."""
        ...

    def wrap(self, exc: BaseException, doing: str) -> StorageAdapterError: ...

    def timed_out(self, doing: str, cause: BaseException | None = None) -> StorageAdapterError: ...


class _Tx:
    def __init__(self, driver: Driver, conn: aiosqlite.Connection, deadline: float) -> None:
        self._driver = driver
        self._conn = conn
        self._deadline = deadline

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._driver.run(self._conn, sql, params, self._deadline)


class Driver:
    """The aiosqlite connection of one database (``conn``, set while it is open) and the
    lock its transactions hold."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.conn: aiosqlite.Connection | None = None
        self.lock = asyncio.Lock()
        """Held by a transaction from its ``BEGIN`` to its end."""

    def connection(self) -> aiosqlite.Connection:
        """The connection; :class:`StorageAdapterError` once the database is closed."""
        conn = self.conn
        if conn is None:
            raise StorageAdapterError(f"{self.bounds.description} is closed")
        return conn

    def deadline(self) -> float:
        """When a call starting now must be over (``time.monotonic()``)."""
        return time.monotonic() + self.bounds.busy_ms / 1000

    async def fetch(self, sql: str, params: Params, start: float) -> list[Row]:
        """One statement of a call asked at ``start``, outside any transaction."""
        conn = self.connection()
        # Its deadline (start + busy_ms) is worked out only when a statement has to
        # wait, as few do (a call fewer on every statement).
        busy: Exception | None = None
        if not self.lock.locked():
            # No transaction is open, and none can open before this statement runs:
            # aiosqlite runs a connection's calls in the order they were submitted, and
            # a transaction submits its BEGIN only once it holds the lock. So single
            # statements need not wait for each other (each is its own autocommit
            # transaction); 32 callers keep the connection's thread busy instead of
            # taking turns through the event loop.
            rows = await self._attempt(conn, sql, params)
            if not isinstance(rows, Exception):
                return rows
            busy = rows
            # Busy: retried under the lock, where a transaction cannot open in the gap.
        deadline = start + self.bounds.busy_ms / 1000
        await self.take_lock(deadline)
        try:
            return await self.run(conn, sql, params, deadline, busy)
        finally:
            self.lock.release()

    async def run(
        self,
        conn: aiosqlite.Connection,
        sql: str,
        params: Params,
        deadline: float,
        busy: Exception | None = None,
    ) -> list[Row]:
        """Run one statement, retrying "database is locked" until ``deadline`` (``busy``:
        the busy error of an attempt made before)."""
        delay = 0.001
        shortened = False
        busy_ms = self.bounds.busy_ms
        try:
            while True:
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0:
                    if busy is not None:
                        raise self.bounds.timed_out("waiting for the write lock", busy) from busy
                    # The deadline bounds waits, not work: a statement that meets no lock
                    # runs however long the call has taken so far (a migration on a slow
                    # disk, busy_timeout_ms=0), with one attempt that does not wait.
                    remaining_ms = 0
                if remaining_ms < busy_ms - _SHORTEN_SLACK_MS:
                    # A retry, or a call that queued first: SQLite's busy handler must
                    # not wait past this call's deadline.
                    await conn.execute(f"PRAGMA busy_timeout = {remaining_ms}")
                    shortened = True
                rows = await self._attempt(conn, sql, params)
                if not isinstance(rows, Exception):
                    return rows
                # The busy handler gave up, or was not consulted (SQLite skips it where
                # waiting could deadlock): retry until the deadline.
                busy = rows
                await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(delay * 2, 0.05)
        finally:
            if shortened:
                with suppress(Exception):
                    await asyncio.shield(conn.execute(f"PRAGMA busy_timeout = {busy_ms}"))

    async def _attempt(
        self, conn: aiosqlite.Connection, sql: str, params: Params
    ) -> list[Row] | Exception:
        """One try of a statement: its rows, or SQLite's "database is locked" to retry
        (any other failure is raised, wrapped)."""
        try:
            return list(await conn.execute_fetchall(sql, params))  # type: ignore[arg-type]
        except SigloError:
            raise
        except Exception as exc:
            if not is_busy(exc):
                raise self.bounds.wrap(exc, "running a statement") from exc
            return exc

    async def take_lock(self, deadline: float) -> None:
        """The transaction lock, waiting no later than ``deadline``."""
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self.lock.acquire()
        except TimeoutError as exc:
            raise self.bounds.timed_out("waiting for a transaction in progress") from exc

    @asynccontextmanager
    async def transaction(self, start: float | None = None) -> AsyncIterator[Executor]:
        """A ``BEGIN IMMEDIATE`` transaction of a call asked at ``start`` (``None``: now);
        commits unless the block raises."""
        conn = self.connection()
        deadline = self.deadline() if start is None else start + self.bounds.busy_ms / 1000
        await self.take_lock(deadline)
        try:
            try:
                await self.run(conn, "BEGIN IMMEDIATE", (), deadline)
                yield _Tx(self, conn, deadline)
                await self.run(conn, "COMMIT", (), deadline)
            except BaseException:
                await self._rollback(conn)
                raise
        finally:
            self.lock.release()

    @staticmethod
    async def _rollback(conn: aiosqlite.Connection) -> None:
        # aiosqlite runs a connection's calls in order, so this ROLLBACK comes after every
        # statement of the transaction, even one still running for a cancelled task. It
        # is awaited through any further cancellation, under the lock: the next user of
        # the connection must never find a transaction left open.
        task = asyncio.ensure_future(conn.execute("ROLLBACK"))
        while True:
            try:
                await asyncio.shield(task)
                return
            except asyncio.CancelledError:
                if task.done():
                    return
            except Exception:  # no transaction was open (BEGIN itself failed)
                return
