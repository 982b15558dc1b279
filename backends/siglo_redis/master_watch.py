"""Following a Sentinel failover on connections that were made before it.

redis-py asks the Sentinels for the master when it *makes* a connection, and not again:
a connection made to the old master stays on it. A master that was paused (or cut off)
while the Sentinels promoted a replica comes back still a master, and goes on accepting
writes until the Sentinels turn it into a replica (about ten seconds later, at their
next look); a planned ``SENTINEL FAILOVER`` leaves it a master for as long. Every write
it confirmed meanwhile is lost when it becomes a replica — a black-box auditor lost
every save confirmed in the seconds after a failover, through the auto-pipeline's
connection (made outside the pool, so the pool's own check of the master never reached
it) and through pooled connections alike; with ``wait_replicas`` below the number of
replicas a planned failover lost them too (a replica not yet moved confirmed them).

So a client built for a Sentinel URL asks the Sentinels for the master again, at most
every :data:`MASTER_CHECK_S`, while it is used (:meth:`MasterWatch.poke`, from each
command: no task runs while nothing is asked of it). When the answer is not the server a
connection is on, that connection is closed: the auto-pipeline's
(:meth:`siglo_redis.pipelining.AutoPipeline.drop_connection_unless`) and the pool's, in use or
idle. Calls in flight on them fail as any lost connection does (a write with an unknown
outcome: it reached the old master), and the next connection is made to the new master.
What remains is the window between the promotion and the next look: writes the old
master confirms then are lost, as writes it confirmed before any replica had them are
(docs/deploying.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final

from redis.exceptions import RedisError

__all__ = ["MASTER_CHECK_S", "MasterWatch"]

MASTER_CHECK_S: Final = 0.5
"""How often, at most, a Sentinel client asks which server is the master while it is
used: the longest a failover goes unnoticed by connections made before it. One
question to a Sentinel, a fraction of a millisecond, in a task of its own."""


class MasterWatch:
    """Asks the Sentinels of ``client``'s pool for the master now and then (see the
    module's docstring) and closes the client's connections to any other server."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._due = 0.0
        self._task: asyncio.Task[None] | None = None
        self.changes = 0
        """How many times the master changed under this client (for tests)."""

    def poke(self) -> None:
        """From each command: start a look if none was started in the last
        :data:`MASTER_CHECK_S` (on the running loop; a look already under way is left
        to finish)."""
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + MASTER_CHECK_S
        loop = asyncio.get_running_loop()
        task = self._task
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._task = loop.create_task(self.look())

    async def look(self) -> None:
        """Ask for the master; close every connection to another server."""
        pool = self._client.connection_pool
        before = pool.master_address
        try:
            address = await pool.get_master_address()
        except (RedisError, OSError):
            return  # no Sentinel answered, or none knows a master yet: ask again later
        if before is not None and address != before:
            self.changes += 1
        # The pool's connections, in use too (their calls went to the old master). Each is
        # pointed at the new master before it is closed: redis-py reconnects a closed
        # connection as it sends (``send_packed_command``), to the host it had, without
        # asking the Sentinels — a closed connection alone went back to the old master.
        pooled = [
            *getattr(pool, "_available_connections", ()),
            *getattr(pool, "_in_use_connections", ()),
        ]
        for conn in pooled:
            if (conn.host, conn.port) != tuple(address):
                conn.host, conn.port = address
                with contextlib.suppress(RedisError, OSError):
                    await conn.disconnect(nowait=True)
        pipe = getattr(self._client, "_auto_pipeline", None)
        if pipe is not None:
            pipe.drop_connection_unless(address)

    async def aclose(self) -> None:
        """Cancel a look under way (the client is closing)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
