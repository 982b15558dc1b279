"""The commands that read or delete what is stored, on an SQLite path where there is no
database (a typo, most often), say so and create nothing (issue 31, defect 6: ``siglo ls
sqlite:///typo.db`` created an empty database file and listed nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from siglo.cli import cli


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), terminal_width=200)


@pytest.mark.parametrize(
    "command",
    [
        ("ls",),
        ("show", "{url}", "run-1"),
        ("export", "{url}", "-o", "{out}"),
        ("rm", "{url}", "run-1"),
        ("prune", "{url}", "--older-than", "1d"),
        ("clean",),
    ],
)
def test_reading_commands_refuse_a_missing_sqlite_database(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    path = tmp_path / "typo.db"
    url = f"sqlite:///{path}"
    out = tmp_path / "dump.jsonl"
    args = [a.format(url=url, out=out) for a in command]
    if len(args) == 1:
        args.append(url)
    result = _run(*args)
    assert result.exit_code == 1, result.output
    assert "there is no database at" in result.stderr, result.stderr
    assert "creates nothing" in result.stderr
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == [], "nothing may be created"


def test_an_existing_database_is_read_as_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    assert _run("migrate", url).exit_code == 0
    listed = _run("ls", url, "--json")
    assert listed.exit_code == 0, listed.output
    assert '"items": []' in listed.stdout


@pytest.mark.parametrize(
    "command",
    [("collect-blobs",), ("rekey",), ("erase", "-n", "t", "--yes")],
    ids=["collect-blobs", "rekey", "erase"],
)
def test_the_store_wide_walks_refuse_a_missing_sqlite_database(
    command: tuple[str, ...], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A blob collection on an empty store made at a mistyped path would reference no
    blob and take every one past its grace for an orphan; a rekey or an erasure there
    would report work done on nothing. Each refuses, creating nothing."""
    import base64
    import os

    blobs = tmp_path_factory.mktemp("blobs")
    (blobs / "kept").write_bytes(b"")  # the store is not empty: nothing may go from it
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    env = {
        "SIGLO_URL": url,  # the settings name the backend whose blob store it is
        "SIGLO_BLOB_URL": blobs.as_uri(),
        "SIGLO_MASTER_KEY": "base64:" + base64.b64encode(os.urandom(32)).decode(),
    }
    result = CliRunner().invoke(cli, [command[0], url, *command[1:]], env=env)
    assert result.exit_code == 1, result.output
    assert "there is no database at" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == [], "nothing may be created"
    assert [p.name for p in blobs.iterdir()] == ["kept"]


@pytest.mark.parametrize("command", ["ls", "show", "export", "rm", "prune", "clean"])
def test_reading_commands_refuse_a_postgres_schema_without_siglo_tables(command: str) -> None:
    """A typo in ``schema=``: the reading commands ask for siglo's tables without
    creating them, refuse, and leave no schema behind (before, they made the schema with
    every table and showed an empty store)."""
    import asyncio
    import uuid

    import psycopg
    from sql_support import POSTGRES_URL, require_postgres

    require_postgres()
    schema = f"siglo_typo_{uuid.uuid4().hex[:8]}"
    url = f"{POSTGRES_URL}?schema={schema}"
    args = {
        "ls": ["ls", url],
        "show": ["show", url, "run-1"],
        "export": ["export", url, "-o", "/dev/null"],
        "rm": ["rm", url, "run-1"],
        "prune": ["prune", url, "--older-than", "1d"],
        "clean": ["clean", url],
    }[command]
    result = _run(*args)
    assert result.exit_code == 1, result.output
    assert "there are no siglo tables at" in result.stderr, result.stderr

    async def exists() -> bool:
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as db:
            found = await db.execute(
                "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
            )
            return await found.fetchone() is not None

    assert not asyncio.run(exists()), f"schema {schema} was created"


_FLOWS = """
from siglo import Step, flow, wait_for_event
from siglo.errors import WaitTimeoutError


async def wait(order):
    try:
        return await wait_for_event(f"approve:{order}", timeout_ms=50)
    except WaitTimeoutError:  # the worker fired the timeout
        return None


async def done(event):
    return {"timed_out": event is None}


orders = flow(Step.create("wait", wait), Step.create("done", done))
"""


def _worker(tmp_path: Path, url: str, *extra: str) -> list[str]:
    import sys

    (tmp_path / "wkflows.py").write_text(_FLOWS, encoding="utf-8")
    return [sys.executable, "-m", "siglo", "worker", url, "--flows", "wkflows:orders", *extra]


def test_a_worker_given_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    """``siglo worker --once`` on a path with no database says so (status 1); a worker
    that runs on waits for the application's first write instead of creating an empty
    store of its own at a mistyped path, and works once the store is there."""
    import asyncio
    import contextlib
    import os
    import signal
    import subprocess
    import time

    import siglo
    from siglo.workflow.flow import WorkflowSuspended

    work = tmp_path / "work"
    work.mkdir()
    url = f"sqlite:///{work / 'typo.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    once = subprocess.run(
        _worker(tmp_path, url, "--once"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert once.returncode == 1, once.stdout + once.stderr
    assert "there is no database at" in once.stderr and "creates nothing" in once.stderr
    assert list(work.iterdir()) == [], "nothing may be created"

    running = subprocess.Popen(
        _worker(tmp_path, url, "--interval", "0.1"),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        assert running.poll() is None, running.communicate()
        assert list(work.iterdir()) == [], "a waiting worker creates nothing"

        async def app() -> None:
            import sys

            sys.path.insert(0, str(tmp_path))
            from wkflows import orders  # type: ignore[import-not-found]

            async with siglo.connect(url) as backend:
                manager = siglo.StorageManager(backend)
                with contextlib.suppress(WorkflowSuspended):
                    await orders.run(1, manager=manager, stack_id="order-1")
                # The worker fires the 50 ms timeout once it has found the store; on a
                # busy machine its polls and its start take seconds: a minute is allowed.
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    checkpoint = await backend.adapter.get_checkpoint("order-1")
                    if checkpoint is not None and checkpoint.status == "completed":
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError("the worker never fired the timer")

        try:
            asyncio.run(app())
        except AssertionError:
            running.send_signal(signal.SIGTERM)
            raise AssertionError(running.communicate(timeout=30)) from None
    finally:
        running.send_signal(signal.SIGTERM)
        out, err = running.communicate(timeout=30)
    assert "waiting: there is no database at" in err, err
    assert "found the storage at" in err, err
    assert "fired 1 timer(s)" in out, out
