"""A step reaches the storage of whoever runs it (issue 31, item 12): ``siglo.current_manager()``
and ``siglo.current_backend()`` inside a step, in the application and in ``siglo worker``
alike; and flows run from synchronous code through ``siglo.sync.SyncFlow``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Step, sync
from siglo.redaction import REDACTED

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"


async def test_a_step_gets_the_manager_and_backend_running_it() -> None:
    seen: list[Any] = []

    async def look(order: int) -> int:
        seen.append((siglo.current_manager(), siglo.current_backend()))
        store = siglo.current_backend().require_idempotency()
        assert await store.claim(f"charge:{order}") == "claimed"
        await store.complete(f"charge:{order}", {"ok": True})
        return order

    looking = siglo.flow(Step.create("look", look), name="look")
    async with siglo.connect("sqlite://") as backend:
        manager = siglo.StorageManager(backend)
        assert manager.backend is backend
        assert await looking.run(7, manager=manager, stack_id="look-1") == 7
        assert seen == [(manager, backend)]
        assert await backend.require_idempotency().get_result("charge:7") == {"ok": True}


async def test_outside_a_step_or_without_a_backend_the_error_says_why() -> None:
    with pytest.raises(siglo.InvalidArgumentError, match=r"current_backend\(\).*inside a step"):
        siglo.current_backend()
    with pytest.raises(siglo.InvalidArgumentError, match=r"current_manager\(\).*inside a step"):
        siglo.current_manager()

    async def look(_: Any) -> None:
        siglo.current_backend()

    looking = siglo.flow(Step.create("look", look), name="bare")
    async with siglo.connect("sqlite://") as backend:
        manager = siglo.StorageManager(backend.adapter)  # a bare adapter
        assert manager.backend is None
        with pytest.raises(siglo.InvalidArgumentError, match="bare storage adapter"):
            await looking.run(None, manager=manager, stack_id="bare-1")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_step_run_by_siglo_worker_uses_the_workers_backend(
    kind: str, tmp_path: Path
) -> None:
    """The timer fires in ``siglo worker``: the step claims an idempotency key through
    ``current_backend()``, which is the worker's — with the application's settings, so
    the card number in the result is stored redacted."""
    marks = tmp_path / "marks"
    os.environ["SIGLO_TEST_MARKS"] = str(marks)
    try:
        from supervised_flows import payments

        async with shared_store(kind) as backend:
            (tmp_path / "siglo.toml").write_text(
                f'url = "{backend.url}"\nredact_fields = ["card"]\n'
            )
            manager = siglo.StorageManager(backend, settings=siglo.Settings())
            with pytest.raises(siglo.WorkflowSuspended):
                await payments.run("o-1", manager=manager, stack_id="pay-1")
            await asyncio.sleep(0.05)  # past the sleep's deadline
            env = {k: v for k, v in os.environ.items() if not k.startswith("SIGLO_")}
            paths = [str(SUPPORT), str(ROOT), str(ROOT / "backends"), str(ROOT / "contract_tests")]
            env.update(PYTHONPATH=os.pathsep.join(paths), SIGLO_TEST_MARKS=str(marks))
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "siglo", "worker", "--flows", "supervised_flows:payments",
                 "--once"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert "fired 1 timer(s)" in done.stdout, done.stdout + done.stderr
            assert marks.read_text().splitlines() == ["charged o-1"]
            result = await backend.require_idempotency().get_result("charge:o-1")
            assert result == {"card": REDACTED, "order": "o-1"}
            stored = await backend.adapter.get_checkpoint("pay-1")
            assert stored is not None and stored.status == "completed"
    finally:
        del os.environ["SIGLO_TEST_MARKS"]


async def _approve(order: dict[str, Any]) -> dict[str, Any]:
    approval = await siglo.wait_for_event(f"approve:{order['id']}")
    return {**order, "approved_by": approval["by"]}


async def _ship(order: dict[str, Any]) -> str:
    return f"order {order['id']} shipped, approved by {order['approved_by']}"


ORDERS = siglo.flow(Step.create("approve", _approve), Step.create("ship", _ship), name="orders")


def test_a_flow_runs_from_synchronous_code(tmp_path: Path) -> None:
    orders = sync.SyncFlow(ORDERS)
    assert orders.name == "orders"
    with sync.connect(f"sqlite:///{tmp_path / 'sync.db'}") as backend:
        manager = sync.StorageManager(backend)
        with pytest.raises(siglo.WorkflowSuspended) as waiting:
            orders.run({"id": 3}, manager=manager, stack_id="order-3")
        assert waiting.value.correlation_key == "approve:3"
        assert orders.deliver("approve:3", {"by": "ada"}, manager=manager) == (
            "order 3 shipped, approved by ada"
        )
        # Run-or-continue, as in async code: the stored run's output.
        assert orders.run({"id": 99}, manager=manager, stack_id="order-3") == (
            "order 3 shipped, approved by ada"
        )
        assert orders.resume("order-3", manager=manager) == "order 3 shipped, approved by ada"
        assert orders.recover("order-3", manager=manager) is False  # not `running`
        stored = manager.load_checkpoint("order-3")
        assert stored is not None and stored.status == "completed"


def test_sync_flow_checks_its_arguments() -> None:
    with pytest.raises(siglo.InvalidArgumentError, match=r"SyncFlow takes a siglo\.Flow"):
        sync.SyncFlow(_ship)  # type: ignore[arg-type]
    with pytest.raises(siglo.InvalidArgumentError, match="manager must be"):
        sync.SyncFlow(ORDERS).run(None, manager="nope")  # type: ignore[arg-type]


_CRASHING_CHARGE = """
import asyncio, os, sys
import siglo
from siglo import Step

async def charge(order):
    payments = siglo.current_backend().require_idempotency()
    key = f"charge:{order['id']}"
    claim = await payments.claim_owned(key, 1_000)  # docs/workflows.md's step, a 1 s lease
    while claim.state == "in-progress":
        await asyncio.sleep(0.1)
        claim = await payments.claim_owned(key, 1_000)
    if claim.claimed:
        with open(os.environ["CHARGES"], "a") as log:
            log.write(key + "\\n")
        if os.environ.get("CRASH"):
            os._exit(9)  # charged, then died before complete
        await payments.complete(key, {"charged": order["cents"]}, token=claim.token)
    return f"charged order {order['id']}"

billing = siglo.flow(Step.create("charge", charge), name="billing")

async def main():
    async with siglo.connect(sys.argv[1]) as backend:
        manager = siglo.StorageManager(backend)
        print(await billing.run({"id": 9, "cents": 1200}, manager=manager, stack_id="bill-9"))

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_the_docs_charge_step_is_not_lost_by_a_crash_between_claim_and_complete(
    tmp_path: Path,
) -> None:
    """docs/workflows.md's charge step, killed after its claim and its charge but before
    ``complete``: the recovered run waits for the claim's lease, charges again under the
    same key (which the provider dedups), and stores the result — before, the seed's
    ``claim`` left the key "in-progress" for 24 h and the rerun took it for done."""
    script = tmp_path / "billing_step.py"
    script.write_text(_CRASHING_CHARGE, encoding="utf-8")
    charges = tmp_path / "charges.log"
    url = f"sqlite:///{tmp_path / 'bill.db'}?workflow_lock_ttl_ms=500"
    env = {**os.environ, "CHARGES": str(charges), "CRASH": "1"}
    crashed = subprocess.run(
        [sys.executable, str(script), url], env=env, capture_output=True, timeout=120
    )
    assert crashed.returncode == 9, crashed.stderr.decode()

    sys.path.insert(0, str(tmp_path))
    try:
        from billing_step import billing  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))

    async def recover() -> Any:
        os.environ["CHARGES"] = str(charges)
        try:
            async with siglo.connect(url) as backend:
                manager = siglo.StorageManager(backend)
                for _ in range(100):  # until the crashed run's workflow lock lapses
                    try:
                        if await billing.recover("bill-9", manager=manager):
                            break
                    except siglo.LockNotAcquiredError:
                        pass
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the crashed run was never recovered")
                return await backend.require_idempotency().get_result("charge:9")
        finally:
            del os.environ["CHARGES"]

    assert asyncio.run(recover()) == {"charged": 1200}
    assert charges.read_text().splitlines() == ["charge:9", "charge:9"]
