"""Counting the store writes a workflow run issues, at the driver.

The end-to-end comparison (:mod:`benchmarks.e2e`) runs, after its timed rounds, one
counting pass per system and reports writes per run:

* **SQLite** (every system's driver opens its connections with ``sqlite3.connect``,
  aiosqlite and SQLAlchemy included): while the comparison runs, ``sqlite3.connect`` is
  wrapped so that each new connection gets a ``set_trace_callback`` that counts the
  statements that write (``INSERT``, ``UPDATE``, ``DELETE``, ``REPLACE``, with or
  without a leading ``WITH``) and the write transactions (an autocommit write, or a
  ``BEGIN`` … ``COMMIT`` with at least one write in it); a statement reported twice in a
  row on one connection is counted once (Python reports a trigger it fires that way);
* **PostgreSQL**: psycopg's ``Cursor.execute``/``executemany`` and their async twins are
  wrapped to count the statements that write (psycopg is under siglo's backend, DBOS's
  SQLAlchemy engine and LangGraph's saver alike), and the write transactions: a write
  on an autocommit connection outside a block, or a ``pipeline()`` / ``transaction()``
  block (outermost) or a ``commit()`` with at least one write since it began;
* **Redis**: a ``MONITOR`` connection during the counting pass, keeping the commands on
  the system's private key prefix: a write is a top-level write command, or a script
  (``EVALSHA``/``EVAL``/``FCALL``) that ran at least one write command (one Lua call is
  one atomic write, whatever it touches).

The counters only count while :attr:`WriteCounter.enabled` (the counting pass); outside
it a wrapped call costs one attribute test. Passes of different systems never overlap,
so what is counted during a system's pass is that system's.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

_WRITE_SQL = re.compile(r"^\s*(?:WITH\b.*?\)\s*)?(INSERT|UPDATE|DELETE|REPLACE)\b", re.I | re.S)
_BEGIN = re.compile(r"^\s*BEGIN\b", re.I)
_END = re.compile(r"^\s*(COMMIT|END)\b", re.I)
_ROLLBACK = re.compile(r"^\s*ROLLBACK\s*(TRANSACTION\s*)?;?\s*$", re.I)

REDIS_WRITES = frozenset(
    [
        "APPEND",
        "COPY",
        "DECR",
        "DECRBY",
        "DEL",
        "EXPIRE",
        "EXPIREAT",
        "GETDEL",
        "GETEX",
        "GETSET",
        "HDEL",
        "HINCRBY",
        "HINCRBYFLOAT",
        "HMSET",
        "HSET",
        "HSETNX",
        "INCR",
        "INCRBY",
        "INCRBYFLOAT",
        "LPOP",
        "LPUSH",
        "LREM",
        "LSET",
        "LTRIM",
        "MSET",
        "MSETNX",
        "PERSIST",
        "PEXPIRE",
        "PEXPIREAT",
        "PSETEX",
        "RENAME",
        "RPOP",
        "RPUSH",
        "SADD",
        "SET",
        "SETEX",
        "SETNX",
        "SETRANGE",
        "SREM",
        "UNLINK",
        "XADD",
        "XDEL",
        "XTRIM",
        "ZADD",
        "ZINCRBY",
        "ZPOPMIN",
        "ZPOPMAX",
        "ZREM",
        "ZREMRANGEBYSCORE",
        "ZREMRANGEBYRANK",
        "ZREMRANGEBYLEX",
    ]
)
REDIS_SCRIPTS = frozenset(("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL"))


def is_write_sql(sql: str) -> bool:
    """Whether ``sql`` is a statement that writes (a CTE-led write included)."""
    return _WRITE_SQL.match(sql) is not None


class WriteCounter:
    """Writes counted while :attr:`enabled`: statements (or commands) and, for SQLite,
    write transactions."""

    def __init__(self) -> None:
        self.enabled = False
        self.statements = 0
        self.transactions = 0
        self._lock = threading.Lock()  # aiosqlite and DBOS run statements on threads

    def add(self, statements: int, transactions: int = 0) -> None:
        with self._lock:
            self.statements += statements
            self.transactions += transactions

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.statements, self.transactions

    def sqlite_tracer(self, conn: sqlite3.Connection | None = None) -> Any:
        """A trace callback for one SQLite connection (it keeps that connection's
        transaction state). With ``conn``, a write is in a transaction when the
        connection says so (``in_transaction``), so a ``BEGIN`` refused as busy (siglo's
        inline writer tries one and steps aside) opens none."""
        state = {"in_tx": False, "wrote": False}
        last = [""]

        def in_tx() -> bool:
            return conn.in_transaction if conn is not None else state["in_tx"]

        def trace(sql: str) -> None:
            if not self.enabled:
                return
            # Python's sqlite3 reports the start of a trigger's subprogram with the
            # text of the statement that fired it: the same statement twice in a row on
            # one connection is one statement (an UPDATE firing siglo's parts trigger).
            if sql == last[0]:
                return
            last[0] = sql
            if is_write_sql(sql):
                if in_tx():
                    state["wrote"] = True
                    self.add(1)
                else:
                    self.add(1, 1)  # autocommit: its own transaction
            elif _BEGIN.match(sql):
                state["in_tx"], state["wrote"] = True, False
            elif _END.match(sql):
                self.add(0, int(state["wrote"]))
                state["in_tx"], state["wrote"] = False, False
            elif _ROLLBACK.match(sql):
                state["in_tx"], state["wrote"] = False, False

        return trace


@contextlib.contextmanager
def counting_sqlite(counter: WriteCounter) -> Iterator[None]:
    """Every ``sqlite3`` connection opened inside traces its writes into ``counter``."""
    original = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = original(*args, **kwargs)
        conn.set_trace_callback(counter.sqlite_tracer(conn))
        return conn

    # sqlite3.connect for aiosqlite and direct users, sqlite3.dbapi2.connect for
    # SQLAlchemy's pysqlite dialect (DBOS).
    modules: list[Any] = [sqlite3, sqlite3.dbapi2]
    for module in modules:
        module.connect = connect
    try:
        yield
    finally:
        for module in modules:
            module.connect = original


def _sql_text(query: Any) -> str:
    if isinstance(query, bytes):
        return query.decode(errors="replace")
    if isinstance(query, str):
        return query
    try:  # psycopg.sql.Composed: its parts, without a connection
        return " ".join(str(getattr(p, "_obj", p)) for p in query._seq)
    except AttributeError:
        return str(query)


@contextlib.contextmanager
def counting_psycopg(counter: WriteCounter) -> Iterator[None]:
    """psycopg's cursors count the statements that write into ``counter``, and their
    connections the write transactions (see the module)."""
    import psycopg

    patched: list[tuple[Any, str, Any]] = []
    blocks: dict[int, list[Any]] = {}
    """By connection id: [open pipeline()/transaction() blocks, wrote since it began]."""

    def wrote(conn: Any, statements: int) -> None:
        state = blocks.get(id(conn))
        if (state is not None and state[0] > 0) or not getattr(conn, "autocommit", True):
            # In a block, or in the implicit transaction a commit() ends.
            blocks.setdefault(id(conn), [0, False])[1] = True
            counter.add(statements)
        else:
            counter.add(statements, 1)

    def ended(conn: Any) -> None:
        state = blocks.get(id(conn))
        if state is not None and state[0] == 0 and state[1]:
            state[1] = False
            if counter.enabled:
                counter.add(0, 1)

    def count(self: Any, query: Any, params: Any, many: bool) -> None:
        if counter.enabled and is_write_sql(_sql_text(query)):
            wrote(self.connection, len(params) if many and params is not None else 1)

    def wrap_sync(cls: Any, name: str, many: bool) -> None:
        original = cls.__dict__[name]

        def method(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
            count(self, query, params, many)
            return original(self, query, params, *args, **kwargs)

        patched.append((cls, name, original))
        setattr(cls, name, method)

    def wrap_async(cls: Any, name: str, many: bool) -> None:
        original = cls.__dict__[name]

        async def method(
            self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any
        ) -> Any:
            count(self, query, params, many)
            return await original(self, query, params, *args, **kwargs)

        patched.append((cls, name, original))
        setattr(cls, name, method)

    def wrap_block_sync(cls: Any, name: str) -> None:
        original = cls.__dict__[name]

        @contextlib.contextmanager
        def method(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            state = blocks.setdefault(id(self), [0, False])
            state[0] += 1
            try:
                with original(self, *args, **kwargs) as block:
                    yield block
            finally:
                state[0] -= 1
                ended(self)

        patched.append((cls, name, original))
        setattr(cls, name, method)

    def wrap_block_async(cls: Any, name: str) -> None:
        original = cls.__dict__[name]

        @contextlib.asynccontextmanager
        async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            state = blocks.setdefault(id(self), [0, False])
            state[0] += 1
            try:
                async with original(self, *args, **kwargs) as block:
                    yield block
            finally:
                state[0] -= 1
                ended(self)

        patched.append((cls, name, original))
        setattr(cls, name, method)

    def wrap_commit(cls: Any, asynchronous: bool) -> None:
        original = cls.__dict__["commit"]

        if asynchronous:

            async def commit(self: Any) -> Any:
                out = await original(self)
                ended(self)
                return out
        else:

            def commit(self: Any) -> Any:  # type: ignore[misc]
                out = original(self)
                ended(self)
                return out

        patched.append((cls, "commit", original))
        cls.commit = commit

    for name, many in (("execute", False), ("executemany", True)):
        wrap_sync(psycopg.Cursor, name, many)
        wrap_async(psycopg.AsyncCursor, name, many)
    for name in ("pipeline", "transaction"):
        wrap_block_sync(psycopg.Connection, name)
        wrap_block_async(psycopg.AsyncConnection, name)
    wrap_commit(psycopg.Connection, asynchronous=False)
    wrap_commit(psycopg.AsyncConnection, asynchronous=True)
    try:
        yield
    finally:
        for cls, name, original in reversed(patched):
            setattr(cls, name, original)


def count_redis_monitor(lines: list[tuple[bool, str]], prefix: str) -> int:
    """Writes among MONITOR ``lines`` (``(from_lua, command)`` in server order) that
    touch keys under ``prefix``: top-level write commands, and scripts that ran a write."""
    writes = 0
    unit_write = False
    unit_ours = False
    for from_lua, command in [*lines, (False, "")]:
        name = command.split(" ", 1)[0].upper()
        if from_lua:
            unit_write = unit_write or name in REDIS_WRITES
            unit_ours = unit_ours or prefix in command
            continue
        writes += int(unit_write and unit_ours)  # the previous top-level unit ends here
        unit_write = name in REDIS_WRITES
        unit_ours = prefix in command
    return writes


class RedisMonitor:
    """A ``MONITOR`` connection collecting the server's commands while it runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.lines: list[tuple[bool, str]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RedisMonitor:
        from redis.asyncio import Redis

        self._client = Redis.from_url(self.url)
        self._monitor = self._client.monitor()
        await self._monitor.connect()
        ready = asyncio.Event()

        async def collect() -> None:
            monitor = self._monitor
            assert monitor.connection is not None
            await monitor.connection.send_command("MONITOR")
            await monitor.connection.read_response()  # OK
            ready.set()
            while True:
                item = await monitor.next_command()
                self.lines.append((item.get("client_type") == "lua", str(item["command"])))

        self._task = asyncio.create_task(collect())
        await asyncio.wait_for(ready.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        # The monitor reads behind the server: stop once it has seen a marker sent after
        # the pass's last command.
        marker = f"siglo-bench-monitor-end-{secrets.token_hex(4)}"
        await self._client.echo(marker)
        for _ in range(1000):  # 10 s at most
            if any(marker in line for _, line in self.lines[-50:]):
                break
            await asyncio.sleep(0.01)
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        with contextlib.suppress(Exception):
            if self._monitor.connection is not None:
                await self._monitor.connection.disconnect()
        await self._client.aclose()
