"""A ``redis.asyncio.Redis`` that confirms each write on replicas (``WAIT``) before
answering, so that an acknowledged write survives the loss of the master.

Redis replicates asynchronously: the master answers a write before any replica has it,
and a replica promoted after the master dies has lost whatever had not reached it yet.
``WAIT numreplicas timeout`` blocks the calling connection until ``numreplicas``
replicas have acknowledged every write that connection made. This client sends each
command that may write together with a ``WAIT`` on the same connection (one pipeline,
one round trip plus the replicas' acknowledgement), and raises :class:`ReplicationError`
when fewer replicas confirm in time: the write happened on the master but is not known
to be on a replica, so the caller must treat it as not acknowledged. A pair whose
connection fails after it was written is not sent again (:mod:`siglo_redis.sent_once`).

On a cluster (:class:`WaitingRedisCluster`) the ``WAIT`` goes to the master of the
write's own slot, on the write's connection: each shard confirms its own writes.

This module imports redis-py at the top: it is only imported when the option is used.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.cluster import ClusterNode, PipelineCommand
from redis.cluster import get_node_name
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    ConnectionError,
    MovedError,
    RedisError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

from siglo_redis.sent_once import (
    SentOnceRedis,
    SentOnceRedisCluster,
    is_write,
    send_batch_once,
    unanswered,
)

__all__ = ["ReplicationError", "WaitingRedis", "WaitingRedisCluster"]


class ReplicationError(RedisError):
    """A write reached the master but fewer replicas than required confirmed it: its
    outcome is unknown (siglo raises :class:`~siglo.errors.OutcomeUnknownError`)."""

    outcome_unknown = True


def _confirmed(args: tuple[Any, ...], confirmed: Any, replicas: int, timeout_ms: int) -> None:
    """Raise :class:`ReplicationError` unless ``confirmed`` replicas are enough: the
    ``WAIT``'s reply to the write ``args``, which ran."""
    name = args[0]
    shown = (name if isinstance(name, bytes) else str(name).encode()).upper().decode()
    if isinstance(confirmed, BaseException):
        # The WAIT's own error reply (a count or timeout the server refuses): the write
        # before it ran all the same, and whether a replica has it is not known.
        error = ReplicationError(
            f"{shown} was written on the master, and the WAIT {replicas} {timeout_ms} "
            f"after it failed ({type(confirmed).__name__}: {confirmed}) (wait_replicas): "
            "it is not known to be on a replica"
        )
        error.__cause__ = confirmed
        raise error
    if int(confirmed) < replicas:
        raise ReplicationError(
            f"{shown} was written on the master but confirmed by {confirmed} of the "
            f"{replicas} replica(s) required within {timeout_ms} ms (wait_replicas): it "
            "may be lost in a failover"
        )


class WaitingRedis(SentOnceRedis):
    """``redis.asyncio.Redis`` plus ``WAIT wait_replicas wait_timeout_ms`` after writes.

    Build it with :meth:`from_pool` (or ``Sentinel.master_for(redis_class=...)``) and
    then call :meth:`require_replicas`.
    """

    wait_replicas: int = 0
    wait_timeout_ms: int = 0

    def require_replicas(self, replicas: int, timeout_ms: int) -> WaitingRedis:
        """Confirm each write on ``replicas`` replicas within ``timeout_ms``."""
        self.wait_replicas = replicas
        self.wait_timeout_ms = timeout_ms
        return self

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.wait_replicas <= 0 or not is_write(args):
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        # One connection for both: WAIT waits for the writes of its own connection.
        async with self.pipeline(transaction=False) as pipe:
            pipe.execute_command(*args, **options)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            # Each reply on its own: the first error raised would not say whether the
            # write or the WAIT after it failed, and only the write's error means it did
            # not run.
            result, confirmed = await pipe.execute(raise_on_error=False)
        if isinstance(result, BaseException):
            raise result
        _confirmed(args, confirmed, self.wait_replicas, self.wait_timeout_ms)
        return result


class WaitingRedisCluster(SentOnceRedisCluster):
    """``redis.asyncio.RedisCluster`` plus ``WAIT`` after writes, on each write's shard.

    ``WAIT`` counts the replicas that have every write *of its connection*, so it must
    follow the write on the same connection to the same master. A write is sent as a
    two-command pipeline (an ``ASKING`` first after an ``ASK``) to its slot's master,
    following ``MOVED`` and ``ASK`` and retrying ``TRYAGAIN`` as redis-py does for a
    single command; a connection that fails before the write is sent makes redis-py
    re-read the topology and send it again, as for any command, and one that fails
    after raises :class:`~siglo_redis.sent_once.UnansweredWriteError` (never sent
    again). Reads and commands sent to chosen nodes go as :class:`SentOnceRedisCluster`
    sends them.
    """

    wait_replicas: int = 0
    wait_timeout_ms: int = 0

    def require_replicas(self, replicas: int, timeout_ms: int) -> WaitingRedisCluster:
        """Confirm each write on ``replicas`` replicas of its shard within ``timeout_ms``."""
        self.wait_replicas = replicas
        self.wait_timeout_ms = timeout_ms
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self.wait_replicas <= 0 or "target_nodes" in kwargs or not is_write(args):
            return await super().execute_command(*args, **kwargs)
        # Retried on a new topology as redis-py retries one command that was not sent.
        retries = self.retry.get_retries()
        while True:
            if self._initialize:
                await self.initialize()
            try:
                return await self._write_and_wait(args, kwargs)
            except self.ERRORS_ALLOW_RETRY:
                if retries <= 0:
                    raise
                retries -= 1

    async def _write_and_wait(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        node: ClusterNode | None = None
        asking = False
        for attempt in range(self.RedisClusterRequestTTL):
            if node is None:
                slot = await self._determine_slot(*args)
                node = self.nodes_manager.get_node_from_slot(slot)
            commands = [PipelineCommand(0, "ASKING")] if asking else []
            write = PipelineCommand(len(commands), *args, **kwargs)
            wait = PipelineCommand(
                len(commands) + 1, "WAIT", self.wait_replicas, self.wait_timeout_ms
            )
            commands += [write, wait]
            try:
                await send_batch_once(node, commands)
            except (ConnectionError, TimeoutError):
                # Never written. As redis-py does for one command: forget the node,
                # re-read the topology (and try again, in execute_command).
                self.nodes_manager.startup_nodes.pop(node.name, None)
                await self.aclose()
                raise
            for command in commands:
                if isinstance(command.result, ConnectionError | TimeoutError):
                    # Written, and the connection failed before the replies: the write
                    # may have run, so it is not sent again (siglo_redis.sent_once).
                    raise unanswered(args, command.result)
            result = write.result
            if isinstance(result, MovedError):
                # Patches the slot table on the next lookup (reinitialize_steps=0).
                self.nodes_manager._moved_exception = result
                node, asking = None, False
                continue
            if isinstance(result, AskError):
                node = self.get_node(node_name=get_node_name(result.host, result.port))
                if node is None:
                    raise result
                asking = True
                continue
            if isinstance(result, TryAgainError):
                node, asking = None, False
                if attempt >= self.RedisClusterRequestTTL // 2:
                    await asyncio.sleep(0.05)
                continue
            if isinstance(result, ClusterDownError | SlotNotCoveredError):
                await self.aclose()
                await asyncio.sleep(0.25)
                raise result
            if isinstance(result, BaseException):
                raise result
            _confirmed(args, wait.result, self.wait_replicas, self.wait_timeout_ms)
            return result
        raise ClusterError("TTL exhausted.")
