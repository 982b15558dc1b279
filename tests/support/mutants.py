"""Deliberately broken backends: each a small subclass of the memory backend that breaks
exactly one adapter rule of docs/contract.md. The contract suite must fail each of them
and name that rule (tests/suite/test_contract_mutants.py)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import mutants_backends as b
import mutants_certificate as c
import mutants_holes as h
import mutants_large as lg
import mutants_values as v

from siglo import MISSING, Capability, Checkpoint, CheckpointConflictError, WaitRecord, codec
from siglo.adapter import CacheEntry, StorageAdapter
from siglo.backend import Backend
from siglo.blind import stored_tokens
from siglo.coordination import LockResult, LockState, holder_label
from siglo.errors import InvalidArgumentError
from siglo.listing import (
    CheckpointPage,
    CheckpointSummary,
    ListQuery,
    decode_cursor,
    encode_cursor,
)
from siglo.manager import StorageManager
from siglo.payloads import CONTEXT_KIND, PayloadKind, StoredPayload, with_wait_fields
from siglo.records import CacheEvent, ContextChangeEvent, embedded_wait_record
from siglo_contract.target import OPTION_PROFILES, Target
from siglo_memory import connect as memory_connect
from siglo_memory.adapter import (
    MemoryStorageAdapter,
    _earliest,
    _Entry,
    _StoredCheckpoint,
    wait_key,
)
from siglo_memory.coordination import (
    COMPLETED_PREFIX,
    IN_PROGRESS,
    MemoryIdempotencyStore,
    MemoryLock,
    MemoryNonceStore,
)

T = TypeVar("T")

_ADAPTER_OPTIONS = ("checkpoint_ttl_ms", "cache_ttl_ms", "claim_lease_ms")


def _factory(
    adapter: type[MemoryStorageAdapter] | None = None,
    idempotency: type[MemoryIdempotencyStore] | None = None,
    lock: type[MemoryLock] | None = None,
    nonces: type[MemoryNonceStore] | None = None,
) -> Callable[..., Backend]:
    """A factory like the memory backend's, with some parts replaced by broken ones."""

    def factory(**options: Any) -> Backend:
        backend = memory_connect("memory://", **options)
        clock = options.get("clock")
        if adapter is not None:
            backend.adapter = adapter(
                clock=clock, **{k: v for k, v in options.items() if k in _ADAPTER_OPTIONS}
            )
        if idempotency is not None:
            backend.idempotency = idempotency(clock=clock)
        if lock is not None:
            backend.lock = lock(clock=clock)
        if nonces is not None:
            backend.nonces = nonces(clock=clock)
        return backend

    return factory


# -- checkpoints -----------------------------------------------------------------------------


class DropsExtraFields(MemoryStorageAdapter):
    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        cp = await super()._do_get_checkpoint(stack_id, namespace, fallback=fallback)
        return None if cp is None else cp.replace(extra={})


class GhostCheckpoint(MemoryStorageAdapter):
    """A stack never saved reads as an empty revision-0 checkpoint."""

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        cp = await super()._do_get_checkpoint(stack_id, namespace, fallback=fallback)
        if cp is None:
            return Checkpoint(
                stack_id=stack_id, namespace=namespace, revision=0, timestamp=self.clock.now_ms()
            )
        return cp


class AbsentIsNotZero(MemoryStorageAdapter):
    """With expected_revision=0 a save of a new stack conflicts (absent taken as None)."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        if expected_revision == 0:
            now = self.clock.now_ms()
            if self._live_checkpoint((checkpoint.namespace, checkpoint.stack_id), now) is None:
                raise CheckpointConflictError(checkpoint.stack_id, None, 0, checkpoint.revision)
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


class IgnoresExpectedRevision(MemoryStorageAdapter):
    """A save with expected_revision stores whatever is stored."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        if expected_revision is None:
            await super()._do_save_checkpoint(checkpoint)
            return
        key = (checkpoint.namespace, checkpoint.stack_id)
        self._checkpoints[key] = _Entry(checkpoint.to_json(), checkpoint.expires_at)


class AllowsSidewaysSave(MemoryStorageAdapter):
    """Without expected_revision, a save of the stored revision is accepted."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        if expected_revision is None:
            current = self._live_checkpoint(
                (checkpoint.namespace, checkpoint.stack_id), self.clock.now_ms()
            )
            if current is not None and current.revision == checkpoint.revision:
                self._checkpoints[
                    (checkpoint.namespace, checkpoint.stack_id)
                ].data = checkpoint.to_json()
                return
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


class ReadThenWriteSave(MemoryStorageAdapter):
    """Checks the revision, then yields to the event loop before writing: not atomic."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        key = (checkpoint.namespace, checkpoint.stack_id)
        current = self._live_checkpoint(key, self.clock.now_ms())
        stored = 0 if current is None else current.revision
        refused = (
            stored != expected_revision
            if expected_revision is not None
            else current is not None and checkpoint.revision <= stored
        )
        if refused:
            raise CheckpointConflictError(
                checkpoint.stack_id,
                current and current.revision,
                expected_revision,
                checkpoint.revision,
            )
        await asyncio.sleep(0)
        gone_at = _earliest(checkpoint.expires_at, self._retention(self.clock.now_ms()))
        self._checkpoints[key] = _StoredCheckpoint(
            checkpoint.to_json(), gone_at, checkpoint.revision
        )


class OneBucketForNamespaces(MemoryStorageAdapter):
    """Every non-empty namespace shares one bucket."""

    @staticmethod
    def _ns(namespace: str | None) -> str | None:
        return None if namespace is None else "ns"

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        stored = checkpoint.namespace
        key = (self._ns(stored), checkpoint.stack_id)
        current = self._live_checkpoint(key, self.clock.now_ms())
        revision = None if current is None else current.revision
        ok = (
            (revision or 0) == expected_revision
            if expected_revision is not None
            else revision is None or checkpoint.revision > revision
        )
        if not ok:
            raise CheckpointConflictError(
                checkpoint.stack_id, revision, expected_revision, checkpoint.revision
            )
        self._checkpoints[key] = _Entry(checkpoint.to_json(), checkpoint.expires_at)

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        now = self.clock.now_ms()
        found = self._live_checkpoint((self._ns(namespace), stack_id), now)
        if found is None and namespace is not None and fallback:
            found = self._live_checkpoint((None, stack_id), now)
        return found


class _JoinedCheckpointKeys(dict[tuple[str | None, str], _StoredCheckpoint]):
    """Checkpoints keyed by ``f"{namespace or ''}:{stack_id}"`` (under the namespace
    ``""``, no namespace's name, so that a joined key joins to itself)."""

    @staticmethod
    def _join(key: tuple[str | None, str]) -> tuple[str | None, str]:
        namespace, stack_id = key
        return key if namespace == "" else ("", f"{namespace or ''}:{stack_id}")

    def __getitem__(self, key: tuple[str | None, str]) -> _StoredCheckpoint:
        return super().__getitem__(self._join(key))

    def __setitem__(self, key: tuple[str | None, str], value: _StoredCheckpoint) -> None:
        super().__setitem__(self._join(key), value)

    def __delitem__(self, key: tuple[str | None, str]) -> None:
        super().__delitem__(self._join(key))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and super().__contains__(self._join(key))

    def get(self, key: tuple[str | None, str], default: Any = None) -> Any:
        return super().get(self._join(key), default)

    def pop(self, key: tuple[str | None, str], *default: Any) -> Any:
        return super().pop(self._join(key), *default)


class NamespaceJoinedToStackId(MemoryStorageAdapter):
    """Keys a checkpoint by its namespace and stack id joined with ``:``: namespace ``a``
    with stack ``b:c`` and namespace ``a:b`` with stack ``c`` are one row, one tenant
    reading and overwriting another's (a black-box auditor's plugin that passed every
    check of contract 1.7)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._checkpoints = _JoinedCheckpointKeys()


class AlwaysFallsBack(MemoryStorageAdapter):
    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        return await super()._do_get_checkpoint(stack_id, namespace, fallback=True)


class ReturnsExpired(MemoryStorageAdapter):
    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        for key in ((namespace, stack_id), (None, stack_id)):
            entry = self._checkpoints.get(key)
            if entry is not None:
                return Checkpoint.from_json(entry.data)
            if namespace is None or not fallback:
                break
        return None


class CleansLiveCheckpoints(MemoryStorageAdapter):
    """Clean-up removes every checkpoint that has an expiry time, expired or not."""

    async def _do_clean_expired_checkpoints(self) -> int:
        doomed = [k for k, e in self._checkpoints.items() if e.gone_at is not None]
        for key in doomed:
            del self._checkpoints[key]
        return len(doomed)


class CleansNothing(MemoryStorageAdapter):
    """Clean-up removes nothing and says so: expired checkpoints stay stored for ever
    (hidden from reads, but never freed). A black-box auditor's plugin passed the
    suite this way."""

    async def _do_clean_expired_checkpoints(self) -> int:
        return 0


class TruncatesIds(MemoryStorageAdapter):
    """Stores checkpoints under the first 255 characters of the stack id (a VARCHAR(255))."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        await super()._do_save_checkpoint(
            checkpoint.replace(stack_id=checkpoint.stack_id[:255]),
            expected_revision=expected_revision,
        )

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        cp = await super()._do_get_checkpoint(stack_id[:255], namespace, fallback=fallback)
        return None if cp is None else cp.replace(stack_id=stack_id)


class AcceptsEmptyIds(MemoryStorageAdapter):
    """Overrides the public method, skipping the base class's argument checks."""

    async def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        if stack_id == "":
            return None
        return await super().get_checkpoint(stack_id, namespace, fallback=fallback)


# -- wait records ------------------------------------------------------------------------------


class DropsWaitMetadata(MemoryStorageAdapter):
    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        await super()._do_save_wait_record(record.replace(metadata=None), ttl_ms=ttl_ms)


class CreateOverwrites(MemoryStorageAdapter):
    """create_wait_record saves whatever is there, as save_wait_record does."""

    async def _do_create_wait_record(self, record: WaitRecord, *, ttl_ms: int | None) -> bool:
        await self._do_save_wait_record(record, ttl_ms=ttl_ms)
        return True


class FirstRecordOfStack(MemoryStorageAdapter):
    """The stack index keeps the first record saved for a stack, not the latest."""

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        stack = wait_key(record.namespace, record.stack_id)
        previous = self._latest_wait_of_stack.get(stack)
        await super()._do_save_wait_record(record, ttl_ms=ttl_ms)
        if previous is not None and previous in self._waits:
            self._latest_wait_of_stack[stack] = previous


class LatestWaitOfStackIgnoresNamespace(MemoryStorageAdapter):
    """The index of a stack's latest wait record is kept by stack id alone, whatever the
    namespace, and its correlation key looked up in the caller's namespace: after
    ``B/k1``, ``B/k2`` and then ``A/k1`` of one stack, namespace ``B`` reads ``k1`` by
    stack id (a black-box auditor's plugin that passed every check of contract 1.7)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._latest_key_of_stack: dict[str, str] = {}

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        await super()._do_save_wait_record(record, ttl_ms=ttl_ms)
        self._latest_key_of_stack[record.stack_id] = record.correlation_key

    async def _do_get_wait_record(
        self, correlation_key_or_stack_id: str, namespace: str | None = None
    ) -> WaitRecord | None:
        now = self.clock.now_ms()
        record = self._live_wait(wait_key(namespace, correlation_key_or_stack_id), now)
        latest = self._latest_key_of_stack.get(correlation_key_or_stack_id)
        if record is None and latest is not None:
            record = self._live_wait(wait_key(namespace, latest), now)
        if record is not None:
            return record
        checkpoint = self._live_checkpoint((namespace, correlation_key_or_stack_id), now)
        return None if checkpoint is None else embedded_wait_record(checkpoint.metadata)


class NoCheckpointFallback(MemoryStorageAdapter):
    async def _do_get_wait_record(
        self, correlation_key_or_stack_id: str, namespace: str | None = None
    ) -> WaitRecord | None:
        now = self.clock.now_ms()
        key = wait_key(namespace, correlation_key_or_stack_id)
        record = self._live_wait(key, now)
        if record is None and key in self._latest_wait_of_stack:
            record = self._live_wait(self._latest_wait_of_stack[key], now)
        return record


class ClaimYieldsBeforeWriting(MemoryStorageAdapter):
    """Checks the record is waiting, yields to the event loop, then writes: not atomic."""

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
        now = self.clock.now_ms()
        record = self._live_wait(wait_key(namespace, correlation_key), now)
        if (
            record is None
            or record.status != "waiting"
            or (record.is_expired(now) and not allow_expired)
        ):
            return await super()._do_claim_wait_record(
                correlation_key,
                claimant_id,
                allow_expired=allow_expired,
                event_payload=event_payload,
                lease_ms=lease_ms,
                namespace=namespace,
            )
        await asyncio.sleep(0)
        claimed = record.replace(
            status="claimed",
            claimant_id=claimant_id or secrets.token_hex(8),
            claimed_at=now,
            lease_expires_at=now + (lease_ms or self.claim_lease_ms),
            event_payload=record.event_payload if event_payload is MISSING else event_payload,
        )
        self._store_wait(claimed)
        return claimed


class ClaimsCompleted(MemoryStorageAdapter):
    """A completed record can be claimed again."""

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
        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is not None and record.status == "completed":
            self._store_wait(record.replace(status="waiting"))
        return await super()._do_claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class IgnoresDeadline(MemoryStorageAdapter):
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
            allow_expired=True,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class LeaseNeverEnds(MemoryStorageAdapter):
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
        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is not None and record.status == "claimed" and record.claimant_id != claimant_id:
            return None
        return await super()._do_claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class AnyoneCompletes(MemoryStorageAdapter):
    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is not None and record.status == "claimed" and record.claimant_id:
            claimant_id = record.claimant_id
        await super()._do_complete_wait_record(correlation_key, claimant_id, namespace)


class AnyoneReleases(MemoryStorageAdapter):
    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> bool:
        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is not None and record.status == "claimed" and record.claimant_id:
            claimant_id = record.claimant_id
        return await super()._do_release_wait_record(correlation_key, claimant_id, namespace)


class CancelsCompleted(MemoryStorageAdapter):
    async def _do_cancel_wait_record(
        self, correlation_key: str, namespace: str | None = None
    ) -> bool:
        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is not None and record.status == "completed":
            self._store_wait(record.replace(status="cancelled"))
            return True
        return await super()._do_cancel_wait_record(correlation_key, namespace)


class CancelWorkflowKeepsRevision(MemoryStorageAdapter):
    async def _do_cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        key = (namespace, stack_id)
        before = self._live_checkpoint(key, self.clock.now_ms())
        await super()._do_cancel_workflow(stack_id, namespace)
        after = self._live_checkpoint(key, self.clock.now_ms())
        if before is not None and after is not None and after.revision != before.revision:
            self._checkpoints[key].data = after.replace(revision=before.revision).to_json()


class WaitsShareNamespaces(MemoryStorageAdapter):
    """Wait records keyed by correlation key / stack id alone, whatever their namespace
    (issue 11 defect 12: one tenant read another's record)."""

    def _store_wait(self, record: WaitRecord) -> None:
        self._waits[record.correlation_key].data = record.to_json()

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        await super()._do_save_wait_record(record.replace(namespace=None), ttl_ms=ttl_ms)
        self._waits[record.correlation_key].data = record.to_json()

    async def _do_get_wait_record(
        self, correlation_key_or_stack_id: str, namespace: str | None = None
    ) -> WaitRecord | None:
        return await super()._do_get_wait_record(correlation_key_or_stack_id, None)

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
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=None,
        )

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        await super()._do_complete_wait_record(correlation_key, claimant_id, None)

    async def _do_cancel_wait_record(
        self, correlation_key: str, namespace: str | None = None
    ) -> bool:
        return await super()._do_cancel_wait_record(correlation_key, None)


class KeepsUntilDeleted(MemoryStorageAdapter):
    """Ignores ``checkpoint_ttl_ms``: a checkpoint without ``expires_at`` (and a wait
    record without ``ttl_ms``) is kept forever (an outside plugin author's break that
    passed every check before contract 1.6)."""

    def _retention(self, now: int) -> int | None:
        return None


class NoRetentionIsADay(MemoryStorageAdapter):
    """Takes ``checkpoint_ttl_ms=None`` (no retention, a user's default) for a day's:
    checkpoints kept "until deleted" are gone tomorrow (a black-box auditor's plugin
    that passed every check of contract 1.7)."""

    def _retention(self, now: int) -> int | None:
        if self.checkpoint_ttl_ms is None:
            return now + 86_400_000
        return super()._retention(now)


class CacheDefaultNeverExpires(MemoryStorageAdapter):
    """An entry set without a TTL never expires, where the adapter's ``cache_ttl_ms``
    is its TTL (a black-box auditor's plugin that passed every check of contract 1.7)."""

    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        await super()._do_set_cached_step(key, value, 2**62 if ttl_ms is None else ttl_ms)


class OwnCacheTtlDefault(MemoryStorageAdapter):
    """Its own ``cache_ttl_ms`` default, what a user's ``siglo.connect`` gets when naming
    none, is 31 years, not siglo's 300 s (``DEFAULTS.cache_ttl_ms``): right whenever the
    option is given, as the suite's profile gives it (a black-box auditor's plugin
    passed ``--options all``: the user-defaults profile gave it too)."""

    def __init__(self, *, cache_ttl_ms: int = 10**12, **options: Any) -> None:
        super().__init__(cache_ttl_ms=cache_ttl_ms, **options)


class OwnClaimLeaseDefault(MemoryStorageAdapter):
    """Its own ``claim_lease_ms`` default is an hour, not siglo's 60 s
    (``DEFAULTS.claim_lease_ms``): a claim without ``lease_ms`` under a user's
    ``siglo.connect`` holds a record from a dead worker for an hour."""

    def __init__(self, *, claim_lease_ms: int = 3_600_000, **options: Any) -> None:
        super().__init__(claim_lease_ms=claim_lease_ms, **options)


class RetentionFromTimestamp(MemoryStorageAdapter):
    """Counts ``checkpoint_ttl_ms`` from the checkpoint's own ``timestamp``, not from its
    save: a checkpoint stamped earlier (an import, a slow clock) is gone at once (an
    outside plugin author's break that passed every check of contract 1.6)."""

    _stamp: int | None = None

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        self._stamp = checkpoint.timestamp
        try:
            await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)
        finally:
            self._stamp = None

    def _retention(self, now: int) -> int | None:
        return super()._retention(now if self._stamp is None else self._stamp)


class ClaimFallsBackAcrossNamespaces(MemoryStorageAdapter):
    """A claim in a namespace that has no record of the key takes the record of that key
    in another namespace (a fallback like the checkpoints' read, wrongly on a write)."""

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
        if namespace is not None and wait_key(namespace, correlation_key) not in self._waits:
            for stored in list(self._waits):
                if stored == correlation_key or (
                    isinstance(stored, tuple) and stored[1] == correlation_key
                ):
                    namespace = None if stored == correlation_key else stored[0]
                    break
        return await super()._do_claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class KeepsWaitsForever(MemoryStorageAdapter):
    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        await super()._do_save_wait_record(record, ttl_ms=None)
        self._waits[wait_key(record.namespace, record.correlation_key)].gone_at = None


# -- workflow lock ----------------------------------------------------------------------------


class NoWorkflowLock(MemoryStorageAdapter):
    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None = None
    ) -> T:
        return await action()


async def _take_memory_workflow_lock(
    adapter: MemoryStorageAdapter, stack_id: str, timeout_ms: int | None
) -> asyncio.Lock:
    """The memory backend's workflow lock of ``stack_id``, acquired (for mutants that
    release it their own way)."""
    lock = adapter._workflow_locks.setdefault(stack_id, asyncio.Lock())
    try:
        await asyncio.wait_for(lock.acquire(), (timeout_ms or 30_000) / 1000)
    except TimeoutError:
        from siglo.errors import LockNotAcquiredError

        raise LockNotAcquiredError(f"workflow lock {stack_id!r} held") from None
    return lock


class WorkflowLockLeaksOnError(MemoryStorageAdapter):
    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None = None
    ) -> T:
        lock = await _take_memory_workflow_lock(self, stack_id, timeout_ms)
        result = await action()  # no finally: an exception leaves the lock held
        lock.release()
        return result


class WorkflowLockIsAPublicLock(MemoryStorageAdapter):
    """with_workflow_lock(X) takes the public lock "workflow:X" (issue 11 defect 7)."""

    public: MemoryLock

    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None = None
    ) -> T:
        from siglo.locking import run_with_lock

        return await run_with_lock(
            self.public, "workflow:" + stack_id, action, timeout_ms=timeout_ms or 30_000
        )


class DeletesWhatTheStackHasLater(MemoryStorageAdapter):
    """delete_checkpoint deletes the checkpoint, then, a few turns later, every wait and
    context the stack has by then: a re-run's (Redis before issue 31, defect 9)."""

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        current = await self.get_checkpoint(stack_id, namespace, fallback=False)
        if expected_revision is not None and (
            current is None or current.revision != expected_revision
        ):
            raise CheckpointConflictError(
                stack_id, None if current is None else current.revision, expected_revision
            )
        self._checkpoints.pop((namespace, stack_id), None)
        for _ in range(5):
            await asyncio.sleep(0)
        await super()._do_delete_checkpoint(stack_id, namespace, None)
        return current is not None


class WorkflowLockIgnoresNamespace(MemoryStorageAdapter):
    """with_workflow_lock drops the namespace: tenant B's run waits for tenant A's run of
    the same stack id (issue 31, defect 9)."""

    async def with_workflow_lock(
        self,
        stack_id: str,
        action: Callable[[], Awaitable[T]],
        *,
        timeout_ms: int | None = None,
        namespace: str | None = None,
    ) -> T:
        return await super().with_workflow_lock(stack_id, action, timeout_ms=timeout_ms)


class _EarlyOrNeverUnlock(MemoryStorageAdapter):
    """A memory workflow lock whose unlocking save decides the release itself."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._taken: set[str] = set()
        """Stacks whose lock the unlocking save dealt with (released, or skipped)."""

    def _unlock_at_save(self, stack_id: str) -> None:
        raise NotImplementedError

    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None = None
    ) -> T:
        lock = await _take_memory_workflow_lock(self, stack_id, timeout_ms)
        try:
            return await action()
        finally:
            if stack_id in self._taken:
                self._taken.discard(stack_id)  # the unlocking save dealt with the lock
            else:
                lock.release()

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Any = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        lock = self._workflow_locks.get(checkpoint.stack_id)
        if lock is not None and lock.locked() and checkpoint.stack_id not in self._taken:
            self._taken.add(checkpoint.stack_id)
            self._unlock_at_save(checkpoint.stack_id)
            await asyncio.sleep(0.2)  # the save lands later
        await super().save_checkpoint_unlocking(
            checkpoint, changes, expected_revision=expected_revision
        )


class UnlocksBeforeSaving(_EarlyOrNeverUnlock):
    """lock.workflow.unlocking-save: the lock is freed first, then (checked and) saved."""

    def _unlock_at_save(self, stack_id: str) -> None:
        self._workflow_locks[stack_id].release()


class UnlockingStrandsLock(_EarlyOrNeverUnlock):
    """lock.workflow.unlocking-save: the release is skipped, as if the save had sent it."""

    def _unlock_at_save(self, stack_id: str) -> None:
        pass


class UnlockingIgnoresExpected(MemoryStorageAdapter):
    """lock.workflow.unlocking-save: the last save of an action drops expected_revision."""

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Any = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        await super().save_checkpoint_unlocking(checkpoint, changes)


class CachingSaveDropsEntry(MemoryStorageAdapter):
    """cache.with-checkpoint: the caching save stores the checkpoint, not its entry."""

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Any,
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        await self.save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )


class CachingSaveEntryOnlyIfSaved(MemoryStorageAdapter):
    """cache.with-checkpoint: the entry is stored only when the compare-and-set wins."""

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Any,
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        await self.save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )
        await self.set_cached_step(entry.key, entry.value, entry.ttl_ms, **entry.in_namespace())


class CachingSaveDefaultNeverExpires(MemoryStorageAdapter):
    """cache.with-checkpoint: an entry given ``ttl_ms=None`` (the adapter's default,
    ``cache_ttl_ms``, as set_cached_step gives it) is cached for 31 years (a black-box
    auditor's plugin that passed every rule of contract 1.7: the check read the entry
    only while it should be live)."""

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Any,
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        if entry.ttl_ms is None:
            entry = replace(entry, ttl_ms=10**12)
        await super().save_checkpoint_caching(
            checkpoint, changes, entry, expected_revision=expected_revision, unlock=unlock
        )


class CachingSaveIgnoresTtl(MemoryStorageAdapter):
    """cache.with-checkpoint: the entry is cached for the adapter's default TTL."""

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Any,
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        await super().save_checkpoint_caching(
            checkpoint,
            changes,
            replace(entry, ttl_ms=None),
            expected_revision=expected_revision,
            unlock=unlock,
        )


def _shares_public_lock(**options: Any) -> Backend:
    backend = memory_connect("memory://", **options)
    adapter = WorkflowLockIsAPublicLock(
        clock=options.get("clock"),
        **{k: v for k, v in options.items() if k in _ADAPTER_OPTIONS},
    )
    assert isinstance(backend.lock, MemoryLock)
    adapter.public = backend.lock
    backend.adapter = adapter
    return backend


# -- step cache, context, cache events ------------------------------------------------------


class FirstSetWins(MemoryStorageAdapter):
    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        if await self.get_cached_step(key) is MISSING:
            await super()._do_set_cached_step(key, value, ttl_ms)


def _normalise_sealed(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: v.replace("+", "-").replace("/", "_").rstrip("=")
            if k == "$siglo" and isinstance(v, str)
            else _normalise_sealed(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_normalise_sealed(v) for v in value]
    return value


class RewritesSealedBase64(MemoryStorageAdapter):
    """payload.byte-faithful: sealed values are stored with their base64 rewritten to the
    URL-safe alphabet, unpadded (a layer "normalising" what looks like base64)."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        contexts = {c: _normalise_sealed(ctx) for c, ctx in checkpoint.contexts.items()}
        metadata = _normalise_sealed(checkpoint.metadata)
        await super()._do_save_checkpoint(
            checkpoint.replace(contexts=contexts, metadata=metadata),
            expected_revision=expected_revision,
        )


class DropsCachedNone(MemoryStorageAdapter):
    async def _do_get_cached_step(self, key: str) -> Any:
        value = await super()._do_get_cached_step(key)
        return MISSING if value is None else value


class MissIsNone(MemoryStorageAdapter):
    async def _do_get_cached_step(self, key: str) -> Any:
        value = await super()._do_get_cached_step(key)
        return None if value is MISSING and key not in self._cache else value


class CacheIgnoresTtl(MemoryStorageAdapter):
    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        await super()._do_set_cached_step(key, value, None)


class CacheIgnoresNamespace(MemoryStorageAdapter):
    """The step cache drops the namespace: tenant B reads tenant A's cached step
    output (issue 33)."""

    async def get_cached_step(self, key: str, *, namespace: str | None = None) -> Any:
        return await super().get_cached_step(key)

    async def set_cached_step(
        self, key: str, value: Any, ttl_ms: int | None = None, *, namespace: str | None = None
    ) -> None:
        await super().set_cached_step(key, value, ttl_ms)


class ScanSkipsNamespacedWaits(MemoryStorageAdapter):
    """The payload walk lists only un-namespaced wait records: a rekey leaves every
    tenant's waits under the old key (issue 33)."""

    async def _do_scan_payloads(self, kind: PayloadKind) -> AsyncIterator[StoredPayload]:
        async for item in super()._do_scan_payloads(kind):
            if item.kind != "wait" or item.namespace is None:
                yield item


class SwapIgnoresWhatWasListed(MemoryStorageAdapter):
    """The payload rewrite never compares: a claim or a set made after the listing is
    overwritten by the rekey (issue 33)."""

    async def _do_swap_payload(self, item: StoredPayload, fields: dict[str, Any]) -> bool:
        if item.kind == "wait":
            entry = self._waits.get(wait_key(item.namespace, item.key))
            if entry is None:
                return False
            record = WaitRecord.from_json(item.token)
            entry.data = with_wait_fields(record, fields).to_json()
            return True
        stored = self._cache.get(item.key)
        if stored is None:
            return False
        stored.data = codec.dumps(fields["value"], what="cached step")
        return True


class DeleteIgnoresWhatWasListed(MemoryStorageAdapter):
    """The payload delete never compares: a wait record claimed or a step set after the
    listing is deleted by the erasure all the same (issue 33)."""

    async def _do_delete_payload(self, item: StoredPayload) -> bool:
        if item.kind == "wait":
            return self._waits.pop(wait_key(item.namespace, item.key), None) is not None
        return self._cache.pop(item.key, None) is not None


class ContextSwapIgnoresWhatWasListed(MemoryStorageAdapter):
    """payload.context: the rewrite of a context-change stream value never compares: a
    change streamed after the listing is overwritten by the rekey, and a key deleted since
    comes back."""

    async def _do_swap_payload(self, item: StoredPayload, fields: dict[str, Any]) -> bool:
        if item.kind != CONTEXT_KIND:
            return await super()._do_swap_payload(item, fields)
        stream, name, _ = item.token
        found = self._contexts.get(stream)
        if found is None:
            return False
        (value,) = fields.values()
        found[0][name] = codec.dumps(value, what=f"context value {name!r}")
        return True


class ResultSwapIgnoresWhatWasListed(MemoryIdempotencyStore):
    """The result rewrite never compares: a completion made after the listing is
    overwritten by the rekey (issue 33)."""

    async def _do_swap_result(self, item: StoredPayload, result: Any) -> bool:
        if self._keys.get(item.key) is None:
            return False
        self._keys.replace(item.key, "COMPLETED:" + codec.dumps_str(result, what="result"))
        return True


class IgnoresContextDeletes(MemoryStorageAdapter):
    async def _do_on_context_change(self, event: ContextChangeEvent) -> None:
        if isinstance(event, ContextChangeEvent) and event.op == "delete":
            return
        await super()._do_on_context_change(event)


class ErrorEventsEvictCache(MemoryStorageAdapter):
    async def _do_on_cache_event(self, event: CacheEvent) -> None:
        await super()._do_on_cache_event(event)
        if event.type == "error":
            self._cache.pop(event.key, None)


class UndeclaredCacheMethods(MemoryStorageAdapter):
    """Declares the step cache but does not implement reading it."""

    _do_get_cached_step = StorageAdapter._do_get_cached_step  # type: ignore[assignment]


# -- idempotency, locks, nonces ------------------------------------------------------------


class IdempotencyYields(MemoryIdempotencyStore):
    async def _do_claim(self, key: str, ttl_ms: int | None) -> Any:
        value = self._keys.get(key)
        await asyncio.sleep(0)
        if value is None:
            self._keys.set(key, IN_PROGRESS, ttl_ms or self.default_ttl_ms)
            return "claimed"
        return "completed" if value.startswith(COMPLETED_PREFIX) else "in-progress"


class IdempotencyDropsNone(MemoryIdempotencyStore):
    async def _do_get_result(self, key: str) -> Any:
        value = await super()._do_get_result(key)
        return MISSING if value is None else value


class FailDeletesCompleted(MemoryIdempotencyStore):
    async def _do_fail(self, key: str, error: BaseException | None) -> None:
        self._keys.delete(key)


class IdempotencyIgnoresTtl(MemoryIdempotencyStore):
    async def _do_claim(self, key: str, ttl_ms: int | None) -> Any:
        return await super()._do_claim(key, None)

    async def _do_complete(self, key: str, result: Any, ttl_ms: int | None) -> None:
        await super()._do_complete(key, result, None)


class CompleteIgnoresOwner(MemoryIdempotencyStore):
    """Anyone may complete or fail: the token is not checked (the Powertools failure)."""

    async def _do_complete_owned(
        self, key: str, result: Any, ttl_ms: int | None, token: str | None
    ) -> bool:
        await self._do_complete(key, result, ttl_ms)
        return True


class LeaseIsRetention(MemoryIdempotencyStore):
    """An in-progress claim is kept as long as a result: a crashed claimer holds it a day."""

    async def _do_claim_owned(
        self, key: str, ttl_ms: int | None, token: str | None, fingerprint: str | None
    ) -> Any:
        return await super()._do_claim_owned(key, ttl_ms or self.default_ttl_ms, token, fingerprint)


class IgnoresFingerprint(MemoryIdempotencyStore):
    """The fingerprint is never stored, so a different request under the key passes."""

    async def _do_claim_owned(
        self, key: str, ttl_ms: int | None, token: str | None, fingerprint: str | None
    ) -> Any:
        return await super()._do_claim_owned(key, ttl_ms, token, None)


class LockYields(MemoryLock):
    """Checks the lock is free, yields to the event loop, then takes it: not atomic."""

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        token = custom_token or f"lock_{self.clock.now_ms()}_{secrets.token_hex(16)}"
        held = self._holders.get(lock_key)
        await asyncio.sleep(0)
        if held is not None:
            return LockResult(acquired=False, token=token)
        self._holders.set(lock_key, token, ttl_ms)
        fence = self._fences.get(lock_key, 0) + 1
        self._fences[lock_key] = fence
        return LockResult(acquired=True, token=token, fencing_token=fence)


class ReleaseIgnoresToken(MemoryLock):
    async def _do_release(self, lock_key: str, token: str) -> bool:
        if self._holders.get(lock_key) is None:
            return False
        self._holders.delete(lock_key)
        return True


class ExtendIgnoresToken(MemoryLock):
    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        holder = self._holders.get(lock_key)
        if holder is None:
            return False
        self._holders.set(lock_key, holder, ttl_ms)
        return True


class LockNeverExpires(MemoryLock):
    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        return await super()._do_acquire(lock_key, 10**12, custom_token)

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        return await super()._do_extend(lock_key, token, 10**12)


class ConstantFencing(MemoryLock):
    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        result = await super()._do_acquire(lock_key, ttl_ms, custom_token)
        if result.acquired:
            return LockResult(acquired=True, token=result.token, fencing_token=1)
        return result


class BadTokenFormat(MemoryLock):
    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        return await super()._do_acquire(
            lock_key, ttl_ms, custom_token or f"lock-{secrets.token_hex(8)}"
        )


class InspectShowsLapsedLease(MemoryLock):
    """inspect reads the stored holder without its expiry: a lapsed lease reads as held."""

    async def _do_inspect(self, lock_key: str) -> LockState | None:
        item = self._holders._items.get(lock_key)  # the stored entry, expired or not
        if item is None:
            return None
        token, expires_at = item
        left = max(1, expires_at - self.clock.now_ms())
        return LockState(holder_label(token), left, self._fences.get(lock_key))


class InspectShowsTheToken(MemoryLock):
    """inspect names the holder by its token: whoever reads the page can release it."""

    async def _do_inspect(self, lock_key: str) -> LockState | None:
        state = await super()._do_inspect(lock_key)
        token = self._holders.get(lock_key)
        if state is None or token is None:
            return state
        return LockState(token, state.expires_in_ms, state.fencing_token)


class WithLockLeaksOnError(MemoryLock):
    async def with_lock(
        self,
        lock_key: str,
        fn: Callable[[], Awaitable[T]],
        ttl_ms: int = 10_000,
        *,
        wait_ms: int = 0,
    ) -> T:
        result = await self.acquire(lock_key, ttl_ms)
        if not result.acquired:
            from siglo.errors import LockNotAcquiredError

            raise LockNotAcquiredError(f"lock {lock_key!r} held")
        value = await fn()  # no finally: an exception leaves the lock held
        await self.release(lock_key, result.token)
        return value


class WithLockNeverWaits(MemoryLock):
    """with_lock tries once whatever wait_ms says (issue 31, item 12: it never waited)."""

    async def with_lock(
        self,
        lock_key: str,
        fn: Callable[[], Awaitable[T]],
        ttl_ms: int = 10_000,
        *,
        wait_ms: int = 0,
    ) -> T:
        return await super().with_lock(lock_key, fn, ttl_ms)


class NonceYields(MemoryNonceStore):
    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        seen = self._seen.get(key)
        await asyncio.sleep(0)
        if seen is not None:
            return False
        self._seen.set(key, "1", ttl_ms)
        return True


class NonceWindowTooLong(MemoryNonceStore):
    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        return await super()._do_claim(key, ttl_ms * 1000)


class NonceWindowAtLeastASecond(MemoryNonceStore):
    """Keeps every nonce at least a second: a window of ``ttl_seconds=0.5`` lasts 1,000 ms,
    not 500 (a black-box auditor's plugin that passed every check of contract 1.7)."""

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        return await super()._do_claim(key, max(ttl_ms, 1_000))


class NotJsonChecked(MemoryStorageAdapter):
    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        try:
            await super()._do_set_cached_step(key, value, ttl_ms)
        except InvalidArgumentError:
            await super()._do_set_cached_step(key, repr(value), ttl_ms)


# -- operating what is stored -------------------------------------------------------------


class CursorSkipsOne(MemoryStorageAdapter):
    """A page's next_cursor points one stack too far: every page boundary loses one."""

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        page = await super()._do_list_checkpoints(query)
        if page.next_cursor is None:
            return page
        peek = await super()._do_list_checkpoints(replace(query, limit=1, cursor=page.next_cursor))
        if not peek.items:
            return page
        last = peek.items[0]
        return CheckpointPage(page.items, encode_cursor(last.namespace or "", last.stack_id))


class StatusFilterIgnored(MemoryStorageAdapter):
    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        return await super()._do_list_checkpoints(replace(query, statuses=None))


class ListsExpired(MemoryStorageAdapter):
    """Listing forgets expiry (the entries' gone_at is ignored)."""

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        saved = {k: e.gone_at for k, e in self._checkpoints.items()}
        for entry in self._checkpoints.values():
            entry.gone_at = None
        try:
            return await super()._do_list_checkpoints(query)
        finally:
            for key, gone_at in saved.items():
                if key in self._checkpoints:
                    self._checkpoints[key].gone_at = gone_at


class TokensOfTheFirstSave(MemoryStorageAdapter):
    """The blind-index entry of a stack is written by its first save only: after its
    value changes, a walk by tokens still finds it under the old token."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)
        first: dict[Any, dict[str, str]] = self.__dict__.setdefault("_first_tokens", {})
        first.setdefault(
            (checkpoint.namespace, checkpoint.stack_id), stored_tokens(checkpoint.metadata)
        )

    async def _do_list_by_index(self, query: ListQuery, tokens: dict[str, str]) -> CheckpointPage:
        first: dict[Any, dict[str, str]] = self.__dict__.get("_first_tokens", {})
        return self._walk(
            query,
            lambda cp: all(
                first.get((cp.namespace, cp.stack_id), {}).get(f) == v for f, v in tokens.items()
            ),
        )


class TokensOutliveDelete(MemoryStorageAdapter):
    """A delete leaves the stack's blind-index entry: a walk by its token still lists the
    deleted stack."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)
        kept: dict[Any, Checkpoint] = self.__dict__.setdefault("_kept_tokens", {})
        kept[(checkpoint.namespace, checkpoint.stack_id)] = checkpoint

    async def _do_list_by_index(self, query: ListQuery, tokens: dict[str, str]) -> CheckpointPage:
        page = await super()._do_list_by_index(query, tokens)
        if page.next_cursor is not None:
            return page
        kept: dict[Any, Checkpoint] = self.__dict__.get("_kept_tokens", {})
        ghosts = [
            CheckpointSummary.of(cp)
            for key, cp in sorted(kept.items(), key=lambda item: str(item[0]))
            if key not in self._checkpoints
            and query.matches(cp)
            and all(stored_tokens(cp.metadata).get(f) == v for f, v in tokens.items())
        ]
        return CheckpointPage([*page.items, *ghosts], None)


class OffsetPages(MemoryStorageAdapter):
    """Pages by offset into the sorted stacks: a stack saved or deleted before the
    position shifts every later one."""

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        offset = 0 if query.cursor is None else int(decode_cursor(query.cursor, 1)[0])
        everything = await super()._do_list_checkpoints(replace(query, cursor=None, limit=10_000))
        items = list(everything.items)[offset : offset + query.limit]
        more = offset + query.limit < len(everything.items)
        return CheckpointPage(items, encode_cursor(str(offset + query.limit)) if more else None)


class DeleteKeepsWaits(MemoryStorageAdapter):
    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        waits = dict(self._waits)
        deleted = await super()._do_delete_checkpoint(stack_id, namespace, expected_revision)
        self._waits.update(waits)
        return deleted


class DeleteIgnoresExpectedRevision(MemoryStorageAdapter):
    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        return await super()._do_delete_checkpoint(stack_id, namespace, None)


class DueIncludesHeld(MemoryStorageAdapter):
    """A claim under a live lease is fired again (two workers would both fire it)."""

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        now = self.clock.now_ms()
        due = [
            record
            for key in self._waits
            if (record := self._live_wait(key, now)) is not None
            and record.is_expired(now)
            and record.status in ("waiting", "claimed")
        ]
        due.sort(key=lambda r: (r.expires_at or 0, r.correlation_key))
        return due[:limit]


@dataclass(frozen=True)
class Mutant:
    """A broken backend and the rule it breaks."""

    rule_id: str
    factory: Callable[..., Backend]
    description: str
    name: str
    """The broken part's class name: a stable id for the test and for worker processes."""
    manager: type[StorageManager] = StorageManager
    """The manager the suite's end-to-end checks use (a broken one for ``manager.*``)."""
    profile: str = "suite"
    """The option profile the suite runs it under (``siglo check --options PROFILE``):
    ``user-defaults`` for a backend broken only in its own defaults, which the suite's
    profile overrides with explicit options."""

    def target(self) -> Target:
        """The suite's target for this mutant, as a third party's factory would give."""
        target = Target.from_factory(
            self.factory, label=self.name, options=OPTION_PROFILES[self.profile]
        )
        target.manager_factory = self.manager
        return target


def _m(
    rule_id: str,
    description: str,
    manager: type[StorageManager] = StorageManager,
    *,
    profile: str = "suite",
    **parts: Any,
) -> Mutant:
    names = "+".join(
        cls.__name__ for cls in [*parts.values(), manager] if cls is not StorageManager
    )
    return Mutant(rule_id, _factory(**parts), description, names, manager, profile)


MUTANTS: tuple[Mutant, ...] = (
    _m(
        "checkpoint.roundtrip",
        "drops unknown wire fields",
        adapter=DropsExtraFields,
    ),
    _m(
        "checkpoint.missing",
        "a never-saved stack reads as revision 0",
        adapter=GhostCheckpoint,
    ),
    _m(
        "checkpoint.occ.expected",
        "an absent checkpoint is not revision 0",
        adapter=AbsentIsNotZero,
    ),
    _m(
        "checkpoint.occ.conflict",
        "a save ignores expected_revision",
        adapter=IgnoresExpectedRevision,
    ),
    _m(
        "checkpoint.occ.monotonic",
        "a save may rewrite the stored revision",
        adapter=AllowsSidewaysSave,
    ),
    _m(
        "checkpoint.occ.atomic",
        "read, yield, write",
        adapter=ReadThenWriteSave,
    ),
    _m(
        "checkpoint.namespace.isolation",
        "one bucket for all namespaces",
        adapter=OneBucketForNamespaces,
    ),
    _m(
        "checkpoint.namespace.isolation",
        "a checkpoint's key is its namespace and stack id joined with ':'",
        adapter=NamespaceJoinedToStackId,
    ),
    _m(
        "checkpoint.namespace.fallback",
        "fallback=False is ignored",
        adapter=AlwaysFallsBack,
    ),
    _m(
        "checkpoint.expiry.hidden",
        "expired checkpoints are returned",
        adapter=ReturnsExpired,
    ),
    _m(
        "checkpoint.expiry.clean",
        "clean-up removes live checkpoints",
        adapter=CleansLiveCheckpoints,
    ),
    _m(
        "checkpoint.expiry.clean",
        "clean-up removes nothing",
        adapter=CleansNothing,
    ),
    _m("wait.roundtrip", "a saved record loses its metadata", adapter=DropsWaitMetadata),
    _m(
        "wait.by-stack",
        "the stack index keeps the first record",
        adapter=FirstRecordOfStack,
    ),
    _m(
        "wait.checkpoint-fallback",
        "no fallback to the checkpoint",
        adapter=NoCheckpointFallback,
    ),
    _m(
        "wait.claim.once",
        "two claimants win a race",
        adapter=ClaimYieldsBeforeWriting,
    ),
    _m(
        "wait.claim.refused",
        "a completed record can be claimed",
        adapter=ClaimsCompleted,
    ),
    _m("wait.claim.expired", "the deadline is ignored", adapter=IgnoresDeadline),
    _m("wait.claim.lease", "a lease never runs out", adapter=LeaseNeverEnds),
    _m(
        "wait.complete.claimant",
        "anyone completes a claimed record",
        adapter=AnyoneCompletes,
    ),
    _m("wait.release", "anyone releases a claim", adapter=AnyoneReleases),
    _m("wait.cancel", "a completed record can be cancelled", adapter=CancelsCompleted),
    _m(
        "wait.cancel-workflow",
        "the cancelled checkpoint keeps its revision",
        adapter=CancelWorkflowKeepsRevision,
    ),
    _m("wait.retention", "records are kept forever", adapter=KeepsWaitsForever),
    _m("wait.create", "a create replaces the record there", adapter=CreateOverwrites),
    _m("lock.workflow.exclusive", "no lock at all", adapter=NoWorkflowLock),
    _m(
        "lock.workflow.release-on-error",
        "an exception leaks the lock",
        adapter=WorkflowLockLeaksOnError,
    ),
    _m(
        "wait.namespace.isolation",
        "wait records of every namespace share one key",
        adapter=WaitsShareNamespaces,
    ),
    _m(
        "wait.namespace.isolation",
        "a claim from a namespace without the record takes another namespace's",
        adapter=ClaimFallsBackAcrossNamespaces,
    ),
    _m(
        "wait.namespace.isolation",
        "the index of a stack's latest wait record ignores the namespace",
        adapter=LatestWaitOfStackIgnoresNamespace,
    ),
    _m(
        "checkpoint.retention",
        "checkpoints and wait records without a TTL are kept forever",
        adapter=KeepsUntilDeleted,
    ),
    _m(
        "checkpoint.retention",
        "the retention is counted from the checkpoint's timestamp, not its save",
        adapter=RetentionFromTimestamp,
    ),
    _m(
        "checkpoint.retention",
        "no retention (checkpoint_ttl_ms=None) is taken for a day's",
        adapter=NoRetentionIsADay,
    ),
    Mutant(
        "lock.workflow.separate",
        _shares_public_lock,
        ("lock.workflow.separate",),
        "with_workflow_lock(X) is the public lock 'workflow:X'",
    ),
    _m(
        "delete.rerun",
        "the delete removes what the stack has a few turns after its checkpoint went",
        adapter=DeletesWhatTheStackHasLater,
    ),
    _m(
        "lock.workflow.namespaced",
        "the workflow lock's key is the stack id alone, whatever the namespace",
        adapter=WorkflowLockIgnoresNamespace,
    ),
    _m(
        "lock.workflow.unlocking-save",
        "the unlocking save frees the lock before saving",
        adapter=UnlocksBeforeSaving,
    ),
    _m(
        "lock.workflow.unlocking-save",
        "the unlocking save never frees the lock",
        adapter=UnlockingStrandsLock,
    ),
    _m(
        "lock.workflow.unlocking-save",
        "the unlocking save drops expected_revision",
        adapter=UnlockingIgnoresExpected,
    ),
    _m(
        "cache.with-checkpoint",
        "the caching save drops the cache entry",
        adapter=CachingSaveDropsEntry,
    ),
    _m(
        "cache.with-checkpoint",
        "the caching save stores the entry only when the compare-and-set wins",
        adapter=CachingSaveEntryOnlyIfSaved,
    ),
    _m(
        "cache.with-checkpoint",
        "the caching save ignores the entry's TTL",
        adapter=CachingSaveIgnoresTtl,
    ),
    _m(
        "cache.with-checkpoint",
        "the caching save keeps an entry without a TTL for 31 years",
        adapter=CachingSaveDefaultNeverExpires,
    ),
    _m("cache.roundtrip", "the first set wins", adapter=FirstSetWins),
    _m("cache.falsy-hit", "a cached None is a miss", adapter=DropsCachedNone),
    _m(
        "payload.byte-faithful",
        "sealed values are re-encoded to URL-safe base64",
        adapter=RewritesSealedBase64,
    ),
    _m("cache.miss", "a miss is None", adapter=MissIsNone),
    _m("cache.expiry", "TTLs are ignored", adapter=CacheIgnoresTtl),
    _m(
        "cache.expiry",
        "an entry set without a TTL never expires",
        adapter=CacheDefaultNeverExpires,
    ),
    _m(
        "cache.expiry",
        "its own cache_ttl_ms default is 31 years (under a user's defaults)",
        adapter=OwnCacheTtlDefault,
        profile="user-defaults",
    ),
    _m(
        "wait.claim.once",
        "its own claim_lease_ms default is an hour (under a user's defaults)",
        adapter=OwnClaimLeaseDefault,
        profile="user-defaults",
    ),
    _m(
        "cache.namespaced",
        "the step cache ignores the namespace",
        adapter=CacheIgnoresNamespace,
    ),
    _m(
        "payload.scan",
        "the payload walk skips namespaced wait records",
        adapter=ScanSkipsNamespacedWaits,
    ),
    _m(
        "payload.swap",
        "the payload rewrite overwrites whatever is stored",
        adapter=SwapIgnoresWhatWasListed,
    ),
    _m(
        "payload.delete",
        "the payload delete removes whatever is stored",
        adapter=DeleteIgnoresWhatWasListed,
    ),
    _m(
        "payload.context",
        "the rewrite of a context stream value overwrites whatever is stored",
        adapter=ContextSwapIgnoresWhatWasListed,
    ),
    _m(
        "payload.results",
        "the result rewrite overwrites whatever is stored",
        idempotency=ResultSwapIgnoresWhatWasListed,
    ),
    _m("context.stream", "deletes are ignored", adapter=IgnoresContextDeletes),
    _m(
        "cache-events.accepted",
        "error events evict the cache",
        adapter=ErrorEventsEvictCache,
    ),
    _m(
        "idempotency.claim.once",
        "two claimers win a race",
        idempotency=IdempotencyYields,
    ),
    _m(
        "idempotency.complete",
        "a None result is a miss",
        idempotency=IdempotencyDropsNone,
    ),
    _m(
        "idempotency.fail",
        "fail deletes completed results",
        idempotency=FailDeletesCompleted,
    ),
    _m(
        "idempotency.expiry",
        "TTLs are ignored",
        idempotency=IdempotencyIgnoresTtl,
    ),
    _m(
        "idempotency.owner",
        "complete ignores the owner token",
        idempotency=CompleteIgnoresOwner,
    ),
    _m(
        "idempotency.lease",
        "an in-progress claim lasts as long as a result",
        idempotency=LeaseIsRetention,
    ),
    _m(
        "idempotency.fingerprint",
        "fingerprints are ignored",
        idempotency=IgnoresFingerprint,
    ),
    _m(
        "lock.acquire.exclusive",
        "two acquirers win a race",
        lock=LockYields,
    ),
    _m("lock.release.token", "release ignores the token", lock=ReleaseIgnoresToken),
    _m("lock.extend.token", "extend ignores the token", lock=ExtendIgnoresToken),
    _m("lock.expiry", "locks never expire", lock=LockNeverExpires),
    _m("lock.fencing", "the fencing token is constant", lock=ConstantFencing),
    _m("lock.token", "tokens are not lock_<ms>_<hex>", lock=BadTokenFormat),
    _m("lock.inspect", "inspect reports a lapsed lease as held", lock=InspectShowsLapsedLease),
    _m("lock.inspect", "inspect shows the holder's token", lock=InspectShowsTheToken),
    _m(
        "lock.with-lock",
        "with_lock leaks the lock on error",
        lock=WithLockLeaksOnError,
    ),
    _m("lock.with-lock.wait", "with_lock never waits", lock=WithLockNeverWaits),
    _m("nonce.claim.once", "two claimers win a race", nonces=NonceYields),
    _m("nonce.expiry", "the window is 1000 times too long", nonces=NonceWindowTooLong),
    _m("nonce.expiry", "every window lasts at least a second", nonces=NonceWindowAtLeastASecond),
    _m("list.walk", "a next_cursor skips a stack", adapter=CursorSkipsOne),
    _m(
        "list.filters",
        "the status filter is ignored",
        adapter=StatusFilterIgnored,
    ),
    _m("list.hidden", "expired checkpoints are listed", adapter=ListsExpired),
    _m("list.concurrent", "offset pagination", adapter=OffsetPages),
    _m(
        "list.by-index",
        "a stack's token is not updated when its value changes",
        adapter=TokensOfTheFirstSave,
    ),
    _m("list.by-index", "a delete leaves the stack's token entry", adapter=TokensOutliveDelete),
    _m(
        "delete.stack",
        "wait records outlive their stack",
        adapter=DeleteKeepsWaits,
    ),
    _m(
        "delete.cas",
        "expected_revision is ignored",
        adapter=DeleteIgnoresExpectedRevision,
    ),
    _m("waits.due", "a claim under a live lease is due", adapter=DueIncludesHeld),
    _m(
        "input.rejected",
        "an empty stack id is accepted",
        adapter=AcceptsEmptyIds,
    ),
    _m(
        "ids.hostile",
        "stack ids are truncated to 255 characters",
        adapter=TruncatesIds,
    ),
    _m(
        "capability.declared",
        "declares the step cache without get_cached_step",
        adapter=UndeclaredCacheMethods,
    ),
    _m(
        "checkpoint.size.guard",
        "a streamed save too large writes its changes",
        adapter=lg.StreamsBeforeSizeGuard,
    ),
    _m("checkpoint.size.guard", "stores documents over the limit", adapter=lg.IgnoresDocumentLimit),
    _m(
        "checkpoint.size.guard",
        "its store holds half the max_document_bytes it declares",
        adapter=lg.HoldsHalfItsDeclaredLimit,
    ),
    _m(
        "checkpoint.size.guard",
        "a streamed save refuses a document of exactly the limit",
        adapter=lg.StreamedRefusesExactLimit,
    ),
    _m(
        "checkpoint.size.guard",
        "a caching save too large writes its entry and changes",
        adapter=lg.CachesBeforeSizeGuard,
    ),
    _m(
        "checkpoint.incremental",
        "a changed context of a large document keeps its stored body",
        adapter=lg.StaleChangedContext,
    ),
    _m(
        "checkpoint.incremental",
        "a context dropped from a large document stays",
        adapter=lg.KeepsDroppedContexts,
    ),
)
"""One broken backend per adapter rule of docs/contract.md."""

HOLES: tuple[Mutant, ...] = (
    _m(
        "checkpoint.roundtrip",
        "an empty metadata object reads as None",
        adapter=h.EmptyMetadataIsNone,
    ),
    _m("checkpoint.roundtrip", "empty contexts are not stored", adapter=h.DropsEmptyContexts),
    _m(
        "wait.roundtrip",
        "unknown wire fields of wait records are lost",
        adapter=h.DropsWaitExtraFields,
    ),
    _m("context.stream", "a stream keeps eight fields", adapter=h.ContextKeepsEightFields),
    _m(
        "wait.complete.claimant",
        "completing a key never saved is quiet",
        adapter=h.CompletesNeverSaved,
    ),
    _m("wait.cancel-workflow", "cancel_workflow cancels one wait", adapter=h.CancelWorkflowOneWait),
    _m("wait.claim.refused", "claimants compared without case", adapter=h.ClaimantCaseBlind),
    _m("wait.complete.claimant", "a prefix of the claimant completes", adapter=h.CompleteByPrefix),
    _m("wait.claim.once", "a None payload keeps the stored one", adapter=h.NonePayloadKeepsStored),
    _m(
        "wait.complete.claimant",
        "after the lease anyone completes",
        adapter=h.LapsedLeaseAnyoneCompletes,
    ),
    _m("lock.release.token", "a prefix of the token releases", lock=h.ReleaseTokenPrefix),
    _m(
        "input.rejected",
        "a lone surrogate cache key is accepted",
        adapter=h.AcceptsSurrogateCacheKeys,
    ),
    _m("input.rejected", "a float lease_ms is rounded", adapter=h.AcceptsFloatLease),
    _m("input.rejected", "ttl_ms=True is 1 ms", idempotency=h.AcceptsBoolIdempotencyTtl),
    _m(
        "input.rejected",
        "an over-long namespace raises ValueError",
        adapter=h.OverlongNamespaceWrongError,
    ),
    _m("input.rejected", "an empty context step id is stored", adapter=h.AcceptsEmptyContextStep),
    _m("checkpoint.occ.monotonic", "a lower revision overwrites", adapter=h.AllowsBackwardsSave),
    _m(
        "nonce.claim.once",
        "a nonce is forgotten after one replay",
        nonces=h.NonceReplayAfterRefusal,
    ),
    _m(
        "idempotency.complete",
        "complete without claim keeps nothing",
        idempotency=h.CompleteWithoutClaimStoresNothing,
    ),
    _m("lock.fencing", "fencing restarts after an expiry", lock=h.FencingRestartsAfterExpiry),
    _m("lock.extend.token", "extend keeps the old expiry", lock=h.ExtendKeepsOldExpiry),
    _m(
        "lock.workflow.exclusive",
        "waiters give up after 300 ms and run",
        adapter=h.WorkflowWaitersGiveUp,
    ),
    _m(
        "lock.workflow.exclusive",
        "a timed-out waiter runs anyway",
        adapter=h.WorkflowTimeoutRunsAnyway,
    ),
    _m(
        "checkpoint.occ.conflict",
        "a conflict names the expected revision as current",
        adapter=h.ConflictNamesExpectedAsCurrent,
    ),
    _m(
        "checkpoint.expiry.hidden",
        "an expired checkpoint still conflicts",
        adapter=h.ExpiredStillConflicts,
    ),
    _m("cache-events.accepted", "error events are refused", adapter=h.RejectsErrorEvents),
    _m("backend.closed", "a closed adapter still answers", adapter=h.AnswersAfterClose),
    _m(
        "wait.complete.claimant", "a cancelled record completes", adapter=h.CancelledRecordCompletes
    ),
    _m(
        "context.streamed-save",
        "a streamed save writes the changes after the checkpoint",
        adapter=h.SavesBeforeStreaming,
    ),
    _m(
        "context.streamed-save",
        "a lone streamed delete is written as a null set",
        adapter=h.StreamedDeleteSetsNull,
    ),
)
"""One broken backend per kind of hole (tests/support/mutants_holes.py)."""

VALUES: tuple[Mutant, ...] = (
    _m(
        "checkpoint.roundtrip",
        "falsy scalar metadata entries are not stored",
        adapter=v.MetadataDropsFalsyScalars,
    ),
    _m("checkpoint.roundtrip", "context keys with ':' are lost", adapter=v.ContextDropsColonKeys),
    _m(
        "checkpoint.roundtrip",
        "nested nulls of a context are dropped",
        adapter=v.ContextDropsNestedNulls,
    ),
    _m(
        "checkpoint.roundtrip",
        "scalar and list unknown wire fields are lost",
        adapter=v.CheckpointExtraDropsScalarsAndLists,
    ),
    _m(
        "wait.roundtrip",
        "falsy unknown wire fields of wait records are lost",
        adapter=v.WaitExtraKeepsTruthy,
    ),
    _m(
        "wait.cancel-workflow",
        "claims with a lapsed lease stay claimed",
        adapter=v.CancelWorkflowSkipsLapsedClaims,
    ),
    _m(
        "wait.complete.claimant",
        "claimants compared without leading spaces",
        adapter=v.CompleteIgnoresLeadingSpace,
    ),
    _m(
        "wait.claim.refused",
        "a claimant ending with the holder's id takes the record",
        adapter=v.ClaimByPrefixedClaimant,
    ),
    _m(
        "wait.claim.once",
        "a False or empty-string event payload keeps the stored one",
        adapter=v.FalsePayloadKeepsStored,
    ),
    _m(
        "context.stream",
        "a stream of over sixteen fields ignores re-sets",
        adapter=v.ContextBigStreamKeepsFirstValue,
    ),
    _m(
        "idempotency.owner",
        "owner tokens compared without case",
        idempotency=v.OwnerTokenCaseBlind,
    ),
)
"""Broken backends only a machine generating the whole value space catches
(tests/support/mutants_values.py)."""

MANAGERS: tuple[Mutant, ...] = (
    _m("manager.redaction.stored", "the stream skips redaction", manager=h.StreamSkipsRedaction),
    _m(
        "manager.redaction.stored",
        "background checkpoints skip redaction",
        manager=h.BackgroundSkipsRedaction,
    ),
    _m(
        "manager.conflict.stored",
        "best-effort swallows conflicts",
        manager=h.BestEffortSwallowsConflicts,
    ),
    _m(
        "manager.restore.stored",
        "restore ignores the expected namespace",
        manager=h.RestoreIgnoresNamespace,
    ),
)
"""Broken managers over a sound backend, for the suite's end-to-end rules."""


def _cleanup_drops_lock_fences(**options: Any) -> Backend:
    """The memory backend whose adapter's clean-up sweeps its own lock's expired keys
    together with their fencing counters (:class:`~mutants_certificate.CleanupDropsLockFences`)."""
    backend = _factory(adapter=c.CleanupDropsLockFences)(**options)
    assert isinstance(backend.adapter, c.CleanupDropsLockFences)
    assert isinstance(backend.lock, MemoryLock)
    backend.adapter.lock = backend.lock
    return backend


CERTIFICATE: tuple[Mutant, ...] = (
    _m("list.walk", "the cursor forgets the namespace", adapter=c.CursorForgetsNamespace),
    _m(
        "list.walk",
        "a filtered walk repeats each page's last stack",
        adapter=c.FilteredWalkRepeatsLast,
    ),
    _m("ids.hostile", "stack ids are keyed by their NFC form", adapter=c.NormalisesStackIds),
    _m("ids.hostile", "namespaces are keyed by 200 characters", adapter=c.TruncatesNamespaces),
    _m("delete.stack", "a delete spares claimed waits", adapter=c.DeleteSparesClaimedWaits),
    _m(
        "delete.cas",
        "a namespaced delete compares the un-namespaced revision",
        adapter=c.DeleteCasReadsUnnamespaced,
    ),
    _m("waits.due", "a wait exactly at its deadline is not due", adapter=c.DueOnlyPastDeadline),
    _m("waits.due", "namespaced waits are never due", adapter=c.DueSkipsNamespaced),
    _m("waits.due", "the limit is applied before sorting", adapter=c.DueLimitBeforeSort),
    _m("wait.release", "anyone releases a lapsed claim", adapter=c.LapsedClaimAnyoneReleases),
    _m(
        "wait.release",
        "a lapsed claim's own claimant cannot release it",
        adapter=c.LapsedClaimNotItsClaimants,
    ),
    _m("lock.extend.token", "extend revives a lapsed lock", lock=c.LapsedLockExtendRevives),
    _m(
        "lock.release.token",
        "anyone releases a lapsed lock",
        lock=c.LapsedLockStrangerReleases,
    ),
    _m(
        "backend.closed",
        "a closed adapter still releases and cancels waits",
        adapter=c.ClosedStillReleasesClaims,
    ),
    _m("wait.release", "release ignores the namespace", adapter=c.ReleaseIgnoresNamespace),
    _m("waits.due", "records past their retention are due", adapter=c.DueIgnoresRetention),
    _m("waits.due", "a lapsed lease is due before its deadline", adapter=c.DueOnLapsedLeaseAlone),
    _m("delete.stack", "a delete takes the waits of ids it prefixes", adapter=c.DeleteByIdPrefix),
    _m(
        "lock.release.token",
        "a lapsed lock's last holder releases",
        lock=c.LapsedLockHolderReleases,
    ),
    _m(
        "list.hidden",
        "a deleted stack stays in walks of every namespace",
        adapter=c.DeletedStaysInTheGlobalIndex,
    ),
    Mutant(
        "lock.fencing",
        _cleanup_drops_lock_fences,
        "a clean-up drops expired locks with their fencing counters",
        "CleanupDropsLockFences",
    ),
)
"""Broken backends for the weaknesses of issue 37 (tests/support/mutants_certificate.py)."""

BACKENDS: tuple[b.BackendMutant, ...] = b.BACKENDS
"""Real SQLite, PostgreSQL and Redis backends with one statement, script or hook broken
(tests/support/mutants_backends.py)."""

ALL_MUTANTS: tuple[Mutant | b.BackendMutant, ...] = (
    MUTANTS + MANAGERS + HOLES + VALUES + CERTIFICATE + BACKENDS
)
"""Every mutant the suite must kill, naming its rule as the primary failure."""

BY_NAME: dict[str, Mutant | b.BackendMutant] = {m.name: m for m in ALL_MUTANTS}

del Capability
