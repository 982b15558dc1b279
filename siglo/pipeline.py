"""The one pipeline between siglo and a backend: what every payload goes through.

Every payload siglo stores — a checkpoint's contexts and metadata, a context-change
value, a wait record's payloads, a cached step output, an idempotency result — passes
:class:`Pipeline` on its way to the backend, and every payload read back passes it on the
way in. The pipeline is built from the one configuration (:class:`siglo.config.Settings`):
today it redacts the settings' ``redact_fields`` at any depth.

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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar

from siglo.adapter import StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.closing import Closable
from siglo.config import Settings
from siglo.coordination import ClaimState, IdempotencyClaim, IdempotencyStore
from siglo.listing import DEFAULT_PAGE_SIZE, CheckpointPage
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord
from siglo.redaction import REDACT_FIELDS_KEY, REDACTED, redact
from siglo.sentinel import MISSING, Missing

__all__ = [
    "REDACT_FIELDS_KEY",
    "Pipeline",
    "PipelineAdapter",
    "PipelineIdempotencyStore",
    "pipeline_adapter",
    "pipeline_parts",
]

T = TypeVar("T")


class Pipeline:
    """The stages a payload passes between siglo and a backend, built from settings."""

    __slots__ = ("redact_fields",)

    def __init__(self, settings: Settings) -> None:
        self.redact_fields = settings.redact_fields

    @property
    def is_identity(self) -> bool:
        """Whether every stage passes payloads through unchanged (nothing to wrap)."""
        return not self.redact_fields

    # -- toward the backend ----------------------------------------------------------------

    def value_out(self, value: Any) -> Any:
        """A payload value as it may leave the process."""
        return redact(value, self.redact_fields) if self.redact_fields else value

    def checkpoint_out(self, checkpoint: Checkpoint) -> Checkpoint:
        """A checkpoint as it may be stored: contexts and metadata redacted, and the
        redacted keys named in its metadata (see :data:`REDACT_FIELDS_KEY`)."""
        fields = self.redact_fields
        if not fields:
            return checkpoint
        contexts = {step: redact(ctx, fields) for step, ctx in checkpoint.contexts.items()}
        metadata = dict(redact(checkpoint.metadata or {}, fields))
        named = set(metadata.get(REDACT_FIELDS_KEY) or ()) | fields
        metadata[REDACT_FIELDS_KEY] = sorted(named)
        if contexts == checkpoint.contexts and metadata == (checkpoint.metadata or {}):
            return checkpoint
        return checkpoint.replace(contexts=contexts, metadata=metadata)

    def event_out(self, event: ContextChangeEvent) -> ContextChangeEvent:
        """A context change as it may be stored (a set of a redacted key sends
        ``"[REDACTED]"``)."""
        fields = self.redact_fields
        if not fields:
            return event
        if event.key in fields and event.op == "set":
            value: Any = REDACTED
        else:
            value = redact(event.value, fields)
        return event if value == event.value else dataclasses.replace(event, value=value)

    def wait_out(self, record: WaitRecord) -> WaitRecord:
        """A wait record as it may be stored: its event payload and metadata redacted."""
        fields = self.redact_fields
        if not fields:
            return record
        payload = redact(record.event_payload, fields)
        metadata = None if record.metadata is None else redact(record.metadata, fields)
        if payload == record.event_payload and metadata == record.metadata:
            return record
        return record.replace(event_payload=payload, metadata=metadata)

    # -- from the backend (no stage changes what comes back yet) -----------------------------

    def checkpoint_in(self, checkpoint: Checkpoint | None) -> Checkpoint | None:
        """A checkpoint as read back."""
        return checkpoint

    def wait_in(self, record: WaitRecord | None) -> WaitRecord | None:
        """A wait record as read back."""
        return record

    def value_in(self, value: T) -> T:
        """A payload value as read back."""
        return value


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

    def __init__(self, inner: StorageAdapter, pipeline: Pipeline) -> None:
        self.inner = inner
        self.pipeline = pipeline

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the backend's own API.
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.inner!r}>"

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
        await self.inner.on_context_change(self.pipeline.event_out(event))

    async def get_context_changes(
        self, stack_id: str, step_id: str, namespace: str | None = None
    ) -> dict[str, Any]:
        changes = await self.inner.get_context_changes(stack_id, step_id, namespace)
        return {k: self.pipeline.value_in(v) for k, v in changes.items()}

    # -- checkpoints ---------------------------------------------------------------------

    async def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        await self.inner.save_checkpoint(
            self.pipeline.checkpoint_out(checkpoint), expected_revision=expected_revision
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
        await self.inner.save_checkpoint_streamed(
            self.pipeline.checkpoint_out(checkpoint),
            [self.pipeline.event_out(c) for c in changes],
            expected_revision=expected_revision,
        )

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        await self.inner.save_checkpoint_unlocking(
            self.pipeline.checkpoint_out(checkpoint),
            [self.pipeline.event_out(c) for c in changes],
            expected_revision=expected_revision,
        )

    async def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        found = await self.inner.get_checkpoint(stack_id, namespace, fallback=fallback)
        return self.pipeline.checkpoint_in(found)

    async def clean_expired_checkpoints(self) -> int:
        return await self.inner.clean_expired_checkpoints()

    # -- wait records --------------------------------------------------------------------

    async def save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        await self.inner.save_wait_record(self.pipeline.wait_out(record), ttl_ms=ttl_ms)

    async def get_wait_record(
        self, correlation_key_or_stack_id: str, *, namespace: str | None = None
    ) -> WaitRecord | None:
        found = await self.inner.get_wait_record(correlation_key_or_stack_id, namespace=namespace)
        return self.pipeline.wait_in(found)

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
            event_payload = self.pipeline.value_out(event_payload)
        claimed = await self.inner.claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )
        return self.pipeline.wait_in(claimed)

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
    ) -> T:
        return await self.inner.with_workflow_lock(stack_id, action, timeout_ms=timeout_ms)

    # -- step cache and telemetry --------------------------------------------------------

    async def get_cached_step(self, key: str) -> Any | Missing:
        found = await self.inner.get_cached_step(key)
        return found if found is MISSING else self.pipeline.value_in(found)

    async def set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        await self.inner.set_cached_step(key, self.pipeline.value_out(value), ttl_ms)

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
    ) -> CheckpointPage:
        # Summaries hold routing fields only, which no stage changes.
        return await self.inner.list_checkpoints(
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
        due = await self.inner.list_due_waits(limit=limit)
        return [r for r in map(self.pipeline.wait_in, due) if r is not None]


_CLASSES: dict[type[StorageAdapter], type[PipelineAdapter]] = {}


def _pipeline_class(inner: type[StorageAdapter]) -> type[PipelineAdapter]:
    # One class per backend class: what the backend declares about itself (name,
    # capabilities, durability) is declared on the class, as siglo reads it.
    if inner in _CLASSES:
        return _CLASSES[inner]
    made = _CLASSES[inner] = type(
        f"Pipeline{inner.__name__}",
        (PipelineAdapter,),
        {
            "inner_class": inner,
            "name": inner.name,
            "capabilities": inner.capabilities,
            "durable": inner.durable,
            "__module__": __name__,
        },
    )
    return made


def pipeline_adapter(adapter: StorageAdapter, pipeline: Pipeline) -> StorageAdapter:
    """``adapter`` behind ``pipeline`` (``adapter`` itself when the pipeline has nothing to
    do; an adapter already behind a pipeline is put behind this one instead)."""
    if isinstance(adapter, PipelineAdapter) and adapter.replaced_by_pipeline:
        adapter = adapter.inner
    if pipeline.is_identity:
        return adapter
    return _pipeline_class(type(adapter))(adapter, pipeline)


class PipelineIdempotencyStore(Closable):
    """A backend's idempotency store (:class:`~siglo.IdempotencyStore`) behind a
    :class:`Pipeline`: a completed result goes out through it and comes back through it."""

    def __init__(self, inner: IdempotencyStore, pipeline: Pipeline) -> None:
        self.inner = inner
        self.pipeline = pipeline

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
        await self.inner.complete(key, self.pipeline.value_out(result), ttl_ms, token=token)

    async def fail(
        self, key: str, error: BaseException | None = None, *, token: str | None = None
    ) -> None:
        await self.inner.fail(key, error, token=token)

    async def extend(self, key: str, token: str, ttl_ms: int) -> bool:
        return await self.inner.extend(key, token, ttl_ms)

    async def get_result(self, key: str) -> Any | Missing:
        found = await self.inner.get_result(key)
        return found if found is MISSING else self.pipeline.value_in(found)

    async def get(self, key: str) -> Any | Missing:
        return await self.get_result(key)


def pipeline_parts(
    adapter: StorageAdapter, idempotency: IdempotencyStore | None, pipeline: Pipeline
) -> tuple[StorageAdapter, IdempotencyStore | None]:
    """A backend's adapter and idempotency store behind ``pipeline``."""
    piped = pipeline_adapter(adapter, pipeline)
    if idempotency is None or pipeline.is_identity:
        return piped, idempotency
    if isinstance(idempotency, PipelineIdempotencyStore):
        idempotency = idempotency.inner
    return piped, PipelineIdempotencyStore(idempotency, pipeline)
