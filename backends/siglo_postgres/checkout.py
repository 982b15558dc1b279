"""Connections from psycopg's pool, with the wait for a free one kept in front of it.

psycopg_pool opens, checks, replaces and closes the connections, and siglo keeps it for
that. But a caller that finds no connection free waits inside the pool through a
``WaitingClient`` — an asyncio condition and an ``asyncio.wait_for`` task per waiter —
and at 32 callers on 10 connections that wait measured ~45 µs of CPU per call, on
calls of ~300 µs of client CPU in all (docs/benchmarks.md): with the client's one
thread the bottleneck, a seventh of the throughput. Here a gate with one permit per
connection stands in front of the pool. Callers wait at the gate in turn, first come
first served, at the price of one future each, and whoever passes finds a connection
free, so the pool does not queue them itself. A caller that passes while the pool is
short of connections (still growing to its size, or replacing a broken one) waits in the
pool as before, for what is left of its timeout.

A connection the server closed while it sat in the pool is replaced before it is handed
out (:mod:`siglo_postgres.liveness`).

``getconn``/``putconn`` rather than ``pool.connection()``: that context manager also
enters the connection's own context, whose exit commits — nothing to commit on siglo's
autocommit connections, yet a lock and a wait each time (~10 µs). ``putconn`` still
rolls back or discards a connection given back in a transaction or broken.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType
from typing import Any, Final

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from siglo_postgres.liveness import closed_while_idle

__all__ = ["ASK_AGAIN_S", "Checkout", "Gate", "PooledConnections"]

AsyncConn = psycopg.AsyncConnection[Any]


class Gate:
    """At most ``size`` holders at a time; the others wait in turn, each at most
    ``timeout_s`` (then :class:`psycopg_pool.PoolTimeout`, as the pool raises).

    An ``asyncio.Semaphore`` would need an ``asyncio.timeout`` per waiter, a timer armed
    and cancelled each time. Every waiter here has the same timeout, so their deadlines
    are in the order they came, and one timer, set for the oldest waiter, serves them all.
    """

    def __init__(self, size: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._free = size
        self._waiters: deque[tuple[asyncio.Future[None], float]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def acquire(self) -> float | None:
        """Wait for a permit; the deadline of the wait, or ``None`` if none was needed."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return None
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Used from a new event loop: the old loop's waiters and timer are gone.
            self._loop, self._timer = loop, None
            self._waiters = deque(w for w in self._waiters if w[0].get_loop() is loop)
        future: asyncio.Future[None] = loop.create_future()
        deadline = loop.time() + self.timeout_s
        self._waiters.append((future, deadline))
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release()  # handed a permit, then cancelled: pass it on
            raise
        return deadline

    def release(self) -> None:
        """Give a permit back: to the oldest waiter still waiting, else to the gate."""
        while self._waiters:
            future, _ = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self._free += 1

    def _expire(self) -> None:
        """Refuse every waiter past its deadline; set the timer for the next one."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        waiters = self._waiters
        while waiters:
            future, deadline = waiters[0]
            if future.done():
                waiters.popleft()
            elif deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            else:
                waiters.popleft()
                future.set_exception(
                    PoolTimeout(f"couldn't get a connection after {self.timeout_s:.2f} sec")
                )


ASK_AGAIN_S: Final = 1.0
"""How often a caller waiting for a connection asks the pool again (see
:meth:`Checkout._getconn`); half the pool's round of reconnection attempts
(``siglo_postgres.database.RECONNECT_ROUND_S``)."""


class PooledConnections:
    """``pool``'s connections, handed out to at most ``size`` callers at a time, each
    waiting at most ``timeout_s`` for one."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConn], size: int, timeout_s: float) -> None:
        self.pool = pool
        self.gate = Gate(size, timeout_s)

    def connection(self) -> Checkout:
        """A connection for one call (``async with``)."""
        return Checkout(self)


class Checkout:
    """One call's connection: ``async with pooled.connection() as conn``."""

    __slots__ = ("_conn", "_pooled")

    def __init__(self, pooled: PooledConnections) -> None:
        self._pooled = pooled
        self._conn: AsyncConn | None = None

    async def __aenter__(self) -> AsyncConn:
        gate = self._pooled.gate
        deadline = await gate.acquire()
        now = asyncio.get_running_loop().time()
        if deadline is None:
            deadline = now + gate.timeout_s
        try:
            # Waited at the gate: the pool gets what is left.
            conn = await self._getconn(deadline)
            if closed_while_idle(conn):
                # Closed by the server as it sat in the pool (a restart): a statement sent
                # on it would fail as one lost in flight (siglo_postgres.liveness).
                conn = await self._replace(conn, deadline)
        except BaseException:
            gate.release()
            raise
        self._conn = conn
        return conn

    async def _replace(self, conn: AsyncConn, deadline: float) -> AsyncConn:
        """A connection for ``conn``, which the server closed, by ``deadline`` (the
        loop's time); each the pool hands out instead is looked at too (after a
        restart every idle one is closed)."""
        pool = self._pooled.pool
        while True:
            await conn.close()
            await pool.putconn(conn)  # discarded: the pool opens another in its place
            conn = await self._getconn(deadline)
            if not closed_while_idle(conn):
                return conn

    async def _getconn(self, deadline: float) -> AsyncConn:
        """A connection from the pool by ``deadline`` (the loop's time), asked for again
        every :data:`ASK_AGAIN_S`: psycopg_pool opens a connection for a caller when it
        asks and finds none, and after a round of failed attempts (an outage) gives up
        on it, the caller still waiting; nothing would then open one for that caller
        before its deadline, the server back or not (nor for the calls whose reads
        were merged into its own)."""
        pool = self._pooled.pool
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - loop.time()
            try:
                return await pool.getconn(max(0.0, min(left, ASK_AGAIN_S)))
            except PoolTimeout:
                if left <= ASK_AGAIN_S:
                    raise PoolTimeout(
                        f"couldn't get a connection after {self._pooled.gate.timeout_s:.2f} sec"
                    ) from None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                await self._pooled.pool.putconn(conn)
        finally:
            self._pooled.gate.release()
