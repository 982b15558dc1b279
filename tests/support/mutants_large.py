"""Broken backends for the large-state rules (SPEC §13, issue 34): each breaks one rule of
docs/contract.md the way a real backend could, and the suite must name that rule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from siglo import Checkpoint, StorageAdapterError
from siglo.adapter import CacheEntry
from siglo.records import ContextChangeEvent
from siglo.sizing import check_document_size
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


class CachesBeforeSizeGuard(MemoryStorageAdapter):
    """A caching save (overridden to write in one go, as writing-a-backend.md invites)
    writes its cache entry and context changes before the size guard refuses the
    document, as a real backend's override could."""

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        check_save_arguments(checkpoint, expected_revision)
        await self.set_cached_step(entry.key, entry.value, entry.ttl_ms, **entry.in_namespace())
        for change in changes:
            await self.on_context_change(change)
        await self.save_checkpoint(checkpoint, expected_revision=expected_revision)


class StreamedRefusesExactLimit(MemoryStorageAdapter):
    """The streamed save (and the unlocking and caching saves, which go through it)
    compares the document with the limit by ``>=``: a document of exactly
    ``max_document_bytes`` is refused (a black-box auditor's plugin that passed every
    check of contract 1.7, which gave the exact limit to the plain save only)."""

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        check_save_arguments(checkpoint, expected_revision)
        limit = self.max_document_bytes
        if limit is not None and len(checkpoint.to_json()) >= limit:
            check_document_size(checkpoint, limit - 1)
        await super().save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )


class IgnoresDocumentLimit(MemoryStorageAdapter):
    """Declares a document limit and stores documents over it (its own save path, which
    never asks the guard)."""

    async def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        check_save_arguments(checkpoint, expected_revision)
        self._require_open()
        await self._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


class HoldsHalfItsDeclaredLimit(MemoryStorageAdapter):
    """Declares ``max_document_bytes`` 400,000 (DynamoDB's item size) where its store
    holds 200,000 bytes: a document between the two passes the size guard and fails in
    the store, mid-run, the failure the declaration exists to prevent (a black-box
    auditor's plugin that passed every rule: the guard was crossed at 4,096 bytes and no
    check stored more than 165 KB)."""

    max_document_bytes = 400_000
    _HOLDS = 200_000

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        size = len(checkpoint.to_json())
        if size > self._HOLDS:
            raise StorageAdapterError(f"item of {size} bytes exceeds the store's item size")
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


_PARTS_FROM = 65_536
"""Where these mutants start saving "incrementally", as the SQL backend does."""


class _Incremental(MemoryStorageAdapter):
    """A large document saved against the one it replaces, contexts compared by step."""

    def _merge(self, old: dict[str, Any], new: Checkpoint) -> dict[str, Any]:
        raise NotImplementedError

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        key = (checkpoint.namespace, checkpoint.stack_id)
        stored = self._live_checkpoint(key, self.clock.now_ms())
        if stored is not None and len(checkpoint.to_json()) >= _PARTS_FROM:
            checkpoint = checkpoint.replace(contexts=self._merge(dict(stored.contexts), checkpoint))
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


class StaleChangedContext(_Incremental):
    """In a large document a step already stored keeps its stored context: changes are
    detected by step id, not by content, so a changed context is never written."""

    def _merge(self, old: dict[str, Any], new: Checkpoint) -> dict[str, Any]:
        return {step: old.get(step, ctx) for step, ctx in new.contexts.items()}


class KeepsDroppedContexts(_Incremental):
    """In a large document a step the save no longer has stays stored: only the steps
    written are touched, never the ones that went."""

    def _merge(self, old: dict[str, Any], new: Checkpoint) -> dict[str, Any]:
        return {**old, **new.contexts}
