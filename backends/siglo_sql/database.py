"""The driver-level connection layer shared by the SQL backends.

SQLAlchemy describes the schema and compiles its DDL; the statements that run on every
checkpoint save, load, claim or CAS go straight to the driver connection (psycopg 3 or
aiosqlite), because SQLAlchemy's async execution costs about 120 µs a statement over raw
psycopg and several times raw aiosqlite's cost (see ``docs/backends/postgres.md``).

A :class:`Database` runs one statement with :meth:`Database.fetch` (autocommit), several
that need nothing from each other with :meth:`Database.fetch_all`, or several in
:meth:`Database.transaction`. Statements are written with named parameters
(``:name``) and converted to the driver's style once (:meth:`Database.sql`); the
parameters of a call are a dict. Every driver exception is wrapped in
:class:`~siglo.errors.StorageAdapterError` with the original as ``__cause__``.
"""

from __future__ import annotations

import abc
import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from sqlalchemy.engine import Dialect

from siglo.errors import OutcomeUnknownError, SigloError, StorageAdapterError, past_its_bound
from siglo.settings import DEFAULTS
from siglo.validation import require_ttl_ms

__all__ = ["Database", "Executor", "OnOpen", "Params", "Plan", "Row"]

Row = tuple[Any, ...]

Params = Mapping[str, Any] | Sequence[Any]

Plan = Generator[tuple[str, Params], list[Row], None]
"""A transaction's statements as a generator: it yields each ``(sql, params)`` and is
sent that statement's rows, so one plan runs on any driver, awaited or not
(:meth:`Database.run_plan`). An exception it raises undoes the transaction."""
"""A statement's parameters: a dict for siglo's named statements (``()`` for none)."""

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
"""A ``:name`` parameter (not a ``::`` cast, not part of a word)."""


class Executor(Protocol):
    """Runs statements on one connection (inside a transaction, or autocommit)."""

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one statement; its rows (``[]`` for a statement without a result)."""
        ...


OnOpen = Callable[["Database"], Awaitable[None]]
"""Called once the first connection works, before any other statement: the schema check."""


class Database(abc.ABC):
    """One siglo database: how to reach it, and how to run statements on it.

    It opens lazily: the first :meth:`fetch` or :meth:`transaction` connects, then runs
    ``on_open`` (the schema version check, or the automatic migration) before anything
    else may run. A failed open leaves it closed, so the next call tries again.
    """

    dialect_name: str
    """``"sqlite"`` or ``"postgresql"``."""
    sa_dialect: Dialect
    """The SQLAlchemy dialect that compiles DDL and quotes identifiers."""
    pyformat: bool = False
    """Whether the driver names parameters ``%(name)s`` (psycopg) instead of ``:name``
    (sqlite3)."""
    coalesce_reads: bool = False
    """Whether concurrent keyed reads should share one statement
    (:mod:`siglo_sql.batching`): SQLite's one connection and PostgreSQL's pool both say
    yes (each statement is a round trip and a statement's work in the server)."""
    answers_per_turn: int | None = None
    """How many callers a batch of concurrent calls (coalesced reads, a group commit)
    answers in one turn of the event loop at most, the rest in the turns after (``None``:
    all at once). Each answered caller resumes in the turn after its answer, so a batch
    of 32 answered at once is one turn of 32 callers' work (loads: about 1.4 ms), and a
    coroutine that waits for the loop waits for that turn and the one before it."""
    sends_together: bool = False
    """Whether :meth:`fetch_all` sends its statements in one round trip (PostgreSQL's
    pipeline mode), so that a write gains nothing by being sent alone: the release of a
    workflow lock then goes with the action's last save."""

    def __init__(
        self,
        *,
        on_open: OnOpen | None = None,
        description: str = "",
        command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    ) -> None:
        self.on_open = on_open
        self.description = description
        self.command_timeout_ms = require_ttl_ms(
            "command_timeout_ms", command_timeout_ms, optional=True
        )
        """The bound on each call, including the wait for a lock or a connection
        (``None``: unbounded)."""
        self._ready = False
        self._connected = False
        self._closed = False
        self._opening = asyncio.Lock()

    def exists(self) -> bool:
        """Whether the database is there already; a server's database is (connecting
        says otherwise), a file may not be, and looking must not create it."""
        return True

    def sql(self, text: str) -> str:
        """``text``, written with ``:name`` parameters, in this driver's style.

        Called once per statement when a backend is built, never per call.
        """
        return _NAMED.sub(r"%(\1)s", text) if self.pyformat else text

    def wrap(self, exc: BaseException, doing: str) -> StorageAdapterError:
        """A driver failure as siglo's error, naming the database and what was done."""
        return StorageAdapterError(
            f"{self.dialect_name} storage failed {doing} ({self.description}): "
            f"{type(exc).__name__}: {exc}"
        )

    def timed_out(self, doing: str, cause: BaseException | None = None) -> StorageAdapterError:
        """The error of a call that did not finish within its bound (``cause``: the
        driver's last word, if any)."""
        last = "" if cause is None else f"; last error {type(cause).__name__}: {cause}"
        return past_its_bound(
            StorageAdapterError(
                f"{self.dialect_name} storage timed out {doing} ({self.description}): not "
                f"done within its bound ({self.bound_text}; a lock held elsewhere, or a "
                f"stalled server){last}"
            )
        )

    def outcome_unknown(
        self, doing: str, cause: BaseException | None = None
    ) -> OutcomeUnknownError:
        """The error of a call that ended past its bound after its request may have
        reached the server: it may or may not have taken effect (``cause``: the
        driver's last word, if any; ``None`` for a call that succeeded too late)."""
        last = "" if cause is None else f"; last error {type(cause).__name__}: {cause}"
        return past_its_bound(
            OutcomeUnknownError(
                f"{self.dialect_name} storage {doing} ({self.description})",
                f"timed out: not answered within its bound ({self.bound_text}), and the "
                f"server may have run it{last}",
            )
        )

    def lost_in_flight(self, doing: str, cause: BaseException) -> OutcomeUnknownError:
        """The error of a call whose connection was lost, without a word from the server,
        after its statement was sent: it may or may not have taken effect."""
        return OutcomeUnknownError(
            f"{self.dialect_name} storage {doing} ({self.description})",
            "the connection was lost with the call in flight, and the server may have run "
            f"it; {type(cause).__name__}: {cause}",
        )

    @property
    def bound_text(self) -> str:
        """The setting(s) that bound a call, as an error message names them."""
        return f"command_timeout_ms={self.command_timeout_ms}"

    async def open(self) -> None:
        """Connect and run the schema check now (otherwise the first call does)."""
        if self._ready:
            return
        async with self._opening:
            if self._ready:
                return
            await self._connect_once()
            try:
                if self.on_open is not None:
                    await self.on_open(self)
            except BaseException:
                await self._reset()
                raise
            self._ready = True

    async def connect_unchecked(self) -> None:
        """Connect without the schema check, for the migrations and ``siglo migrate``.

        Only the ``raw_*`` methods may be used until :meth:`open` has succeeded.
        """
        async with self._opening:
            await self._connect_once()

    async def _connect_once(self) -> None:
        if self._closed:
            raise StorageAdapterError(f"{self.description}: the backend is closed")
        if self._connected:
            return
        try:
            await self._connect()
        except SigloError:
            raise
        except Exception as exc:
            raise self.wrap(exc, "connecting") from exc
        self._connected = True

    async def aclose(self) -> None:
        """Close the connections this database opened (never a user's engine).

        Idempotent; afterwards every call raises :class:`StorageAdapterError`.
        """
        self._closed = True
        await self._reset()

    async def _reset(self) -> None:
        self._ready = False
        self._connected = False
        await self._disconnect()

    @abc.abstractmethod
    async def _connect(self) -> None: ...

    @abc.abstractmethod
    async def _disconnect(self) -> None: ...

    @abc.abstractmethod
    async def raw_fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """:meth:`fetch` without the open check (used while opening)."""

    @abc.abstractmethod
    def raw_transaction(self) -> Any:
        """:meth:`transaction` without the open check (used while opening)."""

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one statement in its own (autocommit) transaction; its rows."""
        if not self._ready:
            await self.open()
        return await self.raw_fetch(sql, params)

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        """A keyed read of a few rows, outside any transaction: :meth:`fetch` here; a
        dialect may answer it without a hop to a driver thread (SQLite)."""
        return await self.fetch(sql, params)

    async def write(self, sql: str, params: Params = ()) -> list[Row]:
        """A keyed write of a row or two, one statement outside any transaction (a
        checkpoint's save or compare-and-set, a cache entry, a wait record's, idempotency
        key's, lock's or nonce's transition): :meth:`fetch` here; a dialect may run it
        without a hop to a driver thread (SQLite)."""
        return await self.fetch(sql, params)

    async def fetch_all(self, statements: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Run ``statements`` in order as one transaction; the rows of each.

        For statements that need nothing from each other's results and where no result
        decides whether to commit: an error in any of them undoes them all. Here they run
        one after another in :meth:`transaction`; a dialect may send them together
        (PostgreSQL: pipeline mode, one round trip).
        """
        async with self.transaction() as tx:
            return [await tx.fetch(sql, params) for sql, params in statements]

    async def run_plan(self, plan: Plan) -> None:
        """Run ``plan`` (see :data:`Plan`) in one write transaction; commits unless it
        raises. A dialect may run it without awaiting between statements (SQLite)."""
        async with self.transaction() as tx:
            try:
                step = next(plan)
                while True:
                    step = plan.send(await tx.fetch(*step))
            except StopIteration:
                pass

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        """A write transaction (SQLite: ``BEGIN IMMEDIATE``); commits unless it raises."""
        if not self._ready:
            await self.open()
        async with self.raw_transaction() as tx:
            yield tx

    @abc.abstractmethod
    async def migration_lock(self, tx: Executor, name: str) -> None:
        """Inside ``tx``, wait until no other process is migrating ``name``."""
