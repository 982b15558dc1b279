"""Broken backends for the large-state rules (SPEC §13, issue 34): each breaks one rule of
docs/contract.md the way a real backend could, and the suite must name that rule."""

from __future__ import annotations

from collections.abc import Sequence

from siglo import Checkpoint
from siglo.records import ContextChangeEvent
from siglo.validation import check_save_arguments
from siglo_memory.adapter import MemoryStorageAdapter


class StreamsBeforeSizeGuard(MemoryStorageAdapter):
    """A streamed save writes its context changes before the size guard refuses the
    document: a refused save leaves part of itself behind."""

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        check_save_arguments(checkpoint, expected_revision)
        for change in changes:
            await self.on_context_change(change)
        await self.save_checkpoint(checkpoint, expected_revision=expected_revision)


class IgnoresDocumentLimit(MemoryStorageAdapter):
    """Declares a document limit and stores documents over it (its own save path, which
    never asks the guard)."""

    async def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        check_save_arguments(checkpoint, expected_revision)
        self._require_open()
        await self._do_save_checkpoint(checkpoint, expected_revision=expected_revision)
