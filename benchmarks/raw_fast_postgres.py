"""The raw-fast PostgreSQL baseline: psycopg 3 with batched loads and pipelined saves.

:mod:`benchmarks.raw_postgres` with two techniques a competent user adds in a few lines:

* **loads batched**: the callers that ask for a checkpoint in the same event-loop tick are
  answered by one ``SELECT stack_id, doc … WHERE stack_id = ANY(%s)``; a batch is taken
  when the loop comes round, and batches taken in later ticks run on other connections
  of the pool meanwhile (several in flight keep the server busy);
* **saves pipelined**: the saves queued in the same tick (32 callers) are sent on one
  connection in psycopg's pipeline mode, each still its own single-statement
  compare-and-set with its own outcome (a lost one returns no row, not an error); a lone
  save is sent as raw's is. In autocommit, PostgreSQL runs the statements between two
  Syncs as one implicit transaction, and psycopg sends one Sync at the end of the block:
  the batch is committed once (one WAL flush), and every reply comes after that commit,
  so each save is as durable when its caller hears of it as raw's. An error in one
  statement would abort the batch's others (none occurs here: the statements only
  return rows or none).

Everything else (schema, documents, pool, prepared statements, binary results, the other
operations) is raw's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks import raw_sql as q
from benchmarks.payloads import now_ms, wire_document
from benchmarks.raw_postgres import (
    _SAVE_EXPECTED,
    _SAVE_PLAIN,
    _SAVE_ZERO,
    RawPostgresSubject,
)
from benchmarks.subject import Conflict

_LOAD_MANY = q.render(
    """SELECT stack_id, doc FROM checkpoints
WHERE namespace = '' AND stack_id = ANY({p}) AND (expires_at IS NULL OR expires_at > {p})""",
    p="%s",
)


class _TickBatcher:
    """Queue items; ``run(batch)`` gets every item queued in one loop tick."""

    def __init__(
        self, run: Callable[[list[tuple[Any, asyncio.Future[Any]]]], Awaitable[None]]
    ) -> None:
        self._run = run
        self._queue: list[tuple[Any, asyncio.Future[Any]]] = []
        self._scheduled = False
        # The tasks in flight, held so none is collected before it finishes.
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.items = 0

    def submit(self, item: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((item, future))
        if not self._scheduled:
            self._scheduled = True
            task = loop.create_task(self._take())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return future

    async def _take(self) -> None:
        batch, self._queue = self._queue, []
        self._scheduled = False  # later callers start a batch of their own
        self.batches += 1
        self.items += len(batch)
        try:
            await self._run(batch)
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise


class RawFastPostgresSubject(RawPostgresSubject):
    """psycopg 3 pool; loads merged per tick, saves pipelined per tick."""

    kind = "raw-fast"
    backend = "postgres"

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.detail += "; loads merged per loop tick (= ANY), saves pipelined per loop tick"
        self._loads = _TickBatcher(self._load_batch)
        self._saves = _TickBatcher(self._save_batch)

    async def _load_batch(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        assert self.pool is not None
        ids = list(dict.fromkeys(stack_id for stack_id, _ in batch))
        async with self.pool.connection() as conn:
            cur = await conn.execute(_LOAD_MANY, (ids, now_ms()), prepare=True, binary=True)
            found = {row[0]: row[1] for row in await cur.fetchall()}
        for stack_id, future in batch:
            if not future.done():
                future.set_result(found.get(stack_id))

    async def _save_batch(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        assert self.pool is not None
        async with self.pool.connection() as conn:
            if len(batch) == 1:
                (stmt, params), future = batch[0]
                cur = await conn.execute(stmt, params, prepare=True, binary=True)
                row = await cur.fetchone()
                if not future.done():  # its caller may have been cancelled meanwhile
                    future.set_result(row)
                return
            async with conn.pipeline():
                cursors = [
                    await conn.execute(stmt, params, prepare=True, binary=True)
                    for (stmt, params), _ in batch
                ]
            for cur, (_, future) in zip(cursors, batch, strict=True):
                row = await cur.fetchone()
                if not future.done():
                    future.set_result(row)

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        doc = self._doc(wire_document(stack_id, revision, contexts, expires_at=expires_at))
        now = now_ms()
        item: tuple[str, tuple[Any, ...]]
        if expected_revision is None:
            item = (_SAVE_PLAIN, (stack_id, revision, doc, expires_at, now))
        elif expected_revision == 0:
            item = (_SAVE_ZERO, (stack_id, revision, doc, expires_at, now))
        else:
            item = (_SAVE_EXPECTED, (revision, doc, expires_at, stack_id, expected_revision, now))
        if await self._saves.submit(item) is None:
            raise Conflict

    async def load(self, stack_id: str) -> int | None:
        column = await self._loads.submit(stack_id)
        if column is None:
            return None
        revision: int = self._decode(column)["revision"]
        return revision
