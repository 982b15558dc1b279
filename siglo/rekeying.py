"""Re-encrypting a store under its current keys, and erasing a tenant (``siglo rekey``,
``siglo erase``; docs/encryption.md).

:func:`rekey` re-saves every checkpoint that holds a payload not encrypted under its
namespace's current key — in clear, compressed only, or under an older key — or whose
metadata lacks the blind-index token of a field now in ``blind_index_fields``, with a
compare-and-set on the revision it read: a concurrent writer's save is never
overwritten (the rekey reads it again and re-encrypts that), and a writer holding the
old revision gets the ordinary conflict of a concurrent save. What is already under the
current key is skipped, so a rekey interrupted anywhere finishes by running it again.
The records outside checkpoints — stand-alone wait records, cached steps, context-change
stream values, idempotency results — are re-sealed where they are, each with a
compare-and-set on the bytes read. Whatever a rekey rewrites, of every kind, passes the
settings' ``redact_fields`` as the pipeline applies them to a new write: the checkpoints
through the pipeline itself, the other records by :func:`_redacted`.

:func:`erase` destroys a namespace's data keys first — from then on nothing of the
namespace decrypts anywhere, the store's own rows, replicas, backups and exports
included — and then deletes its checkpoints, stand-alone wait records and cached steps
(each of those only if it still holds what was listed: one changed meanwhile is listed
again and deleted on the next pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from siglo.adapter import Capability, StorageAdapter
from siglo.backend import Backend
from siglo.blind import INDEX_KEY, indexable
from siglo.checkpoint import Checkpoint
from siglo.codec import REF_KEY, is_reference
from siglo.errors import (
    CapabilityNotSupportedError,
    CheckpointConflictError,
    DecryptionError,
    DocumentTooLargeError,
    InvalidArgumentError,
    LockNotAcquiredError,
    ReservedFormError,
)
from siglo.keys import KEYRING_NAMESPACE, EnvelopeKeyProvider, KeyProvider
from siglo.listing import CheckpointSummary, get_listed
from siglo.locking import split_namespaced_key
from siglo.offload import OffloadAdapter, Offloader
from siglo.payloads import (
    CONTEXT_KIND,
    PAYLOAD_KINDS,
    PayloadKind,
    StoredPayload,
    context_field_key,
)
from siglo.pipeline import WAIT_RECORD_KEY, Codecs, PipelineAdapter, PipelineIdempotencyStore
from siglo.redaction import redact, redact_change
from siglo.sealing import SEALED_KEY, Location, Sealer, is_sealed, refuse_unresolved
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.unreadable import collecting_unreadable, stopping_at_unreadable
from siglo.validation import capped_seconds

__all__ = ["EraseReport", "PayloadCounts", "RefusedStack", "RekeyReport", "erase", "rekey"]

_PAGE: Final = 500
_ATTEMPTS: Final = 8
"""Compare-and-set attempts per stack before a rekey leaves it for the next run."""


@dataclass
class RekeyReport:
    """What a rekey did."""

    total: int = 0
    """Checkpoints looked at."""
    rekeyed: int = 0
    """Checkpoints re-encrypted under the current key."""
    current: int = 0
    """Checkpoints already under the current key (skipped)."""
    left: int = 0
    """Checkpoints that kept changing under the rekey: run it again to finish them."""
    running: int = 0
    """Checkpoints of runs executing a step (their workflow lock held): left as they are,
    since a re-save would refuse the run's next checkpoint (its step then run again);
    the run's own saves seal under its process's current key. Run the rekey again
    once those runs have finished or suspended."""
    refused: list[RefusedStack] = field(default_factory=list)
    """Checkpoints whose re-save was refused for what they hold (a document over the
    size limit once sealed, a value of a form siglo reserves): left as they are, under
    the key they were written with, while the rekey goes on with the others."""
    rotated: dict[str | None, str] | None = None
    """With ``rotate``: the new data key id of each namespace."""
    payloads: dict[str, PayloadCounts] = field(default_factory=dict)
    """Stand-alone wait records (``wait``), cached steps (``step``), context-change
    stream values (``context``) and idempotency results (``idempotency``): what was done
    to each stored copy (for the kinds the backend lists)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Kinds of record not rekeyed, and why (the backend cannot list them)."""


@dataclass(frozen=True)
class RefusedStack:
    """A checkpoint a rekey left as it was, and why (:attr:`RekeyReport.refused`)."""

    namespace: str | None
    stack_id: str
    reason: str


@dataclass
class PayloadCounts:
    """What a rekey did to the stored records of one kind outside checkpoints."""

    rekeyed: int = 0
    """Re-encrypted under the current key (a compare-and-set on the bytes read)."""
    current: int = 0
    """Already under the current key (skipped)."""
    left: int = 0
    """Changed between the read and the rewrite (a claim, a completion, a new value):
    not rewritten; run again to finish them."""
    unreadable: int = 0
    """Do not decrypt — their namespace was erased, or their key is no longer held —
    or are keyed by a digest that does not name their namespace: left as they are."""


@dataclass
class EraseReport:
    """What an erasure did."""

    namespace: str
    erased_keys: list[str]
    deleted: int
    """Checkpoints deleted."""
    payloads: dict[str, int] = field(default_factory=dict)
    """Stand-alone wait records (``wait``) and cached steps (``step``) of the namespace
    deleted, and context-change stream values (``context``, when there were any)
    emptied, for the kinds the backend lists."""
    left: dict[str, int] = field(default_factory=dict)
    """Records of each kind that kept changing under the erasure: run it again."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Kinds of record not deleted, and why (the backend cannot list them): they stay,
    undecryptable, until they expire."""


def _codecs(backend: Backend) -> tuple[PipelineAdapter, Codecs, KeyProvider]:
    adapter = backend.adapter
    if not isinstance(adapter, PipelineAdapter) or adapter.codecs.sealer.keys is None:
        raise InvalidArgumentError(
            "no encryption key is configured: set encryption_keys or master_key "
            "(docs/encryption.md) before rekeying or erasing"
        )
    sealer = adapter.codecs.sealer
    # A rekey reads rows in clear on purpose (to encrypt them), whatever
    # require_encryption says for the application's reads.
    lenient = Sealer(sealer.keys, compress_min_bytes=sealer.compress_min_bytes)
    assert sealer.keys is not None
    return adapter, Codecs(lenient, adapter.codecs.indexed), sealer.keys


async def _summaries(
    backend: Backend, namespace: str | Missing | None, *, stop: bool = True
) -> AsyncIterator[CheckpointSummary]:
    """Every stack of ``namespace`` but the keyrings. A stack the listing cannot read
    stops the walk, naming it (``stop``); else it is reported (:mod:`siglo.unreadable`)."""
    cursor = None
    while True:
        with stopping_at_unreadable() if stop else contextlib.nullcontext():
            page = await backend.raw_adapter.list_checkpoints(
                namespace=namespace, limit=_PAGE, cursor=cursor
            )
        for item in page.items:
            if item.namespace != KEYRING_NAMESPACE:
                yield item
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def _key_ids(checkpoint: Checkpoint) -> set[str | None]:
    """The key id of every payload of a stored checkpoint (``None``: not encrypted)."""
    found: set[str | None] = set()

    def note(value: Any) -> None:
        if value is None:
            return
        if is_sealed(value):
            parts = value[SEALED_KEY].split(".")
            found.add(parts[2] or None if len(parts) == 5 else None)
        else:
            found.add(None)

    for ctx in checkpoint.contexts.values():
        note(ctx)
    metadata = checkpoint.metadata or {}
    rest = {
        k: v for k, v in metadata.items() if k not in ("redactFields", WAIT_RECORD_KEY, INDEX_KEY)
    }
    if rest:
        note(rest if SEALED_KEY not in rest else {SEALED_KEY: rest[SEALED_KEY]})
    wait = metadata.get(WAIT_RECORD_KEY)
    if isinstance(wait, dict):
        note(wait.get("eventPayload"))
        note(wait.get("metadata"))
    return found


def _index_missing(stored: Checkpoint, opened: Checkpoint, indexed: frozenset[str]) -> bool:
    """Whether a field of ``indexed`` is in the metadata without its blind-index token (a
    checkpoint saved before the field was indexed)."""
    tokens = (stored.metadata or {}).get(INDEX_KEY)
    have = set(tokens) if isinstance(tokens, dict) else set()
    metadata = opened.metadata or {}
    return any(f in metadata and indexable(metadata[f]) and f not in have for f in indexed)


async def rekey(
    backend: Backend,
    *,
    namespace: str | Missing | None = MISSING,
    rotate: bool = False,
    progress: Callable[[RekeyReport], None] | None = None,
    report: RekeyReport | None = None,
) -> RekeyReport:
    """Re-encrypt every checkpoint, and every stand-alone wait record, cached step,
    context-change stream value and idempotency result the backend lists (of
    ``namespace``, if given), under its namespace's current key, redacting what it
    rewrites as the settings say; ``rotate`` first makes a new data key current for each
    namespace (envelope keys; with keys in the settings, make the new key current in the
    settings instead). ``progress(report)`` is called after every stack and every kind of
    record. ``report``: the report to fill (default: a new one), so that a caller sees
    what was done when the rekey stops on an error — a rotation made stays in effect
    (its :attr:`RekeyReport.rotated`), and a rekey without ``rotate`` finishes the work.
    See the module."""
    adapter, codecs, keys = _codecs(backend)
    report = RekeyReport() if report is None else report
    stacks = [s async for s in _summaries(backend, namespace)]
    report.total = len(stacks)
    if rotate:
        if not isinstance(keys, EnvelopeKeyProvider):
            raise InvalidArgumentError(
                "--rotate makes a new data key, which needs envelope keys (master_key); with "
                "encryption_keys, add the new key and set encryption_key_id to it instead"
            )
        names = {s.namespace for s in stacks}
        if not isinstance(namespace, Missing):
            names.add(namespace)
        report.rotated = {ns: await keys.rotate(ns) for ns in sorted(names, key=str)}
    for summary in stacks:
        try:
            await _rekey_one(adapter, codecs, keys, summary, report)
        except (DocumentTooLargeError, ReservedFormError) as exc:
            # This document's own: the others are rekeyed all the same (one stack over
            # the limit would otherwise stop every rekey at the same place, for ever).
            report.refused.append(RefusedStack(summary.namespace, summary.stack_id, str(exc)))
        if progress is not None:
            progress(report)
    # One rule for every record rewritten: the settings' redaction, as on any new write
    # (checkpoints get it from the pipeline their re-save goes through).
    redacting = adapter.pipeline.redact_fields
    for kind in (*PAYLOAD_KINDS, CONTEXT_KIND):
        await _rekey_payloads(
            backend, codecs.sealer, keys, kind, namespace, rotate, report, redacting
        )
        if progress is not None:
            progress(report)
    if backend.idempotency is not None and namespace in (MISSING, None):
        # Idempotency keys have no namespace: a rekey of one namespace leaves them.
        await _rekey_results(backend.idempotency, codecs.sealer, keys, rotate, report, redacting)
    return report


async def _rekey_results(
    store: Any,
    sealer: Sealer,
    keys: KeyProvider,
    rotate: bool,
    report: RekeyReport,
    redacting: frozenset[str],
) -> None:
    while isinstance(store, PipelineIdempotencyStore):
        store = store.inner  # the results as stored
    counts = report.payloads.setdefault("idempotency", PayloadCounts())
    try:
        async for item in store.scan_results():
            if rotate and None not in (report.rotated or {}):
                # Results are under the key of "no namespace": rotated with the first.
                assert isinstance(keys, EnvelopeKeyProvider)
                report.rotated = report.rotated or {}
                report.rotated[None] = await keys.rotate(None)
            await _rekey_item(
                store.swap_result, sealer, keys, item, None, item.key, counts, redacting
            )
    except CapabilityNotSupportedError as exc:
        del report.payloads["idempotency"]
        report.skipped["idempotency"] = str(exc)


_KIND_NAMES: Final = {
    "wait": "wait records",
    "step": "cached steps",
    "context": "context-change streams",
    "idempotency": "idempotency results",
}

# What a backend must offer to keep records of a kind at all: one without it has none
# to rekey or delete, and says nothing of them (not "cannot list").
_KEPT_WITH: Final = {
    "wait": Capability.WAIT_RECORDS,
    "step": Capability.STEP_CACHE,
    "context": Capability.CONTEXT_STREAM,
}


def _keeps(raw: StorageAdapter, kind: PayloadKind) -> bool:
    """Whether the backend keeps records of ``kind`` (which a rekey or an erase must
    then find, or say it could not)."""
    return raw.supports(_KEPT_WITH[kind])


def _place(item: StoredPayload) -> tuple[str | None, str] | None:
    """The namespace and record id an item's payloads are bound to (its associated
    data), or ``None`` when its stored key does not tell them."""
    if item.kind != "step":  # a wait record's or a context stream's: listed with both
        return item.namespace, item.key
    split = split_namespaced_key(item.key)
    return None if split is None else (split[1], split[0])


def _key_id(value: Any) -> str | None:
    if not is_sealed(value):
        return None
    parts = value[SEALED_KEY].split(".")
    return parts[2] or None if len(parts) == 5 else None


class _Blobs:
    """The offloading layer's blob store, for the cached steps a rekey rewrites: an
    offloaded output is stored as a reference to its sealed bytes in the blob store, so
    re-encrypting it reads the blob, seals its value under the current key and puts the
    result as a new blob (its digest is that of the new bytes) kept as long as the old
    one — the end of the cache entry's life, which the collector honours."""

    def __init__(self, offloader: Offloader) -> None:
        self.offloader = offloader
        self._keep: dict[str, int] | None = None

    async def read(self, reference: dict[str, Any], where: str) -> Any:
        """The stored (sealed) value ``reference`` stands for."""
        return await self.offloader.value_in(reference, where)

    async def offload(self, value: Any, reference: dict[str, Any]) -> Any:
        """``value`` as stored in place of ``reference``: a new reference when large."""
        if self._keep is None:  # once a rekey, and only if it meets an offloaded output
            self._keep = {d: k async for d, k in self.offloader.store.scan()}
        keep = self._keep.get(reference[REF_KEY])
        if keep is None:  # gone since it was read: kept as long as a new entry's blob
            keep = int(time.time() * 1000) + DEFAULTS.cache_ttl_ms
        return await self.offloader.value_out(value, keep)


def _blobs(backend: Backend) -> _Blobs | None:
    """The connection's blob store (``None`` without ``blob_url``)."""
    adapter = backend.adapter
    while isinstance(adapter, PipelineAdapter):
        if isinstance(adapter, OffloadAdapter):
            return _Blobs(adapter.offloader)
        adapter = adapter.inner
    return None


async def _rekey_payloads(
    backend: Backend,
    sealer: Sealer,
    keys: KeyProvider,
    kind: PayloadKind,
    namespace: str | Missing | None,
    rotate: bool,
    report: RekeyReport,
    redacting: frozenset[str],
) -> None:
    raw = backend.raw_adapter
    if not _keeps(raw, kind):
        return
    if not raw.supports(Capability.PAYLOAD_SCAN):
        report.skipped[kind] = f"the {raw.name} backend cannot list its {_KIND_NAMES[kind]}"
        return
    try:
        # Refused here, before any record, by a backend that lists wait records and
        # cached steps but not its context streams (payload_kinds).
        items = raw.scan_payloads(kind)
    except CapabilityNotSupportedError as exc:
        report.skipped[kind] = str(exc)
        return
    counts = report.payloads.setdefault(kind, PayloadCounts())
    blobs = _blobs(backend)
    try:
        async for item in items:
            place = _place(item)
            if place is None:
                counts.unreadable += 1
                continue
            ns, record_id = place
            if not isinstance(namespace, Missing) and ns != namespace:
                continue
            if rotate and ns not in (report.rotated or {}):
                # A namespace only this kind of record has (no checkpoint): rotated here.
                assert isinstance(keys, EnvelopeKeyProvider)
                report.rotated = report.rotated or {}
                report.rotated[ns] = await keys.rotate(ns)
            await _rekey_item(
                raw.swap_payload, sealer, keys, item, ns, record_id, counts, redacting, blobs
            )
    except CapabilityNotSupportedError as exc:
        report.skipped[kind] = str(exc)


async def _rekey_item(
    swap: Callable[[StoredPayload, dict[str, Any]], Awaitable[bool]],
    sealer: Sealer,
    keys: KeyProvider,
    item: StoredPayload,
    ns: str | None,
    record_id: str,
    counts: PayloadCounts,
    redacting: frozenset[str],
    blobs: _Blobs | None = None,
) -> None:
    active, _key = await keys.current_key(ns)
    stored = dict(item.fields)
    # An offloaded output (a cached step's) is re-encrypted where it is: in its blob.
    # Without the blob store the reference reaches the sealer, which refuses it.
    offloaded: dict[str, Any] = {}
    if blobs is not None:
        offloaded = {n: v for n, v in stored.items() if is_reference(v)}
        for name, reference in offloaded.items():
            where = Location(ns, record_id, item.kind, name).describe()
            stored[name] = await blobs.read(reference, where)
    if all(_key_id(v) == active for v in stored.values()):
        counts.current += 1
        return
    fields: dict[str, Any] = {}
    try:
        for name, value in stored.items():
            at = Location(ns, record_id, item.kind, name)
            opened = _redacted(item.kind, name, await sealer.open(value, at), redacting)
            fields[name] = await sealer.seal(opened, at)
    except DecryptionError:
        counts.unreadable += 1
        return
    if blobs is not None:
        for name, reference in offloaded.items():
            fields[name] = await blobs.offload(fields[name], reference)
    # Rewritten only if the record still holds the bytes read: a concurrent claim,
    # completion or set is never overwritten (it is counted, and a next run finishes).
    if await swap(item, fields):
        counts.rekeyed += 1
    else:
        counts.left += 1


def _redacted(kind: PayloadKind, name: str, value: Any, fields: frozenset[str]) -> Any:
    """A record's payload ``value`` (field ``name``) as the pipeline stores it on a new
    write (:class:`~siglo.pipeline.Pipeline`): ``fields`` redacted at any depth, and a
    context stream's value of a redacted key replaced whole, as a set of that key is
    (:meth:`~siglo.pipeline.Pipeline.event_out`). A rekey rewrites a record only when it
    re-encrypts it; without this the rewrite kept, sealed, the values the settings say
    never to store, which the checkpoints it re-saves beside it no longer hold."""
    if not fields:
        return value
    if kind == CONTEXT_KIND:
        # A stored stream value is a set's: a delete's value is none, not listed.
        return redact_change(context_field_key(name), "set", value, fields)
    return redact(value, fields)


async def _rekey_one(
    adapter: PipelineAdapter,
    codecs: Codecs,
    keys: KeyProvider,
    summary: CheckpointSummary,
    report: RekeyReport,
) -> None:
    """Rekey one stack under its workflow lock, where the backend has one: a run
    executing a step holds it and expects no other writer — re-saved at the next
    revision under it, the run's next checkpoint was refused, the run failed and its
    finished step ran again when a worker took it up (a black-box auditor). A run that
    holds the lock for longer than :data:`RUN_WAIT_MS` is left, counted in
    :attr:`RekeyReport.running`; while the rekey holds it, a run waits to start."""
    raw = adapter.inner
    if not raw.supports(Capability.WORKFLOW_LOCK):
        await _rekey_unlocked(adapter, codecs, keys, summary, report)
        return
    try:
        await raw.with_workflow_lock(
            summary.stack_id,
            lambda: _rekey_unlocked(adapter, codecs, keys, summary, report),
            timeout_ms=RUN_WAIT_MS,
            namespace=summary.namespace,
        )
    except LockNotAcquiredError:
        report.running += 1


RUN_WAIT_MS: Final = 250
"""How long a rekey waits for a stack's workflow lock before it leaves the stack to a
run executing it (:attr:`RekeyReport.running`)."""


async def _rekey_unlocked(
    adapter: PipelineAdapter,
    codecs: Codecs,
    keys: KeyProvider,
    summary: CheckpointSummary,
    report: RekeyReport,
) -> None:
    raw = adapter.inner
    for _ in range(_ATTEMPTS):
        stored = await get_listed(raw, summary)
        if stored is None:  # deleted or expired meanwhile: nothing left to protect
            report.current += 1
            return
        active, _key = await keys.current_key(stored.namespace)
        current = _key_ids(stored) <= {active}
        if current and not codecs.indexed:
            report.current += 1
            return
        opened = await codecs.checkpoint_in(stored)
        assert opened is not None
        # A reference left by a store's offloading, read by a connection without its
        # blob store: refused naming blob_url, as any read through the pipeline does.
        refuse_unresolved(opened)
        if current and not _index_missing(stored, opened, codecs.indexed):
            report.current += 1
            return
        # The same document at the next revision: the compare-and-set is what keeps a
        # concurrent writer's save; the timestamp stays the writer's.
        try:
            await adapter.save_checkpoint(
                opened.replace(revision=stored.revision + 1),
                expected_revision=stored.revision,
            )
        except CheckpointConflictError:
            continue
        report.rekeyed += 1
        return
    report.left += 1


async def erase(backend: Backend, namespace: str, *, settle_s: float | None = None) -> EraseReport:
    """Destroy ``namespace``'s data keys, then delete its checkpoints, stand-alone wait
    records and cached steps (see the module).
    Needs envelope keys (``master_key``): keys in the settings cannot be destroyed per
    namespace.

    Between the two it waits ``settle_s`` (default: the key cache's lifetime,
    :attr:`EnvelopeKeyProvider.refresh_s`, and a second): another process that read the
    namespace's key just before keeps sealing with it until its cache expires, and what
    it saved meanwhile — under a key that no longer exists, unreadable for good — is
    deleted with the rest instead of left behind as an acknowledged save nobody can
    read. ``0`` when no other process writes the namespace."""
    adapter, _, keys = _codecs(backend)
    if not isinstance(keys, EnvelopeKeyProvider):
        raise InvalidArgumentError(
            "erasing a namespace destroys its data key, which needs envelope keys "
            "(master_key); keys in encryption_keys are derived, not stored, and cannot be "
            "destroyed per namespace"
        )
    if namespace == KEYRING_NAMESPACE:
        raise InvalidArgumentError(f"{KEYRING_NAMESPACE!r} holds the keyrings, not data")
    if not await keys.has_keyring(namespace) and not await _holds_data(backend, namespace):
        # A mistyped namespace: reported as erased, it would hide that the real one was
        # not. Refused, writing nothing.
        raise InvalidArgumentError(
            f"namespace {namespace!r} has neither keys nor stacks, wait records or cached "
            "steps in this store: nothing to erase (check its name: `siglo ls` shows the "
            "namespaces of the stacks)"
        )
    erased = await keys.erase(namespace)
    await asyncio.sleep(keys.refresh_s + 1.0 if settle_s is None else capped_seconds(settle_s))
    deleted = 0
    with collecting_unreadable() as unreadable:
        stacks = [s async for s in _summaries(backend, namespace, stop=False)]
    # A stack the listing could not read (on Redis, whose listing reads each document)
    # is the namespace's too: deleted as stored, by the stack its error names.
    ids = [(s.stack_id, s.namespace) for s in stacks]
    for exc in unreadable:
        stack_id = getattr(exc, "stack_id", None)
        if stack_id is not None and getattr(exc, "namespace", None) == namespace:
            ids.append((stack_id, namespace))
    for stack_id, stack_namespace in ids:
        if await adapter.inner.delete_checkpoint(stack_id, stack_namespace):
            deleted += 1
    report = EraseReport(namespace=namespace, erased_keys=erased, deleted=deleted)
    for kind in PAYLOAD_KINDS:
        await _erase_payloads(backend, kind, namespace, report)
    await _erase_stream_values(backend, namespace, report)
    return report


async def _erase_stream_values(backend: Backend, namespace: str, report: EraseReport) -> None:
    """Empty the namespace's context-change stream values that no checkpoint took with
    it: a stack whose changes were streamed but that was never checkpointed (deleting a
    checkpoint deletes its streams, but a stream without one is found only by the
    listing), written in clear before encryption was on, or sealed under the keys just
    destroyed. Each value becomes ``null`` by the compare-and-set of a rekey
    (``payload.context``), so a value set meanwhile is listed again by the next pass;
    the key names stay until the stream expires or its stack is deleted."""
    raw = backend.raw_adapter
    if not _keeps(raw, CONTEXT_KIND):
        return
    if not raw.supports(Capability.PAYLOAD_SCAN) or CONTEXT_KIND not in raw.payload_kinds:
        report.skipped[CONTEXT_KIND] = (
            f"the {raw.name} backend cannot list its {_KIND_NAMES[CONTEXT_KIND]}"
        )
        return
    emptied = 0
    changed = 0
    for _ in range(_ATTEMPTS):
        changed = 0
        async for item in raw.scan_payloads(CONTEXT_KIND):
            if item.namespace != namespace:
                continue
            if await raw.swap_payload(item, dict.fromkeys(item.fields)):
                emptied += 1
            else:
                changed += 1
        if not changed:
            break
    # Counted only when there were any: most erasures meet none (a checkpoint takes its
    # streams with it), and say so by not naming them.
    if emptied:
        report.payloads[CONTEXT_KIND] = emptied
    if changed:
        report.left[CONTEXT_KIND] = changed


async def _holds_data(backend: Backend, namespace: str) -> bool:
    """Whether ``namespace`` holds a checkpoint (one the listing could not read too), or
    a stand-alone wait record or cached step the backend lists (stored before
    encryption, with no keyring)."""
    with collecting_unreadable() as unreadable:
        page = await backend.raw_adapter.list_checkpoints(namespace=namespace, limit=1)
    if page.items or unreadable:
        return True
    raw = backend.raw_adapter
    if not raw.supports(Capability.PAYLOAD_SCAN):
        return False
    kinds = [*PAYLOAD_KINDS, *((CONTEXT_KIND,) if CONTEXT_KIND in raw.payload_kinds else ())]
    for kind in kinds:
        async for item in raw.scan_payloads(kind):
            place = _place(item)
            if place is not None and place[0] == namespace:
                return True
    return False


async def _erase_payloads(
    backend: Backend, kind: PayloadKind, namespace: str, report: EraseReport
) -> None:
    """Delete the namespace's records of ``kind`` outside checkpoints (its keys are
    already destroyed: what is left would only be undecryptable until it expires)."""
    raw = backend.raw_adapter
    if not _keeps(raw, kind):
        return
    if not raw.supports(Capability.PAYLOAD_SCAN):
        report.skipped[kind] = f"the {raw.name} backend cannot list its {_KIND_NAMES[kind]}"
        return
    # A wait record counted once though Redis lists its stack copy too.
    deleted: set[tuple[str | None, str]] = set()
    changed: set[tuple[str | None, str]] = set()
    gone: set[tuple[str | None, str]] = set()
    try:
        for _ in range(_ATTEMPTS):
            changed, gone = set(), set()
            async for item in raw.scan_payloads(kind):
                place = _place(item)
                # A step keyed by the digest of a pair too long to join does not name
                # its namespace: it is left, undecryptable, to expire.
                if place is None or place[0] != namespace:
                    continue
                # A compare-and-delete on what was listed: a record claimed, completed
                # or set meanwhile is listed again by the next pass.
                if await raw.delete_payload(item):
                    gone.add(place)
                else:
                    changed.add(place)
            deleted |= gone
            # A Redis stack copy deleted with its record fails its own delete: not changed.
            changed -= gone
            if not changed:
                break
    except CapabilityNotSupportedError as exc:
        report.skipped[kind] = str(exc)
        return
    report.payloads[kind] = len(deleted)
    report.left[kind] = len(changed)
