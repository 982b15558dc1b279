"""Deliberately broken memory backends for the weaknesses issue 37 names: rules whose one
fixed scenario a slightly wrong backend passed (a walk across namespaces, a stack returned
twice in a filtered walk, Unicode-normalisation twins and long namespaces, a delete of a
stack whose wait is claimed or with a revision inside a namespace, a wait exactly at its
deadline or in a namespace, which record a limited due-wait lookup returns, release or
extend after a lease lapsed by a stranger, every method of a closed backend).

Each breaks exactly one adapter rule; tests/support/mutants.py registers them
(``CERTIFICATE``) and the suite must kill each with that rule as the primary failure.
"""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from typing import Any

from siglo.listing import CheckpointPage, ListQuery, decode_cursor, encode_cursor
from siglo.records import WaitRecord
from siglo.sentinel import MISSING
from siglo_memory.adapter import MemoryStorageAdapter, _StoredCheckpoint
from siglo_memory.coordination import MemoryLock

# -- listing ---------------------------------------------------------------------------------


class CursorForgetsNamespace(MemoryStorageAdapter):
    """The cursor keeps the stack id only: a walk of every namespace resumes after that
    id in *every* namespace, so a later namespace loses its stacks with smaller ids (a
    walk inside one namespace is right)."""

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        after = None if query.cursor is None else decode_cursor(query.cursor, 1)[0]
        everything = await super()._do_list_checkpoints(replace(query, cursor=None, limit=10_000))
        items = [s for s in everything.items if after is None or s.stack_id > after]
        page = items[: query.limit]
        more = len(items) > query.limit
        return CheckpointPage(page, encode_cursor(page[-1].stack_id) if more else None)


class FilteredWalkRepeatsLast(MemoryStorageAdapter):
    """With a status or workflow filter, next_cursor points one stack short: the last
    stack of each page is listed again at the top of the next."""

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        page = await super()._do_list_checkpoints(query)
        filtered = query.statuses is not None or query.workflow_id is not None
        if not filtered or page.next_cursor is None or len(page.items) < 2:
            return page
        before = page.items[-2]
        return CheckpointPage(page.items, encode_cursor(before.namespace or "", before.stack_id))


# -- ids ---------------------------------------------------------------------------------------


class _FoldedKeys(dict[tuple[str | None, str], _StoredCheckpoint]):
    """A checkpoint table whose keys are folded by :meth:`fold` (the bug)."""

    def fold(self, key: tuple[str | None, str]) -> tuple[str | None, str]:
        raise NotImplementedError

    def __setitem__(self, key: tuple[str | None, str], value: _StoredCheckpoint) -> None:
        super().__setitem__(self.fold(key), value)

    def __getitem__(self, key: tuple[str | None, str]) -> _StoredCheckpoint:
        return super().__getitem__(self.fold(key))

    def __delitem__(self, key: tuple[str | None, str]) -> None:
        super().__delitem__(self.fold(key))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and super().__contains__(self.fold(key))

    def get(self, key: tuple[str | None, str], default: Any = None) -> Any:
        return super().get(self.fold(key), default)

    def pop(self, key: tuple[str | None, str], *default: Any) -> Any:
        return super().pop(self.fold(key), *default)


class _NfcKeys(_FoldedKeys):
    def fold(self, key: tuple[str | None, str]) -> tuple[str | None, str]:
        return key[0], unicodedata.normalize("NFC", key[1])


class _ShortNamespaceKeys(_FoldedKeys):
    def fold(self, key: tuple[str | None, str]) -> tuple[str | None, str]:
        return (None if key[0] is None else key[0][:200]), key[1]


class NormalisesStackIds(MemoryStorageAdapter):
    """Checkpoints are keyed by the NFC form of the stack id: ``"é"`` written as one
    code point and as ``e`` + combining accent are one stack."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._checkpoints = _NfcKeys()


class TruncatesNamespaces(MemoryStorageAdapter):
    """Checkpoints are keyed by the first 200 characters of the namespace: two long
    namespaces that differ only after that are one."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._checkpoints = _ShortNamespaceKeys()


# -- deletion ----------------------------------------------------------------------------------


class DeleteSparesClaimedWaits(MemoryStorageAdapter):
    """A delete keeps the stack's wait records that are claimed (a worker holds them)."""

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        claimed = {
            key: entry
            for key, entry in self._waits.items()
            if WaitRecord.from_json(entry.data).status == "claimed"
        }
        deleted = await super()._do_delete_checkpoint(stack_id, namespace, expected_revision)
        self._waits.update(claimed)
        return deleted


class DeleteCasReadsUnnamespaced(MemoryStorageAdapter):
    """A delete with expected_revision compares it with the un-namespaced checkpoint of
    the stack, whatever namespace the delete names."""

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        if expected_revision is None or namespace is None:
            return await super()._do_delete_checkpoint(stack_id, namespace, expected_revision)
        now = self.clock.now_ms()
        compared = self._live_entry((None, stack_id), now)
        if compared is not None and compared.revision == expected_revision:
            return await super()._do_delete_checkpoint(stack_id, namespace, None)
        return await super()._do_delete_checkpoint(stack_id, namespace, expected_revision)


# -- due waits ---------------------------------------------------------------------------------


class DueOnlyPastDeadline(MemoryStorageAdapter):
    """A wait whose deadline is exactly now is not due yet (``>`` where ``>=`` is meant)."""

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        now = self.clock.now_ms()
        due = await super()._do_list_due_waits(10_000)
        return [r for r in due if r.expires_at is None or r.expires_at < now][:limit]


class DueSkipsNamespaced(MemoryStorageAdapter):
    """Due waits are looked for among the un-namespaced records only."""

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        due = await super()._do_list_due_waits(10_000)
        return [r for r in due if r.namespace is None][:limit]


class DueLimitBeforeSort(MemoryStorageAdapter):
    """The limit is applied in storage order, then the few records are sorted: a limited
    lookup returns some due records, not the earliest."""

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        now = self.clock.now_ms()
        due: list[WaitRecord] = []
        for key in self._waits:
            record = self._live_wait(key, now)
            if record is None or not record.is_expired(now):
                continue
            if record.status == "waiting" or record.lease_expired(now):
                due.append(record)
            if len(due) == limit:
                break
        due.sort(key=lambda r: (r.expires_at or 0, r.correlation_key))
        return due


# -- release and extend after a lapse ----------------------------------------------------------


class LapsedClaimAnyoneReleases(MemoryStorageAdapter):
    """Once a claim's lease has lapsed, anyone's release puts it back to waiting."""

    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> bool:
        from siglo_memory.adapter import wait_key

        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is not None and record.lease_expired(self.clock.now_ms()):
            claimant_id = record.claimant_id or claimant_id
        return await super()._do_release_wait_record(correlation_key, claimant_id, namespace)


class LapsedClaimNotItsClaimants(MemoryStorageAdapter):
    """Once a claim's lease has lapsed, even its claimant's release is refused (a
    black-box auditor's plugin that passed every check of contract 1.7): a lapsed claim
    is takeable, not taken, and stays its claimant's until it is."""

    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> bool:
        from siglo_memory.adapter import wait_key

        record = self._live_wait(wait_key(namespace, correlation_key), self.clock.now_ms())
        if record is not None and record.lease_expired(self.clock.now_ms()):
            return False
        return await super()._do_release_wait_record(correlation_key, claimant_id, namespace)


class LapsedLockExtendRevives(MemoryLock):
    """extend by the last holder of a lock that lapsed (nobody took it since) takes it
    again and returns True."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._last: dict[str, str] = {}

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> Any:
        result = await super()._do_acquire(lock_key, ttl_ms, custom_token)
        if result.acquired:
            self._last[lock_key] = result.token
        return result

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        if self._holders.get(lock_key) is None and self._last.get(lock_key) == token:
            self._holders.set(lock_key, token, ttl_ms)
            return True
        return await super()._do_extend(lock_key, token, ttl_ms)


class LapsedLockStrangerReleases(MemoryLock):
    """release of a lock whose holder lapsed returns True for any token."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._ever: set[str] = set()

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> Any:
        result = await super()._do_acquire(lock_key, ttl_ms, custom_token)
        if result.acquired:
            self._ever.add(lock_key)
        return result

    async def _do_release(self, lock_key: str, token: str) -> bool:
        if self._holders.get(lock_key) is None and lock_key in self._ever:
            return True
        return await super()._do_release(lock_key, token)


class ReleaseIgnoresNamespace(MemoryStorageAdapter):
    """release_wait_record releases the un-namespaced record of that key, whatever
    namespace it is given."""

    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> bool:
        return await super()._do_release_wait_record(correlation_key, claimant_id, None)


class DueIgnoresRetention(MemoryStorageAdapter):
    """Due waits are looked for among stored records whatever their retention: a record
    past its retention is fired."""

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        now = self.clock.now_ms()
        due = [
            record
            for entry in self._waits.values()
            if (record := WaitRecord.from_json(entry.data)).is_expired(now)
            and (record.status == "waiting" or record.lease_expired(now))
        ]
        due.sort(key=lambda r: (r.expires_at or 0, r.correlation_key))
        return due[:limit]


class DueOnLapsedLeaseAlone(MemoryStorageAdapter):
    """A claim whose lease lapsed is due whatever its deadline (a future one included)."""

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        now = self.clock.now_ms()
        due: list[WaitRecord] = []
        for key in self._waits:
            record = self._live_wait(key, now)
            if record is None:
                continue
            if record.lease_expired(now) or (record.status == "waiting" and record.is_expired(now)):
                due.append(record)
        due.sort(key=lambda r: (r.expires_at or 0, r.correlation_key))
        return due[:limit]


class DeleteByIdPrefix(MemoryStorageAdapter):
    """A delete removes the waits of every stack whose id starts with the deleted one's
    (a key pattern ``stack*``)."""

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        deleted = await super()._do_delete_checkpoint(stack_id, namespace, expected_revision)
        if deleted:
            for key in list(self._waits):
                record = WaitRecord.from_json(self._waits[key].data)
                if record.namespace == namespace and record.stack_id.startswith(stack_id):
                    del self._waits[key]
        return deleted


class LapsedLockHolderReleases(MemoryLock):
    """release by the last holder of a lock that lapsed (nobody took it since) returns
    True: the token is compared with the stored entry, expired or not."""

    async def _do_release(self, lock_key: str, token: str) -> bool:
        stored = self._holders._items.get(lock_key)
        if stored is not None and stored[0] == token:
            self._holders.delete(lock_key)
            return True
        return await super()._do_release(lock_key, token)


class DeletedStaysInTheGlobalIndex(MemoryStorageAdapter):
    """A deleted stack stays listed by walks of every namespace (its entry in a global
    index is not removed); a walk of its own namespace does not list it."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._ghosts: dict[tuple[str | None, str], Any] = {}

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        entry = self._checkpoints.get((namespace, stack_id))
        deleted = await super()._do_delete_checkpoint(stack_id, namespace, expected_revision)
        if deleted and entry is not None:
            self._ghosts[(namespace, stack_id)] = entry
        return deleted

    async def _do_save_checkpoint(self, checkpoint: Any, *, expected_revision: Any = None) -> None:
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)
        self._ghosts.pop((checkpoint.namespace, checkpoint.stack_id), None)

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        if query.namespace is not MISSING or not self._ghosts:
            return await super()._do_list_checkpoints(query)
        self._checkpoints.update(self._ghosts)
        try:
            return await super()._do_list_checkpoints(query)
        finally:
            for key in self._ghosts:
                self._checkpoints.pop(key, None)


# -- a closed backend --------------------------------------------------------------------------


class ClosedStillReleasesClaims(MemoryStorageAdapter):
    """After aclose() release_wait_record and cancel_wait_record still answer (their
    arguments are still checked)."""

    _answering = False

    def _require_open(self) -> None:
        if not self._answering:
            super()._require_open()

    async def release_wait_record(
        self, correlation_key: str, claimant_id: str, *, namespace: str | None = None
    ) -> bool:
        self._answering = True
        try:
            return await super().release_wait_record(
                correlation_key, claimant_id, namespace=namespace
            )
        finally:
            self._answering = False

    async def cancel_wait_record(
        self, correlation_key: str, *, namespace: str | None = None
    ) -> bool:
        self._answering = True
        try:
            return await super().cancel_wait_record(correlation_key, namespace=namespace)
        finally:
            self._answering = False


__all__ = [
    "ClosedStillReleasesClaims",
    "CursorForgetsNamespace",
    "DeleteByIdPrefix",
    "DeleteCasReadsUnnamespaced",
    "DeleteSparesClaimedWaits",
    "DueIgnoresRetention",
    "DueLimitBeforeSort",
    "DueOnLapsedLeaseAlone",
    "DueOnlyPastDeadline",
    "DueSkipsNamespaced",
    "FilteredWalkRepeatsLast",
    "DeletedStaysInTheGlobalIndex",
    "LapsedClaimAnyoneReleases",
    "LapsedLockHolderReleases",
    "LapsedLockExtendRevives",
    "LapsedLockStrangerReleases",
    "NormalisesStackIds",
    "ReleaseIgnoresNamespace",
    "TruncatesNamespaces",
]


# -- clean-up between a lock's expiry and its next acquire --------------------------------------


class CleanupDropsLockFences(MemoryStorageAdapter):
    """The clean-up (``clean_expired_checkpoints``, what ``siglo clean`` runs on a store
    without ``clean_expired``) also sweeps the backend's expired locks, and with each its
    fencing counter: the next acquire of that key starts again at 1. A backend that cleans
    lock rows by deleting them has this bug; acquires without a clean-up between are right.
    """

    lock: MemoryLock | None = None
    """The lock of the same backend (set by :func:`cleanup_drops_lock_fences`)."""

    async def _do_clean_expired_checkpoints(self) -> int:
        removed = await super()._do_clean_expired_checkpoints()
        if self.lock is not None:
            now = self.clock.now_ms()
            holders = self.lock._holders._items
            for key in [k for k, (_, gone) in holders.items() if gone <= now]:
                del holders[key]
                self.lock._fences.pop(key, None)
        return removed
