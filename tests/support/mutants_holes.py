"""More deliberately broken backends, one per kind of hole a suite can have (issue 12):
values a random program rarely generates, bad input on arguments other than the usual
ones, rules a search finds only by chance, time on backends without an injectable
clock, concurrency that is too gentle, and bugs whose symptoms show first under another
rule. Each breaks one rule of docs/contract.md, written from the rule's text; the suite
must fail each and name that rule as the primary failure."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from siglo import MISSING, Checkpoint, CheckpointConflictError, WaitRecord
from siglo.coordination import LockResult
from siglo.errors import CapabilityNotSupportedError, LockNotAcquiredError, WaitRecordClaimError
from siglo.manager import StorageManager
from siglo.records import CacheEvent, ContextChangeEvent
from siglo.snapshots import take_snapshot
from siglo.stack import ExecutionStack
from siglo.validation import check_save_arguments
from siglo_memory.adapter import MemoryStorageAdapter, _StoredCheckpoint
from siglo_memory.coordination import MemoryIdempotencyStore, MemoryLock, MemoryNonceStore

T = TypeVar("T")

# -- values never generated ---------------------------------------------------------------


class EmptyMetadataIsNone(MemoryStorageAdapter):
    """checkpoint.roundtrip: an empty ``metadata`` object reads back as absent."""

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        cp = await super()._do_get_checkpoint(stack_id, namespace, fallback=fallback)
        if cp is not None and cp.metadata == {}:
            return cp.replace(metadata=None)
        return cp


class DropsEmptyContexts(MemoryStorageAdapter):
    """checkpoint.roundtrip: a chain whose context is empty is not stored."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        kept = {k: v for k, v in checkpoint.contexts.items() if v}
        await super()._do_save_checkpoint(
            checkpoint.replace(contexts=kept), expected_revision=expected_revision
        )


class DropsWaitExtraFields(MemoryStorageAdapter):
    """wait.roundtrip: unknown wire fields of a wait record are lost."""

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        await super()._do_save_wait_record(record.replace(extra={}), ttl_ms=ttl_ms)


class ContextKeepsEightFields(MemoryStorageAdapter):
    """context.stream: a stream keeps its first eight fields only."""

    async def _do_on_context_change(self, event: ContextChangeEvent) -> None:
        key = (event.namespace, event.stack_id, event.step_id)
        fields, _ = self._contexts.get(key, ({}, None))
        if event.op == "set" and event.key not in fields and len(fields) >= 8:
            return
        await super()._do_on_context_change(event)


class CompletesNeverSaved(MemoryStorageAdapter):
    """wait.complete.claimant: completing a key never saved returns quietly."""

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        if self._live_wait(correlation_key, self.clock.now_ms()) is None:
            return
        await super()._do_complete_wait_record(correlation_key, claimant_id, namespace)


class CancelWorkflowOneWait(MemoryStorageAdapter):
    """wait.cancel-workflow: only the first open wait of the stack is cancelled."""

    async def _do_cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        now = self.clock.now_ms()
        spared = []
        for key in list(self._waits):
            record = self._live_wait(key, now)
            if (
                record is not None
                and record.stack_id == stack_id
                and record.namespace == namespace
                and record.status in ("waiting", "claimed")
            ):
                spared.append(record)
        await super()._do_cancel_workflow(stack_id, namespace)
        for record in spared[1:]:
            self._store_wait(record)


class ClaimantCaseBlind(MemoryStorageAdapter):
    """wait.claim.refused: claimants are compared without case, so "Holder" takes the
    record claimed by "holder"."""

    async def _do_claim_wait_record(
        self,
        correlation_key: str,
        claimant_id: str | None = None,
        *,
        allow_expired: bool = False,
        event_payload: Any = MISSING,
        lease_ms: int | None = None,
        namespace: str | None = None,
    ) -> WaitRecord | None:
        record = self._live_wait(correlation_key, self.clock.now_ms())
        if (
            claimant_id is not None
            and record is not None
            and record.status == "claimed"
            and (record.claimant_id or "").lower() == claimant_id.lower()
        ):
            claimant_id = record.claimant_id
        return await super()._do_claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class CompleteByPrefix(MemoryStorageAdapter):
    """wait.complete.claimant: any claimant id that is a prefix of the holder's completes."""

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        record = self._live_wait(correlation_key, self.clock.now_ms())
        if record is not None and (record.claimant_id or "").startswith(claimant_id):
            claimant_id = record.claimant_id or claimant_id
        await super()._do_complete_wait_record(correlation_key, claimant_id, namespace)


class NonePayloadKeepsStored(MemoryStorageAdapter):
    """wait.claim.once: a claim passing ``event_payload=None`` keeps the stored payload."""

    async def _do_claim_wait_record(
        self,
        correlation_key: str,
        claimant_id: str | None = None,
        *,
        allow_expired: bool = False,
        event_payload: Any = MISSING,
        lease_ms: int | None = None,
        namespace: str | None = None,
    ) -> WaitRecord | None:
        return await super()._do_claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=MISSING if event_payload is None else event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class LapsedLeaseAnyoneCompletes(MemoryStorageAdapter):
    """wait.complete.claimant: once the lease has run out, anyone may complete."""

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        now = self.clock.now_ms()
        record = self._live_wait(correlation_key, now)
        if record is not None and record.lease_expired(now):
            claimant_id = record.claimant_id or claimant_id
        await super()._do_complete_wait_record(correlation_key, claimant_id, namespace)


class ReleaseTokenPrefix(MemoryLock):
    """lock.release.token: a prefix of the holder's token releases the lock."""

    async def _do_release(self, lock_key: str, token: str) -> bool:
        holder = self._holders.get(lock_key)
        if holder is not None and holder.startswith(token):
            token = holder
        return await super()._do_release(lock_key, token)


# -- bad input on arguments other than the usual ones -----------------------------------


class AcceptsSurrogateCacheKeys(MemoryStorageAdapter):
    """input.rejected: a cache key with a lone surrogate is accepted."""

    async def set_cached_step(
        self, key: str, value: Any, ttl_ms: int | None = None, *, namespace: str | None = None
    ) -> None:
        if isinstance(key, str) and any("\ud800" <= ch <= "\udfff" for ch in key):
            await self._do_set_cached_step(key, value, ttl_ms)
            return
        await super().set_cached_step(key, value, ttl_ms, namespace=namespace)


class AcceptsFloatLease(MemoryStorageAdapter):
    """input.rejected: a float ``lease_ms`` is rounded instead of refused."""

    async def claim_wait_record(
        self,
        correlation_key: str,
        claimant_id: str | None = None,
        *,
        allow_expired: bool = False,
        event_payload: Any = MISSING,
        lease_ms: int | None = None,
        namespace: str | None = None,
    ) -> WaitRecord | None:
        if isinstance(lease_ms, float) and lease_ms == lease_ms:
            lease_ms = max(1, round(lease_ms))
        return await super().claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class AcceptsBoolIdempotencyTtl(MemoryIdempotencyStore):
    """input.rejected: ``ttl_ms=True`` is taken as 1 ms."""

    async def claim(self, key: str, ttl_ms: int | None = None, **options: Any) -> Any:
        return await super().claim(key, 1 if ttl_ms is True else ttl_ms, **options)


class OverlongNamespaceWrongError(MemoryStorageAdapter):
    """input.rejected: an over-long namespace in cancel_workflow raises ValueError."""

    async def cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        if isinstance(namespace, str) and len(namespace) > 4096:
            raise ValueError("namespace too long")
        await super().cancel_workflow(stack_id, namespace)


class AcceptsEmptyContextStep(MemoryStorageAdapter):
    """input.rejected: a context change with an empty step id is stored."""

    async def on_context_change(self, event: ContextChangeEvent) -> None:
        if isinstance(event, ContextChangeEvent) and event.step_id == "":
            await self._do_on_context_change(event)
            return
        await super().on_context_change(event)


# -- rules a search finds only by chance --------------------------------------------------


class AllowsBackwardsSave(MemoryStorageAdapter):
    """checkpoint.occ.monotonic: a plain save of a lower revision is stored."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        key = (checkpoint.namespace, checkpoint.stack_id)
        current = self._live_checkpoint(key, self.clock.now_ms())
        if (
            expected_revision is None
            and current is not None
            and checkpoint.revision < current.revision
        ):
            self._checkpoints[key] = _StoredCheckpoint(
                checkpoint.to_json(), checkpoint.expires_at, checkpoint.revision
            )
            return
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


class NonceReplayAfterRefusal(MemoryNonceStore):
    """nonce.claim.once: after one refused replay the nonce is forgotten."""

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        first = await super()._do_claim(key, ttl_ms)
        if not first:
            self._seen.delete(key)
        return first


class CompleteWithoutClaimStoresNothing(MemoryIdempotencyStore):
    """idempotency.complete: completing a key never claimed keeps no result."""

    async def _do_complete(self, key: str, result: Any, ttl_ms: int | None) -> None:
        if self._keys.get(key) is None:
            return
        await super()._do_complete(key, result, ttl_ms)


# -- time on backends without an injectable clock ------------------------------------------


class FencingRestartsAfterExpiry(MemoryLock):
    """lock.fencing: a lock taken over after its holder expired restarts fencing at 1."""

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        item = self._holders._items.get(lock_key)
        if item is not None and self.clock.now_ms() >= item[1]:
            self._fences[lock_key] = 0
        return await super()._do_acquire(lock_key, ttl_ms, custom_token)


class ExtendKeepsOldExpiry(MemoryLock):
    """lock.extend.token: extend says True but the lock still expires at the old time."""

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        return self._holders.get(lock_key) == token


# -- concurrency ------------------------------------------------------------------------------


class WorkflowWaitersGiveUp(MemoryStorageAdapter):
    """lock.workflow.exclusive: a waiter gives up after 300 ms and runs its action anyway."""

    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None = None
    ) -> T:
        lock = self._workflow_locks.setdefault(stack_id, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), 0.3)
        except TimeoutError:
            return await action()
        try:
            return await action()
        finally:
            lock.release()


class WorkflowTimeoutRunsAnyway(MemoryStorageAdapter):
    """lock.workflow.exclusive: when ``timeout_ms`` passes, the action runs unlocked."""

    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None = None
    ) -> T:
        try:
            return await super()._do_with_workflow_lock(stack_id, action, timeout_ms=timeout_ms)
        except LockNotAcquiredError:
            return await action()


# -- symptoms under another rule first ---------------------------------------------------------


class ConflictNamesExpectedAsCurrent(MemoryStorageAdapter):
    """checkpoint.occ.conflict: a conflict carries the expected revision as the current."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        try:
            await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)
        except CheckpointConflictError:
            if expected_revision is None:
                raise
            raise CheckpointConflictError(
                checkpoint.stack_id, expected_revision, expected_revision, checkpoint.revision
            ) from None


class ExpiredStillConflicts(MemoryStorageAdapter):
    """checkpoint.expiry.hidden: an expired checkpoint is hidden from reads but a later
    save still conflicts with its revision."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        check_save_arguments(checkpoint, expected_revision)
        key = (checkpoint.namespace, checkpoint.stack_id)
        entry = self._checkpoints.get(key)
        if entry is not None and not entry.live(self.clock.now_ms()):
            stored = entry.revision
            ok = (
                stored == expected_revision
                if expected_revision is not None
                else checkpoint.revision > stored
            )
            if not ok:
                raise CheckpointConflictError(
                    checkpoint.stack_id, stored, expected_revision, checkpoint.revision
                )
            self._checkpoints[key] = _StoredCheckpoint(
                checkpoint.to_json(), checkpoint.expires_at, checkpoint.revision
            )
            return
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


class RejectsErrorEvents(MemoryStorageAdapter):
    """cache-events.accepted: an "error" cache event is refused as not supported."""

    async def _do_on_cache_event(self, event: CacheEvent) -> None:
        if event.type == "error":
            raise CapabilityNotSupportedError("error events are not recorded")
        await super()._do_on_cache_event(event)


class CancelledRecordCompletes(MemoryStorageAdapter):
    """wait.complete.claimant: the claimant of a cancelled record can still complete it."""

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        record = self._live_wait(correlation_key, self.clock.now_ms())
        if record is not None and record.status == "cancelled" and record.claimant_id:
            if record.claimant_id == claimant_id:
                self._store_wait(record.replace(status="completed", completed_at=0))
                return
            raise WaitRecordClaimError("claimed by another claimant")
        await super()._do_complete_wait_record(correlation_key, claimant_id, namespace)


# -- siglo's manager over the backend (the suite's end-to-end rules) ------------------------


class SavesBeforeStreaming(MemoryStorageAdapter):
    """context.streamed-save: a streamed save writes the checkpoint first and the changes
    after it, so a refused compare-and-set loses them."""

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        await self.save_checkpoint(checkpoint, expected_revision=expected_revision)
        for change in changes:
            await self.on_context_change(change)


class StreamedDeleteSetsNull(MemoryStorageAdapter):
    """context.streamed-save: one change sent with a checkpoint is written as a set, so a
    delete stores the field as null (a combined statement that knows only sets)."""

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        if len(changes) == 1 and changes[0].op == "delete":
            changes = [dataclasses.replace(changes[0], op="set", value=None)]
        await super().save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )


class StreamSkipsRedaction(StorageManager):
    """manager.redaction.stored: context changes are streamed unredacted."""

    def _fields_of(self, stack: ExecutionStack | None) -> frozenset[str]:
        # A streamed change is redacted when its job builds it (the closure ``build`` of
        # StorageManager.stream_context_change): that call alone finds no keys, so that
        # checkpoints and StorageManager.redact stay redacted.
        if sys._getframe(1).f_code.co_name == "build":
            return frozenset()
        return super()._fields_of(stack)


class BackgroundSkipsRedaction(StorageManager):
    """manager.redaction.stored: a background checkpoint() is saved unredacted."""

    _in_background = False

    def checkpoint(self, stack_id: Any, **options: Any) -> Checkpoint:
        self._in_background = True
        try:
            return super().checkpoint(stack_id, **options)
        finally:
            self._in_background = False

    def _snapshot(
        self,
        stack: ExecutionStack,
        expected_revision: int | None,
        redact_fields: Any,
        ttl_ms: int | None,
    ) -> Checkpoint:
        if not self._in_background:
            return super()._snapshot(stack, expected_revision, redact_fields, ttl_ms)
        return take_snapshot(
            stack,
            frozenset(),
            self.clock,
            expected_revision=expected_revision,
            redact_fields=(),
            ttl_ms=ttl_ms,
        )


class BestEffortSwallowsConflicts(StorageManager):
    """manager.conflict.stored: in best-effort a conflict is swallowed like a failure."""

    def _handle_failure(self, exc: Exception, doing: str, *, background: str | None = None) -> None:
        if isinstance(exc, CheckpointConflictError) and self.error_mode == "best-effort":
            return
        super()._handle_failure(exc, doing, background=background)


class RestoreIgnoresNamespace(StorageManager):
    """manager.restore.stored: the expected namespace is not compared."""

    def restore_checkpoint(self, checkpoint: Any, *, expected_namespace: str | None = None) -> Any:
        return super().restore_checkpoint(checkpoint)


class AnswersAfterClose(MemoryStorageAdapter):
    """A closed adapter still answers, as the Redis client that reconnected did."""

    def _require_open(self) -> None:
        return None
