"""``RedisStorageAdapter``: the storage contract on Redis, in seed 001 §5's key topology.

Time: Redis expires keys by its own clock from the ``PX`` a write carries. siglo derives
that ``PX`` from the client's wall clock (``expires_at - now``), and every decision that
reads a time inside a document (a checkpoint's ``expiresAt``, a wait's deadline, a claim
lease) uses the client's wall clock too. On one host the two are the same clock.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from hashlib import sha1
from typing import Any, ClassVar, Final

from siglo import codec
from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.checkpoint import TERMINAL_STATUSES, Checkpoint
from siglo.errors import (
    CheckpointConflictError,
    InvalidArgumentError,
    MalformedRecordError,
    SigloError,
    StorageAdapterError,
)
from siglo.listing import CheckpointPage, ListQuery
from siglo.locking import Hold, held, namespaced_key, workflow_lock_key
from siglo.parts import MARK, BodyCache, assemble, split
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
from siglo.unsent import mark_unsent, unwritten
from siglo.validation import (
    check_context_change,
    check_save_arguments,
    require_lease_ms,
    require_ttl_ms,
)
from siglo_redis.client import client_for, close_client
from siglo_redis.commands import (
    Commands,
    clamp_px,
    raw,
    text,
)
from siglo_redis.coordination import RedisLock
from siglo_redis.keys import DEFAULT_PREFIX, KeySpace, check_prefix
from siglo_redis.listing import (
    CheckpointIndex,
    deadline_member_parts,
    is_cluster,
    member_of,
    scan_keys,
)
from siglo_redis.scripts import (
    CHECKPOINT_CAS,
    CHECKPOINT_DELETE,
    CHECKPOINT_LOAD,
    CHECKPOINT_PARTS_CAS,
    COMPARE_AND_DELETE,
    CONTEXT_CHANGE,
    CONTEXT_COMPARE_DELETE,
    CONTEXT_SWAP,
    PARTS_DROP,
    PARTS_STEP_SAVE,
    STEP_SAVE,
)
from siglo_redis.values import decode_cached, decode_context_value, encode_cached
from siglo_redis.waits import (
    MAX_SWAP_ATTEMPTS,
    WaitRecords,
    cancel_decision,
    claim_decision,
    complete_decision,
    completion_refused,
    now_ms,
    release_decision,
    swap,
)

__all__ = ["RedisStorageAdapter"]


_WRITES: Final = frozenset(
    {
        "save_checkpoint",
        "on_context_change",
        "set_cached_step",
        "_do_save_checkpoint",
        "_do_on_context_change",
        "_do_set_cached_step",
    }
)
"""Writes an instance may replace (a test's recorder): then a step's writes go apart."""


class RedisStorageAdapter(StorageAdapter):
    """The storage contract on Redis (seed 001 §5), stricter where SPEC §4 says so.

    ``client`` is any client with the methods of seed 001 §4 (``redis.asyncio.Redis``,
    ``redis.asyncio.RedisCluster``, valkey's client) or a ``redis://`` URL to build one
    from; a client built here is closed by :meth:`aclose`, a client passed in never is.

    Options (seed names in snake_case):

    - ``checkpoint_ttl_ms`` (default 24 h; ``None``: keep until removed) bounds how long
      checkpoints without an earlier ``expires_at``, wait records and context streams are
      kept.
    - ``cache_ttl_ms`` (default 5 min) is the step cache's default TTL.
    - ``record_context_changes`` (default ``True``) writes context changes to
      ``siglo:[<ns>:]context:<stackId>:<stepId>``.
    - ``key_prefix`` (default ``siglo:``) replaces the leading ``siglo:`` of every key;
      ``lock_key_prefix`` (default ``<key_prefix>workflow-lock:``) is where workflow
      locks live: never under the public :class:`RedisLock`'s ``<key_prefix>lock:``.
    - ``claim_lease_ms`` (default 60 s) is how long a wait-record claim lasts.
    - ``workflow_lock_ttl_ms`` / ``workflow_lock_timeout_ms`` govern
      :meth:`with_workflow_lock` (the lease is renewed while the action runs).
    - ``command_timeout_ms`` (default 10 s; ``None``: none) bounds every Redis call.
    - ``incremental_min_bytes`` (default ``None``: off) saves a checkpoint document at
      least this long incrementally: its skeleton at the checkpoint key and its contexts
      in a parts hash beside it, a save writing only the contexts that changed, in the
      compare-and-set's one script (docs/backends/redis.md). Off by default because
      the key then no longer holds the whole document that TypeScript readers expect.
    """

    name: ClassVar[str] = "redis"
    max_document_bytes: int | None = 512 * 1024 * 1024
    """Redis's largest string (``proto-max-bulk-len``'s default, 512 MiB)."""
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.CHECKPOINTS,
            Capability.WAIT_RECORDS,
            Capability.WORKFLOW_LOCK,
            Capability.STEP_CACHE,
            Capability.CONTEXT_STREAM,
            Capability.CACHE_EVENTS,
            Capability.LISTING,
            Capability.DELETION,
            Capability.DUE_WAITS,
            Capability.PAYLOAD_SCAN,
        }
    )
    payload_kinds: ClassVar[frozenset[PayloadKind]] = frozenset((*PAYLOAD_KINDS, CONTEXT_KIND))

    def __init__(
        self,
        client: Any,
        *,
        checkpoint_ttl_ms: int | None = DEFAULTS.checkpoint_ttl_ms,
        cache_ttl_ms: int = DEFAULTS.cache_ttl_ms,
        record_context_changes: bool = True,
        key_prefix: str = DEFAULT_PREFIX,
        lock_key_prefix: str | None = None,
        claim_lease_ms: int = DEFAULTS.claim_lease_ms,
        workflow_lock_ttl_ms: int = DEFAULTS.workflow_lock_ttl_ms,
        workflow_lock_timeout_ms: int = DEFAULTS.workflow_lock_timeout_ms,
        command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
        incremental_min_bytes: int | None = None,
    ) -> None:
        self.checkpoint_ttl_ms = require_ttl_ms(
            "checkpoint_ttl_ms", checkpoint_ttl_ms, optional=True
        )
        self.cache_ttl_ms = require_ttl_ms("cache_ttl_ms", cache_ttl_ms)
        self.claim_lease_ms = require_lease_ms("claim_lease_ms", claim_lease_ms)
        self.workflow_lock_ttl_ms = require_ttl_ms("workflow_lock_ttl_ms", workflow_lock_ttl_ms)
        self.workflow_lock_timeout_ms = require_ttl_ms(
            "workflow_lock_timeout_ms", workflow_lock_timeout_ms
        )
        require_ttl_ms("command_timeout_ms", command_timeout_ms, optional=True)
        if not isinstance(record_context_changes, bool):
            raise InvalidArgumentError(
                f"record_context_changes must be a bool, got {record_context_changes!r}"
            )
        self.record_context_changes = record_context_changes
        if incremental_min_bytes is not None and (
            type(incremental_min_bytes) is not int or incremental_min_bytes < 0
        ):
            raise InvalidArgumentError(
                "incremental_min_bytes must be a non-negative integer of bytes or none, "
                f"got {incremental_min_bytes!r}"
            )
        self.incremental_min_bytes = incremental_min_bytes
        # The bodies of recent saves (hashed once) and, by checkpoint key, the digests
        # this process saw stored last: a save sends only the bodies not among them
        # (the script refuses with 3 when one is not there after all; all are sent then).
        self._bodies = BodyCache()
        self._stored: OrderedDict[str, frozenset[bytes]] = OrderedDict()
        self.keys = KeySpace(check_prefix("key_prefix", key_prefix))
        self._owns_client = isinstance(client, str)
        client = client_for(client, command_timeout_ms=command_timeout_ms)
        self.client: Any = client
        self._redis = Commands(client, command_timeout_ms=command_timeout_ms)
        self._index = CheckpointIndex(self._redis, client, self.keys)
        self._waits = WaitRecords(self._redis, client, self.keys)
        if lock_key_prefix is not None and lock_key_prefix == self.keys.lock_prefix:
            raise InvalidArgumentError(
                f"lock_key_prefix {lock_key_prefix!r} is the public RedisLock's prefix: "
                "workflow locks and public locks must never share keys"
            )
        # with_workflow_lock takes <key_prefix>workflow-lock:<stackId>: a token-checked
        # lease renewed while the action runs, so two actions for one stack never overlap
        # in any process sharing this Redis.
        self.workflow_lock = RedisLock(
            client,
            lock_key_prefix or self.keys.workflow_lock_prefix,
            strict_atomicity=True,
            command_timeout_ms=command_timeout_ms,
        )

    async def aclose(self) -> None:
        """Close the client if this adapter built it from a URL (a passed-in one stays
        open); either way the adapter refuses every call from now on."""
        try:
            if self._owns_client:
                self._owns_client = False
                await self._redis.call("close", close_client(self.client))
        finally:
            await super().aclose()

    # -- checkpoints -------------------------------------------------------------------

    def _px(self, expires_at: int | None, now: int) -> int | None:
        """The key's TTL: the earlier of ``expires_at`` and the retention (may be <= 0)."""
        candidates = [] if expires_at is None else [expires_at - now]
        if self.checkpoint_ttl_ms is not None:
            candidates.append(self.checkpoint_ttl_ms)
        return clamp_px(min(candidates)) if candidates else None

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        # Cut off while its one write was queued, unwritten, it stored nothing: said so
        # (siglo.unsent), the caller may act on it. Every command of this save comes
        # before, or is, the one that stores the checkpoint.
        try:
            if self.incremental_min_bytes is not None and (
                self.keys.checkpoint_parts(checkpoint.stack_id, checkpoint.namespace) is not None
            ):
                await self._save_incrementally(checkpoint, expected_revision)
                return
            data = checkpoint.to_json()
            now = now_ms()
            px = self._px(checkpoint.expires_at, now)
            key = self.keys.checkpoint(checkpoint.stack_id, checkpoint.namespace)
            parts = self.keys.checkpoint_parts(checkpoint.stack_id, checkpoint.namespace)
            shard = self._index.shard_of(key)
            await self._index.register(shard)
            reply = await self._redis.script(
                CHECKPOINT_CAS,
                [
                    key,
                    self._index.key(shard),
                    # The parts hash another writer may have left: dropped with the write.
                    *filter(None, [parts]),
                    *self._index.token_keys_of(checkpoint, key),
                ],
                [
                    data,
                    checkpoint.revision,
                    "" if expected_revision is None else expected_revision,
                    now,
                    "" if px is None else px,
                    member_of(checkpoint.stack_id, checkpoint.namespace),
                    "" if parts is None else "1",
                ],
            )
            outcome = int(reply)
            if outcome == 1:
                return
            if outcome == 2:
                await self._save_checkpoint_exactly(checkpoint, expected_revision, key, data, px)
                return
            raise _conflict(checkpoint, expected_revision, outcome)
        except asyncio.CancelledError as exc:
            if unwritten(exc):
                mark_unsent(exc)
            raise

    # -- a step's writes in one script -------------------------------------------------

    def _own_writes(self) -> bool:
        """Whether saving, streaming and caching are this class's own: a subclass or an
        instance that replaces one (a wrapper, a test's recorder) gets the calls apart."""
        cls = type(self)
        return (
            cls._do_save_checkpoint is RedisStorageAdapter._do_save_checkpoint
            and cls._do_on_context_change is RedisStorageAdapter._do_on_context_change
            and cls._do_set_cached_step is RedisStorageAdapter._do_set_cached_step
            and cls.save_checkpoint is StorageAdapter.save_checkpoint
            and cls.on_context_change is StorageAdapter.on_context_change
            and cls.set_cached_step is StorageAdapter.set_cached_step
            and not _WRITES & vars(self).keys()
        )

    def _one_script(self) -> bool:
        """Whether a step's writes (its context changes, its cache entry, its checkpoint's
        compare-and-set, the workflow lock's release) go in one script (``STEP_SAVE``, or
        ``PARTS_STEP_SAVE`` for a checkpoint saved incrementally): on one Redis server (on
        a cluster the keys are in different slots), with ``eval``, and this class's own
        writes (:meth:`_own_writes`)."""
        return self._redis.has_eval and not self._index.cluster and self._own_writes()

    def writes_with_checkpoint(self, changes: Sequence[ContextChangeEvent]) -> bool:
        """Any changes, by this class's own writes (:meth:`_own_writes`): in one script
        with the checkpoint (:meth:`_one_script`), else the calls in order after the size
        guard (:meth:`StorageAdapter.save_checkpoint_streamed`). Either way a save the
        guard refuses writes none of them, where the storage manager, told no, would
        stream them before the save."""
        return self._own_writes()

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        """The context changes and the checkpoint's compare-and-set in one script, the
        changes written whatever it decides (:meth:`_one_script`; else the calls in
        order)."""
        if not self._one_script():
            await super().save_checkpoint_streamed(
                checkpoint, changes, expected_revision=expected_revision
            )
            return
        await self._step_save(checkpoint, changes, expected_revision, None, None)

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        """:meth:`save_checkpoint_streamed` with the release of the stack's workflow lock
        this task holds in the same script."""
        if not self._one_script():
            await super().save_checkpoint_unlocking(
                checkpoint, changes, expected_revision=expected_revision
            )
            return
        await self._step_save(checkpoint, changes, expected_revision, self._hold(checkpoint), None)

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        """The context changes, the cache entry (``SET … PX``), the compare-and-set and
        (``unlock``) the workflow lock's release in one script, the changes and the
        entry written whatever the compare-and-set decides (:meth:`_one_script`; else
        :meth:`StorageAdapter.save_checkpoint_caching`, the calls apart)."""
        if not self._one_script():
            await super().save_checkpoint_caching(
                checkpoint, changes, entry, expected_revision=expected_revision, unlock=unlock
            )
            return
        hold = self._hold(checkpoint) if unlock else None
        await self._step_save(checkpoint, changes, expected_revision, hold, entry)

    def _hold(self, checkpoint: Checkpoint) -> Hold | None:
        """This task's hold of the stack's workflow lock, if it is not released yet (and
        is this adapter's own kind of lock, whose key the script can release)."""
        lock = self.workflow_lock
        if not isinstance(lock, RedisLock):
            return None
        return held(lock, workflow_lock_key(checkpoint.stack_id, checkpoint.namespace))

    async def _step_save(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        expected_revision: int | None,
        release: Hold | None,
        entry: CacheEntry | None,
    ) -> None:
        # As _do_save_checkpoint: one script stores the checkpoint and the step's writes.
        try:
            check_save_arguments(checkpoint, expected_revision)
            if entry is not None:
                entry.checked()
            # Before anything is sent: a document too large leaves nothing written, the
            # changes and the entry included (they go in the save's script).
            check_document_size(checkpoint, self.max_document_bytes)
            self._require_open()
            step = self._step_writes(changes, release, entry)
            parts = self.keys.checkpoint_parts(checkpoint.stack_id, checkpoint.namespace)
            if self.incremental_min_bytes is not None and parts is not None:
                await self._save_incrementally(checkpoint, expected_revision, step)
                return
            data = checkpoint.to_json()
            now = now_ms()
            px = self._px(checkpoint.expires_at, now)
            key = self.keys.checkpoint(checkpoint.stack_id, checkpoint.namespace)
            shard = self._index.shard_of(key)
            await self._index.register(shard)
            tokens = self._index.token_keys_of(checkpoint, key)
            reply = await self._redis.script(
                STEP_SAVE,
                [key, self._index.key(shard), *filter(None, [parts]), *tokens, *step.keys],
                [
                    data,
                    checkpoint.revision,
                    "" if expected_revision is None else expected_revision,
                    now,
                    "" if px is None else px,
                    member_of(checkpoint.stack_id, checkpoint.namespace),
                    "" if parts is None else "1",
                    len(tokens),
                    step.changes,
                    *step.args,
                ],
            )
            outcome = int(reply)
            if outcome == 2:  # revisions past 2**53: decided here, the lock still held
                await self._save_checkpoint_exactly(checkpoint, expected_revision, key, data, px)
                return
            if release is not None:
                release.released = True
            if outcome == 1:
                return
            raise _conflict(checkpoint, expected_revision, outcome)
        except asyncio.CancelledError as exc:
            if unwritten(exc):
                mark_unsent(exc)
            raise

    def _step_writes(
        self,
        changes: Sequence[ContextChangeEvent],
        release: Hold | None,
        entry: CacheEntry | None,
    ) -> _StepWrites:
        """The keys and arguments of a step's writes besides its checkpoint, as the tail
        of ``STEP_SAVE`` and ``PARTS_STEP_SAVE`` reads them."""
        step = _StepWrites(release)
        retention = None if self.checkpoint_ttl_ms is None else clamp_px(self.checkpoint_ttl_ms)
        for change in changes:
            event = check_context_change(change)
            value = codec.dumps(event.value, what=f"context value {event.key!r}")
            if not self.record_context_changes:
                continue
            step.changes += 1
            step.keys.append(self.keys.context(event.stack_id, event.step_id, event.namespace))
            step.args += [event.op, event.key, value, "" if retention is None else retention]
        if entry is None:
            step.args += ["0", "", ""]
        else:
            name = namespaced_key(entry.key, entry.namespace)
            data = encode_cached(entry.value, what=f"cached value of {name!r}")
            step.keys.append(self.keys.cache(name))
            step.args += ["1", data, clamp_px(entry.ttl_ms or self.cache_ttl_ms)]
        if release is None:
            step.args += ["0", ""]
        else:
            assert isinstance(self.workflow_lock, RedisLock)  # _hold found it
            step.keys.append(self.workflow_lock.key_prefix + release.lease.key)
            step.args += ["1", release.lease.token]
        return step

    async def _save_incrementally(
        self,
        checkpoint: Checkpoint,
        expected_revision: int | None,
        step: _StepWrites | None = None,
        *,
        keep_ttl: bool = False,
    ) -> None:
        """The compare-and-set of :data:`CHECKPOINT_PARTS_CAS`: a document of at least
        ``incremental_min_bytes`` as its skeleton and the context bodies the parts hash
        does not hold yet, a smaller one whole (its parts hash dropped), in one script.
        With ``step``, a step's other writes go in that script too
        (:data:`PARTS_STEP_SAVE`), as :data:`STEP_SAVE` takes them with a whole save.
        ``keep_ttl``: the key keeps the TTL it has (``cancel_workflow``, as its whole
        write does) instead of the retention starting again."""
        data = checkpoint.to_json()
        now = now_ms()
        px: int | str | None = "keep" if keep_ttl else self._px(checkpoint.expires_at, now)
        key = self.keys.checkpoint(checkpoint.stack_id, checkpoint.namespace)
        parts_key = self.keys.checkpoint_parts(checkpoint.stack_id, checkpoint.namespace)
        assert parts_key is not None  # _do_save_checkpoint saves the others whole
        shard = self._index.shard_of(key)
        await self._index.register(shard)
        least = self.incremental_min_bytes
        digests: frozenset[bytes] = frozenset()
        bodies: dict[bytes, bytes] = {}
        head, order = data, b""
        if least is not None and len(data) >= least:
            cut = split(checkpoint, key.encode(), self._bodies)
            head, order, bodies = cut.skeleton, cut.parts, cut.bodies
            digests = frozenset(bodies)
        known = self._stored.pop(key, frozenset())
        common = [
            head,
            checkpoint.revision,
            "" if expected_revision is None else expected_revision,
            now,
            "" if px is None else px,
            member_of(checkpoint.stack_id, checkpoint.namespace),
            order,
        ]
        tokens = self._index.token_keys_of(checkpoint, key)
        keys = [key, self._index.key(shard), parts_key, *tokens]
        script = CHECKPOINT_PARTS_CAS
        if step is not None:
            script = PARTS_STEP_SAVE
            keys += step.keys
            common += [len(tokens), len(bodies)]
        outcome = 3
        for sent in (known, frozenset()):  # then every body, if one believed kept is not
            pairs: list[Any] = []
            for digest, body in bodies.items():
                pairs += (digest.hex(), b"" if digest in sent else body)
            if step is not None:
                pairs += [step.changes, *step.args]
            outcome = int(await self._redis.script(script, keys, common + pairs))
            if outcome != 3 or not sent:
                break
        if outcome == 2:
            # Revisions past 2**53: decided here, writing the document whole and dropping
            # the parts hash in one script; a step's lock is still held.
            await self._save_checkpoint_exactly(checkpoint, expected_revision, key, data, px)
            return
        if outcome == 3:
            raise StorageAdapterError(
                f"checkpoint of stack {checkpoint.stack_id!r}: the parts hash lost a body "
                "the save did not send"
            )
        if step is not None and step.release is not None:
            step.release.released = True
        if outcome == 1:
            self._remember(key, digests)
            return
        raise _conflict(checkpoint, expected_revision, outcome)

    def _remember(self, key: str, digests: frozenset[bytes]) -> None:
        """Note the context digests the parts hash of ``key`` holds now (a few thousand
        checkpoints' worth: a forgotten one costs sending its bodies once more)."""
        self._stored.pop(key, None)
        if digests:
            self._stored[key] = digests
            while len(self._stored) > _REMEMBERED:
                self._stored.popitem(last=False)

    async def _read_checkpoint(
        self, stack_id: str, namespace: str | None
    ) -> tuple[bytes | None, bytes | None]:
        """``(head, document)`` of a stored checkpoint: what its key holds, and the
        whole document (assembled from its parts hash when it is stored in parts; the
        two read in one atomic step, so a save between cannot tear it)."""
        key = self.keys.checkpoint(stack_id, namespace)
        parts_key = self.keys.checkpoint_parts(stack_id, namespace)
        found: tuple[bytes, bytes | None, dict[bytes, bytes]] | None = None
        if parts_key is None:
            # No parts hash can share this key's slot: the stack is only ever stored whole.
            head = raw(await self._redis.get(key))
            return head, head
        if self.incremental_min_bytes is None:
            head = raw(await self._redis.get(key))
            if head is None or not _skeleton(head):
                return head, head
            # A skeleton: a writer with incremental saves on stored it in parts.
        else:
            if self._bodies.holds(key.encode()):
                # Saved or loaded here in parts: its bodies are likely kept.
                kept = await self._kept_document(key, parts_key)
                if kept is not None:
                    return kept
            # The key and the hash side by side (auto-pipelining writes the two commands
            # together: one round trip). Not one atomic read, but none is needed when it
            # proves itself: a whole document is complete alone, and a hash whose
            # "@head" is the SHA-1 of the skeleton read is the parts saved with it
            # (HGETALL reads the hash at one moment). Otherwise the atomic read decides.
            stored, fields = await asyncio.gather(
                self._redis.get(key),
                self._redis.call("HGETALL", self.client.hgetall(parts_key)),
            )
            head = raw(stored)
            if head is None:
                return None, None
            if not _skeleton(head):
                return head, head
            found = _own_parts(head, fields)
        if found is None:
            found = await self._head_and_parts(key, parts_key)
        if found is None:
            return None, None
        head, order, bodies = found
        if order is None:
            return head, head
        document = assemble(head, order, bodies)
        if document is None:
            raise MalformedRecordError(
                "checkpoint", "contexts", f"of stack {stack_id!r} name a part that is not stored"
            )
        self._remember(key, frozenset(bodies))
        # Its bodies kept: a save of it hashes only the contexts that changed, and the
        # next load here reads the parts list alone (_kept_document).
        self._bodies.keep(key.encode(), order, bodies)
        return head, document

    async def _kept_document(
        self, key: str, parts_key: str
    ) -> tuple[bytes | None, bytes | None] | None:
        """``(head, document)`` of a checkpoint whose bodies this process keeps (it saved
        or loaded it in parts), read without them: the key and the hash's ``@len``,
        ``@head`` and ``@order`` side by side (one round trip, a few hundred bytes), the
        document assembled from the bodies kept for the digests ``@order`` names. A
        digest names its body, so a body another writer replaced is never served: its
        ``@order`` names another digest, whose body is read (``HMGET`` of those fields).
        ``None`` when the hash was not saved with the key's skeleton (or no longer is,
        at the read of the bodies): the key and the whole hash are read then.

        At 256 KB, ``HGETALL`` of 16 bodies of 16 KB took the server and the client
        longer than ``GET`` of the whole document (issue 34)."""
        stored, fields = await asyncio.gather(
            self._redis.get(key),
            self._redis.call("HMGET", self.client.hmget(parts_key, ["@len", "@head", "@order"])),
        )
        head = raw(stored)
        if head is None:
            return None, None
        if not _skeleton(head):
            return head, head
        size, digest, order = (raw(f) for f in (fields or (None, None, None)))
        if size != str(len(head)).encode() or digest != sha1_hex(head).encode():
            return None
        order = order or b"[]"
        kept, missing = self._bodies.partial(key.encode(), order)
        if missing:
            # Another writer changed some contexts since: their bodies alone are read,
            # with "@head" again (still the skeleton's SHA-1: the hash is the one saved
            # with it, so the bodies are).
            names = ["@head", *(d.hex() for d in missing)]
            found = await self._redis.call("HMGET", self.client.hmget(parts_key, names))
            if raw(found[0]) != digest or any(f is None for f in found[1:]):
                return None
            read = {d: raw(f) or b"" for d, f in zip(missing, found[1:], strict=True)}
            self._bodies.keep(key.encode(), order, read)
            kept.update(read)
        document = assemble(head, order, kept)
        if document is None:
            return None
        self._remember(key, frozenset(kept))
        return head, document

    async def _head_and_parts(
        self, key: str, parts_key: str
    ) -> tuple[bytes, bytes | None, dict[bytes, bytes]] | None:
        """What the checkpoint key holds, and when its parts hash belongs to it the parts
        list and the bodies by digest (else ``None`` and nothing), read in one atomic
        step; ``None`` when there is no checkpoint.

        ``MULTI``/``EXEC`` of ``GET`` and ``HGETALL`` where the client can (the server
        writes the reply straight from the keys: a 10 MB document through Lua took 20 ms
        more, copied into Lua strings and back), else :data:`CHECKPOINT_LOAD`."""
        pipeline = getattr(self.client, "pipeline", None)
        if pipeline is None or is_cluster(self.client):
            reply = await self._redis.script(CHECKPOINT_LOAD, [key, parts_key], [])
            if not reply:
                return None
            head = raw(reply[0]) or b""
            if len(reply) == 1:
                return head, None, {}
            bodies = {
                bytes.fromhex(text(reply[i]) or ""): raw(reply[i + 1]) or b""
                for i in range(2, len(reply), 2)
            }
            return head, raw(reply[1]) or b"[]", bodies
        pipe = pipeline(transaction=True)
        pipe.get(key)
        pipe.hgetall(parts_key)
        stored, fields = await self._redis.call("MULTI", pipe.execute())
        if stored is None:
            return None
        head = raw(stored) or b""
        # Parts of another head: stored whole since (a writer without parts left these).
        return _own_parts(head, fields) or (head, None, {})

    async def _save_checkpoint_exactly(
        self,
        checkpoint: Checkpoint,
        expected_revision: int | None,
        key: str,
        data: bytes,
        px: int | str | None,
    ) -> None:
        """The compare-and-set for revisions of 2**53 and above, in exact integers
        (``px``: as the swap script's TTL, ``"keep"`` included).

        Decided here, written by the swap script only if the stored value is still the
        one decided on (else decided again): as atomic as the Lua compare-and-set.
        """
        for _ in range(MAX_SWAP_ATTEMPTS):
            current, stored_data = await self._live_checkpoint(
                checkpoint.stack_id, checkpoint.namespace, now_ms()
            )
            current_revision = None if current is None else current.revision
            if expected_revision is not None:
                won = (current_revision or 0) == expected_revision
            else:
                won = current_revision is None or checkpoint.revision > current_revision
            if not won:
                raise CheckpointConflictError(
                    checkpoint.stack_id, current_revision, expected_revision, checkpoint.revision
                )
            # Listed before it is written: the index may name a checkpoint not (yet)
            # there, which a walk skips, but never misses one that is.
            index = self._index.key(self._index.shard_of(key))
            member = member_of(checkpoint.stack_id, checkpoint.namespace)
            await self._redis.call("ZADD", self.client.zadd(index, {member: 0}))
            for token_key in self._index.token_keys_of(checkpoint, key):
                await self._redis.call("ZADD", self.client.zadd(token_key, {member: 0}))
            # Written whole: a parts hash beside it goes in the same script.
            parts = self.keys.checkpoint_parts(checkpoint.stack_id, checkpoint.namespace)
            ttl = "" if px is None else px
            if await swap(self._redis, key, stored_data, data, ttl, parts):
                return
        raise StorageAdapterError(
            f"checkpoint of stack {checkpoint.stack_id!r} kept changing under contention"
        )

    async def _live_checkpoint(
        self, stack_id: str, namespace: str | None, now: int
    ) -> tuple[Checkpoint | None, bytes | None]:
        """The live checkpoint (``None`` if gone or expired) and what its key holds (the
        value the swap script compares against)."""
        head, document = await self._read_checkpoint(stack_id, namespace)
        if document is None:
            return None, None
        checkpoint = Checkpoint.from_json(document)
        # A key of another writer may outlive its expiresAt (the seed's PX ignores it).
        if checkpoint.is_expired(now):
            return None, head
        return checkpoint, head

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        now = now_ms()
        found, _ = await self._live_checkpoint(stack_id, namespace, now)
        if found is None and namespace is not None and fallback:
            found, _ = await self._live_checkpoint(stack_id, None, now)
        return found

    async def _do_clean_expired_checkpoints(self) -> int:
        """Redis expires keys itself (seed 001 §5): nothing to sweep, returns 0."""
        return 0

    async def clean_expired(self) -> dict[str, int]:
        """What ``siglo clean`` runs: Redis expires the records themselves (0 of them
        here); this drops what siglo's own indexes still name — listing-index members of
        expired checkpoints, due-wait entries of gone or finished waits — and the parts
        hashes that belong to no stored checkpoint (:meth:`_drop_orphan_parts`), and
        counts them."""
        self._require_open()

        async def read(member: str) -> WaitRecord | None:
            namespace, key = deadline_member_parts(member)
            record, _ = await self._waits.read(key, namespace)
            return record

        swept = await self._index.sweep(read)
        return {"checkpoints": 0, **swept, "checkpoint_parts": await self._drop_orphan_parts()}

    async def _drop_orphan_parts(self) -> int:
        """Drop every parts hash whose checkpoint key is gone or holds another head, and
        count them. siglo's own writes leave none (every whole write and every delete
        drops the hash in its script, and a save in parts gives both keys one ``PX``),
        but siglo before whole writes dropped it did, and so does a key removed past
        siglo (a ``DEL`` by hand, eviction under ``maxmemory``) or saved whole by a
        TypeScript worker: such a hash holds every context body of a checkpoint that is
        no longer stored, kept for its old TTL or, with ``checkpoint_ttl_ms`` none,
        forever. They are found with ``SCAN`` (no index names them), whatever this
        adapter's ``incremental_min_bytes``: another process may have saved in parts.
        Each is dropped by :data:`PARTS_DROP`, which keeps it if a save made it the
        stored head's meanwhile; a batch of them at once (auto-pipelined: one round trip
        for many, where one each took a round trip per hash)."""
        prefix = "".join("\\" + c if c in "*?[]\\" else c for c in self.keys.prefix)
        dropped = 0
        batch: list[Any] = []

        async def drop() -> int:
            sent = batch[:]
            batch.clear()
            return sum(int(reply or 0) for reply in await asyncio.gather(*sent))

        try:
            async for name in scan_keys(self._redis, self.client, f"{prefix}*checkpoint-parts:*"):
                owner = self.keys.checkpoint_parts_of(name)
                if owner is None:
                    continue  # another key whose id holds "checkpoint-parts:"
                key = self.keys.checkpoint(*owner)
                batch.append(self._redis.script(PARTS_DROP, [key, name], []))
                if len(batch) == _DROP_BATCH:
                    dropped += await drop()
            return dropped + await drop()
        finally:
            for unsent in batch:  # the walk failed: these were never started
                unsent.close()

    # -- operating what is stored (siglo_redis.listing) ---------------------------------

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        return await self._index.page(query, now_ms())

    async def _do_list_by_index(self, query: ListQuery, tokens: dict[str, str]) -> CheckpointPage:
        assert query.namespace is not MISSING  # list_checkpoints_by_index names one
        if not self._index.indexable(query.namespace):
            # Braces in the namespace on a cluster: its stacks have no sets.
            return await super()._do_list_by_index(query, tokens)
        return await self._index.page(query, now_ms(), tokens)

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        # The wait records and context streams live in other cluster slots than the
        # checkpoint, so they cannot go in its script. A run re-created under the same
        # id once the checkpoint is gone must keep what it stores (issue 31: deleting
        # "whatever the stack has by then" deleted the new run's wait, which then waited
        # forever). So what belongs to the run being deleted is read first, and only
        # that is deleted, each key or field only if it still holds the value read:
        # - context fields before the checkpoint: while it exists no new run can be
        #   created under its id (creation is a compare-and-set on revision 0), and a
        #   new run may well write the very same values, which no comparison tells apart;
        # - wait records after it (a refused compare-and-set must leave a live run's
        #   waits alone); a new run's record differs from the old one (its createdAt).
        key = self.keys.checkpoint(stack_id, namespace)
        _, before = await self._read_checkpoint(stack_id, namespace)
        if expected_revision is not None:
            # Checked before anything is read for deletion; the delete's script checks
            # it again, atomically.
            stored = _revision_of(before)
            if stored != expected_revision:
                raise CheckpointConflictError(stack_id, stored, expected_revision)
        contexts = {
            step: await self._context_fields(stack_id, step, namespace)
            for step in _steps_of(before)
        }
        waits = await self._waits.snapshot_of_stack(stack_id, namespace)
        for step, fields in contexts.items():
            if fields:
                pairs = [part for item in fields.items() for part in item]
                await self._redis.script(
                    CONTEXT_COMPARE_DELETE, [self.keys.context(stack_id, step, namespace)], pairs
                )
        reply = await self._redis.script(
            CHECKPOINT_DELETE,
            [
                key,
                self._index.key(self._index.shard_of(key)),
                # No parts hash when none can share the key's slot (the script checks).
                *filter(None, [self.keys.checkpoint_parts(stack_id, namespace)]),
            ],
            [
                member_of(stack_id, namespace),
                "" if expected_revision is None else expected_revision,
                now_ms(),
            ],
        )
        if int(reply[0]) == 0:
            stored = int(reply[1])
            raise CheckpointConflictError(
                stack_id, None if stored < 0 else stored, expected_revision
            )
        self._stored.pop(key, None)  # its parts hash is gone: no body is kept for a rerun
        # A crash from here on leaves records that expire with their retention.
        await self._waits.delete_snapshot(stack_id, namespace, waits)
        return int(reply[1]) == 1

    async def _context_fields(
        self, stack_id: str, step_id: str, namespace: str | None
    ) -> dict[bytes, bytes]:
        fields = await self._redis.call(
            "HGETALL", self.client.hgetall(self.keys.context(stack_id, step_id, namespace))
        )
        return {raw(name) or b"": raw(data) or b"" for name, data in (fields or {}).items()}

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        async def read(member: str) -> WaitRecord | None:
            namespace, key = deadline_member_parts(member)
            record, _ = await self._waits.read(key, namespace)
            return record

        return await self._index.due(limit, now_ms(), read)

    # -- wait records (siglo_redis.waits) ------------------------------------------------

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        # Indexed by deadline before it is written: a due wait is never missed.
        await self._index.add_deadline(record)
        await self._waits.save(record, ttl_ms if ttl_ms is not None else self.checkpoint_ttl_ms)

    async def _do_create_wait_record(self, record: WaitRecord, *, ttl_ms: int | None) -> bool:
        # Indexed by deadline before it is written, as a save is; an entry of a record
        # already there keeps its deadline, and the created record's is set after.
        await self._index.add_deadline(record, keep_existing=True)
        retention = ttl_ms if ttl_ms is not None else self.checkpoint_ttl_ms
        if not await self._waits.create(record, retention):
            return False
        await self._index.add_deadline(record)
        return True

    async def _do_get_wait_record(
        self, correlation_key_or_stack_id: str, namespace: str | None = None
    ) -> WaitRecord | None:
        key = correlation_key_or_stack_id
        record, data = await self._waits.read(key, namespace)
        if record is not None:
            return record
        record = await self._waits.latest_of_stack(key, namespace, data)
        if record is not None:
            return record
        # Seed 001 §5: last, a wait record kept in the checkpoint's metadata.
        checkpoint, _ = await self._live_checkpoint(key, namespace, now_ms())
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
        decide = claim_decision(
            claimant_id, lease_ms or self.claim_lease_ms, allow_expired, event_payload
        )
        _, claimed = await self._waits.transition(correlation_key, namespace, decide)
        return claimed

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        before, completed = await self._waits.transition(
            correlation_key, namespace, complete_decision(claimant_id)
        )
        if completed is None:
            raise completion_refused(correlation_key, before)

    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> bool:
        _, released = await self._waits.transition(
            correlation_key, namespace, release_decision(claimant_id)
        )
        return released is not None

    async def _do_cancel_wait_record(
        self, correlation_key: str, namespace: str | None = None
    ) -> bool:
        _, cancelled = await self._waits.transition(correlation_key, namespace, cancel_decision())
        return cancelled is not None

    async def _do_cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        keys, _ = await self._waits.keys_of_stack(stack_id, namespace)
        decide = cancel_decision(stack_id, namespace)
        for correlation_key in sorted(keys):
            await self._waits.transition(correlation_key, namespace, decide)
        key = self.keys.checkpoint(stack_id, namespace)
        for _ in range(MAX_SWAP_ATTEMPTS):
            now = now_ms()
            checkpoint, data = await self._live_checkpoint(stack_id, namespace, now)
            if checkpoint is None or checkpoint.status in TERMINAL_STATUSES:
                return
            cancelled = checkpoint.replace(
                status="cancelled", revision=checkpoint.revision + 1, timestamp=now
            )
            if self.incremental_min_bytes is not None or (data and _skeleton(data)):
                # Stored in parts (or saving so): the compare-and-set on the revision
                # keeps the parts hash in step, where the swap would write the head only.
                try:
                    await self._save_incrementally(cancelled, checkpoint.revision, keep_ttl=True)
                except CheckpointConflictError:
                    continue
                return
            # Written whole, keeping the key's TTL: a parts hash left beside it (by siglo
            # before whole writes dropped it) goes in the same script.
            parts = self.keys.checkpoint_parts(stack_id, namespace)
            if await swap(self._redis, key, data, cancelled.to_json(), "keep", parts):
                return
        raise StorageAdapterError(
            f"checkpoint of stack {stack_id!r} kept changing under contention"
        )

    # -- step cache ------------------------------------------------------------------------

    async def _do_get_cached_step(self, key: str) -> Any | Missing:
        data = await self._redis.get(self.keys.cache(key))
        return MISSING if data is None else decode_cached(data)

    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        data = encode_cached(value, what=f"cached value of {key!r}")
        await self._redis.set(self.keys.cache(key), data, px=ttl_ms or self.cache_ttl_ms)

    # -- stored payloads -----------------------------------------------------------------------

    async def _string_at(self, key: str) -> bytes | None:
        """The value of ``key`` if it is a string (a key of another type is not a record
        even when its name matches the pattern, e.g. a context hash whose step id holds
        ``wait:``)."""
        kind = text(await self._redis.call("TYPE", self.client.type(key)))
        return await self._redis.get(key) if kind == "string" else None

    async def _do_scan_payloads(self, kind: PayloadKind) -> AsyncIterator[StoredPayload]:
        prefix = "".join("\\" + c if c in "*?[]\\" else c for c in self.keys.prefix)
        if kind == "step":
            start = len(self.keys.cache(""))
            async for key in scan_keys(self._redis, self.client, f"{prefix}cache:*"):
                data = await self._string_at(key)
                if data is not None:
                    value = {"value": decode_cached(data)}
                    yield StoredPayload("step", key[start:], None, value, (key, data))
            return
        if kind == CONTEXT_KIND:
            async for item in self._scan_contexts(prefix):
                yield item
            return
        async for key in scan_keys(self._redis, self.client, f"{prefix}*wait:*"):
            data = await self._string_at(key)
            if data is None:
                continue
            try:
                record = WaitRecord.from_json(data)
            except SigloError:
                continue  # a checkpoint or another record whose id holds "wait:"
            ns = record.namespace
            # The record at its own key, or the seed's copy at its stack id's (which
            # TypeScript workers read): both hold the payloads.
            if key not in (
                self.keys.wait(record.correlation_key, ns),
                self.keys.wait(record.stack_id, ns),
            ):
                continue
            fields = wait_fields(record)
            if fields:
                yield StoredPayload("wait", record.correlation_key, ns, fields, (key, data))

    async def _scan_contexts(self, prefix: str) -> AsyncIterator[StoredPayload]:
        """Every value of every context hash, one item each (``context:`` also appears in
        other keys' ids: only a hash whose key is a context key's is read)."""
        async for key in scan_keys(self._redis, self.client, f"{prefix}*context:*"):
            stream = self.keys.context_of(key)
            if stream is None:
                continue
            if text(await self._redis.call("TYPE", self.client.type(key))) != "hash":
                continue
            namespace, stack_id, step_id = stream
            values = await self._redis.call("HGETALL", self.client.hgetall(key))
            for name, data in (values or {}).items():
                field, stored = text(name) or "", raw(data) or b""
                value = decode_context_value(stored)
                if value is None:  # not a payload: nothing to seal (as a wait's None)
                    continue
                yield StoredPayload(
                    CONTEXT_KIND,
                    stack_id,
                    namespace,
                    {context_field(step_id, field): value},
                    (key, field, stored),
                )

    async def _do_swap_payload(self, item: StoredPayload, fields: dict[str, Any]) -> bool:
        if item.kind == CONTEXT_KIND:
            key, field, stored = item.token
            (value,) = fields.values()
            new = codec.dumps(value, what=f"context value {field!r}")
            # One script: the field written only if it still holds the bytes read.
            return int(await self._redis.script(CONTEXT_SWAP, [key], [field, stored, new])) == 1
        key, data = item.token
        if item.kind == "wait":
            new = with_wait_fields(WaitRecord.from_json(data), fields).to_json()
        else:
            new = encode_cached(fields["value"], what=f"cached value of {item.key!r}")
        # The swap script: written only if the key still holds the bytes read, its TTL kept.
        return await swap(self._redis, key, data, new, "keep")

    async def _do_delete_payload(self, item: StoredPayload) -> bool:
        key, data = item.token
        if item.kind == "wait":
            return await self._waits.delete_listed(key, data)
        # One script: deleted only if the key still holds the bytes listed.
        return int(await self._redis.script(COMPARE_AND_DELETE, [key], [data])) == 1

    # -- context stream and telemetry ---------------------------------------------------------

    async def _do_on_context_change(self, event: ContextChangeEvent) -> None:
        """``HSET`` (or ``HDEL``) the field and ``PEXPIRE`` the hash (seed 001 §5), atomically.

        Bad input raises :class:`~siglo.errors.InvalidArgumentError`; a Redis failure
        raises :class:`~siglo.errors.StorageAdapterError`, which the storage manager
        (which streams these in the background) treats by its error mode — swallowed in
        ``best-effort``, as the seed's non-blocking telemetry does.
        """
        value = codec.dumps(event.value, what=f"context value {event.key!r}")
        if not self.record_context_changes:
            return
        key = self.keys.context(event.stack_id, event.step_id, event.namespace)
        retention = None if self.checkpoint_ttl_ms is None else clamp_px(self.checkpoint_ttl_ms)
        if self._redis.has_eval:
            await self._redis.script(
                CONTEXT_CHANGE,
                [key],
                [event.op, event.key, value, "" if retention is None else retention],
            )
            return
        # A client without eval (seed 001 §4): the seed's two commands.
        if event.op == "delete":
            await self._redis.call("HDEL", self.client.hdel(key, event.key))
        else:
            await self._redis.call("HSET", self.client.hset(key, event.key, value))
        if retention is None:
            await self._redis.call("PERSIST", self.client.persist(key))
        else:
            await self._redis.call("PEXPIRE", self.client.pexpire(key, retention))

    async def _do_get_context_changes(
        self, stack_id: str, step_id: str, namespace: str | None = None
    ) -> dict[str, Any]:
        fields = await self._redis.call(
            "HGETALL", self.client.hgetall(self.keys.context(stack_id, step_id, namespace))
        )
        return {
            text(name) or "": decode_context_value(raw(data) or b"")
            for name, data in (fields or {}).items()
        }

    async def _do_on_cache_event(self, event: CacheEvent) -> None:
        """Telemetry only: accepted, nothing is stored."""


@dataclass(slots=True)
class _StepWrites:
    """A step's writes besides its checkpoint, as the tail of a step's script reads them:
    the keys after the checkpoint's, the arguments after its own, how many context
    changes they hold, and the workflow lock's hold when the script releases it."""

    release: Hold | None
    keys: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)
    changes: int = 0


_DROP_BATCH: Final = 256
"""Parts hashes ``siglo clean`` checks at once (:meth:`RedisStorageAdapter._drop_orphan_parts`)."""

_REMEMBERED: Final = 4096
"""Checkpoints whose stored context digests an adapter remembers."""


def sha1_hex(data: bytes) -> str:
    """The SHA-1 of ``data`` in hex, as Lua's ``redis.sha1hex`` gives it."""
    return sha1(data, usedforsecurity=False).hexdigest()


def _own_parts(head: bytes, fields: Any) -> tuple[bytes, bytes | None, dict[bytes, bytes]] | None:
    """``(head, parts list, bodies by digest)`` when the parts hash's ``fields`` were
    saved with ``head`` (its ``@len`` and ``@head``), else ``None``."""
    parts = {raw(name) or b"": raw(value) or b"" for name, value in (fields or {}).items()}
    if parts.get(b"@len") != str(len(head)).encode():
        return None
    if parts.get(b"@head") != sha1_hex(head).encode():
        return None
    order = parts.pop(b"@order", b"[]")
    bodies = {
        bytes.fromhex(name.decode()): body for name, body in parts.items() if name[:1] != b"@"
    }
    return head, order, bodies


def _skeleton(head: bytes) -> bool:
    """Whether a checkpoint key holds a skeleton (``"contexts":{}``): stored in parts, or
    a document without contexts. No field before ``contexts`` is an object, so its
    first ``"contexts":`` is the top-level one, found in the document's opening."""
    at = head.find(MARK[:-2])
    return at >= 0 and head.startswith(b"{}", at + len(MARK) - 2)


def _steps_of(document: bytes | None) -> list[str]:
    """The steps whose context streams a stored checkpoint has (none if unreadable)."""
    if not document:
        return []
    try:
        return list(Checkpoint.from_json(document).contexts)
    except SigloError:
        return []


def _revision_of(document: bytes | None) -> int | None:
    """The revision of a stored checkpoint, ``None`` if there is none or it has expired
    (as the delete script reads it)."""
    if not document:
        return None
    try:
        checkpoint = Checkpoint.from_json(document)
    except SigloError:
        return None
    if checkpoint.expires_at is not None and now_ms() >= checkpoint.expires_at:
        return None
    return checkpoint.revision


def _conflict(
    checkpoint: Checkpoint, expected_revision: int | None, outcome: int
) -> CheckpointConflictError:
    """The error of a compare-and-set script's conflict reply, ``-2 - stored`` (``-1``:
    nothing stored)."""
    stored = -2 - outcome
    return CheckpointConflictError(
        checkpoint.stack_id, None if stored < 0 else stored, expected_revision, checkpoint.revision
    )
