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

This module imports redis-py at the top: it is only imported when the option is used.
"""

from __future__ import annotations

from typing import Any, Final

import redis.asyncio
from redis.exceptions import RedisError

__all__ = ["READ_ONLY_COMMANDS", "ReplicationError", "WaitingRedis"]

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
    }
)
"""Commands that never write: sent alone, without a ``WAIT``. Scripts (``EVALSHA``)
count as writes, since most of siglo's do."""


class ReplicationError(RedisError):
    """A write reached the master but fewer replicas than required confirmed it."""


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
        name = args[0]
        upper = (name if isinstance(name, bytes) else str(name).encode()).upper()
        if self.wait_replicas <= 0 or upper in READ_ONLY_COMMANDS:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        # One connection for both: WAIT waits for the writes of its own connection.
        async with self.pipeline(transaction=False) as pipe:
            pipe.execute_command(*args, **options)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            result, confirmed = await pipe.execute()
        if int(confirmed) < self.wait_replicas:
            raise ReplicationError(
                f"{upper.decode()} was written on the master but confirmed by "
                f"{confirmed} of the {self.wait_replicas} replica(s) required within "
                f"{self.wait_timeout_ms} ms (wait_replicas): it may be lost in a failover"
            )
        return result
