"""A live stack to and from what is stored: its snapshot (a :class:`Checkpoint`), its
context-change events (both redacted), and the stack a checkpoint restores."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from siglo import codec
from siglo.checkpoint import CHECKPOINT_VERSION, SCHEMA_VERSION, Checkpoint
from siglo.clock import Clock
from siglo.errors import InvalidArgumentError, NamespaceMismatchError
from siglo.records import ContextChangeEvent, ContextOp
from siglo.redaction import (
    REDACT_FIELDS_KEY,
    REDACTED,
    check_redact_fields,
    named_redactions,
    redact,
    redact_contexts,
)
from siglo.stack import ContextStream, ExecutionStack
from siglo.validation import require_optional_id, require_ttl_ms
from siglo.wire import later_ms

__all__ = ["context_change_event", "restore_stack", "take_snapshot"]

_NONE_NAMED: Final[frozenset[str]] = frozenset()


def take_snapshot(
    stack: ExecutionStack,
    manager_fields: frozenset[str],
    clock: Clock,
    *,
    expected_revision: int | None,
    redact_fields: Collection[str],
    ttl_ms: int | None,
) -> Checkpoint:
    """Snapshot ``stack`` at its next revision, which the stack then takes.

    The keys of ``manager_fields``, the stack's own and ``redact_fields`` (which the
    stack keeps from then on) are redacted from the contexts; ``expires_at`` is
    ``ttl_ms`` from now. Bad arguments raise before anything changes.
    """
    if expected_revision is not None and (
        type(expected_revision) is not int or expected_revision < 0
    ):
        raise InvalidArgumentError(
            f"expected_revision must be a non-negative integer, got {expected_revision!r}"
        )
    if ttl_ms is not None:
        require_ttl_ms("ttl_ms", ttl_ms)
    named = _NONE_NAMED if redact_fields == () else check_redact_fields(redact_fields)
    revision = stack.revision + 1
    if expected_revision is not None and revision <= expected_revision:
        raise InvalidArgumentError(
            f"expected_revision {expected_revision} is ahead of stack {stack.stack_id!r}'s "
            f"revision {stack.revision}; restore the latest checkpoint first"
        )
    now = clock.now_ms()
    # Keys once named for a stack stay redacted: its later stream events and
    # snapshots must not send what an earlier snapshot withheld.
    if not named <= stack.redact_fields:
        stack.redact_fields = stack.redact_fields | named
    fields = manager_fields | stack.redact_fields
    contexts = redact_contexts(stack.contexts, fields) if fields else stack.contexts
    metadata: Mapping[str, Any] = stack.metadata
    if fields:
        # The metadata leaves the process too (a flow's input, a wait's event payload),
        # and names the keys redacted, so any process that restores the stack — a
        # worker, another replica — keeps redacting them (restore_stack).
        metadata = dict(redact(stack.metadata, fields))
        listed = set(metadata.get(REDACT_FIELDS_KEY) or ()) | fields
        metadata[REDACT_FIELDS_KEY] = sorted(listed)
    # Checkpoint.to_wire's order, key for key: a document stored from a snapshot and one
    # a backend encodes again (an import elsewhere, an export) are the same bytes.
    wire: dict[str, Any] = {
        "version": CHECKPOINT_VERSION,
        "schemaVersion": SCHEMA_VERSION,
        "stackId": stack.stack_id,
    }
    if stack.workflow_id is not None:
        wire["workflowId"] = stack.workflow_id
    if stack.namespace is not None:
        wire["namespace"] = stack.namespace
    wire["type"] = stack.type
    wire["status"] = stack.status
    wire["revision"] = revision
    wire["chains"] = stack.chains
    wire["contexts"] = contexts
    wire["timestamp"] = now
    if ttl_ms is not None:
        wire["expiresAt"] = later_ms(now, ttl_ms)
    if metadata:
        wire["metadata"] = metadata
    if stack.extra:
        # What the stack was restored with and siglo does not know, kept (redacted like
        # the rest), after siglo's fields as to_wire puts it; never in place of one.
        extra = redact(stack.extra, fields) if fields else stack.extra
        wire.update((key, value) for key, value in extra.items() if key not in wire)
    # A value of a form siglo reserves would read back as what it looks like: refused
    # now, not at every load after.
    codec.refuse_reserved_forms(contexts, f"stack {stack.stack_id!r}")
    codec.refuse_reserved_metadata(metadata, f"stack {stack.stack_id!r}")
    # Encoding then decoding is the deep copy: later mutations of the live stack
    # cannot reach the snapshot, non-JSON context values fail here, synchronously,
    # and the adapter reuses the encoding instead of serialising again.
    checkpoint = Checkpoint.from_json(codec.dumps_of(wire, "stack", stack.stack_id))
    stack.revision = revision
    return checkpoint


def context_change_event(
    stack: ExecutionStack,
    step_id: str,
    key: str,
    value: Any,
    op: ContextOp,
    *,
    fields: frozenset[str],
    revision: int,
    timestamp: int,
) -> ContextChangeEvent:
    """The event streamed for one change of ``stack``'s context, ``fields`` redacted.

    A set of a redacted key sends ``"[REDACTED]"``; any other value is redacted at any
    depth (a value too deep to redact raises :class:`InvalidArgumentError`).
    """
    if key in fields and op == "set":
        sent: Any = REDACTED
    else:
        sent = redact(value, fields) if fields else value
    return ContextChangeEvent(
        stack_id=stack.stack_id,
        step_id=step_id,
        key=key,
        value=sent,
        op=op,
        namespace=stack.namespace,
        revision=revision,
        timestamp=timestamp,
    )


def restore_stack(
    checkpoint: Checkpoint | Mapping[str, Any] | bytes | str,
    stream: ContextStream,
    *,
    expected_namespace: str | None,
) -> ExecutionStack:
    """A new live stack holding ``checkpoint`` (a :class:`Checkpoint`, a wire document
    or its JSON), streaming its context changes to ``stream``.

    Raises :class:`~siglo.errors.NamespaceMismatchError` when ``expected_namespace`` and
    the checkpoint's namespace are both present and differ. An un-namespaced checkpoint
    restored for ``expected_namespace`` (a read that fell back to it, seed 001 §5) makes
    a stack of that namespace at revision 0: reads fall back, writes do not — its first
    save creates the namespace's own checkpoint and leaves the un-namespaced one as it
    was, which another tenant, or the application without namespaces, still owns.
    """
    if isinstance(checkpoint, bytes | str):
        checkpoint = Checkpoint.from_json(checkpoint)
    elif not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint.from_wire(checkpoint)
    require_optional_id("expected_namespace", expected_namespace)
    if (
        expected_namespace is not None
        and checkpoint.namespace is not None
        and checkpoint.namespace != expected_namespace
    ):
        raise NamespaceMismatchError(checkpoint.stack_id, expected_namespace, checkpoint.namespace)
    # The live stack must not share dicts with the (immutable) checkpoint: decode a
    # fresh copy from its JSON, which a loaded checkpoint already holds (no re-encode).
    doc = codec.loads(checkpoint.to_json(), what="checkpoint")
    metadata = doc.get("metadata") or {}
    fell_back = expected_namespace is not None and checkpoint.namespace is None
    return ExecutionStack(
        stack_id=checkpoint.stack_id,
        manager=stream,
        workflow_id=checkpoint.workflow_id,
        namespace=expected_namespace if fell_back else checkpoint.namespace,
        type=checkpoint.type,
        status=checkpoint.status,
        revision=0 if fell_back else checkpoint.revision,
        chains=list(checkpoint.chains),
        contexts=doc["contexts"],
        metadata=metadata,
        redact_fields=named_redactions(metadata),
        extra={name: doc[name] for name in checkpoint.extra if name in doc},
    )
