"""Focused checks of hostile ids (``ids.hostile``) and declared capabilities
(``capability.declared``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from siglo.adapter import CAPABILITY_METHODS, Capability
from siglo.errors import CapabilityNotSupportedError, CheckpointConflictError
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord
from siglo.validation import MAX_ID_LENGTH
from siglo_contract.machine_base import HOSTILE_IDS
from siglo_contract.registry import CheckContext, check, expect, fail

C = Capability


HOSTILE_EXTRA = (
    "ab",
    "abc",
    "a\\\\b",
    "a'; DROP TABLE x; --",
    "a\nb",
    "a\tb",
    "y" * 300 + "1",
    "y" * 300 + "2",
    ":",
    "}{",
    "%3A",
    "wait",
    "checkpoint:x",
    "a:checkpoint:b",
    "siglo:wait:x",
    "🙂" * 1000,
    " s p ",
    "A",
    "a ",
    # Unicode-normalisation twins: the same text composed and decomposed (NFC / NFD,
    # the Angstrom sign and its compatibility forms). A store that normalises keys
    # confuses them.
    "caf\u00e9",
    "cafe\u0301",
    "\u00c5",
    "A\u030a",
    "\u212b",
    "\ufb01",
    "fi",
)


@check("ids.hostile")
async def hostile_ids(ctx: CheckContext) -> None:
    """Ids of any characters but NUL (up to the longest allowed) are data: every one is
    stored and found apart, in every part of the contract."""
    ctx.about("ids.hostile")
    longest = "z" * (MAX_ID_LENGTH - len(ctx.prefix))
    ids = sorted(set(HOSTILE_IDS) | set(HOSTILE_EXTRA) | {longest, longest[:-1] + "y"})
    caps = ctx.session.target.capabilities
    a = ctx.backend.adapter
    if C.CHECKPOINTS in caps:
        for i, name in enumerate(ids):
            for ns in (ctx.id(name), None):
                try:
                    await a.save_checkpoint(
                        ctx.checkpoint(ctx.id(name), 1, namespace=ns, metadata={"i": i})
                    )
                except CheckpointConflictError as exc:
                    fail(
                        "ids.hostile",
                        f"the first save of id {name!r} (ns {ns!r}) conflicted with another "
                        f"id's checkpoint: {exc}",
                    )
        for i, name in enumerate(ids):
            for ns in (ctx.id(name), None):
                got = await a.get_checkpoint(ctx.id(name), ns, fallback=False)
                expect(
                    got is not None and got.metadata == {"i": i} and got.stack_id == ctx.id(name),
                    "ids.hostile",
                    f"checkpoint of id {name!r} (ns {ns!r}) read back as {got!r}",
                )
        await _long_namespaces(ctx)
    if C.STEP_CACHE in caps:
        for i, name in enumerate(ids):
            await a.set_cached_step(ctx.id(name), i, 60_000)
        for i, name in enumerate(ids):
            value = await a.get_cached_step(ctx.id(name))
            expect(value == i, "ids.hostile", f"cache key {name!r} read back {value!r}, want {i}")
    if C.WAIT_RECORDS in caps:
        for name in ids:
            await a.save_wait_record(
                WaitRecord(correlation_key=ctx.id(name), stack_id=ctx.id(name))
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
    await _hostile_coordination_ids(ctx, ids)


async def _long_namespaces(ctx: CheckContext) -> None:
    """One stack in namespaces of the longest allowed length that differ only in their
    last character: two namespaces, two checkpoints."""
    a = ctx.backend.adapter
    stack = ctx.id("in-a-long-namespace")
    base = ctx.id("n" * (MAX_ID_LENGTH - len(ctx.prefix) - 1))
    namespaces = [base + tail for tail in ("a", "b", "\u00e9")]
    for i, ns in enumerate(namespaces):
        try:
            await a.save_checkpoint(ctx.checkpoint(stack, 1, namespace=ns, metadata={"i": i}))
        except CheckpointConflictError as exc:
            fail(
                "ids.hostile",
                f"the first save of a stack in a {len(ns)}-character namespace ending "
                f"{ns[-1]!r} conflicted with another namespace's checkpoint: {exc}",
            )
    for i, ns in enumerate(namespaces):
        got = await a.get_checkpoint(stack, ns, fallback=False)
        expect(
            got is not None and got.metadata == {"i": i} and got.namespace == ns,
            "ids.hostile",
            f"the checkpoint in the {len(ns)}-character namespace ending {ns[-1]!r} read back "
            f"as {None if got is None else (got.namespace and got.namespace[-1], got.metadata)!r}",
        )


async def _hostile_coordination_ids(ctx: CheckContext, ids: list[str]) -> None:
    caps = ctx.session.target.capabilities
    b = ctx.backend
    if C.LOCKS in caps and b.lock is not None:
        for name in ids:
            got = await b.lock.acquire(ctx.id(name), 600_000, ctx.id(name))
            expect(got.acquired, "ids.hostile", f"lock {name!r} was not free")
        for name in ids:
            expect(
                await b.lock.release(ctx.id(name), ctx.id(name)),
                "ids.hostile",
                f"lock {name!r} was not released by its own token",
            )
    if C.NONCES in caps and b.nonces is not None:
        for name in ids:
            expect(await b.nonces.claim(ctx.id(name), 600), "ids.hostile", f"nonce {name!r}")
    if C.IDEMPOTENCY in caps and b.idempotency is not None:
        for i, name in enumerate(ids):
            state = await b.idempotency.claim(ctx.id(name))
            expect(state == "claimed", "ids.hostile", f"idempotency key {name!r}: {state!r}")
            await b.idempotency.complete(ctx.id(name), i)
        for i, name in enumerate(ids):
            result = await b.idempotency.get_result(ctx.id(name))
            expect(
                result == i, "ids.hostile", f"idempotency key {name!r} result {result!r}, want {i}"
            )


@check("capability.declared")
async def declared_capabilities_work(ctx: CheckContext) -> None:
    """Every method of every declared capability is implemented."""
    ctx.about("capability.declared")
    target = ctx.session.target
    caps = target.capabilities
    a = ctx.backend.adapter
    if target.spec is not None:
        # What siglo.connect checks at every connection (siglo.connect.check_capabilities):
        # a backend with a capability its registration leaves out is refused there, so
        # a pass here would certify a backend nobody can connect to.
        unregistered = sorted(c.value for c in ctx.backend.capabilities - caps)
        expect(
            not unregistered,
            "capability.declared",
            f"the backend has {', '.join(unregistered)} but its plugin's registration does "
            "not declare it: siglo.connect refuses such a backend (PluginError); declare the "
            "same set in add_backend(capabilities=...) and on the adapter class",
        )
    calls: dict[Capability, Callable[[], Awaitable[Any]]] = {}
    stack = ctx.id("cap")

    async def noop() -> None:
        return None

    async def checkpoints() -> None:
        await a.save_checkpoint(ctx.checkpoint(stack, 1))
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
