"""Concurrent keyed reads answered by one statement.

An SQLite backend has one connection, and aiosqlite runs its statements one at a time on
the connection's thread, each a hop to that thread and a wake-up of the event loop when
it is done. When 32 tasks load checkpoints at once, that per-statement cost is most of
the work. On PostgreSQL a pool runs several statements at once, but each is still a
round trip and a statement's work in the server; one for 30 ids costs little more.
:class:`KeyedReads` lets the first caller run its lookup at once, alone (no
added latency when calls come one by one), and answers every caller that arrives while
a lookup is running with one ``SELECT … WHERE id IN (…)`` when it is done; callers that
ask again as soon as a batch has answered them share the next batch.

Each batch is one statement, so each caller's answer comes from one consistent snapshot
taken after the caller asked: what it would have read had it run alone at that moment.

Lookups go through :meth:`Database.read`: on an SQLite file a lookup made while the driver
connection is idle runs inline on the reader connection and returns before anyone can
queue behind it, so batches form only while writes or other reads are in flight.

Every caller is answered or fails within the database's ``command_timeout_ms`` counted
from its own call, as a lookup of its own would be. A queued caller waits for the lookup
running when it came and then for its batch, each bounded on its own; without a bound of
its own it failed, under a stalled server, only after two bounds or more (one per batch
ahead of its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from siglo.validation import ms_as_seconds
from siglo_sql.database import Database
from siglo_sql.rows import stored_bytes

__all__ = ["DEFAULT_MAX_BATCH", "KeyedReads"]

DEFAULT_MAX_BATCH: Final = 64
"""Keys per statement at most (SQLite allows 32,766 parameters; a short ``IN`` list
keeps each statement quick so the next batch is not kept waiting)."""


class KeyedReads:
    """Lookups of one value by row id, coalesced while one is running.

    ``single`` is the SQL that reads ``(value, …)`` rows for parameters ``:id`` and
    ``:now``; ``many(n)`` returns the SQL that reads ``(id, value, …)`` rows for
    parameters ``:id0`` … ``:id<n-1>`` and ``:now`` (built once per ``n``). ``clock``
    gives the ``now`` of each statement, read when it is sent. :meth:`get` answers the
    value, :meth:`get_row` the value and the columns after it. ``fold``, when given,
    makes one answer of all the rows of a key (a statement that reads several rows per
    key, as a checkpoint's with its parts); else the first row is the answer.
    """

    def __init__(
        self,
        database: Database,
        single: str,
        many: Callable[[int], str],
        clock: Callable[[], int],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        fold: Callable[[list[tuple[Any, ...]]], tuple[Any, ...]] | None = None,
    ) -> None:
        self._db = database
        self._fold = fold
        self._single = single
        self._many = many
        self._sql: dict[int, str] = {}
        self._clock = clock
        self._max_batch = max_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._waiting: dict[bytes, list[asyncio.Future[tuple[Any, ...] | None]]] = {}
        self._drainer: asyncio.Task[None] | None = None

    async def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key`` (``None``: no live row)."""
        row = await self.get_row(key)
        return None if row is None else stored_bytes(row[0])

    async def get_row(self, key: bytes) -> tuple[Any, ...] | None:
        """The value stored under ``key`` and the columns read after it (``None``: no
        live row)."""
        loop = asyncio.get_running_loop()
        if self._running and self._loop is loop:
            future: asyncio.Future[tuple[Any, ...] | None] = loop.create_future()
            self._waiting.setdefault(key, []).append(future)
            return await self._answer(key, future)
        if self._loop is not loop:
            # Used from a new event loop: a lookup left running on the old one (its loop
            # closed under it) will never hand over, so nothing may wait for it.
            self._loop, self._waiting, self._drainer = loop, {}, None
        self._running = True
        try:
            rows = await self._db.read(self._single, {"id": key, "now": self._clock()})
        finally:
            if self._waiting:
                self._hand_over()
            else:  # nobody queued (every call, when calls come one by one)
                self._running = False
        if not rows:
            return None
        if self._fold is not None:
            return self._fold([tuple(row) for row in rows])
        return tuple(rows[0])

    async def _answer(
        self, key: bytes, future: asyncio.Future[tuple[Any, ...] | None]
    ) -> tuple[Any, ...] | None:
        """A queued caller's answer, within the bound counted from its call."""
        bound_ms = self._db.command_timeout_ms
        if bound_ms is None:
            return await future
        # A timer, not asyncio.wait_for: awaiting the future itself resumes the caller in
        # the very turn its batch answers, so that callers asking again at once still
        # share the next batch (wait_for would wake them a turn later, one by one).
        assert self._loop is not None
        timer = self._loop.call_later(ms_as_seconds(bound_ms), self._expire, key, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, key: bytes, future: asyncio.Future[tuple[Any, ...] | None]) -> None:
        """A queued caller's deadline passed: it fails now, and no batch reads for it."""
        if future.done():
            return
        queued = self._waiting.get(key)
        if queued is not None and future in queued:
            queued.remove(future)
            if not queued:
                del self._waiting[key]
        future.set_exception(self._db.timed_out("waiting for a batched read"))

    def _hand_over(self) -> None:
        """After a lookup: answer whoever queued behind it, or stand down."""
        if self._waiting:
            # A task of its own, so the caller that ran the lookup returns now.
            assert self._loop is not None
            self._drainer = self._loop.create_task(self._drain())
        else:
            self._running = False

    async def _drain(self) -> None:
        batch: dict[bytes, list[asyncio.Future[tuple[Any, ...] | None]]] = {}
        try:
            while True:
                if not self._waiting:
                    # The callers a batch answered resume in the loop's next turn, and
                    # under load most ask again at once: wait that turn, so that their
                    # lookups share the next batch instead of the first of them running
                    # alone ahead of the rest, a round trip more per batch (measured
                    # in docs/benchmarks.md). Nobody's answer waits for this turn: only
                    # the next batch does.
                    await asyncio.sleep(0)
                    if not self._waiting:
                        break
                keys = list(self._waiting)[: self._max_batch]
                batch = {key: self._waiting.pop(key) for key in keys}
                try:
                    params: dict[str, Any] = {f"id{i}": key for i, key in enumerate(keys)}
                    params["now"] = self._clock()
                    rows = await self._db.read(self._statement(len(keys)), params)
                except Exception as exc:  # the statement failed: so does every read in it
                    for futures in batch.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                if self._fold is None:
                    found = {bytes(row[0]): tuple(row[1:]) for row in rows}
                else:
                    grouped: dict[bytes, list[tuple[Any, ...]]] = {}
                    for row in rows:
                        grouped.setdefault(bytes(row[0]), []).append(tuple(row[1:]))
                    found = {key: self._fold(group) for key, group in grouped.items()}
                # At most answers_per_turn callers resume in one turn of the loop
                # (Database.answers_per_turn); the rest wait a turn each such group.
                per_turn = self._db.answers_per_turn
                answered = 0
                turns = 0
                for key in list(batch):
                    if per_turn is not None and answered >= per_turn:
                        await asyncio.sleep(0)
                        answered = 0
                        turns += 1
                    value = found.get(key)
                    for future in batch.pop(key):
                        if not future.done():
                            future.set_result(value)
                            answered += 1
                if turns:
                    # The callers answered last resume in the next turn, and most ask
                    # again at once: the next batch waits for them, as for the rest.
                    await asyncio.sleep(0)
        finally:
            self._running = False
            self._drainer = None
            # Stopped by cancellation (the loop is closing): nobody may be left waiting.
            left = [*batch.values(), *self._waiting.values()]
            self._waiting = {}
            for futures in left:
                for future in futures:
                    if not future.done():
                        future.cancel()

    def _statement(self, n: int) -> str:
        sql = self._sql.get(n)
        if sql is None:
            sql = self._sql[n] = self._many(n)
        return sql
