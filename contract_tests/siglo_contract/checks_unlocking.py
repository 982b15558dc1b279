"""The focused check of ``save_checkpoint_unlocking``: an action's last save, which a
backend may send together with the release of the workflow lock the action holds."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from siglo.adapter import Capability, StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.errors import CheckpointConflictError, InvalidArgumentError, LockNotAcquiredError
from siglo.records import ContextChangeEvent
from siglo_contract.registry import CheckContext, check, expect, fail
from siglo_contract.target import USER_DEFAULTS

_RULE: Final = "lock.workflow.unlocking-save"

ENTER_WITHIN_MS: Final = 2_000
"""How long the next holder may wait for a lock that must be free (a sound backend's is
free at once; one released only by its TTL is not)."""


@check(_RULE, requires=(Capability.CHECKPOINTS,))
async def workflow_lock_unlocking_save(ctx: CheckContext) -> None:
    """save_checkpoint_unlocking stores as save_checkpoint_streamed does, and the lock is
    free once the action returns but never before the save has landed; a refused
    compare-and-set is raised and frees it all the same; bad input, or another stack's
    save, leaves it held; outside a lock it is a plain save."""
    ctx.about(_RULE)
    await _Unlocking(ctx, ctx.backend.adapter).run()
    # A user's defaults (no checkpoint retention) take another path on some backends:
    # PostgreSQL sends the change, the save and the release in one round trip.
    async with ctx.session.backend_with(**USER_DEFAULTS) as plain:
        await _Unlocking(ctx, plain.adapter).run()


class _Unlocking:
    def __init__(self, ctx: CheckContext, adapter: StorageAdapter) -> None:
        self.ctx = ctx
        self.a = adapter
        self.stack = ctx.id("wf-unlock")
        self.streams = adapter.supports(Capability.CONTEXT_STREAM)

    def cp(self, revision: int, stack: str | None = None) -> Checkpoint:
        return self.ctx.checkpoint(stack or self.stack, revision, contexts={"p": {"rev": revision}})

    def changes(self, revision: int) -> list[ContextChangeEvent]:
        if not self.streams:
            return []
        change = ContextChangeEvent(
            stack_id=self.stack,
            step_id="p",
            key="rev",
            value=revision,
            timestamp=self.ctx.now_ms(),
        )
        return [change]

    async def unlocking(
        self, revision: int, expected: int | None, stack: str | None = None
    ) -> None:
        await self.a.save_checkpoint_unlocking(
            self.cp(revision, stack), self.changes(revision), expected_revision=expected
        )

    async def stored_revision(self, stack: str | None = None) -> int | None:
        got = await self.a.get_checkpoint(stack or self.stack)
        return None if got is None else got.revision

    async def held_elsewhere(self) -> bool:
        """Whether another caller finds the stack's lock taken (waiting briefly)."""

        async def enter() -> None:
            return None

        try:
            await self.a.with_workflow_lock(self.stack, enter, timeout_ms=50)
        except LockNotAcquiredError:
            return True
        return False

    async def next_holder_reads(
        self, revision: int, after: str, streamed: int | None = None
    ) -> None:
        """The next holder enters at once and reads ``revision``, and in the stream the
        last change recorded (``streamed``, by default the revision's own)."""

        async def read() -> tuple[int | None, dict[str, Any]]:
            stream = {}
            if self.streams:
                stream = await self.a.get_context_changes(self.stack, "p")
            return await self.stored_revision(), stream

        try:
            got, stream = await asyncio.wait_for(
                self.a.with_workflow_lock(self.stack, read, timeout_ms=ENTER_WITHIN_MS),
                ENTER_WITHIN_MS / 1000 + 5,
            )
        except (LockNotAcquiredError, TimeoutError):
            fail(_RULE, f"the lock was still held {ENTER_WITHIN_MS} ms after {after}")
        expect(
            got == revision,
            _RULE,
            f"the next holder read revision {got} after {after}; want {revision}",
        )
        want = revision if streamed is None else streamed
        if self.streams:
            expect(
                stream.get("rev") == want,
                _RULE,
                f"the next holder read the stream {stream!r} after {after}; want rev={want}",
            )

    async def run(self) -> None:
        # The last write of an action: stored, and the lock free once the action is
        # done. A caller already waiting for the lock enters after the save has landed.
        async def first() -> None:
            await self.unlocking(1, 0)

        seen: list[int | None] = []

        async def waiting() -> None:
            async def look() -> None:
                seen.append(await self.stored_revision())

            await self.a.with_workflow_lock(self.stack, look, timeout_ms=ENTER_WITHIN_MS)

        async def hold_then_first() -> None:
            contender.append(asyncio.ensure_future(waiting()))
            await asyncio.sleep(0.05)  # the contender polls while the lock is held
            await first()

        contender: list[asyncio.Future[None]] = []
        try:
            await self.a.with_workflow_lock(self.stack, hold_then_first)
        except BaseException:
            # The contender must not outlive the check (and its backend) unawaited.
            for task in contender:
                task.cancel()
            await asyncio.gather(*contender, return_exceptions=True)
            raise
        try:
            await asyncio.wait_for(contender[0], ENTER_WITHIN_MS / 1000 + 5)
        except (LockNotAcquiredError, TimeoutError):
            fail(_RULE, "a caller waiting for the lock never entered after the unlocking save")

        expect(
            seen == [1],
            _RULE,
            f"a caller waiting for the lock entered and read revision {seen}; want [1]: the "
            "lock was free before the unlocking save had landed",
        )
        await self.next_holder_reads(1, "an unlocking save")

        # A refused compare-and-set is raised, stores nothing but its changes (as
        # save_checkpoint_streamed), and frees the lock too.
        refused: list[BaseException] = []

        async def conflicting() -> None:
            try:
                await self.unlocking(2, 0)
            except CheckpointConflictError as exc:
                refused.append(exc)

        await self.a.with_workflow_lock(self.stack, conflicting)
        if not refused:
            fail(_RULE, "an unlocking save with expected_revision=0 over revision 1 was accepted")
        expect(
            await self.stored_revision() == 1,
            _RULE,
            "a refused unlocking save changed the stored checkpoint",
        )
        await self.next_holder_reads(1, "a refused unlocking save", streamed=2)

        # Bad input is refused before anything is written, and the lock stays held; so
        # does it after a save of another stack. The valid save then frees it.
        other = self.ctx.id("wf-unlock-other")
        still_held: list[tuple[str, bool]] = []

        async def careful() -> None:
            try:
                await self.unlocking(2, -1)
            except InvalidArgumentError:
                pass
            else:
                fail(_RULE, "an unlocking save with expected_revision=-1 was accepted")
            still_held.append(("a save refused for bad input", await self.held_elsewhere()))
            await self.a.save_checkpoint_unlocking(self.cp(1, other), expected_revision=0)
            still_held.append(("another stack's unlocking save", await self.held_elsewhere()))
            await self.unlocking(2, 1)

        await self.a.with_workflow_lock(self.stack, careful)
        for after, held in still_held:
            expect(held, _RULE, f"the stack's lock was free inside its action after {after}")
        expect(
            await self.stored_revision(other) == 1,
            _RULE,
            "another stack's unlocking save inside the action was not stored",
        )
        await self.next_holder_reads(2, "an unlocking save after refused ones")

        # Outside any lock: a plain save, compare-and-set and forward rule alike.
        await self.unlocking(3, 2)
        await self.unlocking(4, None)
        try:
            await self.unlocking(4, None)
        except CheckpointConflictError:
            pass
        else:
            fail(_RULE, "an unlocking save outside a lock moved revision 4 sideways")
        expect(
            await self.stored_revision() == 4,
            _RULE,
            "unlocking saves outside a lock did not store revision 4",
        )
