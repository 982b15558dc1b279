"""Group commit: the keyed writes that concurrent callers ask within one turn of the event
loop, committed as one transaction on the writer connection.

A write that runs alone runs at once (:meth:`SqliteDatabase.write`: one autocommit
statement on the loop's thread, no turn of the loop). A write that cannot run at once (a
call ahead of it, the WAL's checkpoint in the way) or that comes after the inline work has
held the loop for :data:`HOLD_S` joins the *batch* being collected, or opens one: the batch
takes its place in line when it opens (:meth:`CallOrder.reserve`, so calls asked after its
first write run after it, as they would after that write), collects every write asked
until its task runs (the next turn of the loop), then runs them in one ``BEGIN IMMEDIATE``
… ``COMMIT``. Each keeps its own result: a statement that fails is undone alone (SQLite
undoes a failed statement, not its transaction), a plan (:data:`siglo_sql.database.Plan`)
runs in a ``SAVEPOINT`` of its own and is rolled back to it if it raises; the error goes
to its caller only. No caller is answered before the ``COMMIT``: what returned is
committed, as durably as one write alone. A batch holds the loop for at most
:data:`BATCH_BUDGET_S` (and :data:`BATCH_MAX` writes): the rest commit in the next turn.
Its callers are answered :data:`ANSWERS_PER_TURN` a turn of the loop, so that their
work, which resumes in the turn after each answer, leaves the loop turning too (the
reads coalesced by :mod:`siglo_sql.batching` are answered the same way). Once a batch
of several has committed, the next write opens the next batch at once instead of
running alone first: the callers it answered ask again together.

Where a commit syncs (``synchronous`` ``FULL`` or ``EXTRA``) no write runs on the loop:
every keyed write goes to a batch, and the batch's statements run in one transaction on
a writer of their own on the backend's thread (one sync of the WAL per batch). Plans
(transactions) stay on the aiosqlite connection there.

A lock in the way (a transaction open on the aiosqlite connection, another process's
write lock) sends a batch's writes to the aiosqlite connection one by one, each bounded
from when it was asked, as a write alone would go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from siglo_sql.database import Params, Plan, Row

__all__ = [
    "ANSWERS_PER_TURN",
    "BATCH_BUDGET_S",
    "BATCH_MAX",
    "GAP_S",
    "HOLD_S",
    "Entry",
    "answer_in_turns",
    "settle",
]

BATCH_MAX: Final = 64
"""The most writes one batch collects; the next opens another."""
BATCH_BUDGET_S: Final = 0.002
"""How long one transaction of a batch may run before it commits (the writes left commit
in another, after a turn of the loop)."""
HOLD_S: Final = 0.002
"""How long inline work (keyed reads and writes run at once) may hold the event loop
before a call yields it: a read waits a turn of the loop, a write joins a batch."""
ANSWERS_PER_TURN: Final = 8
"""How many callers a batch answers in one turn of the loop (the rest in the turns
after). Each resumes in the turn after its answer: 32 answered at once made turns of
1.4-2.3 ms, and a coroutine waiting for the loop waits for such a turn and the one
before it: a 1 ms sleeper beside 32 callers woke 5.5-6.7 ms late at p99, 8 a turn
4.0-4.5 ms, at 2-14 % fewer operations a second (docs/backends/sqlite.md, issue 36).
A shorter hold and budget (1 ms) took it to 2.4-3.9 ms but let eight writers of one
stack conflict more: a fifth fewer updates a second."""
GAP_S: Final = 0.0005
"""Inline calls further apart than this start a new stretch of holding the loop."""


@dataclass(eq=False, slots=True)
class Entry:
    """One write of a batch: a statement (``sql``, ``params``) or a ``plan``."""

    sql: str
    params: Params
    plan: Plan | None
    start: float
    """When it was asked (``time.monotonic()``): its waits end at ``start`` plus the bound."""
    future: asyncio.Future[list[Row]]


def settle(entry: Entry, rows: list[Row] | None, error: BaseException | None = None) -> None:
    """Answer ``entry``'s caller (unless it gave up waiting)."""
    future = entry.future
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result([] if rows is None else rows)


async def answer_in_turns(
    answers: Sequence[tuple[Entry, list[Row] | None, BaseException | None]],
    per_turn: int | None = ANSWERS_PER_TURN,
) -> None:
    """Answer ``answers`` (committed, or failed), ``per_turn`` callers a turn of the loop
    (``None``: all at once). Cancelled between turns, it answers the rest at once before
    it stops: what committed is never reported otherwise."""
    step = per_turn or len(answers) or 1
    for at in range(0, len(answers), step):
        if at:
            try:
                await asyncio.sleep(0)
            except BaseException:
                for entry, rows, error in answers[at:]:
                    settle(entry, rows, error)
                raise
        for entry, rows, error in answers[at : at + step]:
            settle(entry, rows, error)
