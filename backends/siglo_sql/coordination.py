"""Idempotency store, lock and nonce store on SQL tables (seed 001 §6–§8).

Claims go through the primary key: one conditional upsert decides the winner, so two
processes can never both win. Locks are lease rows (owner token, expiry, fencing
counter), not session advisory locks, which break behind a transaction-pooling
PgBouncer. Every expiry compares with the injected clock's ``now``.
"""

from __future__ import annotations

from typing import Any

from siglo import codec
from siglo.clock import Clock, system_clock
from siglo.coordination import (
    ClaimState,
    IdempotencyStoreBase,
    LockBase,
    LockResult,
    NonceStoreBase,
    new_lock_token,
)
from siglo.errors import StorageAdapterError
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.validation import require_ttl_ms
from siglo_sql.database import Database
from siglo_sql.keys import at_most, row_id
from siglo_sql.statements import Statements

__all__ = ["SqlIdempotencyStore", "SqlLock", "SqlNonceStore"]


class SqlIdempotencyStore(IdempotencyStoreBase):
    """States as in Redis: ``in-progress`` while claimed, ``completed`` with a result."""

    def __init__(
        self,
        database: Database,
        statements: Statements,
        *,
        clock: Clock | None = None,
        default_ttl_ms: int = DEFAULTS.idempotency_ttl_ms,
    ) -> None:
        self.default_ttl_ms = require_ttl_ms("default_ttl_ms", default_ttl_ms)
        self.clock: Clock = clock or system_clock
        self._db = database
        self._s = statements

    async def _do_claim(self, key: str, ttl_ms: int | None) -> ClaimState:
        ttl = ttl_ms or self.default_ttl_ms
        rid = row_id(key)
        for _ in range(100):
            now = self.clock.now_ms()
            params = {"id": rid, "key": key, "gone_at": at_most(now + ttl), "now": now}
            if await self._db.fetch(self._s.idem_claim, params):
                return "claimed"
            rows = await self._db.fetch(self._s.idem_state, params)
            if rows:
                return "completed" if rows[0][0] == "completed" else "in-progress"
            # The holder failed (deleting its key) between our two statements: claim again.
        raise StorageAdapterError(f"idempotency key {key!r}: no stable state after 100 tries")

    async def _do_complete(self, key: str, result: Any, ttl_ms: int | None) -> None:
        data = codec.dumps(result, what=f"result of {key!r}")
        gone_at = at_most(self.clock.now_ms() + (ttl_ms or self.default_ttl_ms))
        await self._db.fetch(
            self._s.idem_complete,
            {"id": row_id(key), "key": key, "result": data, "gone_at": gone_at},
        )

    async def _do_fail(self, key: str, error: BaseException | None) -> None:
        await self._db.fetch(self._s.idem_fail, {"id": row_id(key), "now": self.clock.now_ms()})

    async def _do_get_result(self, key: str) -> Any | Missing:
        rows = await self._db.fetch(
            self._s.idem_result, {"id": row_id(key), "now": self.clock.now_ms()}
        )
        if not rows:
            return MISSING
        return codec.loads(rows[0][0], what="idempotency result")


class SqlLock(LockBase):
    """Token-checked lease rows with a TTL and a fencing counter per key.

    ``scope`` separates independent lock spaces in one table (``"lock"`` for this
    public lock, ``"workflow"`` for the adapter's workflow locks).
    """

    def __init__(
        self,
        database: Database,
        statements: Statements,
        *,
        clock: Clock | None = None,
        scope: str = "lock",
    ) -> None:
        self.clock: Clock = clock or system_clock
        self.scope = scope
        self._db = database
        self._s = statements

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        now = self.clock.now_ms()
        token = custom_token or new_lock_token(now)
        rows = await self._db.fetch(
            self._s.lock_acquire,
            {
                "id": row_id(self.scope, lock_key),
                "scope": self.scope,
                "key": lock_key,
                "token": token,
                "gone_at": at_most(now + ttl_ms),
                "now": now,
            },
        )
        if not rows:
            return LockResult(acquired=False, token=token)
        return LockResult(acquired=True, token=token, fencing_token=int(rows[0][0]))

    async def _do_release(self, lock_key: str, token: str) -> bool:
        rows = await self._db.fetch(
            self._s.lock_release,
            {"id": row_id(self.scope, lock_key), "token": token, "now": self.clock.now_ms()},
        )
        return bool(rows)

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        now = self.clock.now_ms()
        rows = await self._db.fetch(
            self._s.lock_extend,
            {
                "id": row_id(self.scope, lock_key),
                "token": token,
                "gone_at": at_most(now + ttl_ms),
                "now": now,
            },
        )
        return bool(rows)


class SqlNonceStore(NonceStoreBase):
    """First claim of a key within its window wins; later ones are replays."""

    def __init__(
        self, database: Database, statements: Statements, *, clock: Clock | None = None
    ) -> None:
        self.clock: Clock = clock or system_clock
        self._db = database
        self._s = statements

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        now = self.clock.now_ms()
        gone_at = at_most(now + ttl_ms)
        params = {"id": row_id(key), "key": key, "gone_at": gone_at, "now": now}
        return bool(await self._db.fetch(self._s.nonce_claim, params))
