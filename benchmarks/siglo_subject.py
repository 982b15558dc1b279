"""siglo itself, on any registered backend, through its public API."""

from __future__ import annotations

import contextlib
from typing import Any

import siglo
from benchmarks.payloads import now_ms
from benchmarks.subject import Conflict, Subject
from siglo.backend import Backend
from siglo.checkpoint import Checkpoint
from siglo.errors import CheckpointConflictError
from siglo.plugins import get_registry
from siglo.records import WaitRecord


class SigloSubject(Subject):
    """A :class:`siglo.Backend` opened from ``url``.

    When the backend declares an isolation factory (own key prefix, schema …) it is used,
    so a run never touches data it did not create; otherwise :func:`siglo.connect`.
    """

    kind = "siglo"

    def __init__(self, backend: str, url: str, **options: Any) -> None:
        self.backend = backend
        self.url = url
        self.options = options
        self._stack = contextlib.AsyncExitStack()
        self._b: Backend | None = None

    @property
    def b(self) -> Backend:
        assert self._b is not None, "open() first"
        return self._b

    async def open(self) -> None:
        spec = get_registry().for_url(self.url)
        isolated = spec.load_isolated()
        if isolated is not None:
            self._b = await self._stack.enter_async_context(isolated(self.url, **self.options))
            self.detail = f"siglo.{spec.name} (isolated)"
        else:
            self._b = siglo.connect(self.url, **self.options)
            self._stack.push_async_callback(self._b.aclose)
            self.detail = f"siglo.{spec.name}"

    async def close(self) -> None:
        await self._stack.aclose()

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        checkpoint = Checkpoint(
            stack_id=stack_id,
            revision=revision,
            timestamp=now_ms(),
            contexts=contexts,
            expires_at=expires_at,
        )
        try:
            await self.b.adapter.save_checkpoint(checkpoint, expected_revision=expected_revision)
        except CheckpointConflictError as exc:
            raise Conflict from exc

    async def load(self, stack_id: str) -> int | None:
        checkpoint = await self.b.adapter.get_checkpoint(stack_id)
        return None if checkpoint is None else checkpoint.revision

    async def clean_expired(self) -> int:
        return await self.b.adapter.clean_expired_checkpoints()

    async def put_wait(self, key: str, stack_id: str) -> None:
        record = WaitRecord(correlation_key=key, stack_id=stack_id, created_at=now_ms())
        await self.b.adapter.save_wait_record(record)

    async def claim_wait(self, key: str, claimant: str) -> bool:
        claimed = await self.b.adapter.claim_wait_record(
            key, claimant, event_payload={"approved": True}
        )
        return claimed is not None

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        store = self.b.idempotency
        if store is None:
            raise NotImplementedError
        state = await store.claim(key)
        assert state == "claimed", state
        await store.complete(key, result)

    async def lock_pair(self, key: str) -> None:
        lock = self.b.lock
        if lock is None:
            raise NotImplementedError
        held = await lock.acquire(key, 10_000)
        assert held.acquired
        assert await lock.release(key, held.token)

    async def cache_set_get(self, key: str, value: Any) -> None:
        await self.b.adapter.set_cached_step(key, value)
        got = await self.b.adapter.get_cached_step(key)
        assert got is not siglo.MISSING
