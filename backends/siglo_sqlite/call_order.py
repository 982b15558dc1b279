"""Keeping one backend's calls in the order they were asked, across its connections.

Calls run on aiosqlite's thread (in the order submitted) or inline on the event loop's
thread (at once). The inline connections keep the order only if a call asked while
earlier ones are still under way runs after them: such a call waits its turn on the loop
(:meth:`CallOrder.turn`) and then runs inline, instead of queueing on the driver: with 32
callers the driver never emptied once one call was on it, and every call took the hop.
A batch of writes (:mod:`siglo_sqlite.group_commit`) takes its place in line when its
first write is asked (:meth:`CallOrder.reserve`) and its turn when its task runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

__all__ = ["CallOrder", "Place"]


@dataclass(eq=False)
class Place:
    """A place in line taken when work was asked, for a turn taken later
    (:meth:`CallOrder.reserve`): a batch of writes (:mod:`siglo_sqlite.group_commit`)."""

    until: int
    """The driver calls asked before it (it waits until every one numbered below has
    answered)."""
    before: asyncio.Future[None] | None
    """The place reserved before it, if that work has not ended yet."""
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """Done once its turn has ended: calls asked after it wait for this."""
    taken: bool = False
    """Whether its turn was begun (``turn(place)``)."""


class CallOrder:
    """The calls on the driver not answered yet, and the line of calls waiting their turn."""

    def __init__(self) -> None:
        self._tickets = 0
        """Calls submitted to the aiosqlite connection so far (each call's number)."""
        self._open_tickets: set[int] = set()
        """The numbers of those not answered yet."""
        self._answer_waits: list[tuple[int, asyncio.Future[None]]] = []
        """Calls waiting until every call numbered below theirs has answered."""
        self._line = asyncio.Lock()
        """The turn of calls that wait (:meth:`turn`): first come, first served."""
        self.in_line = 0
        """Calls waiting for their turn or holding it: calls asked meanwhile queue too."""
        self._ahead: asyncio.Future[None] | None = None
        """The last place reserved (:meth:`reserve`), until its turn ends: calls asked
        after it wait for it before they queue."""

    @property
    def on_driver(self) -> int:
        """Statements submitted to the aiosqlite connection and not answered yet."""
        return len(self._open_tickets)

    @contextmanager
    def driver_call(self) -> Iterator[None]:
        """Around one call on the aiosqlite connection: numbered when it is asked,
        answered when the block ends (however it ends)."""
        ticket = self._tickets
        self._tickets = ticket + 1
        self._open_tickets.add(ticket)
        try:
            yield
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

    def reserve(self) -> Place:
        """Take a place in line now for work whose turn is taken later with
        ``turn(place)``: calls asked from now on run after that work, as if it had
        queued when it was reserved."""
        place = Place(self._tickets, self._ahead)
        self._ahead = place.done
        self.in_line += 1
        return place

    def give_up(self, place: Place) -> None:
        """Let go of ``place`` if its turn was never begun (its task was cancelled
        before it ran): the calls asked after it go on."""
        if not place.taken:
            place.taken = True
            self.in_line -= 1
            if not place.done.done():
                place.done.set_result(None)
            if self._ahead is place.done:
                self._ahead = None

    @asynccontextmanager
    async def turn(self, place: Place | None = None) -> AsyncIterator[None]:
        """Queue behind the calls waiting already, then wait for the driver's calls asked
        before this one: what follows runs after every call asked before it.

        Calls asked while any waits queue behind it (first come, first served), so none
        overtakes another. This wait is the one the call would have had queued behind
        those calls on the driver: not cut short, since the bound is on waits for a lock,
        not on the work of calls asked before (each of which is bounded the same way). It
        counts against the call's bound if the call then meets a lock: its deadline runs
        from when it was asked (the caller keeps that time).
        """
        if place is None:
            until, before = self._tickets, self._ahead
            self.in_line += 1
        else:
            until, before = place.until, place.before
            place.taken = True
        try:
            if before is not None and not before.done():
                await asyncio.wait({before})
            async with self._line:
                await self._answered(until)
                yield
        finally:
            self.in_line -= 1
            if place is not None:
                if not place.done.done():
                    place.done.set_result(None)
                if self._ahead is place.done:
                    self._ahead = None
