"""The in-memory storage adapter (reference model)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from siglo import codec
from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.blind import stored_tokens
from siglo.checkpoint import TERMINAL_STATUSES, Checkpoint
from siglo.clock import Clock, clock_or_system
from siglo.errors import (
    CheckpointConflictError,
    LockNotAcquiredError,
    WaitRecordClaimError,
)
from siglo.listing import CheckpointPage, CheckpointSummary, ListQuery, decode_cursor, encode_cursor
from siglo.locking import Lease, using_lease
from siglo.payloads import (
    CONTEXT_KIND,
    PAYLOAD_KINDS,
    PayloadKind,
    StoredPayload,
    context_field,
    wait_fields,
    with_wait_fields,
)
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord, embedded_wait_record
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.sizing import check_document_size
from siglo.validation import check_save_arguments, ms_as_seconds, require_lease_ms, require_ttl_ms
from siglo_memory.model import StorageModel, WaitKey, wait_key

__all__ = ["MemoryStorageAdapter", "WaitKey", "wait_key"]

T = TypeVar("T")


@dataclass(slots=True)
class _Entry:
    """A stored JSON document and the time it is gone (``None``: kept until removed)."""

    data: bytes
    gone_at: int | None

    def live(self, now: int) -> bool:
        return self.gone_at is None or now < self.gone_at


@dataclass(slots=True)
class _StoredCheckpoint(_Entry):
    """A stored checkpoint: its JSON and, beside it, its revision.

    A save compares revisions only; keeping the revision here spares decoding the
    stored document on every save.
    """

    revision: int


def _earliest(*times: int | None) -> int | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


class MemoryStorageAdapter(StorageAdapter):
    """The whole storage contract in plain dicts; every expiry uses the injected clock.

    ``checkpoint_ttl_ms`` (default: none) bounds how long checkpoints without their own
    ``expires_at``, wait records and context streams are kept, as the seed's
    ``checkpointTtlMs`` does for Redis. ``cache_ttl_ms`` is the step cache's default TTL,
    ``claim_lease_ms`` how long a wait-record claim lasts before another claimant may
    take the record over.
    """

    name: ClassVar[str] = "memory"
    durable: ClassVar[bool] = False  # nothing outlives the process: best-effort by default
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.CHECKPOINTS,
            Capability.WAIT_RECORDS,
            Capability.WORKFLOW_LOCK,
            Capability.STEP_CACHE,
            Capability.CONTEXT_STREAM,
            Capability.CACHE_EVENTS,
            Capability.CLOCK,
            Capability.LISTING,
            Capability.DELETION,
            Capability.DUE_WAITS,
            Capability.PAYLOAD_SCAN,
        }
    )
    payload_kinds: ClassVar[frozenset[PayloadKind]] = frozenset((*PAYLOAD_KINDS, CONTEXT_KIND))

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        checkpoint_ttl_ms: int | None = None,
        cache_ttl_ms: int = DEFAULTS.cache_ttl_ms,
        claim_lease_ms: int = DEFAULTS.claim_lease_ms,
        workflow_lock_timeout_ms: int = DEFAULTS.workflow_lock_timeout_ms,
    ) -> None:
        self.clock: Clock = clock_or_system(clock)
        self.checkpoint_ttl_ms = require_ttl_ms(
            "checkpoint_ttl_ms", checkpoint_ttl_ms, optional=True
        )
        self.cache_ttl_ms = require_ttl_ms("cache_ttl_ms", cache_ttl_ms)
        self.claim_lease_ms = require_lease_ms("claim_lease_ms", claim_lease_ms)
        self.workflow_lock_timeout_ms = require_ttl_ms(
            "workflow_lock_timeout_ms", workflow_lock_timeout_ms
        )
        self._checkpoints: dict[tuple[str | None, str], _StoredCheckpoint] = {}
        # Keyed by wait_key(namespace of the record's stack, correlation key / stack id).
        self._waits: dict[WaitKey, _Entry] = {}
        self._latest_wait_of_stack: dict[WaitKey, WaitKey] = {}
        self._cache: dict[str, _Entry] = {}
        self._contexts: dict[tuple[str | None, str, str], tuple[dict[str, bytes], int | None]] = {}
        self._workflow_locks: dict[str, asyncio.Lock] = {}
        self._workflow_fences: dict[str, int] = {}
        self.cache_events: list[CacheEvent] = []
        """Cache events received, newest last (telemetry only; bounded to 1,000)."""

    @property
    def model(self) -> StorageModel:
        """A read-only view of the stored entries, expired ones included (for the
        contract suite's state machines; see :mod:`siglo_memory.model`)."""
        return StorageModel(
            checkpoints=MappingProxyType(self._checkpoints),
            waits=MappingProxyType(self._waits),
            latest_wait_of_stack=MappingProxyType(self._latest_wait_of_stack),
            cache=MappingProxyType(self._cache),
        )

    def _retention(self, now: int) -> int | None:
        return None if self.checkpoint_ttl_ms is None else now + self.checkpoint_ttl_ms

    # -- checkpoints -------------------------------------------------------------------

    def _live_entry(self, key: tuple[str | None, str], now: int) -> _StoredCheckpoint | None:
        entry = self._checkpoints.get(key)
        if entry is None or not entry.live(now):
            return None
        return entry

    def _live_checkpoint(self, key: tuple[str | None, str], now: int) -> Checkpoint | None:
        entry = self._live_entry(key, now)
        return None if entry is None else Checkpoint.from_json(entry.data)

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        data = checkpoint.to_json()
        now = self.clock.now_ms()
        key = (checkpoint.namespace, checkpoint.stack_id)
        current = self._live_entry(key, now)
        current_revision = None if current is None else current.revision
        if expected_revision is not None:
            won = (current_revision or 0) == expected_revision
        else:
            won = current_revision is None or checkpoint.revision > current_revision
        if not won:
            raise CheckpointConflictError(
                checkpoint.stack_id, current_revision, expected_revision, checkpoint.revision
            )
        gone_at = _earliest(checkpoint.expires_at, self._retention(now))
        self._checkpoints[key] = _StoredCheckpoint(data, gone_at, checkpoint.revision)

    def writes_with_checkpoint(self, changes: Sequence[ContextChangeEvent]) -> bool:
        """Any changes: a save that follows them in the same turn takes them, through
        :meth:`StorageAdapter.save_checkpoint_streamed` (the size guard, then the changes
        recorded, then the save), so that a save the size guard refuses writes none of
        them, as on every backend (docs/large-state.md); streamed first, they stayed in
        the stream."""
        return True

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        """The entry cached, then the save (streamed): one after the other, neither
        depending on the other's outcome. The lock is released when the action ends."""
        check_save_arguments(checkpoint, expected_revision)
        entry.checked()
        check_document_size(checkpoint, self.max_document_bytes)  # nothing written if too large
        self._require_open()
        await self.set_cached_step(entry.key, entry.value, entry.ttl_ms, **entry.in_namespace())
        await self.save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        now = self.clock.now_ms()
        found = self._live_checkpoint((namespace, stack_id), now)
        if found is None and namespace is not None and fallback:
            found = self._live_checkpoint((None, stack_id), now)
        return found

    async def _do_clean_expired_checkpoints(self) -> int:
        now = self.clock.now_ms()
        expired = [key for key, entry in self._checkpoints.items() if not entry.live(now)]
        for key in expired:
            del self._checkpoints[key]
        return len(expired)

    # -- operating what is stored -----------------------------------------------------

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        return self._walk(query, lambda checkpoint: True)

    async def _do_list_by_index(self, query: ListQuery, tokens: dict[str, str]) -> CheckpointPage:
        # The reference: the listing, keeping the stacks whose stored tokens hold the
        # filter's (no index: the other backends keep one to get the same answer fast).
        return self._walk(
            query,
            lambda checkpoint: all(
                stored_tokens(checkpoint.metadata).get(field) == value
                for field, value in tokens.items()
            ),
        )

    def _walk(self, query: ListQuery, keep: Callable[[Checkpoint], bool]) -> CheckpointPage:
        # The walk's order: (namespace or "", stack id). "" is no namespace's name, so
        # the un-namespaced stacks come first and no two stacks share a position.
        after = None if query.cursor is None else tuple(decode_cursor(query.cursor, 2))
        now = self.clock.now_ms()
        found: list[tuple[tuple[str, str], CheckpointSummary]] = []
        for (namespace, stack_id), entry in self._checkpoints.items():
            position = (namespace or "", stack_id)
            if (after is not None and position <= after) or not entry.live(now):
                continue
            checkpoint = Checkpoint.from_json(entry.data)
            if query.matches(checkpoint) and keep(checkpoint):
                found.append((position, CheckpointSummary.of(checkpoint)))
        found.sort(key=lambda item: item[0])
        page = found[: query.limit]
        more = len(found) > query.limit
        return CheckpointPage(
            [summary for _, summary in page], encode_cursor(*page[-1][0]) if more else None
        )

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        now = self.clock.now_ms()
        key = (namespace, stack_id)
        current = self._live_entry(key, now)
        if expected_revision is not None and (
            current is None or current.revision != expected_revision
        ):
            raise CheckpointConflictError(
                stack_id, None if current is None else current.revision, expected_revision
            )
        self._checkpoints.pop(key, None)
        for stored_key in list(self._waits):
            record = WaitRecord.from_json(self._waits[stored_key].data)
            if record.stack_id == stack_id and record.namespace == namespace:
                del self._waits[stored_key]
                latest = wait_key(namespace, stack_id)
                if self._latest_wait_of_stack.get(latest) == stored_key:
                    del self._latest_wait_of_stack[latest]
        for context_key in list(self._contexts):
            if context_key[:2] == key:
                del self._contexts[context_key]
        return current is not None

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        now = self.clock.now_ms()
        due: list[WaitRecord] = []
        for key in self._waits:
            record = self._live_wait(key, now)
            if record is None or not record.is_expired(now):
                continue
            if record.status == "waiting" or record.lease_expired(now):
                due.append(record)
        due.sort(key=lambda r: (r.expires_at or 0, r.correlation_key))
        return due[:limit]

    # -- wait records --------------------------------------------------------------------

    def _live_wait(self, key: WaitKey, now: int) -> WaitRecord | None:
        entry = self._waits.get(key)
        if entry is None or not entry.live(now):
            return None
        return WaitRecord.from_json(entry.data)

    def _store_wait(self, record: WaitRecord) -> None:
        # Transitions keep the retention the record was saved with.
        self._waits[wait_key(record.namespace, record.correlation_key)].data = record.to_json()

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        data = record.to_json()
        now = self.clock.now_ms()
        gone_at = now + ttl_ms if ttl_ms is not None else self._retention(now)
        ns = record.namespace
        self._waits[wait_key(ns, record.correlation_key)] = _Entry(data, gone_at)
        self._latest_wait_of_stack[wait_key(ns, record.stack_id)] = wait_key(
            ns, record.correlation_key
        )

    async def _do_create_wait_record(self, record: WaitRecord, *, ttl_ms: int | None) -> bool:
        # No await between the look and the write: atomic on the event loop.
        key = wait_key(record.namespace, record.correlation_key)
        if self._live_wait(key, self.clock.now_ms()) is not None:
            return False
        await self._do_save_wait_record(record, ttl_ms=ttl_ms)
        return True

    async def _do_get_wait_record(
        self, correlation_key_or_stack_id: str, namespace: str | None = None
    ) -> WaitRecord | None:
        key = wait_key(namespace, correlation_key_or_stack_id)
        now = self.clock.now_ms()
        record = self._live_wait(key, now)
        if record is not None:
            return record
        latest = self._latest_wait_of_stack.get(key)
        if latest is not None:
            record = self._live_wait(latest, now)
            if record is not None:
                return record
        # Seed 001 §5: last, a wait record kept in the checkpoint's metadata.
        checkpoint = self._live_checkpoint((namespace, correlation_key_or_stack_id), now)
        return None if checkpoint is None else embedded_wait_record(checkpoint.metadata)

    async def _do_claim_wait_record(
        self,
        correlation_key: str,
        claimant_id: str,
        *,
        allow_expired: bool = False,
        event_payload: Any = MISSING,
        lease_ms: int | None = None,
        namespace: str | None = None,
    ) -> WaitRecord | None:
        now = self.clock.now_ms()
        record = self._live_wait(wait_key(namespace, correlation_key), now)
        if record is None or record.status in ("completed", "cancelled"):
            return None
        if (
            record.status == "claimed"
            and not record.lease_expired(now)
            and record.claimant_id != claimant_id
        ):
            return None
        if record.is_expired(now) and not allow_expired:
            return None
        claimed = record.replace(
            status="claimed",
            claimant_id=claimant_id,
            claimed_at=now,
            lease_expires_at=now + (lease_ms or self.claim_lease_ms),
            event_payload=record.event_payload if event_payload is MISSING else event_payload,
        )
        self._store_wait(claimed)
        return claimed

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        now = self.clock.now_ms()
        record = self._live_wait(wait_key(namespace, correlation_key), now)
        if record is None:
            raise WaitRecordClaimError(f"no wait record with correlation key {correlation_key!r}")
        if record.status != "claimed":
            raise WaitRecordClaimError(
                f"wait record {correlation_key!r} is {record.status}, not claimed"
            )
        if record.claimant_id != claimant_id:
            raise WaitRecordClaimError(
                f"wait record {correlation_key!r} is claimed by another claimant"
            )
        self._store_wait(record.replace(status="completed", completed_at=now))

    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> bool:
        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is None or record.status != "claimed" or record.claimant_id != claimant_id:
            return False
        self._store_wait(
            record.replace(
                status="waiting", claimant_id=None, claimed_at=None, lease_expires_at=None
            )
        )
        return True

    async def _do_cancel_wait_record(
        self, correlation_key: str, namespace: str | None = None
    ) -> bool:
        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is None or record.status not in ("waiting", "claimed"):
            return False
        self._store_wait(record.replace(status="cancelled"))
        return True

    async def _do_cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        now = self.clock.now_ms()
        for key in list(self._waits):
            record = self._live_wait(key, now)
            if (
                record is not None
                and record.stack_id == stack_id
                and record.namespace == namespace
                and record.status in ("waiting", "claimed")
            ):
                self._store_wait(record.replace(status="cancelled"))
        key_cp = (namespace, stack_id)
        checkpoint = self._live_checkpoint(key_cp, now)
        if checkpoint is not None and checkpoint.status not in TERMINAL_STATUSES:
            cancelled = checkpoint.replace(
                status="cancelled", revision=checkpoint.revision + 1, timestamp=now
            )
            entry = self._checkpoints[key_cp]
            entry.data = cancelled.to_json()
            entry.revision = cancelled.revision

    async def _do_with_workflow_lock(
        self,
        stack_id: str,
        action: Callable[[], Awaitable[T]],
        *,
        timeout_ms: int | None = None,
    ) -> T:
        lock = self._workflow_locks.setdefault(stack_id, asyncio.Lock())
        timeout = ms_as_seconds(timeout_ms or self.workflow_lock_timeout_ms)
        try:
            await asyncio.wait_for(lock.acquire(), timeout)
        except TimeoutError:
            raise LockNotAcquiredError(
                f"workflow lock for stack {stack_id!r} still held after {timeout * 1000:.0f} ms"
            ) from None
        try:
            # In one process the lock cannot be lost; the fencing token still grows
            # per holder, as on every backend.
            fence = self._workflow_fences.get(stack_id, 0) + 1
            self._workflow_fences[stack_id] = fence
            return await using_lease(Lease(stack_id, f"memory-{fence}", fence), action)
        finally:
            lock.release()

    # -- step cache ------------------------------------------------------------------------

    async def _do_get_cached_step(self, key: str) -> Any | Missing:
        entry = self._cache.get(key)
        if entry is None or not entry.live(self.clock.now_ms()):
            return MISSING
        return codec.loads(entry.data, what="cached step")

    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        data = codec.dumps(value, what=f"cached value of {key!r}")
        self._cache[key] = _Entry(data, self.clock.now_ms() + (ttl_ms or self.cache_ttl_ms))

    # -- stored payloads -----------------------------------------------------------------------

    async def _do_scan_payloads(self, kind: PayloadKind) -> AsyncIterator[StoredPayload]:
        # A snapshot of the keys: entries written during the walk may be missed, never
        # listed twice.
        if kind == "wait":
            for key in list(self._waits):
                entry = self._waits.get(key)
                if entry is None or not entry.live(self.clock.now_ms()):
                    continue
                record = WaitRecord.from_json(entry.data)
                fields = wait_fields(record)
                if fields:
                    yield StoredPayload(
                        "wait", record.correlation_key, record.namespace, fields, entry.data
                    )
            return
        if kind == CONTEXT_KIND:
            for stream in list(self._contexts):
                found = self._contexts.get(stream)
                if found is None or (found[1] is not None and self.clock.now_ms() >= found[1]):
                    continue
                namespace, stack_id, step_id = stream
                for name, data in list(found[0].items()):
                    value = codec.loads(data, what="context value")
                    if value is None:  # not a payload: nothing to seal (as a wait's None)
                        continue
                    field = context_field(step_id, name)
                    token = (stream, name, data)
                    yield StoredPayload(CONTEXT_KIND, stack_id, namespace, {field: value}, token)
            return
        for stored in list(self._cache):
            entry = self._cache.get(stored)
            if entry is None or not entry.live(self.clock.now_ms()):
                continue
            value = codec.loads(entry.data, what="cached step")
            yield StoredPayload("step", stored, None, {"value": value}, entry.data)

    async def _do_swap_payload(self, item: StoredPayload, fields: dict[str, Any]) -> bool:
        # No await between the comparison and the write: atomic on the event loop.
        now = self.clock.now_ms()
        if item.kind == "wait":
            entry = self._waits.get(wait_key(item.namespace, item.key))
            if entry is None or not entry.live(now) or entry.data != item.token:
                return False
            record = WaitRecord.from_json(entry.data)
            entry.data = with_wait_fields(record, fields).to_json()
            return True
        if item.kind == CONTEXT_KIND:
            # One value of the stream, only if it is still the bytes listed: a change
            # streamed meanwhile (or the stream's expiry) wins over the rekey.
            stream, name, data = item.token
            found = self._contexts.get(stream)
            if found is None or (found[1] is not None and now >= found[1]):
                return False
            values = found[0]
            if values.get(name) != data:
                return False
            (value,) = fields.values()
            values[name] = codec.dumps(value, what=f"context value {name!r}")
            return True
        entry = self._cache.get(item.key)
        if entry is None or not entry.live(now) or entry.data != item.token:
            return False
        entry.data = codec.dumps(fields["value"], what=f"cached value of {item.key!r}")
        return True

    async def _do_delete_payload(self, item: StoredPayload) -> bool:
        # The compare of swap_payload, then the removal, with no await in between.
        now = self.clock.now_ms()
        if item.kind == "wait":
            key = wait_key(item.namespace, item.key)
            entry = self._waits.get(key)
            if entry is None or not entry.live(now) or entry.data != item.token:
                return False
            del self._waits[key]
            return True
        entry = self._cache.get(item.key)
        if entry is None or not entry.live(now) or entry.data != item.token:
            return False
        del self._cache[item.key]
        return True

    # -- context stream and telemetry ---------------------------------------------------------

    async def _do_on_context_change(self, event: ContextChangeEvent) -> None:
        now = self.clock.now_ms()
        key = (event.namespace, event.stack_id, event.step_id)
        fields, gone_at = self._contexts.get(key, ({}, None))
        if gone_at is not None and now >= gone_at:
            fields = {}
        if event.op == "delete":
            fields.pop(event.key, None)
        else:
            fields[event.key] = codec.dumps(event.value, what=f"context value {event.key!r}")
        self._contexts[key] = (fields, self._retention(now))

    async def _do_get_context_changes(
        self, stack_id: str, step_id: str, namespace: str | None = None
    ) -> dict[str, Any]:
        fields, gone_at = self._contexts.get((namespace, stack_id, step_id), ({}, None))
        if gone_at is not None and self.clock.now_ms() >= gone_at:
            return {}
        return {name: codec.loads(data, what="context value") for name, data in fields.items()}

    async def _do_on_cache_event(self, event: CacheEvent) -> None:
        self.cache_events.append(event)
        del self.cache_events[:-1000]
