"""Idempotency store, lock and nonce store on SQL tables (seed 001 §6–§8).

Claims go through the primary key: one conditional upsert decides the winner, so two
processes can never both win. Locks are lease rows (owner token, expiry, fencing
counter), not session advisory locks, which break behind a transaction-pooling
PgBouncer. Every expiry compares with the injected clock's ``now``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from siglo import codec
from siglo.clock import Clock, clock_or_system
from siglo.coordination import (
    IdempotencyStoreBase,
    LockBase,
    LockResult,
    LockState,
    NonceStoreBase,
    OwnedClaimReply,
    holder_label,
    new_lock_token,
)
from siglo.errors import StorageAdapterError
from siglo.payloads import StoredPayload
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.validation import require_ttl_ms
from siglo_sql.database import Database
from siglo_sql.keys import at_most, row_id
from siglo_sql.statements import Statements

__all__ = ["SqlIdempotencyStore", "SqlLock", "SqlNonceStore"]


class SqlIdempotencyStore(IdempotencyStoreBase):
    """States as in Redis: ``in-progress`` while claimed, ``completed`` with a result.

    An owned claim's token is in the row's ``owner`` column, a fingerprint's digest in
    ``fingerprint`` (schema version 5). ``claim``, ``complete`` and ``fail`` decide in one
    conditional statement each.
    """

    def __init__(
        self,
        database: Database,
        statements: Statements,
        *,
        clock: Clock | None = None,
        default_ttl_ms: int = DEFAULTS.idempotency_ttl_ms,
        default_lease_ms: int = DEFAULTS.idempotency_lease_ms,
    ) -> None:
        self.default_ttl_ms = require_ttl_ms("default_ttl_ms", default_ttl_ms)
        self.default_lease_ms = require_ttl_ms("default_lease_ms", default_lease_ms)
        self.clock: Clock = clock_or_system(clock)
        self._db = database
        self._s = statements

    async def _do_claim_owned(
        self, key: str, ttl_ms: int | None, token: str | None, fingerprint: str | None
    ) -> OwnedClaimReply:
        lease = ttl_ms or self._default_claim_ms(token)
        rid = row_id(key)
        for _ in range(100):
            now = self.clock.now_ms()
            params = {
                "id": rid,
                "key": key,
                "gone_at": at_most(now + lease),
                "now": now,
                "owner": token,
                "fingerprint": fingerprint,
            }
            if await self._db.write(self._s.idem_claim, params):
                return "claimed"
            rows = await self._db.read(self._s.idem_state, {"id": rid, "now": now})
            if rows:
                state, stored = rows[0][0], rows[0][1]
                if fingerprint and stored and stored != fingerprint:
                    return "mismatch"
                return "completed" if state == "completed" else "in-progress"
            # The holder failed (deleting its key) between our two statements: claim again.
        raise StorageAdapterError(f"idempotency key {key!r}: no stable state after 100 tries")

    async def _do_complete_owned(
        self, key: str, result: Any, ttl_ms: int | None, token: str | None
    ) -> bool:
        data = codec.dumps(result, what=f"result of {key!r}")
        now = self.clock.now_ms()
        gone_at = at_most(now + (ttl_ms or self.default_ttl_ms))
        params: dict[str, Any] = {"id": row_id(key), "result": data, "gone_at": gone_at, "now": now}
        if token is None:
            return bool(await self._db.write(self._s.idem_complete, {**params, "key": key}))
        return bool(await self._db.write(self._s.idem_complete_owned, {**params, "owner": token}))

    async def _do_fail_owned(
        self, key: str, error: BaseException | None, token: str | None
    ) -> bool:
        params: dict[str, Any] = {"id": row_id(key), "now": self.clock.now_ms()}
        if token is not None:
            return bool(await self._db.write(self._s.idem_fail_owned, {**params, "owner": token}))
        if await self._db.write(self._s.idem_fail, params):
            return True
        # Nothing freed: fine (the seed's fail) unless an owned claim holds the key. This
        # read only decides whether to report; the delete above already decided the change.
        return not await self._db.read(self._s.idem_owned, params)

    async def _do_extend(self, key: str, token: str, ttl_ms: int) -> bool:
        now = self.clock.now_ms()
        params = {"id": row_id(key), "owner": token, "gone_at": at_most(now + ttl_ms), "now": now}
        return bool(await self._db.write(self._s.idem_extend, params))

    async def _do_get_result(self, key: str) -> Any | Missing:
        rows = await self._db.read(
            self._s.idem_result, {"id": row_id(key), "now": self.clock.now_ms()}
        )
        if not rows:
            return MISSING
        return codec.loads(rows[0][0], what="idempotency result")

    async def _do_scan_results(self) -> AsyncIterator[StoredPayload]:
        after, page = b"", 500
        while True:
            params = {"after": after, "now": self.clock.now_ms(), "limit": page}
            rows = await self._db.fetch(self._s.idem_scan, params)
            for row_key, key, data in rows:
                stored = bytes(data)
                result = {"result": codec.loads(stored, what="idempotency result")}
                yield StoredPayload("idempotency", key, None, result, (bytes(row_key), stored))
            if len(rows) < page:
                return
            after = bytes(rows[-1][0])

    async def _do_swap_result(self, item: StoredPayload, result: Any) -> bool:
        row, stored = item.token
        params = {
            "id": row,
            "result": codec.dumps(result, what=f"result of {item.key!r}"),
            "old_result": stored,
            "now": self.clock.now_ms(),
        }
        return bool(await self._db.write(self._s.idem_swap, params))


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
        self.clock: Clock = clock_or_system(clock)
        self.scope = scope
        self._db = database
        self._s = statements

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        now = self.clock.now_ms()
        token = custom_token or new_lock_token(now)
        rows = await self._db.write(
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

    def release_statement(self, lock_key: str, token: str) -> tuple[str, dict[str, Any]]:
        """The release of ``lock_key`` held with ``token``: its SQL and parameters (sent
        alone by :meth:`release`, or with an action's last write)."""
        params = {"id": row_id(self.scope, lock_key), "token": token, "now": self.clock.now_ms()}
        return self._s.lock_release, params

    async def _do_release(self, lock_key: str, token: str) -> bool:
        return bool(await self._db.write(*self.release_statement(lock_key, token)))

    async def _do_inspect(self, lock_key: str) -> LockState | None:
        rows = await self._db.read(
            self._s.lock_inspect, {"id": row_id(self.scope, lock_key), "now": self.clock.now_ms()}
        )
        if not rows:
            return None
        token, remaining, fence = rows[0]
        return LockState(holder_label(str(token)), int(remaining), int(fence))

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        now = self.clock.now_ms()
        rows = await self._db.write(
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
        self.clock: Clock = clock_or_system(clock)
        self._db = database
        self._s = statements

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        now = self.clock.now_ms()
        gone_at = at_most(now + ttl_ms)
        params = {"id": row_id(key), "key": key, "gone_at": gone_at, "now": now}
        return bool(await self._db.write(self._s.nonce_claim, params))
