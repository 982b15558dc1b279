"""Focused checks with real concurrent callers: CAS saves, wait-record claims and the
workflow lock, from several tasks (each on its own connection when the storage is
reachable by URL) and, for backends shared between processes, from several processes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any, Final

from siglo.adapter import Capability
from siglo.errors import CheckpointConflictError, LockNotAcquiredError
from siglo.records import WaitRecord
from siglo_contract.concurrency import (
    PROCESSES,
    TASKS,
    contenders,
    in_processes,
    shares_across_processes,
)
from siglo_contract.registry import CheckContext, check, expect, fail

FIRST_HOLD_MS: Final = 1000
"""How long the first workflow-lock action holds the lock while the others wait, unless
the run's profile says otherwise (``workflow_lock_hold_ms``): a lock whose waiters give
up (and run anyway) after anything shorter shows as an overlap."""
HOLD_S: Final = 0.02
"""How long each later action holds it."""


@check("checkpoint.occ.atomic")
async def concurrent_checkpoint_saves(ctx: CheckContext) -> None:
    """N concurrent saves with one expected_revision: exactly one wins, on an existing
    stack and on an absent one (expected_revision=0)."""
    ctx.about("checkpoint.occ.atomic")
    stack = ctx.id("race")
    await ctx.backend.adapter.save_checkpoint(ctx.checkpoint(stack, 1))
    async with contenders(ctx) as backends:

        async def save(i: int, backend: Any, sid: str, expected: int) -> str:
            cp = ctx.checkpoint(sid, expected + 1, metadata={"writer": i})
            try:
                await backend.adapter.save_checkpoint(cp, expected_revision=expected)
                return "won"
            except CheckpointConflictError as exc:
                expect(
                    exc.current_revision == expected + 1,
                    "checkpoint.occ.atomic",
                    f"a losing save saw current_revision={exc.current_revision}, "
                    f"want {expected + 1}",
                )
                return "conflict"

        for sid, expected in ((stack, 1), (ctx.id("race-absent"), 0)):
            results = await asyncio.gather(
                *(save(i, b, sid, expected) for i, b in enumerate(backends))
            )
            winners = [i for i, r in enumerate(results) if r == "won"]
            expect(
                len(winners) == 1,
                "checkpoint.occ.atomic",
                f"{len(winners)} of {TASKS} concurrent saves with "
                f"expected_revision={expected} won: {results}",
            )
            stored = await ctx.backend.adapter.get_checkpoint(sid)
            expect(
                stored is not None and stored.metadata == {"writer": winners[0]},
                "checkpoint.occ.atomic",
                f"the stored checkpoint is not the winner's ({winners[0]}): {stored!r}",
            )
    if shares_across_processes(ctx):
        cp = ctx.checkpoint(stack, 3).to_wire()
        rounds = 10
        out = await in_processes(
            ctx,
            "cas_save",
            [
                {"stack_id": stack, "checkpoint": cp, "expected": 2, "rounds": rounds}
                for _ in range(PROCESSES)
            ],
        )
        for i in range(rounds):
            results = [proc[i] for proc in out]
            expect(
                results.count("won") == 1,
                "checkpoint.occ.atomic",
                f"{results.count('won')} of {PROCESSES} processes won the same CAS save "
                f"(expected_revision={2 + i}): {results}",
            )


@check("wait.claim.once")
async def concurrent_wait_claims(ctx: CheckContext) -> None:
    """N concurrent claims of one waiting record: exactly one claimant, whose payload and
    claimant id are what is stored."""
    ctx.about("wait.claim.once")
    key = ctx.id("claim-race")
    await ctx.backend.adapter.save_wait_record(
        WaitRecord(correlation_key=key, stack_id=ctx.id("s"))
    )
    async with contenders(ctx) as backends:
        results = await asyncio.gather(
            *(
                b.adapter.claim_wait_record(key, f"claimant-{i}", event_payload={"i": i})
                for i, b in enumerate(backends)
            )
        )
    winners = [r for r in results if r is not None]
    expect(
        len(winners) == 1,
        "wait.claim.once",
        f"{len(winners)} of {TASKS} concurrent claimants got the record: "
        f"{[w.claimant_id for w in winners]}",
    )
    won = winners[0]
    stored = await ctx.backend.adapter.get_wait_record(key)
    expect(
        stored is not None
        and stored.claimant_id == won.claimant_id
        and won.claimant_id == f"claimant-{stored.event_payload['i']}",
        "wait.claim.once",
        f"the stored record is not the winner's {won!r}: {stored!r}",
    )
    if shares_across_processes(ctx):
        key2 = ctx.id("claim-race-2")
        await ctx.backend.adapter.save_wait_record(
            WaitRecord(correlation_key=key2, stack_id=ctx.id("s"))
        )
        out = await in_processes(
            ctx, "wait_claim", [{"key": key2, "claimant": f"proc-{i}"} for i in range(PROCESSES)]
        )
        claimed = [o for o in out if o is not None]
        expect(
            len(claimed) == 1,
            "wait.claim.once",
            f"{len(claimed)} of {PROCESSES} processes claimed the same record: {out}",
        )


@check("lock.workflow.exclusive")
async def workflow_lock_exclusive(ctx: CheckContext) -> None:
    """Actions under with_workflow_lock for one stack never overlap, however long one
    holds the lock; results are returned; a waiter that gives up raises
    LockNotAcquiredError without running its action."""
    ctx.about("lock.workflow.exclusive")
    first_hold_s = ctx.session.profile.get("workflow_lock_hold_ms", FIRST_HOLD_MS) / 1000
    stack = ctx.id("wf")
    inside = 0
    overlaps: list[str] = []
    order: list[int] = []

    async with contenders(ctx) as backends:

        async def run(i: int, backend: Any) -> int:
            async def action() -> int:
                nonlocal inside
                inside += 1
                if inside > 1:
                    overlaps.append(f"action {i} started while {inside - 1} other(s) ran")
                order.append(i)
                await asyncio.sleep(first_hold_s if i == 0 else HOLD_S)
                inside -= 1
                return i

            if i:
                await asyncio.sleep(0.05)  # the first action holds the lock by now
            result: int = await backend.adapter.with_workflow_lock(stack, action)
            return result

        results = await asyncio.gather(*(run(i, b) for i, b in enumerate(backends)))
    expect(not overlaps, "lock.workflow.exclusive", "; ".join(overlaps))
    expect(
        results == list(range(len(results))),
        "lock.workflow.exclusive",
        f"with_workflow_lock did not return the actions' results: {results}",
    )
    await _waiter_gives_up(ctx, ctx.id("wf-held"))
    if shares_across_processes(ctx):
        out = await in_processes(
            ctx,
            "workflow_lock",
            [{"stack_id": stack, "hold_s": 0.1, "rounds": 2} for _ in range(PROCESSES)],
        )
        intervals = sorted(iv for proc in out for iv in proc)
        for (_, end), (start, _) in itertools.pairwise(intervals):
            expect(
                start >= end,
                "lock.workflow.exclusive",
                f"actions in two processes overlapped: one ran until {end:.4f}, "
                f"another started at {start:.4f}",
            )


async def _waiter_gives_up(ctx: CheckContext, stack: str) -> None:
    """While one action holds the lock, a caller with a short timeout_ms gets
    LockNotAcquiredError and its action never runs."""
    release = asyncio.Event()
    entered = asyncio.Event()

    async def hold() -> None:
        entered.set()
        await release.wait()

    holder = asyncio.create_task(ctx.backend.adapter.with_workflow_lock(stack, hold))
    try:
        await asyncio.wait_for(entered.wait(), 10)
        ran: list[float] = []

        async def intruder() -> None:
            ran.append(time.monotonic())

        try:
            await ctx.backend.adapter.with_workflow_lock(stack, intruder, timeout_ms=200)
        except LockNotAcquiredError:
            pass
        else:
            fail(
                "lock.workflow.exclusive",
                "with_workflow_lock(timeout_ms=200) on a held lock returned instead of "
                "raising LockNotAcquiredError",
            )
        expect(
            not ran,
            "lock.workflow.exclusive",
            "an action ran while another held the workflow lock of its stack",
        )
    finally:
        release.set()
        await holder


@check("lock.workflow.release-on-error")
async def workflow_lock_release_on_error(ctx: CheckContext) -> None:
    """An action's exception propagates and the lock is free afterwards."""
    ctx.about("lock.workflow.release-on-error")
    stack = ctx.id("wf-error")

    class Boom(Exception):
        pass

    async def explode() -> None:
        raise Boom("from the action")

    try:
        await ctx.backend.adapter.with_workflow_lock(stack, explode)
    except Boom:
        pass
    else:
        fail("lock.workflow.release-on-error", "the action's exception did not propagate")

    async def ok() -> str:
        return "ran"

    try:
        result = await asyncio.wait_for(
            ctx.backend.adapter.with_workflow_lock(stack, ok, timeout_ms=2_000), 5
        )
    except (LockNotAcquiredError, TimeoutError):
        fail("lock.workflow.release-on-error", "the lock was still held after the action raised")
    expect(result == "ran", "lock.workflow.release-on-error", f"result {result!r}")


@check("lock.workflow.namespaced")
async def workflow_lock_namespaced(ctx: CheckContext) -> None:
    """A run's workflow lock holds its namespace: the same stack id in another namespace,
    in none, or an un-namespaced id spelled like the namespace and the id never waits,
    while the same id in the same namespace still does."""
    ctx.about("lock.workflow.namespaced")
    adapter = ctx.backend.adapter
    stack = ctx.id("wf-ns")
    tenant = "tenant-a"
    release = asyncio.Event()
    entered = asyncio.Event()

    async def hold() -> None:
        entered.set()
        await release.wait()

    holder = asyncio.create_task(adapter.with_workflow_lock(stack, hold, namespace=tenant))
    try:
        await asyncio.wait_for(entered.wait(), 10)

        async def ran() -> str:
            return "ran"

        others: list[tuple[str, str | None]] = [
            (stack, "tenant-b"),
            (stack, None),
            (f"{tenant}:{stack}", None),
            (f"@{len(tenant)}:{tenant}:{stack}", None),
            (f"{len(tenant)}:{tenant}:{stack}", None),
        ]
        for other, namespace in others:
            try:
                result = await asyncio.wait_for(
                    adapter.with_workflow_lock(other, ran, timeout_ms=1_000, namespace=namespace),
                    10,
                )
            except (LockNotAcquiredError, TimeoutError):
                fail(
                    "lock.workflow.namespaced",
                    f"with_workflow_lock({other!r}, namespace={namespace!r}) waited for the "
                    f"lock held by with_workflow_lock({stack!r}, namespace={tenant!r})",
                )
            expect(result == "ran", "lock.workflow.namespaced", f"result {result!r}")
        intruded: list[str] = []

        async def intruder() -> None:
            intruded.append("ran")

        with contextlib.suppress(LockNotAcquiredError):
            await adapter.with_workflow_lock(stack, intruder, timeout_ms=200, namespace=tenant)
        expect(
            not intruded,
            "lock.workflow.namespaced",
            f"two actions of stack {stack!r} in namespace {tenant!r} held its lock together",
        )
    finally:
        release.set()
        await holder


@check("lock.workflow.separate", requires=(Capability.LOCKS,))
async def workflow_lock_separate(ctx: CheckContext) -> None:
    """The public lock never holds a workflow lock, whatever its name, nor the reverse."""
    stack = ctx.id("wf-sep")
    lock = ctx.backend.lock
    assert lock is not None
    held = []
    for name in (f"workflow:{stack}", stack, f"workflow-lock:{stack}"):
        taken = await lock.acquire(name, 60_000)
        expect(taken.acquired, "lock.workflow.separate", f"public lock {name!r} not acquired")
        held.append((name, taken.token))

    async def inside() -> str:
        other = ctx.id("wf-sep-other")
        for name in (f"workflow:{other}", other):
            got = await lock.acquire(name, 60_000)
            expect(
                got.acquired,
                "lock.workflow.separate",
                f"public lock {name!r} was taken by with_workflow_lock({other!r})",
            )
            await lock.release(name, got.token)
        return "ran"

    async def outer() -> str:
        return await ctx.backend.adapter.with_workflow_lock(
            ctx.id("wf-sep-other"), inside, timeout_ms=1_000
        )

    try:
        result = await asyncio.wait_for(
            ctx.backend.adapter.with_workflow_lock(stack, outer, timeout_ms=1_000), 10
        )
    except (LockNotAcquiredError, TimeoutError):
        fail(
            "lock.workflow.separate",
            f"with_workflow_lock({stack!r}) waited for public locks named like it",
        )
    expect(result == "ran", "lock.workflow.separate", f"result {result!r}")
    for name, token in held:
        await lock.release(name, token)
