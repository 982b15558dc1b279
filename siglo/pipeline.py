"""The one pipeline between siglo and a backend: what every payload goes through.

Every payload siglo stores — a checkpoint's contexts and metadata, a context-change
value, a wait record's payloads, a cached step output, an idempotency result — passes
:class:`Pipeline` on its way to the backend, and every payload read back passes it on the
way in. The pipeline is built from the one configuration (:class:`siglo.config.Settings`):
it redacts the settings' ``redact_fields`` at any depth, then the codec chain
(:mod:`siglo.sealing`) compresses and encrypts each payload when the settings ask for it,
and decodes (and, under ``require_encryption``, checks) each payload read back.

:func:`siglo.connect` puts it in front of the backend it returns
(:class:`PipelineAdapter`, :class:`PipelineIdempotencyStore`), so every path that goes
through that backend — a manager, a flow, the worker, import, any ``siglo`` command, the
application's own adapter calls — stores what the pipeline made of its payloads, and no
path can forget a stage. A backend (built-in or a third party's) sees only what the
pipeline passed on and needs to know nothing about it. Where the pipeline has nothing to
do, :func:`siglo.connect` returns the backend as it is: no layer, no cost.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from inspect import iscoroutinefunction
from typing import Any, ClassVar, Final, TypeVar

from siglo import telemetry
from siglo.adapter import CacheEntry, StorageAdapter
from siglo.blind import INDEX_KEY, check_filter, indexable, list_matching, token
from siglo.checkpoint import Checkpoint
from siglo.closing import Closable
from siglo.codec import (
    NO_BLOB_STORE,
    REF_KEY,
    is_reference,
    refuse_reserved_forms,
    refuse_reserved_metadata,
    refuse_reserved_value,
    refuse_unopened_value,
)
from siglo.config import Settings
from siglo.coordination import (
    ClaimState,
    IdempotencyClaim,
    IdempotencyStore,
    IdempotencyStoreBase,
    Lock,
    LockBase,
    NonceStore,
    NonceStoreBase,
)
from siglo.errors import InvalidArgumentError, KeyErasedError, naming_wait
from siglo.keys import (
    KEYRING_NAMESPACE,
    EnvelopeKeyProvider,
    KeyProvider,
    SettingsKeyProvider,
    decode_key,
    master_key_from,
)
from siglo.listing import DEFAULT_PAGE_SIZE, CheckpointPage
from siglo.payloads import PayloadKind, StoredPayload, context_field
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord
from siglo.redaction import (
    REDACT_FIELDS_KEY,
    named_redactions,
    redact,
    redact_change,
    redacting,
)
from siglo.sealing import SEALED_KEY, Location, Sealer, refuse_unresolved, require_packages
from siglo.sentinel import MISSING, Missing
from siglo.telemetry import Telemetry
from siglo.unreadable import UNREADABLE, report_unreadable

__all__ = [
    "REDACT_FIELDS_KEY",
    "Pipeline",
    "PipelineAdapter",
    "PipelineIdempotencyStore",
    "TracedPipelineAdapter",
    "TracedPipelineIdempotencyStore",
    "observe_coordination",
    "pipeline_adapter",
    "pipeline_parts",
    "redact_wait",
    "redacted_parts",
    "sealer_for",
    "shown_run",
    "traced_own",
]

WAIT_RECORD_KEY: Final = "waitRecord"
"""The metadata key of a waiting run's embedded wait record: kept as a record (its
payloads sealed like a wait record's), since backends read it."""

CLEAR_METADATA_KEYS: Final = frozenset({REDACT_FIELDS_KEY})
"""Metadata keys that stay in clear beside the sealed rest: the names (not values) of
the redacted fields, which every process restoring the stack must read."""

T = TypeVar("T")


class Pipeline:
    """The stages a payload passes between siglo and a backend, built from settings."""

    __slots__ = ("redact_fields", "settings", "telemetry")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redact_fields = settings.redact_fields
        # Decided once, here: without an OpenTelemetry SDK there is no tracing stage at
        # all, so the calls cost what they cost without siglo[otel] (docs/observability.md).
        self.telemetry = telemetry.current()

    @property
    def seals(self) -> bool:
        """Whether the codec chain has anything to do (encrypt, compress or check)."""
        s = self.settings
        return s.encrypts or s.compression_min_bytes is not None or s.require_encryption

    @property
    def is_identity(self) -> bool:
        """Whether every stage passes payloads through unchanged and nothing is traced
        (nothing to wrap)."""
        return not self.redact_fields and not self.seals and self.telemetry is None

    # -- toward the backend ----------------------------------------------------------------

    def value_out(self, value: Any) -> Any:
        """A payload value as it may leave the process."""
        return redact(value, self.redact_fields) if self.redact_fields else value

    def checkpoint_out(self, checkpoint: Checkpoint) -> Checkpoint:
        """A checkpoint as it may be stored: contexts and metadata redacted, and the
        redacted keys named in its metadata (see :data:`REDACT_FIELDS_KEY`). The keys a
        checkpoint names there are redacted too, whatever the settings say (a dump
        imported by a process without the application's settings, written around the
        manager: its own list travels with it, as a restored stack's does)."""
        fields = self.redact_fields
        named = named_redactions(checkpoint.metadata)
        if not named <= fields:
            fields = fields | named
        if not fields:
            return checkpoint
        contexts, redacted, extra = redacted_parts(checkpoint, fields)
        metadata = dict(redacted or {})
        listed = set(metadata.get(REDACT_FIELDS_KEY) or ()) | fields
        metadata[REDACT_FIELDS_KEY] = sorted(listed)
        if (
            contexts == checkpoint.contexts
            and metadata == (checkpoint.metadata or {})
            and extra == checkpoint.extra
        ):
            return checkpoint
        return checkpoint.replace(contexts=contexts, metadata=metadata, extra=extra)

    def event_out(self, event: ContextChangeEvent) -> ContextChangeEvent:
        """A context change as it may be stored (a set of a redacted key sends
        ``"[REDACTED]"``)."""
        fields = self.redact_fields
        if not fields:
            return event
        value = redact_change(event.key, event.op, event.value, fields)
        return event if value == event.value else dataclasses.replace(event, value=value)

    def wait_out(self, record: WaitRecord) -> WaitRecord:
        """A wait record as it may be stored: its event payload and metadata redacted."""
        return redact_wait(record, self.redact_fields)


def redacted_parts(
    checkpoint: Checkpoint, fields: frozenset[str]
) -> tuple[dict[str, Any], Any, Mapping[str, Any]]:
    """``checkpoint``'s contexts, metadata and fields siglo does not know (a TypeScript
    worker's), each with ``fields`` redacted at any depth."""
    contexts = {step: redact(ctx, fields) for step, ctx in checkpoint.contexts.items()}
    metadata = None if checkpoint.metadata is None else redact(checkpoint.metadata, fields)
    extra = redact(checkpoint.extra, fields) if checkpoint.extra else checkpoint.extra
    return contexts, metadata, extra


def shown_run(
    checkpoint: Checkpoint, waits: Iterable[WaitRecord], settings_fields: Iterable[str]
) -> tuple[Checkpoint, list[WaitRecord], frozenset[str]]:
    """A stored run as every path that prints or sends it out gives it — ``siglo show``,
    ``siglo export``, the dashboard: the keys the settings redact (``settings_fields``)
    and those the checkpoint says it was saved without hidden at any depth in its
    contexts, metadata and fields siglo does not know, and in its wait records' payloads
    and metadata, so that a value stored before its key was redacted is not printed
    either (:func:`siglo.redaction.redacting`). Returns the run, its waits and the keys
    hidden (for the run's other records: its context stream)."""
    fields = redacting(checkpoint, settings_fields)
    waits = list(waits)
    if not fields:
        return checkpoint, waits, fields
    contexts, metadata, extra = redacted_parts(checkpoint, fields)
    if (contexts, metadata, extra) != (checkpoint.contexts, checkpoint.metadata, checkpoint.extra):
        checkpoint = checkpoint.replace(contexts=contexts, metadata=metadata, extra=extra)
    return checkpoint, [redact_wait(w, fields) for w in waits], fields


def redact_wait(record: WaitRecord, fields: frozenset[str]) -> WaitRecord:
    """``record`` with ``fields`` redacted out of its event payload and metadata (the
    record itself when nothing changes)."""
    if not fields:
        return record
    payload = redact(record.event_payload, fields)
    metadata = None if record.metadata is None else redact(record.metadata, fields)
    if payload == record.event_payload and metadata == record.metadata:
        return record
    return record.replace(event_payload=payload, metadata=metadata)


def sealer_for(settings: Settings, raw: StorageAdapter) -> Sealer:
    """The codec chain ``settings`` ask for, over the backend adapter ``raw`` (where the
    envelope key provider keeps its keyrings)."""
    keys: KeyProvider | None = None
    if settings.encryption_keys:
        keys = SettingsKeyProvider(
            {k: decode_key(v, k) for k, v in settings.encryption_keys.items()},
            settings.encryption_key_id,
        )
    elif settings.master_key is not None:
        retention = getattr(raw, "checkpoint_ttl_ms", None)
        if retention is not None:
            # The keyrings are checkpoints: one that expired would take every key of
            # its namespace with it, backups and exports included.
            raise InvalidArgumentError(
                f"envelope keys (master_key) keep each namespace's keys as a checkpoint, and "
                f"this {raw.name} backend expires checkpoints after checkpoint_ttl_ms="
                f"{retention}: connect it with checkpoint_ttl_ms=none (checkpoints with an "
                "expires_at still expire), or use encryption_keys"
            )
        keys = EnvelopeKeyProvider(raw, master_key_from(settings.master_key))
    require_packages(
        encrypts=keys is not None, compresses=settings.compression_min_bytes is not None
    )
    return Sealer(
        keys,
        compress_min_bytes=settings.compression_min_bytes,
        require_encryption=settings.require_encryption,
    )


class Codecs:
    """The codec chain applied to each kind of record (see :mod:`siglo.sealing` for the
    locations the associated data binds), and the blind index of the metadata fields
    named in ``indexed`` (:mod:`siglo.blind`)."""

    __slots__ = ("indexed", "sealer")

    def __init__(self, sealer: Sealer, indexed: frozenset[str] = frozenset()) -> None:
        self.sealer = sealer
        self.indexed = indexed

    async def index_key(self, namespace: str | None) -> bytes:
        """The blind-index key of ``namespace`` (the key provider's)."""
        keys = self.sealer.keys
        assert keys is not None
        return await keys.index_key(namespace)

    # -- toward the backend ----------------------------------------------------------------

    async def checkpoint_out(self, checkpoint: Checkpoint) -> Checkpoint:
        sealer = self.sealer
        if not sealer.encrypts and sealer.compress_min_bytes is None:
            return checkpoint
        ns, sid = checkpoint.namespace, checkpoint.stack_id
        contexts = {}
        for step, ctx in checkpoint.contexts.items():
            where = Location(ns, sid, "checkpoint", f"contexts.{step}")
            # A context is stored again at every save: unchanged, it keeps its ciphertext,
            # so the incremental saves and offloading see it unchanged (siglo.sealing).
            contexts[step] = await sealer.seal_dict(ctx, where, reuse=True)
        metadata = await self.metadata_out(checkpoint.metadata, ns, sid)
        return checkpoint.replace(contexts=contexts, metadata=metadata)

    async def metadata_out(
        self, metadata: Any, namespace: str | None, stack_id: str
    ) -> dict[str, Any] | None:
        if metadata is None:
            return None
        clear = {k: v for k, v in metadata.items() if k in CLEAR_METADATA_KEYS}
        rest = {
            k: v
            for k, v in metadata.items()
            if k not in CLEAR_METADATA_KEYS and k != WAIT_RECORD_KEY and k != INDEX_KEY
        }
        out: dict[str, Any] = dict(clear)
        if rest:
            sealed = await self.sealer.seal(
                rest, Location(namespace, stack_id, "checkpoint", "metadata")
            )
            out.update(sealed)
        fields = [f for f in self.indexed if f in rest and indexable(rest[f])]
        if fields and self.sealer.keys is not None:
            key = await self.index_key(namespace)
            out[INDEX_KEY] = {f: token(key, f, rest[f]) for f in sorted(fields)}
        wait = metadata.get(WAIT_RECORD_KEY)
        if isinstance(wait, dict):
            out[WAIT_RECORD_KEY] = await self.wait_wire_out(wait, namespace)
        elif wait is not None:
            out[WAIT_RECORD_KEY] = wait
        return out

    async def wait_wire_out(self, wire: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        ns = wire.get("namespace", namespace)
        key = str(wire.get("correlationKey"))
        out = dict(wire)
        for name in ("eventPayload", "metadata"):
            if out.get(name) is not None:
                out[name] = await self.sealer.seal(out[name], Location(ns, key, "wait", name))
        return out

    async def wait_out(self, record: WaitRecord) -> WaitRecord:
        if not self.sealer.encrypts and self.sealer.compress_min_bytes is None:
            return record
        ns, key = record.namespace, record.correlation_key
        return record.replace(
            event_payload=await self.sealer.seal(
                record.event_payload, Location(ns, key, "wait", "eventPayload")
            ),
            metadata=await self.sealer.seal_dict(
                record.metadata, Location(ns, key, "wait", "metadata")
            ),
        )

    async def event_out(self, event: ContextChangeEvent) -> ContextChangeEvent:
        value = await self.sealer.seal(event.value, _context_location(event))
        return event if value is event.value else dataclasses.replace(event, value=value)

    # -- from the backend ----------------------------------------------------------------

    async def checkpoint_in(self, checkpoint: Checkpoint | None) -> Checkpoint | None:
        if checkpoint is None:
            return None
        sealer = self.sealer
        ns, sid = checkpoint.namespace, checkpoint.stack_id
        contexts: dict[str, Any] = {}
        changed = False
        for step, ctx in checkpoint.contexts.items():
            where = Location(ns, sid, "checkpoint", f"contexts.{step}")
            if type(ctx) is dict and len(ctx) == 1 and is_reference(ctx.get(SEALED_KEY)):
                raise InvalidArgumentError(
                    f"{where.describe()} is sealed and offloaded to blob "
                    f"{ctx[SEALED_KEY][REF_KEY]}, and this connection has no blob store to "
                    f"read it from: {NO_BLOB_STORE}"
                )
            opened = await sealer.open(ctx, where, reuse=True)
            changed = changed or opened is not ctx
            contexts[step] = opened
        metadata = await self.metadata_in(checkpoint.metadata, ns, sid)
        if not changed and metadata is checkpoint.metadata:
            return checkpoint
        return checkpoint.replace(contexts=contexts, metadata=metadata)

    async def metadata_in(self, metadata: Any, namespace: str | None, stack_id: str) -> Any:
        if metadata is None:
            return None
        sealed = metadata.get(SEALED_KEY)
        wait = metadata.get(WAIT_RECORD_KEY)
        if not isinstance(sealed, str) and wait is None and not self.sealer.require_encryption:
            return metadata
        out: dict[str, Any] = {}
        where = Location(namespace, stack_id, "checkpoint", "metadata")
        if isinstance(sealed, str):
            out.update(await self.sealer.open({SEALED_KEY: sealed}, where))
        else:
            rest = {
                k: v
                for k, v in metadata.items()
                if k not in CLEAR_METADATA_KEYS and k != WAIT_RECORD_KEY and k != INDEX_KEY
            }
            if rest:
                out.update(await self.sealer.open(rest, where))
        out.update({k: v for k, v in metadata.items() if k in CLEAR_METADATA_KEYS})
        if isinstance(wait, dict):
            out[WAIT_RECORD_KEY] = await self.wait_wire_in(wait, namespace)
        elif wait is not None:
            out[WAIT_RECORD_KEY] = wait
        return out

    async def wait_wire_in(self, wire: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        ns = wire.get("namespace", namespace)
        key = str(wire.get("correlationKey"))
        out = dict(wire)
        for name in ("eventPayload", "metadata"):
            if out.get(name) is not None:
                out[name] = await self.sealer.open(out[name], Location(ns, key, "wait", name))
        return out

    async def wait_in(self, record: WaitRecord | None) -> WaitRecord | None:
        if record is None:
            return None
        ns, key = record.namespace, record.correlation_key
        payload = await self.sealer.open(
            record.event_payload, Location(ns, key, "wait", "eventPayload")
        )
        metadata = await self.sealer.open(record.metadata, Location(ns, key, "wait", "metadata"))
        if payload is record.event_payload and metadata is record.metadata:
            return record
        return record.replace(event_payload=payload, metadata=metadata)


def _refuse_reserved_checkpoint(
    checkpoint: Checkpoint, changes: Sequence[ContextChangeEvent] = ()
) -> None:
    """Refuse a checkpoint (and the context changes sent with it) holding a value of a
    form siglo reserves, before anything is written (:func:`refuse_reserved_forms`): a
    read would take it for what it looks like. The manager refuses its stacks' when it
    takes their snapshot; this is the adapter's own entry."""
    where = f"stack {checkpoint.stack_id!r}"
    refuse_reserved_forms(checkpoint.contexts, where)
    refuse_reserved_metadata(checkpoint.metadata, where)
    for change in changes:
        _refuse_reserved_change(change)


def _refuse_reserved_change(event: ContextChangeEvent) -> None:
    refuse_reserved_value(
        event.value,
        f"the change of {event.step_id}.{event.key} of stack {event.stack_id!r}",
    )


def _refuse_reserved_wait(record: WaitRecord) -> None:
    what = f"wait record {record.correlation_key!r}"
    refuse_reserved_value(record.event_payload, f"the event payload of {what}")
    refuse_reserved_value(record.metadata, f"the metadata of {what}")


def _context_location(event: ContextChangeEvent) -> Location:
    return _change_location(event.namespace, event.stack_id, event.step_id, event.key)


def _change_location(namespace: str | None, stack_id: str, step: str, key: str) -> Location:
    # The field siglo rekey re-seals a stored stream value at: the same name.
    return Location(namespace, stack_id, "context", context_field(step, key))


def _step_location(key: str, namespace: str | None = None) -> Location:
    # A namespaced entry is bound to its namespace: encrypted under that namespace's key
    # (so erasing it makes the entry unreadable) with the namespace in the associated data.
    return Location(namespace, key, "step", "value")


def _in_namespace(namespace: str | None) -> dict[str, Any]:
    """The ``namespace`` keyword of a step-cache call, left out without a namespace: an
    adapter written before cache entries had namespaces is still called as it was."""
    return {} if namespace is None else {"namespace": namespace}


def _result_location(key: str) -> Location:
    return Location(None, key, "idempotency", "result")


class PipelineAdapter(StorageAdapter):
    """A backend's storage adapter behind a :class:`Pipeline`: every contract method
    passes its payloads through the pipeline and calls the backend's own method.

    Anything else (a backend's own methods and attributes: ``migrate``, ``keys`` …) is
    the backend adapter's, through :attr:`inner`. Build one with :func:`pipeline_adapter`.
    """

    inner_class: ClassVar[type[StorageAdapter]] = StorageAdapter
    replaced_by_pipeline: ClassVar[bool] = True
    """Whether :func:`pipeline_adapter` takes this layer off before adding its own (a
    layer below the pipeline, such as :mod:`siglo.offload`'s, stays)."""
    refuses_reserved: ClassVar[bool] = True
    """Whether this layer refuses values of a form siglo reserves (a sealed value, a
    reference to an offloaded one, metadata's ``$siglo`` keys) in what it is given:
    the layer the application calls does; one below it gets the pipeline's own forms."""

    def __init__(
        self, inner: StorageAdapter, pipeline: Pipeline, sealer: Sealer | None = None
    ) -> None:
        self.inner = inner
        self.pipeline = pipeline
        self.codecs = Codecs(
            sealer if sealer is not None else sealer_for(pipeline.settings, inner),
            pipeline.settings.blind_index_fields,
        )

    def _lenient(self) -> Codecs:
        sealer = self.codecs.sealer
        if not sealer.require_encryption:
            return self.codecs
        return Codecs(Sealer(sealer.keys, compress_min_bytes=sealer.compress_min_bytes))

    async def open_stored_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint | None:
        """A checkpoint document as some store held it (an export's line), decoded by
        this pipeline's codec chain; one in clear is accepted whatever
        ``require_encryption`` says, since saving it here encrypts it."""
        return await self._lenient().checkpoint_in(checkpoint)

    async def open_stored_wait(self, record: WaitRecord) -> WaitRecord | None:
        """Like :meth:`open_stored_checkpoint`, for a wait record."""
        return await self._lenient().wait_in(record)

    async def _checkpoint_out(self, checkpoint: Checkpoint) -> Checkpoint:
        return await self.codecs.checkpoint_out(self.pipeline.checkpoint_out(checkpoint))

    async def stored_form(self, checkpoint: Checkpoint) -> tuple[Checkpoint, int | None]:
        """``checkpoint`` as the backend would store it — through every layer's stages
        down to the backend's adapter — and the backend's document limit
        (:mod:`siglo.sizing`), with nothing written to the backend or a blob store; a
        value of a form siglo reserves is refused as a save refuses it. ``siglo import``
        checks a whole dump with it before it writes anything."""
        if self.refuses_reserved:
            _refuse_reserved_checkpoint(checkpoint)
        out = await self._checkpoint_out(checkpoint)
        if isinstance(self.inner, PipelineAdapter):
            return await self.inner.stored_form(out)
        return out, self.inner.max_document_bytes

    async def _events_out(self, changes: Sequence[ContextChangeEvent]) -> list[ContextChangeEvent]:
        return [await self.codecs.event_out(self.pipeline.event_out(c)) for c in changes]

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the backend's own API.
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.inner!r}>"

    # StorageAdapter declares these with class-level defaults, which __getattr__ never
    # sees past: without these, the pipeline's adapter answered the defaults (no lock,
    # the default lease) instead of the backend's own.

    @property
    def workflow_lock(self) -> Lock | None:
        return self.inner.workflow_lock

    @workflow_lock.setter
    def workflow_lock(self, lock: Lock | None) -> None:
        self.inner.workflow_lock = lock

    @property
    def workflow_lock_ttl_ms(self) -> int:
        return self.inner.workflow_lock_ttl_ms

    @workflow_lock_ttl_ms.setter
    def workflow_lock_ttl_ms(self, ttl_ms: int) -> None:
        self.inner.workflow_lock_ttl_ms = ttl_ms

    @property
    def workflow_lock_timeout_ms(self) -> int:
        return self.inner.workflow_lock_timeout_ms

    @workflow_lock_timeout_ms.setter
    def workflow_lock_timeout_ms(self, timeout_ms: int) -> None:
        self.inner.workflow_lock_timeout_ms = timeout_ms

    # -- what the backend is -------------------------------------------------------------

    def implements(self, method: str) -> bool:
        return self.inner.implements(method)

    @property
    def closed(self) -> bool:
        return self.inner.closed

    def mark_closed(self) -> None:
        self.inner.mark_closed()

    async def aclose(self) -> None:
        await self.inner.aclose()

    # -- context stream ------------------------------------------------------------------

    async def on_context_change(self, event: ContextChangeEvent) -> None:
        if self.refuses_reserved:
            _refuse_reserved_change(event)
        await self.inner.on_context_change(
            await self.codecs.event_out(self.pipeline.event_out(event))
        )

    async def get_context_changes(
        self, stack_id: str, step_id: str, namespace: str | None = None
    ) -> dict[str, Any]:
        changes = await self.inner.get_context_changes(stack_id, step_id, namespace)
        sealer = self.codecs.sealer
        return {
            k: await sealer.open(v, _change_location(namespace, stack_id, step_id, k))
            for k, v in changes.items()
        }

    # -- checkpoints ---------------------------------------------------------------------

    async def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        if self.refuses_reserved:
            _refuse_reserved_checkpoint(checkpoint)
        await self.inner.save_checkpoint(
            await self._checkpoint_out(checkpoint), expected_revision=expected_revision
        )

    def writes_with_checkpoint(self, changes: Sequence[ContextChangeEvent]) -> bool:
        return self.inner.writes_with_checkpoint(changes)

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        if self.refuses_reserved:
            _refuse_reserved_checkpoint(checkpoint, changes)
        await self.inner.save_checkpoint_streamed(
            await self._checkpoint_out(checkpoint),
            await self._events_out(changes),
            expected_revision=expected_revision,
        )

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        if self.refuses_reserved:
            _refuse_reserved_checkpoint(checkpoint, changes)
        await self.inner.save_checkpoint_unlocking(
            await self._checkpoint_out(checkpoint),
            await self._events_out(changes),
            expected_revision=expected_revision,
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
        if self.refuses_reserved:
            _refuse_reserved_checkpoint(checkpoint, changes)
            refuse_reserved_value(entry.value, f"the value of cached step {entry.key!r}")
        # The entry's value sealed as set_cached_step seals it, at its own location.
        sealed = await self.codecs.sealer.seal(
            self.pipeline.value_out(entry.value), _step_location(entry.key, entry.namespace)
        )
        await self.inner.save_checkpoint_caching(
            await self._checkpoint_out(checkpoint),
            await self._events_out(changes),
            dataclasses.replace(entry, value=sealed),
            expected_revision=expected_revision,
            unlock=unlock,
        )

    async def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        found = await self.inner.get_checkpoint(stack_id, namespace, fallback=fallback)
        if found is not None:
            refuse_unresolved(found)
        return await self.codecs.checkpoint_in(found)

    async def clean_expired_checkpoints(self) -> int:
        return await self.inner.clean_expired_checkpoints()

    # -- wait records --------------------------------------------------------------------

    async def save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        if self.refuses_reserved:
            _refuse_reserved_wait(record)
        await self.inner.save_wait_record(
            await self.codecs.wait_out(self.pipeline.wait_out(record)), ttl_ms=ttl_ms
        )

    async def create_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> bool:
        if self.refuses_reserved:
            _refuse_reserved_wait(record)
        return await self.inner.create_wait_record(
            await self.codecs.wait_out(self.pipeline.wait_out(record)), ttl_ms=ttl_ms
        )

    async def get_wait_record(
        self, correlation_key_or_stack_id: str, *, namespace: str | None = None
    ) -> WaitRecord | None:
        found = await self.inner.get_wait_record(correlation_key_or_stack_id, namespace=namespace)
        return await self.codecs.wait_in(found)

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
        if event_payload is not MISSING:
            if self.refuses_reserved:
                refuse_reserved_value(event_payload, f"the event delivered for {correlation_key!r}")
            event_payload = await self.codecs.sealer.seal(
                self.pipeline.value_out(event_payload),
                Location(namespace, correlation_key, "wait", "eventPayload"),
            )
        claimed = await self.inner.claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )
        return await self.codecs.wait_in(claimed)

    async def complete_wait_record(
        self, correlation_key: str, claimant_id: str, *, namespace: str | None = None
    ) -> None:
        await self.inner.complete_wait_record(correlation_key, claimant_id, namespace=namespace)

    async def release_wait_record(
        self, correlation_key: str, claimant_id: str, *, namespace: str | None = None
    ) -> bool:
        return await self.inner.release_wait_record(
            correlation_key, claimant_id, namespace=namespace
        )

    async def cancel_wait_record(
        self, correlation_key: str, *, namespace: str | None = None
    ) -> bool:
        return await self.inner.cancel_wait_record(correlation_key, namespace=namespace)

    async def cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        await self.inner.cancel_workflow(stack_id, namespace)

    async def with_workflow_lock(
        self,
        stack_id: str,
        action: Callable[[], Awaitable[T]],
        *,
        timeout_ms: int | None = None,
        namespace: str | None = None,
    ) -> T:
        return await self.inner.with_workflow_lock(
            stack_id, action, timeout_ms=timeout_ms, namespace=namespace
        )

    # -- step cache and telemetry --------------------------------------------------------

    async def get_cached_step(self, key: str, *, namespace: str | None = None) -> Any | Missing:
        found = await self.inner.get_cached_step(key, **_in_namespace(namespace))
        if found is MISSING:
            return found
        if is_reference(found):
            # The offloading layer resolves references below; one that reaches here has
            # no blob store to be read from.
            refuse_unopened_value(found, f"cached step {key!r}")
        try:
            return await self.codecs.sealer.open(found, _step_location(key, namespace))
        except KeyErasedError:
            # The entry of an erased namespace, left until it expires: gone by intent, so
            # a miss — a run of the namespace used again computes and caches it anew.
            return MISSING

    async def set_cached_step(
        self, key: str, value: Any, ttl_ms: int | None = None, *, namespace: str | None = None
    ) -> None:
        if self.refuses_reserved:
            refuse_reserved_value(value, f"the value of cached step {key!r}")
        sealed = await self.codecs.sealer.seal(
            self.pipeline.value_out(value), _step_location(key, namespace)
        )
        await self.inner.set_cached_step(key, sealed, ttl_ms, **_in_namespace(namespace))

    async def on_cache_event(self, event: CacheEvent) -> None:
        await self.inner.on_cache_event(event)

    # -- operating what is stored --------------------------------------------------------

    async def list_checkpoints(
        self,
        *,
        namespace: str | Missing | None = MISSING,
        status: str | Iterable[str] | None = None,
        workflow_id: str | None = None,
        updated_before: int | None = None,
        updated_after: int | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        cursor: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointPage:
        """The backend's listing, without the keyrings when it lists every namespace;
        ``metadata`` filters by equality on metadata fields — through the blind index
        when the metadata is encrypted (:mod:`siglo.blind`)."""
        if metadata is not None:
            redacted = sorted(set(metadata) & self.pipeline.redact_fields)
            if redacted:
                # Stored "[REDACTED]", or its value where it was stored before the key was
                # redacted: a filter on it would answer guesses about the values every
                # printing path hides (a black-box auditor: `siglo ls --where ssn=…`).
                raise InvalidArgumentError(
                    f"metadata field(s) {', '.join(map(repr, redacted))} are redacted by the "
                    "settings (redact_fields): a listing does not filter on them"
                )
            return await self._list_matching(
                metadata,
                namespace=namespace,
                status=status,
                workflow_id=workflow_id,
                updated_before=updated_before,
                updated_after=updated_after,
                limit=limit,
                cursor=cursor,
            )
        # Summaries hold routing fields only, which no stage changes. (A listing of every
        # namespace leaves out the keyrings below, whatever the settings: siglo.reserved.)
        return await self.inner.list_checkpoints(
            namespace=namespace,
            status=status,
            workflow_id=workflow_id,
            updated_before=updated_before,
            updated_after=updated_after,
            limit=limit,
            cursor=cursor,
        )

    async def _list_matching(self, metadata: Mapping[str, Any], **query: Any) -> CheckpointPage:
        wanted = check_filter(metadata)
        codecs = self.codecs
        if codecs.sealer.encrypts:
            unindexed = sorted(set(wanted) - codecs.indexed)
            if unindexed:
                raise InvalidArgumentError(
                    f"metadata field(s) {', '.join(map(repr, unindexed))} are encrypted and "
                    "not in blind_index_fields: only indexed fields can be filtered on "
                    "without decrypting (docs/encryption.md)"
                )
        namespace = query.get("namespace", MISSING)
        if (
            codecs.sealer.keys is not None
            and namespace is not MISSING
            and namespace != KEYRING_NAMESPACE
            and set(wanted) <= codecs.indexed
        ):
            # One namespace, every field indexed: the backend's index answers, without
            # reading the stacks it passes.
            key = await codecs.index_key(namespace)
            tokens = {f: token(key, f, v) for f, v in sorted(wanted.items())}
            return await self.inner.list_checkpoints_by_index(tokens, **query)
        return await list_matching(
            self.inner,
            wanted,
            indexed=codecs.indexed,
            index_key=codecs.index_key if codecs.sealer.keys is not None else None,
            skip=lambda s: s.namespace == KEYRING_NAMESPACE,
            **query,
        )

    async def list_checkpoints_by_index(
        self,
        tokens: Mapping[str, str],
        *,
        namespace: str | None,
        status: str | Iterable[str] | None = None,
        workflow_id: str | None = None,
        updated_before: int | None = None,
        updated_after: int | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        cursor: str | None = None,
    ) -> CheckpointPage:
        # Tokens and summaries are routing data no stage changes.
        return await self.inner.list_checkpoints_by_index(
            tokens,
            namespace=namespace,
            status=status,
            workflow_id=workflow_id,
            updated_before=updated_before,
            updated_after=updated_after,
            limit=limit,
            cursor=cursor,
        )

    async def delete_checkpoint(
        self,
        stack_id: str,
        namespace: str | None = None,
        *,
        expected_revision: int | None = None,
    ) -> bool:
        return await self.inner.delete_checkpoint(
            stack_id, namespace, expected_revision=expected_revision
        )

    async def list_due_waits(self, *, limit: int = DEFAULT_PAGE_SIZE) -> list[WaitRecord]:
        opened: list[WaitRecord] = []
        for record in await self.inner.list_due_waits(limit=limit):
            try:
                found = await self.codecs.wait_in(record)
            except UNREADABLE as exc:
                # Not decryptable here: left out, named to whoever lists (siglo.unreadable).
                key, namespace = record.correlation_key, record.namespace
                report_unreadable(naming_wait(exc, key, namespace, record.stack_id))
                continue
            if found is not None:
                opened.append(found)
        return opened

    # -- stored payloads: as the backend stores them ---------------------------------------

    def scan_payloads(self, kind: PayloadKind) -> AsyncIterator[StoredPayload]:
        """The backend's walk, its payloads as stored (sealed): what ``siglo rekey``
        re-encrypts, not the application's values."""
        return self.inner.scan_payloads(kind)

    async def swap_payload(self, item: StoredPayload, fields: Mapping[str, Any]) -> bool:
        """The backend's compare-and-set rewrite; ``fields`` are stored as given (already
        sealed by whoever rewrites them)."""
        return await self.inner.swap_payload(item, fields)

    async def delete_payload(self, item: StoredPayload) -> bool:
        """The backend's compare-and-delete of a listed record (``siglo erase``)."""
        return await self.inner.delete_payload(item)


# Every storage call the tracing stage puts in a span (all of a backend's contract
# calls that reach the server; the sync ones decide locally and are left alone).
TRACED_CALLS: Final = (
    "on_context_change",
    "get_context_changes",
    "save_checkpoint",
    "save_checkpoint_streamed",
    "save_checkpoint_unlocking",
    "save_checkpoint_caching",
    "get_checkpoint",
    "clean_expired_checkpoints",
    "save_wait_record",
    "create_wait_record",
    "get_wait_record",
    "claim_wait_record",
    "complete_wait_record",
    "release_wait_record",
    "cancel_wait_record",
    "cancel_workflow",
    "with_workflow_lock",
    "get_cached_step",
    "set_cached_step",
    "on_cache_event",
    "list_checkpoints",
    "list_checkpoints_by_index",
    "delete_checkpoint",
    "list_due_waits",
    "swap_payload",
    "delete_payload",
)
TRACED_IDEMPOTENCY_CALLS: Final = (
    "claim",
    "claim_owned",
    "complete",
    "fail",
    "extend",
    "get_result",
)


NOT_STORAGE_CALLS: Final = frozenset({"aclose"})
"""A backend's own coroutine methods, reached past the pipeline's (:func:`traced_own`),
that are not storage calls: left untraced."""


def _operation_attributes(part: Any, name: str) -> dict[str, Any]:
    # The span's attributes are built once per part and operation, not per call.
    attributes: dict[str, Any] | None = part.operation_attributes.get(name)
    if attributes is None:
        attributes = part.operation_attributes[name] = {
            **part.attributes,
            "db.operation.name": name,
        }
    return attributes


def _traced(base: type[Any], operation: str, prefix: str = "") -> Any:
    untraced = getattr(base, operation)
    name = prefix + operation

    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        attributes = _operation_attributes(self, name)
        if name == "with_workflow_lock":
            return await _traced_lock(self, attributes, untraced, *args, **kwargs)
        return await self.telemetry.call(attributes, name, untraced, self, *args, **kwargs)

    call.__name__ = operation
    call.__doc__ = untraced.__doc__
    return call


async def _traced_lock(
    adapter: Any,
    attributes: dict[str, Any],
    untraced: Callable[..., Awaitable[Any]],
    stack_id: str,
    action: Callable[[], Awaitable[Any]],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``with_workflow_lock`` traced: an exception its action raised (a step's, a
    cancellation of the run) ends the span as the action's outcome, not as a failure of
    the lock's storage call (Telemetry.call's ``action_raised``)."""
    raised: list[BaseException] = []

    async def watched() -> Any:
        try:
            return await action()
        except BaseException as exc:
            raised.append(exc)
            raise

    return await adapter.telemetry.call(
        attributes,
        "with_workflow_lock",
        untraced,
        adapter,
        stack_id,
        watched,
        *args,
        action_raised=lambda exc: any(exc is seen for seen in raised),
        **kwargs,
    )


def traced_own(part: Any, name: str, prefix: str = "") -> Any:
    """``part.inner``'s attribute ``name`` as a traced part (:class:`TracedPipelineAdapter`,
    :class:`TracedPipelineIdempotencyStore`) hands it on: a coroutine method of the
    backend's own (``clean_expired``, ``migrate``, ``swap_result`` …, which the
    contract's traced calls do not list) is a storage call too, so it is wrapped in a
    span and a timing named ``prefix + name``; anything else is handed on as it is."""
    found = getattr(part.inner, name)
    if name.startswith("_") or name in NOT_STORAGE_CALLS or not iscoroutinefunction(found):
        return found
    operation = prefix + name
    attributes = _operation_attributes(part, operation)
    telemetry: Telemetry = part.telemetry

    # Made per look-up, not kept on the part: the backend's method is looked up anew
    # each time, as without the tracing stage (a method replaced later is the one called).
    @functools.wraps(found)
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await telemetry.call(attributes, operation, found, *args, **kwargs)

    return call


class TracedPipelineAdapter(PipelineAdapter):
    """A :class:`PipelineAdapter` whose every storage call is a span and a timing
    (:mod:`siglo.telemetry`); what the stages make of the payloads is the same. The
    backend's own coroutine methods, reached through it (``clean_expired`` …), are
    traced too (:func:`traced_own`)."""

    telemetry: Telemetry
    attributes: dict[str, Any]
    operation_attributes: dict[str, dict[str, Any]]

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the backend's own API.
        return traced_own(self, name)


for _name in TRACED_CALLS:
    setattr(TracedPipelineAdapter, _name, _traced(PipelineAdapter, _name))

_CLASSES: dict[tuple[type[StorageAdapter], bool], type[PipelineAdapter]] = {}


def _pipeline_class(inner: type[StorageAdapter], traced: bool) -> type[PipelineAdapter]:
    # One class per backend class: what the backend declares about itself (name,
    # capabilities, durability) is declared on the class, as siglo reads it.
    if (inner, traced) in _CLASSES:
        return _CLASSES[inner, traced]
    made = _CLASSES[inner, traced] = type(
        f"{'Traced' if traced else ''}Pipeline{inner.__name__}",
        (TracedPipelineAdapter if traced else PipelineAdapter,),
        {
            "inner_class": inner,
            "name": inner.name,
            "capabilities": inner.capabilities,
            "durable": inner.durable,
            "__module__": __name__,
        },
    )
    return made


def pipeline_adapter(
    adapter: StorageAdapter,
    pipeline: Pipeline,
    attributes: dict[str, Any] | None = None,
    sealer: Sealer | None = None,
) -> StorageAdapter:
    """``adapter`` behind ``pipeline`` (``adapter`` itself when the pipeline has nothing to
    do; an adapter already behind a pipeline is put behind this one instead).
    ``attributes``: the backend's span attributes (:func:`siglo.telemetry.db_attributes`)
    when the pipeline traces; ``sealer``: the codec chain to use (default: the one
    ``pipeline``'s settings ask for)."""
    if isinstance(adapter, PipelineAdapter) and adapter.replaced_by_pipeline:
        adapter = adapter.inner
    if pipeline.is_identity and not isinstance(adapter, PipelineAdapter):
        return adapter
    # An offloading layer (siglo.offload) passes sealed values through both ways: the
    # pipeline in front of it opens them, with no keys a clear error, never the
    # ciphertext handed on (its idempotency results, cached outputs, streams, waits).
    traced = pipeline.telemetry is not None
    piped = _pipeline_class(type(adapter), traced)(adapter, pipeline, sealer)
    if isinstance(piped, TracedPipelineAdapter):
        assert pipeline.telemetry is not None
        piped.telemetry = pipeline.telemetry
        piped.attributes = attributes or {"db.system.name": adapter.name}
        piped.operation_attributes = {}
    return piped


class PipelineIdempotencyStore(Closable):
    """A backend's idempotency store (:class:`~siglo.IdempotencyStore`) behind a
    :class:`Pipeline`: a completed result goes out through it and comes back through it."""

    def __init__(self, inner: IdempotencyStore, pipeline: Pipeline, sealer: Sealer) -> None:
        self.inner = inner
        if isinstance(inner, IdempotencyStoreBase):
            inner.opened_above = True  # what it reads is opened here
        self.pipeline = pipeline
        self.sealer = sealer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def closed(self) -> bool:
        return bool(getattr(self.inner, "closed", False))

    def mark_closed(self) -> None:
        if isinstance(self.inner, Closable):
            self.inner.mark_closed()

    async def claim(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> ClaimState:
        return await self.inner.claim(key, ttl_ms, fingerprint=fingerprint)

    async def claim_owned(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> IdempotencyClaim:
        return await self.inner.claim_owned(key, ttl_ms, fingerprint=fingerprint)

    async def complete(
        self, key: str, result: Any, ttl_ms: int | None = None, *, token: str | None = None
    ) -> None:
        refuse_reserved_value(result, f"the result of idempotency key {key!r}")
        sealed = await self.sealer.seal(self.pipeline.value_out(result), _result_location(key))
        await self.inner.complete(key, sealed, ttl_ms, token=token)

    async def fail(
        self, key: str, error: BaseException | None = None, *, token: str | None = None
    ) -> None:
        await self.inner.fail(key, error, token=token)

    async def extend(self, key: str, token: str, ttl_ms: int) -> bool:
        return await self.inner.extend(key, token, ttl_ms)

    async def get_result(self, key: str) -> Any | Missing:
        found = await self.inner.get_result(key)
        return found if found is MISSING else await self.sealer.open(found, _result_location(key))

    async def get(self, key: str) -> Any | Missing:
        return await self.get_result(key)


class TracedPipelineIdempotencyStore(PipelineIdempotencyStore):
    """A :class:`PipelineIdempotencyStore` whose every call is a span and a timing, the
    store's own coroutine methods reached through it (``swap_result``) included."""

    telemetry: Telemetry
    attributes: dict[str, Any]
    operation_attributes: dict[str, dict[str, Any]]

    def __getattr__(self, name: str) -> Any:
        return traced_own(self, name, prefix="idempotency.")


for _name in TRACED_IDEMPOTENCY_CALLS:
    setattr(
        TracedPipelineIdempotencyStore,
        _name,
        _traced(PipelineIdempotencyStore, _name, prefix="idempotency."),
    )


def observe_coordination(
    pipeline: Pipeline,
    attributes: dict[str, Any] | None,
    lock: Lock | None,
    nonces: NonceStore | None,
) -> None:
    """Have a backend's lock and nonce store count their calls that run past their bound
    under ``siglo.timeouts`` when the pipeline traces (``attributes``: the backend's).
    They are not traced (called directly, they stay the backend's own objects), but a
    timeout of theirs is a storage call's like any other. A lock or store not built on
    :class:`~siglo.coordination.LockBase` / :class:`~siglo.coordination.NonceStoreBase`
    has nowhere to report it, and is left alone."""
    observed = None
    if pipeline.telemetry is not None:
        observed = pipeline.telemetry.failure_observer(attributes or {})
    for part in (lock, nonces):
        if isinstance(part, LockBase | NonceStoreBase):
            # Set either way: a part handed to a second connect (a memory store's copy)
            # reports to that connect's telemetry, or to none.
            part.failure_observer = observed


def pipeline_parts(
    adapter: StorageAdapter,
    idempotency: IdempotencyStore | None,
    pipeline: Pipeline,
    attributes: dict[str, Any] | None = None,
) -> tuple[StorageAdapter, IdempotencyStore | None]:
    """A backend's adapter and idempotency store behind ``pipeline`` (``attributes``:
    the backend's span attributes, when the pipeline traces)."""
    piped = pipeline_adapter(adapter, pipeline, attributes)
    if isinstance(idempotency, PipelineIdempotencyStore):
        idempotency = idempotency.inner
    if idempotency is None or not isinstance(piped, PipelineAdapter):
        return piped, idempotency
    sealer = piped.codecs.sealer
    if pipeline.telemetry is None:
        return piped, PipelineIdempotencyStore(idempotency, pipeline, sealer)
    store = TracedPipelineIdempotencyStore(idempotency, pipeline, sealer)
    store.telemetry = pipeline.telemetry
    store.attributes = attributes or {"db.system.name": "unknown"}
    store.operation_attributes = {}
    return piped, store
