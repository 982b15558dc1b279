"""The floor for ``memory://``: a dict of orjson bytes with the same checks.

No driver sits under the memory backend, so its "raw" baseline is the least work the
contract needs in-process: encode once, compare the stored revision, keep bytes, decode
on load. siglo / this ratio is therefore siglo's own Python overhead, undiluted by I/O.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from benchmarks.payloads import now_ms, wire_document
from benchmarks.subject import Conflict, Subject


class RawMemorySubject(Subject):
    """A dict: ``stack_id -> (revision, expires_at, bytes)``."""

    kind = "raw"
    backend = "memory"
    detail = "dict + orjson"

    def __init__(self) -> None:
        self._cps: dict[str, tuple[int, int | None, bytes]] = {}
        self._waits: dict[str, tuple[str, bytes]] = {}
        self._idem: dict[str, tuple[bytes, int]] = {}
        self._locks: dict[str, tuple[str, int]] = {}
        self._cache: dict[str, tuple[bytes, int]] = {}

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        data = orjson.dumps(wire_document(stack_id, revision, contexts, expires_at=expires_at))
        now = now_ms()
        stored = self._cps.get(stack_id)
        if stored is not None and stored[1] is not None and stored[1] <= now:
            stored = None
        if expected_revision is not None:
            if (0 if stored is None else stored[0]) != expected_revision:
                raise Conflict
        elif stored is not None and revision <= stored[0]:
            raise Conflict
        self._cps[stack_id] = (revision, expires_at, data)

    async def load(self, stack_id: str) -> int | None:
        stored = self._cps.get(stack_id)
        if stored is None or (stored[1] is not None and stored[1] <= now_ms()):
            return None
        revision: int = orjson.loads(stored[2])["revision"]
        return revision

    async def clean_expired(self) -> int:
        now = now_ms()
        gone = [k for k, v in self._cps.items() if v[1] is not None and v[1] <= now]
        for k in gone:
            del self._cps[k]
        return len(gone)

    async def put_wait(self, key: str, stack_id: str) -> None:
        doc = {"correlationKey": key, "stackId": stack_id, "status": "waiting"}
        self._waits[key] = ("waiting", orjson.dumps(doc))

    async def claim_wait(self, key: str, claimant: str) -> bool:
        stored = self._waits.get(key)
        if stored is None or stored[0] != "waiting":
            return False
        doc = orjson.loads(stored[1])
        doc.update(status="claimed", claimantId=claimant, eventPayload={"approved": True})
        self._waits[key] = ("claimed", orjson.dumps(doc))
        return True

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        now = now_ms()
        assert key not in self._idem
        self._idem[key] = (b"in-progress", now + 86_400_000)
        self._idem[key] = (b"COMPLETED:" + orjson.dumps(result), now + 86_400_000)

    async def lock_pair(self, key: str) -> None:
        now = now_ms()
        held = self._locks.get(key)
        assert held is None or held[1] <= now
        token = f"lock_{now}_{secrets.token_hex(16)}"
        self._locks[key] = (token, now + 10_000)
        if self._locks[key][0] == token:
            del self._locks[key]

    async def cache_set_get(self, key: str, value: Any) -> None:
        now = now_ms()
        self._cache[key] = (orjson.dumps(value), now + 300_000)
        data, gone = self._cache[key]
        assert gone > now_ms() - 1
        orjson.loads(data)
