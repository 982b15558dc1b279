"""A ``redis.asyncio.Redis`` that confirms each write on replicas (``WAIT``) before
answering, so that an acknowledged write survives the loss of the master.

Redis replicates asynchronously: the master answers a write before any replica has it,
and a replica promoted after the master dies has lost whatever had not reached it yet.
``WAIT numreplicas timeout`` blocks the calling connection until ``numreplicas``
replicas have acknowledged every write that connection made. This client sends each
command that may write together with a ``WAIT`` on the same connection (one pipeline,
one round trip plus the replicas' acknowledgement), and raises :class:`ReplicationError`
when fewer replicas confirm in time: the write happened on the master but is not known
to be on a replica, so the caller must treat it as not acknowledged.

On a cluster (:class:`WaitingRedisCluster`) the ``WAIT`` goes to the master of the
write's own slot, on the write's connection: each shard confirms its own writes.

This module imports redis-py at the top: it is only imported when the option is used.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Final

import redis.asyncio
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

from siglo_redis.cluster_seeds import SeedKeepingRedisCluster
from siglo_redis.scripts import READ_ONLY_SCRIPTS

__all__ = ["READ_ONLY_COMMANDS", "ReplicationError", "WaitingRedis", "WaitingRedisCluster"]

READ_ONLY_COMMANDS: Final = frozenset(
    {
        b"GET",
        b"MGET",
        b"GETRANGE",
        b"STRLEN",
        b"EXISTS",
        b"HGET",
        b"HGETALL",
        b"HMGET",
        b"HLEN",
        b"HKEYS",
        b"TTL",
        b"PTTL",
        b"SCAN",
        b"PING",
        b"INFO",
        b"ROLE",
        b"TYPE",
        b"SCRIPT",
        b"CLIENT",
        b"WAIT",
        b"ZRANGE",
        b"ZREVRANGE",
        b"ZRANGEBYLEX",
        b"ZREVRANGEBYLEX",
        b"ZRANGEBYSCORE",
        b"ZREVRANGEBYSCORE",
        b"ZCARD",
        b"ZCOUNT",
        b"ZSCORE",
        b"ZMSCORE",
        b"ZRANK",
        b"ZREVRANK",
        b"ZSCAN",
        b"HEXISTS",
        b"HSCAN",
        b"SMEMBERS",
        b"SISMEMBER",
        b"SCARD",
        b"SSCAN",
        b"LRANGE",
        b"LLEN",
        b"DBSIZE",
    }
)
"""Commands that never write: sent alone, without a ``WAIT``. A script (``EVALSHA``)
counts as a write unless it is one of siglo's read-only scripts
(:data:`~siglo_redis.scripts.READ_ONLY_SCRIPTS`: a checkpoint's load, a lock's
inspection)."""

_SCRIPT_CALLS: Final = frozenset({b"EVALSHA", b"EVAL"})


class ReplicationError(RedisError):
    """A write reached the master but fewer replicas than required confirmed it: its
    outcome is unknown (siglo raises :class:`~siglo.errors.OutcomeUnknownError`)."""

    outcome_unknown = True


def _is_write(args: tuple[Any, ...]) -> bool:
    name = args[0]
    command = (name if isinstance(name, bytes) else str(name).encode()).upper()
    if command in _SCRIPT_CALLS and len(args) > 1:
        body = args[1] if isinstance(args[1], bytes) else str(args[1]).encode()
        # EVALSHA names the script by its SHA-1; EVAL (after a NOSCRIPT) sends it whole.
        sha = body.decode() if command == b"EVALSHA" else hashlib.sha1(body).hexdigest()
        return sha.lower() not in READ_ONLY_SCRIPTS
    return command not in READ_ONLY_COMMANDS


def _confirmed(args: tuple[Any, ...], confirmed: Any, replicas: int, timeout_ms: int) -> None:
    """Raise :class:`ReplicationError` unless ``confirmed`` replicas are enough."""
    if int(confirmed) < replicas:
        name = args[0]
        shown = (name if isinstance(name, bytes) else str(name).encode()).upper().decode()
        raise ReplicationError(
            f"{shown} was written on the master but confirmed by {confirmed} of the "
            f"{replicas} replica(s) required within {timeout_ms} ms (wait_replicas): it "
            "may be lost in a failover"
        )


class WaitingRedis(redis.asyncio.Redis):
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
        if self.wait_replicas <= 0 or not _is_write(args):
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        # One connection for both: WAIT waits for the writes of its own connection.
        async with self.pipeline(transaction=False) as pipe:
            pipe.execute_command(*args, **options)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            result, confirmed = await pipe.execute()
        _confirmed(args, confirmed, self.wait_replicas, self.wait_timeout_ms)
        return result


class WaitingRedisCluster(SeedKeepingRedisCluster):
    """``redis.asyncio.RedisCluster`` plus ``WAIT`` after writes, on each write's shard.

    ``WAIT`` counts the replicas that have every write *of its connection*, so it must
    follow the write on the same connection to the same master. A write is sent as a
    two-command pipeline (an ``ASKING`` first after an ``ASK``) to its slot's master,
    following ``MOVED`` and ``ASK`` and retrying ``TRYAGAIN`` as redis-py does for a
    single command; a connection that fails makes redis-py re-read the topology, as
    for any command. Reads and commands sent to chosen nodes go as usual.
    """

    wait_replicas: int = 0
    wait_timeout_ms: int = 0

    def require_replicas(self, replicas: int, timeout_ms: int) -> WaitingRedisCluster:
        """Confirm each write on ``replicas`` replicas of its shard within ``timeout_ms``."""
        self.wait_replicas = replicas
        self.wait_timeout_ms = timeout_ms
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self.wait_replicas <= 0 or "target_nodes" in kwargs or not _is_write(args):
            return await super().execute_command(*args, **kwargs)
        # Retried on a new topology as redis-py retries one command.
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
                await node.execute_pipeline(commands)
            except (ConnectionError, TimeoutError):
                # As redis-py does for one command: forget the node, re-read the topology.
                self.nodes_manager.startup_nodes.pop(node.name, None)
                await self.aclose()
                raise
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
            if isinstance(wait.result, BaseException):
                raise wait.result
            _confirmed(args, wait.result, self.wait_replicas, self.wait_timeout_ms)
            return result
        raise ClusterError("TTL exhausted.")
