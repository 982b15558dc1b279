"""PostgreSQL through a psycopg 3 ``AsyncConnectionPool``.

Connections are in autocommit mode: most operations are one statement, which is its own
transaction. Statements are prepared on their first use on each connection
(``prepare_threshold=0``; pass ``prepare_threshold=None`` behind a PgBouncer older than
1.21 in transaction mode) and results come in binary, so a checkpoint's ``bytea`` arrives
as the very bytes that were stored.

Every call is bounded by ``command_timeout_ms`` from the wait for a pooled connection to
the last row (:meth:`PostgresDatabase._bounded`): at the bound the server is asked to
cancel the statement (one waiting for a lock held elsewhere ends at once, the
connection stays usable); a server that answers neither the statement nor the cancel
request (stopped, or the network stalled) has the connection's socket shut down
:data:`SEVER_AFTER_MS` later, so the call still ends, and the pool drops the connection.

What the caller gets says what is known of the outcome (SPEC §4: an acknowledgement is
never a guess). A call whose statement the server cancelled was rolled back: a plain
:class:`~siglo.errors.StorageAdapterError` saying it timed out. Any other end of a call
past its bound is :class:`~siglo.errors.OutcomeUnknownError` — a cut connection, and a
call that *succeeded* after its bound: a cancel that reaches a commit waiting for its
synchronous standby cancels only the wait, and PostgreSQL commits locally, warns
("canceling wait for synchronous replication … already committed locally") and answers
success; the standby may never get that commit. The same warning on a call within its
bound (another session cancelled it) is an unknown outcome too (:func:`_left_ambiguous`),
and so is a call whose connection was lost with no word from the server after its
statement was sent (the server died, the network dropped: it may have committed); a
connection the server closed while it sat in the pool is replaced before a call is sent
on it, so that a restart does not look the same (:mod:`siglo_postgres.liveness`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.dialects import postgresql

from siglo.errors import OutcomeUnknownError, SigloError, StorageAdapterError
from siglo.settings import DEFAULTS
from siglo.validation import ms_as_seconds
from siglo_postgres.checkout import PooledConnections
from siglo_postgres.liveness import closed_while_idle, lost_in_flight
from siglo_postgres.watches import SEVER_AFTER_MS, Watch, Watches
from siglo_sql.database import Database, Executor, OnOpen, Params, Row

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["PIPELINE_MODE", "SEVER_AFTER_MS", "PostgresDatabase"]

AsyncConn = psycopg.AsyncConnection[Any]
T = TypeVar("T")

PIPELINE_MODE: Final = psycopg.Pipeline.is_supported()
"""Whether psycopg's libpq has pipeline mode (libpq 14 or newer: psycopg's binary wheels
bundle one; a psycopg built against an older system libpq has none, and
:meth:`PostgresDatabase.fetch_all` then runs its statements in a transaction)."""

RECONNECT_ROUND_S: Final = 2.0
"""How long psycopg_pool tries to replace a broken connection before it gives up on it
(its ``reconnect_timeout``; 5 min by default). Its attempts come 1, 2, 4, 8 … s apart,
so after a long outage the next one could come as long after the server was back, every
call failing meanwhile (by that schedule up to 11 s after an outage of 20 s, a minute
after one of two minutes; a black-box auditor measured 8–9 s after 20 s).
With rounds of 2 s, attempts are at most 1 s apart, and once a round gives up a caller
who finds the pool empty starts the next at once: calls succeed within about a second
of the server's return (tests/backends/test_postgres_reconnect.py). The cost, while the
server is down (by that schedule): about one connection attempt a second for each
connection being replaced, and psycopg_pool's warning when a round ends."""


async def _execute(conn: AsyncConn, sql: str, params: Params) -> psycopg.AsyncCursor[Any]:
    if params:
        return await conn.execute(sql, params, binary=True)
    # DDL and other parameterless statements: not worth a prepared statement.
    return await conn.execute(sql, prepare=False)


_TUPLES_OK: Final = psycopg.pq.ExecStatus.TUPLES_OK

_ENGINE_REPLACEMENTS: Final = 64
"""How many connections an application's engine may hand out that the server closed
(after a restart, each idle one) before a call gives up."""

BATCH_LOCK_TIMEOUT_MS: Final = 50
"""How long a statement of writes sent together may wait for a row another transaction
holds (the batch's ``lock_timeout``, local to its transaction) before the batch is
rolled back and each of its writes sent again alone.

Writes sent together are one transaction: each row a write of it locks stays locked
until the last is done. Two processes' batches, each holding a row the other's next
write wants, wait for each other (a deadlock, which PostgreSQL breaks only after its
``deadlock_timeout``, a second by default, by failing one), and a batch waiting for a
row holds its own rows meanwhile, so that other callers queue behind it: a black-box
auditor's two processes, each running the same 80 stack ids four at a time, met
deadlocks in four rounds of five, and calls waited out their whole bound. A write alone
is its own transaction and holds its rows only while it runs."""

_BATCH_LOCK_TIMEOUT: Final = f"SELECT set_config('lock_timeout', '{BATCH_LOCK_TIMEOUT_MS}ms', true)"

_DEADLOCK_ATTEMPTS: Final = 3
"""How many times a statement (or :meth:`PostgresDatabase.fetch_all`'s transaction) is
sent when the server fails it to break a deadlock: the transaction it failed was rolled
back, nothing of it done, so sending it again is safe."""

_Write = tuple[str, Params, "asyncio.Future[list[Row]]"]
"""A keyed write waiting to go out with others: its statement, and its caller's answer."""


async def _rows(cur: psycopg.AsyncCursor[Any]) -> list[Row]:
    # Whether the statement returns rows, from its result's status: ``cur.description``
    # would build a column description to say so (2.2 µs against 0.07, every statement).
    result = cur.pgresult
    return await cur.fetchall() if result is not None and result.status == _TUPLES_OK else []


async def _fetch(conn: AsyncConn, sql: str, params: Params) -> list[Row]:
    return await _rows(await _execute(conn, sql, params))


def _left_ambiguous(diag: psycopg.errors.Diagnostic) -> bool:
    """Whether a notice says a commit may not have reached the synchronous standby.

    PostgreSQL warns "canceling wait for synchronous replication due to user request"
    when a cancel reaches a commit that waits for its synchronous standby (the commit is
    kept locally and the call answers success), and "canceling the wait for synchronous
    replication and terminating connection …" when a terminate does
    (``src/backend/replication/syncrep.c``). A server whose ``lc_messages`` is not
    English words them otherwise: then only siglo's own cancels are caught, by the
    expired bound.
    """
    message = diag.message_primary or ""
    return (
        diag.severity_nonlocalized == "WARNING"
        and message.startswith("canceling")
        and "synchronous replication" in message
    )


class _Ambiguity:
    """The connections whose current call got the warning of :func:`_left_ambiguous`.

    Each connection gets one notice handler when it is opened; the handler marks the
    connection (by id: no reference from the handler back to the connection), and the
    call that ends on it reads and clears the mark.
    """

    __slots__ = ("marked",)

    def __init__(self) -> None:
        self.marked: set[int] = set()

    def watch(self, conn: AsyncConn) -> Callable[[psycopg.errors.Diagnostic], None]:
        """Mark ``conn`` whenever the server warns that a commit was left ambiguous;
        returns the handler added to it."""
        key = id(conn)
        marked = self.marked

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            if _left_ambiguous(diag):
                marked.add(key)

        conn.add_notice_handler(on_notice)
        return on_notice

    async def configure(self, conn: AsyncConn) -> None:
        """The pool's ``configure`` callback."""
        self.watch(conn)

    def take(self, conn: AsyncConn) -> bool:
        """Whether ``conn``'s call was left ambiguous (the mark is cleared)."""
        if not self.marked:
            return False
        key = id(conn)
        if key in self.marked:
            self.marked.discard(key)
            return True
        return False


class _Call:
    """One call's connection, the whole call bounded: ``async with db._bounded(doing)``.

    The bound runs from the wait for a pooled connection to the last row (see the module
    docstring); a call still running at its deadline fails with
    :class:`~siglo.errors.StorageAdapterError` saying it timed out. A class rather than
    a generator-based context manager: every statement goes through it.
    """

    __slots__ = ("_checkout", "_conn", "_db", "_doing", "_watch")

    def __init__(self, db: PostgresDatabase, doing: str) -> None:
        self._db = db
        self._doing = doing
        self._watch: Watch | None = None
        self._conn: AsyncConn | None = None
        self._checkout: AbstractAsyncContextManager[AsyncConn] | None = None

    async def __aenter__(self) -> AsyncConn:
        db = self._db
        checkout = self._checkout = db._connection()
        if db._watches is None:  # unbounded calls
            conn = self._conn = await checkout.__aenter__()
            return conn
        watch = self._watch = db._watches.start(asyncio.get_running_loop())
        try:
            conn = await checkout.__aenter__()
        except BaseException:
            db._watches.end(watch)
            raise
        if watch.expired:  # the bound passed just as the connection came: nothing sent
            db._watches.end(watch)
            await checkout.__aexit__(None, None, None)
            raise db.timed_out(self._doing)
        watch.conn = self._conn = conn
        return conn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        watch = self._watch
        checkout = self._checkout
        assert checkout is not None
        db = self._db
        conn = self._conn
        if watch is not None:
            # Before the connection goes back: no cancel or cut may reach its next call.
            assert db._watches is not None
            db._watches.end(watch)
            if watch.expired and conn is not None:
                # The cancel sent for this call travels on a connection of its own and
                # may reach the server after the call ended: given back, the connection
                # would have it cancel another caller's statement (a black-box auditor:
                # "canceling statement due to user request" on the next call). Closed,
                # the pool replaces it, and a late cancel finds no session to cancel.
                with suppress(Exception):
                    await conn.close()
        ambiguous = conn is not None and db._ambiguity.take(conn)
        await checkout.__aexit__(exc_type, exc, tb)
        if watch is not None and watch.expired:
            if isinstance(exc, psycopg.errors.QueryCanceled):
                # The server cancelled the statement: rolled back, not done.
                raise db.timed_out(self._doing, exc) from exc
            if exc is None or isinstance(exc, Exception):
                raise db.outcome_unknown(self._doing, exc) from exc
        if exc is not None and lost_in_flight(exc, conn):
            # Sent on a connection that was open (siglo_postgres.liveness), and lost
            # without a word from the server: it may have run and committed.
            raise db.lost_in_flight(self._doing, exc) from exc
        if ambiguous and (exc is None or isinstance(exc, Exception)):
            raise OutcomeUnknownError(
                f"{db.dialect_name} storage {self._doing} ({db.description})",
                "PostgreSQL cancelled the wait for the synchronous standby and committed "
                "locally only: the commit may be lost in a failover",
            ) from exc


class _Tx:
    def __init__(self, db: PostgresDatabase, conn: AsyncConn) -> None:
        self._db = db
        self._conn = conn

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            return await _fetch(self._conn, sql, params)
        except SigloError:
            raise
        except Exception as exc:
            raise self._db.wrap(exc, "running a statement") from exc


class PostgresDatabase(Database):
    """A PostgreSQL database reached through ``conninfo`` (or an application's engine)."""

    dialect_name = "postgresql"
    sa_dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    pyformat = True
    coalesce_reads = True
    """Concurrent checkpoint loads share one ``SELECT … IN (…)`` while a lookup runs
    (:mod:`siglo_sql.batching`): a pool runs ten statements at once, but each still costs
    a round trip and a statement's work in the server, and one statement for 30 ids
    costs little more than one for a single id (docs/benchmarks.md)."""
    sends_together = PIPELINE_MODE

    def __init__(
        self,
        conninfo: str,
        *,
        description: str,
        pool_min_size: int = DEFAULTS.pool_min_size,
        pool_max_size: int = DEFAULTS.pool_max_size,
        pool_timeout_ms: int = DEFAULTS.pool_timeout_ms,
        prepare_threshold: int | None = 0,
        engine: AsyncEngine | None = None,
        on_open: OnOpen | None = None,
        command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    ) -> None:
        super().__init__(
            on_open=on_open, description=description, command_timeout_ms=command_timeout_ms
        )
        self.conninfo = conninfo
        self.pool_min_size = pool_min_size
        self.pool_max_size = pool_max_size
        self.pool_timeout_ms = pool_timeout_ms
        self.prepare_threshold = prepare_threshold
        self.engine = engine
        self._pool: PooledConnections | None = None
        self._engine_open = False
        self._watches = (
            None if command_timeout_ms is None else Watches(ms_as_seconds(command_timeout_ms))
        )
        self._ambiguity = _Ambiguity()
        self._writing = 0
        """Keyed writes sent alone and not answered yet."""
        self._waiting_writes: list[_Write] | None = None
        """The keyed writes asked meanwhile, to go out together (:meth:`write`)."""
        self._senders: set[asyncio.Task[None]] = set()

    async def _connect(self) -> None:
        if self.engine is not None:
            async with self._engine_connection() as conn:
                await conn.execute("SELECT 1")
            self._engine_open = True
            return
        # Connecting is part of the call that needs it, and bounded with it: a server
        # that takes the connection and never answers (frozen, a stalled route) kept
        # each call waiting for libpq's connect_timeout (10 s by default) whatever the
        # call's command_timeout_ms, and a worker's retries with it.
        bound = None if self.command_timeout_ms is None else ms_as_seconds(self.command_timeout_ms)
        try:
            async with asyncio.timeout(bound):
                await self._open_pool(bound)
        except TimeoutError:
            raise self.timed_out("connecting") from None

    async def _open_pool(self, bound: float | None) -> None:
        """The probe connection, then the pool, filled (:meth:`_connect`)."""
        # One direct connection first: a refused connection, a wrong password or a
        # missing database fails at once with libpq's own message, where the pool would
        # retry until its timeout and report only that it timed out.
        probe = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        await probe.close()
        pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            self.conninfo,
            min_size=self.pool_min_size,
            max_size=self.pool_max_size,
            timeout=ms_as_seconds(self.pool_timeout_ms),
            kwargs={"autocommit": True, "prepare_threshold": self.prepare_threshold},
            configure=self._ambiguity.configure,
            reconnect_timeout=RECONNECT_ROUND_S,
            open=False,
            name="siglo",
        )
        pool_timeout_s = ms_as_seconds(self.pool_timeout_ms)
        opening_s = pool_timeout_s if bound is None else min(bound, pool_timeout_s)
        try:
            await pool.open(wait=True, timeout=opening_s)
        except BaseException:
            with suppress(Exception):
                await pool.close(timeout=0)
            raise
        # The wait for a connection is bounded like the call (whichever is shorter).
        wait_ms = min(self.pool_timeout_ms, self.command_timeout_ms or self.pool_timeout_ms)
        self._pool = PooledConnections(pool, self.pool_max_size, ms_as_seconds(wait_ms))

    async def _disconnect(self) -> None:
        self._engine_open = False
        pooled, self._pool = self._pool, None
        if pooled is not None:
            with suppress(Exception):
                await pooled.pool.close()

    @asynccontextmanager
    async def _engine_connection(self) -> AsyncIterator[AsyncConn]:
        assert self.engine is not None
        for _ in range(_ENGINE_REPLACEMENTS):
            async with self.engine.connect() as sa_conn:
                sa_conn = await sa_conn.execution_options(isolation_level="AUTOCOMMIT")
                raw = await sa_conn.get_raw_connection()
                conn = raw.driver_connection
                assert isinstance(conn, psycopg.AsyncConnection)
                if closed_while_idle(conn):
                    # Closed by the server in the engine's pool (siglo_postgres.liveness):
                    # dropped from it, and another connection taken (afresh, so that it
                    # gets the AUTOCOMMIT above: an invalidated connection reopened in
                    # place would not).
                    await sa_conn.invalidate()
                    continue
                # The application's connection: the notice handler is ours for this call.
                handler = self._ambiguity.watch(conn)
                try:
                    yield conn
                except BaseException:
                    if conn.closed:
                        # Lost under siglo's own use of the driver, which SQLAlchemy did
                        # not see: dropped, not reset (a reset would fail, logged as an
                        # ERROR with its traceback).
                        await sa_conn.invalidate()
                    raise
                finally:
                    conn.remove_notice_handler(handler)
                return
        raise StorageAdapterError(
            f"{self.description}: the engine handed out {_ENGINE_REPLACEMENTS} connections "
            "in a row that the server had closed"
        )

    def _connection(self) -> AbstractAsyncContextManager[AsyncConn]:
        if self._pool is not None:
            return self._pool.connection()
        if self.engine is not None and self._engine_open:
            return self._engine_connection()
        raise StorageAdapterError(f"{self.description} is closed")

    def _bounded(self, doing: str) -> _Call:
        """A connection for one call, the whole call bounded (see the module docstring)."""
        return _Call(self, doing)

    async def raw_fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._sent_again_after_a_deadlock(
            "running a statement", lambda conn: _fetch(conn, sql, params)
        )

    async def _sent_again_after_a_deadlock(
        self, doing: str, call: Callable[[AsyncConn], Awaitable[T]]
    ) -> T:
        """``call`` on a connection of its own, bounded; sent again (up to
        :data:`_DEADLOCK_ATTEMPTS` times) when the server failed it to break a deadlock."""
        for attempt in range(1, _DEADLOCK_ATTEMPTS + 1):
            try:
                async with self._bounded(doing) as conn:
                    return await call(conn)
            except SigloError:
                raise
            except psycopg.errors.DeadlockDetected as exc:
                if attempt == _DEADLOCK_ATTEMPTS:
                    raise self.wrap(exc, doing) from exc
            except Exception as exc:
                raise self.wrap(exc, doing) from exc
        raise AssertionError("unreachable")  # the last attempt returns or raises

    async def fetch_all(self, statements: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Run ``statements`` in order as one transaction, sent together: one round trip.

        psycopg's pipeline mode on an autocommit connection sends every statement, then
        one Sync; the server runs them as one implicit transaction, which the Sync commits
        (or, after an error, rolls back), and returns every result in that one reply. An
        explicit ``BEGIN`` … ``COMMIT`` would add a round trip at each end. Without
        pipeline mode (:data:`PIPELINE_MODE`), one after another in a transaction.
        """
        if not PIPELINE_MODE:
            return await super().fetch_all(statements)
        if not self._ready:
            await self.open()

        async def sent(conn: AsyncConn) -> list[list[Row]]:
            async with conn.pipeline():
                cursors = [await _execute(conn, sql, params) for sql, params in statements]
            return [await _rows(cur) for cur in cursors]

        return await self._sent_again_after_a_deadlock("in a transaction", sent)

    async def write(self, sql: str, params: Params = ()) -> list[Row]:
        """A keyed write: sent at once on a connection of its own when no other is under
        way; else it waits for the loop to come round with the other writes asked
        meanwhile, and they go out together, in one pipeline on one connection.

        Each write's outcome is its own (a compare-and-set that loses returns no row, not
        an error) and none is answered before the pipeline's one Sync has committed them:
        as durable as alone. A Sync after each write would commit each on its own, one
        WAL flush after another on one connection: at 32 callers that measured 202 writes
        a second against 1,330 for a connection per write and 3,040 for one Sync
        (``docs/backends/postgres.md``). If the server refuses one statement, the implicit
        transaction of them all is rolled back, and each is sent again alone, so that
        only its own caller gets the error.
        """
        if not self._ready:
            await self.open()
        if not PIPELINE_MODE:
            return await self.raw_fetch(sql, params)
        waiting = self._waiting_writes
        if waiting is None and not self._writing:
            self._writing += 1
            try:
                return await self.raw_fetch(sql, params)
            finally:
                self._writing -= 1
        future: asyncio.Future[list[Row]] = asyncio.get_running_loop().create_future()
        if waiting is None:
            waiting = self._waiting_writes = []
            task = asyncio.ensure_future(self._send_together(waiting))
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)
        waiting.append((sql, params, future))
        return await future

    async def _send_together(self, writes: list[_Write]) -> None:
        """Send the writes asked in one turn of the loop in one pipeline; answer each."""
        if self._waiting_writes is writes:
            self._waiting_writes = None
        self._writing += 1
        try:
            if len(writes) == 1:
                sql, params, future = writes[0]
                await self._answer(future, self.raw_fetch(sql, params))
                return
            try:
                async with self._bounded("writing together") as conn:
                    sent: list[psycopg.AsyncCursor[Any] | psycopg.Error] = []
                    async with conn.pipeline():
                        # A statement that waits for a row held elsewhere fails the
                        # batch (sent again alone, below), not holds its rows meanwhile.
                        await conn.execute(_BATCH_LOCK_TIMEOUT, binary=True)
                        for sql, params, _ in writes:
                            try:
                                sent.append(await _execute(conn, sql, params))
                            except psycopg.Error as exc:
                                if exc.pgresult is not None:
                                    raise  # the server's refusal: handled below
                                # Refused before it was sent (its parameters): only its
                                # caller fails; the others go on (the pipeline's Sync
                                # commits what was sent).
                                sent.append(exc)
                    results = [
                        cur if isinstance(cur, psycopg.Error) else await _rows(cur) for cur in sent
                    ]
            except psycopg.Error as exc:
                if exc.pgresult is None:
                    raise self.wrap(exc, "writing together") from exc
                # The server refused a statement, or one waited for a row longer than
                # the batch's lock timeout: the implicit transaction of them all was
                # rolled back. Each alone, so that only its own caller hears of a
                # refusal, and a wait for a row holds no other caller's.
                # Not a write whose caller has gone (cut off by its own deadline): the
                # rollback undid it, and its caller may have made up for it already (given
                # back a claim it might have made), which a write sent now would undo.
                await asyncio.gather(
                    *(
                        self._answer(f, self.raw_fetch(sql, params))
                        for sql, params, f in writes
                        if not f.done()
                    )
                )
                return
            for (_, _, future), answer in zip(writes, results, strict=True):
                if future.done():
                    continue
                if isinstance(answer, psycopg.Error):
                    future.set_exception(self.wrap(answer, "running a statement"))
                else:
                    future.set_result(answer)
        except BaseException as exc:
            for _, _, future in writes:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._writing -= 1

    @staticmethod
    async def _answer(future: asyncio.Future[list[Row]], call: Awaitable[list[Row]]) -> None:
        """``future`` gets what ``call`` returns or raises."""
        try:
            rows = await call
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(rows)

    @asynccontextmanager
    async def raw_transaction(self) -> AsyncIterator[Executor]:
        try:
            async with self._bounded("in a transaction") as conn, conn.transaction():
                yield _Tx(self, conn)
        except SigloError:
            raise
        except Exception as exc:
            raise self.wrap(exc, "in a transaction") from exc

    async def migration_lock(self, tx: Executor, name: str) -> None:
        # A transaction-level advisory lock: released at commit, and (unlike a session
        # lock) correct behind a transaction-pooling PgBouncer.
        await tx.fetch("SELECT pg_advisory_xact_lock(hashtext(%(name)s))", {"name": name})
