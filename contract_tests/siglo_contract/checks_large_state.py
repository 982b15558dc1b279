"""Focused checks of the large-state rules (SPEC §13): the size guard and incremental
saves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.errors import CheckpointConflictError, DocumentTooLargeError
from siglo.records import ContextChangeEvent
from siglo.sentinel import MISSING
from siglo_contract.checks_checkpoints import same
from siglo_contract.registry import CheckContext, check, expect, fail

GUARD_LIMIT = 4096
"""The document limit the size-guard check puts on the adapter under test (or its own
declared maximum, if smaller): small enough to cross cheaply on every backend."""

DECLARED_LIMIT_CHECKED_UP_TO: Final = 16 * 1024 * 1024
"""The largest declared ``max_document_bytes`` the size-guard check also stores a document
of exactly (by every save path; and refuses one byte more). A limit up to here is a
document store's item size — DynamoDB's 400 KB, Firestore's 1 MiB, Cosmos DB's 2 MB,
MongoDB's 16 MiB — which a backend declares so that siglo refuses a larger document
before its store fails on it mid-run: a declaration larger than what the store holds is
then exactly the failure it exists to prevent, and only a save at the declared size
shows it (a backend declaring 400 KB whose store failed above 200 KB passed every rule:
the guard was crossed at :data:`GUARD_LIMIT` only, and ``checkpoint.incremental``
stores 165 KB at most; a black-box auditor). Writing and reading back 16 MiB four times
takes well under a second in memory. A larger limit is a field maximum (Redis's 512 MiB
string, PostgreSQL's 1 GiB field, SQLite's 10⁹-byte value: every built-in backend's),
which no quick run writes at: for it the guard is checked at :data:`GUARD_LIMIT` and the
documents stored go up to ``checkpoint.incremental``'s, and nothing between those and
the declared limit is written."""

SaveFn = Callable[[Checkpoint, list[ContextChangeEvent], int], Awaitable[None]]
"""``save(checkpoint, changes, expected_revision)``: one of the paths a save takes."""


def _padded(cp: Checkpoint, step: str, size: int) -> Checkpoint:
    """``cp`` with a context ``step`` padded so that its document is ``size`` bytes."""
    probe = cp.replace(contexts={**cp.contexts, step: {"pad": ""}})
    missing = size - len(probe.to_json())
    if missing < 0:
        raise AssertionError(f"cannot pad a {len(probe.to_json())}-byte document to {size}")
    return cp.replace(contexts={**cp.contexts, step: {"pad": "x" * missing}})


def _save_paths(a: StorageAdapter, entry: CacheEntry) -> dict[str, SaveFn]:
    """Every save path the storage manager takes, by what a message calls it: the plain
    save, the streamed save (its context changes), the unlocking one and, with a step
    cache, the caching one (storing ``entry`` too) — a backend may override any of them
    to write in one go."""
    saves: dict[str, SaveFn] = {
        "a plain save": lambda cp, changes, expected: a.save_checkpoint(
            cp, expected_revision=expected
        ),
        "a streamed save": lambda cp, changes, expected: a.save_checkpoint_streamed(
            cp, changes, expected_revision=expected
        ),
        "an unlocking save": lambda cp, changes, expected: a.save_checkpoint_unlocking(
            cp, changes, expected_revision=expected
        ),
    }
    if a.supports(Capability.STEP_CACHE):
        saves["a caching save"] = lambda cp, changes, expected: a.save_checkpoint_caching(
            cp, changes, entry, expected_revision=expected
        )
    return saves


@check("checkpoint.size.guard")
async def checkpoint_size_guard(ctx: CheckContext) -> None:
    """A document of exactly the limit is stored, by every save path; one byte more raises
    DocumentTooLargeError naming the stack, the size, the limit and the largest context,
    and leaves the stored checkpoint and (streamed) the context stream as they were.

    The limit is :data:`GUARD_LIMIT` (the declared one when smaller), put on the adapter
    for the check; then, for a declared ``max_document_bytes`` above it and up to
    :data:`DECLARED_LIMIT_CHECKED_UP_TO`, a document of exactly the declared limit is
    stored by every save path and one byte more refused. A larger declared limit (every
    built-in backend's) is not written at: see :data:`DECLARED_LIMIT_CHECKED_UP_TO`."""
    await _guard_at_lowered_limit(ctx)
    declared = ctx.backend.raw_adapter.max_document_bytes
    if declared is not None and GUARD_LIMIT < declared <= DECLARED_LIMIT_CHECKED_UP_TO:
        await _guard_at_declared_limit(ctx, declared)


async def _guard_at_lowered_limit(ctx: CheckContext) -> None:
    """The guard crossed at :data:`GUARD_LIMIT`: cheap on every backend."""
    ctx.about("checkpoint.size.guard")
    raw = ctx.backend.raw_adapter
    declared = raw.max_document_bytes
    limit = GUARD_LIMIT if declared is None else min(declared, GUARD_LIMIT)
    raw.max_document_bytes = limit
    try:
        a = ctx.backend.adapter
        stack = ctx.id("size-guard")
        first = ctx.checkpoint(stack, 1, contexts={"small": {"n": 1}})
        await a.save_checkpoint(first)
        fits = _padded(ctx.checkpoint(stack, 2, contexts={"small": {"n": 2}}), "big", limit)
        await a.save_checkpoint(fits, expected_revision=1)
        stored = await a.get_checkpoint(stack)
        expect(
            same(stored, fits),
            "checkpoint.size.guard",
            f"a document of exactly the limit ({limit} bytes) was not stored as saved: "
            f"read back {stored!r}",
        )
        over = _padded(ctx.checkpoint(stack, 3, contexts={"small": {"n": 3}}), "big", limit + 1)
        try:
            await a.save_checkpoint(over, expected_revision=2)
        except DocumentTooLargeError as exc:
            expect(
                (exc.stack_id, exc.size, exc.limit) == (stack, limit + 1, limit),
                "checkpoint.size.guard",
                f"the error carries stack_id={exc.stack_id!r}, size={exc.size}, "
                f"limit={exc.limit}; want {stack!r}, {limit + 1}, {limit}",
            )
            expect(
                bool(exc.largest) and exc.largest[0][0] == "big",
                "checkpoint.size.guard",
                f"the error names the largest contexts {exc.largest!r}; want 'big' first",
            )
        else:
            fail(
                "checkpoint.size.guard",
                f"a {limit + 1}-byte document was stored although the limit is {limit}",
            )
        after = await a.get_checkpoint(stack)
        expect(
            same(after, fits),
            "checkpoint.size.guard",
            f"a refused save changed the stored checkpoint into {after!r}",
        )
        # Every save path the storage manager takes but the plain one, checked above.
        streams = a.supports(Capability.CONTEXT_STREAM)
        entry = CacheEntry(key=ctx.id("size-guard-entry"), value={"out": "late"})
        caches = a.supports(Capability.STEP_CACHE)
        # Compared with what a look-up answers before (a miss; how a backend reads a miss
        # is cache.miss's business, not this rule's).
        unset = await a.get_cached_step(entry.key) if caches else MISSING
        saves = _save_paths(a, entry)
        del saves["a plain save"]
        for what, save in saves.items():
            change = ContextChangeEvent(
                stack_id=stack, step_id="big", key="note", timestamp=ctx.now_ms(), value=what
            )
            try:
                await save(over, [change] if streams else [], 2)
            except DocumentTooLargeError:
                pass
            else:
                fail(
                    "checkpoint.size.guard",
                    f"{what} of a {limit + 1}-byte document was stored (limit {limit})",
                )
            if streams:
                streamed = await a.get_context_changes(stack, "big")
                expect(
                    "note" not in streamed,
                    "checkpoint.size.guard",
                    f"{what} refused as too large wrote its context change: {streamed!r}",
                )
            expect(
                same(await a.get_checkpoint(stack), fits),
                "checkpoint.size.guard",
                f"{what} refused as too large changed the stored checkpoint",
            )
            if caches:
                cached = await a.get_cached_step(entry.key)
                expect(
                    cached is unset or cached == unset,
                    "checkpoint.size.guard",
                    f"{what} refused as too large stored a cache entry: {cached!r}",
                )
        # A document of exactly the limit is stored by each of these saves too (a streamed
        # save that refused it, comparing with >=, passed when only the plain save was
        # given one).
        revision = 2
        for what, save in saves.items():
            revision += 1
            exact = _padded(
                ctx.checkpoint(stack, revision, contexts={"small": {"n": revision}}), "big", limit
            )
            try:
                await save(exact, [], revision - 1)
            except DocumentTooLargeError as exc:
                fail(
                    "checkpoint.size.guard",
                    f"{what} of a document of exactly the limit ({limit} bytes) was refused: {exc}",
                )
            stored = await a.get_checkpoint(stack)
            expect(
                same(stored, exact),
                "checkpoint.size.guard",
                f"{what} of a document of exactly the limit ({limit} bytes) was not stored "
                f"as saved: read back {stored!r}",
            )
    finally:
        raw.max_document_bytes = declared


async def _guard_at_declared_limit(ctx: CheckContext, limit: int) -> None:
    """A document of exactly the declared ``limit`` stored by every save path, and one
    byte more refused: the store holds what the backend declares it holds."""
    ctx.about("checkpoint.size.guard")
    a = ctx.backend.adapter
    stack = ctx.id("size-guard-declared")
    entry = CacheEntry(key=ctx.id("size-guard-declared-entry"), value={"out": 1})
    revision = 0
    for what, save in _save_paths(a, entry).items():
        revision += 1
        exact = _padded(
            ctx.checkpoint(stack, revision, contexts={"small": {"n": revision}}), "big", limit
        )
        try:
            await save(exact, [], revision - 1)
        except Exception as exc:
            # The store's own failure (a driver's error for an item too large) as much as
            # the guard's: a document of the declared size must be stored.
            fail(
                "checkpoint.size.guard",
                f"{what} of a document of exactly the declared max_document_bytes "
                f"({limit} bytes) raised {type(exc).__name__}: {exc} — a backend declares "
                "the largest document its store holds",
            )
        stored = await a.get_checkpoint(stack)
        expect(
            same(stored, exact),
            "checkpoint.size.guard",
            f"{what} of a document of exactly the declared max_document_bytes ({limit} "
            "bytes) was not stored as saved: read back "
            + ("nothing" if stored is None else f"{len(stored.to_json())} bytes"),
        )
    over = _padded(
        ctx.checkpoint(stack, revision + 1, contexts={"small": {"n": 0}}), "big", limit + 1
    )
    try:
        await a.save_checkpoint(over, expected_revision=revision)
    except DocumentTooLargeError as exc:
        expect(
            (exc.size, exc.limit) == (limit + 1, limit),
            "checkpoint.size.guard",
            f"a document one byte over the declared limit raised with size={exc.size}, "
            f"limit={exc.limit}; want {limit + 1}, {limit}",
        )
    else:
        fail(
            "checkpoint.size.guard",
            f"a {limit + 1}-byte document was stored although the declared "
            f"max_document_bytes is {limit}",
        )


_OUTPUT: Final = 8_000
_ENTRY: Final = 6_000
"""The sizes of a step's output and of a history entry in :func:`checkpoint_incremental`:
its documents grow past 64 KiB (where the SQL backend saves in parts), to about 165 KB."""


def _grown(
    cp: Checkpoint, revision: int, step: int, sizes: tuple[int, int] = (_OUTPUT, _ENTRY)
) -> Checkpoint:
    """The next checkpoint of a run whose state grows: one context changed, one added,
    one removed every third step, the rest unchanged (as a stack's saves are)."""
    output, entry = sizes
    contexts = {name: dict(ctx) for name, ctx in cp.contexts.items()}
    contexts[f"step-{step}"] = {"output": "o" * output + str(step), "n": step}
    if "history" in contexts:
        contexts["history"]["log"] = contexts["history"]["log"] + ["x" * entry + str(step)]
    if step % 3 == 0:
        contexts.pop(f"step-{step - 2}", None)
    if step == 5:
        # Same content under two steps, and a step moved to the end.
        contexts["copy"] = dict(contexts["history"])
        contexts["first"] = contexts.pop("first")
    if step == 6:
        contexts["copy"] = {"log": []}  # a shared body changed under one of its steps
    return cp.replace(revision=revision, contexts=contexts, timestamp=cp.timestamp + 1)


def _documents(first: Checkpoint, sizes: tuple[int, int]) -> list[Checkpoint]:
    """Every document :func:`checkpoint_incremental` saves or tries to, in order."""
    out, cp = [first], first
    for step in range(2, 16):
        out.append(_grown(cp, step, step + 100, sizes))
        cp = _grown(cp, step, step, sizes)
        out.append(cp)
    small = cp.replace(revision=16, contexts={"first": {"a": 2}})
    restarted = small.replace(contexts={**small.contexts, "history": {"log": []}})
    again = _grown(restarted, 17, 17, sizes)
    return [*out, small, _grown(again, 17, 18, sizes)]


def _sizes_within(first: Checkpoint, limit: int | None) -> tuple[int, int]:
    """The sizes of :func:`_grown` whose largest document fits a backend's declared
    ``limit`` (the size guard would refuse a larger one, by ``checkpoint.size.guard``):
    a store that holds one item up to 64 KB runs the same program, smaller."""
    sizes = (_OUTPUT, _ENTRY)
    while limit is not None and sizes[1] > 1:
        if max(len(d.to_json()) for d in _documents(first, sizes)) <= limit:
            break
        sizes = (max(1, sizes[0] * 3 // 4), max(1, sizes[1] * 3 // 4))
    return sizes


@check("checkpoint.incremental")
async def checkpoint_incremental(ctx: CheckContext) -> None:
    """A run of saves whose contexts grow, change, repeat, move and go (past 64 KiB, where
    the SQL backend saves incrementally, unless the backend declares a smaller
    ``max_document_bytes``: then as large as it holds), with refused saves between them:
    every load returns the document of the last accepted save, byte for byte."""
    ctx.about("checkpoint.incremental")
    a = ctx.backend.adapter
    stack = ctx.id("incremental")
    cp = ctx.checkpoint(stack, 1, contexts={"first": {"a": 1}, "history": {"log": []}})
    sizes = _sizes_within(cp, ctx.backend.raw_adapter.max_document_bytes)
    await a.save_checkpoint(cp, expected_revision=0)
    for step in range(2, 16):
        nxt = _grown(cp, step, step, sizes)
        if step % 4 == 0:
            # A refused save of other contents leaves the stored document as it was.
            stale = _grown(cp, step, step + 100, sizes)
            try:
                await a.save_checkpoint(stale, expected_revision=step - 2)
            except CheckpointConflictError:
                pass
            else:
                fail("checkpoint.incremental", f"a save expecting revision {step - 2} stored")
            got = await a.get_checkpoint(stack)
            expect(
                got is not None and got.to_json() == cp.to_json(),
                "checkpoint.incremental",
                f"after a refused save at revision {step}, read back a document other than "
                f"revision {cp.revision}'s",
            )
        await a.save_checkpoint(nxt, expected_revision=step - 1)
        got = await a.get_checkpoint(stack)
        if got is None or got.to_json() != nxt.to_json():
            want = set(nxt.contexts)
            have = set() if got is None else set(got.contexts)
            changed = sorted(
                s for s in want & have if got is not None and got.contexts[s] != nxt.contexts[s]
            )
            fail(
                "checkpoint.incremental",
                f"revision {step} ({len(nxt.to_json())} bytes) read back differently: "
                f"missing contexts {sorted(want - have)}, extra {sorted(have - want)}, "
                f"different {changed}"
                + ("" if got is None or got != nxt else " (equal, not the same bytes)"),
            )
        cp = nxt
    # Shrinking back to a small document (stored whole on SQL) and growing again.
    small = cp.replace(revision=16, contexts={"first": {"a": 2}})
    await a.save_checkpoint(small, expected_revision=15)
    got = await a.get_checkpoint(stack)
    expect(
        got is not None and got.to_json() == small.to_json(),
        "checkpoint.incremental",
        f"a document shrunk to {len(small.to_json())} bytes read back as {got!r}",
    )
    again = _grown(
        small.replace(contexts={**small.contexts, "history": {"log": []}}), 17, 17, sizes
    )
    again = _grown(again, 17, 18, sizes)
    await a.save_checkpoint(again, expected_revision=16)
    got = await a.get_checkpoint(stack)
    expect(
        got is not None and got.to_json() == again.to_json(),
        "checkpoint.incremental",
        "a document grown again after shrinking read back differently",
    )
