"""Every command that works on a store, stopped by Ctrl-C, SIGTERM or SIGHUP, says it was
interrupted and what to do, and exits with 128 + the signal's number — as export, import,
rekey and erase do (the others ended with click's bare "Aborted!" and status 1, or
silently on SIGTERM). Each command here waits on a Redis server behind a frozen proxy
when the signal comes: a real process, a real signal."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _redis_helpers import REDIS_URL, require_redis
from _tcp_proxy import proxied_url

from siglo_redis import isolated

COMMANDS = {
    "ls": ["ls", "{url}"],
    "show": ["show", "{url}", "run-1"],
    "rm": ["rm", "{url}", "run-1"],
    "clean": ["clean", "{url}"],
}


@pytest.mark.parametrize(
    ("command", "stop"),
    [(name, "SIGTERM") for name in COMMANDS] + [("ls", "SIGINT"), ("clean", "SIGHUP")],
)
async def test_a_stopped_command_says_it_was_interrupted(
    tmp_path: Path, command: str, stop: str
) -> None:
    require_redis()
    signum = signal.Signals[stop]
    async with isolated(REDIS_URL) as store:
        with proxied_url(store.url, 6379) as (url, proxy):
            proxy.freeze()
            args = [a.format(url=url) for a in COMMANDS[command]]
            running = await asyncio.to_thread(
                subprocess.Popen,
                [sys.executable, "-m", "siglo", *args],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            deadline = time.monotonic() + 60
            while not proxy._pairs:  # connected: its handlers are in place
                assert running.poll() is None and time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            running.send_signal(signum)
            _out, err = await asyncio.to_thread(running.communicate, timeout=60)
            proxy.thaw()
    said = err.decode()
    assert running.returncode == 128 + signum, (running.returncode, said)
    assert f"siglo {command} was interrupted ({stop})" in said, said
    assert "run it again" in said, said
