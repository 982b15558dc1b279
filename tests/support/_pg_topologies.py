"""PostgreSQL topologies the tests start themselves: a PgBouncer in front of the shared
server, and a primary with a streaming replica of our own.

Everything listens on 127.0.0.1 only, on free ports in 30300-30399, in a temporary
directory removed afterwards. PostgreSQL and PgBouncer refuse to run as root: as root,
the processes run as the ``postgres`` user (the Debian packages create it).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from _tcp_proxy import TcpProxy
from ports import free_ports

__all__ = ["PgBouncer", "PostgresPair", "free_ports", "pg_binary"]


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: a missing binary fails the run)")
    pytest.skip(f"{message}; skipping")


def pg_binary(name: str) -> str:
    """``name`` from the newest ``/usr/lib/postgresql/*/bin`` (or ``PATH``)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=_major)
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        _unavailable(f"the PostgreSQL binary {name} is not installed")
    assert on_path is not None
    return on_path


def _major(path: str) -> int:
    part = path.split("/")[4]
    return int(part) if part.isdigit() else 0


def _as_postgres() -> dict[str, object]:
    """``subprocess`` arguments that drop root to the ``postgres`` user."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        _unavailable("running as root and there is no postgres user to run servers as")
        raise
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _own_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _wait_listening(port: int, log: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not _listening(port):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise RuntimeError(f"nothing listens on 127.0.0.1:{port}:\n{tail}")
        time.sleep(0.05)


class PgBouncer:
    """A PgBouncer on a loopback port, pooling ``mode`` in front of ``server``."""

    def __init__(
        self, port: int, *, server: tuple[str, int, str, str], mode: str = "transaction"
    ) -> None:
        self.binary = self.binary_path()
        host, server_port, dbname, user = server
        self.port = port
        self.dbname = dbname
        self.dir = _own_dir(f"siglo-pgbouncer-{port}-")
        # auth_type=any: the server's own (trust) authentication applies, as the user
        # named here. "one" is a second name for the database with a single server
        # connection, so that every client shares it.
        target = f"host={host} port={server_port} dbname={dbname} user={user}"
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"{dbname} = {target}\n"
            f"one = {target} pool_size=1\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            f"pool_mode = {mode}\n"
            "max_client_conn = 500\n"
            "default_pool_size = 8\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary_path() -> str:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.path.exists(binary):
            _unavailable("pgbouncer is not installed (apt-get install pgbouncer)")
        return binary

    def url(self, dbname: str | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname or self.dbname}"

    def start(self) -> PgBouncer:
        command = [self.binary, str(self.dir / "pgbouncer.ini")]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **_as_postgres(),  # type: ignore[call-overload]
        )
        _wait_listening(self.port, self.dir / "pgbouncer.log")
        time.sleep(0.05)
        if self.process.poll() is not None:
            # Something else listens on the port (this bouncer could not bind it): its
            # clients would talk to another test's bouncer.
            raise RuntimeError(
                f"pgbouncer on 127.0.0.1:{self.port} exited ({self.process.returncode}):\n"
                + self.log_tail()
            )
        return self

    def log_tail(self, size: int = 3000) -> str:
        """The end of the bouncer's log (why it closed a client, say)."""
        log = self.dir / "pgbouncer.log"
        return log.read_text(errors="replace")[-size:] if log.exists() else "(no log)"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresNode:
    """One ``postgres`` server of our own: a data directory and a loopback port."""

    def __init__(self, root: Path, name: str, port: int) -> None:
        self.data = root / name
        self.port = port
        self.log = root / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *settings: str) -> PostgresNode:
        command = [
            pg_binary("postgres"),
            "-D", str(self.data),
            "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1",
            "-c", "unix_socket_directories=",
            *settings,
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                **_as_postgres(),  # type: ignore[call-overload]
            )
        _wait_listening(self.port, self.log, 60)
        # Listening is not accepting: a server starting up (or replaying) refuses first.
        deadline = time.monotonic() + 60
        while subprocess.run(
            [pg_binary("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
            timeout=10,
        ).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres on {self.port} is not ready:\n{self.log}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: the server dies without a shutdown checkpoint, as on a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
            # The postmaster's children notice its death and exit; wait for the port.
            deadline = time.monotonic() + 10
            while _listening(self.port) and time.monotonic() < deadline:
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # smart shutdown
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def run(self, *command: str) -> str:
        done = subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            timeout=60,
            **_as_postgres(),  # type: ignore[call-overload]
        )
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def sql(self, statement: str) -> str:
        return self.run(
            pg_binary("psql"),
            "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres",
            "-At", "-c", statement,
        ).strip()  # fmt: skip


class PostgresPair:
    """A primary and a streaming replica (``pg_basebackup``), synchronous or not.

    The replica streams through :attr:`link`, a TCP proxy on loopback: ``link.freeze()``
    stalls replication (the standby confirms nothing more, and receives nothing more)
    without stopping a process of either server.
    """

    def __init__(self, ports: Sequence[int], *, synchronous: bool = True) -> None:
        self.root = _own_dir("siglo-pg-pair-")
        primary_port, replica_port = ports
        self.primary = PostgresNode(self.root, "primary", primary_port)
        self.replica = PostgresNode(self.root, "replica", replica_port)
        self.synchronous = synchronous
        self.link = TcpProxy(("127.0.0.1", primary_port))

    @property
    def url(self) -> str:
        """Both hosts; libpq picks the one that accepts writes."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.replica.port}"
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    def start(self) -> PostgresPair:
        primary = self.primary
        primary.run(
            pg_binary("initdb"), "-D", str(primary.data), "-U", "postgres",
            "--auth=trust", "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        with open(primary.data / "pg_hba.conf", "a") as hba:
            hba.write("host replication postgres 127.0.0.1/32 trust\n")
        settings = [
            "-c", "wal_level=replica",
            "-c", "max_wal_senders=4",
            "-c", "fsync=on",
            "-c", "synchronous_commit=on",
            "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        # Only the primary waits for a standby: the promoted replica has none.
        sync = ["-c", "synchronous_standby_names=replica"] if self.synchronous else []
        primary.start(*settings, *sync)
        primary.run(
            pg_binary("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-D", str(self.replica.data), "-R", "-X", "stream",
            "--no-sync",
        )  # fmt: skip
        self.replica.start(
            *settings,
            "-c",
            "cluster_name=replica",
            "-c",
            "primary_conninfo="
            f"host=127.0.0.1 port={self.link.port} user=postgres application_name=replica",
        )
        deadline = time.monotonic() + 30
        wanted = "sync" if self.synchronous else "async"
        while primary.sql("SELECT sync_state FROM pg_stat_replication") != wanted:
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not start streaming")
            time.sleep(0.1)
        return self

    def promote(self) -> None:
        """Promote the replica and wait until it accepts writes."""
        self.replica.run(pg_binary("pg_ctl"), "promote", "-w", "-D", str(self.replica.data))

    def stop(self) -> None:
        self.link.restore()
        with contextlib.suppress(Exception):
            self.replica.stop()
        with contextlib.suppress(Exception):
            self.primary.stop()
        self.link.close()
        shutil.rmtree(self.root, ignore_errors=True)
