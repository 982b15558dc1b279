"""The deadlines of a PostgreSQL database's calls in flight, kept with one timer.

Every call is bounded by ``command_timeout_ms`` (see :mod:`siglo_postgres.database`).
A timer armed and cancelled per call (``loop.call_at``) cost ~3.5 µs of a call's CPU;
here every call of one database has the same timeout and registers when it starts, so
the calls in flight are in deadline order, and one timer, set for the oldest, serves
them all: a call costs a dict insert and delete. When the timer fires it expires every
call past its deadline and is set again for the next one.

An expired call is not cancelled (psycopg would then wait up to 10 s for the server to
acknowledge): the server is asked to cancel what the call's connection runs, and if the
call is still running :data:`SEVER_AFTER_MS` later, the connection's socket is shut down
so that the call reads end-of-file and fails at once.
"""

from __future__ import annotations

import asyncio
import os
import socket
from contextlib import suppress
from typing import Any, Final

import psycopg

__all__ = ["SEVER_AFTER_MS", "Watch", "Watches"]

SEVER_AFTER_MS: Final = 1_000
"""How long past its bound a cancelled call may wait for the server to acknowledge the
cancellation before its connection is cut (psycopg alone would wait up to 10 s)."""

AsyncConn = psycopg.AsyncConnection[Any]

_BACKGROUND: set[asyncio.Task[None]] = set()
"""Cancel requests still in flight after their call ended (kept from the collector)."""


class Watch:
    """The deadline of one call; :attr:`conn` is set once the call has a connection."""

    __slots__ = ("_loop", "_sever_timer", "conn", "deadline", "expired")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        self.deadline = deadline
        self.conn: AsyncConn | None = None
        self.expired = False
        self._loop = loop
        self._sever_timer: asyncio.TimerHandle | None = None

    def expire(self) -> None:
        """The deadline passed: cancel on the server what the connection runs, and cut
        the connection if that does not end the call soon. A call still waiting for a
        connection sees :attr:`expired` when it gets one (its wait has the same bound)."""
        self.expired = True
        if self.conn is None:
            return
        task = self._loop.create_task(self._cancel(self.conn))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)
        self._sever_timer = self._loop.call_later(SEVER_AFTER_MS / 1000, self._sever)

    @staticmethod
    async def _cancel(conn: AsyncConn) -> None:
        with suppress(Exception):
            await conn.cancel_safe(timeout=SEVER_AFTER_MS / 1000)

    def _sever(self) -> None:
        self._sever_timer = None
        conn = self.conn
        if conn is None:
            return
        with suppress(Exception), socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """The call ended: nothing of it may touch the connection any more."""
        if self._sever_timer is not None:
            self._sever_timer.cancel()
            self._sever_timer = None


class Watches:
    """The watches of one database's calls in flight, each ``timeout_s`` long."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight: dict[Watch, None] = {}
        """Insertion order is deadline order (one timeout, registered at the start)."""
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> Watch:
        """The watch of a call starting now."""
        if loop is not self._loop:
            # Used from a new event loop: the old loop's timer will never run.
            self._loop, self._inflight, self._timer = loop, {}, None
        watch = Watch(loop, loop.time() + self.timeout_s)
        self._inflight[watch] = None
        if self._timer is None:
            self._timer = loop.call_at(watch.deadline, self._fire)
        return watch

    def end(self, watch: Watch) -> None:
        """The call of ``watch`` ended (before its connection goes back to the pool)."""
        self._inflight.pop(watch, None)
        watch.close()

    def _fire(self) -> None:
        """Expire every call past its deadline; set the timer for the next one."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        while self._inflight:
            watch = next(iter(self._inflight))
            if watch.deadline > now:
                self._timer = loop.call_at(watch.deadline, self._fire)
                return
            del self._inflight[watch]
            watch.expire()
