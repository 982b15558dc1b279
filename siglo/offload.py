"""Offloaded values (SPEC §13): a value too large for a checkpoint goes to a blob store.

With the settings' ``offload_min_bytes`` and ``blob_url`` set, :func:`siglo.connect` puts
an :class:`OffloadAdapter` between the pipeline and the backend: the order a payload
passes is *redact → (encode) → offload → store*, so a blob holds what the pipeline made of
the value. Each top-level value of a checkpoint's contexts, and each cached step output,
whose compact JSON is at least ``offload_min_bytes`` long is put in the blob store under
its SHA-256 and replaced in what is stored by a reference, ``{"$siglo.blob": "<sha256>",
"bytes": <length>}``; every read resolves references back to the values. What a reader
gets is what was saved.

Blobs are collected, not deleted with their checkpoint: :func:`collect_blobs` removes
every blob that no live checkpoint references and whose keep-until (its last put, or for
a cached step output the end of the cache entry's life) is more than the grace period
old. Deleting, pruning and expiring checkpoints therefore leave no blob behind once the
collector has run (``siglo collect-blobs``), and a blob a save is about to reference is
never taken (its put refreshed it). ``siglo export`` reads through the adapter and so
writes values inline; ``siglo import`` offloads them again on the target.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import orjson

from siglo.adapter import CacheEntry, StorageAdapter
from siglo.blobs import BlobStore, blob_digest
from siglo.checkpoint import Checkpoint
from siglo.codec import REF_KEY, is_reference
from siglo.config import DEFAULT_BLOB_GRACE_MS, Settings
from siglo.errors import (
    DamagedBlobError,
    DanglingReferenceError,
    InvalidArgumentError,
    StorageAdapterError,
)
from siglo.listing import get_listed
from siglo.pipeline import Pipeline, PipelineAdapter
from siglo.records import ContextChangeEvent
from siglo.sealing import Location, Sealer
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.sizing import check_document_size
from siglo.unreadable import stopping_at_unreadable

__all__ = [
    "DEFAULT_GRACE_MS",
    "REF_KEY",
    "Collected",
    "OffloadAdapter",
    "Offloader",
    "collect_blobs",
    "offload_adapter",
    "references",
    "resolving",
]


DEFAULT_GRACE_MS: Final = DEFAULT_BLOB_GRACE_MS
"""How long past its keep-until an unreferenced blob is kept by :func:`collect_blobs`
(1 h, the default of the settings' ``blob_grace_ms``): longer than any save takes between
putting a blob and storing its reference."""

_RETRY_S: Final = 0.05
_REREADS: Final = 10
"""Reads of a checkpoint whose blobs went missing before giving up: each means a save
replaced it, and a collector removed the blobs it no longer names, between the read of
the checkpoint and that of its blobs."""


_is_ref = is_reference


def references(checkpoint: Checkpoint) -> Iterator[str]:
    """The digests of the blobs a stored checkpoint references."""
    for context in checkpoint.contexts.values():
        for value in context.values():
            if _is_ref(value):
                yield value[REF_KEY]


class Offloader:
    """Puts large values in ``store`` and resolves references from it."""

    def __init__(self, store: BlobStore, min_bytes: int) -> None:
        if type(min_bytes) is not int or min_bytes <= 0:
            raise InvalidArgumentError(
                f"offload_min_bytes must be a positive integer of bytes, got {min_bytes!r}"
            )
        self.store = store
        self.min_bytes = min_bytes

    def _planned(self, value: Any) -> tuple[Any, bytes | None]:
        """``value`` as stored (its reference when large), and the blob's bytes to put
        (``None``: the value stays inline)."""
        if value is None or isinstance(value, (bool, int, float)):
            return value, None  # never large
        data = orjson.dumps(value)
        if len(data) < self.min_bytes:
            return value, None
        return {REF_KEY: blob_digest(data), "bytes": len(data)}, data

    async def _ref(self, value: Any, keep_until_ms: int | None = None) -> Any:
        stored, data = self._planned(value)
        if data is not None:
            await self.store.put(stored[REF_KEY], data, keep_until_ms=keep_until_ms)
        return stored

    def _plan(self, checkpoint: Checkpoint) -> tuple[Checkpoint, list[tuple[str, bytes]]]:
        """``checkpoint`` as stored (its large values replaced by references), and the
        blobs to put for it as ``(digest, bytes)``."""
        contexts: dict[str, dict[str, Any]] = {}
        blobs: list[tuple[str, bytes]] = []
        for step, context in checkpoint.contexts.items():
            out = {}
            for key, value in context.items():
                stored, data = self._planned(value)
                out[key] = stored
                if data is not None:
                    blobs.append((stored[REF_KEY], data))
            contexts[step] = out
        return (checkpoint.replace(contexts=contexts) if blobs else checkpoint), blobs

    def planned_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` as :meth:`checkpoint_out` would store it, without putting
        anything in the blob store."""
        return self._plan(checkpoint)[0]

    async def _resolve(self, value: Any, where: str) -> Any:
        if not _is_ref(value):
            return value
        digest = value[REF_KEY]
        data = await self.store.get(digest)
        if data is None:
            # A collector moving the blob aside while a save refreshed it puts it back
            # within microseconds: one look again before calling the reference dangling.
            await asyncio.sleep(_RETRY_S)
            data = await self.store.get(digest)
        if data is None:
            raise DanglingReferenceError(
                f"{where} references blob {digest} ({value['bytes']} bytes), which the "
                f"blob store {self.store.url} does not have: was the store changed, or a "
                "collector run without the checkpoints of this backend?"
            )
        # Named by the digest of its bytes: bytes that do not match it were altered,
        # truncated or replaced in the store, and are never read as the value.
        if blob_digest(data) != digest:
            raise DamagedBlobError(
                f"{where} references blob {digest} ({value['bytes']} bytes), whose bytes in "
                f"the blob store {self.store.url} ({len(data)} bytes) do not match that "
                "digest: the blob was altered, truncated or replaced; restore it from a "
                "backup of the blob store"
            )
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise DamagedBlobError(
                f"{where} references blob {digest}, whose bytes are not the JSON siglo "
                f"writes: {exc}"
            ) from None

    async def checkpoint_out(self, checkpoint: Checkpoint, limit: int | None = None) -> Checkpoint:
        """``checkpoint`` with its large context values replaced by references, their
        blobs put. The size guard (``limit``, :mod:`siglo.sizing`) measures the document
        with its references before any blob is put: a save it refuses stores nothing."""
        stored, blobs = self._plan(checkpoint)
        check_document_size(stored, limit)
        for digest, data in blobs:
            await self.store.put(digest, data)
        return stored

    async def checkpoint_in(self, checkpoint: Checkpoint | None) -> Checkpoint | None:
        """A stored checkpoint with its references resolved."""
        if checkpoint is None or not any(True for _ in references(checkpoint)):
            return checkpoint
        contexts = {
            step: {
                key: await self._resolve(value, f"stack {checkpoint.stack_id!r}, {step}.{key}")
                for key, value in context.items()
            }
            for step, context in checkpoint.contexts.items()
        }
        return checkpoint.replace(contexts=contexts)

    async def value_out(self, value: Any, keep_until_ms: int) -> Any:
        """A step output as stored (a reference when large)."""
        return await self._ref(value, keep_until_ms)

    async def value_in(self, value: Any, where: str) -> Any:
        """A stored step output, resolved."""
        return await self._resolve(value, where)


class _AsStored(Sealer):
    """The offloading layer's codecs: it sits below the pipeline, so the payloads it
    passes (a wait's event payload, a context change) are already sealed on the way
    down and are opened by the pipeline above on the way up — it neither seals nor
    opens (with no keys of its own it could only fail on a sealed value)."""

    __slots__ = ()

    async def open(self, value: Any, where: Location, *, reuse: bool = False) -> Any:
        return value


class OffloadAdapter(PipelineAdapter):
    """A backend's adapter behind an :class:`Offloader` (see the module). Build one with
    :func:`offload_adapter`; everything it does not offload passes through."""

    replaced_by_pipeline: ClassVar[bool] = False
    refuses_reserved: ClassVar[bool] = False  # below the pipeline: given its sealed forms

    def __init__(self, inner: StorageAdapter, offloader: Offloader) -> None:
        super().__init__(inner, Pipeline(Settings()), _AsStored(None))
        self.offloader = offloader
        self._store_closed = False

    async def aclose(self) -> None:
        """Close the backend's adapter, then the blob store (its connections), once."""
        try:
            await self.inner.aclose()
        finally:
            if not self._store_closed:
                self._store_closed = True
                await self.offloader.store.aclose()

    async def _stored(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` as the backend's adapter gets it, its blobs put — after the
        size guard, so that a document the backend refuses leaves no blob behind."""
        if isinstance(self.inner, PipelineAdapter):  # a layer below measures its own form
            form, limit = await self.inner.stored_form(
                self.offloader.planned_checkpoint(checkpoint)
            )
            check_document_size(form, limit)
            return await self.offloader.checkpoint_out(checkpoint)
        return await self.offloader.checkpoint_out(checkpoint, self.inner.max_document_bytes)

    async def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        stored = await self._stored(checkpoint)
        await self.inner.save_checkpoint(stored, expected_revision=expected_revision)

    async def stored_form(self, checkpoint: Checkpoint) -> tuple[Checkpoint, int | None]:
        out = self.offloader.planned_checkpoint(checkpoint)
        if isinstance(self.inner, PipelineAdapter):
            return await self.inner.stored_form(out)
        return out, self.inner.max_document_bytes

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        stored = await self._stored(checkpoint)
        await self.inner.save_checkpoint_streamed(
            stored, changes, expected_revision=expected_revision
        )

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        stored = await self._stored(checkpoint)
        await self.inner.save_checkpoint_unlocking(
            stored, changes, expected_revision=expected_revision
        )

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        stored = await self._stored(checkpoint)
        value = await self.offloader.value_out(entry.value, self._keep_entry_until(entry.ttl_ms))
        await self.inner.save_checkpoint_caching(
            stored,
            changes,
            dataclasses.replace(entry, value=value),
            expected_revision=expected_revision,
            unlock=unlock,
        )

    async def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        found = await self.inner.get_checkpoint(stack_id, namespace, fallback=fallback)
        for _ in range(_REREADS):
            try:
                return await self.offloader.checkpoint_in(found)
            except DamagedBlobError:
                raise
            except DanglingReferenceError:
                # Read before a save replaced it, and its blobs collected since: the
                # collector walks the revisions stored now, and a blob put long ago is
                # past its grace (a black-box auditor: a load racing a save and
                # `siglo collect-blobs` raised this for a healthy run). Dangling only if
                # the checkpoint stored is still the one read.
                again = await self.inner.get_checkpoint(stack_id, namespace, fallback=fallback)
                if again is None:
                    return None  # removed meanwhile
                assert found is not None  # resolving None raises nothing
                if again.to_json() == found.to_json():
                    raise
                found = again
        raise StorageAdapterError(
            f"the checkpoint of {stack_id!r} changed under {_REREADS} reads of its blobs; try again"
        )

    async def get_cached_step(self, key: str, *, namespace: str | None = None) -> Any | Missing:
        kw: dict[str, Any] = {} if namespace is None else {"namespace": namespace}
        found = await self.inner.get_cached_step(key, **kw)
        if found is MISSING:
            return found
        return await self.offloader.value_in(found, f"cached step {key!r}")

    async def set_cached_step(
        self, key: str, value: Any, ttl_ms: int | None = None, *, namespace: str | None = None
    ) -> None:
        stored = await self.offloader.value_out(value, self._keep_entry_until(ttl_ms))
        kw: dict[str, Any] = {} if namespace is None else {"namespace": namespace}
        await self.inner.set_cached_step(key, stored, ttl_ms, **kw)

    def _keep_entry_until(self, ttl_ms: int | None) -> int:
        """Until when the blob of a cache entry kept ``ttl_ms`` is kept (ms)."""
        ttl = ttl_ms if ttl_ms is not None else getattr(self.inner, "cache_ttl_ms", None)
        return int(time.time() * 1000) + (ttl if ttl is not None else DEFAULTS.cache_ttl_ms)


def resolving(adapter: StorageAdapter) -> StorageAdapter:
    """What ``adapter`` stores, with offloaded values read back: the pipeline's adapters
    in front are looked through down to the :class:`OffloadAdapter` (or, with nothing
    offloaded, the backend's own adapter). ``siglo export`` writes from it, so a dump
    carries values, never references to a blob store the target may not share."""
    while isinstance(adapter, PipelineAdapter) and not isinstance(adapter, OffloadAdapter):
        adapter = adapter.inner
    return adapter


_CLASSES: dict[type[StorageAdapter], type[OffloadAdapter]] = {}


def offload_adapter(adapter: StorageAdapter, offloader: Offloader) -> StorageAdapter:
    """``adapter`` behind ``offloader`` (its class carries the backend's declarations)."""
    inner = type(adapter)
    cls = _CLASSES.get(inner)
    if cls is None:
        cls = _CLASSES[inner] = type(
            f"Offload{inner.__name__}",
            (OffloadAdapter,),
            {
                "inner_class": inner,
                "name": inner.name,
                "capabilities": inner.capabilities,
                "durable": inner.durable,
                "__module__": __name__,
            },
        )
    return cls(adapter, offloader)


@dataclass(frozen=True)
class Collected:
    """What :func:`collect_blobs` found: the blobs referenced by live checkpoints, those
    it removed, and those it kept unreferenced (within their grace period)."""

    referenced: int
    removed: int
    kept: int


async def _stored_checkpoints(adapter: StorageAdapter) -> Iterable[Checkpoint]:
    found: list[Checkpoint] = []
    cursor: str | None = None
    while True:
        # Every stack, or none: the blobs of one left out would be taken for orphans.
        with stopping_at_unreadable():
            page = await adapter.list_checkpoints(cursor=cursor, limit=500)
        for summary in page.items:
            cp = await get_listed(adapter, summary)
            if cp is not None:
                found.append(cp)
        cursor = page.next_cursor
        if cursor is None:
            return found


async def collect_blobs(
    adapter: StorageAdapter,
    store: BlobStore,
    *,
    grace_ms: int = DEFAULT_GRACE_MS,
    now_ms: int | None = None,
) -> Collected:
    """Remove every blob of ``store`` that no live checkpoint of ``adapter`` references
    and whose keep-until is more than ``grace_ms`` before ``now_ms`` (the wall clock).

    ``adapter`` is the backend's own adapter (what is stored: references, not values);
    an :class:`OffloadAdapter` is looked through. It must list checkpoints (capability
    ``listing``): every namespace is walked. Run it from one place at a time or several:
    a blob is removed only while still stale (:meth:`BlobStore.delete_stale`).
    """
    while isinstance(adapter, PipelineAdapter):
        adapter = adapter.inner
    if grace_ms < 0:
        raise InvalidArgumentError(f"grace_ms must be >= 0, got {grace_ms!r}")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    referenced: set[str] = set()
    # Scan the blobs first, then the checkpoints: a blob put after the scan is not
    # considered, and one put before it and referenced by a checkpoint saved after the
    # walk was refreshed by its put, so it is within the grace period.
    blobs = [(digest, keep) async for digest, keep in store.scan()]
    for cp in await _stored_checkpoints(adapter):
        referenced.update(references(cp))
    removed = kept = 0
    for digest, keep in blobs:
        if digest in referenced:
            continue
        if keep + grace_ms < now and await store.delete_stale(digest, now - grace_ms):
            removed += 1
        else:
            kept += 1
    return Collected(len(referenced), removed, kept)
