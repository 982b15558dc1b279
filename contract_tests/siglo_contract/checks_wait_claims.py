"""Focused checks of the claim rules of wait records: claims, refusals, deadlines,
leases and completion, one deterministic scenario per rule."""

from __future__ import annotations

import time
from typing import Any

from siglo.records import WaitRecord
from siglo.sentinel import MISSING
from siglo.settings import DEFAULTS
from siglo_contract.checks_waits import (
    claim_as,
    complete_refused,
    record,
    refused,
    same,
    store_record,
)
from siglo_contract.machine_base import canon, look_alikes
from siglo_contract.registry import CheckContext, RuleViolation, check, expect, fail


@check("wait.claim.once")
async def wait_claim_once(ctx: CheckContext) -> None:
    """A claim returns the record claimed: claimant (or a generated one), claimed_at,
    the lease, and the payload passed (None included) or the stored one."""
    ctx.about("wait.claim.once")
    a = ctx.backend.adapter
    # A claim without lease_ms lasts the backend's claim_lease_ms: the run's option, or,
    # under the user-defaults profile (no option given, as siglo.connect gives none), the
    # backend's own default, which must be siglo's (DEFAULTS).
    lease_default = int(ctx.session.target.options.get("claim_lease_ms", DEFAULTS.claim_lease_ms))
    cases: list[tuple[str, str | None, Any, int | None]] = [
        ("stored-payload", "c1", MISSING, None),
        ("none-payload", "c2", None, None),
        ("falsy-payload", "c3", 0, 5_000),
        ("false-payload", "c5", False, None),
        ("empty-text-payload", "c6", "", None),
        ("nested-payload", "c4", {"a": [1, {"b": None}]}, None),
        ("generated", None, MISSING, 2**40),
    ]
    for name, claimant, payload, lease in cases:
        stored = await store_record(ctx, record(ctx, name, event_payload={"stored": name}))
        got = await a.claim_wait_record(
            stored.correlation_key, claimant, event_payload=payload, lease_ms=lease
        )
        expect(
            got is not None and got.status == "claimed",
            "wait.claim.once",
            f"claim of a waiting record returned {got!r}",
        )
        assert got is not None
        expect(
            got.claimant_id == claimant if claimant else bool(got.claimant_id),
            "wait.claim.once",
            f"claimant_id {got.claimant_id!r}, want {claimant or 'a generated id'!r}",
        )
        want_payload = stored.event_payload if payload is MISSING else payload
        expect(
            canon(got.event_payload) == canon(want_payload),
            "wait.claim.once",
            f"event_payload {got.event_payload!r}, want {want_payload!r}",
        )
        expect(
            got.claimed_at is not None
            and got.lease_expires_at == got.claimed_at + (lease or lease_default),
            "wait.claim.once",
            f"claimed_at {got.claimed_at}, lease_expires_at {got.lease_expires_at}, "
            f"lease {lease or lease_default} ms",
        )
        if ctx.clock_controlled:
            expect(
                got.claimed_at == ctx.now_ms(),
                "wait.claim.once",
                f"claimed_at {got.claimed_at}, the clock says {ctx.now_ms()}",
            )
        expect(
            got.replace(event_payload=None)
            == stored.replace(
                status="claimed",
                claimant_id=got.claimant_id,
                claimed_at=got.claimed_at,
                lease_expires_at=got.lease_expires_at,
                event_payload=None,
            ),
            "wait.claim.once",
            f"a claim changed fields other than its own: {stored!r} → {got!r}",
        )
        after = await a.get_wait_record(stored.correlation_key)
        expect(same(after, got), "wait.claim.once", f"claim returned {got!r}, stored {after!r}")


@check("wait.claim.refused")
async def wait_claimrefused(ctx: CheckContext) -> None:
    """Missing, completed, cancelled and otherwise-claimed records are refused (also to
    claimants that differ from the holder only slightly); the holder renews."""
    ctx.about("wait.claim.refused")
    a = ctx.backend.adapter
    await refused(ctx, "wait.claim.refused", ctx.id("never-saved"), "c")
    held = await store_record(ctx, record(ctx, "held", event_payload={"p": 1}))
    first = await claim_as(ctx, held.correlation_key, "holder", lease_ms=600_000)
    for other in (*look_alikes("holder"), "HOLDER", "other"):
        await refused(ctx, "wait.claim.refused", held.correlation_key, other)
    await refused(ctx, "wait.claim.refused", held.correlation_key, None)
    renewed = await a.claim_wait_record(
        held.correlation_key, "holder", event_payload=None, lease_ms=900_000
    )
    expect(
        renewed is not None
        and renewed.claimant_id == "holder"
        and renewed.event_payload is None
        and renewed.claimed_at is not None
        and renewed.lease_expires_at == renewed.claimed_at + 900_000
        and renewed.lease_expires_at > (first.lease_expires_at or 0),
        "wait.claim.refused",
        f"the holder re-claiming did not renew its lease: {first!r} → {renewed!r}",
    )
    done = await store_record(ctx, record(ctx, "done"))
    await claim_as(ctx, done.correlation_key, "c")
    await a.complete_wait_record(done.correlation_key, "c")
    for claimant in ("c", "d", None):
        await refused(ctx, "wait.claim.refused", done.correlation_key, claimant)
    gone = await store_record(ctx, record(ctx, "gone"))
    expect(
        await a.cancel_wait_record(gone.correlation_key) is True,
        "wait.cancel",
        "cancel of a waiting record did not return True",
    )
    for claimant in ("c", None):
        await refused(ctx, "wait.claim.refused", gone.correlation_key, claimant)
    for status in ("completed", "cancelled"):
        saved = await store_record(ctx, record(ctx, f"saved-{status}", status=status))
        await refused(ctx, "wait.claim.refused", saved.correlation_key, "c")


@check("wait.claim.expired")
async def wait_deadline(ctx: CheckContext) -> None:
    """Past its deadline a claim needs allow_expired; a completed one stays refused."""
    ctx.about("wait.claim.expired")
    a = ctx.backend.adapter
    late = await store_record(ctx, record(ctx, "late", expires_at=ctx.now_ms() - 1))
    got = await a.claim_wait_record(late.correlation_key, "c")
    expect(got is None, "wait.claim.expired", f"claimed past the deadline: {got!r}")
    got = await a.claim_wait_record(late.correlation_key, "c", allow_expired=True, event_payload=[])
    expect(
        got is not None and got.status == "claimed" and got.event_payload == [],
        "wait.claim.expired",
        f"allow_expired=True did not claim: {got!r}",
    )
    await a.complete_wait_record(late.correlation_key, "c")
    got = await a.claim_wait_record(late.correlation_key, "c", allow_expired=True)
    expect(got is None, "wait.claim.refused", f"a completed record was claimed: {got!r}")
    ttl = ctx.short_ttl_ms()
    soon = await store_record(ctx, record(ctx, "soon", expires_at=ctx.now_ms() + ttl))
    await ctx.pass_time(ttl)
    got = await a.claim_wait_record(soon.correlation_key, "late")
    expect(got is None, "wait.claim.expired", f"claimed past the deadline: {got!r}")
    got = await a.claim_wait_record(soon.correlation_key, "late", allow_expired=True)
    expect(
        got is not None and got.status == "claimed",
        "wait.claim.expired",
        f"allow_expired=True did not claim: {got!r}",
    )


@check("wait.claim.lease")
async def wait_lease(ctx: CheckContext) -> None:
    """A claimant whose lease ran out loses the record to the next claimant."""
    ctx.about("wait.claim.lease")
    lease = ctx.short_ttl_ms()
    a = ctx.backend.adapter
    for attempt in range(4):
        rec = await store_record(ctx, record(ctx, f"lease-{attempt}"))
        began = time.monotonic()
        await claim_as(ctx, rec.correlation_key, "first", lease_ms=lease)
        try:
            await refused(ctx, "wait.claim.refused", rec.correlation_key, "second")
        except RuleViolation:
            # On real time, a machine that stalled past the lease between the two claims
            # saw the lease run out as it should: that refusal proved nothing either way.
            # Again, on a new record with a longer lease.
            if ctx.clock_controlled or (time.monotonic() - began) * 1000 < lease:
                raise
            lease *= 4
            continue
        break
    else:
        fail(
            "wait.claim.refused",
            f"the machine stalled past the lease four times (the last {lease // 4} ms): "
            "a claim during a live lease could not be checked",
        )
    await ctx.pass_time(lease)
    second = await a.claim_wait_record(rec.correlation_key, "second", lease_ms=600_000)
    expect(
        second is not None and second.claimant_id == "second" and second.status == "claimed",
        "wait.claim.lease",
        f"the lease ran out but the record stayed with the first claimant: {second!r}",
    )
    await refused(ctx, "wait.claim.refused", rec.correlation_key, "first")


@check("wait.complete.claimant")
async def wait_complete(ctx: CheckContext) -> None:
    """Only the claimant completes a claimed record; anything else raises
    WaitRecordClaimError and changes nothing."""
    ctx.about("wait.complete.claimant")
    a = ctx.backend.adapter
    await complete_refused(ctx, ctx.id("never-saved"), "c")
    rec = await store_record(ctx, record(ctx, "k"))
    await complete_refused(ctx, rec.correlation_key, "c")
    await claim_as(ctx, rec.correlation_key, "claimant")
    for other in (*look_alikes("claimant"), "other"):
        await complete_refused(ctx, rec.correlation_key, other)
    await a.complete_wait_record(rec.correlation_key, "claimant")
    done = await a.get_wait_record(rec.correlation_key)
    expect(
        done is not None
        and done.status == "completed"
        and done.completed_at is not None
        and done.claimant_id == "claimant",
        "wait.complete.claimant",
        f"after complete by the claimant the record is {done!r}",
    )
    await complete_refused(ctx, rec.correlation_key, "claimant")
    cancelled = await store_record(ctx, record(ctx, "cancelled"))
    await claim_as(ctx, cancelled.correlation_key, "c")
    await a.cancel_wait_record(cancelled.correlation_key)
    await complete_refused(ctx, cancelled.correlation_key, "c")
    lapsed = await store_record(ctx, record(ctx, "lapsed"))
    ttl = ctx.short_ttl_ms()
    await claim_as(ctx, lapsed.correlation_key, "holder", lease_ms=ttl)
    await ctx.pass_time(ttl)
    await complete_refused(ctx, lapsed.correlation_key, "intruder")


@check("wait.release")
async def wait_release(ctx: CheckContext) -> None:
    """``release_wait_record`` puts a claimed record back to ``waiting`` for its claimant
    only (claimant, claim time and lease cleared, payload kept); otherwise it returns
    False and changes nothing."""
    ctx.about("wait.release")
    a = ctx.backend.adapter
    expect(
        await a.release_wait_record(ctx.id("never-saved"), "c") is False,
        "wait.release",
        "releasing a missing record did not return False",
    )
    rec = await store_record(ctx, record(ctx, "k", event_payload={"stored": 1}))
    expect(
        await a.release_wait_record(rec.correlation_key, "c") is False,
        "wait.release",
        "releasing a waiting record did not return False",
    )
    await claim_as(ctx, rec.correlation_key, "claimant", event_payload={"event": 2})
    for other in (*look_alikes("claimant"), "other"):
        before = await a.get_wait_record(rec.correlation_key)
        released = await a.release_wait_record(rec.correlation_key, other)
        after = await a.get_wait_record(rec.correlation_key)
        expect(
            released is False and same(after, before),
            "wait.release",
            f"release by {other!r} returned {released!r} and changed {before!r} into {after!r}",
        )
    expect(
        await a.release_wait_record(rec.correlation_key, "claimant") is True,
        "wait.release",
        "the claimant's release did not return True",
    )
    back = await a.get_wait_record(rec.correlation_key)
    expect(
        back is not None
        and back.status == "waiting"
        and back.claimant_id is None
        and back.claimed_at is None
        and back.lease_expires_at is None
        and canon(back.event_payload) == canon({"event": 2}),
        "wait.release",
        f"after the claimant's release the record is {back!r}",
    )
    again = await a.claim_wait_record(rec.correlation_key, "next")
    expect(
        again is not None and again.claimant_id == "next",
        "wait.release",
        f"a released record could not be claimed again: {again!r}",
    )
    await a.complete_wait_record(rec.correlation_key, "next")
    expect(
        await a.release_wait_record(rec.correlation_key, "next") is False,
        "wait.release",
        "a completed record was released",
    )
    # With namespace=, the record of that namespace only: the same key un-namespaced
    # (and in another namespace) keeps its claim.
    ns, other_ns = ctx.id("rel-ns"), ctx.id("rel-other")
    key = ctx.id("rel-shared")
    spaces = (None, ns, other_ns)
    for i, namespace in enumerate(spaces):
        await a.save_wait_record(
            WaitRecord(correlation_key=key, stack_id=ctx.id(f"rel-s{i}"), namespace=namespace)
        )
    for i, namespace in enumerate(spaces):
        # Three records apart, or the namespaces are not (their own rule's failure).
        got = await a.get_wait_record(key, namespace=namespace)
        expect(
            got is not None and got.stack_id == ctx.id(f"rel-s{i}"),
            "wait.namespace.isolation",
            f"the record of key {key!r} in namespace {namespace!r} read back as {got!r}",
        )
        await claim_as(ctx, key, "holder", namespace=namespace)
    released = await a.release_wait_record(key, "holder", namespace=ns)
    expect(released is True, "wait.release", f"the claimant's namespaced release gave {released!r}")
    for namespace, status in ((ns, "waiting"), (None, "claimed"), (other_ns, "claimed")):
        got = await a.get_wait_record(key, namespace=namespace)
        expect(
            got is not None and got.status == status,
            "wait.release",
            f"after a release in namespace {ns!r}, the record in {namespace!r} is {got!r}, "
            f"want {status}",
        )
    # A lapsed lease makes the claim takeable, not anyone's to release: a stranger's
    # release still returns False and changes nothing.
    ttl = ctx.short_ttl_ms()
    lapsing = await store_record(ctx, record(ctx, "lapsing"))
    await claim_as(ctx, lapsing.correlation_key, "holder", lease_ms=ttl)
    await ctx.pass_time(ttl)
    for other in ("stranger", *look_alikes("holder")):
        before = await a.get_wait_record(lapsing.correlation_key)
        released = await a.release_wait_record(lapsing.correlation_key, other)
        after = await a.get_wait_record(lapsing.correlation_key)
        expect(
            released is False and same(after, before),
            "wait.release",
            f"after the lease lapsed, release by {other!r} returned {released!r} and changed "
            f"{before!r} into {after!r}",
        )
    # Its claimant's release is still its own: not taken over, the claim is released.
    released = await a.release_wait_record(lapsing.correlation_key, "holder")
    back = await a.get_wait_record(lapsing.correlation_key)
    expect(
        released is True and back is not None and back.status == "waiting",
        "wait.release",
        f"after the lease lapsed (the claim not taken over), the claimant's release returned "
        f"{released!r} and left {back!r}",
    )
