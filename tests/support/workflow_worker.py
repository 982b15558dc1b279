"""A worker process for tests/workflows/test_workflow_processes.py: runs a flow on a
shared store."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import siglo
from siglo import Step, flow, wait_for_event


def make_flow(log_path: str) -> siglo.Flow:
    def log(line: str) -> None:
        with open(log_path, "a") as f:
            f.write(line + "\n")

    async def reserve(order: dict[str, Any]) -> dict[str, Any]:
        log(f"reserve {os.getpid()}")
        return {**order, "reserved": True}

    async def charge(order: dict[str, Any]) -> dict[str, Any]:
        log(f"charge {os.getpid()}")
        if os.environ.get("SIGLO_TEST_CRASH_IN_CHARGE") == "1":
            os._exit(17)  # the worker dies mid-step: no clean-up, no checkpoint
        approval = await wait_for_event(f"approve:{order['id']}")
        return {**order, "charged": True, "approved_by": approval["by"]}

    async def ship(order: dict[str, Any]) -> str:
        log(f"ship {os.getpid()}")
        return f"order {order['id']} shipped, approved by {order['approved_by']}"

    return flow(
        Step.create("reserve", reserve),
        Step.create("charge", charge),
        Step.create("ship", ship),
        name="orders",
    )


async def main(url: str, log_path: str, command: str) -> None:
    async with siglo.connect(url) as backend:
        manager = siglo.StorageManager(backend, error_mode="strict")
        orders = make_flow(log_path)
        if command == "run":
            try:
                await orders.run({"id": 1}, manager=manager, stack_id="order-1")
            except siglo.WorkflowSuspended as waiting:
                print(f"suspended {waiting.correlation_key}")
        elif command == "deliver":
            print(await orders.deliver("approve:1", {"by": "ada"}, manager=manager))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
