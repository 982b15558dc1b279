"""What the benchmark ran on, for the report."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sqlite3
import subprocess
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
