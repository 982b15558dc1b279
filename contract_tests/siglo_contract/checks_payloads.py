"""Focused checks of stored payloads outside checkpoints (capability ``payload_scan``):
the walk ``siglo rekey`` makes of stand-alone wait records, cached steps and (where the
backend's ``payload_kinds`` has it) context-change stream values, its compare-and-set
rewrite of their payloads, and the compare-and-delete ``siglo erase`` removes them with."""

from __future__ import annotations

import time
from typing import Any

from siglo.adapter import Capability, StorageAdapter
from siglo.errors import CapabilityNotSupportedError
from siglo.locking import split_namespaced_key
from siglo.payloads import CONTEXT_KIND, StoredPayload, context_field
from siglo.records import ContextChangeEvent, ContextOp, WaitRecord
from siglo.sentinel import MISSING
from siglo_contract.machine_base import canon
from siglo_contract.registry import CheckContext, check, expect, fail

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


_Stream = tuple[str | None, str, str]
"""A context-change stream: (namespace, stack id, step id)."""


async def _refuses_context(ctx: CheckContext, a: StorageAdapter) -> None:
    """A backend that does not list its context-change streams says so, before any
    record: the walk and the rewrite of a ``context`` item raise
    CapabilityNotSupportedError."""
    try:
        async for _ in a.scan_payloads(CONTEXT_KIND):
            break
    except CapabilityNotSupportedError:
        pass
    else:
        fail(
            "payload.context",
            "scan_payloads('context') of a backend whose payload_kinds lacks 'context' "
            "did not raise CapabilityNotSupportedError",
        )
    name = context_field("step", "k")
    item = StoredPayload(CONTEXT_KIND, ctx.id("s"), None, {name: 1})
    try:
        done = await a.swap_payload(item, {name: 2})
    except CapabilityNotSupportedError:
        return
    fail(
        "payload.context",
        f"swap_payload of a context item on a backend whose payload_kinds lacks 'context' "
        f"returned {done!r}, not CapabilityNotSupportedError",
    )


@check("payload.context")
async def payload_context(ctx: CheckContext) -> None:
    """Where payload_kinds has "context", every non-null value of every context-change
    stream is listed once, as get_context_changes returns it, and a rewrite replaces that
    one value only if it is still what was listed; elsewhere the walk is refused."""
    ctx.about("payload.context")
    a = ctx.backend.adapter
    if CONTEXT_KIND not in ctx.backend.raw_adapter.payload_kinds:
        await _refuses_context(ctx, a)
        return
    if not a.supports(Capability.CONTEXT_STREAM):
        # No stream can be written to list: the walk has only to run.
        async for _ in a.scan_payloads(CONTEXT_KIND):
            pass
        return
    ns, other, stack = ctx.id("tenant"), ctx.id("other"), ctx.id("s")
    at = ctx.now_ms()

    async def change(stream: _Stream, key: str, value: Any = None, op: ContextOp = "set") -> None:
        namespace, stack_id, step_id = stream
        await a.on_context_change(
            ContextChangeEvent(
                stack_id=stack_id,
                step_id=step_id,
                key=key,
                value=value,
                op=op,
                namespace=namespace,
                timestamp=at,
            )
        )

    # One stack: a step of a namespace with several keys (a step "pay" with key "a.b"
    # and a step "pay.a" with key "b" are two fields), the same step un-namespaced and in
    # another namespace.
    pay, pay_a = (ns, stack, "pay"), (ns, stack, "pay.a")
    plain, elsewhere = (None, stack, "pay"), (other, stack, "pay")
    written: dict[tuple[_Stream, str], Any] = {
        (pay, "card"): {"n": [1, None]},
        (pay, "note"): "x",
        (pay, "a.b"): 3,
        (pay, "moved"): "old",
        (pay, "dropped"): "d",
        (pay, "falsy"): 0,
        (pay_a, "b"): 2,
        (plain, "card"): "plain",
        (elsewhere, "card"): "other",
    }
    for (stream, key), value in written.items():
        await change(stream, key, value)
    await change(pay, "nil", None)  # null: nothing to seal, not listed
    await change(pay, "gone", 1)
    await change(pay, "gone", op="delete")  # deleted: not listed

    listed: dict[tuple[_Stream, str], list[StoredPayload]] = {}
    async for item in a.scan_payloads(CONTEXT_KIND):
        if not item.key.startswith(ctx.prefix):
            continue
        expect(
            item.kind == CONTEXT_KIND and len(item.fields) == 1,
            "payload.context",
            f"scan_payloads('context') listed {item!r} with fields {item.fields!r}: not one "
            "value of kind 'context'",
        )
        for name in item.fields:
            found = [
                (stream, key)
                for stream, key in (*written, (pay, "nil"), (pay, "gone"))
                if stream[:2] == (item.namespace, item.key)
                and context_field(stream[2], key) == name
            ]
            place = found[0] if found else ((item.namespace, item.key, "?"), name)
            listed.setdefault(place, []).append(item)
    expect(
        set(listed) == set(written),
        "payload.context",
        f"scan_payloads('context') listed {sorted(map(str, listed))}, not "
        f"{sorted(map(str, written))} (a null value and a deleted key are not listed)",
    )
    for place, items in listed.items():
        expect(
            len(items) == 1, "payload.context", f"context value {place} listed {len(items)} times"
        )
        want = written.get(place)
        for item in items:
            expect(
                place not in written
                or canon(item.fields) == canon({context_field(place[0][2], place[1]): want}),
                "payload.context",
                f"context value {place} listed with {item.fields!r}, not {want!r}",
            )

    async def swap(stream: _Stream, key: str, value: Any) -> bool:
        """The rewrite of the value of ``key`` as listed (each was, once: checked above)."""
        (item,) = listed[(stream, key)]
        return await a.swap_payload(item, {context_field(stream[2], key): value})

    async def read(stream: _Stream) -> dict[str, Any]:
        namespace, stack_id, step_id = stream
        return await a.get_context_changes(stack_id, step_id, namespace)

    def values(stream: _Stream, **changed: Any) -> dict[str, Any]:
        found = {key: value for (s, key), value in written.items() if s == stream}
        return {**found, **changed}

    # A rewrite of a value as listed replaces it, and nothing else.
    done = await swap(pay, "card", {"new": 1})
    expect(done, "payload.context", "the rewrite of a value as listed was refused")
    new_pay = values(pay, card={"new": 1}, nil=None)
    got = await read(pay)
    expect(
        canon(got) == canon(new_pay),
        "payload.context",
        f"stream {pay} after the rewrite of 'card': {got!r}, not {new_pay!r}",
    )
    for stream in (pay_a, plain, elsewhere):
        got = await read(stream)
        expect(
            canon(got) == canon(values(stream)),
            "payload.context",
            f"stream {stream} after a rewrite of {pay}'s 'card': {got!r}, not {values(stream)!r}",
        )
    # A swap already done is not done again.
    again = await swap(pay, "card", {"stale": 1})
    expect(not again, "payload.context", "a second rewrite of what was listed was done")
    # A change of the key to another value since the listing wins; so does its delete.
    await change(pay, "moved", "newer")
    stale = await swap(pay, "moved", "rekeyed")
    expect(not stale, "payload.context", "a rewrite overwrote a change made since the listing")
    await change(pay, "dropped", op="delete")
    stale = await swap(pay, "dropped", "rekeyed")
    expect(not stale, "payload.context", "a rewrite of a key deleted since the listing was done")
    new_pay = values(pay, card={"new": 1}, nil=None, moved="newer")
    del new_pay["dropped"]
    got = await read(pay)
    expect(
        canon(got) == canon(new_pay),
        "payload.context",
        f"stream {pay} after refused rewrites: {got!r}, not {new_pay!r}",
    )
    # The same stack and step un-namespaced is another stream.
    done = await swap(plain, "card", "rekeyed")
    expect(done, "payload.context", "the rewrite of an un-namespaced value was refused")
    for stream, want in (
        (plain, {"card": "rekeyed"}),
        (elsewhere, values(elsewhere)),
        (pay, new_pay),
    ):
        got = await read(stream)
        expect(
            canon(got) == canon(want),
            "payload.context",
            f"stream {stream} after a rewrite of {plain}'s 'card': {got!r}, not {want!r}",
        )


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
