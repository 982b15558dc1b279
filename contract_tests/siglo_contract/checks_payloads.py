"""Focused checks of stored payloads outside checkpoints (capability ``payload_scan``):
the walk ``siglo rekey`` makes of stand-alone wait records and cached steps, its
compare-and-set rewrite of their payloads, and the compare-and-delete ``siglo erase``
removes them with."""

from __future__ import annotations

import time
from typing import Any

from siglo.adapter import Capability, StorageAdapter
from siglo.locking import split_namespaced_key
from siglo.payloads import StoredPayload
from siglo.records import WaitRecord
from siglo.sentinel import MISSING
from siglo_contract.machine_base import canon
from siglo_contract.registry import CheckContext, check, expect

_NEEDS = (Capability.WAIT_RECORDS, Capability.STEP_CACHE)
"""What the checks store their records with, beyond their rules' capability."""


async def _mine(
    ctx: CheckContext, a: StorageAdapter, kind: str
) -> dict[tuple[str, str | None], list[StoredPayload]]:
    """This check's listed items of ``kind`` by (key, namespace): other checks share the
    store, and a backend may list more than one stored copy of a wait record."""
    found: dict[tuple[str, str | None], list[StoredPayload]] = {}
    async for item in a.scan_payloads(kind):  # type: ignore[arg-type]  # "wait" | "step"
        if kind == "wait":
            place: tuple[str, str | None] | None = (item.key, item.namespace)
        else:
            place = split_namespaced_key(item.key)
        if place is not None and place[0].startswith(ctx.prefix):
            found.setdefault(place, []).append(item)
    return found


def _wait(ctx: CheckContext, key: str, namespace: str | None, **fields: Any) -> WaitRecord:
    return WaitRecord(
        correlation_key=ctx.id(key), stack_id=ctx.id(f"s-{key}"), namespace=namespace, **fields
    )


@check("payload.scan", requires=_NEEDS)
async def payload_scan(ctx: CheckContext) -> None:
    """Every live wait record and cached step holding a payload is listed, of every
    namespace, with its payloads as stored; expired ones and payload-less waits are not."""
    ctx.about("payload.scan")
    a = ctx.backend.adapter
    ns = ctx.id("tenant")
    ttl = ctx.short_ttl_ms()
    await a.save_wait_record(_wait(ctx, "a", ns, event_payload={"p": [1, None]}, metadata={"m": 1}))
    await a.save_wait_record(_wait(ctx, "b", None, metadata={"m": "b"}))
    await a.save_wait_record(_wait(ctx, "c", ns))
    await a.save_wait_record(_wait(ctx, "d", None, metadata={"m": "d"}), ttl_ms=ttl)
    await a.set_cached_step(ctx.id("k1"), {"v": 1}, 600_000, namespace=ns)
    await a.set_cached_step(ctx.id("k2"), None, 600_000)
    await a.set_cached_step(ctx.id("k3"), 3, ttl)
    await ctx.pass_time(ttl)
    waits = await _mine(ctx, a, "wait")
    want_waits = {
        (ctx.id("a"), ns): {"eventPayload": {"p": [1, None]}, "metadata": {"m": 1}},
        (ctx.id("b"), None): {"metadata": {"m": "b"}},
    }
    expect(
        set(waits) == set(want_waits),
        "payload.scan",
        f"scan_payloads('wait') listed {sorted(map(str, waits))}, not "
        f"{sorted(map(str, want_waits))}",
    )
    for place, items in waits.items():
        for item in items:
            expect(
                place not in want_waits or canon(item.fields) == canon(want_waits[place]),
                "payload.scan",
                f"wait record {place} listed with {item.fields!r}, not {want_waits.get(place)!r}",
            )
    steps = await _mine(ctx, a, "step")
    want_steps = {(ctx.id("k1"), ns): {"v": 1}, (ctx.id("k2"), None): None}
    expect(
        set(steps) == set(want_steps),
        "payload.scan",
        f"scan_payloads('step') listed {sorted(map(str, steps))}, not "
        f"{sorted(map(str, want_steps))}",
    )
    for place, items in steps.items():
        expect(
            len(items) == 1,
            "payload.scan",
            f"cached step {place} listed {len(items)} times",
        )
        expect(
            place not in want_steps
            or all(canon(i.fields) == canon({"value": want_steps[place]}) for i in items),
            "payload.scan",
            f"cached step {place} listed with {[i.fields for i in items]!r}",
        )


@check("payload.swap", requires=_NEEDS)
async def payload_swap(ctx: CheckContext) -> None:
    """A rewrite of what was listed replaces the payloads and nothing else; one of a
    record that changed, went or expired since it was listed changes nothing."""
    ctx.about("payload.swap")
    a = ctx.backend.adapter
    ns = ctx.id("tenant")
    ttl = ctx.short_ttl_ms()
    await a.save_wait_record(_wait(ctx, "w", ns, event_payload={"p": 1}, metadata={"m": 1}))
    await a.save_wait_record(_wait(ctx, "claimed", ns, metadata={"m": 2}))
    await a.set_cached_step(ctx.id("k"), {"v": 1}, 600_000, namespace=ns)
    await a.set_cached_step(ctx.id("reset"), {"v": 1}, 600_000)
    short_set = time.monotonic()
    await a.set_cached_step(ctx.id("short"), {"v": 1}, ttl)
    await a.set_cached_step(ctx.id("gone"), {"v": 1}, ttl)
    waits = await _mine(ctx, a, "wait")
    steps = await _mine(ctx, a, "step")

    def new(item: StoredPayload) -> dict[str, Any]:
        return {name: {"new": value} for name, value in item.fields.items()}

    for item in waits.get((ctx.id("w"), ns), []):
        expect(await a.swap_payload(item, new(item)), "payload.swap", f"swap of {item} refused")
    got = await a.get_wait_record(ctx.id("w"), namespace=ns)
    expect(
        got is not None
        and got.status == "waiting"
        and canon(got.event_payload) == canon({"new": {"p": 1}})
        and canon(got.metadata) == canon({"new": {"m": 1}}),
        "payload.swap",
        f"wait record after its rewrite: {got!r}",
    )
    for item in waits.get((ctx.id("w"), ns), []):
        again = await a.swap_payload(item, {name: {"stale": 1} for name in item.fields})
        expect(not again, "payload.swap", "a second rewrite of what was listed was done")
    # A claim between the listing and the rewrite wins.
    await a.claim_wait_record(ctx.id("claimed"), "c", event_payload={"e": 1}, namespace=ns)
    # (A backend listing a second copy of the record — Redis's copy at the stack id's
    # key, which a claim does not change — may rewrite that copy; never the record.)
    items = waits.get((ctx.id("claimed"), ns), [])
    swaps = [await a.swap_payload(item, new(item)) for item in items]
    expect(False in swaps, "payload.swap", "a rewrite overwrote a claim made since the listing")
    got = await a.get_wait_record(ctx.id("claimed"), namespace=ns)
    expect(
        got is not None
        and got.status == "claimed"
        and got.claimant_id == "c"
        and canon(got.event_payload) == canon({"e": 1}),
        "payload.swap",
        f"claimed wait record after a refused rewrite: {got!r}",
    )
    # Cached steps: rewritten in place, TTL kept; a re-set or an expiry since wins.
    for key, namespace in (("k", ns), ("short", None)):
        for item in steps.get((ctx.id(key), namespace), []):
            ok = await a.swap_payload(item, new(item))
            # On real time, a machine that stalled past the short TTL since the set saw
            # the step expire as it should: refusing its rewrite is right then.
            stalled = (time.monotonic() - short_set) * 1000 >= ttl
            if not ok and key == "short" and not ctx.clock_controlled and stalled:
                continue
            expect(ok, "payload.swap", f"swap of cached step {key!r} refused")
    value = await a.get_cached_step(ctx.id("k"), namespace=ns)
    expect(canon(value) == canon({"new": {"v": 1}}), "payload.swap", f"cached step read {value!r}")
    await a.set_cached_step(ctx.id("reset"), {"v": 2}, 600_000)
    for item in steps.get((ctx.id("reset"), None), []):
        done = await a.swap_payload(item, new(item))
        expect(not done, "payload.swap", "a rewrite overwrote a set made since the listing")
    value = await a.get_cached_step(ctx.id("reset"))
    expect(canon(value) == canon({"v": 2}), "payload.swap", f"re-set step read {value!r}")
    await ctx.pass_time(ttl)
    for item in steps.get((ctx.id("gone"), None), []):
        done = await a.swap_payload(item, new(item))
        expect(not done, "payload.swap", "a rewrite of an expired cached step was done")
    for key in ("short", "gone"):
        value = await a.get_cached_step(ctx.id(key))
        expect(
            value is MISSING,
            "payload.swap",
            f"cached step {key!r} past its TTL read {value!r} after a rewrite",
        )


@check("payload.delete", requires=_NEEDS)
async def payload_delete(ctx: CheckContext) -> None:
    """A delete of what was listed removes that record and nothing else; one of a record
    that changed, went or expired since it was listed removes nothing."""
    ctx.about("payload.delete")
    a = ctx.backend.adapter
    ns, other = ctx.id("tenant"), ctx.id("other")
    ttl = ctx.short_ttl_ms()
    for namespace in (ns, other):
        await a.save_wait_record(_wait(ctx, "w", namespace, event_payload={"p": 1}))
        await a.set_cached_step(ctx.id("k"), {"v": 1}, 600_000, namespace=namespace)
    await a.save_wait_record(_wait(ctx, "claimed", ns, metadata={"m": 2}))
    await a.set_cached_step(ctx.id("reset"), {"v": 1}, 600_000)
    await a.set_cached_step(ctx.id("gone"), {"v": 1}, ttl)
    waits = await _mine(ctx, a, "wait")
    steps = await _mine(ctx, a, "step")
    # Redis lists the seed's copy of a wait record too, which may go with the record:
    # its own delete then finds nothing. One of them must be done, and the record gone.
    deletes = [await a.delete_payload(item) for item in waits.get((ctx.id("w"), ns), [])]
    expect(True in deletes, "payload.delete", f"the deletes of a listed wait gave {deletes}")
    for item in steps.get((ctx.id("k"), ns), []):
        expect(await a.delete_payload(item), "payload.delete", f"delete of {item} refused")
    got = await a.get_wait_record(ctx.id("w"), namespace=ns)
    expect(got is None, "payload.delete", f"wait record after its delete: {got!r}")
    value = await a.get_cached_step(ctx.id("k"), namespace=ns)
    expect(value is MISSING, "payload.delete", f"cached step after its delete read {value!r}")
    for item in [*waits.get((ctx.id("w"), ns), []), *steps.get((ctx.id("k"), ns), [])]:
        again = await a.delete_payload(item)
        expect(not again, "payload.delete", f"a second delete of {item} was done")
    # The same key in another namespace is another record: it stays.
    kept = await a.get_wait_record(ctx.id("w"), namespace=other)
    expect(
        kept is not None and canon(kept.event_payload) == canon({"p": 1}),
        "payload.delete",
        f"the same wait key in another namespace after a delete: {kept!r}",
    )
    value = await a.get_cached_step(ctx.id("k"), namespace=other)
    expect(
        canon(value) == canon({"v": 1}),
        "payload.delete",
        f"the same step key in another namespace after a delete read {value!r}",
    )
    again_listed = await _mine(ctx, a, "wait")
    expect(
        (ctx.id("w"), other) in again_listed and (ctx.id("w"), ns) not in again_listed,
        "payload.delete",
        f"wait records listed after a delete: {sorted(map(str, again_listed))}",
    )
    # A claim between the listing and the delete wins (Redis's copy at the stack id's
    # key, which a claim does not change, may go; never the record).
    await a.claim_wait_record(ctx.id("claimed"), "c", event_payload={"e": 1}, namespace=ns)
    deletes = [await a.delete_payload(item) for item in waits.get((ctx.id("claimed"), ns), [])]
    expect(False in deletes, "payload.delete", "a delete removed a record claimed since")
    got = await a.get_wait_record(ctx.id("claimed"), namespace=ns)
    expect(
        got is not None and got.status == "claimed" and canon(got.event_payload) == canon({"e": 1}),
        "payload.delete",
        f"claimed wait record after a refused delete: {got!r}",
    )
    # A re-set or an expiry since the listing wins.
    await a.set_cached_step(ctx.id("reset"), {"v": 2}, 600_000)
    for item in steps.get((ctx.id("reset"), None), []):
        done = await a.delete_payload(item)
        expect(not done, "payload.delete", "a delete removed a step set since the listing")
    value = await a.get_cached_step(ctx.id("reset"))
    expect(canon(value) == canon({"v": 2}), "payload.delete", f"re-set step read {value!r}")
    await ctx.pass_time(ttl)
    for item in steps.get((ctx.id("gone"), None), []):
        done = await a.delete_payload(item)
        expect(not done, "payload.delete", "a delete of an expired cached step returned True")


@check("payload.results", requires=(Capability.IDEMPOTENCY,))
async def payload_results(ctx: CheckContext) -> None:
    """The idempotency store lists each live completed key with its result, never an
    in-progress one; a rewrite replaces the result unless the key changed since."""
    ctx.about("payload.results")
    # Any: scan_results and swap_result are IdempotencyStoreBase's, not the protocol's.
    store: Any = ctx.backend.idempotency
    if store is None:
        return
    done, busy, again = ctx.id("done"), ctx.id("busy"), ctx.id("again")
    for key, result in ((done, {"r": [1, None]}), (again, 0)):
        await store.claim(key)
        await store.complete(key, result)
    await store.claim(busy)
    found: dict[str, StoredPayload] = {}
    async for item in store.scan_results():
        if item.key.startswith(ctx.prefix):
            expect(item.key not in found, "payload.results", f"{item.key!r} listed twice")
            found[item.key] = item
    expect(
        set(found) == {done, again},
        "payload.results",
        f"scan_results listed {sorted(found)}, not {sorted((done, again))}",
    )
    if done in found:
        expect(
            canon(found[done].fields) == canon({"result": {"r": [1, None]}}),
            "payload.results",
            f"{done!r} listed with {found[done].fields!r}",
        )
        ok = await store.swap_result(found[done], {"result": {"new": 1}})
        expect(ok, "payload.results", "a rewrite of an unchanged result was refused")
        got = await store.get_result(done)
        expect(canon(got) == canon({"new": 1}), "payload.results", f"rewritten result {got!r}")
        stale = await store.swap_result(found[done], {"result": {"stale": 1}})
        expect(not stale, "payload.results", "a second rewrite of what was listed was done")
    if again in found:
        await store.complete(again, {"second": 1})
        stale = await store.swap_result(found[again], {"result": {"stale": 1}})
        expect(not stale, "payload.results", "a rewrite overwrote a completion since the listing")
        got = await store.get_result(again)
        expect(canon(got) == canon({"second": 1}), "payload.results", f"result {got!r}")
