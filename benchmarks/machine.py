"""What the benchmark ran on, for the report."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sqlite3
import subprocess
from collections.abc import Sequence
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=os.path.dirname(__file__),
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_times() -> tuple[int, int] | None:
    """``(steal, total)``: the clock ticks of all CPUs since boot, from ``/proc/stat``;
    ``None`` where there is no such file.

    *Steal* is time a CPU of this virtual machine was ready to run and the hypervisor ran
    another guest instead: the part of a shared machine's noise that can be measured from
    inside. ``total`` is every state's ticks (user, nice, system, idle, iowait, irq,
    softirq, steal; guest time is already counted in user and nice).
    """
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]
    return ticks[7], sum(ticks)


def steal_share(start: Sequence[int] | None, end: Sequence[int] | None) -> float | None:
    """The share of the machine's CPU time stolen between two :func:`cpu_times` (or
    their JSON lists)."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def describe() -> dict[str, Any]:
    """CPU, cores, memory, OS, Python and driver versions."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _mem_gb(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "siglo_commit": _git_commit(),
        "packages": {
            d: _version(d)
            for d in (
                "siglo",
                "orjson",
                "redis",
                "hiredis",
                "psycopg",
                "psycopg-pool",
                "aiosqlite",
                "sqlalchemy",
                "langgraph-checkpoint-sqlite",
                "langgraph-checkpoint-postgres",
            )
        },
        "servers": {},
    }
