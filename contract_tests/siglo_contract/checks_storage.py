"""Focused checks of the storage adapter: concurrency, real time, bad input, hostile ids,
declared capabilities. The state machines cover the rest of the adapter rules."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from siglo.adapter import CAPABILITY_METHODS, Capability
from siglo.checkpoint import Checkpoint
from siglo.errors import (
    CapabilityNotSupportedError,
    CheckpointConflictError,
    InvalidArgumentError,
    LockNotAcquiredError,
    WaitRecordClaimError,
)
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord
from siglo.sentinel import MISSING
from siglo_contract.concurrency import (
    PROCESSES,
    TASKS,
    contenders,
    in_processes,
    shares_across_processes,
)
from siglo_contract.machine_base import HOSTILE_IDS, canon
from siglo_contract.registry import CheckContext, check, expect, fail

C = Capability


def _cp(ctx: CheckContext, stack: str, revision: int, **fields: Any) -> Checkpoint:
    return Checkpoint(stack_id=stack, revision=revision, timestamp=ctx.now_ms(), **fields)


# -- concurrency ------------------------------------------------------------------------


@check("checkpoint.occ.atomic")
async def concurrent_checkpoint_saves(ctx: CheckContext) -> None:
    """N concurrent saves with one expected_revision: exactly one wins."""
    stack = ctx.id("race")
    await ctx.backend.adapter.save_checkpoint(_cp(ctx, stack, 1))
    async with contenders(ctx) as backends:

        async def save(i: int, backend: Any) -> str:
            cp = _cp(ctx, stack, 2, metadata={"writer": i})
            try:
                await backend.adapter.save_checkpoint(cp, expected_revision=1)
                return "won"
            except CheckpointConflictError as exc:
                expect(
                    exc.current_revision == 2,
                    "checkpoint.occ.atomic",
                    f"a losing save saw current_revision={exc.current_revision}, want 2",
                )
                return "conflict"

        results = await asyncio.gather(*(save(i, b) for i, b in enumerate(backends)))
    winners = [i for i, r in enumerate(results) if r == "won"]
    expect(
        len(winners) == 1,
        "checkpoint.occ.atomic",
        f"{len(winners)} of {TASKS} concurrent saves with expected_revision=1 won: {results}",
    )
    stored = await ctx.backend.adapter.get_checkpoint(stack)
    expect(
        stored is not None and stored.metadata == {"writer": winners[0]},
        "checkpoint.occ.atomic",
        f"the stored checkpoint is not the winner's ({winners[0]}): {stored!r}",
    )
    if shares_across_processes(ctx):
        cp = _cp(ctx, stack, 3).to_wire()
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
    """N concurrent claims of one waiting record: exactly one claimant."""
    key = ctx.id("claim-race")
    await ctx.backend.adapter.save_wait_record(
        WaitRecord(correlation_key=key, stack_id=ctx.id("s"))
    )
    async with contenders(ctx) as backends:
        results = await asyncio.gather(
            *(b.adapter.claim_wait_record(key, f"claimant-{i}") for i, b in enumerate(backends))
        )
    winners = [r.claimant_id for r in results if r is not None]
    expect(
        len(winners) == 1,
        "wait.claim.once",
        f"{len(winners)} of {TASKS} concurrent claimants got the record: {winners}",
    )
    stored = await ctx.backend.adapter.get_wait_record(key)
    expect(
        stored is not None and stored.claimant_id == winners[0],
        "wait.claim.once",
        f"the stored claimant is not the winner {winners[0]!r}: {stored!r}",
    )
    if shares_across_processes(ctx):
        key2 = ctx.id("claim-race-2")
        await ctx.backend.adapter.save_wait_record(
            WaitRecord(correlation_key=key2, stack_id=ctx.id("s"))
        )
        out = await in_processes(
            ctx, "wait_claim", [{"key": key2, "claimant": f"proc-{i}"} for i in range(PROCESSES)]
        )
        won = [o for o in out if o is not None]
        expect(
            len(won) == 1,
            "wait.claim.once",
            f"{len(won)} of {PROCESSES} processes claimed the same record: {out}",
        )


@check("lock.workflow.exclusive")
async def workflow_lock_exclusive(ctx: CheckContext) -> None:
    """Actions under with_workflow_lock for one stack never overlap; results are returned."""
    stack = ctx.id("wf")
    inside = 0
    overlaps = 0

    async with contenders(ctx) as backends:

        async def run(i: int, backend: Any) -> int:
            async def action() -> int:
                nonlocal inside, overlaps
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(0.005)
                inside -= 1
                return i

            result: int = await backend.adapter.with_workflow_lock(stack, action)
            return result

        results = await asyncio.gather(*(run(i, b) for i, b in enumerate(backends)))
    expect(
        overlaps == 0,
        "lock.workflow.exclusive",
        f"{overlaps} times an action started while another for the same stack ran",
    )
    expect(
        results == list(range(len(results))),
        "lock.workflow.exclusive",
        f"with_workflow_lock did not return the actions' results: {results}",
    )
    if shares_across_processes(ctx):
        out = await in_processes(
            ctx,
            "workflow_lock",
            [{"stack_id": stack, "hold_s": 0.02, "rounds": 3} for _ in range(PROCESSES)],
        )
        intervals = sorted(iv for proc in out for iv in proc)
        for (_, end), (start, _) in itertools.pairwise(intervals):
            expect(
                start >= end,
                "lock.workflow.exclusive",
                f"actions in two processes overlapped: one ran until {end:.4f}, "
                f"another started at {start:.4f}",
            )


@check("lock.workflow.release-on-error")
async def workflow_lock_release_on_error(ctx: CheckContext) -> None:
    """An action's exception propagates and the lock is free afterwards."""
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


@check("lock.workflow.separate", requires=(C.LOCKS,))
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


# -- time, on the backend's clock or for real ------------------------------------------


@check("checkpoint.expiry.hidden", "checkpoint.expiry.clean")
async def checkpoint_expiry_in_time(ctx: CheckContext) -> None:
    """A checkpoint expires when its time comes, clean-up or not, and the stack is free."""
    ttl = ctx.short_ttl_ms()
    stack, keep = ctx.id("expiring"), ctx.id("kept")
    try:
        await ctx.backend.adapter.save_checkpoint(_cp(ctx, ctx.id("fresh"), 1), expected_revision=0)
    except CheckpointConflictError as exc:
        fail("checkpoint.occ.expected", f"expected_revision=0 on a new stack conflicted: {exc}")
    await ctx.backend.adapter.save_checkpoint(_cp(ctx, stack, 5, expires_at=ctx.now_ms() + ttl))
    await ctx.backend.adapter.save_checkpoint(_cp(ctx, keep, 1))
    got = await ctx.backend.adapter.get_checkpoint(stack)
    expect(got is not None, "checkpoint.expiry.hidden", "a live checkpoint was not returned")
    await ctx.pass_time(ttl)
    got = await ctx.backend.adapter.get_checkpoint(stack)
    expect(got is None, "checkpoint.expiry.hidden", f"expired checkpoint returned: {got!r}")
    count = await ctx.backend.adapter.clean_expired_checkpoints()
    expect(type(count) is int and count >= 0, "checkpoint.expiry.clean", f"count {count!r}")
    expect(
        await ctx.backend.adapter.get_checkpoint(keep) is not None,
        "checkpoint.expiry.clean",
        "clean_expired_checkpoints removed a live checkpoint",
    )
    try:
        await ctx.backend.adapter.save_checkpoint(_cp(ctx, stack, 1), expected_revision=0)
    except CheckpointConflictError as exc:
        fail("checkpoint.expiry.hidden", f"a save after expiry conflicted: {exc}")


@check("wait.retention")
async def wait_retention_in_time(ctx: CheckContext) -> None:
    """A record past its retention is never returned, claimed, completed or cancelled."""
    ttl = ctx.short_ttl_ms()
    key, stack = ctx.id("retained"), ctx.id("retained-stack")
    await ctx.backend.adapter.save_wait_record(
        WaitRecord(correlation_key=key, stack_id=stack), ttl_ms=ttl
    )
    expect(
        await ctx.backend.adapter.get_wait_record(key) is not None,
        "wait.retention",
        "a record within its retention was not returned",
    )
    await ctx.pass_time(ttl)
    adapter = ctx.backend.adapter
    expect(await adapter.get_wait_record(key) is None, "wait.retention", "returned after retention")
    expect(
        await adapter.get_wait_record(stack) is None,
        "wait.retention",
        "returned by stack id after retention",
    )
    expect(
        await adapter.claim_wait_record(key, "c") is None,
        "wait.retention",
        "claimed after retention",
    )
    expect(
        await adapter.cancel_wait_record(key) is False,
        "wait.retention",
        "cancelled after retention",
    )
    try:
        await adapter.complete_wait_record(key, "c")
    except WaitRecordClaimError:
        pass
    else:
        fail("wait.retention", "completed after retention")


@check("wait.claim.expired")
async def wait_deadline_in_time(ctx: CheckContext) -> None:
    """Once the deadline passes a claim needs allow_expired."""
    ttl = ctx.short_ttl_ms()
    key = ctx.id("deadline")
    await ctx.backend.adapter.save_wait_record(
        WaitRecord(correlation_key=key, stack_id=ctx.id("s"), expires_at=ctx.now_ms() + ttl)
    )
    await ctx.pass_time(ttl)
    got = await ctx.backend.adapter.claim_wait_record(key, "late")
    expect(got is None, "wait.claim.expired", f"claimed past the deadline: {got!r}")
    got = await ctx.backend.adapter.claim_wait_record(key, "late", allow_expired=True)
    expect(
        got is not None and got.status == "claimed",
        "wait.claim.expired",
        f"allow_expired=True did not claim: {got!r}",
    )


@check("wait.claim.lease")
async def wait_lease_in_time(ctx: CheckContext) -> None:
    """A claimant whose lease ran out loses the record to the next claimant."""
    lease = ctx.short_ttl_ms()
    key = ctx.id("lease")
    adapter = ctx.backend.adapter
    await adapter.save_wait_record(WaitRecord(correlation_key=key, stack_id=ctx.id("s")))
    first = await adapter.claim_wait_record(key, "first", lease_ms=lease)
    expect(first is not None, "wait.claim.once", "a waiting record could not be claimed")
    expect(
        await adapter.claim_wait_record(key, "second") is None,
        "wait.claim.refused",
        "a second claimant took a record under a live lease",
    )
    await ctx.pass_time(lease)
    second = await adapter.claim_wait_record(key, "second")
    expect(
        second is not None and second.claimant_id == "second",
        "wait.claim.lease",
        f"the lease ran out but the record stayed with the first claimant: {second!r}",
    )


@check("cache.expiry", "cache.miss", "cache.falsy-hit")
async def cache_in_time(ctx: CheckContext) -> None:
    """Falsy values are hits, unknown keys miss, values past their TTL miss."""
    adapter = ctx.backend.adapter
    expect(await adapter.get_cached_step(ctx.id("never")) is MISSING, "cache.miss", "not MISSING")
    falsy: tuple[Any, ...] = (None, 0, False, "", [], {})
    for i, value in enumerate(falsy):
        await adapter.set_cached_step(ctx.id(f"falsy{i}"), value, 60_000)
        got = await adapter.get_cached_step(ctx.id(f"falsy{i}"))
        expect(
            got is not MISSING and canon(got) == canon(value),
            "cache.falsy-hit",
            f"cached {value!r}, got {got!r}",
        )
    ttl = ctx.short_ttl_ms()
    await adapter.set_cached_step(ctx.id("short"), {"v": 1}, ttl)
    expect(await adapter.get_cached_step(ctx.id("short")) == {"v": 1}, "cache.roundtrip", "lost")
    await ctx.pass_time(ttl)
    got = await adapter.get_cached_step(ctx.id("short"))
    expect(got is MISSING, "cache.expiry", f"value past its TTL returned: {got!r}")


# -- lookups ------------------------------------------------------------------------------


@check("wait.by-stack", "wait.checkpoint-fallback", requires=(C.CHECKPOINTS,))
async def wait_lookups(ctx: CheckContext) -> None:
    """By stack id the latest record is found; else the checkpoint's embedded record."""
    adapter = ctx.backend.adapter
    stack = ctx.id("stack")
    for name in ("w1", "w2"):
        await adapter.save_wait_record(WaitRecord(correlation_key=ctx.id(name), stack_id=stack))
    got = await adapter.get_wait_record(stack)
    expect(
        got is not None and got.correlation_key == ctx.id("w2"),
        "wait.by-stack",
        f"get_wait_record(stack) returned {got!r}, not the latest record",
    )
    await adapter.claim_wait_record(ctx.id("w2"), "c")
    got = await adapter.get_wait_record(stack)
    expect(
        got is not None and got.status == "claimed",
        "wait.by-stack",
        f"by stack id the record is not in its current state: {got!r}",
    )
    embedded = WaitRecord(correlation_key=ctx.id("inner"), stack_id=ctx.id("cp-stack"))
    await adapter.save_checkpoint(
        _cp(ctx, ctx.id("cp-stack"), 1, metadata={"waitRecord": embedded.to_wire()})
    )
    got = await adapter.get_wait_record(ctx.id("cp-stack"))
    expect(got == embedded, "wait.checkpoint-fallback", f"got {got!r}, want {embedded!r}")
    await adapter.save_checkpoint(
        _cp(
            ctx,
            ctx.id("ns-stack"),
            1,
            namespace=ctx.id("ns"),
            metadata={"waitRecord": embedded.to_wire()},
        )
    )
    got = await adapter.get_wait_record(ctx.id("ns-stack"))
    expect(
        got is None,
        "wait.checkpoint-fallback",
        f"a namespaced checkpoint's embedded record was returned: {got!r}",
    )


@check("checkpoint.namespace.fallback", "checkpoint.namespace.isolation")
async def namespace_lookups(ctx: CheckContext) -> None:
    """Namespaced reads fall back to the un-namespaced checkpoint, never to another ns."""
    adapter = ctx.backend.adapter
    stack, ns_a, ns_b = ctx.id("s"), ctx.id("a"), ctx.id("b")
    await adapter.save_checkpoint(_cp(ctx, stack, 1, metadata={"at": "root"}))
    await adapter.save_checkpoint(_cp(ctx, stack, 7, namespace=ns_a, metadata={"at": "a"}))
    got = await adapter.get_checkpoint(stack, ns_b)
    expect(
        got is None or got.namespace in (None, ns_b),
        "checkpoint.namespace.isolation",
        f"a get in namespace b returned namespace a's checkpoint: {got!r}",
    )
    expect(
        got is not None and got.metadata == {"at": "root"},
        "checkpoint.namespace.fallback",
        f"get in an empty namespace returned {got!r}, not the un-namespaced checkpoint",
    )
    expect(
        await adapter.get_checkpoint(stack, ns_b, fallback=False) is None,
        "checkpoint.namespace.fallback",
        "fallback=False still fell back",
    )
    got = await adapter.get_checkpoint(stack)
    expect(
        got is not None and got.metadata == {"at": "root"},
        "checkpoint.namespace.fallback",
        f"an un-namespaced get returned {got!r}",
    )
    await adapter.save_checkpoint(_cp(ctx, stack, 1, namespace=ns_b, metadata={"at": "b"}))
    got = await adapter.get_checkpoint(stack, ns_a)
    expect(
        got is not None and got.metadata == {"at": "a"},
        "checkpoint.namespace.isolation",
        f"namespace a now reads {got!r}",
    )


# -- input, ids, capabilities ------------------------------------------------------------


async def _rejects(what: str, call: Callable[[], Awaitable[Any]]) -> None:
    try:
        await call()
    except InvalidArgumentError:
        return
    except Exception as exc:
        fail("input.rejected", f"{what} raised {exc!r}, not InvalidArgumentError")
    fail("input.rejected", f"{what} was accepted")


class _NotJson:
    pass


@check("input.rejected")
async def bad_input(ctx: CheckContext) -> None:
    """Bad ids, TTLs, revisions, values and types raise InvalidArgumentError; nothing changes."""
    caps = ctx.session.target.capabilities
    a = ctx.backend.adapter
    if C.CHECKPOINTS in caps:
        stack = ctx.id("kept")
        cp = _cp(ctx, stack, 3, metadata={"v": 1})
        await a.save_checkpoint(cp)
        await _rejects("get_checkpoint('')", lambda: a.get_checkpoint(""))
        await _rejects("get_checkpoint(NUL)", lambda: a.get_checkpoint("a\x00b"))
        await _rejects("get_checkpoint(123)", lambda: a.get_checkpoint(123))  # type: ignore[arg-type]
        await _rejects("get_checkpoint(ns='')", lambda: a.get_checkpoint(stack, ""))
        await _rejects("save_checkpoint('x')", lambda: a.save_checkpoint("x"))  # type: ignore[arg-type]
        await _rejects(
            "save_checkpoint(expected_revision=-1)",
            lambda: a.save_checkpoint(_cp(ctx, stack, 9), expected_revision=-1),
        )
        await _rejects(
            "save_checkpoint(expected_revision='3')",
            lambda: a.save_checkpoint(_cp(ctx, stack, 9), expected_revision="3"),  # type: ignore[arg-type]
        )
        await _rejects(
            "save_checkpoint(revision 3, expected_revision=3)",
            lambda: a.save_checkpoint(_cp(ctx, stack, 3), expected_revision=3),
        )
        await _rejects(
            "save_checkpoint(stack id with NUL)",
            lambda: a.save_checkpoint(_cp(ctx, stack + "\x00", 9)),
        )
        after = await a.get_checkpoint(stack)
        expect(after == cp, "input.rejected", f"rejected saves changed {cp!r} into {after!r}")
    if C.WAIT_RECORDS in caps:
        key = ctx.id("wait")
        await a.save_wait_record(WaitRecord(correlation_key=key, stack_id=ctx.id("s")))
        before = await a.get_wait_record(key)
        await _rejects(
            "save_wait_record(key '')",
            lambda: a.save_wait_record(WaitRecord(correlation_key="", stack_id="s")),
        )
        await _rejects(
            "save_wait_record(ttl_ms=0)",
            lambda: a.save_wait_record(WaitRecord(correlation_key=key, stack_id="other"), ttl_ms=0),
        )
        await _rejects(
            "save_wait_record(ttl_ms=1.5)",
            lambda: a.save_wait_record(
                WaitRecord(correlation_key=key, stack_id="other"),
                ttl_ms=1.5,  # type: ignore[arg-type]
            ),
        )
        await _rejects("get_wait_record('')", lambda: a.get_wait_record(""))
        await _rejects(
            "claim_wait_record(lease_ms=0)", lambda: a.claim_wait_record(key, "c", lease_ms=0)
        )
        await _rejects(
            "claim_wait_record(event_payload=non-JSON)",
            lambda: a.claim_wait_record(key, "c", event_payload=_NotJson()),
        )
        await _rejects("claim_wait_record(claimant '')", lambda: a.claim_wait_record(key, ""))
        await _rejects("complete_wait_record(claimant '')", lambda: a.complete_wait_record(key, ""))
        await _rejects("cancel_wait_record('')", lambda: a.cancel_wait_record(""))
        await _rejects("cancel_workflow('')", lambda: a.cancel_workflow(""))
        after_rec = await a.get_wait_record(key)
        expect(
            after_rec == before,
            "input.rejected",
            f"rejected calls changed {before!r} into {after_rec!r}",
        )
    if C.STEP_CACHE in caps:
        ck = ctx.id("cache")
        await a.set_cached_step(ck, "kept", 60_000)
        await _rejects("set_cached_step(non-JSON)", lambda: a.set_cached_step(ck, {1, 2}, 60_000))
        await _rejects("set_cached_step(ttl_ms=-1)", lambda: a.set_cached_step(ck, 1, -1))
        await _rejects("set_cached_step(ttl_ms=True)", lambda: a.set_cached_step(ck, 1, True))
        await _rejects("get_cached_step('')", lambda: a.get_cached_step(""))
        got = await a.get_cached_step(ck)
        expect(
            got == "kept", "input.rejected", f"rejected sets changed the cached value to {got!r}"
        )
    if C.CONTEXT_STREAM in caps:
        await _rejects("on_context_change('x')", lambda: a.on_context_change("x"))  # type: ignore[arg-type]
        await _rejects("get_context_changes('')", lambda: a.get_context_changes("", "p"))
    if C.CACHE_EVENTS in caps:
        await _rejects("on_cache_event('x')", lambda: a.on_cache_event("x"))  # type: ignore[arg-type]
    if C.WORKFLOW_LOCK in caps:
        ran = []

        async def action() -> None:
            ran.append(1)

        await _rejects("with_workflow_lock('')", lambda: a.with_workflow_lock("", action))
        expect(not ran, "input.rejected", "with_workflow_lock('') ran the action")
    await _bad_coordination_input(ctx)


async def _bad_coordination_input(ctx: CheckContext) -> None:
    b = ctx.backend
    if b.idempotency is not None and C.IDEMPOTENCY in ctx.session.target.capabilities:
        idem = b.idempotency
        key = ctx.id("idem")
        await idem.claim(key)
        await _rejects("idempotency claim('')", lambda: idem.claim(""))
        await _rejects("idempotency claim(ttl_ms=0)", lambda: idem.claim(key, 0))
        await _rejects("idempotency complete(non-JSON)", lambda: idem.complete(key, _NotJson()))
        state = await idem.claim(key)
        expect(
            state == "in-progress",
            "input.rejected",
            f"a rejected complete changed the key: claim now says {state!r}",
        )
    if b.lock is not None and C.LOCKS in ctx.session.target.capabilities:
        lock = b.lock
        await _rejects("lock acquire('')", lambda: lock.acquire(""))
        await _rejects("lock acquire(ttl_ms=0)", lambda: lock.acquire(ctx.id("l"), 0))
        await _rejects("lock release(token '')", lambda: lock.release(ctx.id("l"), ""))
        await _rejects("lock extend(ttl_ms=0)", lambda: lock.extend(ctx.id("l"), "t", 0))
    if b.nonces is not None and C.NONCES in ctx.session.target.capabilities:
        nonces = b.nonces
        await _rejects("nonce claim('')", lambda: nonces.claim("", 1))
        await _rejects("nonce claim(ttl_seconds=0)", lambda: nonces.claim(ctx.id("n"), 0))
        await _rejects(
            "nonce claim(ttl_seconds=nan)", lambda: nonces.claim(ctx.id("n"), float("nan"))
        )


HOSTILE_EXTRA = (
    "ab",
    "abc",
    "a\\\\b",
    "a'; DROP TABLE x; --",
    "a\nb",
    "a\tb",
    "y" * 300 + "1",
    "y" * 300 + "2",
)


@check("ids.hostile")
async def hostile_ids(ctx: CheckContext) -> None:
    """Ids of any characters but NUL are data: every one is stored and found apart."""
    ids = sorted(set(HOSTILE_IDS) | set(HOSTILE_EXTRA))
    caps = ctx.session.target.capabilities
    a = ctx.backend.adapter
    if C.CHECKPOINTS in caps:
        for i, name in enumerate(ids):
            await a.save_checkpoint(
                _cp(ctx, ctx.id(name), 1, namespace=ctx.id(name), metadata={"i": i})
            )
            await a.save_checkpoint(_cp(ctx, ctx.id(name), 1, metadata={"i": i}))
        for i, name in enumerate(ids):
            for ns in (ctx.id(name), None):
                got = await a.get_checkpoint(ctx.id(name), ns, fallback=False)
                expect(
                    got is not None and got.metadata == {"i": i} and got.stack_id == ctx.id(name),
                    "ids.hostile",
                    f"checkpoint of id {name!r} (ns {ns!r}) read back as {got!r}",
                )
    if C.STEP_CACHE in caps:
        for i, name in enumerate(ids):
            await a.set_cached_step(ctx.id(name), i, 60_000)
        for i, name in enumerate(ids):
            value = await a.get_cached_step(ctx.id(name))
            expect(value == i, "ids.hostile", f"cache key {name!r} read back {value!r}, want {i}")
    if C.WAIT_RECORDS in caps:
        for name in ids:
            await a.save_wait_record(
                WaitRecord(correlation_key=ctx.id(name), stack_id=ctx.id("S" + name))
            )
        for name in ids:
            record = await a.get_wait_record(ctx.id(name))
            expect(
                record is not None and record.correlation_key == ctx.id(name),
                "ids.hostile",
                f"wait record {name!r} read back as {record!r}",
            )
    if C.CONTEXT_STREAM in caps:
        for i, name in enumerate(ids):
            await a.on_context_change(
                ContextChangeEvent(
                    stack_id=ctx.id(name), step_id=name, key=name, value=i, timestamp=ctx.now_ms()
                )
            )
        for i, name in enumerate(ids):
            fields = await a.get_context_changes(ctx.id(name), name)
            expect(fields == {name: i}, "ids.hostile", f"context of {name!r} read back {fields!r}")


@check("capability.declared")
async def declared_capabilities_work(ctx: CheckContext) -> None:
    """Every method of every declared capability is implemented."""
    caps = ctx.session.target.capabilities
    a = ctx.backend.adapter
    calls: dict[Capability, Callable[[], Awaitable[Any]]] = {}
    stack = ctx.id("cap")

    async def noop() -> None:
        return None

    async def checkpoints() -> None:
        await a.save_checkpoint(_cp(ctx, stack, 1))
        await a.get_checkpoint(stack)
        await a.clean_expired_checkpoints()

    async def waits() -> None:
        key = ctx.id("cap-wait")
        await a.save_wait_record(WaitRecord(correlation_key=key, stack_id=stack))
        await a.get_wait_record(key)
        await a.claim_wait_record(key, "c")
        await a.complete_wait_record(key, "c")
        await a.cancel_wait_record(key)
        await a.cancel_workflow(stack)

    async def cache() -> None:
        await a.set_cached_step(ctx.id("cap"), 1, 1_000)
        await a.get_cached_step(ctx.id("cap"))

    async def context() -> None:
        await a.on_context_change(
            ContextChangeEvent(
                stack_id=stack, step_id="p", key="k", value=1, timestamp=ctx.now_ms()
            )
        )
        await a.get_context_changes(stack, "p")

    async def events() -> None:
        await a.on_cache_event(CacheEvent(type="hit", key="k", timestamp=ctx.now_ms()))

    async def workflow_lock() -> None:
        await a.with_workflow_lock(stack, noop)

    async def listing() -> None:
        await a.list_checkpoints(namespace=stack, limit=1)

    async def deletion() -> None:
        await a.delete_checkpoint(ctx.id("cap-deleted"))

    async def due_waits() -> None:
        await a.list_due_waits(limit=1)

    calls = {
        C.LISTING: listing,
        C.DELETION: deletion,
        C.DUE_WAITS: due_waits,
        C.CHECKPOINTS: checkpoints,
        C.WAIT_RECORDS: waits,
        C.STEP_CACHE: cache,
        C.CONTEXT_STREAM: context,
        C.CACHE_EVENTS: events,
        C.WORKFLOW_LOCK: workflow_lock,
    }
    for cap, call in calls.items():
        if cap not in caps:
            continue
        expect(
            cap in a.capabilities,
            "capability.declared",
            f"the backend declares {cap.value!r} but its adapter's capabilities do not",
        )
        for method in CAPABILITY_METHODS[cap]:
            expect(a.implements(method), "capability.declared", f"{method}() is not implemented")
        try:
            await call()
        except CapabilityNotSupportedError as exc:
            fail("capability.declared", f"declared {cap.value!r}, but: {exc}")
    for cap, attr, methods in (
        (C.IDEMPOTENCY, "idempotency", ("claim", "complete", "fail", "get_result", "get")),
        (C.LOCKS, "lock", ("acquire", "release", "extend", "with_lock")),
        (C.NONCES, "nonces", ("claim",)),
    ):
        if cap in caps:
            part = getattr(ctx.backend, attr)
            expect(
                part is not None,
                "capability.declared",
                f"the backend declares {cap.value!r} but Backend.{attr} is None",
            )
            for method in methods:
                expect(
                    callable(getattr(part, method, None)),
                    "capability.declared",
                    f"Backend.{attr}.{method} is missing",
                )
