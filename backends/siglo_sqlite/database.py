"""One long-lived aiosqlite connection per backend, in WAL mode. For files, three more
plain ``sqlite3`` connections: a read-only one for keyed reads and one for keyed writes,
both used on the event loop's thread (:meth:`SqliteDatabase.read`,
:meth:`SqliteDatabase.write`), and one that checkpoints the WAL on the backend's own
worker thread, which also opens them. A call that must wait for calls asked before it
waits its turn on the loop (:meth:`SqliteDatabase._turn`), so the calls keep their order.

aiosqlite runs every call on the connection's own thread, so each statement costs a
thread hop: one ``execute_fetchall`` per operation keeps it to one. The connection is
shared by the backend's tasks: a transaction holds an :class:`asyncio.Lock` from its
``BEGIN`` to its end, so no other task's statement runs inside it; single statements
outside a transaction go straight to the connection. Across processes SQLite's own locking
serialises writers: ``BEGIN IMMEDIATE`` takes the write lock up front where a read and a
write must be atomic, the busy timeout makes a writer wait for another, and a
"database is locked" that still comes back is retried until the busy timeout has passed.

Every call is bounded by ``command_timeout_ms``: its waits (for this backend's own
transaction in progress, for another connection's write lock) end at the call's deadline
with :class:`~siglo.errors.StorageAdapterError`, so a lock held elsewhere never hangs a
call. The busy handler never waits past the bound either (``PRAGMA busy_timeout`` is the
smaller of ``busy_timeout_ms`` and ``command_timeout_ms``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import TYPE_CHECKING, Final

import aiosqlite
from sqlalchemy.dialects import sqlite as sqlite_dialect

from siglo.errors import InvalidArgumentError, SigloError, StorageAdapterError
from siglo.settings import DEFAULTS
from siglo_sql.database import Database, Executor, OnOpen, Params, Row

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["SqliteDatabase"]

_log = logging.getLogger("siglo.sqlite")

SYNCHRONOUS_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
_SHORTEN_SLACK_MS: Final = 50
"""A call with less than its full busy wait left by this much sets a shorter one."""
MMAP_SIZE_BYTES: Final = 1 << 30
"""``PRAGMA mmap_size``: reads of a file up to 1 GiB go through the OS page cache mapped
into the process instead of a ``read()`` per page (address space, not memory)."""
CACHE_SIZE_KIB: Final = 65_536
"""``PRAGMA cache_size`` (64 MiB, SQLite's default is 2 MiB): with the default, a keyed
lookup in a million-checkpoint file was twice as slow as in a thousand-checkpoint one."""


INLINE_WRITE_MODES: Final = frozenset({"OFF", "NORMAL"})
"""The ``synchronous`` modes whose commits :meth:`SqliteDatabase.write` may run on the
event loop's thread: in WAL mode neither syncs a commit."""
CHECKPOINT_FRAMES: Final = 1_000
"""The WAL frames (pages) the inline writes let the WAL reach before it starts over:
SQLite's own ``wal_autocheckpoint`` default. A checkpoint starts at about half, and writes
wait for it if they reach the other half before it ends."""
CHECKPOINT_EVERY_MIN: Final = 32
"""The fewest inline writes between two checkpoints of the WAL (:meth:`SqliteDatabase.write`);
also the first interval."""
CHECKPOINT_EVERY_MAX: Final = 4_096
"""The most (small writes fill 1,000 frames slowly)."""
CHECKPOINT_RESTART_WAIT_MS: Final = 10
"""How long the checkpoint's last step tries to start the WAL over while another
connection reads or writes it, before leaving that to a later checkpoint: the inline
writes wait for that step, so it must stay short."""


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def _open_inline(path: str, wait_ms: int, *pragmas: str) -> sqlite3.Connection:
    """A connection used on the event loop's thread: autocommit (each statement its own
    transaction and snapshot), never waiting for a lock once open, the main connection's
    page settings, and ``pragmas``.

    Setting it up reads the schema, and that read may meet a lock: another process
    opening the file (its first connection briefly locks the WAL index) or holding it.
    Until it is set up it waits for a lock up to ``wait_ms``, as the main connection
    does; it is set up off the event loop's thread, so that wait never holds the loop.
    """
    # check_same_thread off: set up on a worker thread, then only ever used from the
    # loop's thread.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        for pragma in (
            f"busy_timeout = {max(0, wait_ms)}",
            *pragmas,
            f"mmap_size = {MMAP_SIZE_BYTES}",
            f"cache_size = -{CACHE_SIZE_KIB}",
            "busy_timeout = 0",
        ):
            conn.execute(f"PRAGMA {pragma}")
    except BaseException:
        conn.close()
        raise
    return conn


def _open_reader(path: str, wait_ms: int) -> sqlite3.Connection:
    """The connection :meth:`SqliteDatabase.read` uses: read-only."""
    return _open_inline(path, wait_ms, "query_only = ON")


def _open_writer(path: str, wait_ms: int, synchronous: str) -> sqlite3.Connection:
    """The connection :meth:`SqliteDatabase.write` uses: the main connection's durability,
    never checkpointing the WAL (the checkpointer's thread does)."""
    return _open_inline(path, wait_ms, f"synchronous = {synchronous}", "wal_autocheckpoint = 0")


def _open_checkpointer(path: str, wait_ms: int, synchronous: str) -> sqlite3.Connection:
    """The connection that checkpoints the WAL of the writer's commits, on a thread of its
    own (:meth:`SqliteDatabase.write`); it syncs as the main connection does."""
    return _open_inline(path, wait_ms, f"synchronous = {synchronous}")


def _daemonic(conn: aiosqlite.Connection) -> aiosqlite.Connection:
    """``conn`` (not yet awaited) with its worker thread made a daemon.

    aiosqlite's thread is not a daemon, and it holds its last job, and through it the
    connection, until the next one comes: a backend that is never closed kept the
    process from exiting, forever (aiosqlite issue 299). A daemon thread lets the process
    exit as it does with an open plain ``sqlite3`` connection; SQLite's journal makes
    that safe (a transaction not committed is rolled back when the file is next opened,
    one committed is kept). Before 0.22 the connection was itself the thread; since, the
    thread is its ``_thread``. tests/backends/test_sqlite_backend.py fails if an unclosed backend
    stops the process exiting.
    """
    thread = conn if isinstance(conn, threading.Thread) else getattr(conn, "_thread", None)
    if isinstance(thread, threading.Thread) and not thread.is_alive():
        thread.daemon = True
    return conn


class _Tx:
    def __init__(self, db: SqliteDatabase, conn: aiosqlite.Connection, deadline: float) -> None:
        self._db = db
        self._conn = conn
        self._deadline = deadline

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._db._run(self._conn, sql, params, self._deadline)


class SqliteDatabase(Database):
    """An SQLite file (or a private in-memory database when ``path`` is ``None``)."""

    dialect_name = "sqlite"
    sa_dialect = sqlite_dialect.dialect()
    coalesce_reads = True  # one connection: every statement waits for the one before

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
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise InvalidArgumentError(
                f"synchronous must be one of {', '.join(sorted(SYNCHRONOUS_MODES))}, "
                f"got {synchronous!r}"
            )
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.synchronous = synchronous.upper()
        self.engine = engine
        self._conn: aiosqlite.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        """A second connection to the file, for :meth:`read` on the event loop's thread."""
        self._writer: sqlite3.Connection | None = None
        """A third, for :meth:`write` on the event loop's thread (files at a
        ``synchronous`` that does not sync each commit)."""
        self._tickets = 0
        """Calls submitted to the aiosqlite connection so far (each call's number)."""
        self._open_tickets: set[int] = set()
        """The numbers of those not answered yet."""
        self._answer_waits: list[tuple[int, asyncio.Future[None]]] = []
        """Calls waiting until every call numbered below theirs has answered."""
        self._line = asyncio.Lock()
        """The turn of calls that wait (:meth:`_turn`): first come, first served."""
        self._in_line = 0
        """Calls waiting for their turn or holding it: calls asked meanwhile queue too."""
        self._inline_writes = 0
        """Writes :meth:`write` has run inline since the last checkpoint was asked."""
        self._checkpoint_every = CHECKPOINT_EVERY_MIN
        """Inline writes between two checkpoints of the WAL (adapts to the frames found)."""
        self._checkpointer: sqlite3.Connection | None = None
        """A fourth connection, only for checkpoints, on :attr:`_thread`."""
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        """A file-backed backend's own worker thread: it opens the inline connections
        and runs the checkpoints. Its own, not the loop's default executor, which the
        application may replace (DBOS Transact sets its pool there, and shuts that pool
        down when it stops: every ``asyncio.to_thread`` after that fails)."""
        self._checkpointing: concurrent.futures.Future[None] | None = None
        """The checkpoint submitted last (done once it has answered)."""
        self._checkpoint_done: asyncio.Future[None] | None = None
        """The same, as the loop's future: what a write the checkpoint holds up waits for."""
        self._restarting = False
        """True while the checkpoint's last step runs: writes wait for it to end."""
        self._since_restart = 0
        """Inline writes since the WAL last started over (frames per write, for the interval)."""
        self._sa_conn: AsyncConnection | None = None
        self._lock = asyncio.Lock()

    def exists(self) -> bool:
        return self.engine is not None or self.path is None or os.path.exists(self.path)

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
                conn = await _daemonic(
                    aiosqlite.connect(self.path or ":memory:", isolation_level=None)
                )
            except BaseException:
                # aiosqlite stops its worker thread without waiting for it; give it a
                # moment, or it may report to an event loop that has since closed.
                await asyncio.sleep(0.01)
                raise
        assert isinstance(conn, aiosqlite.Connection)
        self._conn = conn
        try:
            await conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
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
        deadline = self._deadline()
        for pragma in (
            # WAL: readers never block the writer, and a commit is one append.
            "journal_mode = WAL",
            f"synchronous = {self.synchronous}",
            # Keeps keyed lookups flat as the file grows (docs/benchmarks.md, scale).
            f"mmap_size = {MMAP_SIZE_BYTES}",
            f"cache_size = -{CACHE_SIZE_KIB}",
        ):
            await self._run(conn, f"PRAGMA {pragma}", (), deadline)
        if self.engine is not None:
            return
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="siglo-sqlite")
        self._reader = await self._open_off_loop(_open_reader, path, deadline)
        if self.synchronous in INLINE_WRITE_MODES:
            self._writer = await self._open_off_loop(_open_writer, path, deadline, self.synchronous)
            self._checkpointer = await self._open_off_loop(
                _open_checkpointer, path, deadline, self.synchronous
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
            if _is_busy(exc):
                raise self.timed_out("waiting for a lock to open the file", exc) from exc
            raise

    async def _disconnect(self) -> None:
        checkpoint, self._checkpointing = self._checkpointing, None
        self._checkpoint_done = None
        thread, self._thread = self._thread, None
        try:
            if checkpoint is not None and not checkpoint.done():
                # A checkpoint under way ends first (milliseconds): its connection is
                # closed below. It never raises (see _checkpoint_wal).
                await asyncio.wait({asyncio.wrap_future(checkpoint)})
        finally:
            if thread is not None:
                thread.shutdown(wait=False)
            await self._close_connections()

    async def _close_connections(self) -> None:
        conn, self._conn = self._conn, None
        sa_conn, self._sa_conn = self._sa_conn, None
        reader, self._reader = self._reader, None
        writer, self._writer = self._writer, None
        checkpointer, self._checkpointer = self._checkpointer, None
        for inline in (reader, writer, checkpointer):
            if inline is not None:
                with suppress(Exception):
                    inline.close()
        if sa_conn is not None:
            with suppress(Exception):
                await sa_conn.close()  # back to the user's pool; their engine stays open
        elif conn is not None:
            with suppress(Exception):
                await conn.close()

    @property
    def bound_text(self) -> str:
        # The busy wait is the smaller of the two.
        return (
            f"busy_timeout_ms={self.busy_timeout_ms}, command_timeout_ms={self.command_timeout_ms}"
        )

    @property
    def _busy_ms(self) -> int:
        """The longest one call may wait for the write lock."""
        if self.command_timeout_ms is None:
            return self.busy_timeout_ms
        return min(self.busy_timeout_ms, self.command_timeout_ms)

    def _deadline(self) -> float:
        """When a call starting now must be over (``time.monotonic()``)."""
        return time.monotonic() + self._busy_ms / 1000

    async def _run(
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
        try:
            while True:
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0:
                    if busy is not None:
                        raise self.timed_out("waiting for the write lock", busy) from busy
                    # The deadline bounds waits, not work: a statement that meets no lock
                    # runs however long the call has taken so far (a migration on a slow
                    # disk, busy_timeout_ms=0), with one attempt that does not wait.
                    remaining_ms = 0
                if remaining_ms < self._busy_ms - _SHORTEN_SLACK_MS:
                    # A retry, or a call that queued first: SQLite's busy handler must
                    # not wait past this call's deadline.
                    await conn.execute(f"PRAGMA busy_timeout = {remaining_ms}")
                    shortened = True
                try:
                    return list(await conn.execute_fetchall(sql, params))  # type: ignore[arg-type]
                except SigloError:
                    raise
                except Exception as exc:
                    if not _is_busy(exc):
                        raise self.wrap(exc, "running a statement") from exc
                    # The busy handler gave up, or was not consulted (SQLite skips it
                    # where waiting could deadlock): retry until the deadline.
                    busy = exc
                    await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                    delay = min(delay * 2, 0.05)
        finally:
            if shortened:
                with suppress(Exception):
                    await asyncio.shield(conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}"))

    async def _take_lock(self, deadline: float) -> None:
        """This connection's transaction lock, waiting no later than ``deadline``."""
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._lock.acquire()
        except TimeoutError as exc:
            raise self.timed_out("waiting for a transaction in progress") from exc

    def _connection(self) -> aiosqlite.Connection:
        conn = self._conn
        if conn is None:
            raise StorageAdapterError(f"{self.description} is closed")
        return conn

    @property
    def _on_driver(self) -> int:
        """Statements submitted to the aiosqlite connection and not answered yet."""
        return len(self._open_tickets)

    async def raw_fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._driver_fetch(sql, params, time.monotonic())

    async def _driver_fetch(self, sql: str, params: Params, start: float) -> list[Row]:
        """:meth:`raw_fetch` of a call that started at ``start`` (``time.monotonic()``):
        its waits end at ``start`` plus the busy bound, however long it waited in turn."""
        ticket = self._tickets
        self._tickets = ticket + 1
        self._open_tickets.add(ticket)
        try:
            return await self._fetch_on_driver(sql, params, start)
        finally:
            self._open_tickets.discard(ticket)
            if self._answer_waits:
                self._wake_answered()

    def _wake_answered(self) -> None:
        """Let go the calls whose earlier driver calls have all answered."""
        lowest_open = min(self._open_tickets, default=self._tickets)
        still: list[tuple[int, asyncio.Future[None]]] = []
        for until, waiting in self._answer_waits:
            if until <= lowest_open:
                if not waiting.done():
                    waiting.set_result(None)
            else:
                still.append((until, waiting))
        self._answer_waits = still

    async def _answered(self, until: int) -> None:
        """Wait until every driver call numbered below ``until`` has answered."""
        if any(ticket < until for ticket in self._open_tickets):
            waiting = asyncio.get_running_loop().create_future()
            self._answer_waits.append((until, waiting))
            await waiting

    @asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """Queue behind the calls waiting already, then wait for the driver's calls asked
        before this one: what follows runs after every call asked before it.

        The inline connections keep this backend's calls in the order they were asked
        only if a call asked while others are still under way runs after them. A call
        that cannot run at once waits here, on the loop, and then runs inline, instead
        of queueing on the driver: with 32 callers the driver never emptied once one
        call was on it, and every call took the hop. Calls asked while any waits queue
        behind it (first come, first served), so none overtakes another.

        This wait is the one the call would have had queued behind those calls on the
        driver: not cut short, since the bound is on waits for a lock, not on the work
        of calls asked before (each of which is bounded the same way). It counts against
        the call's bound if the call then meets a lock: its deadline runs from when it
        was asked (``start``, passed on to the driver).
        """
        until = self._tickets
        self._in_line += 1
        try:
            async with self._line:
                await self._answered(until)
                yield
        finally:
            self._in_line -= 1

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        if not self._ready:
            await self.open()
        if self._in_line:
            start = time.monotonic()
            async with self._turn():
                return await self._driver_fetch(sql, params, start)
        return await self.raw_fetch(sql, params)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        if not self._ready:
            await self.open()
        async with AsyncExitStack() as stack:
            start = time.monotonic()
            if self._in_line:
                # Its turn lasts until it holds the transaction lock: calls asked after
                # it then wait for that lock, and so run after the transaction.
                async with self._turn():
                    tx = await stack.enter_async_context(self.raw_transaction(start))
            else:
                tx = await stack.enter_async_context(self.raw_transaction(start))
            yield tx

    async def _fetch_on_driver(self, sql: str, params: Params, start: float) -> list[Row]:
        conn = self._connection()
        # Its deadline (start + _busy_ms) is worked out only when a statement has to
        # wait, as few do (a call fewer on every statement).
        busy: Exception | None = None
        if not self._lock.locked():
            # No transaction is open, and none can open before this statement runs:
            # aiosqlite runs a connection's calls in the order they were submitted, and
            # a transaction submits its BEGIN only once it holds the lock. So single
            # statements need not wait for each other (each is its own autocommit
            # transaction); 32 callers keep the connection's thread busy instead of
            # taking turns through the event loop.
            try:
                return list(await conn.execute_fetchall(sql, params))  # type: ignore[arg-type]
            except SigloError:
                raise
            except Exception as exc:
                if not _is_busy(exc):
                    raise self.wrap(exc, "running a statement") from exc
                busy = exc
            # Busy: retried under the lock, where a transaction cannot open in the gap.
        deadline = start + self._busy_ms / 1000
        await self._take_lock(deadline)
        try:
            return await self._run(conn, sql, params, deadline, busy)
        finally:
            self._lock.release()

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
        their turn (:meth:`_turn`), a read waits behind them, then runs inline.
        """
        if not self._ready:
            await self.open()
        reader = self._reader
        if self._in_line:
            start = time.monotonic()
            async with self._turn():
                return await self._read_now(reader, sql, params, start)
        if reader is not None and not self._on_driver and not self._lock.locked():
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
        if reader is not None and not self._lock.locked():
            try:
                return reader.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                if not _is_busy(exc):
                    raise self.wrap(exc, "running a statement") from exc
        if start is None:
            return await self.raw_fetch(sql, params)
        return await self._driver_fetch(sql, params, start)

    async def write(self, sql: str, params: Params = ()) -> list[Row]:
        """A keyed write, run at once on the event loop's thread by the writer connection
        when the aiosqlite connection is idle and the write need not wait, else as
        :meth:`fetch` does.

        A sequential save was one statement of about 35 us and two thread hops of about
        50 us each. The writer's busy timeout is 0: when another connection (another
        process) holds the write lock, SQLite answers "database is locked" at once and
        the write goes through the driver thread, which waits as any call does. The same
        gate as :meth:`read`'s keeps the order of this backend's calls: a write runs
        inline only with nothing in flight on the driver and no transaction open.

        Only where a commit does not sync (``synchronous`` ``NORMAL`` or ``OFF``, in WAL
        mode a commit appends to the WAL): a commit that waited for the disk would stall
        the event loop. For the same reason the writer never checkpoints the WAL
        (``wal_autocheckpoint = 0``): a checkpoint (copy and sync) runs every so many
        inline writes on a thread and connection of its own (:meth:`_checkpoint_wal`),
        beside them. It changes nothing a call reads, so calls go on while it runs, and
        it is submitted without a turn of the loop, so a caller saving in a loop that
        never waits still has its WAL checkpointed. (Before, one write in 32 went through
        the driver, whose commit checkpointed: with 32 callers the driver then always had
        one in flight, and every write took the hop.)
        """
        if not self._ready:
            await self.open()
        writer = self._writer
        if writer is None:
            return await self.fetch(sql, params)
        if (
            not self._in_line
            and not self._on_driver
            and not self._lock.locked()
            and not self._checkpoint_in_the_way()
        ):
            rows = self._write_inline(writer, sql, params)
            if rows is not None:
                return rows
            if not self._checkpointing_now():
                return await self.raw_fetch(sql, params)  # another connection's lock
            # This backend's own checkpoint holds the lock: wait for it, in turn.
        start = time.monotonic()  # nothing was awaited since the call was asked
        async with self._turn():
            for _ in range(2):
                while self._checkpoint_in_the_way():
                    await self._checkpoint_answered()
                if self._lock.locked():
                    break
                rows = self._write_inline(writer, sql, params)
                if rows is not None:
                    return rows
                if not self._checkpointing_now():
                    break
                await self._checkpoint_answered()
            # A transaction open, or another connection's lock: the driver waits for it.
            return await self._driver_fetch(sql, params, start)

    def _write_inline(
        self, writer: sqlite3.Connection, sql: str, params: Params
    ) -> list[Row] | None:
        """The write on the writer; ``None`` if a lock is in the way (it never waits)."""
        try:
            rows = writer.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            if not _is_busy(exc):
                raise self.wrap(exc, "running a statement") from exc
            return None
        self._inline_writes += 1
        self._since_restart += 1
        if self._inline_writes >= self._checkpoint_every:
            self._checkpoint_soon()
        return rows

    def _checkpointing_now(self) -> bool:
        """Whether this backend's checkpoint is under way."""
        return self._checkpoint_done is not None and not self._checkpoint_done.done()

    def _checkpoint_in_the_way(self) -> bool:
        """Whether a write must wait for the checkpoint under way: its last step holds the
        write lock, or the WAL has grown as far as it may before that step."""
        return self._checkpointing_now() and (
            self._restarting or self._inline_writes >= self._checkpoint_every
        )

    async def _checkpoint_answered(self) -> None:
        """Wait for the checkpoint under way: work, like a checkpoint a commit on the
        driver runs (its last step waits at most :data:`CHECKPOINT_RESTART_WAIT_MS` for
        other connections), so not cut short by the call's bound."""
        checkpoint = self._checkpoint_done
        if checkpoint is not None and not checkpoint.done():
            await asyncio.wait({checkpoint})

    def _checkpoint_soon(self) -> None:
        """Start a checkpoint of the WAL on :attr:`_thread`, unless one runs."""
        thread = self._thread
        if (
            thread is not None
            and self._checkpointer is not None
            and (self._checkpointing is None or self._checkpointing.done())
        ):
            self._inline_writes = 0
            self._checkpointing = thread.submit(self._checkpoint_wal)
            self._checkpoint_done = asyncio.wrap_future(self._checkpointing)

    def _checkpoint_wal(self) -> None:
        """Checkpoint the WAL and start it over. Runs on :attr:`_thread`; never
        raises (a failed checkpoint is tried again at the next interval).

        Two steps. ``PASSIVE`` copies the WAL's frames into the file without taking a
        lock, while the inline writes go on (they append more). ``RESTART`` then copies
        the frames appended meanwhile and makes the next write start the WAL from its
        beginning, so the file stops growing. It needs the write lock and no reader in
        the WAL: new writes wait on the loop while it runs (:attr:`_restarting`), and it
        tries again for at most :data:`CHECKPOINT_RESTART_WAIT_MS` while another
        connection reads or writes. (SQLite's own busy wait would sleep a millisecond
        first, with the writes waiting.) The frames the WAL held at the end set the
        interval to the next checkpoint, aiming at :data:`CHECKPOINT_FRAMES`."""
        conn = self._checkpointer
        if conn is None:
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self._restarting = True
            give_up = time.monotonic() + CHECKPOINT_RESTART_WAIT_MS / 1000
            while True:
                busy, frames, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                if not busy or time.monotonic() >= give_up:
                    break
                time.sleep(0.0002)
        except Exception as exc:
            _log.debug("checkpointing the WAL of %s failed: %s", self.description, exc)
            return
        finally:
            self._restarting = False
        if busy:
            return
        writes, self._since_restart = self._since_restart, 0
        if frames > 0 and writes > 0:
            every = int(CHECKPOINT_FRAMES / 2 / (frames / writes))
            self._checkpoint_every = min(CHECKPOINT_EVERY_MAX, max(CHECKPOINT_EVERY_MIN, every))

    @asynccontextmanager
    async def raw_transaction(self, start: float | None = None) -> AsyncIterator[Executor]:
        conn = self._connection()
        deadline = self._deadline() if start is None else start + self._busy_ms / 1000
        await self._take_lock(deadline)
        try:
            try:
                await self._run(conn, "BEGIN IMMEDIATE", (), deadline)
                yield _Tx(self, conn, deadline)
                await self._run(conn, "COMMIT", (), deadline)
            except BaseException:
                await self._rollback(conn)
                raise
        finally:
            self._lock.release()

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

    async def migration_lock(self, tx: Executor, name: str) -> None:
        # BEGIN IMMEDIATE already holds the database's write lock.
        return None
