"""Focused checks of the wait-record rules: one deterministic scenario per rule (the wait
machine adds the random interleavings). Time moves on the backend's clock, or for real
with short TTLs."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from siglo.adapter import Capability
from siglo.errors import WaitRecordClaimError
from siglo.records import WaitRecord
from siglo_contract.machine_base import canon
from siglo_contract.registry import CheckContext, check, expect, fail


def same(a: WaitRecord | None, b: WaitRecord | None) -> bool:
    """Equal, with ``0``, ``False`` and ``0.0`` told apart."""
    if a is None or b is None:
        return a is b
    return a == b and canon(a.to_wire()) == canon(b.to_wire())


def record(ctx: CheckContext, key: str, stack: str = "s", **fields: Any) -> WaitRecord:
    return WaitRecord(correlation_key=ctx.id(key), stack_id=ctx.id(stack), **fields)


async def store_record(ctx: CheckContext, rec: WaitRecord, ttl_ms: int | None = None) -> WaitRecord:
    """Save ``rec`` and read it back (``wait.roundtrip`` if it does not)."""
    await ctx.backend.adapter.save_wait_record(rec, ttl_ms=ttl_ms)
    got = await ctx.backend.adapter.get_wait_record(rec.correlation_key, namespace=rec.namespace)
    expect(same(got, rec), "wait.roundtrip", f"saved {rec!r}, read back {got!r}")
    return rec


async def claim_as(
    ctx: CheckContext, key: str, claimant: str, rule_id: str = "wait.claim.once", **kw: Any
) -> WaitRecord:
    got = await ctx.backend.adapter.claim_wait_record(key, claimant, **kw)
    expect(
        got is not None and got.status == "claimed" and got.claimant_id == claimant,
        rule_id,
        f"claim_wait_record({key!r}, {claimant!r}) of a claimable record returned {got!r}",
    )
    assert got is not None
    return got


async def refused(ctx: CheckContext, rule_id: str, key: str, claimant: str | None) -> None:
    """A claim of ``key`` must return None and change nothing."""
    a = ctx.backend.adapter
    before = await a.get_wait_record(key)
    got = await a.claim_wait_record(key, claimant)
    expect(
        got is None,
        rule_id,
        f"claim_wait_record({key!r}, {claimant!r}) of {before!r} returned {got!r}, not None",
    )
    after = await a.get_wait_record(key)
    expect(same(after, before), rule_id, f"a refused claim changed {before!r} into {after!r}")


async def complete_refused(ctx: CheckContext, key: str, claimant: str) -> None:
    a = ctx.backend.adapter
    before = await a.get_wait_record(key)
    try:
        await a.complete_wait_record(key, claimant)
    except WaitRecordClaimError:
        after = await a.get_wait_record(key)
        expect(
            same(after, before),
            "wait.complete.claimant",
            f"a refused complete by {claimant!r} changed {before!r} into {after!r}",
        )
        return
    fail(
        "wait.complete.claimant",
        f"complete_wait_record({key!r}, {claimant!r}) of {before!r} did not raise "
        "WaitRecordClaimError",
    )


@check("wait.roundtrip")
async def wait_roundtrip(ctx: CheckContext) -> None:
    """Every field reads back equal (unknown wire fields, empty metadata, falsy and nested
    payloads, a claimed record); a re-save replaces the whole record."""
    ctx.about("wait.roundtrip")
    now = ctx.now_ms()
    full = record(
        ctx,
        "k",
        namespace=ctx.id("ns"),
        step_id="step:1",
        event_type="paid",
        created_at=now,
        expires_at=now + 3_600_000,
        event_payload={"a": [1, None, {"b": False}], "ü": 0.5},
        metadata={"m": {}, "n": [1]},
        extra={"customField": [1, {"x": None}], "otherField": "v"},
    )
    await store_record(ctx, full)
    payloads: tuple[Any, ...] = (None, 0, False, "", [], {}, 2**53 + 1)
    for payload in payloads:
        await store_record(ctx, record(ctx, "k", event_payload=payload, metadata={}))
    await store_record(ctx, record(ctx, "k"))
    # Unknown wire fields of every JSON kind, falsy ones too.
    await store_record(
        ctx,
        record(
            ctx,
            "k",
            extra={
                "zeroField": 0,
                "falseField": False,
                "blankField": "",
                "emptyList": [],
                "emptyObject": {},
                "nullField": None,
                "listField": [0, ""],
            },
        ),
    )
    claimed_rec = record(
        ctx,
        "c",
        status="claimed",
        claimant_id="holder",
        claimed_at=now,
        lease_expires_at=now + 600_000,
        extra={"futureField": 1},
    )
    await store_record(ctx, claimed_rec)
    await store_record(ctx, record(ctx, "d", status="completed", completed_at=now, metadata={}))
    await store_record(ctx, record(ctx, "e", status="cancelled"))
    await store_record(ctx, record(ctx, "f", created_at=now), ttl_ms=2**62)


@check("wait.by-stack")
async def wait_by_stack(ctx: CheckContext) -> None:
    """By stack id, the stack's latest saved record in its current state; a correlation
    key beats another record's stack id."""
    ctx.about("wait.by-stack")
    a = ctx.backend.adapter
    stack = ctx.id("stack")
    for name in ("w1", "w2"):
        await store_record(ctx, WaitRecord(correlation_key=ctx.id(name), stack_id=stack))
    got = await a.get_wait_record(stack)
    expect(
        got is not None and got.correlation_key == ctx.id("w2"),
        "wait.by-stack",
        f"get_wait_record(stack) returned {got!r}, not the latest record",
    )
    await claim_as(ctx, ctx.id("w2"), "c")
    got = await a.get_wait_record(stack)
    expect(
        got is not None and got.status == "claimed" and got.claimant_id == "c",
        "wait.by-stack",
        f"by stack id the record is not in its current state: {got!r}",
    )
    await store_record(
        ctx, WaitRecord(correlation_key=ctx.id("w1"), stack_id=stack, event_type="re")
    )
    got = await a.get_wait_record(stack)
    expect(
        got is not None and got.correlation_key == ctx.id("w1") and got.event_type == "re",
        "wait.by-stack",
        f"after re-saving w1, by stack id: {got!r}",
    )
    await store_record(ctx, record(ctx, "x", "other"))
    await store_record(ctx, record(ctx, "y", "x"))
    got = await a.get_wait_record(ctx.id("x"))
    expect(
        got is not None and got.correlation_key == ctx.id("x"),
        "wait.by-stack",
        f"the record of correlation key x lost to the record of stack x: {got!r}",
    )


@check("wait.checkpoint-fallback", requires=(Capability.CHECKPOINTS,))
async def wait_checkpoint_fallback(ctx: CheckContext) -> None:
    """The record embedded in the un-namespaced checkpoint is found, exactly; never a
    namespaced checkpoint's; a record of the stack wins."""
    ctx.about("wait.checkpoint-fallback")
    a = ctx.backend.adapter
    embedded = {
        "correlationKey": ctx.id("inner"),
        "stackId": ctx.id("cp"),
        "status": "waiting",
        "eventType": "evt",
        "customField": {"kept": True},
    }
    await a.save_checkpoint(ctx.checkpoint(ctx.id("cp"), 1, metadata={"waitRecord": embedded}))
    got = await a.get_wait_record(ctx.id("cp"))
    expect(
        got is not None and canon(got.to_wire()) == canon(embedded),
        "wait.checkpoint-fallback",
        f"got {got!r}, want the embedded {embedded!r}",
    )
    await a.save_checkpoint(
        ctx.checkpoint(ctx.id("cp2"), 1, namespace=ctx.id("N"), metadata={"waitRecord": embedded})
    )
    got = await a.get_wait_record(ctx.id("cp2"))
    expect(
        got is None,
        "wait.checkpoint-fallback",
        f"a namespaced checkpoint's embedded record was returned: {got!r}",
    )
    await a.save_checkpoint(ctx.checkpoint(ctx.id("plain"), 1, metadata={"other": 1}))
    got = await a.get_wait_record(ctx.id("plain"))
    expect(got is None, "wait.checkpoint-fallback", f"no embedded record, got {got!r}")
    real = await store_record(ctx, record(ctx, "real", "cp", event_type="real"))
    got = await a.get_wait_record(ctx.id("cp"))
    expect(
        same(got, real),
        "wait.checkpoint-fallback",
        f"the embedded record was returned although the stack has a record: {got!r}",
    )


@check("wait.cancel")
async def wait_cancel(ctx: CheckContext) -> None:
    """Waiting and claimed records cancel (True); completed, cancelled and missing ones
    return False and do not change."""
    ctx.about("wait.cancel")
    a = ctx.backend.adapter
    waiting = await store_record(ctx, record(ctx, "w"))
    claimed = await store_record(ctx, record(ctx, "c"))
    await claim_as(ctx, claimed.correlation_key, "x")
    for rec in (waiting, claimed):
        got = await a.cancel_wait_record(rec.correlation_key)
        expect(got is True, "wait.cancel", f"cancel of {rec!r} returned {got!r}")
        after = await a.get_wait_record(rec.correlation_key)
        expect(
            after is not None and after.status == "cancelled",
            "wait.cancel",
            f"after cancel the record is {after!r}",
        )
    done = await store_record(ctx, record(ctx, "d"))
    await claim_as(ctx, done.correlation_key, "x")
    await a.complete_wait_record(done.correlation_key, "x")
    for key in (waiting.correlation_key, done.correlation_key, ctx.id("never-saved")):
        before = await a.get_wait_record(key)
        got = await a.cancel_wait_record(key)
        expect(got is False, "wait.cancel", f"cancel of {before!r} returned {got!r}")
        after = await a.get_wait_record(key)
        expect(same(after, before), "wait.cancel", f"cancel changed {before!r} into {after!r}")


@check("wait.cancel-workflow", requires=(Capability.CHECKPOINTS,))
async def wait_cancel_workflow(ctx: CheckContext) -> None:
    """cancel_workflow cancels every open wait of the stack in that namespace (several
    waiting and claimed ones), and its live checkpoint unless final; nothing else."""
    ctx.about("wait.cancel-workflow")
    a = ctx.backend.adapter
    ns, other_ns = ctx.id("N"), ctx.id("M")
    states = {
        "w1": "waiting",
        "w2": "claimed",
        "w3": "completed",
        "w4": "waiting",
        "w5": "claimed",
        "w6": "cancelled",
    }
    for name, status in states.items():
        await store_record(ctx, record(ctx, name, namespace=ns))
        if status in ("claimed", "completed"):
            await claim_as(ctx, ctx.id(name), "c", namespace=ns)
        if status == "completed":
            await a.complete_wait_record(ctx.id(name), "c", namespace=ns)
        if status == "cancelled":
            await a.cancel_wait_record(ctx.id(name), namespace=ns)
    # A claim whose lease has run out is still a claimed record of the stack: it is
    # cancelled too (a backend that took it as abandoned and skipped it was caught only
    # by the state machines, on some seeds).
    lease = ctx.short_ttl_ms()
    await store_record(ctx, record(ctx, "lapsed", namespace=ns))
    await claim_as(ctx, ctx.id("lapsed"), "c", namespace=ns, lease_ms=lease)
    await ctx.pass_time(lease)
    await store_record(ctx, record(ctx, "other-ns", namespace=other_ns))
    await store_record(ctx, record(ctx, "no-ns"))
    await store_record(ctx, record(ctx, "other-stack", "t", namespace=ns))
    await a.save_checkpoint(ctx.checkpoint(ctx.id("s"), 4, namespace=ns, status="waiting"))
    await a.save_checkpoint(ctx.checkpoint(ctx.id("s"), 2))
    await a.save_checkpoint(ctx.checkpoint(ctx.id("done"), 2, namespace=ns, status="completed"))
    await a.cancel_workflow(ctx.id("s"), ns)
    want = {
        "w1": "cancelled",
        "w2": "cancelled",
        "w3": "completed",
        "w4": "cancelled",
        "w5": "cancelled",
        "w6": "cancelled",
        "lapsed": "cancelled",
        "other-ns": "waiting",
        "no-ns": "waiting",
        "other-stack": "waiting",
    }
    namespace_of = {"other-ns": other_ns, "no-ns": None}
    for name, status in want.items():
        got = await a.get_wait_record(ctx.id(name), namespace=namespace_of.get(name, ns))
        expect(
            got is not None and got.status == status,
            "wait.cancel-workflow",
            f"after cancel_workflow the record {name} is {got!r}, want {status}",
        )
    cancelled = await a.get_checkpoint(ctx.id("s"), ns, fallback=False)
    expect(
        cancelled is not None and (cancelled.status, cancelled.revision) == ("cancelled", 5),
        "wait.cancel-workflow",
        f"the stack's checkpoint is {cancelled!r}, want cancelled at revision 5",
    )
    untouched = await a.get_checkpoint(ctx.id("s"))
    expect(
        untouched is not None and (untouched.status, untouched.revision) == ("running", 2),
        "wait.cancel-workflow",
        f"the un-namespaced checkpoint changed: {untouched!r}",
    )
    await a.cancel_workflow(ctx.id("s"), ns)
    again = await a.get_checkpoint(ctx.id("s"), ns, fallback=False)
    expect(
        again is not None and again.revision == 5,
        "wait.cancel-workflow",
        f"a second cancel_workflow changed the cancelled checkpoint: {again!r}",
    )
    await a.cancel_workflow(ctx.id("done"), ns)
    done = await a.get_checkpoint(ctx.id("done"), ns, fallback=False)
    expect(
        done is not None and (done.status, done.revision) == ("completed", 2),
        "wait.cancel-workflow",
        f"cancel_workflow changed a completed checkpoint: {done!r}",
    )
    await a.cancel_workflow(ctx.id("nothing-here"))


@check("wait.retention")
async def wait_retention(ctx: CheckContext) -> None:
    """A record past its retention is never returned, claimed, completed or cancelled."""
    ctx.about("wait.retention")
    ttl = ctx.short_ttl_ms()
    adapter = ctx.backend.adapter
    key, stack = ctx.id("retained"), ctx.id("retained-stack")
    await store_record(ctx, WaitRecord(correlation_key=key, stack_id=stack), ttl_ms=ttl)
    claimed = ctx.id("retained-claimed")
    await store_record(ctx, WaitRecord(correlation_key=claimed, stack_id=stack), ttl_ms=ttl)
    await claim_as(ctx, claimed, "x", lease_ms=600_000)
    await ctx.pass_time(ttl)
    expect(await adapter.get_wait_record(key) is None, "wait.retention", "returned after retention")
    expect(
        await adapter.get_wait_record(stack) is None,
        "wait.retention",
        "returned by stack id after retention",
    )
    expect(
        await adapter.claim_wait_record(key, "c", allow_expired=True) is None,
        "wait.retention",
        "claimed after retention",
    )
    expect(
        await adapter.cancel_wait_record(key) is False,
        "wait.retention",
        "cancelled after retention",
    )
    for k, who in ((key, "c"), (claimed, "x")):
        try:
            await adapter.complete_wait_record(k, who)
        except WaitRecordClaimError:
            pass
        else:
            fail("wait.retention", "completed after retention")
    # Saved without ttl_ms: the backend's default retention, its checkpoint_ttl_ms.
    async with ctx.session.backend_with(checkpoint_ttl_ms=ttl) as short:
        kept = ctx.id("retained-by-default")
        await short.adapter.save_wait_record(WaitRecord(correlation_key=kept, stack_id=stack))
        await ctx.pass_time(ttl)
        found = await short.adapter.get_wait_record(kept)
        expect(
            found is None,
            "wait.retention",
            f"a record saved without ttl_ms was returned after the backend's "
            f"checkpoint_ttl_ms={ttl}: {found!r}",
        )
        expect(
            await short.adapter.create_wait_record(
                WaitRecord(correlation_key=kept, stack_id=stack)
            ),
            "wait.retention",
            "a record past its default retention kept its key from a create",
        )


@check("wait.create")
async def wait_create(ctx: CheckContext) -> None:
    """A create stores a claimed record as given where its key has none; a second create
    (another state) returns False and changes nothing; another namespace, and a key whose
    record is past its retention, take a create; of eight concurrent creates one wins."""
    ctx.about("wait.create")
    a = ctx.backend.adapter
    rule = "wait.create"
    now = ctx.now_ms()
    claimed = record(
        ctx,
        "created",
        status="claimed",
        claimant_id="holder",
        claimed_at=now,
        lease_expires_at=now + 600_000,
        expires_at=now + 3_600_000,
        event_payload={"paid": 0},
    )
    first = await a.create_wait_record(claimed)
    got = await a.get_wait_record(claimed.correlation_key)
    expect(first is True, rule, f"create_wait_record of a new key returned {first!r}")
    expect(same(got, claimed), rule, f"created {claimed!r}, read back {got!r}")
    fresh = claimed.replace(status="waiting", claimant_id=None, claimed_at=None,
                            lease_expires_at=None, event_payload=None)  # fmt: skip
    again = await a.create_wait_record(fresh)
    after = await a.get_wait_record(claimed.correlation_key)
    expect(again is False, rule, f"a create over a stored record returned {again!r}")
    expect(same(after, claimed), rule, f"a refused create changed {claimed!r} into {after!r}")

    elsewhere = fresh.replace(namespace=ctx.id("create-ns"))
    other = await a.create_wait_record(elsewhere)
    got = await a.get_wait_record(elsewhere.correlation_key, namespace=elsewhere.namespace)
    expect(
        other is True and same(got, elsewhere),
        rule,
        f"a create in another namespace returned {other!r}, read back {got!r}",
    )

    ttl = ctx.short_ttl_ms()
    brief = record(ctx, "create-brief")
    await a.save_wait_record(brief, ttl_ms=ttl)
    await ctx.pass_time(ttl)
    replaced = brief.replace(status="cancelled")
    over_gone = await a.create_wait_record(replaced)
    got = await a.get_wait_record(brief.correlation_key)
    expect(
        over_gone is True and same(got, replaced),
        rule,
        f"a create over a record past its retention returned {over_gone!r}, read {got!r}",
    )

    contested = [record(ctx, "create-race", metadata={"n": n}) for n in range(8)]
    won = await asyncio.gather(*(a.create_wait_record(r) for r in contested))
    winners = [r for r, ok in zip(contested, won, strict=True) if ok is True]
    got = await a.get_wait_record(contested[0].correlation_key)
    expect(len(winners) == 1, rule, f"{len(winners)} of 8 concurrent creates returned True")
    expect(
        len(winners) != 1 or same(got, winners[0]),
        rule,
        f"the winning create stored {winners[:1]!r}, read back {got!r}",
    )


@check("wait.namespace.isolation")
async def wait_namespace_isolation(ctx: CheckContext) -> None:
    """Two tenants' wait records with the same correlation key and stack id, and an
    un-namespaced one: each is read, claimed, completed and cancelled in its namespace
    only; by stack id each namespace reads its own latest record, whatever another
    namespace saves."""
    a = ctx.backend.adapter
    rule = "wait.namespace.isolation"
    key, stack = ctx.id("tenant-wait"), ctx.id("tenant-stack")
    spaces: list[str | None] = [None, ctx.id("tenant-a"), ctx.id("tenant-b")]
    for ns in spaces:
        await a.save_wait_record(
            WaitRecord(correlation_key=key, stack_id=stack, namespace=ns, metadata={"of": str(ns)})
        )

    async def of(ns: str | None, lookup: str = key) -> WaitRecord | None:
        return await a.get_wait_record(lookup, namespace=ns)

    for ns in spaces:
        for lookup in (key, stack):
            got = await of(ns, lookup)
            expect(
                got is not None
                and got.namespace == ns
                and (got.metadata or {}).get("of") == str(ns),
                rule,
                f"get_wait_record({lookup!r}, namespace={ns!r}) returned {got!r}",
            )
    stranger = await of(ctx.id("tenant-c"))
    expect(stranger is None, rule, f"a namespace with no records read {stranger!r}")
    # A namespace with no record of the key claims, releases, completes and cancels
    # nothing: it never falls back to a record of another namespace (or of none).
    empty = ctx.id("tenant-c")
    took = await a.claim_wait_record(key, "claimant-c", namespace=empty)
    expect(took is None, rule, f"a claim from a namespace with no record took {took!r}")
    with contextlib.suppress(WaitRecordClaimError):
        await a.release_wait_record(key, "claimant-c", namespace=empty)
    with contextlib.suppress(WaitRecordClaimError):
        await a.complete_wait_record(key, "claimant-c", namespace=empty)
    cancelled = await a.cancel_wait_record(key, namespace=empty)
    expect(not cancelled, rule, "a cancel from a namespace with no record cancelled one")
    await a.cancel_workflow(stack, empty)
    for ns in spaces:
        got = await of(ns)
        expect(
            got is not None and got.status == "waiting" and got.claimant_id is None,
            rule,
            f"calls from namespace {empty!r}, which has no record, changed {ns!r}'s: {got!r}",
        )

    none_ns, ns_a, ns_b = spaces
    claimed = await a.claim_wait_record(key, "claimant-a", namespace=ns_a)
    expect(claimed is not None and claimed.namespace == ns_a, rule, f"claim in A: {claimed!r}")
    for ns in (none_ns, ns_b):
        other = await of(ns)
        expect(
            other is not None and other.status == "waiting",
            rule,
            f"a claim in namespace {ns_a!r} changed the record of {ns!r}: {other!r}",
        )
    claimed_b = await a.claim_wait_record(key, "claimant-b", namespace=ns_b)
    expect(claimed_b is not None, rule, "the same key in namespace B could not be claimed")
    await a.complete_wait_record(key, "claimant-a", namespace=ns_a)
    b_now = await of(ns_b)
    expect(
        b_now is not None and b_now.status == "claimed" and b_now.claimant_id == "claimant-b",
        rule,
        f"completing in A changed B: {b_now!r}",
    )
    try:
        await a.complete_wait_record(key, "claimant-a", namespace=ns_b)
    except WaitRecordClaimError:
        pass
    else:
        fail(rule, "A's claimant completed B's record")
    expect(await a.cancel_wait_record(key, namespace=none_ns), rule, "cancel (no namespace)")
    for ns, status in ((ns_a, "completed"), (ns_b, "claimed")):
        got = await of(ns)
        expect(
            got is not None and got.status == status,
            rule,
            f"cancelling the un-namespaced record changed {ns!r}: {got!r}",
        )
    await a.cancel_workflow(stack, ns_b)
    for ns, status in ((none_ns, "cancelled"), (ns_a, "completed"), (ns_b, "cancelled")):
        got = await of(ns)
        expect(
            got is not None and got.status == status,
            rule,
            f"after cancel_workflow in {ns_b!r}, the record of {ns!r} is {got!r}",
        )
    # A save in one namespace never moves another's answer by stack id: each namespace
    # reads its own latest record of the stack, also when the other namespace saved a
    # correlation key it has too, or one it lacks (an index of the latest record per
    # stack id alone passed the rest of this check).
    by_stack = ctx.id("tenant-latest")
    first, second, third = ctx.id("latest-1"), ctx.id("latest-2"), ctx.id("latest-3")
    latest: dict[str | None, str] = {}
    for ns, saved in ((ns_b, first), (ns_b, second), (ns_a, first), (none_ns, third)):
        await a.save_wait_record(WaitRecord(correlation_key=saved, stack_id=by_stack, namespace=ns))
        latest[ns] = saved
        for reader, want in latest.items():
            got = await of(reader, by_stack)
            expect(
                got is not None and got.namespace == reader and got.correlation_key == want,
                rule,
                f"after a save of {saved!r} (stack {by_stack!r}) in namespace {ns!r}, "
                f"get_wait_record({by_stack!r}, namespace={reader!r}) returned {got!r}, not "
                f"that namespace's latest record {want!r}",
            )
