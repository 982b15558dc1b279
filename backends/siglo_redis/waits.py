"""Wait records on Redis: how they are stored, read, indexed and moved between states.

A record lives at ``<prefix>wait:<correlationKey>``, is indexed by stack in the sorted
set ``<prefix>wait-index:<stackId>`` and, for TypeScript workers, copied to
``<prefix>wait:<stackId>`` (seed 001 §5). A state change (claim, complete, release,
cancel) is a *transition*: read the record, decide its next state with a pure function,
and write it only if the stored value is still the one decided on (the ``SWAP`` script),
retrying otherwise. Of N racing callers exactly one moves a record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Final

from siglo.errors import (
    MalformedRecordError,
    StorageAdapterError,
    WaitRecordClaimError,
    naming_wait,
)
from siglo.records import WaitRecord
from siglo.sentinel import MISSING
from siglo_redis.commands import Commands, clamp_px, sha1, text
from siglo_redis.keys import KeySpace
from siglo_redis.scripts import (
    COMPARE_AND_DELETE,
    SWAP,
    WAIT_CREATE,
    WAIT_INDEX_ADD,
    WAIT_STACK_COPY,
)

__all__ = [
    "MAX_SWAP_ATTEMPTS",
    "Decide",
    "WaitRecords",
    "cancel_decision",
    "claim_decision",
    "complete_decision",
    "completion_refused",
    "now_ms",
    "release_decision",
    "swap",
]

MAX_SWAP_ATTEMPTS: Final = 1_000
"""How often a compare-and-swap is retried under contention before giving up."""

Decide = Callable[[WaitRecord | None], WaitRecord | None]
"""The next state of a record (``None``: leave it as it is)."""


def now_ms() -> int:
    """The client's wall clock, which every decision about a time in a document uses."""
    return time.time_ns() // 1_000_000


async def swap(
    redis: Commands,
    key: str,
    old: bytes | None,
    new: bytes,
    ttl: int | str = "keep",
    drop: str | None = None,
) -> bool:
    """Write ``new`` at ``key`` only if it still holds ``old`` (``None``: absent), and
    delete ``drop`` (a key in its slot) in the same script when it does."""
    keys = [key] if drop is None else [key, drop]
    return int(await redis.script(SWAP, keys, [sha1(old), new, ttl])) == 1


# -- decisions -------------------------------------------------------------------------------


def claim_decision(claimant: str, lease_ms: int, allow_expired: bool, event_payload: Any) -> Decide:
    """``waiting`` (or claimed under a lapsed lease, or by ``claimant``) → ``claimed``."""

    def decide(record: WaitRecord | None) -> WaitRecord | None:
        now = now_ms()
        if record is None or record.status in ("completed", "cancelled"):
            return None
        if (
            record.status == "claimed"
            and not record.lease_expired(now)
            and record.claimant_id != claimant
        ):
            return None
        if record.is_expired(now) and not allow_expired:
            return None
        return record.replace(
            status="claimed",
            claimant_id=claimant,
            claimed_at=now,
            lease_expires_at=now + lease_ms,
            event_payload=record.event_payload if event_payload is MISSING else event_payload,
        )

    return decide


def complete_decision(claimant_id: str) -> Decide:
    """``claimed`` by ``claimant_id`` → ``completed``."""

    def decide(record: WaitRecord | None) -> WaitRecord | None:
        if record is None or record.status != "claimed" or record.claimant_id != claimant_id:
            return None
        return record.replace(status="completed", completed_at=now_ms())

    return decide


def completion_refused(correlation_key: str, record: WaitRecord | None) -> WaitRecordClaimError:
    """Why a completion did not happen, as the contract names it."""
    if record is None:
        return WaitRecordClaimError(f"no wait record with correlation key {correlation_key!r}")
    if record.status != "claimed":
        return WaitRecordClaimError(
            f"wait record {correlation_key!r} is {record.status}, not claimed"
        )
    return WaitRecordClaimError(f"wait record {correlation_key!r} is claimed by another claimant")


def release_decision(claimant_id: str) -> Decide:
    """``claimed`` by ``claimant_id`` → ``waiting`` again."""

    def decide(record: WaitRecord | None) -> WaitRecord | None:
        if record is None or record.status != "claimed" or record.claimant_id != claimant_id:
            return None
        return record.replace(
            status="waiting", claimant_id=None, claimed_at=None, lease_expires_at=None
        )

    return decide


def cancel_decision(stack_id: str | None = None, namespace: str | None = None) -> Decide:
    """``waiting`` or ``claimed`` → ``cancelled`` (only the records of one stack, if given)."""

    def decide(record: WaitRecord | None) -> WaitRecord | None:
        if record is None or record.status not in ("waiting", "claimed"):
            return None
        if stack_id is not None and (record.stack_id != stack_id or record.namespace != namespace):
            return None
        return record.replace(status="cancelled")

    return decide


# -- storage -------------------------------------------------------------------------------


_DELETE_ATTEMPTS: Final = 8
"""Compare-and-deletes of one wait record a stack's deletion tries while deliveries keep
changing it."""


class WaitRecords:
    """Reads, writes and transitions of wait records in one key space."""

    def __init__(self, redis: Commands, client: Any, keys: KeySpace) -> None:
        self._redis = redis
        self._client = client
        self._keys = keys

    async def read(
        self, key: str, namespace: str | None = None
    ) -> tuple[WaitRecord | None, bytes | None]:
        """The record stored at ``[<ns>:]wait:<key>`` and its raw value (``namespace``:
        of the record's stack; records never cross namespaces).

        Only a record whose correlation key is ``key`` counts: the seed's per-stack copy
        (stored at ``wait:<stackId>``) is not the record *of* that key.
        """
        data = await self._redis.get(self._keys.wait(key, namespace))
        if data is None:
            return None, None
        try:
            record = WaitRecord.from_json(data)
        except MalformedRecordError as exc:
            raise naming_wait(exc, key, namespace) from exc  # which key to look at
        return (record if record.correlation_key == key else None), data

    async def save(self, record: WaitRecord, retention_ms: int | None) -> None:
        """Store ``record`` for ``retention_ms`` (``None``: until removed), indexed by stack."""
        data = record.to_json()
        ns = record.namespace
        await self._redis.set(self._keys.wait(record.correlation_key, ns), data, px=retention_ms)
        await self._index_by_stack(record, data, retention_ms)

    async def create(self, record: WaitRecord, retention_ms: int | None) -> bool:
        """Store ``record`` as :meth:`save` does, but only if its correlation key has no
        record (one atomic script); ``True`` if stored."""
        data = record.to_json()
        px = "" if retention_ms is None else clamp_px(retention_ms)
        created = await self._redis.script(
            WAIT_CREATE,
            [self._keys.wait(record.correlation_key, record.namespace)],
            [data, record.correlation_key, px],
        )
        if int(created) != 1:
            return False
        await self._index_by_stack(record, data, retention_ms)
        return True

    async def _index_by_stack(
        self, record: WaitRecord, data: bytes, retention_ms: int | None
    ) -> None:
        ns = record.namespace
        px = "" if retention_ms is None else clamp_px(retention_ms)
        await self._redis.script(
            WAIT_INDEX_ADD,
            [self._keys.wait_index(record.stack_id, ns)],
            [record.correlation_key, px],
        )
        if record.stack_id != record.correlation_key:
            # Seed 001 §5's second index, read by TypeScript workers.
            await self._redis.script(
                WAIT_STACK_COPY,
                [self._keys.wait(record.stack_id, ns)],
                [data, record.stack_id, px],
            )

    async def transition(
        self, correlation_key: str, namespace: str | None, decide: Decide
    ) -> tuple[WaitRecord | None, WaitRecord | None]:
        """Read, decide, write-if-unchanged; retried until the decision stands.

        Returns ``(record before, record after or None)``.
        """
        for _ in range(MAX_SWAP_ATTEMPTS):
            record, data = await self.read(correlation_key, namespace)
            after = decide(record)
            if after is None:
                return record, None
            key = self._keys.wait(correlation_key, namespace)
            if await swap(self._redis, key, data, after.to_json()):
                return record, after
        raise StorageAdapterError(f"wait record {correlation_key!r} kept changing under contention")

    async def latest_of_stack(
        self, stack_id: str, namespace: str | None, copy: bytes | None
    ) -> WaitRecord | None:
        """The record saved last for ``stack_id`` (``copy``: the value at ``wait:<stackId>``)."""
        latest = await self._redis.call(
            "ZREVRANGE", self._client.zrevrange(self._keys.wait_index(stack_id, namespace), 0, 0)
        )
        if latest:
            record, _ = await self.read(text(latest[0]) or "", namespace)
            return record
        if copy is not None:
            # Written by a worker without siglo's index: follow the seed's copy.
            pointed = WaitRecord.from_json(copy).correlation_key
            record, _ = await self.read(pointed, namespace)
            return record
        return None

    async def keys_of_stack(
        self, stack_id: str, namespace: str | None
    ) -> tuple[set[str], bytes | None]:
        """The correlation keys indexed for ``stack_id``, and the seed's copy if any."""
        members = await self._redis.call(
            "ZRANGE", self._client.zrange(self._keys.wait_index(stack_id, namespace), 0, -1)
        )
        keys = {text(m) or "" for m in members or ()}
        copy = await self._redis.get(self._keys.wait(stack_id, namespace))
        if copy is not None:
            # A record with this correlation key, or the seed's copy naming one. (One
            # that cannot be read names none: it is the stack's own, removed with it.)
            with contextlib.suppress(MalformedRecordError):
                keys.add(WaitRecord.from_json(copy).correlation_key)
        return keys, copy

    async def snapshot_of_stack(
        self, stack_id: str, namespace: str | None
    ) -> list[tuple[str | None, bytes]]:
        """The records of the stack as stored now: ``(correlation key, raw value)``, and
        ``(None, raw value)`` for the seed's copy when it is one of the stack's."""
        keys, copy = await self.keys_of_stack(stack_id, namespace)
        found: list[tuple[str | None, bytes]] = []
        for correlation_key in sorted(keys):
            try:
                record, data = await self.read(correlation_key, namespace)
            except MalformedRecordError:
                # Indexed for this stack and unreadable (written past siglo): it goes
                # with the stack, deleted only as stored, like the others.
                data = await self._redis.get(self._keys.wait(correlation_key, namespace))
                if data is not None:
                    found.append((correlation_key, data))
                continue
            if record is None or record.stack_id != stack_id or record.namespace != namespace:
                continue
            assert data is not None  # a record was read from it
            found.append((correlation_key, data))
        if copy is not None:
            try:
                seed_copy = WaitRecord.from_json(copy)
            except MalformedRecordError:
                found.append((None, copy))  # at the stack's own key: the stack's
            else:
                if seed_copy.stack_id == stack_id and seed_copy.namespace == namespace:
                    found.append((None, copy))
        return found

    async def delete_snapshot(
        self, stack_id: str, namespace: str | None, snapshot: list[tuple[str | None, bytes]]
    ) -> None:
        """Delete the records of :meth:`snapshot_of_stack` that are still stored as read.

        Each one only if its key still holds the value read (one script: compare and
        delete), so a run re-created under the same stack id since keeps its own wait
        even under the same correlation key; its index entry, dropped with a record, is
        put back if the new run's record is there by then (the record and the index are
        in different cluster slots, so not one script).
        """
        index = self._keys.wait_index(stack_id, namespace)
        for correlation_key, data in snapshot:
            key = self._keys.wait(
                stack_id if correlation_key is None else correlation_key, namespace
            )
            deleted = await self._delete_read(key, data)
            if not deleted or correlation_key is None:
                continue
            await self._redis.call("ZREM", self._client.zrem(index, correlation_key))
            record, _ = await self.read(correlation_key, namespace)
            if record is not None and record.stack_id == stack_id:
                # Saved by a new run between the delete and the ZREM: index it again.
                ttl = int(await self._redis.call("PTTL", self._client.pttl(key)))
                await self._redis.script(
                    WAIT_INDEX_ADD, [index], [correlation_key, "" if ttl < 0 else ttl]
                )

    async def _delete_read(self, key: str, data: bytes) -> bool:
        """Delete the record at ``key`` if it is still the one read as ``data``: those
        bytes, or that record changed since — claimed, completed or cancelled by a
        delivery meanwhile, the same stack's record of the same creation time (a record
        of a run re-created under the stack's id has its own). Each delete compares the
        bytes it last read (a delivery's claim after the snapshot left the record behind
        for good, indexed as due: a black-box auditor)."""
        try:
            first = WaitRecord.from_json(data)
        except MalformedRecordError:
            first = None
        for _ in range(_DELETE_ATTEMPTS):
            if int(await self._redis.script(COMPARE_AND_DELETE, [key], [data])) == 1:
                return True
            if first is None or first.created_at is None:
                return False  # nothing tells this record from another but its bytes
            now = await self._redis.get(key)
            if now is None:
                return False
            try:
                record = WaitRecord.from_json(now)
            except MalformedRecordError:
                return False
            if (
                record.created_at != first.created_at
                or record.stack_id != first.stack_id
                or record.namespace != first.namespace
                or record.correlation_key != first.correlation_key
            ):
                return False
            data = now
        return False

    async def delete_listed(self, key: str, data: bytes) -> bool:
        """Delete the record, or the seed's per-stack copy, stored at ``key`` only if it
        still holds ``data`` (the compare-and-delete script; ``siglo erase``).

        With the record go its entry in the stack's index (put back if a new run saved
        a record of that key meanwhile, as :meth:`delete_snapshot` does) and the stack's
        copy when it holds the same bytes: the two keys are in different cluster slots,
        so each is its own compare-and-delete, and a copy written since stays.
        """
        if int(await self._redis.script(COMPARE_AND_DELETE, [key], [data])) != 1:
            return False
        record = WaitRecord.from_json(data)
        ns = record.namespace
        if key != self._keys.wait(record.correlation_key, ns):
            return True  # the seed's copy: the record at its own key is listed too
        if record.stack_id != record.correlation_key:
            copy = self._keys.wait(record.stack_id, ns)
            await self._redis.script(COMPARE_AND_DELETE, [copy], [data])
        index = self._keys.wait_index(record.stack_id, ns)
        await self._redis.call("ZREM", self._client.zrem(index, record.correlation_key))
        again, _ = await self.read(record.correlation_key, ns)
        if again is not None and again.stack_id == record.stack_id:
            ttl = int(await self._redis.call("PTTL", self._client.pttl(key)))
            await self._redis.script(
                WAIT_INDEX_ADD, [index], [record.correlation_key, "" if ttl < 0 else ttl]
            )
        return True
