"""Tenant B's run is never held up by tenant A's run with the same stack id (issue 31,
defect 9): the workflow lock's key holds the namespace, on every backend. Before, B's
``Flow.run`` waited for A's lock until ``workflow_lock_timeout_ms`` and failed."""

from __future__ import annotations

import asyncio
import time

import pytest
from raw_storage import KINDS, any_backend

from siglo import Step, StorageManager, flow
from siglo.errors import CheckpointConflictError, LockNotAcquiredError
from siglo.locking import workflow_lock_key


@pytest.mark.rule("lock.workflow.namespaced")
@pytest.mark.parametrize("kind", KINDS)
async def test_tenant_b_runs_while_tenant_a_holds_the_same_stack_id(kind: str) -> None:
    async with any_backend(kind, workflow_lock_timeout_ms=1_500) as backend:
        # One manager per request, as docs/sync.md says; both on the same storage.
        manager = StorageManager(backend, error_mode="strict")
        other = StorageManager(backend, error_mode="strict")
        a_entered = asyncio.Event()
        a_may_finish = asyncio.Event()

        async def work(tenant: str) -> str:
            if tenant == "a":
                a_entered.set()
                await a_may_finish.wait()
            return f"done for {tenant}"

        orders = flow(Step.create("work", work))
        run_a = asyncio.create_task(
            orders.run("a", manager=manager, stack_id="order-1", namespace="tenant-a")
        )
        try:
            await asyncio.wait_for(a_entered.wait(), 10)
            started = time.monotonic()
            result = await orders.run("b", manager=other, stack_id="order-1", namespace="tenant-b")
            assert result == "done for b"
            assert time.monotonic() - started < 1.0, "tenant B waited for tenant A's lock"
            # The same run of tenant A is still exclusive.
            with pytest.raises(LockNotAcquiredError):
                await orders.recover("order-1", manager=other, namespace="tenant-a")
        finally:
            a_may_finish.set()
            assert await run_a == "done for a"


def test_the_lock_key_is_one_per_run() -> None:
    keys = {
        workflow_lock_key("x", None),
        workflow_lock_key("x", "a"),
        workflow_lock_key("x", "b"),
        workflow_lock_key("a:x", None),
        workflow_lock_key("@1:a:x", None),
        workflow_lock_key("1:a:x", None),
        workflow_lock_key("@@1:a:x", None),
        workflow_lock_key("a:x", "a"),
    }
    assert len(keys) == 8
    # Without a namespace the key is the stack id itself, as before.
    assert workflow_lock_key("order-1", None) == "order-1"
    long = workflow_lock_key("s" * 4096, "n" * 4096)
    assert len(long) <= 4096
    assert long != workflow_lock_key("s" * 4096, "n" * 4095)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_one_shared_manager_runs_both_tenants_of_one_stack_id(kind: str) -> None:
    """A module-level manager serving every tenant: B's run of order-1 starts while A's
    is live in the same manager (create_stack once refused: "a live stack with id
    'order-1' already exists", whatever the namespace)."""
    async with any_backend(kind) as backend:
        manager = StorageManager(backend, error_mode="strict")
        a_entered = asyncio.Event()
        a_may_finish = asyncio.Event()

        async def work(tenant: str) -> str:
            if tenant == "a":
                a_entered.set()
                await a_may_finish.wait()
            return f"done for {tenant}"

        orders = flow(Step.create("work", work))
        run_a = asyncio.create_task(
            orders.run("a", manager=manager, stack_id="order-1", namespace="tenant-a")
        )
        try:
            await asyncio.wait_for(a_entered.wait(), 10)
            assert (
                await orders.run("b", manager=manager, stack_id="order-1", namespace="tenant-b")
                == "done for b"
            )
            # Tenant A's run is stored and live: another stack of it may be made, and the
            # compare-and-set refuses its creation (docs/configuration.md).
            extra = manager.create_stack("order-1", namespace="tenant-a")
            with pytest.raises(CheckpointConflictError):
                await manager.save(extra, expected_revision=0)
            manager.discard_stack(extra)
        finally:
            a_may_finish.set()
            assert await run_a == "done for a"
        stored = await backend.adapter.get_checkpoint("order-1", "tenant-b", fallback=False)
        assert stored is not None and stored.status == "completed"


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_a_tenant_never_continues_a_run_of_no_namespace(kind: str) -> None:
    """With ``namespace_fallback`` on (the default) a tenant's ``flow.run`` with the id of
    a run of no namespace reads that run through the fallback. A completed run's output
    is what it reads (docs/configuration.md); a run still going — running in another
    process, crashed, or waiting — is refused, naming it: continuing it would copy its
    input into the tenant's namespace and run its steps a second time, beside its own
    process, under another workflow lock. Nothing is stored in the tenant's namespace."""
    from siglo.errors import InvalidStateTransitionError

    ran: list[str] = []

    async def charge(order: dict[str, str]) -> dict[str, str]:
        ran.append(order["who"])
        return {**order, "charged": "yes"}

    billing = flow(Step.create("charge", charge), name="billing")
    async with any_backend(kind) as backend:
        manager = StorageManager(backend)
        for status in ("running", "waiting", "failed"):
            legacy = manager.create_stack(
                f"inv-{status}",
                workflow_id=billing.name,
                metadata={"flowVersion": billing.version, "input": {"who": "legacy"}},
            )
            if status != "running":
                legacy.transition(status)
            await manager.save(legacy, expected_revision=0)
            manager.discard_stack(legacy)
            with pytest.raises(InvalidStateTransitionError, match=f"of no namespace .* {status}"):
                await billing.run(
                    {"who": "tenant"}, manager=manager, stack_id=f"inv-{status}", namespace="t"
                )
            assert ran == []
            assert (
                await backend.adapter.get_checkpoint(f"inv-{status}", "t", fallback=False) is None
            )
        # A completed run of no namespace: its output is read, as the docs say.
        assert await billing.run({"who": "legacy"}, manager=manager, stack_id="inv-done") == {
            "who": "legacy",
            "charged": "yes",
        }
        again = await billing.run(
            {"who": "tenant"}, manager=manager, stack_id="inv-done", namespace="t"
        )
        assert again == {"who": "legacy", "charged": "yes"} and ran == ["legacy"]
