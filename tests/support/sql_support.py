"""Shared helpers of the SQL backend tests (imported by tests/test_sql_*.py and friends).

Every backend a test opens is on private storage: SQLite a fresh temporary file or a
private in-memory database, PostgreSQL a fresh schema ``siglo_test_<random>``, dropped
afterwards. PostgreSQL comes from ``SIGLO_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); when it cannot be reached its tests are
skipped with a plain message, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from siglo.backend import Backend

POSTGRES_URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

KINDS = ("sqlite-memory", "sqlite-file", "postgres")
SHARED_KINDS = ("sqlite-file", "postgres")
"""Backends that several processes share."""


@functools.cache
def postgres_problem() -> str | None:
    """Why PostgreSQL cannot be used here, or ``None``."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'siglo[postgres]>=0.1,<1')"
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return f"PostgreSQL is not reachable at {POSTGRES_URL}: {exc}".strip()


def require_postgres() -> None:
    """Skip (or, under CI=true, fail) when PostgreSQL is not reachable."""
    problem = postgres_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{problem} (CI=true: a missing backend fails the run)")
    pytest.skip(f"{problem}; skipping the PostgreSQL tests")


def base_url(kind: str) -> str:
    """The URL :func:`open_backend` isolates from."""
    if kind == "sqlite-memory":
        return "sqlite://"
    if kind == "sqlite-file":
        # Absolute, in the temporary directory: isolated() makes its directory beside
        # the URL's file, and one in the checkout raced `ruff check .` walking it.
        return f"sqlite:///{Path(tempfile.gettempdir()) / 'siglo-test.db'}"
    if kind == "postgres":
        require_postgres()
        return POSTGRES_URL
    raise ValueError(kind)


@asynccontextmanager
async def open_backend(kind: str, **options: Any) -> AsyncIterator[Backend]:
    """A backend of ``kind`` on private storage, removed afterwards."""
    url = base_url(kind)
    if kind == "postgres":
        from siglo_postgres import isolated
    else:
        from siglo_sqlite import isolated  # type: ignore[assignment]
    async with isolated(url, **options) as backend:
        yield backend


async def refusing_trigger(backend: Backend, table: str, event: str, message: str) -> str:
    """A trigger on siglo's ``table`` (its name without the prefix) that fails every
    ``event`` (``INSERT``, ``DELETE`` …) with ``message``; returns the SQL that drops it."""
    adapter: Any = backend.adapter
    db = adapter.database
    if backend.name == "postgres":
        full = f"{adapter.schema}.{adapter.table_prefix}{table}"
        await db.fetch(
            f"CREATE FUNCTION {adapter.schema}.refuse() RETURNS trigger"
            f" LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '{message}'; END $$"
        )
        await db.fetch(
            f"CREATE TRIGGER refuse BEFORE {event} ON {full}"
            f" FOR EACH ROW EXECUTE FUNCTION {adapter.schema}.refuse()"
        )
        return f"DROP TRIGGER refuse ON {full}"
    full = f"{adapter.table_prefix}{table}"
    await db.fetch(
        f"CREATE TRIGGER refuse BEFORE {event} ON {full}"
        f" BEGIN SELECT RAISE(ABORT, '{message}'); END"
    )
    return "DROP TRIGGER refuse"


# -- worker processes ------------------------------------------------------------------


_pool: Any = None
POOL_SIZE = 4


def worker_pool() -> Any:
    """The test run's pool of spawned worker processes, warmed up (imports done).

    Made once and shared by every test module (spawning and importing is the slow part);
    shut down when the run exits.
    """
    global _pool
    if _pool is None:
        import atexit
        import multiprocessing
        import time
        from concurrent.futures import ProcessPoolExecutor

        from sql_workers import exit_with_parent

        _pool = ProcessPoolExecutor(
            POOL_SIZE, mp_context=multiprocessing.get_context("spawn"), initializer=exit_with_parent
        )
        list(_pool.map(time.sleep, [0.01] * POOL_SIZE))
        atexit.register(_pool.shutdown)
    return _pool


async def race(job: str, url: str, **args: Any) -> list[Any]:
    """Run ``job`` in every worker process, all starting at the same instant; their results.

    Fails the test if any worker saw an error (a leaked "database is locked" included).
    """
    import asyncio
    import time

    from sql_workers import run_job

    pool = worker_pool()
    start_at = time.time() + 0.5
    futures = [
        asyncio.wrap_future(pool.submit(run_job, job, url, start_at, worker, args))
        for worker in range(POOL_SIZE)
    ]
    outcomes = await asyncio.gather(*futures)
    errors = [e for o in outcomes for e in o["errors"]]
    assert errors == [], errors
    return [o["result"] for o in outcomes]


def statements_sent(trace: list[str]) -> list[str]:
    """An SQLite trace (``set_trace_callback``) as the statements sent: SQLite traces the
    start of each trigger program with the text of the statement that fired it (the
    checkpoints' triggers of schema version 6 run on every save), so an entry that
    repeats the one before it is that statement's trigger, not another statement."""
    return [sql for i, sql in enumerate(trace) if i == 0 or sql != trace[i - 1]]
