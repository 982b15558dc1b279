"""Flows the worker-process tests run in several processes
(tests/workflows/test_worker_processes.py).

Every step appends a line to ``$SIGLO_TEST_MARKS`` (one ``O_APPEND`` write, whole lines
even from several processes), so a test can count how often each step ran.

``python ops_flows.py run URL STACK_ID`` starts a ``crashy`` run; with
``SIGLO_TEST_HANG=1`` its second step hangs (for the test to SIGKILL the process).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import siglo
from siglo import Step, flow, wait_for_event
from siglo.errors import WaitTimeoutError
from siglo.workflow import run_input


def mark(text: str) -> None:
    fd = os.open(os.environ["SIGLO_TEST_MARKS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{text} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


async def one(x: int) -> int:
    mark("one")
    return x + 1


async def two(x: int) -> int:
    mark("two")
    if os.environ.get("SIGLO_TEST_HANG") == "1":
        mark("hanging")
        await asyncio.sleep(3600)
    return x * 10


async def three(x: int) -> int:
    mark("three")
    return x + 5


crashy = flow(Step.create("one", one), Step.create("two", two), Step.create("three", three))


async def wait_or_time_out(_: Any) -> str:
    key = f"pay:{run_input()}"
    try:
        return str(await wait_for_event(key, timeout_ms=400))
    except WaitTimeoutError:
        mark(f"timeout {run_input()}")
        return "late"


async def after(outcome: str) -> str:
    mark(f"after {run_input()}")
    return outcome


deadline = flow(Step.create("wait", wait_or_time_out), Step.create("after", after), name="deadline")


async def _run(url: str, stack_id: str) -> None:
    async with siglo.connect(url) as backend:
        manager = siglo.StorageManager(backend, error_mode="strict")
        print(await crashy.run(1, manager=manager, stack_id=stack_id))


if __name__ == "__main__":
    command, url, stack_id = sys.argv[1:4]
    assert command == "run"
    asyncio.run(_run(url, stack_id))
