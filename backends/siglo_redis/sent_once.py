"""A command that may write is sent once: a lost reply is an unknown outcome, not a retry.

redis-py sends a command again after a connection error or a timeout: the plain
client's ``Retry`` wraps the send *and* the read of a call, and ``RedisCluster`` runs a
call again after either. When the connection fails after the command was written, the
server may have run it, and the command sent again meets its own effect: a
compare-and-set conflicts with the save it just stored (reported as
``CheckpointConflictError``), a fresh nonce is reported as a replay, an idempotency key
as in progress, a lock as held by somebody else — each a wrong answer, not an ambiguous
one (``tests/backends/test_redis_unanswered_writes.py`` produces all of them with a
proxy that drops one reply).

siglo's clients therefore answer a command that may write (:func:`is_write`) whose
connection failed after it was written with :class:`UnansweredWriteError`. It is not a
``ConnectionError``, so neither redis-py's ``Retry`` nor its cluster retry sends the
command again, and siglo reports it as :class:`~siglo.errors.OutcomeUnknownError` (its
``outcome_unknown`` flag). Everything else is retried as before: a read whose reply was
lost (running it twice changes nothing), and any command whose connection failed before
it was written (a refused connect, a connection found closed).

For the same reason nothing is written on a connection the server closed while it sat
idle (a restart, its ``timeout``): sent, the command would be lost unsent and reported
unknown. :func:`closed_by_server` looks before a command goes out on a connection with
nothing in flight.

The clients here are the plain ones (``auto_pipeline=false``) and the bases of the
others: :class:`SentOnceRedis` (standalone and Sentinel; its pipelines too; and the
client siglo sends through over the pool of an application's redis-py ``Redis``,
:func:`siglo_redis.client.client_for`) and :class:`SentOnceRedisCluster`. The
auto-pipeline (:mod:`siglo_redis.pipelining`) and the ``WAIT`` clients
(:mod:`siglo_redis.replication`) call :func:`unanswered` where they learn that a
written command lost its connection. Each carries ``sends_writes_once = True``.

This module imports redis-py at the top: it is only imported when a client is built.
"""

from __future__ import annotations

import hashlib
import select
from collections.abc import Iterable
from typing import Any, Final

import redis.asyncio
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, PipelineCommand
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ConnectionError,
    ReadOnlyError,
    RedisError,
    TimeoutError,
)

from siglo_redis.cluster_seeds import SeedKeepingRedisCluster
from siglo_redis.scripts import READ_ONLY_SCRIPTS

__all__ = [
    "READ_ONLY_COMMANDS",
    "closed_by_server",
    "refused",
    "send_batch_once",
    "send_once",
    "SentOnceRedis",
    "SentOnceRedisCluster",
    "UnansweredWriteError",
    "is_write",
    "unanswered",
]

READ_ONLY_COMMANDS: Final = frozenset(
    {
        b"GET", b"MGET", b"GETRANGE", b"STRLEN", b"EXISTS", b"TYPE", b"TTL", b"PTTL",
        b"HGET", b"HGETALL", b"HMGET", b"HLEN", b"HKEYS", b"HEXISTS", b"HSCAN",
        b"ZRANGE", b"ZREVRANGE", b"ZRANGEBYLEX", b"ZREVRANGEBYLEX", b"ZRANGEBYSCORE",
        b"ZREVRANGEBYSCORE", b"ZCARD", b"ZCOUNT", b"ZSCORE", b"ZMSCORE", b"ZRANK",
        b"ZREVRANK", b"ZSCAN", b"SMEMBERS", b"SISMEMBER", b"SCARD", b"SSCAN", b"LRANGE",
        b"LLEN", b"SCAN", b"DBSIZE", b"PING", b"ECHO", b"TIME", b"INFO", b"ROLE",
        b"SCRIPT", b"CLIENT", b"WAIT", b"COMMAND", b"CLUSTER", b"ASKING", b"READONLY",
        b"READWRITE", b"HELLO", b"AUTH", b"SELECT",
    }
)  # fmt: skip
"""Commands that change nothing stored (some change the connection's state). A script
(``EVALSHA``) counts as a write unless it is one of siglo's read-only scripts
(:data:`~siglo_redis.scripts.READ_ONLY_SCRIPTS`: a checkpoint's load, a lock's
inspection); any other command counts as a write."""

_SCRIPT_CALLS: Final = frozenset({b"EVALSHA", b"EVAL"})


def is_write(args: tuple[Any, ...]) -> bool:
    """Whether the command ``args`` may change what is stored."""
    name = args[0]
    # redis-py names some commands with their subcommand ("SCRIPT LOAD").
    command = (name if isinstance(name, bytes) else str(name).encode()).upper().split(b" ")[0]
    if command in _SCRIPT_CALLS and len(args) > 1:
        body = args[1] if isinstance(args[1], bytes) else str(args[1]).encode()
        # EVALSHA names the script by its SHA-1; EVAL (after a NOSCRIPT) sends it whole.
        sha = body.decode() if command == b"EVALSHA" else hashlib.sha1(body).hexdigest()
        return sha.lower() not in READ_ONLY_SCRIPTS
    return command not in READ_ONLY_COMMANDS


class UnansweredWriteError(RedisError):
    """A command that may write was sent and its connection failed before the reply:
    the server may or may not have run it (siglo raises
    :class:`~siglo.errors.OutcomeUnknownError`). Never retried."""

    outcome_unknown = True


def refused(exc: BaseException) -> bool:
    """Whether ``exc``, a ``ConnectionError`` to redis-py, is in fact the server's answer
    refusing the command, which therefore did not run: ``-LOADING`` (a restarted
    server still loading its data), an authentication error, and a master demoted to
    a replica (its ``-READONLY``, which redis-py's Sentinel connection raises again as
    a ``ConnectionError``)."""
    if isinstance(exc, BusyLoadingError | AuthenticationError | AuthorizationError):
        return True
    return isinstance(exc, ConnectionError) and isinstance(exc.__context__, ReadOnlyError)


def unanswered(args: tuple[Any, ...], exc: BaseException) -> BaseException:
    """What a call whose command ``args`` was written gets when reading its reply fails
    with ``exc``: :class:`UnansweredWriteError` for a write, ``exc`` itself for a read
    and for a command the server refused (:func:`refused`): retried, as before."""
    if not is_write(args) or refused(exc):
        return exc
    name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
    error = UnansweredWriteError(
        f"{name.upper()} was sent and its connection failed before the reply "
        f"({type(exc).__name__}: {exc}): the server may have run it"
    )
    error.__cause__ = exc
    return error


async def _raise_if_a_write(
    connection: Any, sent: Iterable[tuple[Any, ...]], exc: ConnectionError | TimeoutError
) -> None:
    """After reading the reply to the commands ``sent`` on ``connection`` failed with
    ``exc``: :class:`UnansweredWriteError` if any of them may write (the connection
    dropped); else nothing, and the caller raises ``exc`` (retried). Only on that
    failure: the reading itself goes unwrapped."""
    for args in sent:
        failure = unanswered(args, exc)
        if failure is not exc:
            await connection.disconnect(nowait=True)
            raise failure from exc


class SentOncePipeline(Pipeline):
    """A pipeline whose batch holding a write is not sent again after its connection
    fails while the replies are read, nor sent on a connection the server closed."""

    async def _execute_pipeline(self, connection: Any, *args: Any, **kwargs: Any) -> Any:
        if closed_by_server(connection):
            await connection.disconnect(nowait=True)
        return await super()._execute_pipeline(connection, *args, **kwargs)

    async def _execute_transaction(self, connection: Any, *args: Any, **kwargs: Any) -> Any:
        if closed_by_server(connection):
            await connection.disconnect(nowait=True)
        return await super()._execute_transaction(connection, *args, **kwargs)

    async def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        # Only ever called after the batch was written.
        try:
            return await super().parse_response(connection, command_name, **options)
        except (ConnectionError, TimeoutError) as exc:
            await _raise_if_a_write(connection, (args for args, _ in self.command_stack), exc)
            raise


class SentOnceRedis(redis.asyncio.Redis):
    """``redis.asyncio.Redis`` that does not send a write again once it was written
    (see the module's docstring); its :meth:`pipeline` neither."""

    sends_writes_once = True

    async def _send_command_parse_response(
        self, conn: Any, command_name: Any, *args: Any, **options: Any
    ) -> Any:
        if closed_by_server(conn):
            await conn.disconnect(nowait=True)  # the send connects anew
        await conn.send_command(*args)
        try:
            return await self.parse_response(conn, command_name, **options)
        except (ConnectionError, TimeoutError) as exc:
            await _raise_if_a_write(conn, (args,), exc)
            raise

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        return SentOncePipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


def closed_by_server(connection: Any) -> bool:
    """Whether the server closed ``connection`` while it sat idle (a restart, its
    ``timeout``, ``CLIENT KILL``): a command written on it would be lost unsent and,
    being sent, reported as an unknown outcome; it goes on a new connection instead.

    Called only when nothing is in flight on the connection, so anything to read means
    it is not fit for a command: the end of its stream (or an error) that the event loop
    has already handed to its reader, or — when the loop was busy as it came (a long
    synchronous stretch of the application) — bytes still in the socket, which a poll
    sees (about a microsecond). redis-py's pool looks when it hands a connection out,
    but only at the reader, so a blocked loop fooled it.
    """
    reader = connection._reader
    if reader is None:
        return False  # not connected: the send connects
    if reader.at_eof() or reader.exception() is not None:
        return True
    # One poller per connection, made once (half the cost of a new one each time); a
    # reconnected connection has a new reader, and gets a new poller.
    looked: tuple[Any, Any] | None = getattr(connection, "_siglo_poller", None)
    if looked is None or looked[0] is not reader:
        writer = connection._writer
        sock = None if writer is None else writer.transport.get_extra_info("socket")
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        looked = connection._siglo_poller = (reader, poller)
    return bool(looked[1].poll(0))


async def send_once(node: ClusterNode, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``node.execute_command(*args, **kwargs)``, except that a write whose connection
    fails after it was written raises :class:`UnansweredWriteError`."""
    connection = node.acquire_connection()
    try:
        if closed_by_server(connection):
            await connection.disconnect(nowait=True)  # sent on a new one
        await connection.send_packed_command(connection.pack_command(*args), False)
        try:
            return await node.parse_response(connection, args[0], **kwargs)
        except (ConnectionError, TimeoutError) as exc:
            await _raise_if_a_write(connection, (args,), exc)
            raise
    finally:
        node.release(connection)


async def send_batch_once(node: ClusterNode, commands: list[PipelineCommand]) -> None:
    """``node.execute_pipeline(commands)`` on a connection the server has not closed:
    each command's ``result`` is its reply or the exception reading it raised (a
    ``ConnectionError`` there: the batch was written, see :func:`unanswered`)."""
    connection = node.acquire_connection()
    try:
        if closed_by_server(connection):
            await connection.disconnect(nowait=True)
        batch = connection.pack_commands(command.args for command in commands)
        await connection.send_packed_command(batch, False)
        for command in commands:
            try:
                command.result = await node.parse_response(
                    connection, command.args[0], **command.kwargs
                )
            except Exception as exc:
                command.result = exc
    finally:
        node.release(connection)


class _SentOnceNode:
    """A cluster node whose ``execute_command`` is :func:`send_once`."""

    __slots__ = ("_node",)

    def __init__(self, node: ClusterNode) -> None:
        self._node = node

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return await send_once(self._node, args, kwargs)


class SentOnceRedisCluster(SeedKeepingRedisCluster):
    """A Redis Cluster client whose writes are sent once (see the module's docstring):
    redis-py still follows ``MOVED``/``ASK`` and re-reads the topology after a failed
    connection, and still retries what was never written and every read."""

    sends_writes_once = True

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        node: Any = _SentOnceNode(target_node)
        return await super()._execute_command(node, *args, **kwargs)
