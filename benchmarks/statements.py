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

* **SQLite**: every ``sqlite3`` connection opened while a backend's workloads run is
  remembered (``sqlite3.connect`` wrapped: a cost at connect only); during a counting
  pass each gets a trace callback counting the statements it runs, ``BEGIN`` and
  ``COMMIT`` included (a write reported twice in a row is one: a trigger's start).
  A connection that may not be touched from the loop's thread (aiosqlite's) cannot be
  traced, and a subject with nothing traced has no figure.
* **PostgreSQL**: psycopg's ``execute`` and ``executemany`` (sync and async) are wrapped
  during the counting pass only; ``executemany`` counts one statement per parameter set.
* **Redis**: a ``MONITOR`` connection during the pass; the top-level commands naming the
  pass's keys (scripts count once, whatever they run inside).

Outside the counting passes nothing is traced or wrapped, so timed passes pay nothing.
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
    """Remembers every ``sqlite3`` connection opened inside (see the module's doc)."""

    def __init__(self) -> None:
        # Held, not weakly (a sqlite3.Connection takes no weak reference), until the
        # tracking ends; a closed one refuses its trace callback and is left out.
        self._conns: list[sqlite3.Connection] = []

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        original = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn: sqlite3.Connection = original(*args, **kwargs)
            self._conns.append(conn)
            return conn

        modules: list[Any] = [sqlite3, sqlite3.dbapi2]
        for module in modules:
            module.connect = connect
        try:
            yield
        finally:
            for module in modules:
                module.connect = original
            self._conns.clear()

    @contextlib.contextmanager
    def traced(self, counter: Counter) -> Iterator[int]:
        """Trace every remembered connection into ``counter``; yields how many could be."""
        traced: list[sqlite3.Connection] = []
        for conn in list(self._conns):
            last = [""]

            def trace(sql: str, last: list[str] = last) -> None:
                # A write reported twice in a row is one statement firing a trigger (the
                # trigger's start is reported with its statement's text); a read may
                # repeat itself, parameters and all (a caller loading one stack again).
                if sql == last[0] and is_write_sql(sql):
                    return
                last[0] = sql
                counter.add()

            try:
                conn.set_trace_callback(trace)
            except sqlite3.ProgrammingError:  # closed, or owned by another thread
                continue
            traced.append(conn)
        try:
            yield len(traced)
        finally:
            for conn in traced:
                with contextlib.suppress(sqlite3.ProgrammingError):
                    conn.set_trace_callback(None)


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
        with sqlite_conns.traced(counter) as traced:
            if not traced:
                return None
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
    one = await _pass(subject, workload, 1, backend, sqlite_conns, redis_url)
    more = await _pass(subject, workload, 1 + EXTRA, backend, sqlite_conns, redis_url)
    if one is None or more is None:
        return None
    return max(0, more - one) / (EXTRA * workload.concurrency)
