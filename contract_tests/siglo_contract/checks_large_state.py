"""Focused checks of the large-state rules (SPEC §13): the size guard."""

from __future__ import annotations

from siglo.adapter import Capability
from siglo.checkpoint import Checkpoint
from siglo.errors import DocumentTooLargeError
from siglo.records import ContextChangeEvent
from siglo_contract.checks_checkpoints import same
from siglo_contract.registry import CheckContext, check, expect, fail

GUARD_LIMIT = 4096
"""The document limit the size-guard check puts on the adapter under test (or its own
declared maximum, if smaller): small enough to cross cheaply on every backend."""


def _padded(cp: Checkpoint, step: str, size: int) -> Checkpoint:
    """``cp`` with a context ``step`` padded so that its document is ``size`` bytes."""
    probe = cp.replace(contexts={**cp.contexts, step: {"pad": ""}})
    missing = size - len(probe.to_json())
    if missing < 0:
        raise AssertionError(f"cannot pad a {len(probe.to_json())}-byte document to {size}")
    return cp.replace(contexts={**cp.contexts, step: {"pad": "x" * missing}})


@check("checkpoint.size.guard")
async def checkpoint_size_guard(ctx: CheckContext) -> None:
    """A document of exactly the limit is stored; one byte more raises
    DocumentTooLargeError naming the stack, the size, the limit and the largest context,
    and leaves the stored checkpoint and (streamed) the context stream as they were."""
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
        if not a.supports(Capability.CONTEXT_STREAM):
            return
        change = ContextChangeEvent(
            stack_id=stack, step_id="big", key="note", timestamp=ctx.now_ms(), value="late"
        )
        try:
            await a.save_checkpoint_streamed(over, [change], expected_revision=2)
        except DocumentTooLargeError:
            pass
        else:
            fail(
                "checkpoint.size.guard",
                f"a streamed save of a {limit + 1}-byte document was stored (limit {limit})",
            )
        streamed = await a.get_context_changes(stack, "big")
        expect(
            "note" not in streamed,
            "checkpoint.size.guard",
            f"a streamed save refused as too large wrote its context change: {streamed!r}",
        )
        expect(
            same(await a.get_checkpoint(stack), fits),
            "checkpoint.size.guard",
            "a streamed save refused as too large changed the stored checkpoint",
        )
    finally:
        raw.max_document_bytes = declared
