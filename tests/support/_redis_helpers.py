"""Helpers shared by the Redis tests (the fixtures on the shared server are in
tests/backends/conftest.py).

``SIGLO_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) is the shared server; every
test works under its own random key prefix and deletes it afterwards. Servers a test
must own (one to kill, a 3-master cluster) are started from the installed binaries on
loopback ports 30000-30099 and stopped afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")


BUSY_LUA = (
    "local t = redis.call('TIME') local u = t[1] * 1e6 + t[2] "
    "repeat local n = redis.call('TIME') until n[1] * 1e6 + n[2] - u > 300000 return 1"
)
"""A script that keeps the server, and the connection it came on, busy for 0.3 s: the
calls asked meanwhile on the connection wait in its auto-pipeline's queue."""


class CancelWhenQueued(list[Any]):
    """An auto-pipeline's queue (``client._pipeline_of()._queue``) that cancels ``task``
    as a command naming ``key`` joins it: a caller's deadline landing while that command
    waits for the next write of the connection, never written."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.task: Any = None

    def append(self, entry: Any) -> None:
        super().append(entry)
        if self.task is not None and self.key in entry.args:
            self.task.cancel()
            self.task = None


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: a missing backend fails the run)")
    pytest.skip(f"{message}; skipping")


def require_redis(url: str = REDIS_URL) -> None:
    """Skip (fail under CI=true) with a plain message when Redis is unreachable."""
    try:
        import redis
    except ImportError:
        _unavailable("the redis driver is not installed (pip install 'siglo[redis]>=0.1,<1')")

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        client.ping()
    except Exception as exc:
        _unavailable(f"Redis at {url} is unreachable ({exc})")
    finally:
        client.close()


class RedisServer:
    """A redis-server of our own on a loopback port (killed, paused, restarted by tests)."""

    def __init__(self, port: int, *extra: str) -> None:
        if shutil.which("redis-server") is None:
            _unavailable("redis-server binary not found: cannot start a private Redis")
        self.port = port
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix=f"siglo-redis-{port}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
                "--logfile", str(self.dir / "redis.log"),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.02)
        log = self.dir / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise RuntimeError(f"redis-server on port {self.port} did not start:\n{tail}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def halt(self) -> None:
        """Stop the server (SIGTERM, as a restart does) and keep its directory: with
        ``--appendonly yes`` a later :meth:`start` on the same port has the data back."""
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_cluster(
    ports: list[int],
    bus_ports: list[int],
    replicas: int = 0,
    announce_ports: list[int] | None = None,
) -> Iterator[list[RedisServer]]:
    """Cluster-enabled servers joined by ``redis-cli --cluster create``: three masters,
    or with ``replicas=1`` three masters and three replicas (six ports).

    The cluster bus ports are given too, so nothing listens outside our port range.
    With ``announce_ports``, each node tells clients and replicas that it is at its
    announced port (a proxy's, say) instead of its own.
    """
    announced = [
        (
            "--cluster-announce-ip", "127.0.0.1",
            "--cluster-announce-port", str(port),
            "--cluster-announce-bus-port", str(bus),
        )
        for port, bus in zip(announce_ports or (), bus_ports, strict=False)
    ] or [()] * len(ports)  # fmt: skip
    if shutil.which("redis-cli") is None:
        _unavailable("redis-cli binary not found: cannot create a Redis Cluster")
    servers = [
        RedisServer(
            port,
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", "2000",
            "--cluster-port", str(bus),
            *announce,
        )
        for port, bus, announce in zip(ports, bus_ports, announced, strict=True)
    ]  # fmt: skip
    try:
        for server in servers:
            server.start()
        subprocess.run(
            [
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas", str(replicas), "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            states = [
                subprocess.run(
                    ["redis-cli", "-p", str(p), "cluster", "info"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                for p in ports
            ]
            if all("cluster_state:ok" in s for s in states):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster did not become ready: {states}")
            time.sleep(0.1)
        yield servers
    finally:
        for server in servers:
            server.stop()


class RedisSentinel:
    """A ``redis-server --sentinel`` of our own watching ``service`` on a loopback port."""

    def __init__(self, port: int, service: str, master_port: int, quorum: int = 2) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix=f"siglo-sentinel-{port}-"))
        # A fast failover for tests: down after 1 s, a new attempt after 3 s.
        (self.dir / "sentinel.conf").write_text(
            f"port {port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.dir}\n"
            f"logfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {service} 127.0.0.1 {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} 1000\n"
            f"sentinel failover-timeout {service} 3000\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisSentinel:
        self.process = subprocess.Popen(
            ["redis-server", str(self.dir / "sentinel.conf"), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.dir / "sentinel.log")
        return self

    def ask(self, *command: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(self.port), *command],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for_port(port: int, log: Path, seconds: float = 10) -> None:
    """Until something listens on loopback ``port``; the log's tail in the error if not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}:\n{tail}")


def redis_cli(port: int, *command: str) -> str:
    """One ``redis-cli`` command against a loopback port (its stdout)."""
    return subprocess.run(
        ["redis-cli", "-p", str(port), *command], capture_output=True, text=True, timeout=10
    ).stdout


def wait_for_replica_links(ports: list[int], replicas: int | None = None) -> None:
    """Until every replica among the servers on ``ports`` is linked to its master (and,
    with ``replicas``, that many of them are replicas), at most 30 s."""
    deadline = time.monotonic() + 30
    while True:
        infos = [redis_cli(port, "info", "replication") for port in ports]
        linked = [i for i in infos if "role:slave" in i and "master_link_status:up" in i]
        if len(linked) == sum("role:slave" in i for i in infos) and (
            replicas is None or len(linked) == replicas
        ):
            return
        assert time.monotonic() < deadline, f"replicas not linked: {infos}"
        time.sleep(0.05)


class SentinelGroup:
    """1 master, ``replicas`` replicas and 3 Sentinels on loopback ports, for
    ``service`` (``ports``: the master's, the replicas', the Sentinels')."""

    service = "siglo"

    def __init__(self, ports: list[int], replicas: int = 1) -> None:
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            _unavailable("redis-server / redis-cli not found: cannot start Redis Sentinel")
        master, *rest = ports
        self.master = RedisServer(master)
        self.replicas = [
            RedisServer(port, "--replicaof", "127.0.0.1", str(master)) for port in rest[:replicas]
        ]
        self.replica = self.replicas[0]
        self.sentinels = [RedisSentinel(p, self.service, master) for p in rest[replicas:]]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def log_tails(self, lines: int = 40) -> str:
        """The last ``lines`` of each Sentinel's log: what it saw, for a failure message."""
        tails = []
        for sentinel in self.sentinels:
            log = sentinel.dir / "sentinel.log"
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            tails.append(f"--- sentinel {sentinel.port}\n" + "\n".join(text[-lines:]))
        return "\n".join(tails)

    def master_port(self) -> int | None:
        """The master's port as the first Sentinel names it now."""
        reply = self.sentinels[0].ask("sentinel", "get-master-addr-by-name", self.service)
        lines = reply.split()
        return int(lines[1]) if len(lines) == 2 else None

    def start(self) -> SentinelGroup:
        self.master.start()
        for replica in self.replicas:
            replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        deadline = time.monotonic() + 30
        while True:
            links = [redis_cli(r.port, "info", "replication") for r in self.replicas]
            views = [s.ask("sentinel", "master", self.service) for s in self.sentinels]
            if all("master_link_status:up" in link for link in links) and all(
                _field(v, "num-slaves") == str(len(self.replicas))
                and _field(v, "num-other-sentinels") == "2"
                for v in views
            ):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"Sentinel group not ready: {links} {views}")
            time.sleep(0.1)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for replica in self.replicas:
            replica.stop()
        self.master.stop()


def _field(reply: str, name: str) -> str | None:
    """A field of ``SENTINEL MASTER``'s flat name/value reply."""
    lines = reply.split("\n")
    for i, line in enumerate(lines[:-1]):
        if line.strip() == name:
            return lines[i + 1].strip()
    return None
