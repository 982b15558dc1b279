"""A ``siglo`` command stopped by a real signal while it waits on a server behind a frozen
proxy (tests/support/_tcp_proxy.py): what it said and how it ended."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _tcp_proxy import TcpProxy

__all__ = ["stopped_while_waiting"]

_ROOT = Path(__file__).resolve().parents[2]
_THIS_CHECKOUT = os.pathsep.join(str(_ROOT / d) for d in (".", "backends", "contract_tests"))
"""This checkout's sources first: the command run is the code under test, whatever the
installed siglo is."""


async def stopped_while_waiting(
    args: list[str],
    proxy: TcpProxy,
    cwd: Path,
    signum: signal.Signals,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``siglo *args`` with ``proxy`` frozen, send ``signum`` once it has connected
    through it (its loop, and its handlers, in place), and return its status and stderr;
    the proxy is thawed afterwards. ``env``: variables added to this process's."""
    proxy.freeze()
    running = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "siglo", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": _THIS_CHECKOUT, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not proxy._pairs:
        assert running.poll() is None and time.monotonic() < deadline, "it never connected"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    running.send_signal(signum)
    _out, err = await asyncio.to_thread(running.communicate, timeout=60)
    proxy.thaw()
    return running.returncode, err.decode()
