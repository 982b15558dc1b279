"""Measured where a siglo workflow run's time goes inside SQLite, statement by statement.

``python -m benchmarks.experiments.e2e_statements [RUNS] [ROUNDS]``: the end-to-end
benchmark's siglo subject (``benchmarks.e2e.SigloWorkflow``: a flow of 3 steps, one
cached, strict manager) on a SQLite file, 32 runs at once, ``RUNS`` runs a round after a
warm-up round. Every ``sqlite3`` connection the process opens (the inline ones on the
event loop's thread, the driver's, the WAL checkpointer's) is made with a connection
class whose ``execute`` times itself; the round prints its runs/s, then each kind of
statement's calls a run, mean µs a call and µs a run (``loop``: run on the event loop's
thread; ``thread``: on another, such as the WAL checkpointer's; then the statement's
text up to its first 60 characters), and the totals of each. The timing wrapper costs
a few microseconds a statement, so runs/s is lower than the benchmark's.

After each round, raw-fast's plain write (``benchmarks.write_limit``: inline ``sqlite3``,
a commit a write) by 32 writers on another file of the same directory, ten writes a run,
makes the raw write limit at siglo's writes a run (its ``INSERT``, ``UPDATE`` and
``DELETE`` statements on the loop); the round prints the time a run that limit leaves
and the share of it siglo's statements on the loop took. What the end-to-end miss of
docs/benchmarks.md cites.
"""

from __future__ import annotations

import asyncio
import collections
import re
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CONCURRENCY = 32

_spent: collections.Counter[str] = collections.Counter()
_calls: collections.Counter[str] = collections.Counter()


def _kind(sql: str) -> str:
    """The statement's text up to 60 characters, and whether the loop's thread ran it."""
    where = "loop" if threading.current_thread() is threading.main_thread() else "thread"
    text = re.sub(r"\s+", " ", sql).strip()[:60]
    return f"{where:6} {text}"


class _TimedConnection(sqlite3.Connection):
    """A ``sqlite3`` connection whose ``execute`` adds its time to the counters."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        started = time.perf_counter_ns()
        try:
            return super().execute(sql, parameters)
        finally:
            kind = _kind(sql)
            _spent[kind] += time.perf_counter_ns() - started
            _calls[kind] += 1


@contextmanager
def _timed_connections() -> Iterator[None]:
    """Every ``sqlite3`` connection opened meanwhile times its statements."""
    plain = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", _TimedConnection)
        conn: sqlite3.Connection = plain(*args, **kwargs)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]  # the same signature, timed
    try:
        yield
    finally:
        sqlite3.connect = plain


def _is_write(kind: str) -> bool:
    return kind.startswith("loop") and kind.split()[1] in {"INSERT", "UPDATE", "DELETE"}


async def _measure(runs: int, rounds: int) -> list[str]:
    from benchmarks.e2e import SigloWorkflow, measure_runs
    from benchmarks.raw_fast_sqlite import RawFastSqliteSubject
    from benchmarks.write_limit import measure_writes

    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="siglo-e2e-statements-") as directory:
        # The raw writer's connection is opened plainly: its writes are not timed one by
        # one, only their rate.
        raw = RawFastSqliteSubject(f"{directory}/limit.db")
        await raw.open()
        subject = SigloWorkflow("sqlite", f"sqlite:///{directory}/e2e.db")
        timed = _timed_connections()
        timed.__enter__()  # siglo opens connections when it needs them, not all at once
        await subject.open()
        try:
            await measure_runs(subject, CONCURRENCY, CONCURRENCY * 4)  # warm-up
            for n in range(1, rounds + 1):
                _spent.clear()
                _calls.clear()
                got = await measure_runs(subject, CONCURRENCY, runs)
                # measure_runs runs one untimed run a task before its timed ones.
                done = got["runs"] + CONCURRENCY
                lines.append(f"round {n}: {got['runs_per_s']:,.0f} runs/s")
                for kind, ns in _spent.most_common():
                    lines.append(
                        f"  {_calls[kind] / done:5.2f} a run  {ns / _calls[kind] / 1e3:8.1f} µs "
                        f"each  {ns / done / 1e3:7.1f} µs a run  {kind}"
                    )
                for where in ("loop", "thread"):
                    total = sum(ns for k, ns in _spent.items() if k.startswith(where)) / done
                    lines.append(f"  in statements on the {where}: {total / 1e3:.1f} µs a run")
                on_loop = sum(ns for k, ns in _spent.items() if k.startswith("loop")) / done / 1e3
                writes = sum(c for k, c in _calls.items() if _is_write(k)) / done
                limit = await measure_writes(raw, CONCURRENCY, runs * 10)
                budget = 1e6 / (limit["runs_per_s"] / writes)
                lines.append(
                    f"  raw-fast plain writes at {CONCURRENCY} writers: "
                    f"{limit['runs_per_s']:,.0f}/s; at siglo's {writes:.1f} writes a run the "
                    f"limit is {limit['runs_per_s'] / writes:,.0f} runs/s, {budget:.0f} µs a "
                    f"run; siglo's statements on the loop took {on_loop / budget:.2f} of that"
                )
        finally:
            await subject.close()
            timed.__exit__(None, None, None)
            await raw.close()
    return lines


def main(runs: int = 3_200, rounds: int = 3) -> None:
    for line in asyncio.run(_measure(runs, rounds)):
        print(line)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
