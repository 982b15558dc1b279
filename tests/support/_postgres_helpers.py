"""A PostgreSQL server of a test's own, on a spare loopback port, to stop and restart.

The shared server (``SIGLO_POSTGRES_URL``) is never stopped by a test. Creating a
cluster takes seconds, so tests that need one run under ``CI=true`` or
``SIGLO_TEST_PRIVATE_POSTGRES=1`` (otherwise they are skipped with that message).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

__all__ = ["PrivatePostgres", "private_postgres_server"]


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class PrivatePostgres:
    """``initdb`` + ``pg_ctl`` on ``127.0.0.1:<port>`` in a temporary directory."""

    def __init__(self, port: int) -> None:
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            pytest.skip("no PostgreSQL server binaries here to start a private server")
        if os.geteuid() == 0 and shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        self.port = port
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.dir = tempfile.mkdtemp(prefix="siglo-pg-")
        self.data = os.path.join(self.dir, "data")
        if self._as_postgres:
            shutil.chown(self.dir, "postgres")
        subprocess.run(
            [*self._as_postgres, initdb, "-D", self.data, "-U", "postgres", "--auth=trust",
             "-E", "UTF8"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -c port={port} -k {self.dir} -c fsync=off"
        self._ctl = [*self._as_postgres, pg_ctl, "-D", self.data, "-o", options, "-w", "-l",
                     f"{self.dir}/log"]  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        subprocess.run([*self._ctl, "start"], check=True, capture_output=True)

    def stop(self) -> None:
        """An immediate stop: connections are cut, as in a crash."""
        subprocess.run([*self._ctl, "-m", "immediate", "stop"], capture_output=True)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def private_postgres_enabled() -> bool:
    return "true" in (
        os.environ.get("CI", "").lower(),
        os.environ.get("SIGLO_TEST_PRIVATE_POSTGRES", "").replace("1", "true"),
    )


@contextmanager
def private_postgres_server(port: int) -> Iterator[PrivatePostgres]:
    """A started private server, removed afterwards (skips unless enabled, see above)."""
    if not private_postgres_enabled():
        pytest.skip("set SIGLO_TEST_PRIVATE_POSTGRES=1 to stop and restart a private server")
    server = PrivatePostgres(port)
    try:
        server.start()
        yield server
    finally:
        server.remove()
