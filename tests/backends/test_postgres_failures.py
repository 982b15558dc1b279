"""PostgreSQL failures: wrapped in StorageAdapterError (original as __cause__), bounded
in time, obeying the storage manager's error mode; recovery after a server restart.

The private server of the last test runs on 127.0.0.1:30150 from the binaries in
/usr/lib/postgresql/*/bin (as the ``postgres`` user), and is stopped afterwards.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

import siglo
from siglo import Checkpoint, StorageManager

CLOSED_PORT = 30199
SILENT_PORT = 30198
PRIVATE_PORT = 30150


def quick(url: str) -> siglo.Backend:
    return siglo.connect(url, connect_timeout_ms=1000, pool_timeout_ms=1500)


async def test_closed_port_is_wrapped_and_quick() -> None:
    backend = quick(f"postgresql://postgres@127.0.0.1:{CLOSED_PORT}/test")
    began = time.monotonic()
    with pytest.raises(siglo.StorageAdapterError) as info:
        await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
    assert time.monotonic() - began < 5
    assert info.value.__cause__ is not None
    assert "127.0.0.1:30199" in str(info.value)
    # Every operation fails the same way, and closing is still fine.
    assert backend.lock is not None
    with pytest.raises(siglo.StorageAdapterError):
        await backend.lock.acquire("k")
    await backend.aclose()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A server that accepts connections and never answers."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", SILENT_PORT))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield SILENT_PORT
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


async def test_silent_server_times_out(silent_server: int) -> None:
    backend = quick(f"postgresql://postgres@127.0.0.1:{silent_server}/test")
    began = time.monotonic()
    with pytest.raises(siglo.StorageAdapterError) as info:
        await backend.adapter.get_checkpoint("s")
    assert time.monotonic() - began < 6
    assert info.value.__cause__ is not None
    await backend.aclose()


async def test_error_modes_of_the_manager() -> None:
    """manager.error-mode: an unreachable database is raised in strict mode only."""
    url = f"postgresql://postgres@127.0.0.1:{CLOSED_PORT}/test"
    for mode in ("best-effort", "strict"):
        backend = quick(url)
        manager = StorageManager(backend, error_mode=mode)
        manager.create_stack("s")
        if mode == "strict":
            with pytest.raises(siglo.StorageAdapterError) as info:
                await manager.save_checkpoint("s")
            assert info.value.__cause__ is not None
        else:
            await manager.save_checkpoint("s")
        await backend.aclose()


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else None


@pytest.fixture
def private_postgres() -> Iterator[tuple[str, str]]:
    """A PostgreSQL server of our own on 127.0.0.1:30150 (so that we can stop it).

    Creating a cluster takes seconds: it runs under CI=true or SIGLO_TEST_PRIVATE_POSTGRES=1.
    """
    if "true" not in (
        os.environ.get("CI", "").lower(),
        os.environ.get("SIGLO_TEST_PRIVATE_POSTGRES", "").replace("1", "true"),
    ):
        pytest.skip("set SIGLO_TEST_PRIVATE_POSTGRES=1 to stop and restart a private server")
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None or shutil.which("runuser") is None:
        pytest.skip("no PostgreSQL server binaries here to start a private server")
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    directory = tempfile.mkdtemp(prefix="siglo-pg-")
    data = os.path.join(directory, "data")
    if as_postgres:
        shutil.chown(directory, "postgres")
    subprocess.run(
        [*as_postgres, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    options = f"-c listen_addresses=127.0.0.1 -c port={PRIVATE_PORT} -k {directory} -c fsync=off"
    ctl = [*as_postgres, pg_ctl, "-D", data, "-o", options, "-w", "-l", f"{directory}/log"]
    subprocess.run([*ctl, "start"], check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{PRIVATE_PORT}/postgres", directory
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)


async def test_server_stopped_and_restarted(private_postgres: tuple[str, str]) -> None:
    url, directory = private_postgres
    data = os.path.join(directory, "data")
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    options = f"-c listen_addresses=127.0.0.1 -c port={PRIVATE_PORT} -k {directory} -c fsync=off"
    ctl = [*as_postgres, str(_pg_bin("pg_ctl")), "-D", data, "-o", options, "-w", "-l",
           f"{directory}/log"]  # fmt: skip
    backend = quick(url)
    a = backend.adapter
    await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))

    await asyncio.to_thread(subprocess.run, [*ctl, "-m", "immediate", "stop"], check=True,
                            capture_output=True)  # fmt: skip
    began = time.monotonic()
    with pytest.raises(siglo.StorageAdapterError) as info:
        await a.get_checkpoint("s")
    assert info.value.__cause__ is not None
    assert time.monotonic() - began < 6

    await asyncio.to_thread(subprocess.run, [*ctl, "start"], check=True, capture_output=True)
    # The pool replaces broken connections: within a few tries the data is back.
    for _ in range(20):
        try:
            got = await a.get_checkpoint("s")
            break
        except siglo.StorageAdapterError:
            await asyncio.sleep(0.1)
    else:
        pytest.fail("the backend did not recover after the server came back")
    assert got is not None
    assert got.revision == 1
    await backend.aclose()
