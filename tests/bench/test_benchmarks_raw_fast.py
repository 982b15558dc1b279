"""The raw-fast baselines are real baselines: every workload passes their checks, and
their compare-and-set refuses what the raw ones refuse, also when the callers' statements
are batched or pipelined together (real Redis, PostgreSQL and SQLite; no timing asserted).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.subject import Conflict, Subject
from benchmarks.workloads import Workload, measure


def _unreachable() -> tuple[type[BaseException], ...]:
    """The errors of a server that is not there (the test then skips)."""
    import psycopg
    import redis.exceptions

    return (OSError, psycopg.OperationalError, redis.exceptions.ConnectionError)


REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")


def _postgres_url() -> str:
    return os.environ.get("SIGLO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _make(kind: str, backend: str, tmp_path: Path) -> Subject:
    if kind == "raw-fast" and backend == "sqlite":
        from benchmarks.raw_fast_sqlite import RawFastSqliteSubject

        return RawFastSqliteSubject(str(tmp_path / "raw-fast.db"))
    if kind == "raw-fast" and backend == "redis":
        from benchmarks.raw_fast_redis import RawFastRedisSubject

        return RawFastRedisSubject(REDIS_URL)
    if kind == "raw-fast" and backend == "postgres":
        from benchmarks.raw_fast_postgres import RawFastPostgresSubject

        return RawFastPostgresSubject(_postgres_url(), pool_size=4, doc_type="bytea")
    if backend == "sqlite":
        from benchmarks.raw_sqlite import RawSqliteSubject

        return RawSqliteSubject(str(tmp_path / "raw.db"))
    if backend == "redis":
        from benchmarks.raw_redis import RawRedisSubject

        return RawRedisSubject(REDIS_URL)
    from benchmarks.raw_postgres import RawPostgresSubject

    return RawPostgresSubject(_postgres_url(), pool_size=4, doc_type="bytea")


SUBJECTS = [(k, b) for k in ("raw-fast", "raw") for b in ("sqlite", "redis", "postgres")]


@pytest.fixture(params=SUBJECTS, ids=[f"{k}-{b}" for k, b in SUBJECTS])
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    kind, backend = request.param
    s = _make(kind, backend, tmp_path)
    try:
        await s.open()
    except _unreachable() as exc:
        pytest.skip(f"{backend} not reachable: {exc}")
    try:
        yield s
    finally:
        await s.close()


async def test_every_workload_passes_its_checks(subject: Subject) -> None:
    # The workloads assert what they time: loads return the saved revision, claims win,
    # locks are acquired and released, and the contending compare-and-set (8 writers on
    # one stack) loses no update.
    for name, size in [
        ("save", "1k"),
        ("load", "16k"),
        ("cas", "1k"),
        ("wait_claim", None),
        ("idempotency", None),
        ("lock", None),
        ("cache", None),
    ]:
        for concurrency in (1, 8, 32):
            m = await measure(
                subject, Workload(name, size, concurrency, 64), f"t-{name}-{concurrency}"
            )
            assert m.ops >= 64 and m.ops_per_s > 0


async def test_compare_and_set_refuses_the_loser_of_a_race(subject: Subject) -> None:
    ctx = {"step": {"n": 1}}
    await subject.save("race", 1, ctx, expected_revision=0)
    with pytest.raises(Conflict):  # it exists: expected 0 loses
        await subject.save("race", 1, ctx, expected_revision=0)
    # Two callers read revision 1 and both write 2, together (one batch, one pipeline or
    # one tick): exactly one wins.
    outcomes = await asyncio.gather(
        *(subject.save("race", 2, ctx, expected_revision=1) for _ in range(2)),
        return_exceptions=True,
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["Conflict", "NoneType"], outcomes
    assert await subject.load("race") == 2
    with pytest.raises(Conflict):  # a stale expected revision
        await subject.save("race", 3, ctx, expected_revision=1)
    with pytest.raises(Conflict):  # a plain save never moves the revision backwards
        await subject.save("race", 2, ctx)
    await subject.save("race", 5, ctx)
    assert await subject.load("race") == 5


async def test_loads_of_one_tick_each_get_their_own_checkpoint(subject: Subject) -> None:
    for i in range(5):
        await subject.save(f"many-{i}", i + 1, {"i": {"v": i}})
    got = await asyncio.gather(*(subject.load(f"many-{i}") for i in range(7)))
    assert got == [1, 2, 3, 4, 5, None, None]


async def test_contending_writers_do_conflict_when_their_calls_interleave(
    tmp_path: Path,
) -> None:
    """The batched and pipelined baselines yield between a load and its save, so writers
    sharing a stack really do race (and the workload counts their conflicts)."""
    for backend in ("redis", "postgres"):
        s = _make("raw-fast", backend, tmp_path)
        try:
            await s.open()
        except _unreachable() as exc:
            pytest.skip(f"{backend} not reachable: {exc}")
        try:
            m = await measure(s, Workload("cas", "1k", 8, 64), "contend")
            assert m.extra["conflicts"] > 0, backend
        finally:
            await s.close()


async def test_callers_of_one_tick_share_one_pipeline_or_batch(tmp_path: Path) -> None:
    from benchmarks.raw_fast_postgres import RawFastPostgresSubject
    from benchmarks.raw_fast_redis import RawFastRedisSubject

    redis = RawFastRedisSubject(REDIS_URL)
    postgres = RawFastPostgresSubject(_postgres_url(), pool_size=4, doc_type="bytea")
    opened: list[Any] = []
    try:
        for s in (redis, postgres):
            try:
                await s.open()
            except _unreachable() as exc:
                pytest.skip(f"{s.backend} not reachable: {exc}")
            opened.append(s)
        await asyncio.gather(*(redis.save(f"p{i}", 1, {"a": {}}) for i in range(32)))
        assert redis.pipe.commands >= 32 and redis.pipe.pipelines < 4
        await asyncio.gather(*(postgres.save(f"p{i}", 1, {"a": {}}) for i in range(32)))
        assert postgres._saves.items == 32 and postgres._saves.batches == 1
        # Pipelined in autocommit, one tick's saves are one implicit transaction: the
        # rows share the inserting transaction id (committed together, at the Sync).
        assert postgres.pool is not None
        async with postgres.pool.connection() as conn:
            cur = await conn.execute("SELECT DISTINCT xmin::text FROM checkpoints")
            assert len(await cur.fetchall()) == 1
        assert await asyncio.gather(*(postgres.load(f"p{i}") for i in range(32))) == [1] * 32
        assert postgres._loads.items == 32 and postgres._loads.batches == 1
    finally:
        for s in opened:
            await s.close()


async def test_raw_fast_sqlite_runs_its_statements_on_the_loop_thread(tmp_path: Path) -> None:
    import threading

    from benchmarks.raw_fast_sqlite import RawFastSqliteSubject

    s = RawFastSqliteSubject(str(tmp_path / "inline.db"))
    await s.open()
    try:
        assert s.db is not None
        threads: set[int] = set()
        s.db.set_trace_callback(lambda _sql: threads.add(threading.get_ident()))
        await s.save("a", 1, {"c": {}})
        assert await s.load("a") == 1
        assert threads == {threading.get_ident()}
        # WAL, as raw's and siglo's files.
        assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        await s.close()


async def test_statements_an_operation_are_counted_at_the_driver(tmp_path: Path) -> None:
    """benchmarks/statements.py: the raw-fast baselines send one statement (Redis: one
    command) a save and two a compare-and-set without contention, on every server."""
    from benchmarks.statements import SqliteConnections, statements_per_op

    conns = SqliteConnections()
    for backend in ("sqlite", "redis", "postgres"):
        with conns.tracking():
            s = _make("raw-fast", backend, tmp_path)
            conns.armed = True  # its connections traced from their opening
            try:
                await s.open()
            except _unreachable() as exc:
                pytest.skip(f"{backend} not reachable: {exc}")
            try:
                for name, calls, want in (("save", 4, 1.0), ("cas", 1, 2.0), ("load", 4, 1.0)):
                    got = await statements_per_op(
                        s,
                        Workload(name, "1k", calls, calls),
                        backend,
                        sqlite_conns=conns,
                        redis_url=REDIS_URL,
                    )
                    if (backend, name) == ("postgres", "load"):
                        # Callers' loads of one tick share one batched statement.
                        assert got is not None and 0 < got <= 1.0, got
                    else:
                        assert got == want, (backend, name, got)
            finally:
                await s.close()
