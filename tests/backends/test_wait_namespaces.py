"""Wait records never cross tenants (issue 11 defect 12, rule wait.namespace.isolation).

A property test on every backend: random programs of saves, claims, completions,
cancellations and reads by two tenants (and an un-namespaced stack) whose correlation
keys and stack ids collide. What one tenant observes must be exactly what it observes
when it runs its own operations alone on a fresh reference store: the other tenant's
operations change nothing it can see.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from raw_storage import KINDS, any_backend

import siglo
from siglo import WaitRecord
from siglo.errors import WaitRecordClaimError

TENANTS = (None, "tenant-a", "tenant-b")
IDS = ("k", "s")
"""Correlation keys and stack ids drawn from one tiny set, so they collide."""

Op = tuple[str, str | None, str, str]

ops = st.lists(
    st.tuples(
        st.sampled_from(("save", "claim", "complete", "cancel", "get")),
        st.sampled_from(TENANTS),
        st.sampled_from(IDS),
        st.sampled_from((*IDS, "c1", "c2")),  # stack id for a save, claimant otherwise
    ),
    min_size=1,
    max_size=14,
)


async def _apply(adapter: siglo.StorageAdapter, op: Op, tag: str) -> Any:
    kind, ns, key, arg = op
    namespace = None if ns is None else f"{ns}-{tag}"
    key = f"{key}-{tag}"
    if kind == "save":
        record = WaitRecord(
            correlation_key=key, stack_id=f"{arg}-{tag}", namespace=namespace, metadata={"n": 1}
        )
        await adapter.save_wait_record(record)
        return "saved"
    if kind == "claim":
        got = await adapter.claim_wait_record(key, arg, namespace=namespace)
        return None if got is None else (got.status, got.claimant_id)
    if kind == "complete":
        try:
            await adapter.complete_wait_record(key, arg, namespace=namespace)
            return "completed"
        except WaitRecordClaimError:
            return "refused"
    if kind == "cancel":
        return await adapter.cancel_wait_record(key, namespace=namespace)
    got = await adapter.get_wait_record(key, namespace=namespace)
    if got is None:
        return None
    return (
        got.correlation_key.removesuffix(f"-{tag}"),
        got.stack_id.removesuffix(f"-{tag}"),
        got.namespace is None,
        got.status,
        got.claimant_id,
    )


async def _observe(backend: siglo.Backend, program: list[Op]) -> dict[str | None, list[Any]]:
    tag = secrets.token_hex(4)  # fresh ids per example: the store outlives examples
    seen: dict[str | None, list[Any]] = {ns: [] for ns in TENANTS}
    for op in program:
        seen[op[1]].append(await _apply(backend.adapter, op, tag))
    return seen


@pytest.mark.rule("wait.namespace.isolation")
@pytest.mark.parametrize("kind", KINDS)
def test_tenants_with_colliding_ids_never_see_each_other(kind: str) -> None:
    with asyncio.Runner() as runner:
        opened = any_backend(kind)
        backend = runner.run(opened.__aenter__())
        try:

            @settings(max_examples=30, deadline=None)
            @given(program=ops)
            def isolated(program: list[Op]) -> None:
                together = runner.run(_observe(backend, program))
                for tenant in TENANTS:
                    alone = [op for op in program if op[1] == tenant]
                    reference = siglo.connect("memory://")
                    by_itself = runner.run(_observe(reference, alone))
                    assert together[tenant] == by_itself[tenant], (tenant, program)

            isolated()
        finally:
            runner.run(opened.__aexit__(None, None, None))


@pytest.mark.rule("wait.checkpoint-fallback", "wait.namespace.isolation")
@pytest.mark.parametrize("kind", KINDS)
async def test_checkpoint_fallback_reads_the_namespace_asked_for(kind: str) -> None:
    async with any_backend(kind) as backend:
        adapter = backend.adapter
        for ns in ("tenant-a", None):
            embedded = WaitRecord(correlation_key=f"evt-{ns}", stack_id="s", namespace=ns)
            await adapter.save_checkpoint(
                siglo.Checkpoint(
                    stack_id="s",
                    namespace=ns,
                    revision=1,
                    timestamp=1,
                    metadata={"waitRecord": embedded.to_wire()},
                )
            )
        a = await adapter.get_wait_record("s", namespace="tenant-a")
        assert a is not None and a.correlation_key == "evt-tenant-a"
        plain = await adapter.get_wait_record("s")
        assert plain is not None and plain.correlation_key == "evt-None"
        assert await adapter.get_wait_record("s", namespace="tenant-b") is None
