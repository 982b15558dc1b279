"""Broken backends that only a state machine generating the contract's whole value space
catches (issue 12, item 1): checkpoint metadata and contexts of many shapes, unknown wire
fields of any value, several waits of one stack in every state, claimant ids that differ
from the holder's by one character, falsy event payloads, context streams with many and
unusual field names, idempotency keys failed without a claim. Each breaks one rule of
docs/contract.md, written from the rule's text; the focused checks do not meet these
values, so the widened machines must."""

from __future__ import annotations

from typing import Any

from siglo import MISSING, Checkpoint, WaitRecord
from siglo.records import ContextChangeEvent
from siglo_memory.adapter import MemoryStorageAdapter
from siglo_memory.coordination import MemoryIdempotencyStore

# -- checkpoints ---------------------------------------------------------------------------


class MetadataDropsFalsyScalars(MemoryStorageAdapter):
    """checkpoint.roundtrip: metadata entries whose value is ``False`` or ``""`` are not
    stored."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        meta = checkpoint.metadata
        if meta:
            kept = {k: v for k, v in meta.items() if v is not False and v != ""}
            checkpoint = checkpoint.replace(metadata=kept)
        await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)


class ContextDropsColonKeys(MemoryStorageAdapter):
    """checkpoint.roundtrip: context keys containing ``:`` are not stored."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        contexts = {
            chain: {k: v for k, v in ctx.items() if ":" not in k}
            for chain, ctx in checkpoint.contexts.items()
        }
        await super()._do_save_checkpoint(
            checkpoint.replace(contexts=contexts), expected_revision=expected_revision
        )


def _drop_nested_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nested_nulls(v) for k, v in value.items() if v is not None}
    return value


class ContextDropsNestedNulls(MemoryStorageAdapter):
    """checkpoint.roundtrip: ``null`` members of objects nested (through objects, not
    lists) inside a context value are dropped; top-level context keys keep theirs."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        contexts = {
            chain: {k: _drop_nested_nulls(v) for k, v in ctx.items()}
            for chain, ctx in checkpoint.contexts.items()
        }
        await super()._do_save_checkpoint(
            checkpoint.replace(contexts=contexts), expected_revision=expected_revision
        )


class CheckpointExtraDropsScalarsAndLists(MemoryStorageAdapter):
    """checkpoint.roundtrip: unknown wire fields are kept only when their value is an
    object or ``null``; scalar and list ones are lost."""

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        extra = {k: v for k, v in checkpoint.extra.items() if v is None or isinstance(v, dict)}
        await super()._do_save_checkpoint(
            checkpoint.replace(extra=extra), expected_revision=expected_revision
        )


# -- waits ---------------------------------------------------------------------------------


class WaitExtraKeepsTruthy(MemoryStorageAdapter):
    """wait.roundtrip: unknown wire fields of a wait record with a falsy value are lost."""

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        extra = {k: v for k, v in record.extra.items() if v}
        await super()._do_save_wait_record(record.replace(extra=extra), ttl_ms=ttl_ms)


class CancelWorkflowSkipsLapsedClaims(MemoryStorageAdapter):
    """wait.cancel-workflow: a claimed record whose lease has run out is taken as
    abandoned and left claimed."""

    async def _do_cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        now = self.clock.now_ms()
        lapsed = [
            r
            for r in (self._live_wait(key, now) for key in list(self._waits))
            if r is not None
            and r.stack_id == stack_id
            and r.namespace == namespace
            and r.status == "claimed"
            and r.lease_expired(now)
        ]
        await super()._do_cancel_workflow(stack_id, namespace)
        for record in lapsed:
            self._store_wait(record)


class CompleteIgnoresLeadingSpace(MemoryStorageAdapter):
    """wait.complete.claimant: claimant ids are compared with leading spaces stripped,
    so " holder" completes the record claimed by "holder"."""

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        record = self._live_wait(correlation_key, self.clock.now_ms())
        if (
            record is not None
            and record.claimant_id
            and record.claimant_id.lstrip() == claimant_id.lstrip()
        ):
            claimant_id = record.claimant_id
        await super()._do_complete_wait_record(correlation_key, claimant_id, namespace)


class ClaimByPrefixedClaimant(MemoryStorageAdapter):
    """wait.claim.refused: a claimant whose id ends with the holder's (``x-holder``)
    counts as the holder and takes the claimed record under a live lease."""

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
        record = self._live_wait(correlation_key, self.clock.now_ms())
        if (
            claimant_id is not None
            and record is not None
            and record.status == "claimed"
            and record.claimant_id
            and claimant_id.endswith(record.claimant_id)
        ):
            claimant_id = record.claimant_id
        return await super()._do_claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


class FalsePayloadKeepsStored(MemoryStorageAdapter):
    """wait.claim.once: a claim passing ``event_payload=False`` or ``""`` keeps the
    stored payload instead."""

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
        if event_payload is False or event_payload == "":
            event_payload = MISSING
        return await super()._do_claim_wait_record(
            correlation_key,
            claimant_id,
            allow_expired=allow_expired,
            event_payload=event_payload,
            lease_ms=lease_ms,
            namespace=namespace,
        )


# -- context streams -------------------------------------------------------------------------


class ContextBigStreamKeepsFirstValue(MemoryStorageAdapter):
    """context.stream: once a stream has more than sixteen fields, setting a field it
    already has keeps the old value."""

    async def _do_on_context_change(self, event: ContextChangeEvent) -> None:
        key = (event.namespace, event.stack_id, event.step_id)
        fields, _ = self._contexts.get(key, ({}, None))
        if event.op == "set" and event.key in fields and len(fields) > 16:
            return
        await super()._do_on_context_change(event)


# -- idempotency -----------------------------------------------------------------------------


class OwnerTokenCaseBlind(MemoryIdempotencyStore):
    """idempotency.owner: owner tokens are compared without case, so the owner's token
    upper-cased completes and fails its claim."""

    def _held_by_owner(self, key: str) -> str:
        return super()._held_by_owner(key).lower()

    async def _do_complete_owned(
        self, key: str, result: Any, ttl_ms: int | None, token: str | None
    ) -> bool:
        return await super()._do_complete_owned(
            key, result, ttl_ms, None if token is None else token.lower()
        )

    async def _do_fail_owned(
        self, key: str, error: BaseException | None, token: str | None
    ) -> bool:
        return await super()._do_fail_owned(key, error, None if token is None else token.lower())
