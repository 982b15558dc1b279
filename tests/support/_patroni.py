"""A Patroni cluster the tests start themselves: one etcd and two Patroni nodes, each
running a PostgreSQL of its own, with Patroni's ``synchronous_mode`` on.

Everything listens on 127.0.0.1 only (ports given by the caller), in a temporary
directory removed afterwards. Patroni and PostgreSQL run as the ``postgres`` user when
the tests run as root (as :mod:`_pg_topologies` does). The Debian packages ``patroni``
and ``etcd-server`` provide the binaries.

The leader's failure is a node's death: its Patroni and its postmaster are killed with
SIGKILL (killing Patroni alone would leave its PostgreSQL running as a primary nobody
manages). The other node takes the leader key once its TTL lapses and promotes its
PostgreSQL. A switchover goes through the leader's REST API.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path

from _pg_topologies import _as_postgres, _own_dir, _unavailable, _wait_listening, pg_binary

__all__ = ["PatroniCluster"]

TTL_S = 10
"""The leader key's TTL: a dead leader is replaced within about this long."""


class _Node:
    def __init__(self, root: Path, name: str, pg_port: int, api_port: int) -> None:
        self.name = name
        self.pg_port = pg_port
        self.api_port = api_port
        self.config = root / f"{name}.yml"
        self.data = root / name
        self.log = root / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def api(self, path: str, body: dict[str, object] | None = None) -> tuple[int, str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method="GET" if body is None else "POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError as error:
            return 0, str(error)

    def role(self) -> str | None:
        status, text = self.api("/patroni")
        if status == 0:
            return None
        with contextlib.suppress(ValueError):
            return str(json.loads(text).get("role"))
        return None

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None


class PatroniCluster:
    """etcd plus two Patroni nodes (``n0`` and ``n1``) in synchronous mode."""

    def __init__(self, ports: Sequence[int]) -> None:
        for binary in ("patroni", "etcd"):
            if shutil.which(binary) is None:
                _unavailable(f"{binary} is not installed (apt-get install patroni etcd-server)")
        etcd_client, etcd_peer, pg0, api0, pg1, api1 = ports
        self.root = _own_dir("siglo-patroni-")
        self.etcd_client = etcd_client
        self.etcd_peer = etcd_peer
        self.etcd: subprocess.Popen[bytes] | None = None
        self.scope = f"siglo-{uuid.uuid4().hex[:8]}"
        self.nodes = [_Node(self.root, "n0", pg0, api0), _Node(self.root, "n1", pg1, api1)]

    @property
    def url(self) -> str:
        """Both nodes; libpq keeps the one that accepts writes (the leader)."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    def _write_config(self, node: _Node) -> None:
        bin_dir = str(Path(pg_binary("postgres")).parent)
        hba = [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        config = {
            "scope": self.scope,
            "namespace": "/siglo-tests/",
            "name": node.name,
            "log": {"level": "WARNING"},
            "restapi": {
                "listen": f"127.0.0.1:{node.api_port}",
                "connect_address": f"127.0.0.1:{node.api_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_client}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": 1,
                    "retry_timeout": 3,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": False,
                        "parameters": {
                            "wal_level": "replica",
                            "max_wal_senders": 5,
                            "max_replication_slots": 5,
                            "synchronous_commit": "on",
                            "shared_buffers": "32MB",
                            "fsync": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, {"username": "postgres"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": bin_dir,
                "pgpass": str(self.root / f"{node.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.root)},
                "pg_hba": hba,
            },
        }
        # JSON is YAML: no YAML library needed.
        node.config.write_text(json.dumps(config, indent=2))

    def start(self) -> PatroniCluster:
        etcd_dir = self.root / "etcd"
        log = self.root / "etcd.log"
        with open(log, "ab") as out:
            self.etcd = subprocess.Popen(
                [
                    "etcd",
                    "--name", "e0",
                    "--data-dir", str(etcd_dir),
                    "--listen-client-urls", f"http://127.0.0.1:{self.etcd_client}",
                    "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_client}",
                    "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
                    "--initial-cluster", f"e0=http://127.0.0.1:{self.etcd_peer}",
                    "--listen-metrics-urls", "",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                **_as_postgres(),  # type: ignore[call-overload]
            )  # fmt: skip
        _wait_listening(self.etcd_client, log)
        for node in self.nodes:
            self._write_config(node)
            self._start_node(node)
            if node is self.nodes[0]:
                self.wait_for(lambda: self.leader() is self.nodes[0], 90, "n0 did not bootstrap")
        self.wait_for(self.has_sync_standby, 90, "no synchronous standby")
        return self

    def _start_node(self, node: _Node) -> None:
        with open(node.log, "ab") as out:
            node.process = subprocess.Popen(
                ["patroni", str(node.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PATRONI_LOG_LEVEL": "WARNING"},
                **_as_postgres(),  # type: ignore[call-overload]
            )
        _wait_listening(node.api_port, node.log, 60)

    def wait_for(self, condition: object, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                    for p in sorted(self.root.glob("*.log"))
                )
                raise RuntimeError(f"{what}:\n{logs}")
            time.sleep(0.2)

    def leader(self) -> _Node | None:
        for node in self.nodes:
            if node.role() in ("master", "primary"):
                return node
        return None

    def replica(self) -> _Node:
        leader = self.leader()
        return next(n for n in self.nodes if n is not leader)

    def has_sync_standby(self) -> bool:
        status, text = self.nodes[0].api("/cluster")
        if status != 200:
            status, text = self.nodes[1].api("/cluster")
        if status != 200:
            return False
        members = json.loads(text).get("members", [])
        return any(
            m.get("role") == "sync_standby" and m.get("state") in ("running", "streaming")
            for m in members
        )

    def kill_leader(self) -> _Node:
        """The leader node dies: its Patroni and its PostgreSQL, SIGKILL."""
        leader = self.leader()
        assert leader is not None, "no leader to kill"
        pid = leader.postmaster_pid()
        assert leader.process is not None
        leader.process.kill()
        leader.process.wait(10)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid is not None and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        return leader

    def switchover(self) -> _Node:
        """A planned switchover to the synchronous standby; the new leader."""
        leader = self.leader()
        assert leader is not None
        candidate = next(n for n in self.nodes if n is not leader)
        status, text = leader.api(
            "/switchover", {"leader": leader.name, "candidate": candidate.name}
        )
        assert status == 200, (status, text)
        self.wait_for(lambda: self.leader() is candidate, 60, "the switchover did not finish")
        return candidate

    def stop(self) -> None:
        for node in self.nodes:
            pid = node.postmaster_pid()
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()  # Patroni stops its PostgreSQL
                try:
                    node.process.wait(30)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(5)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)
