"""Flows that ``siglo worker`` runs in tests/workflows/test_worker_supervision.py.

Each step appends a whole line to ``$SIGLO_TEST_MARKS`` (one ``O_APPEND`` write), so the
test counts how often each step ran, whatever the process.

- ``naps``: one step that sleeps durably for ``run_input()`` ms, then marks
  ``start <stack id>``, waits ``$SIGLO_TEST_STEP_S`` seconds (0 if unset) and marks
  ``end <stack id>``: a timer the worker fires, and a run in progress the test can
  signal in the middle of.
- ``payments``: sleeps durably, then claims an idempotency key through
  ``siglo.current_backend()`` and stores a result with a card number in it.
"""

from __future__ import annotations

import asyncio
import os

import siglo
from siglo import Step, flow
from siglo.workflow import run_input, sleep
from siglo.workflow.step import current_step


def mark(text: str) -> None:
    fd = os.open(os.environ["SIGLO_TEST_MARKS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{text}\n".encode())
    finally:
        os.close(fd)


async def nap(_: object) -> str:
    await sleep(int(run_input()))
    stack_id = current_step.get().stack_id
    mark(f"start {stack_id}")
    await asyncio.sleep(float(os.environ.get("SIGLO_TEST_STEP_S", "0")))
    mark(f"end {stack_id}")
    return "rested"


naps = flow(Step.create("nap", nap), name="naps")


async def pay(order: str) -> str:
    """Sleeps durably, then charges through the backend of whoever runs the step (the
    worker, on the timer): an idempotency key makes the charge safe to repeat."""
    await sleep(1)
    payments = siglo.current_backend().require_idempotency()
    key = f"charge:{order}"
    if await payments.claim(key) == "claimed":
        mark(f"charged {order}")
        await payments.complete(key, {"card": "4111 1111 1111 1111", "order": order})
    return f"paid {order}"


payments = flow(Step.create("pay", pay), name="payments")
