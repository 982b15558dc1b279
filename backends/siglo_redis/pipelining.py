"""Auto-pipelining: concurrent commands on one client share one socket write and one read.

Why: a Redis command costs the server a few microseconds, but each round trip costs the
client a socket write, a wake-up and a read (~50k commands/s unpipelined on a small
machine against > 500k/s pipelined). redis-py sends each call on its own pooled
connection and waits for its reply, so 32 concurrent callers make 32 writes and 32
reads. Here (as ioredis' ``enableAutoPipelining``) every command issued while others are
in flight is queued; the queue goes out in one write at the next turn of the event loop,
and one reader task reads the replies in the order the commands were written and hands
each to its caller. A lone call is written at once, so sequential latency does not grow.

Semantics are those of one call at a time:

* an error reply (``-ERR …``) fails only its own call; the stream stays in step;
* a call cancelled (or timed out by :class:`~siglo_redis.deadlines.Deadlines`) before its
  command was written is never written, and its cancellation says so
  (:func:`siglo.unsent.unwritten`); after, its reply is read and dropped;
* a reply redis-py raises as a ``ConnectionError`` though the server answered it
  (``-LOADING`` …: :func:`~siglo_redis.sent_once.refused`) fails only its own call, which
  the retry policy may send again (it did not run);
* a lost connection fails every call written on it and not yet answered: a read with
  ``redis.ConnectionError``, which the client's ``Retry`` policy (or redis-py's cluster
  retry) sends again on a new connection, a command that may write with
  :class:`~siglo_redis.sent_once.UnansweredWriteError`, never sent again (it may have
  run); a call queued and not yet written goes out on the new connection;
* commands that change or block a connection (``MULTI``, ``WATCH``, ``SELECT``,
  blocking pops, ``SUBSCRIBE`` …) never go through the pipeline.

:class:`AutoPipelinedRedis` is a ``redis.asyncio.Redis`` whose single commands are
pipelined; :class:`AutoPipelinedRedisCluster` keeps one pipeline per cluster node, so a
batch only ever holds commands for its node (a ``MOVED``/``ASK`` reply is handled by
redis-py as for any call).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from siglo.unsent import mark_unwritten
from siglo_redis.cluster_seeds import SeedKeepingRedisCluster
from siglo_redis.sent_once import (
    SentOnceRedis,
    closed_by_server,
    refused,
    send_once,
    unanswered,
)

__all__ = ["AutoPipeline", "AutoPipelinedRedis", "AutoPipelinedRedisCluster"]

# Commands that change the connection's state or hold it: they take a pooled connection
# of their own, as without auto-pipelining.
_UNPIPELINED: Final = frozenset(
    {
        "AUTH", "HELLO", "SELECT", "CLIENT", "RESET", "QUIT", "MONITOR",
        "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH",
        "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE",
        "SUNSUBSCRIBE",
        "BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX",
        "BZMPOP", "XREAD", "XREADGROUP", "WAIT", "WAITAOF", "DEBUG", "SHUTDOWN",
        "FAILOVER", "SYNC", "PSYNC", "REPLICAOF", "SLAVEOF",
    }
)  # fmt: skip
_NEVER_DECODE: Final = "NEVER_DECODE"
_EMPTY_RESPONSE: Final = "EMPTY_RESPONSE"

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # hiredis packs a command in C: ~8x faster than redis-py's Python packer
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - redis[hiredis] is siglo's extra
    _hiredis_pack = None


_HIREDIS_MAX_ARG: Final = 65_536
"""The longest argument hiredis packs. hiredis copies every argument into one new
buffer: at 1 KB that is 2 us against redis-py's 9, but a buffer of 128 KB or more is a
fresh allocation whose pages fault in, and packing a 256 KB checkpoint's save took
hundreds of us, while redis-py's packer sends an argument above its 6,000-byte cutoff as
its own chunk, uncopied (about 16 us at any size)."""


def _packable(args: tuple[Any, ...]) -> bool:
    """Whether hiredis packs ``args`` exactly as redis-py's encoder would, and cheaply:
    only str, bytes and int (not bool) arguments, none longer than
    :data:`_HIREDIS_MAX_ARG`, and a command name that is one word (redis-py splits
    ``"CONFIG GET"`` into two arguments; floats it formats with ``repr``)."""
    for a in args:
        t = type(a)
        if t is int:
            continue
        if (t is not str and t is not bytes) or len(a) > _HIREDIS_MAX_ARG:
            return False
    first = args[0]
    return b" " not in first if type(first) is bytes else " " not in first


def pack(conn: Connection, entries: list[_Entry]) -> tuple[list[bytes], list[_Entry]]:
    """The wire bytes of ``entries``' commands, as ``conn.pack_command`` would write them,
    and the entries packed. An entry whose arguments cannot be encoded fails alone."""
    encoder = conn.encoder
    hiredis_pack = _hiredis_pack
    if encoder.encoding.lower().replace("-", "") != "utf8" or encoder.encoding_errors != "strict":
        hiredis_pack = None
    out: list[bytes] = []
    packed: list[_Entry] = []
    for e in entries:
        try:
            if hiredis_pack is not None and _packable(e.args):
                out.append(hiredis_pack(e.args))
            else:
                out.extend(conn.pack_command(*e.args))
        except Exception as exc:  # e.g. a value redis-py refuses to encode
            _fail(e, exc)
            continue
        packed.append(e)
    return out, packed


def _pipelinable(command: Any) -> bool:
    name = command.decode() if isinstance(command, bytes) else str(command)
    return name.upper() not in _UNPIPELINED


class _Entry:
    """One queued call: its arguments, options and the future its caller awaits."""

    __slots__ = ("args", "future", "options", "written")

    def __init__(self, args: tuple[Any, ...], options: dict[str, Any], future: Any) -> None:
        self.args = args
        self.options = options
        self.future: asyncio.Future[Any] = future
        self.written = False
        """Handed to the connection's writer: the server may run it from then on."""


class AutoPipeline:
    """One connection, a write queue and a reader task (see the module's docstring).

    ``new_connection`` makes an unconnected redis-py ``Connection``; ``response_callbacks``
    are the client's (applied to each reply as redis-py would); ``retry`` is the policy a
    call's connection failures are retried with (``None``: not retried).
    """

    def __init__(
        self,
        new_connection: Callable[[], Connection],
        response_callbacks: Mapping[Any, Callable[..., Any]],
        retry: Retry | None,
    ) -> None:
        self._new_connection = new_connection
        self._callbacks = response_callbacks
        self._retry = retry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._queue: list[_Entry] = []
        self._inflight: deque[_Entry] = deque()
        self._flush_scheduled = False
        self._closed = False
        self.writes = 0
        """How many socket writes carried commands (for tests and tuning)."""

    # -- calls ------------------------------------------------------------------------

    async def execute(self, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        """Send one command and return its reply, parsed as redis-py would."""
        if self._retry is None:
            reply = await self._submit(args, options)
        else:
            reply = await self._retry.call_with_retry(
                lambda: self._submit(args, options), _no_cleanup
            )
        return await self._parse(args[0], reply, options)

    async def _submit(self, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        if self._closed:
            raise ConnectionError("the auto-pipeline's client is closed")
        entry = _Entry(args, options, loop.create_future())
        conn = self._conn
        if conn is not None and not self._inflight and not self._queue:
            # Nothing in flight: write now (a lone call waits for no loop turn).
            self._write(conn, [entry])
        else:
            self._queue.append(entry)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        try:
            return await entry.future
        except asyncio.CancelledError as exc:
            if not entry.written:
                # Cut off while queued: the next write skips it (a done future), so it
                # never reaches the server, and the caller may know that (siglo.unsent).
                mark_unwritten(exc)
            raise

    async def _parse(self, command: Any, reply: Any, options: dict[str, Any]) -> Any:
        if isinstance(reply, ResponseError):
            if _EMPTY_RESPONSE in options:
                return options[_EMPTY_RESPONSE]
            raise reply
        callback = self._callbacks.get(command)
        if callback is None:
            return reply
        kwargs = {
            k: v for k, v in options.items() if k not in (_NEVER_DECODE, _EMPTY_RESPONSE, "keys")
        }
        result = callback(reply, **kwargs)
        return await result if inspect.isawaitable(result) else result

    # -- writing ----------------------------------------------------------------------

    def _flush(self) -> None:
        """Write every queued call in one write (connecting first if need be)."""
        self._flush_scheduled = False
        if not self._queue:
            return
        conn = self._conn
        if conn is None:
            if self._connecting is None and self._loop is not None:
                self._connecting = self._loop.create_task(self._connect())
            return
        entries = [e for e in self._queue if not e.future.done()]
        self._queue.clear()
        if entries:
            self._write(conn, entries)

    def _write(self, conn: Connection, entries: list[_Entry]) -> None:
        if not self._inflight and closed_by_server(conn):
            # The server closed it while nothing was in flight (a restart, its `timeout`):
            # the calls go out on a new connection, not lost unsent on this one.
            self._queue[:0] = entries
            self._broken(conn, ConnectionError("closed by the server while idle"))
            return
        chunks, entries = pack(conn, entries)
        if not entries:
            return
        writer = conn._writer
        try:
            if writer is None:
                raise ConnectionError("connection closed")
            for e in entries:
                e.written = True
            writer.writelines(chunks)
        except Exception as exc:
            for e in entries:
                _fail(e, exc)
            self._broken(conn, exc)
            return
        self.writes += 1
        self._inflight.extend(entries)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _connect(self) -> None:
        conn = self._new_connection()
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException as exc:
            self._connecting = None
            queued, self._queue = self._queue, []
            for e in queued:
                _fail(e, exc if isinstance(exc, Exception) else ConnectionError(repr(exc)))
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            if not isinstance(exc, Exception):
                raise
            return
        self._connecting = None
        if self._closed:
            await conn.disconnect(nowait=True)
            return
        self._conn = conn
        assert self._loop is not None
        self._reader = self._loop.create_task(self._read(conn))
        self._flush()

    # -- reading ----------------------------------------------------------------------

    async def _read(self, conn: Connection) -> None:
        """Read replies in write order and hand each to its caller."""
        inflight = self._inflight
        loop = asyncio.get_running_loop()
        while True:
            if not inflight:
                self._wake = wake = loop.create_future()
                try:
                    await wake
                finally:
                    self._wake = None
                continue
            entry = inflight[0]
            try:
                reply = await conn.read_response(
                    disable_decoding=_NEVER_DECODE in entry.options,
                    disconnect_on_error=False,
                )
            except ResponseError as exc:
                reply = exc  # an error reply: only this call fails, the stream is in step
            except asyncio.CancelledError:
                self._broken(conn, ConnectionError("the auto-pipeline was closed"))
                raise
            except Exception as exc:
                if not refused(exc):
                    self._broken(conn, exc)
                    return
                # The server refused this command (-LOADING …): it did not run, and only
                # its call fails, with what the retry policy sends again.
                inflight.popleft()
                _fail(entry, exc)
                if not conn.is_connected:  # dropped after it (Sentinel's demoted master)
                    self._broken(conn, ConnectionError("closed after a refused command"))
                    return
                continue
            inflight.popleft()
            future = entry.future
            if not future.done():  # a cancelled caller's reply is dropped
                future.set_result(reply)

    def _broken(self, conn: Connection, exc: BaseException) -> None:
        """Fail every call written on ``conn`` and not answered; drop the connection."""
        if conn is not self._conn and self._conn is not None:
            return
        self._conn = None
        if not isinstance(exc, ConnectionError | TimeoutError):
            exc = _connection_error(exc)
        pending = list(self._inflight)
        self._inflight.clear()
        for e in pending:
            _fail(e, unanswered(e.args, exc))
        reader = self._reader
        self._reader = None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        self._disconnect(conn)
        if self._queue and not self._closed and not self._flush_scheduled:
            # Calls queued behind the lost ones go out on a new connection.
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def drop_connection_unless(self, address: tuple[str, int]) -> None:
        """Close the connection unless it is to ``address`` (the master a Sentinel names
        now: :mod:`siglo_redis.master_watch`). Its calls in flight fail as on a lost
        connection; queued ones go out on a new connection, to the new master."""
        conn = self._conn
        if conn is None or (conn.host, conn.port) == tuple(address):
            return
        if self._loop is not asyncio.get_running_loop():
            return  # made on another loop: dropped when this one is adopted
        self._broken(conn, ConnectionError(f"the master is now {address[0]}:{address[1]}"))

    def _disconnect(self, conn: Connection) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        task = self._loop.create_task(conn.disconnect(nowait=True))
        task.add_done_callback(_ignore_result)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start afresh on a new event loop: the old loop's socket and tasks are dead."""
        old = self._conn
        if old is not None and old._writer is not None:
            with contextlib.suppress(Exception):
                old._writer.transport.abort()
        self._loop = loop
        self._conn = self._connecting = self._reader = self._wake = None
        self._queue = []
        self._inflight = deque()
        self._flush_scheduled = False

    async def aclose(self) -> None:
        """Fail what is pending and close the connection."""
        self._closed = True
        conn = self._conn
        queued, self._queue = self._queue, []
        for e in queued:
            _fail(e, ConnectionError("the auto-pipeline's client is closed"))
        if self._loop is not asyncio.get_running_loop():
            self._adopt(asyncio.get_running_loop())
            return
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(BaseException):
                await self._connecting
        if conn is not None:
            self._broken(conn, ConnectionError("the auto-pipeline's client is closed"))
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)

    def reopen(self) -> None:
        """Allow use again after :meth:`aclose` (a new connection on the next call)."""
        self._closed = False

    async def retire(self, grace_s: float) -> None:
        """Close once every call already queued or written has its reply (at most
        ``grace_s``; after that, as :meth:`aclose`).

        A written command may have run: failing its call would make the caller (or
        redis-py's cluster retry) send it again, and a compare-and-set or a claim that
        ran twice reports a conflict or a refusal for what it had in fact done.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        # Polled: the reader hands replies out one by one and signals nothing when done.
        for _ in range(int(grace_s / 0.005) + 1):
            if not (self._inflight or self._queue) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.005)
        await self.aclose()


async def _no_cleanup(_error: Exception) -> None:
    """The retry's failure hook: the pipeline has already dropped the connection."""


def _fail(entry: _Entry, exc: BaseException) -> None:
    if not entry.future.done():
        entry.future.set_exception(exc)


def _connection_error(exc: BaseException) -> ConnectionError:
    error = ConnectionError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _ignore_result(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class AutoPipelinedRedis(SentOnceRedis):
    """``redis.asyncio.Redis`` whose single commands go through an :class:`AutoPipeline`.

    Everything else (``pipeline()``, pub/sub, scans) is :class:`SentOnceRedis`'s.
    """

    _auto_pipeline: AutoPipeline | None = None

    def _pipeline_of(self) -> AutoPipeline:
        pipe = self._auto_pipeline
        if pipe is None:
            pool = self.connection_pool
            pipe = AutoPipeline(pool.make_connection, self.response_callbacks, self.get_retry())
            self._auto_pipeline = pipe
        return pipe

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.connection is not None or not _pipelinable(args[0]):
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        return await self._pipeline_of().execute(args, options)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        pipe = self._auto_pipeline
        if pipe is not None:
            await pipe.aclose()
            self._auto_pipeline = None
        await super().aclose(close_connection_pool)


class _PipelinedNode:
    """A cluster node whose ``execute_command`` goes through the node's pipeline."""

    __slots__ = ("_node", "_pipe")

    def __init__(self, node: ClusterNode, pipe: AutoPipeline) -> None:
        self._node = node
        self._pipe = pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if not _pipelinable(args[0]):
            return await send_once(self._node, args, kwargs)
        return await self._pipe.execute(args, kwargs)


_ROUTING: contextvars.ContextVar[bool] = contextvars.ContextVar("siglo_routing", default=False)
"""True inside redis-py's routing of one command: an ``aclose()`` there is its own."""
_RETIRE_GRACE_S: Final = 30.0


class AutoPipelinedRedisCluster(SeedKeepingRedisCluster):
    """``redis.asyncio.RedisCluster`` with one :class:`AutoPipeline` per node.

    redis-py picks the node of each command (slot, ``MOVED``, ``ASK``) and retries
    connection failures at the cluster level, as for any call; only the node's own
    send-and-read is pipelined.
    """

    _node_pipelines: dict[str, AutoPipeline] | None = None
    sends_writes_once = True
    """Its node pipelines send a write once (see the module's docstring)."""

    def _pipeline_for(self, node: ClusterNode) -> AutoPipeline:
        pipes = self._node_pipelines
        if pipes is None:
            pipes = self._node_pipelines = {}
        key = node.name
        pipe = pipes.get(key)
        if pipe is None:
            kwargs = dict(node.connection_kwargs)
            # Cluster-level retries decide on another node; none at the node's level.
            kwargs.pop("retry", None)
            connection_class = node.connection_class

            def new_connection() -> Connection:
                return connection_class(**kwargs)

            pipe = AutoPipeline(new_connection, node.response_callbacks, None)
            pipes[key] = pipe
        return pipe

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        node: Any = _PipelinedNode(target_node, self._pipeline_for(target_node))
        token = _ROUTING.set(True)
        try:
            return await super()._execute_command(node, *args, **kwargs)
        finally:
            _ROUTING.reset(token)

    async def aclose(self, *args: Any, **kwargs: Any) -> None:
        pipes = list((self._node_pipelines or {}).values())
        self._node_pipelines = {}
        if _ROUTING.get():
            # redis-py calls aclose() itself to re-read the topology: after a connection
            # failure, and after every few MOVED replies (so, all through a resharding).
            # Other callers' commands are then written and may have run; failing them
            # would have redis-py send them again (a lock taken twice, a won
            # compare-and-set reported as a conflict). New calls get new pipelines; the
            # old ones close once their calls are answered (or their connection fails).
            for pipe in pipes:
                task = asyncio.get_running_loop().create_task(pipe.retire(_RETIRE_GRACE_S))
                _RETIRING.add(task)
                task.add_done_callback(_RETIRING.discard)
        else:
            for pipe in pipes:
                await pipe.aclose()
        await super().aclose(*args, **kwargs)


_RETIRING: set[asyncio.Task[None]] = set()
"""Pipelines closing in the background (kept from the garbage collector)."""
