"""The event-loop lag probe, the write counters of the end-to-end comparison and the
compare-and-set conflict figures: each measures what it says (real SQLite, PostgreSQL
and Redis; no timing asserted except a lag that cannot be shorter than a block)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report, writes
from benchmarks.loop_lag import lag_during, percentile
from benchmarks.subject import Subject
from benchmarks.workloads import WARMUP, Workload

ROOT = Path(__file__).resolve().parents[2]


class _Blocking(Subject):
    """A store whose save holds the event loop's thread for 20 ms (as inline I/O does)."""

    kind = "blocking"

    async def save(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.02)  # noqa: ASYNC251  (the point: work that holds the loop)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


async def test_the_probe_sees_a_loop_held_by_inline_work() -> None:
    lags = await lag_during(_Blocking(), Workload("save", "1k", 4, 8), "lag", min_samples=1)
    # The probe cannot wake before a 20 ms block ends: some wake is at least ~19 ms late.
    assert lags and max(lags) >= 19.0, lags


class _Counting(Subject):
    """A store that yields at each save and counts them."""

    kind = "counting"

    def __init__(self) -> None:
        self.saves = 0

    async def save(self, *args: Any, **kwargs: Any) -> None:
        self.saves += 1
        await asyncio.sleep(0.0005)


async def test_a_round_runs_until_the_probe_has_its_samples() -> None:
    # One run (4 first saves, WARMUP each untimed, then 8) takes about 5 ms: the probe
    # wakes a few times; the round runs it again, whole, until it has woken 50 times.
    subject = _Counting()
    lags = await lag_during(subject, Workload("save", "1k", 4, 8), "lag", min_samples=50)
    assert len(lags) >= 50
    one_run = 4 + 4 * WARMUP + 8
    assert subject.saves >= 2 * one_run and subject.saves % one_run == 0, subject.saves


def _cli(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--no-chart", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    return doc


def test_loop_lag_and_raw_fast_run_from_the_command_line(tmp_path: Path) -> None:
    doc = _cli(
        tmp_path,
        "--backends",
        "sqlite",
        "--sizes",
        "1k",
        "--workloads",
        "save,load,cas",
        "--raw-fast",
        "--loop-lag",
        "--no-langgraph",
    )
    assert doc["meta"]["order"] == ["workloads:sqlite", "loop-lag"]
    kinds = {(s["kind"], s["status"]) for s in doc["subjects"]}
    assert {("siglo", "ok"), ("raw", "ok"), ("raw-fast", "ok")} <= kinds
    assert all(r["status"] == "ok" for r in doc["results"])
    # siglo / raw-fast for every cell, and a 0.8x target for save, load and CAS.
    fast = {x["workload"] for x in doc["ratios"] if x["vs"] == "raw-fast"}
    assert fast == {r["workload"] for r in doc["results"] if r["kind"] == "siglo"}
    assert any(t["target"] == "siglo >= 0.8x raw-fast driver" for t in doc["targets"])
    lag = {(e["kind"], e["workload"]): e for e in doc["loop_lag"]}
    assert set(lag) == {
        (k, f"{n}/1k/c32") for k in ("siglo", "raw", "raw-fast") for n in ("save", "load", "cas")
    }
    for e in lag.values():
        assert e["status"] == "ok", e
        assert 0 <= e["p50_ms"] <= e["p99_ms"] <= e["max_ms"]
    md = (tmp_path / "out" / "results.md").read_text()
    assert (
        "| workload | siglo ops/s | raw ops/s | raw-fast ops/s | siglo / raw | siglo / raw-fast |"
        in md
    )
    assert "### event-loop lag at 32 callers" in md
    assert "### compare-and-set: conflicts per successful update" in md
    assert "then the event-loop lag probes" in md
    # Statements an operation, counted in untimed passes (benchmarks/statements.py): the
    # raw-fast baseline's save is its one statement, its compare-and-set a load and a
    # save (inline, its writers never conflict); the counts run on twins whose
    # connections are traced from their opening, aiosqlite's (raw's) included.
    per_op = {(r["kind"], r["workload"]): r["statements_per_op"] for r in doc["results"]}
    assert per_op[("raw-fast", "save/1k/c1")] == per_op[("raw-fast", "save/1k/c32")] == 1.0
    assert per_op[("raw-fast", "cas/1k/c8")] == 2.0
    assert per_op[("raw", "save/1k/c1")] == 1.0
    # siglo's: counted for every cell; one caller's operations each send at least one.
    # At 8 or 32 callers loads share statements (coalesced reads) and writes share
    # transactions (group commit), so the difference between the two passes, which is
    # what is counted, can come out 0 when the machine's load coalesces them alike.
    siglo = sorted((w, v) for (k, w), v in per_op.items() if k == "siglo")
    assert all(v is not None and v >= 0 for _, v in siglo), siglo
    assert all(v is not None and v >= 1 for w, v in siglo if w.endswith("/c1")), siglo
    assert per_op[("siglo", "save/1k/c1")] >= 1.0
    # … and a ratio carries both sides' figure, for the computed reason of a miss.
    x = next(x for x in doc["ratios"] if (x["vs"], x["workload"]) == ("raw-fast", "save/1k/c1"))
    assert x["statements"] == [per_op[("siglo", "save/1k/c1")], 1.0]


def test_a_run_recorded_with_warm_up_conflicts_shows_no_conflict_table() -> None:
    r = {
        "backend": "sqlite",
        "kind": "raw",
        "workload": "cas/1k/c8",
        "name": "cas",
        "concurrency": 8,
        "status": "ok",
        "ops": 100,
        "runs": [1.0],
        "extra": [{"conflicts": 350}],
    }
    assert report._conflict_lines({"meta": {}, "results": [r]}) == []
    lines = report._conflict_lines({"meta": {"timed_conflicts": True}, "results": [r]})
    assert "| sqlite | cas/1k/c8 | raw | 3.50 (3.50–3.50) |" in lines


def test_conflicts_per_update_are_the_timed_conflicts_over_the_updates() -> None:
    r = {"name": "cas", "ops": 200, "runs": [1.0, 2.0], "extra": [{"conflicts": 700}, {}]}
    assert report.conflicts_per_update(r) == [3.5, 0.0]
    assert report.conflicts_per_update({**r, "name": "save"}) == []
    assert report.conflicts_per_update({**r, "extra": [{"conflicts": 1}]}) == []


def test_a_write_is_an_insert_update_delete_or_replace() -> None:
    for sql in (
        "INSERT INTO t VALUES (1)",
        "  update t set a = 1",
        "DELETE FROM t",
        "REPLACE INTO t VALUES (1)",
        "WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x",
        "INSERT INTO t VALUES (1) ON CONFLICT (k) DO UPDATE SET a = 2",
    ):
        assert writes.is_write_sql(sql), sql
    for sql in (
        "SELECT * FROM t FOR UPDATE",
        "BEGIN",
        "COMMIT",
        "PRAGMA x",
        "WITH x AS (SELECT 1) SELECT 1",
    ):
        assert not writes.is_write_sql(sql), sql


def test_sqlite_writes_and_their_transactions_are_counted(tmp_path: Path) -> None:
    counter = writes.WriteCounter()
    with writes.counting_sqlite(counter):
        conn = sqlite3.connect(tmp_path / "w.db", isolation_level=None)
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, a INT)")
    conn.execute("CREATE TABLE log (a INT)")
    conn.execute("CREATE TRIGGER tr AFTER UPDATE ON t BEGIN INSERT INTO log VALUES (NEW.a); END")
    counter.enabled = True
    conn.execute("INSERT INTO t VALUES (1, 1)")  # autocommit: one transaction
    conn.execute("SELECT * FROM t").fetchall()  # not a write
    conn.execute("BEGIN")
    conn.execute("UPDATE t SET a = 2 WHERE k = 1")  # fires the trigger: still one statement
    conn.execute("UPDATE t SET a = 3 WHERE k = 1")
    conn.execute("COMMIT")
    conn.execute("BEGIN")
    conn.execute("SELECT 1").fetchall()
    conn.execute("COMMIT")  # a read-only transaction is no write
    counter.enabled = False
    conn.execute("INSERT INTO t VALUES (2, 2)")  # not counting
    conn.close()
    assert counter.snapshot() == (3, 2)
    assert sqlite3.connect is not None and sqlite3.connect.__module__ == "_sqlite3"


async def test_psycopg_writes_are_counted() -> None:
    psycopg = pytest.importorskip("psycopg")
    url = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    counter = writes.WriteCounter()
    with writes.counting_psycopg(counter):
        try:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        except psycopg.OperationalError as exc:
            pytest.skip(f"postgres not reachable: {exc}")
        async with conn:
            await conn.execute("CREATE TEMP TABLE w (k INT PRIMARY KEY, a INT)")
            counter.enabled = True
            await conn.execute("INSERT INTO w VALUES (1, 1)")
            await conn.execute(b"UPDATE w SET a = 2 WHERE k = 1")
            await conn.execute("SELECT * FROM w WHERE k = %s FOR UPDATE", (1,))
            async with conn.cursor() as cur:
                await cur.executemany("INSERT INTO w VALUES (%s, 0)", [(2,), (3,), (4,)])
            counter.enabled = False
            await conn.execute("DELETE FROM w")
    # Five writing statements; three write transactions: each autocommit statement is
    # one, and executemany's three inserts share the one Sync of its pipeline.
    assert counter.snapshot() == (5, 3)
    assert "method" not in psycopg.AsyncCursor.execute.__qualname__  # restored


def test_a_redis_write_is_a_write_command_or_a_script_that_wrote() -> None:
    lines = [
        (False, "EVALSHA abc 1 p:cp:1 x"),  # a script that wrote: one write
        (True, "HGET p:cp:1 r"),
        (True, "HSET p:cp:1 r 2"),
        (False, "EVALSHA def 1 p:cp:1"),  # a script that only read
        (True, "HGET p:cp:1 d"),
        (False, "SET p:k v"),
        (False, "GET p:k"),
        (False, "SET other:k v"),  # another prefix
        (False, "PEXPIRE p:k 10"),
    ]
    assert writes.count_redis_monitor(lines, "p:") == 3


async def test_the_redis_monitor_counts_a_prefixs_writes() -> None:
    redis_asyncio = pytest.importorskip("redis.asyncio")
    import redis.exceptions

    url = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"siglo-bench-test:{secrets.token_hex(4)}:"
    client = redis_asyncio.Redis.from_url(url)
    try:
        await client.ping()
    except (OSError, redis.exceptions.ConnectionError) as exc:
        pytest.skip(f"redis not reachable: {exc}")
    try:
        async with writes.RedisMonitor(url) as monitor:
            await client.set(prefix + "a", "1")
            await client.get(prefix + "a")
            await client.eval("return redis.call('DEL', KEYS[1])", 1, prefix + "a")
            await client.eval("return redis.call('GET', KEYS[1])", 1, prefix + "a")
            await asyncio.gather(*(client.hset(prefix + f"h{i}", "f", "v") for i in range(3)))
        assert writes.count_redis_monitor(monitor.lines, prefix) == 5
    finally:
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
