"""``SqliteDatabase``: which connection runs each call to an SQLite file.

One long-lived aiosqlite connection per backend, in WAL mode (:mod:`siglo_sqlite.driver`:
each statement on its thread, bounded; transactions). For files, three more plain
``sqlite3`` connections (:mod:`siglo_sqlite.connections`): a read-only one for keyed
reads and one for keyed writes, both used on the event loop's thread
(:meth:`SqliteDatabase.read`, :meth:`SqliteDatabase.write`), and one that checkpoints the
WAL on the backend's own worker thread (:mod:`siglo_sqlite.wal_checkpoints`), which also
opens them. A call that must wait for calls asked before it waits its turn on the loop
(:mod:`siglo_sqlite.call_order`), so the calls keep their order.

Every call is bounded by ``command_timeout_ms``: its waits (for this backend's own
transaction in progress, for another connection's write lock) end at the call's deadline
with :class:`~siglo.errors.StorageAdapterError`, so a lock held elsewhere never hangs a
call. The busy handler never waits past the bound either (``PRAGMA busy_timeout`` is the
smaller of ``busy_timeout_ms`` and ``command_timeout_ms``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, suppress
from functools import partial
from typing import TYPE_CHECKING, Final

import aiosqlite
from sqlalchemy.dialects import sqlite as sqlite_dialect

from siglo.errors import InvalidArgumentError, SigloError
from siglo.settings import DEFAULTS
from siglo_sql.database import Database, Executor, OnOpen, Params, Plan, Row
from siglo_sqlite.call_order import CallOrder, Place
from siglo_sqlite.connections import (
    INLINE_WRITE_MODES,
    SYNCHRONOUS_MODES,
    daemonic,
    file_pragmas,
    is_busy,
    open_checkpointer,
    open_reader,
    open_syncing_writer,
    open_writer,
)
from siglo_sqlite.driver import Driver
from siglo_sqlite.group_commit import (
    ANSWERS_PER_TURN,
    BATCH_BUDGET_S,
    BATCH_MAX,
    GAP_S,
    HOLD_S,
    Entry,
    answer_in_turns,
    settle,
)
from siglo_sqlite.wal_checkpoints import WalCheckpoints

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["SqliteDatabase"]

_MAX_BUSY_MS: Final = 2**31 - 1
"""The longest ``PRAGMA busy_timeout`` SQLite keeps (milliseconds, a C ``int``)."""


class SqliteDatabase(Database):
    """An SQLite file (or a private in-memory database when ``path`` is ``None``)."""

    dialect_name = "sqlite"
    sa_dialect = sqlite_dialect.dialect()
    coalesce_reads = True  # one connection: every statement waits for the one before
    # Its statements run on the loop's thread: answering a batch's 32 callers at once
    # made the turns of the loop that other coroutines wait for 1.4-2.3 ms long, and a
    # 1 ms sleeper woke 4 ms late at the median, 5-8 ms at p99 (issue 36's bar: 5 ms).
    answers_per_turn = ANSWERS_PER_TURN

    def __init__(
        self,
        path: str | None,
        *,
        busy_timeout_ms: int = DEFAULTS.busy_timeout_ms,
        synchronous: str = "NORMAL",
        engine: AsyncEngine | None = None,
        on_open: OnOpen | None = None,
        command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    ) -> None:
        super().__init__(
            on_open=on_open,
            description=f"sqlite {path!r}" if path else "sqlite in-memory",
            command_timeout_ms=command_timeout_ms,
        )
        if type(busy_timeout_ms) is not int or busy_timeout_ms < 0:
            raise InvalidArgumentError(
                f"busy_timeout_ms must be a non-negative integer, got {busy_timeout_ms!r}"
            )
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS_MODES:
            raise InvalidArgumentError(
                f"synchronous must be one of {', '.join(sorted(SYNCHRONOUS_MODES))}, "
                f"got {synchronous!r}"
            )
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.synchronous = synchronous.upper()
        self.engine = engine
        self._driver = Driver(self)
        """The aiosqlite connection (while open) and its transactions' lock."""
        self._order = CallOrder()
        """The calls in flight on the driver, and those waiting their turn."""
        self._reader: sqlite3.Connection | None = None
        """A second connection to the file, for :meth:`read` on the event loop's thread."""
        self._writer: sqlite3.Connection | None = None
        """A third, for :meth:`write` on the event loop's thread (files at a
        ``synchronous`` that does not sync each commit)."""
        self._syncing: sqlite3.Connection | None = None
        """At a ``synchronous`` whose commits sync (``FULL``, ``EXTRA``), the writer of
        the batches of keyed writes instead, used on :attr:`_thread` only: a commit that
        waits for the disk never holds the loop (:mod:`siglo_sqlite.group_commit`)."""
        self._wal: WalCheckpoints | None = None
        """The checkpoints of the WAL the writer appends to, on a fourth connection
        (with the writer)."""
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        """A file-backed backend's own worker thread: it opens the inline connections
        and runs the checkpoints. Its own, not the loop's default executor, which the
        application may replace (DBOS Transact sets its pool there, and shuts that pool
        down when it stops: every ``asyncio.to_thread`` after that fails)."""
        self._sa_conn: AsyncConnection | None = None
        self._collecting: list[Entry] | None = None
        """The batch of writes open to more (:mod:`siglo_sqlite.group_commit`)."""
        self._batches: set[asyncio.Task[None]] = set()
        """The tasks of the batches not committed yet."""
        self._holding_since = 0.0
        """When the inline work holding the loop now began (``time.monotonic()``)."""
        self._last_inline = 0.0
        """When the last inline call ran."""

    def exists(self) -> bool:
        return self.engine is not None or self.path is None or os.path.exists(self.path)

    # -- opening and closing ----------------------------------------------------------

    async def _connect(self) -> None:
        if self.engine is not None:
            sa_conn = await self.engine.connect()
            try:
                sa_conn = await sa_conn.execution_options(isolation_level="AUTOCOMMIT")
                raw = await sa_conn.get_raw_connection()
                conn = raw.driver_connection
            except BaseException:
                await sa_conn.close()
                raise
            self._sa_conn = sa_conn
        else:
            # isolation_level=None: no implicit BEGIN; siglo says when a transaction is.
            try:
                conn = await daemonic(
                    aiosqlite.connect(self.path or ":memory:", isolation_level=None)
                )
            except BaseException:
                # aiosqlite stops its worker thread without waiting for it; give it a
                # moment, or it may report to an event loop that has since closed.
                await asyncio.sleep(0.01)
                raise
        assert isinstance(conn, aiosqlite.Connection)
        self._driver.conn = conn
        try:
            await conn.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
            if self.path is not None:
                await self._set_up_file(conn, self.path)
        except BaseException:
            await self._disconnect()
            raise

    async def _set_up_file(self, conn: aiosqlite.Connection, path: str) -> None:
        """WAL mode and the page settings on ``conn``; the inline connections.

        Every statement here may meet a lock (other processes creating or opening the
        same file at the same moment): each waits and retries until the connect's
        deadline, like any call, and a lock held past it is a timeout naming the bound.
        """
        deadline = self._driver.deadline()
        for pragma in file_pragmas(self.synchronous):
            await self._driver.run(conn, f"PRAGMA {pragma}", (), deadline)
        if self.engine is not None:
            return
        thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="siglo-sqlite")
        self._thread = thread
        self._reader = await self._open_off_loop(open_reader, path, deadline)
        if self.synchronous in INLINE_WRITE_MODES:
            self._writer = await self._open_off_loop(open_writer, path, deadline, self.synchronous)
            checkpointer = await self._open_off_loop(
                open_checkpointer, path, deadline, self.synchronous
            )
            self._wal = WalCheckpoints(checkpointer, thread, self.description)
        else:
            self._syncing = await self._open_off_loop(
                open_syncing_writer, path, deadline, self.synchronous
            )

    async def _open_off_loop(
        self, opener: Callable[..., sqlite3.Connection], path: str, deadline: float, *args: str
    ) -> sqlite3.Connection:
        """``opener(path, wait_ms, *args)`` on :attr:`_thread`, waiting for a lock no
        later than ``deadline``."""
        wait_ms = int((deadline - time.monotonic()) * 1000)
        thread = self._thread
        assert thread is not None  # set up before any opener runs
        try:
            return await asyncio.wrap_future(thread.submit(opener, path, wait_ms, *args))
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise self.timed_out("waiting for a lock to open the file", exc) from exc
            raise

    async def _disconnect(self) -> None:
        thread, self._thread = self._thread, None
        try:
            if self._wal is not None:
                # A checkpoint under way ends first (milliseconds): its connection is
                # closed below.
                await self._wal.stop()
        finally:
            syncing, self._syncing = self._syncing, None
            if thread is not None:
                if syncing is not None:
                    # Closed on its thread, after any batch it is running.
                    thread.submit(syncing.close)
                thread.shutdown(wait=False)
            await self._close_connections()

    async def _close_connections(self) -> None:
        conn, self._driver.conn = self._driver.conn, None
        sa_conn, self._sa_conn = self._sa_conn, None
        reader, self._reader = self._reader, None
        writer, self._writer = self._writer, None
        wal, self._wal = self._wal, None
        for inline in (reader, writer, None if wal is None else wal.conn):
            if inline is not None:
                with suppress(Exception):
                    inline.close()
        if sa_conn is not None:
            with suppress(Exception):
                await sa_conn.close()  # back to the user's pool; their engine stays open
        elif conn is not None:
            with suppress(Exception):
                await conn.close()

    # -- bounds -----------------------------------------------------------------------

    @property
    def bound_text(self) -> str:
        # The busy wait is the smaller of the two.
        return (
            f"busy_timeout_ms={self.busy_timeout_ms}, command_timeout_ms={self.command_timeout_ms}"
        )

    @property
    def busy_ms(self) -> int:
        """The longest one call may wait for the write lock, at most what SQLite's
        ``busy_timeout`` holds (a C ``int``: a longer one reads as 0, no wait at all)."""
        if self.command_timeout_ms is None:
            return min(self.busy_timeout_ms, _MAX_BUSY_MS)
        return min(self.busy_timeout_ms, self.command_timeout_ms, _MAX_BUSY_MS)

    # -- calls on the driver ----------------------------------------------------------

    async def raw_fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._driver_fetch(sql, params, time.monotonic())

    async def _driver_fetch(self, sql: str, params: Params, start: float) -> list[Row]:
        """:meth:`raw_fetch` of a call that started at ``start`` (``time.monotonic()``):
        its waits end at ``start`` plus the busy bound, however long it waited in turn."""
        with self._order.driver_call():
            return await self._driver.fetch(sql, params, start)

    def raw_transaction(self, start: float | None = None) -> AbstractAsyncContextManager[Executor]:
        return self._driver.transaction(start)

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        if not self._ready:
            await self.open()
        if self._order.in_line:
            start = time.monotonic()
            async with self._order.turn():
                return await self._driver_fetch(sql, params, start)
        return await self.raw_fetch(sql, params)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        if not self._ready:
            await self.open()
        async with AsyncExitStack() as stack:
            start = time.monotonic()
            if self._order.in_line:
                # Its turn lasts until it holds the transaction lock: calls asked after
                # it then wait for that lock, and so run after the transaction.
                async with self._order.turn():
                    tx = await stack.enter_async_context(self.raw_transaction(start))
            else:
                tx = await stack.enter_async_context(self.raw_transaction(start))
            yield tx

    async def migration_lock(self, tx: Executor, name: str) -> None:
        # BEGIN IMMEDIATE already holds the database's write lock.
        return None

    # -- keyed reads and writes on the event loop's thread ----------------------------

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        """A keyed read, run at once on the event loop's thread by the reader connection
        when the aiosqlite connection is idle and the read need not wait, else as
        :meth:`fetch` does.

        In WAL mode a reader never waits for a writer, and a lookup by key in a file
        mapped into memory takes microseconds: less than the hop to aiosqlite's thread and
        back (about 100 us here), which was most of a sequential load. The reader's busy
        timeout is 0, so it never blocks the loop on a lock: where SQLite would make it
        wait (a WAL being recovered after a crash) it gets "database is locked" and the
        read goes through the driver thread, which waits as any call does. It sees what
        is committed when it starts, as a read outside a transaction on the main
        connection does.

        While the aiosqlite connection has statements in flight or a transaction open,
        reads queue behind them there (coalesced by :mod:`siglo_sql.batching`), as before
        the reader existed: a read then sees this backend's writes asked before it, and
        the loop's thread, which would hold the GIL for every inline read, leaves it to
        the driver thread: with 32 callers saving and loading, inline reads starved the
        writes (compare-and-set at 32 callers 0.92 -> 0.64 x raw). While calls wait for
        their turn (:mod:`siglo_sqlite.call_order`), a read waits behind them, then runs
        inline.
        """
        if not self._ready:
            await self.open()
        reader = self._reader
        if self._order.in_line:
            start = time.monotonic()
            async with self._order.turn():
                return await self._read_now(reader, sql, params, start)
        if reader is not None and not self._order.on_driver and not self._driver.lock.locked():
            now = time.monotonic()
            if now - self._last_inline > GAP_S:
                self._holding_since = now
            elif now - self._holding_since > HOLD_S:
                # Inline work has held the loop long enough: let it turn once.
                await asyncio.sleep(0)
                self._holding_since = self._last_inline = time.monotonic()
                return await self._read_after_turn(sql, params)
            self._last_inline = now
            # _read_now's inline path, written out: every sequential load comes here, and
            # the call to it (a coroutine more, the lock checked again) was 1.7k of a
            # load's 127k instructions (python -m benchmarks.instructions sqlite load).
            try:
                return reader.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                if not is_busy(exc):
                    raise self.wrap(exc, "running a statement") from exc
        return await self.raw_fetch(sql, params)

    async def _read_after_turn(self, sql: str, params: Params) -> list[Row]:
        """:meth:`read` once it has let the loop turn (what it waits for may have
        changed meanwhile)."""
        reader = self._reader
        if self._order.in_line:
            start = time.monotonic()
            async with self._order.turn():
                return await self._read_now(reader, sql, params, start)
        if reader is not None and not self._order.on_driver:
            return await self._read_now(reader, sql, params)
        return await self.raw_fetch(sql, params)

    async def _read_now(
        self,
        reader: sqlite3.Connection | None,
        sql: str,
        params: Params,
        start: float | None = None,
    ) -> list[Row]:
        """On the reader if there is one, no transaction is open and no lock is in the
        way, else on the driver (``start``: when a call that waited in turn was asked;
        ``None``: now)."""
        if reader is not None and not self._driver.lock.locked():
            try:
                return reader.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                if not is_busy(exc):
                    raise self.wrap(exc, "running a statement") from exc
        if start is None:
            return await self.raw_fetch(sql, params)
        return await self._driver_fetch(sql, params, start)

    async def write(self, sql: str, params: Params = ()) -> list[Row]:
        """A keyed write, run at once on the event loop's thread by the writer connection
        when the aiosqlite connection is idle, the write need not wait and inline work
        has not held the loop for :data:`~siglo_sqlite.group_commit.HOLD_S`; else it
        joins a batch that commits it with the others asked meanwhile
        (:mod:`siglo_sqlite.group_commit`), on the writer, or on the driver where a lock
        is in the way. At a ``synchronous`` whose commits sync, always in a batch, on the
        backend's own thread.

        A sequential save was one statement of about 35 us and two thread hops of about
        50 us each. The writer's busy timeout is 0: when another connection (another
        process) holds the write lock, SQLite answers "database is locked" at once and
        the write goes through the driver thread, which waits as any call does. The same
        gate as :meth:`read`'s keeps the order of this backend's calls: a write runs
        inline only with nothing in flight on the driver and no transaction open.

        Inline only where a commit does not sync (``synchronous`` ``NORMAL`` or ``OFF``,
        in WAL mode a commit appends to the WAL): a commit that waited for the disk would
        stall the event loop. For the same reason the writer never checkpoints the WAL
        (``wal_autocheckpoint = 0``): :mod:`siglo_sqlite.wal_checkpoints` does, every so
        many inline writes, beside them.
        """
        if not self._ready:
            await self.open()
        writer, wal = self._writer, self._wal
        if writer is None or wal is None:
            if self._syncing is not None:
                return await self._batched(sql, params, None)
            return await self.fetch(sql, params)
        if (
            self._collecting is None
            and not self._order.in_line
            and not self._order.on_driver
            and not self._driver.lock.locked()
            and not wal.in_the_way()
        ):
            now = time.monotonic()
            if now - self._last_inline > GAP_S:
                self._holding_since = now
            if now - self._holding_since <= HOLD_S:
                self._last_inline = now
                # _write_inline, written out: every sequential save comes here, and the
                # call to it was 583 of a save's 168,870 instructions
                # (benchmarks.instructions).
                try:
                    written: list[Row] = writer.execute(sql, params).fetchall()
                except sqlite3.Error as exc:
                    if not is_busy(exc):
                        raise self.wrap(exc, "running a statement") from exc
                else:
                    wal.wrote()
                    return written
                if not wal.under_way():
                    return await self.raw_fetch(sql, params)  # another connection's lock
                # This backend's own checkpoint holds the lock: wait for it, in a batch.
        return await self._batched(sql, params, None)

    async def run_plan(self, plan: Plan) -> None:
        """A transaction's plan run at once on the event loop's thread by the writer
        connection when :meth:`write` would run a statement there (an incremental save:
        its compare-and-set and part writes took one hop to the driver's thread each,
        five times the statements' own time); else as every transaction runs."""
        if not self._ready:
            await self.open()
        writer, wal = self._writer, self._wal
        if writer is None or wal is None:
            await super().run_plan(plan)
            return
        if (
            self._collecting is None
            and not self._order.in_line
            and not self._order.on_driver
            and not self._driver.lock.locked()
            and not wal.in_the_way()
        ):
            now = time.monotonic()
            if now - self._last_inline > GAP_S:
                self._holding_since = now
            if now - self._holding_since <= HOLD_S:
                self._last_inline = now
                if self._plan_inline(writer, wal, plan):
                    return
                if not wal.under_way():
                    await super().run_plan(plan)  # another connection's lock
                    return
        await self._batched("", (), plan)

    # -- group commit (siglo_sqlite.group_commit) -------------------------------------

    async def _batched(self, sql: str, params: Params, plan: Plan | None) -> list[Row]:
        """Join the batch being collected, or open one; the write's rows once its batch
        has committed."""
        future: asyncio.Future[list[Row]] = asyncio.get_running_loop().create_future()
        entry = Entry(sql, params, plan, time.monotonic(), future)
        collecting = self._collecting
        if collecting is None:
            collecting = self._collecting = [entry]
            place = self._order.reserve()
            task = asyncio.ensure_future(self._run_batch(collecting, place))
            self._batches.add(task)
            task.add_done_callback(partial(self._batch_ended, collecting, place))
        else:
            collecting.append(entry)
            if len(collecting) >= BATCH_MAX:
                self._collecting = None
        return await future

    def _batch_ended(self, entries: list[Entry], place: Place, task: asyncio.Task[None]) -> None:
        """A batch's task is over: if it was cancelled before it ran, its callers are
        cancelled too and its place in line is let go."""
        self._batches.discard(task)
        self._order.give_up(place)
        if self._collecting is entries:
            self._collecting = None
        for entry in entries:
            if not entry.future.done():
                entry.future.cancel()

    async def _run_batch(self, entries: list[Entry], place: Place) -> None:
        """Run a batch's writes in their turn, as few transactions as the budget allows."""
        try:
            async with self._order.turn(place):
                if self._collecting is entries:
                    self._collecting = None
                done = 0
                while done < len(entries):
                    if done:
                        await asyncio.sleep(0)  # the budget is spent: let the loop turn
                    done = await self._run_some(entries, done)
                self._holding_since = self._last_inline = time.monotonic()
                if len(entries) > 1:
                    # Callers are writing concurrently: the next write (one of those
                    # answered now, most likely, as they ask again) opens the next
                    # batch at once rather than holding the loop on its own first.
                    self._holding_since -= HOLD_S
        except BaseException as exc:
            for entry in entries:
                settle(entry, None, exc)
            if not isinstance(exc, Exception):
                raise

    async def _run_some(self, entries: list[Entry], first: int) -> int:
        """Run ``entries[first:]`` (as many as the budget allows) inline, or the first on
        the driver if a lock is in the way; the index of the first left."""
        writer, wal = self._writer, self._wal
        syncing, thread = self._syncing, self._thread
        if syncing is not None and thread is not None and not self._driver.lock.locked():
            ran = await self._commit_off_loop(syncing, thread, entries, first)
            if ran is not None:
                return ran
            writer = None  # another connection's lock: the driver waits for it
        for _ in range(2):
            if writer is None or wal is None:
                break  # closed meanwhile (the driver says so), or a syncing commit
            while wal.in_the_way():
                await wal.answered()
            if self._driver.lock.locked():
                break
            answered: list[tuple[Entry, list[Row] | None, BaseException | None]] = []
            ran = self._commit_group(writer, wal, entries, first, answered)
            if ran is not None:
                await answer_in_turns(answered, self.answers_per_turn)
                return ran
            if not wal.under_way():
                break
            await wal.answered()
        # A transaction open, or another connection's lock: the driver waits for it.
        entry = entries[first]
        try:
            if entry.plan is None:
                rows = await self._driver_fetch(entry.sql, entry.params, entry.start)
            else:
                rows = []
                async with self.raw_transaction(entry.start) as tx:
                    try:
                        step = next(entry.plan)
                        while True:
                            step = entry.plan.send(await tx.fetch(*step))
                    except StopIteration:
                        pass
        except Exception as exc:
            settle(entry, None, exc)
        else:
            settle(entry, rows)
        return first + 1

    def _commit_group(
        self,
        writer: sqlite3.Connection,
        wal: WalCheckpoints,
        entries: list[Entry],
        first: int,
        answered: list[tuple[Entry, list[Row] | None, BaseException | None]],
    ) -> int | None:
        """Run ``entries[first:]`` on the writer in one transaction until the budget is
        spent, and add their answers to ``answered`` once it committed (a failed commit
        answers them at once); the index of the first left, or ``None`` (nothing run) if
        another connection holds the write lock."""
        if first == len(entries) - 1:
            return self._commit_one(writer, wal, entries[first], first)
        try:
            writer.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if is_busy(exc):
                return None
            raise self.wrap(exc, "starting a transaction") from exc
        until = time.monotonic() + BATCH_BUDGET_S
        answers: list[tuple[Entry, list[Row] | None, Exception | None]] = []
        index = first
        try:
            while index < len(entries):
                entry = entries[index]
                index += 1
                if entry.plan is None:
                    try:
                        rows = writer.execute(entry.sql, entry.params).fetchall()
                    except sqlite3.Error as exc:
                        if not writer.in_transaction:
                            raise  # SQLite undid the transaction (an I/O error, a full disk)
                        answers.append((entry, None, self.wrap(exc, "running a statement")))
                    else:
                        answers.append((entry, rows, None))
                else:
                    writer.execute("SAVEPOINT siglo_write")
                    try:
                        self._drive(writer, entry.plan)
                    except Exception as exc:
                        if not writer.in_transaction:
                            raise
                        writer.execute("ROLLBACK TO siglo_write")
                        writer.execute("RELEASE siglo_write")
                        answers.append((entry, None, exc))
                    else:
                        writer.execute("RELEASE siglo_write")
                        answers.append((entry, None, None))
                if time.monotonic() >= until:
                    break
            writer.execute("COMMIT")
        except Exception as exc:
            # Nothing of this transaction is kept: every write in it fails.
            if writer.in_transaction:
                writer.execute("ROLLBACK")
            error = exc if isinstance(exc, SigloError) else self.wrap(exc, "committing")
            for entry in entries[first:index]:
                settle(entry, None, error)
            return index
        for _, _, failed in answers:
            if failed is None:
                wal.wrote()
        answered.extend(answers)
        return index

    async def _commit_off_loop(
        self,
        syncing: sqlite3.Connection,
        thread: concurrent.futures.ThreadPoolExecutor,
        entries: list[Entry],
        first: int,
    ) -> int | None:
        """Run ``entries[first:]`` (single statements) in one transaction on the syncing
        writer, on :attr:`_thread`, and answer them; the index of the first left, or
        ``None`` (nothing run) if another connection holds the write lock."""
        batch = [(entry.sql, entry.params) for entry in entries[first:]]
        try:
            answers = await asyncio.wrap_future(thread.submit(_run_together, syncing, batch))
        except Exception as exc:  # the transaction failed, or the file was closed
            error = exc if isinstance(exc, SigloError) else self.wrap(exc, "committing")
            for entry in entries[first:]:
                settle(entry, None, error)
            return len(entries)
        if answers is None:
            return None
        await answer_in_turns(
            [
                (entry, None, self.wrap(failed, "running a statement"))
                if failed is not None
                else (entry, rows, None)
                for entry, (rows, failed) in zip(entries[first:], answers, strict=True)
            ],
            self.answers_per_turn,
        )
        return len(entries)

    def _commit_one(
        self, writer: sqlite3.Connection, wal: WalCheckpoints, entry: Entry, index: int
    ) -> int | None:
        """A batch of one: run as a write at once would be."""
        if entry.plan is not None:
            try:
                ran = self._plan_inline(writer, wal, entry.plan)
            except Exception as exc:
                settle(entry, None, exc)
                return index + 1
            if not ran:
                return None
            settle(entry, [])
            return index + 1
        rows: list[Row] | None
        try:
            rows = self._write_inline(writer, wal, entry.sql, entry.params)
        except Exception as exc:
            settle(entry, None, exc)
            return index + 1
        if rows is None:
            return None
        settle(entry, rows)
        return index + 1

    def _drive(self, writer: sqlite3.Connection, plan: Plan) -> None:
        """Run ``plan``'s statements on the writer (in a transaction already open)."""
        try:
            step = next(plan)
            while True:
                try:
                    rows = writer.execute(*step).fetchall()
                except sqlite3.Error as exc:
                    raise self.wrap(exc, "running a statement") from exc
                step = plan.send(rows)
        except StopIteration:
            return

    def _plan_inline(self, writer: sqlite3.Connection, wal: WalCheckpoints, plan: Plan) -> bool:
        """Run ``plan`` on the writer; ``False`` (nothing run) if another connection
        holds the write lock: the writer never waits."""
        try:
            writer.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if not is_busy(exc):
                raise self.wrap(exc, "starting a transaction") from exc
            return False
        try:
            self._drive(writer, plan)
            try:
                writer.execute("COMMIT")
            except sqlite3.Error as exc:
                writer.execute("ROLLBACK")
                raise self.wrap(exc, "committing") from exc
        except BaseException:
            if writer.in_transaction:
                writer.execute("ROLLBACK")
            raise
        wal.wrote()
        return True

    def _write_inline(
        self, writer: sqlite3.Connection, wal: WalCheckpoints, sql: str, params: Params
    ) -> list[Row] | None:
        """The write on the writer; ``None`` if a lock is in the way (it never waits)."""
        try:
            rows = writer.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            if not is_busy(exc):
                raise self.wrap(exc, "running a statement") from exc
            return None
        wal.wrote()
        return rows


def _run_together(
    conn: sqlite3.Connection, statements: list[tuple[str, Params]]
) -> list[tuple[list[Row] | None, sqlite3.Error | None]] | None:
    """Run ``statements`` on ``conn`` in one transaction (one alone: autocommit), each
    its own outcome; ``None`` if another connection holds the write lock. On the
    backend's thread: the commit syncs."""
    if len(statements) == 1:
        try:
            return [(conn.execute(*statements[0]).fetchall(), None)]
        except sqlite3.Error as exc:
            if is_busy(exc):
                return None
            return [(None, exc)]
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        if is_busy(exc):
            return None
        raise
    answers: list[tuple[list[Row] | None, sqlite3.Error | None]] = []
    try:
        for sql, params in statements:
            try:
                answers.append((conn.execute(sql, params).fetchall(), None))
            except sqlite3.Error as exc:
                if not conn.in_transaction:
                    raise  # SQLite undid the transaction (an I/O error, a full disk)
                answers.append((None, exc))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return answers
