"""Focused checks of the checkpoint rules: one deterministic scenario per rule, so each
is caught whatever the seed (the checkpoint machine adds the random interleavings)."""

from __future__ import annotations

import base64
from typing import Any, Final

import orjson

from siglo.adapter import Capability
from siglo.checkpoint import Checkpoint
from siglo.errors import CheckpointConflictError, InvalidArgumentError
from siglo.keys import SettingsKeyProvider
from siglo.records import WaitRecord
from siglo.sealing import SEALED_KEY, Location, Sealer
from siglo.sentinel import MISSING
from siglo_contract.machine_base import canon
from siglo_contract.registry import CheckContext, check, expect, fail

BIG = 2**60
"""A revision far above 32 bits; ``2**53`` and ``2**53 + 1`` are also used (equal as
doubles, different as revisions)."""


def same(a: Checkpoint | None, b: Checkpoint | None) -> bool:
    """Equal, with ``0``, ``False`` and ``0.0`` told apart."""
    if a is None or b is None:
        return a is b
    return a == b and canon(a.to_wire()) == canon(b.to_wire())


async def _conflict(
    ctx: CheckContext, rule_id: str, cp: Checkpoint, expected: int | None
) -> CheckpointConflictError:
    """Save ``cp``; it must raise a conflict (else ``rule_id`` fails) and change nothing."""
    a = ctx.backend.adapter
    before = await a.get_checkpoint(cp.stack_id, cp.namespace, fallback=False)
    try:
        await a.save_checkpoint(cp, expected_revision=expected)
    except CheckpointConflictError as exc:
        after = await a.get_checkpoint(cp.stack_id, cp.namespace, fallback=False)
        expect(
            same(after, before),
            rule_id,
            f"a refused save of revision {cp.revision} (expected_revision={expected}) "
            f"changed {before!r} into {after!r}",
        )
        expect(
            (exc.stack_id, exc.expected_revision) == (cp.stack_id, expected),
            rule_id,
            f"the conflict carries stack_id={exc.stack_id!r}, expected_revision="
            f"{exc.expected_revision!r}; want {cp.stack_id!r}, {expected!r}",
        )
        want = None if before is None else before.revision
        expect(
            exc.current_revision == want,
            rule_id,
            f"the conflict carries current_revision={exc.current_revision!r}, "
            f"the stored revision is {want!r}",
        )
        return exc
    fail(
        rule_id,
        f"a save of revision {cp.revision} with expected_revision={expected} was accepted "
        f"although {before and before.revision!r} was stored",
    )


async def _stores(ctx: CheckContext, rule_id: str, cp: Checkpoint, expected: int | None) -> None:
    """Save ``cp``; it must be stored (else ``rule_id`` fails)."""
    a = ctx.backend.adapter
    try:
        await a.save_checkpoint(cp, expected_revision=expected)
    except CheckpointConflictError as exc:
        fail(rule_id, f"a save of revision {cp.revision} (expected_revision={expected}): {exc}")
    got = await a.get_checkpoint(cp.stack_id, cp.namespace, fallback=False)
    expect(
        got is not None and got.revision == cp.revision,
        rule_id,
        f"saved revision {cp.revision} (expected_revision={expected}), read back {got!r}",
    )


@check("checkpoint.roundtrip")
async def checkpoint_roundtrip(ctx: CheckContext) -> None:
    """Every field reads back equal: varied contexts (falsy values, ``:`` in keys, nulls
    in nested objects), empty, absent and falsy-valued metadata, unknown wire fields; a
    re-save replaces the whole document."""
    ctx.about("checkpoint.roundtrip")
    a = ctx.backend.adapter
    stack = ctx.id("full")
    contexts: dict[str, Any] = {
        "x": {
            "k": [1, {"n": None}, [], {}],
            "empty": {},
            "list": [],
            "ü名🙂": "ünï",
            "float": 1.5,
            "false": False,
            "zero": 0,
            "big": 2**53 + 1,
            "neg": -(2**40),
            "text": 'q"\\\n\t',
            "blank": "",
            "a:b": "colon",
            "nested": {"a": {"n": None}},
        },
        "y": {},
        "z": {"deep": {"a": {"b": {"c": [[{"d": [None]}]]}}}},
        "many": {f"f{i}": i for i in range(60)},
    }
    variants = [
        ctx.checkpoint(
            stack,
            3,
            workflow_id="wf:1",
            status="waiting",
            type="custom-type",
            chains=("x", "y", "z", "many"),
            contexts=contexts,
            # Falsy scalars too: a backend that drops them loses what a user stored.
            metadata={"m": {}, "list": [1, "two", None], "f": False, "e": "", "z": 0, "n": None},
            expires_at=ctx.now_ms() + 3_600_000,
            extra={"unknownField": {"kept": [1, 2]}, "nullField": None},
        ),
        # Unknown wire fields of every JSON kind, falsy ones too.
        ctx.checkpoint(
            stack,
            4,
            metadata={},
            extra={
                "textField": "t",
                "numberField": 2.5,
                "listField": [1, None],
                "trueField": True,
                "zeroField": 0,
                "falseField": False,
                "blankField": "",
                "emptyList": [],
            },
        ),
        ctx.checkpoint(stack, 5, metadata={}),
        ctx.checkpoint(stack, 6, metadata=None, contexts={}, chains=()),
        ctx.checkpoint(stack, 7, contexts={"only": {"v": None}}, chains=("only",), metadata={}),
    ]
    for cp in variants:
        await a.save_checkpoint(cp)
        got = await a.get_checkpoint(stack)
        expect(same(got, cp), "checkpoint.roundtrip", f"saved {cp!r}, read back {got!r}")
        expect(
            got is not None and dict(got.extra) == dict(cp.extra),
            "checkpoint.roundtrip",
            f"unknown wire fields {dict(cp.extra)!r} read back as {got and dict(got.extra)!r}",
        )
    namespaced = ctx.checkpoint(stack, 1, namespace=ctx.id("ns"), metadata={})
    await a.save_checkpoint(namespaced)
    got = await a.get_checkpoint(stack, ctx.id("ns"), fallback=False)
    expect(same(got, namespaced), "checkpoint.roundtrip", f"read back {got!r}")


_EVERY_BASE64_CHARACTER = "v1.ez.k-1_Z.AZaz09-_AZaz09-_.AZaz09-_+/=AZaz09-_"
"""A sealed value with every character of the envelope alphabet (and a few outside it a
third party's codec might use): any rewriting of one shows."""


def _sealer() -> Sealer | None:
    """siglo's codec chain with a fixed test key, compressing, when the encryption extra
    is installed; ``None`` on a core install (``siglo check`` needs no extra)."""
    try:
        return Sealer(SettingsKeyProvider({"k1": b"\x07" * 32}), compress_min_bytes=64)
    except InvalidArgumentError:  # zstandard or cryptography not installed
        return None


async def _seal(sealer: Sealer | None, value: Any, where: Location) -> dict[str, Any]:
    """``value`` sealed, or (without the extra) a made-up envelope of the same shape whose
    data is ``value``'s JSON in the envelope's alphabet."""
    if sealer is not None:
        sealed: dict[str, Any] = await sealer.seal(value, where)
        return sealed
    data = base64.urlsafe_b64encode(orjson.dumps(value)).decode()
    return {SEALED_KEY: f"v1.ez.k1.{_EVERY_BASE64_CHARACTER[-12:]}.{data}"}


@check("payload.byte-faithful")
async def payload_byte_faithful(ctx: CheckContext) -> None:
    """Sealed values as siglo's codec chain writes them — encrypted and compressed, as
    step contexts, metadata, wait payloads and cached values — read back exactly, and
    the encrypted ones still decrypt where they were written."""
    ctx.about("payload.byte-faithful")
    a = ctx.backend.adapter
    sealer = _sealer()
    stack, ns = ctx.id("sealed"), ctx.id("tenant")
    big = {"text": "é" * 300, "n": list(range(50))}
    contexts = {
        "small": await _seal(
            sealer, {"card": "4111"}, Location(ns, stack, "checkpoint", "contexts.small")
        ),
        "big": await _seal(sealer, big, Location(ns, stack, "checkpoint", "contexts.big")),
        "made": {SEALED_KEY: _EVERY_BASE64_CHARACTER},
    }
    metadata = {
        "redactFields": ["cvv"],
        **await _seal(sealer, {"who": "x"}, Location(ns, stack, "checkpoint", "metadata")),
    }
    saved = ctx.checkpoint(stack, 1, namespace=ns, contexts=contexts, metadata=metadata)
    await a.save_checkpoint(saved, expected_revision=0)
    got = await a.get_checkpoint(stack, ns, fallback=False)
    expect(
        got is not None and dict(got.contexts) == contexts and got.metadata == metadata,
        "payload.byte-faithful",
        f"saved sealed contexts {contexts!r} and metadata {metadata!r}, read back "
        f"{got and dict(got.contexts)!r} and {got and got.metadata!r}",
    )
    if sealer is not None and got is not None and dict(got.contexts) == contexts:
        opened = await sealer.open(
            got.contexts["big"], Location(ns, stack, "checkpoint", "contexts.big")
        )
        expect(opened == big, "payload.byte-faithful", "a sealed context no longer decrypts")
    if Capability.WAIT_RECORDS in ctx.session.target.capabilities:
        key = ctx.id("sealed-wait")
        payload = {SEALED_KEY: _EVERY_BASE64_CHARACTER}
        record = WaitRecord(
            correlation_key=key,
            stack_id=stack,
            namespace=ns,
            event_payload=payload,
            metadata={SEALED_KEY: _EVERY_BASE64_CHARACTER[::-1]},
        )
        await a.save_wait_record(record)
        found = await a.get_wait_record(key, namespace=ns)
        expect(
            found is not None
            and found.event_payload == payload
            and found.metadata == record.metadata,
            "payload.byte-faithful",
            f"saved a wait record with sealed payloads {record!r}, read back {found!r}",
        )
    if Capability.STEP_CACHE in ctx.session.target.capabilities:
        key = ctx.id("sealed-step")
        value = await _seal(sealer, big, Location(None, key, "step", "value"))
        await a.set_cached_step(key, value)
        cached = await a.get_cached_step(key)
        expect(
            cached is not MISSING and cached == value,
            "payload.byte-faithful",
            f"cached the sealed value {value!r}, read back {cached!r}",
        )


def _blame_found(got: Checkpoint | None, stack: str, ns: str | None, fallback: bool) -> str:
    """The rule a get broke by returning ``got`` where nothing should be found: another
    namespace's checkpoint is a leak, the un-namespaced one a fallback that should not
    have happened; anything else is a checkpoint made up."""
    if got is not None and got.stack_id == stack and got.namespace != ns:
        if got.namespace is not None:
            return "checkpoint.namespace.isolation"
        if ns is not None and not fallback:
            return "checkpoint.namespace.fallback"
    return "checkpoint.missing"


@check("checkpoint.missing")
async def checkpoint_missing(ctx: CheckContext) -> None:
    """Stacks never saved read as None, also next to similar ids and in namespaces."""
    ctx.about("checkpoint.missing")
    a = ctx.backend.adapter
    await a.save_checkpoint(ctx.checkpoint(ctx.id("ab"), 1))
    await a.save_checkpoint(ctx.checkpoint(ctx.id("a"), 1, namespace=ctx.id("n")))
    for stack, ns, fallback in (
        (ctx.id("never"), None, True),
        (ctx.id("a"), None, True),
        (ctx.id("A"), None, True),
        (ctx.id("ab "), None, True),
        (ctx.id("never"), ctx.id("n"), True),
        (ctx.id("a"), ctx.id("other"), True),
        (ctx.id("ab"), ctx.id("n"), False),
    ):
        got = await a.get_checkpoint(stack, ns, fallback=fallback)
        expect(
            got is None,
            _blame_found(got, stack, ns, fallback),
            f"get_checkpoint({stack!r}, {ns!r}, fallback={fallback}) of a stack never saved "
            f"there returned {got!r}",
        )


@check("checkpoint.occ.expected")
async def checkpoint_occ_expected(ctx: CheckContext) -> None:
    """The right expected_revision stores: an absent checkpoint and one stored at
    revision 0 are both revision 0; huge revisions are exact."""
    ctx.about("checkpoint.occ.expected")
    rule_id = "checkpoint.occ.expected"
    stack = ctx.id("cas")
    await _stores(ctx, rule_id, ctx.checkpoint(stack, 1), 0)
    for revision in (2, 3, 10):
        await _stores(
            ctx, rule_id, ctx.checkpoint(stack, revision), revision - 1 if revision < 10 else 3
        )
    zero = ctx.id("zero")
    await _stores(ctx, rule_id, ctx.checkpoint(zero, 0), None)
    await _stores(ctx, rule_id, ctx.checkpoint(zero, 1), 0)
    big = ctx.id("big")
    await _stores(ctx, rule_id, ctx.checkpoint(big, BIG), None)
    await _stores(ctx, rule_id, ctx.checkpoint(big, BIG + 1), BIG)
    near = ctx.id("2**53")
    await _stores(ctx, rule_id, ctx.checkpoint(near, 2**53), 0)
    await _stores(ctx, rule_id, ctx.checkpoint(near, 2**53 + 1), 2**53)
    await _stores(ctx, rule_id, ctx.checkpoint(near, 2**53 + 2), 2**53 + 1)


@check("checkpoint.occ.conflict")
async def checkpoint_occ_conflict(ctx: CheckContext) -> None:
    """A wrong expected_revision (above, below, on an absent stack, off by one from a huge
    revision) raises a conflict carrying the stored revision; nothing changes."""
    ctx.about("checkpoint.occ.conflict")
    rule_id = "checkpoint.occ.conflict"
    stack = ctx.id("cas")
    await ctx.backend.adapter.save_checkpoint(ctx.checkpoint(stack, 2, metadata={"v": 2}))
    for revision, expected in ((5, 3), (5, 1), (3, 0), (2**53 + 3, 2**53 + 2)):
        await _conflict(ctx, rule_id, ctx.checkpoint(stack, revision, status="failed"), expected)
    absent = ctx.id("absent")
    await _conflict(ctx, rule_id, ctx.checkpoint(absent, 5), 3)
    await _conflict(ctx, rule_id, ctx.checkpoint(absent, 2), 1)
    zero = ctx.id("zero")
    await ctx.backend.adapter.save_checkpoint(ctx.checkpoint(zero, 0))
    await _conflict(ctx, rule_id, ctx.checkpoint(zero, 2), 1)
    big = ctx.id("big")
    await ctx.backend.adapter.save_checkpoint(ctx.checkpoint(big, BIG + 1))
    await _conflict(ctx, rule_id, ctx.checkpoint(big, BIG + 3), BIG)
    await _conflict(ctx, rule_id, ctx.checkpoint(big, BIG + 3), BIG + 2)


@check("checkpoint.occ.monotonic")
async def checkpoint_occ_monotonic(ctx: CheckContext) -> None:
    """Without expected_revision a save must move the revision forward: the same or a
    lower revision conflicts and changes nothing; a higher one stores."""
    ctx.about("checkpoint.occ.monotonic")
    rule_id = "checkpoint.occ.monotonic"
    stack = ctx.id("plain")
    await _stores(ctx, rule_id, ctx.checkpoint(stack, 2, metadata={"v": 2}), None)
    for revision in (2, 1, 0):
        await _conflict(ctx, rule_id, ctx.checkpoint(stack, revision, status="failed"), None)
    await _stores(ctx, rule_id, ctx.checkpoint(stack, 3), None)
    await _stores(ctx, rule_id, ctx.checkpoint(stack, 7), None)
    await _conflict(ctx, rule_id, ctx.checkpoint(stack, 7, metadata={"sideways": True}), None)
    zero = ctx.id("zero")
    await _stores(ctx, rule_id, ctx.checkpoint(zero, 0), None)
    await _conflict(ctx, rule_id, ctx.checkpoint(zero, 0, metadata={}), None)
    near = ctx.id("2**53")
    await _stores(ctx, rule_id, ctx.checkpoint(near, 2**53), None)
    await _stores(ctx, rule_id, ctx.checkpoint(near, 2**53 + 1), None)
    await _conflict(ctx, rule_id, ctx.checkpoint(near, 2**53 + 1), None)
    await _conflict(ctx, rule_id, ctx.checkpoint(near, 2**53), None)
    big = ctx.id("big")
    await _stores(ctx, rule_id, ctx.checkpoint(big, BIG), None)
    await _conflict(ctx, rule_id, ctx.checkpoint(big, BIG - 1), None)


async def _namespace_not_joined(ctx: CheckContext) -> None:
    """Namespace ``N`` with stack ``x:y``, namespace ``N:x`` with stack ``y`` and the
    un-namespaced stack ``N:x:y`` are three checkpoints (``:`` is data, ids.hostile): a
    backend that keys a checkpoint by the namespace and the stack id joined with ``:``
    gives one tenant another's row."""
    rule = "checkpoint.namespace.isolation"
    a = ctx.backend.adapter
    ns, left, right = ctx.id("joined"), ctx.id("x"), ctx.id("y")
    rows: list[tuple[str | None, str]] = [
        (ns, f"{left}:{right}"),
        (f"{ns}:{left}", right),
        (None, f"{ns}:{left}:{right}"),
    ]
    saved: list[tuple[str | None, str]] = []
    for namespace, stack in rows:
        for other_ns, other_stack in rows:
            if (other_ns, other_stack) in saved:
                continue
            got = await a.get_checkpoint(other_stack, other_ns, fallback=False)
            expect(
                got is None,
                rule,
                f"after saves of {saved!r} (namespace, stack id), get_checkpoint("
                f"{other_stack!r}, {other_ns!r}, fallback=False) returned {got!r}",
            )
        try:
            await a.save_checkpoint(
                ctx.checkpoint(stack, 1, namespace=namespace, metadata={"at": [namespace, stack]}),
                expected_revision=0,
            )
        except CheckpointConflictError as exc:
            fail(
                rule,
                f"the first save of stack {stack!r} in namespace {namespace!r} conflicted "
                f"after saves of {saved!r} (namespace, stack id): {exc}",
            )
        saved.append((namespace, stack))
    for namespace, stack in rows:
        got = await a.get_checkpoint(stack, namespace, fallback=False)
        expect(
            got is not None
            and (got.namespace, got.stack_id) == (namespace, stack)
            and got.metadata == {"at": [namespace, stack]},
            rule,
            f"get_checkpoint({stack!r}, {namespace!r}) returned {got!r}, not its own "
            f"checkpoint (saved beside {rows!r})",
        )


@check("checkpoint.namespace.fallback", "checkpoint.namespace.isolation")
async def namespace_lookups(ctx: CheckContext) -> None:
    """Namespaced reads fall back to the un-namespaced checkpoint, never to another ns;
    each namespace has its own revisions, conflicts and clean-up, and is never joined
    with a stack id into one key (namespace N, stack x:y is not namespace N:x, stack y)."""
    a = ctx.backend.adapter
    stack, ns_a, ns_b, ns_c = ctx.id("s"), ctx.id("a"), ctx.id("b"), ctx.id("c")
    ctx.about("checkpoint.namespace.isolation")
    await a.save_checkpoint(ctx.checkpoint(stack, 5, namespace=ns_a, metadata={"at": "a"}))
    try:
        await a.save_checkpoint(ctx.checkpoint(stack, 1, namespace=ns_b, metadata={"at": "b"}))
        await a.save_checkpoint(
            ctx.checkpoint(stack, 1, namespace=ns_c, metadata={"at": "c"}), expected_revision=0
        )
    except CheckpointConflictError as exc:
        fail(
            "checkpoint.namespace.isolation",
            f"a save in a fresh namespace conflicted with another namespace's: {exc}",
        )
    for ns, want in ((ns_a, 5), (ns_b, 1), (ns_c, 1)):
        got = await a.get_checkpoint(stack, ns)
        expect(
            got is not None and got.revision == want and got.namespace == ns,
            "checkpoint.namespace.isolation",
            f"namespace {ns!r} reads {got!r}, want its own revision {want}",
        )
    conflict = await _conflict(
        ctx, "checkpoint.namespace.isolation", ctx.checkpoint(stack, 9, namespace=ns_b), 4
    )
    expect(
        conflict.current_revision == 1,
        "checkpoint.namespace.isolation",
        "a conflict in namespace b carried another namespace's revision "
        f"{conflict.current_revision}",
    )
    await a.save_checkpoint(
        ctx.checkpoint(ctx.id("gone"), 1, namespace=ns_a, expires_at=ctx.now_ms() - 1)
    )
    await a.save_checkpoint(ctx.checkpoint(ctx.id("gone"), 1, namespace=ns_b))
    await a.save_checkpoint(ctx.checkpoint(ctx.id("control"), 1, namespace=ns_a))
    await a.clean_expired_checkpoints()
    got = await a.get_checkpoint(ctx.id("gone"), ns_b)
    control = await a.get_checkpoint(ctx.id("control"), ns_a)
    expect(
        got is not None,
        # A clean-up that removes live checkpoints everywhere breaks its own rule; one that
        # keeps them but takes another namespace's along breaks isolation.
        "checkpoint.namespace.isolation" if control is not None else "checkpoint.expiry.clean",
        "clean-up of an expired checkpoint in namespace a removed namespace b's",
    )
    await _namespace_not_joined(ctx)
    ctx.about("checkpoint.namespace.fallback")
    expect(
        await a.get_checkpoint(stack) is None,
        "checkpoint.namespace.fallback",
        "get_checkpoint without a namespace returned a namespaced checkpoint",
    )
    expect(
        await a.get_checkpoint(stack, ctx.id("d")) is None,
        "checkpoint.namespace.fallback",
        "a get in an empty namespace fell back to another namespace",
    )
    await a.save_checkpoint(ctx.checkpoint(stack, 3, metadata={"at": "root"}))
    got = await a.get_checkpoint(stack, ctx.id("d"))
    expect(
        got is not None and got.namespace is None and got.metadata == {"at": "root"},
        "checkpoint.namespace.fallback",
        f"get in an empty namespace returned {got!r}, not the un-namespaced checkpoint",
    )
    expect(
        await a.get_checkpoint(stack, ctx.id("d"), fallback=False) is None,
        "checkpoint.namespace.fallback",
        "fallback=False still fell back",
    )
    got = await a.get_checkpoint(stack)
    expect(
        got is not None and got.metadata == {"at": "root"},
        "checkpoint.namespace.fallback",
        f"an un-namespaced get returned {got!r}",
    )
    got = await a.get_checkpoint(stack, ns_a)
    expect(
        got is not None and got.metadata == {"at": "a"},
        "checkpoint.namespace.isolation",
        f"namespace a now reads {got!r}",
    )


@check("checkpoint.retention")
async def checkpoint_retention(ctx: CheckContext) -> None:
    """Opened with a short ``checkpoint_ttl_ms``, a checkpoint saved without
    ``expires_at`` is there until it passes, counted from its save whatever its own
    timestamp says (one stamped long before, as an import or a slow clock writes it, is
    kept as long), and gone after: not returned, its stack saved again from revision 0."""
    ctx.about("checkpoint.retention")
    ttl = ctx.short_ttl_ms()
    async with ctx.session.backend_with(checkpoint_ttl_ms=ttl) as short:
        a = short.adapter
        stack = ctx.id("retained")
        await a.save_checkpoint(ctx.checkpoint(stack, 3))
        got = await a.get_checkpoint(stack)
        expect(got is not None, "checkpoint.retention", "a checkpoint was gone at once")
        stamped = ctx.id("stamped-before")
        await a.save_checkpoint(
            ctx.checkpoint(stamped, 1).replace(timestamp=max(1, ctx.now_ms() - 100 * ttl))
        )
        expect(
            await a.get_checkpoint(stamped) is not None,
            "checkpoint.retention",
            "a checkpoint whose timestamp is older than checkpoint_ttl_ms was gone at once: "
            "the retention is counted from the save, not from the checkpoint's timestamp",
        )
        await ctx.pass_time(ttl)
        got = await a.get_checkpoint(stack)
        expect(
            got is None,
            "checkpoint.retention",
            f"a checkpoint saved without expires_at was returned after checkpoint_ttl_ms="
            f"{ttl}: {got!r}",
        )
        try:
            await a.save_checkpoint(ctx.checkpoint(stack, 1), expected_revision=0)
        except CheckpointConflictError as exc:
            fail("checkpoint.retention", f"a save after its retention conflicted: {exc}")
    if not ctx.clock_controlled:
        return  # ten years pass only on a clock the suite moves
    # A user's default, checkpoint_ttl_ms=None: kept until deleted (a backend that took
    # None for some retention of its own passed every check before).
    async with ctx.session.backend_with(checkpoint_ttl_ms=None) as kept:
        stack = ctx.id("kept-without-retention")
        await kept.adapter.save_checkpoint(ctx.checkpoint(stack, 1))
        await ctx.pass_time(TEN_YEARS_MS)
        got = await kept.adapter.get_checkpoint(stack)
        expect(
            got is not None,
            "checkpoint.retention",
            "opened with checkpoint_ttl_ms=None (no retention, a user's default), a "
            "checkpoint saved without expires_at was gone ten years later: it is kept "
            "until deleted",
        )


TEN_YEARS_MS: Final = 10 * 365 * 24 * 3600 * 1000
"""How long a checkpoint kept without retention is checked to stay (a manual clock)."""


@check("checkpoint.expiry.hidden", "checkpoint.expiry.clean")
async def checkpoint_expiry_in_time(ctx: CheckContext) -> None:
    """A checkpoint expires when its time comes, clean-up or not, and the stack is free;
    clean-up keeps live checkpoints."""
    a = ctx.backend.adapter
    ttl = ctx.short_ttl_ms()
    keep, past, far = ctx.id("kept"), ctx.id("past"), ctx.id("far")
    ctx.about("checkpoint.expiry.hidden")
    await a.save_checkpoint(ctx.checkpoint(past, 4, expires_at=ctx.now_ms() - 1))
    got = await a.get_checkpoint(past)
    expect(got is None, "checkpoint.expiry.hidden", f"an expired checkpoint returned: {got!r}")
    try:
        await a.save_checkpoint(ctx.checkpoint(past, 1), expected_revision=0)
    except CheckpointConflictError as exc:
        fail("checkpoint.expiry.hidden", f"a save over an expired checkpoint conflicted: {exc}")
    for attempt in range(4):
        # Read back before it expires; a machine so busy that the save and the read
        # outlasted the TTL (a real clock: 0.3 s) decides nothing, and the TTL grows: a
        # backend fails only for a checkpoint missing while it was still live.
        stack = ctx.id(f"expiring-{attempt}")
        expires_at = ctx.now_ms() + ttl
        await a.save_checkpoint(ctx.checkpoint(stack, 5, expires_at=expires_at))
        got = await a.get_checkpoint(stack)
        if got is not None or ctx.now_ms() < expires_at:
            break
        ttl *= 4
    expect(got is not None, "checkpoint.expiry.hidden", "a live checkpoint was not returned")
    await a.save_checkpoint(ctx.checkpoint(keep, 1))
    await a.save_checkpoint(ctx.checkpoint(far, 1, expires_at=ctx.now_ms() + 3_600_000))
    await a.save_checkpoint(ctx.checkpoint(ctx.id("huge"), 1, expires_at=2**62))
    await ctx.pass_time(max(0, expires_at - ctx.now_ms()) + 1)
    got = await a.get_checkpoint(stack)
    expect(got is None, "checkpoint.expiry.hidden", f"expired checkpoint returned: {got!r}")
    try:
        await a.save_checkpoint(ctx.checkpoint(stack, 1))
    except CheckpointConflictError as exc:
        fail("checkpoint.expiry.hidden", f"a plain save after expiry conflicted: {exc}")
    ctx.about("checkpoint.expiry.clean")
    await a.save_checkpoint(ctx.checkpoint(ctx.id("old"), 1, expires_at=ctx.now_ms() - 1))
    count = await a.clean_expired_checkpoints()
    expect(
        type(count) is int and count >= 0,
        "checkpoint.expiry.clean",
        f"clean_expired_checkpoints returned {count!r}, not a count >= 0",
    )
    for live in (keep, far, stack, ctx.id("huge")):
        expect(
            await a.get_checkpoint(live) is not None,
            "checkpoint.expiry.clean",
            f"clean_expired_checkpoints removed the live checkpoint {live!r}",
        )
    expect(
        await a.get_checkpoint(ctx.id("old")) is None,
        "checkpoint.expiry.hidden",
        "an expired checkpoint was returned after clean-up",
    )
    if ctx.session.clock is not None:
        # "Afterwards no expired checkpoint is stored": a backend on the suite's clock
        # decides expiry by it, not by its store's own (native expiry may return 0), so
        # its clean-up removes what expired and says so, and a second one finds nothing
        # left — a clean-up that removed nothing passed before (a black-box auditor).
        gone = ctx.id("gone")
        await a.save_checkpoint(ctx.checkpoint(gone, 1, expires_at=ctx.now_ms() + ttl))
        await ctx.pass_time(ttl)
        removed = await a.clean_expired_checkpoints()
        expect(
            removed >= 1,
            "checkpoint.expiry.clean",
            f"clean_expired_checkpoints removed {removed} checkpoints with one expired by "
            "the backend's own clock: it is left stored",
        )
        again = await a.clean_expired_checkpoints()
        expect(
            again == 0,
            "checkpoint.expiry.clean",
            f"a second clean_expired_checkpoints removed {again} more: the first left "
            "expired checkpoints stored",
        )
