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

from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError, RedisError, TimeoutError

__all__ = ["MASTER_CHECK_S", "FailoverAwareSentinel", "MasterWatch", "watching"]

MASTER_CHECK_S: Final = 0.5
"""How often, at most, a Sentinel client asks which server is the master while it is
used: the longest a failover goes unnoticed by connections made before it. One
question to a Sentinel, a fraction of a millisecond, in a task of its own."""


STRAGGLER_S: Final = 0.05
"""How long the Sentinels that have not answered are waited for once one has: each
answers in a fraction of a millisecond, and one that does not is not waited for."""


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


class _Watching:
    """Mixed into the client class of a Sentinel URL (:func:`watching`): each command
    first gives the watch its chance to look. Clients of other URLs do not have it, so
    their commands pay nothing for it."""

    _master_watch: MasterWatch | None = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        watch = self._master_watch
        if watch is not None:
            watch.poke()
        return await super().execute_command(*args, **options)  # type: ignore[misc]


def watching(redis_class: type[Any]) -> type[Any]:
    """``redis_class`` (siglo's auto-pipelined, sent-once or waiting client) with each
    of its commands poking the client's :class:`MasterWatch` first."""
    return type(f"Watching{redis_class.__name__}", (_Watching, redis_class), {})


class FailoverAwareSentinel(Sentinel):
    """redis-py's ``Sentinel``, naming the master as the Sentinels that know best do.

    redis-py takes the first Sentinel's ``SENTINEL MASTERS``, which names the old master
    until the failover ends (``+switch-master``): seconds after the promotion, as long
    as the Sentinels take to move the other replicas (``failover-timeout`` at worst), the
    old master, still a master when it did not die (a planned ``SENTINEL FAILOVER``),
    confirming writes it then drops (a black-box auditor lost 4.3 s of them). Here every
    Sentinel is asked: one failing the master over names the promoted replica (``SENTINEL
    GET-MASTER-ADDR-BY-NAME``, from the moment the replica is a master), and otherwise
    the newest configuration (the highest ``config-epoch``) among those that see the
    master up wins, so a Sentinel that has not heard of the failover yet is outvoted.
    """

    probe_pool: Any = None
    """The pool of the client this names the master for (set where the client is built):
    during a failover a replica is asked its ``ROLE`` on a connection of that pool's
    settings (password, TLS), to learn of the promotion before the Sentinel does."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        states, errors = await self._states(service_name)
        for sentinel, state in states:
            if "failover_in_progress" not in _flags(state):
                continue
            try:
                # Not redis-py's sentinel_get_master_addr_by_name: its async client
                # hands the reply's parser an option it does not take (redis-py 6.4).
                reply = await sentinel.execute_command(
                    "SENTINEL GET-MASTER-ADDR-BY-NAME", service_name
                )
            except (ConnectionError, TimeoutError):
                continue
            old = (state["ip"], int(state["port"]))
            if reply:
                promoted = (_text(reply[0]), int(reply[1]))
                if promoted != old:
                    return promoted
            # The Sentinel learns of the promotion at its next look at the replica (a
            # second later): the replica that says it is a master now is the promoted one.
            promoted_now = await self._promoted_replica(sentinel, service_name, old)
            if promoted_now is not None:
                return promoted_now
        up = [state for _, state in states if self.check_master_state(state, service_name)]
        if up:
            newest = max(up, key=lambda state: int(state.get("config-epoch", 0)))
            ip = self._force_master_ip if self._force_master_ip is not None else newest["ip"]
            return ip, int(newest["port"])
        detail = f" : {', '.join(errors)}" if errors else ""
        raise MasterNotFoundError(f"No master found for {service_name!r}{detail}")

    async def _states(
        self, service_name: str
    ) -> tuple[list[tuple[Any, dict[str, Any]]], list[str]]:
        """Each Sentinel's state of ``service_name``'s master, asked of all at once, and
        the errors of those that failed. Those that have not answered
        :data:`STRAGGLER_S` after the first did are left out: a Sentinel that does not
        answer (paused, cut off) would hold every new connection for its timeout."""
        loop = asyncio.get_running_loop()

        async def ask(sentinel: Any) -> tuple[Any, dict[str, Any] | None, str | None]:
            try:
                masters = await sentinel.sentinel_masters()
            except (ConnectionError, TimeoutError) as exc:
                return sentinel, None, f"{sentinel} - {exc!r}"
            return sentinel, masters.get(service_name), None

        pending = {asyncio.ensure_future(ask(sentinel)) for sentinel in self.sentinels}
        states: list[tuple[Any, dict[str, Any]]] = []
        errors: list[str] = []
        deadline: float | None = None
        try:
            while pending:
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break  # the stragglers, past the grace
                for task in done:
                    sentinel, state, error = task.result()
                    if error is not None:
                        errors.append(error)
                    elif state:
                        states.append((sentinel, state))
                        if deadline is None:
                            deadline = loop.time() + STRAGGLER_S
        finally:
            for task in pending:
                task.cancel()
        return states, errors

    async def _promoted_replica(
        self, sentinel: Any, service_name: str, old: tuple[str, int]
    ) -> tuple[str, int] | None:
        """The replica of ``service_name`` (as ``sentinel`` lists them) whose ``ROLE`` is
        master, other than ``old``; ``None`` if none is yet, or it cannot be asked."""
        pool = self.probe_pool
        if pool is None:
            return None
        try:
            replicas = await sentinel.execute_command("SENTINEL SLAVES", service_name)
        except (ConnectionError, TimeoutError):
            return None
        for replica in replicas or ():
            if replica.get("is_sdown") or replica.get("is_disconnected"):
                continue
            address = (_text(replica["ip"]), int(replica["port"]))
            if address == old:
                continue
            conn = pool.make_connection()
            try:
                await conn.connect_to(address)  # this address, not the Sentinels' master
                await conn.send_command("ROLE")
                role = await conn.read_response()
            except (RedisError, OSError):
                continue
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await conn.disconnect(nowait=True)
            if role and _text(role[0]) == "master":
                return address
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flags(state: dict[str, Any]) -> set[str]:
    """A Sentinel's flags of a master (a text in RESP2, a set in RESP3)."""
    flags = state.get("flags", "")
    return set(flags.split(",")) if isinstance(flags, str) else set(flags)
