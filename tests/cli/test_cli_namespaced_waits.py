"""Wait records of namespaced runs through ``siglo export / import / show / rm / prune``
(issue 31, defect 4): every reader of a listed stack's wait records names its namespace,
on real SQLite, PostgreSQL and Redis stores."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner, Result
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Checkpoint, WaitRecord
from siglo.cli import cli
from siglo.clock import system_clock

NS = "tenant:a"


async def invoke(*args: str, input: bytes | None = None) -> Result:
    # In a thread: each command runs its own event loop, as in a shell.
    return await asyncio.to_thread(
        CliRunner().invoke, cli, list(args), input=input, catch_exceptions=False
    )


async def waiting_run(
    backend: siglo.Backend, stack_id: str, key: str, *, namespace: str | None = NS
) -> WaitRecord:
    """A run of ``namespace`` waiting for ``key``: its wait record, and its checkpoint
    embedding it (as a flow stores them)."""
    now = system_clock.now_ms()
    wait = WaitRecord(
        correlation_key=key,
        stack_id=stack_id,
        namespace=namespace,
        step_id="approve",
        created_at=now,
        expires_at=now + 3_600_000,
    )
    await backend.adapter.save_wait_record(wait)
    await backend.adapter.save_checkpoint(
        Checkpoint(
            stack_id=stack_id,
            namespace=namespace,
            workflow_id="orders",
            status="waiting",
            revision=3,
            timestamp=now,
            contexts={"approve": {"waitingFor": key}},
            metadata={"waitRecord": wait.to_wire()},
        )
    )
    return wait


@pytest.mark.parametrize(
    ("source", "target"),
    [("sqlite", "postgres"), ("postgres", "redis"), ("redis", "sqlite")],
)
async def test_export_carries_the_waits_of_namespaced_runs(source: str, target: str) -> None:
    async with shared_store(source) as src, shared_store(target) as dst:
        await waiting_run(src, "order-1", "approve:1")
        await waiting_run(src, "order-2", "approve:2", namespace=None)
        dump = await invoke("export", src.url)
        assert dump.exit_code == 0, dump.output
        imported = await invoke("import", dst.url, input=dump.stdout_bytes)
        assert imported.exit_code == 0, imported.output
        assert "imported 2 checkpoint(s) and 2 wait record(s)" in imported.output
        moved = await dst.adapter.get_wait_record("approve:1", namespace=NS)
        assert moved is not None and moved.status == "waiting" and moved.namespace == NS
        # ... and the run is deliverable in the new store.
        claimed = await dst.adapter.claim_wait_record("approve:1", "me", namespace=NS)
        assert claimed is not None and claimed.stack_id == "order-1"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_show_rm_prune_see_the_waits_of_namespaced_runs(kind: str) -> None:
    async with shared_store(kind) as backend:
        url = backend.url
        await waiting_run(backend, "order-1", "approve:1")
        shown = await invoke("show", url, "order-1", "--namespace", NS, "--json")
        assert shown.exit_code == 0, shown.output
        waits = json.loads(shown.output)["waitRecords"]
        assert [(w["correlationKey"], w["namespace"]) for w in waits] == [("approve:1", NS)]
        table = await invoke("show", url, "order-1", "--namespace", NS)
        assert "wait approve:1" in table.output and "waiting" in table.output

        removed = await invoke("rm", url, "order-1", "--namespace", NS)
        assert removed.exit_code == 0, removed.output
        assert await backend.adapter.get_wait_record("approve:1", namespace=NS) is None

        # prune: a finished namespaced run goes with its (finished) wait.
        old = system_clock.now_ms() - 30 * 86_400_000
        done = WaitRecord(
            correlation_key="approve:9", stack_id="order-9", namespace=NS, status="cancelled"
        )
        await backend.adapter.save_wait_record(done)
        await backend.adapter.save_checkpoint(
            Checkpoint(
                stack_id="order-9", namespace=NS, status="cancelled", revision=2, timestamp=old
            )
        )
        pruned = await invoke("prune", url, "--older-than", "7d", "-n", NS)
        assert pruned.exit_code == 0 and "deleted 1 stack(s)" in pruned.output
        assert await backend.adapter.get_wait_record("approve:9", namespace=NS) is None


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_show_and_rm_of_a_stack_not_there_say_where_to_look(kind: str) -> None:
    """A stack is its namespace and its id. ``siglo show`` of an id stored only in
    namespaces said "no stack" with a hint to list stacks; in a namespace where the
    application's reads fall back to the stack without one, it said "no stack" while the
    library served that stack (a black-box auditor). The hints now say so."""
    async with shared_store(kind) as backend:
        adapter = backend.adapter
        await adapter.save_checkpoint(Checkpoint(stack_id="order-1", revision=1, timestamp=1))
        await adapter.save_checkpoint(
            Checkpoint(stack_id="order-2", revision=1, timestamp=1, namespace="tenant-a")
        )
        missing = await invoke("show", backend.url, "order-2")
        assert missing.exit_code == 1
        assert "no stack 'order-2'" in missing.output
        assert "shown with --namespace NS" in missing.output, missing.output
        fallen = await invoke("show", backend.url, "order-1", "--namespace", "tenant-b")
        assert fallen.exit_code == 1
        assert "no stack 'order-1' in namespace 'tenant-b'" in fallen.output
        assert "a stack 'order-1' without a namespace exists" in fallen.output
        assert "namespace_fallback is on" in fallen.output, fallen.output
        nowhere = await invoke("show", backend.url, "order-9", "--namespace", "tenant-b")
        assert nowhere.exit_code == 1 and "--namespace NS` lists" in nowhere.output
        # siglo rm says the same (a black-box auditor found only `siglo show` did).
        removed = await invoke("rm", backend.url, "order-2")
        assert removed.exit_code == 1 and "shown with --namespace NS" in removed.output
        fallen_rm = await invoke("rm", backend.url, "order-1", "--namespace", "tenant-b")
        assert fallen_rm.exit_code == 1
        assert "a stack 'order-1' without a namespace exists" in fallen_rm.output
        stale = await invoke("rm", backend.url, "order-2", "--revision", "1")
        assert stale.exit_code == 1 and "shown with --namespace NS" in stale.output
