"""Statements (Redis: commands) an operation, counted at the driver in untimed passes.

A ratio of ops/s below the target can come from a subject that asks the server more
often for the same operation: a save written in parts, a transaction's ``BEGIN`` and
``COMMIT`` around one statement, a load and a script where one would do. After a cell's
timed rounds, each subject runs the cell twice more, untimed, with ``1`` and ``1 + N``
operations per caller (:data:`EXTRA`), counting what it sends (save, load and
compare-and-set: the cells with targets against the raw baselines); the difference over the
``N × callers`` operations is what one operation costs, with the setup and the warm-up
(the same in both passes) left out. A compare-and-set's retries are part of its
operation, as in the timed rounds.

* **SQLite**: the counting passes run on a twin of each subject, on files of its own,
  whose connections get a trace callback when they are opened (``sqlite3.connect``
  wrapped, :class:`SqliteConnections`), aiosqlite's included; it counts the statements
  they run while a pass counts, ``BEGIN`` and ``COMMIT`` included (a write reported
  twice in a row is one: a trigger's start). The subjects timed are never traced.
* **PostgreSQL**: psycopg's ``execute`` and ``executemany`` (sync and async) are wrapped
  during the counting pass only; ``executemany`` counts one statement per parameter set.
* **Redis**: a ``MONITOR`` connection during the pass; the top-level commands naming the
  pass's keys (scripts count once, whatever they run inside).

Nothing timed is traced or wrapped, so timed passes pay nothing.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

from benchmarks.subject import Subject
from benchmarks.workloads import Workload, measure
from benchmarks.writes import is_write_sql

EXTRA = 2
"""Operations per caller the second counting pass does more than the first."""

COUNTED = frozenset(("save", "load", "cas"))
"""The workloads counted: those with a target against the raw baselines."""


class Counter:
    """Statements counted while :attr:`enabled` (drivers' threads included)."""

    def __init__(self) -> None:
        self.enabled = False
        self.count = 0
        self._lock = threading.Lock()

    def add(self, n: int = 1) -> None:
        if self.enabled:
            with self._lock:
                self.count += n


class SqliteConnections:
    """Traces the ``sqlite3`` connections opened inside while :attr:`armed` (see the
    module's doc).

    A connection gets its trace callback when it is opened, on the thread opening it,
    and keeps it: setting one later from the loop's thread could wait for a connection
    another thread is using, holding the GIL that thread's callback needs (a deadlock).
    So the subjects timed are opened unarmed and never traced, and the counting passes
    run on twins of them opened armed (benchmarks/cli.py)."""

    def __init__(self) -> None:
        self.armed = False
        self.counter = Counter()
        self.traced_connections = 0

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        original = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn: sqlite3.Connection = original(*args, **kwargs)
            if self.armed:
                conn.set_trace_callback(self._tracer())
                self.traced_connections += 1
            return conn

        modules: list[Any] = [sqlite3, sqlite3.dbapi2]
        for module in modules:
            module.connect = connect
        try:
            yield
        finally:
            for module in modules:
                module.connect = original

    def _tracer(self) -> Any:
        last = [""]

        def trace(sql: str) -> None:
            counter = self.counter
            if not counter.enabled:
                return
            # A write reported twice in a row is one statement firing a trigger (the
            # trigger's start is reported with its statement's text); a read may repeat
            # itself, parameters and all (a caller loading one stack again).
            if sql == last[0] and is_write_sql(sql):
                return
            last[0] = sql
            counter.add()

        return trace

    @contextlib.contextmanager
    def traced(self, counter: Counter) -> Iterator[int]:
        """Count the traced connections' statements into ``counter`` (connections opened
        meanwhile are traced too); yields how many are traced."""
        self.counter, armed = counter, self.armed
        self.armed = True
        try:
            yield self.traced_connections
        finally:
            self.armed = armed
            self.counter = Counter()


@contextlib.contextmanager
def psycopg_counted(counter: Counter) -> Iterator[None]:
    """psycopg's cursors count every statement into ``counter`` inside."""
    import psycopg

    patched: list[tuple[Any, str, Any]] = []

    def wrap(cls: Any, name: str, many: bool, is_async: bool) -> None:
        original = cls.__dict__[name]

        def count(params: Any) -> None:
            counter.add(len(params) if many and isinstance(params, list | tuple) else 1)

        if is_async:

            async def amethod(self: Any, query: Any, params: Any = None, *a: Any, **k: Any) -> Any:
                count(params)
                return await original(self, query, params, *a, **k)

            setattr(cls, name, amethod)
        else:

            def method(self: Any, query: Any, params: Any = None, *a: Any, **k: Any) -> Any:
                count(params)
                return original(self, query, params, *a, **k)

            setattr(cls, name, method)
        patched.append((cls, name, original))

    for name, many in (("execute", False), ("executemany", True)):
        wrap(psycopg.Cursor, name, many, False)
        wrap(psycopg.AsyncCursor, name, many, True)
    try:
        yield
    finally:
        for cls, name, original in reversed(patched):
            setattr(cls, name, original)


async def _pass(
    subject: Subject,
    workload: Workload,
    per_caller: int,
    backend: str,
    sqlite_conns: SqliteConnections | None,
    redis_url: str,
) -> int | None:
    """What one untimed pass of ``per_caller`` operations per caller sent."""
    tag = f"s{secrets.token_hex(3)}"
    w = Workload(
        workload.name, workload.size, workload.concurrency, per_caller * workload.concurrency
    )
    counter = Counter()
    if backend == "redis":
        from benchmarks.writes import RedisMonitor

        async with RedisMonitor(redis_url) as monitor:
            await measure(subject, w, tag)
        return sum(1 for lua, line in monitor.lines if not lua and tag in line)
    if backend == "postgres":
        with psycopg_counted(counter):
            counter.enabled = True
            await measure(subject, w, tag)
        return counter.count
    if backend == "sqlite" and sqlite_conns is not None:
        with sqlite_conns.traced(counter):
            counter.enabled = True
            await measure(subject, w, tag)
        return counter.count or None
    return None


async def statements_per_op(
    subject: Subject,
    workload: Workload,
    backend: str,
    *,
    sqlite_conns: SqliteConnections | None = None,
    redis_url: str = "",
) -> float | None:
    """Statements (Redis: commands) one operation of ``workload`` sends on ``subject``
    (``None``: not countable here)."""
    if backend not in ("sqlite", "postgres", "redis") or workload.name not in COUNTED:
        return None
    # A first pass untimed and uncounted: what a subject does once (opening a connection,
    # preparing its statements) is in neither pass that counts.
    # On SQLite armed (connections it opens are traced) but not counting.
    armed = sqlite_conns.traced(Counter()) if sqlite_conns is not None else None
    with armed if armed is not None else contextlib.nullcontext():
        await measure(
            subject,
            Workload(workload.name, workload.size, workload.concurrency, 1),
            f"w{secrets.token_hex(3)}",
        )
    one = await _pass(subject, workload, 1, backend, sqlite_conns, redis_url)
    more = await _pass(subject, workload, 1 + EXTRA, backend, sqlite_conns, redis_url)
    if one is None or more is None:
        return None
    return max(0, more - one) / (EXTRA * workload.concurrency)
