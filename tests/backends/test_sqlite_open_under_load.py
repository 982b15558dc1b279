"""Opening an SQLite file that other processes are opening or holding: the backend waits
for their locks (within its bound), as every other call does, instead of failing.

CI once saw a worker process fail to connect with a bare "database is locked"
(tests/backends/test_sql_multiprocess.py, four processes creating one file together). Every
statement that sets a connection up now waits and retries until the connect's deadline.
Against real locks taken by plain ``sqlite3`` connections in other processes.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import siglo
from siglo import Checkpoint
from siglo.errors import StorageAdapterError
from siglo_sqlite.connections import open_reader, open_writer

# Opens the file and closes it again, as fast as it can: each time its process's first
# connection, which locks the WAL index exclusively for a moment to see whether it is
# the first of all. Prints one line once it is running.
OPENER = """
import sqlite3, sys
print("opening", flush=True)
while True:
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    conn.close()
"""

# Holds an exclusive lock on a file in rollback-journal mode (nothing else may read it)
# for argv[2] seconds; prints one line once it holds it.
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("CREATE TABLE IF NOT EXISTS other_app (k INTEGER PRIMARY KEY)")
conn.execute("BEGIN EXCLUSIVE")
conn.execute("INSERT INTO other_app VALUES (1)")
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@contextmanager
def other_processes(script: str, *args: str, count: int = 1) -> Iterator[None]:
    """``count`` processes running ``script``, each past its first printed line."""
    processes = [
        subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline()
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()


async def created(path: Path) -> None:
    async with siglo.connect(f"sqlite:///{path}") as backend:
        await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))


@pytest.mark.parametrize("wait_ms", [0, 10_000])
async def test_setting_up_an_inline_connection_waits_for_other_processes_opening(
    tmp_path: Path, wait_ms: int
) -> None:
    """With no wait (how the inline connections were set up before) some set-ups fail
    while other processes open the file; with the connect's wait, none does."""
    path = tmp_path / "busy.db"
    await created(path)  # and closed: this process has no connection to the file
    errors: list[str] = []
    with other_processes(OPENER, str(path), count=3):
        for attempt in range(300):
            opener = open_reader if attempt % 2 else open_writer
            args = () if opener is open_reader else ("NORMAL",)
            try:
                opener(str(path), wait_ms, *args).close()
            except sqlite3.OperationalError as exc:
                errors.append(str(exc))
    if wait_ms:
        assert errors == []
    else:
        assert errors, "the control: the lock was never met"
        assert set(errors) == {"database is locked"}


async def test_connecting_waits_for_a_lock_another_process_holds(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    hold_s = 0.4
    with other_processes(HOLDER, str(path), str(hold_s)):
        began = time.monotonic()
        async with siglo.connect(f"sqlite:///{path}") as backend:
            await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
            stored = await backend.adapter.get_checkpoint("s")
        waited = time.monotonic() - began
    assert stored is not None
    assert stored.revision == 1
    assert waited >= hold_s * 0.5  # it met the lock and waited it out


async def test_a_lock_held_past_the_bound_is_a_timeout_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with other_processes(HOLDER, str(path), "10"):
        backend = siglo.connect(f"sqlite:///{path}", command_timeout_ms=300)
        try:
            began = time.monotonic()
            with pytest.raises(StorageAdapterError, match=r"timed out.*command_timeout_ms=300"):
                await backend.adapter.get_checkpoint("s")
            assert time.monotonic() - began < 5.0  # the bound, not the holder's 10 s
        finally:
            await backend.aclose()
