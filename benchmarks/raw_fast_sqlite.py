"""The raw-fast SQLite baseline: stdlib ``sqlite3`` inline on the event loop's thread.

What a competent user writes without a thread hop per statement: one connection opened
with the same pragmas as :mod:`benchmarks.raw_sqlite` (WAL, ``synchronous``,
``busy_timeout``, ``mmap_size``, ``cache_size``), autocommit, the same single statements
(:mod:`benchmarks.raw_sql`), each prepared once and reused from the connection's
statement cache. Every call runs to its end without yielding the event loop, so callers
never overlap (a compare-and-set's load and save are never interleaved with another
caller's) and no other coroutine runs meanwhile: the loop-lag probe
(:mod:`benchmarks.loop_lag`) measures what that costs.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import uuid
from typing import Any

import orjson

from benchmarks import raw_sql as q
from benchmarks.payloads import now_ms, wire_document
from benchmarks.subject import Conflict, Subject
from siglo.settings import DEFAULTS
from siglo_sqlite.connections import CACHE_SIZE_KIB, MMAP_SIZE_BYTES


def _sql(stmt: str) -> str:
    return q.render(stmt, p="?", doc="BLOB")


class RawFastSqliteSubject(Subject):
    """``sqlite3`` on the loop's thread, on a private database file."""

    kind = "raw-fast"
    backend = "sqlite"

    def __init__(self, path: str | None = None, *, synchronous: str = "NORMAL") -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="siglo-bench-") if path is None else None
        self.path = path or os.path.join(self._tmp.name if self._tmp else ".", "raw-fast.db")
        self.synchronous = synchronous
        self.detail = (
            f"sqlite3 inline on the loop's thread, 1 connection, WAL + synchronous={synchronous}, "
            "siglo's mmap_size/cache_size/busy_timeout, statements prepared once, BLOB"
        )
        self.db: sqlite3.Connection | None = None

    async def open(self) -> None:
        # Statement cache larger than the statements used, so each is prepared once.
        self.db = sqlite3.connect(self.path, isolation_level=None, cached_statements=256)
        for pragma in (
            f"busy_timeout = {DEFAULTS.busy_timeout_ms}",
            "journal_mode = WAL",
            f"synchronous = {self.synchronous}",
            f"mmap_size = {MMAP_SIZE_BYTES}",
            f"cache_size = -{CACHE_SIZE_KIB}",
        ):
            self.db.execute(f"PRAGMA {pragma}")
        for stmt in q.SCHEMA:
            self.db.execute(_sql(stmt))

    async def close(self) -> None:
        if self.db is not None:
            self.db.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _one(self, stmt: str, params: tuple[Any, ...]) -> Any:
        assert self.db is not None
        # fetchall: the statement runs to its end and is reset, so its autocommit
        # transaction is over (a RETURNING statement left mid-way holds the write lock).
        rows = self.db.execute(stmt, params).fetchall()
        return rows[0] if rows else None

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        doc = orjson.dumps(wire_document(stack_id, revision, contexts, expires_at=expires_at))
        now = now_ms()
        if expected_revision is None:
            row = self._one(_SAVE_PLAIN, (stack_id, revision, doc, expires_at, now))
        elif expected_revision == 0:
            row = self._one(_SAVE_ZERO, (stack_id, revision, doc, expires_at, now))
        else:
            row = self._one(
                _SAVE_EXPECTED, (revision, doc, expires_at, stack_id, expected_revision, now)
            )
        if row is None:
            raise Conflict

    async def load(self, stack_id: str) -> int | None:
        row = self._one(_LOAD, (stack_id, now_ms()))
        if row is None:
            return None
        revision: int = orjson.loads(row[0])["revision"]
        return revision

    async def clean_expired(self) -> int:
        assert self.db is not None
        return self.db.execute(_CLEAN, (now_ms(),)).rowcount

    async def put_wait(self, key: str, stack_id: str) -> None:
        doc = {"correlationKey": key, "stackId": stack_id, "status": "waiting"}
        self._one(_PUT_WAIT, (key, stack_id, orjson.dumps({**doc, "createdAt": now_ms()})))

    async def claim_wait(self, key: str, claimant: str) -> bool:
        now = now_ms()
        row = self._one(
            _CLAIM_WAIT, (claimant, now + 60_000, orjson.dumps({"approved": True}), key, now, now)
        )
        if row is None:
            return False
        orjson.loads(row[0])
        return True

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        now = now_ms()
        assert self._one(_IDEM_CLAIM, (key, now + 86_400_000, now)) is not None
        self._one(_IDEM_COMPLETE, (orjson.dumps(result), now + 86_400_000, key))

    async def lock_pair(self, key: str) -> None:
        token = f"lock_{now_ms()}_{uuid.uuid4().hex}"
        now = now_ms()
        assert self._one(_LOCK_ACQUIRE, (key, token, now + 10_000, now)) is not None
        now = now_ms()
        assert self._one(_LOCK_RELEASE, (now, key, token, now)) is not None

    async def cache_set_get(self, key: str, value: Any) -> None:
        now = now_ms()
        self._one(_CACHE_SET, (key, orjson.dumps(value), now + 300_000))
        row = self._one(_CACHE_GET, (key, now))
        assert row is not None
        orjson.loads(row[0])


_SAVE_PLAIN = _sql(q.SAVE_PLAIN)
_SAVE_ZERO = _sql(q.SAVE_EXPECTED_ZERO)
_SAVE_EXPECTED = _sql(q.SAVE_EXPECTED)
_LOAD = _sql(q.LOAD)
_CLEAN = _sql(q.CLEAN)
_PUT_WAIT = _sql(q.PUT_WAIT)
_CLAIM_WAIT = _sql(q.CLAIM_WAIT)
_IDEM_CLAIM = _sql(q.IDEM_CLAIM)
_IDEM_COMPLETE = _sql(q.IDEM_COMPLETE)
_LOCK_ACQUIRE = _sql(q.LOCK_ACQUIRE)
_LOCK_RELEASE = _sql(q.LOCK_RELEASE)
_CACHE_SET = _sql(q.CACHE_SET)
_CACHE_GET = _sql(q.CACHE_GET)
