"""The raw aiosqlite baseline: one connection, WAL, the same single statements.

``journal_mode=WAL``, ``synchronous=NORMAL`` by default (durable across a process crash,
the usual setting for WAL, and siglo's default) and the other pragmas siglo's SQLite
backend sets (``busy_timeout``, ``mmap_size``, ``cache_size``), autocommit, documents as
BLOBs of orjson bytes. Every statement
is one thread hop (``execute_fetchall``), the least aiosqlite allows.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import aiosqlite
import orjson

from benchmarks import raw_sql as q
from benchmarks.payloads import now_ms, wire_document
from benchmarks.subject import Conflict, Subject

# The pragmas siglo's SQLite backend sets, so the baseline has the same file settings.
from siglo.settings import DEFAULTS
from siglo_sqlite.connections import CACHE_SIZE_KIB, MMAP_SIZE_BYTES


def _sql(stmt: str) -> str:
    return q.render(stmt, p="?", doc="BLOB")


class RawSqliteSubject(Subject):
    """aiosqlite on a private temporary database file."""

    kind = "raw"
    backend = "sqlite"

    def __init__(self, path: str | None = None, *, synchronous: str = "NORMAL") -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="siglo-bench-") if path is None else None
        self.path = path or os.path.join(self._tmp.name if self._tmp else ".", "raw.db")
        self.synchronous = synchronous
        self.detail = (
            f"aiosqlite, 1 connection, WAL + synchronous={synchronous}, "
            "siglo's mmap_size/cache_size/busy_timeout, BLOB"
        )
        self.db: aiosqlite.Connection | None = None

    async def open(self) -> None:
        self.db = await aiosqlite.connect(self.path, isolation_level=None)
        await self.db.execute(f"PRAGMA busy_timeout = {DEFAULTS.busy_timeout_ms}")
        await self.db.execute("PRAGMA journal_mode=WAL")
        await self.db.execute(f"PRAGMA synchronous={self.synchronous}")
        await self.db.execute(f"PRAGMA mmap_size = {MMAP_SIZE_BYTES}")
        await self.db.execute(f"PRAGMA cache_size = -{CACHE_SIZE_KIB}")
        for stmt in q.SCHEMA:
            await self.db.execute(_sql(stmt))

    async def close(self) -> None:
        if self.db is not None:
            await self.db.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def _rows(self, stmt: str, params: tuple[Any, ...]) -> list[Any]:
        assert self.db is not None
        return list(await self.db.execute_fetchall(stmt, params))

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
            rows = await self._rows(_SAVE_PLAIN, (stack_id, revision, doc, expires_at, now))
        elif expected_revision == 0:
            rows = await self._rows(_SAVE_ZERO, (stack_id, revision, doc, expires_at, now))
        else:
            rows = await self._rows(
                _SAVE_EXPECTED, (revision, doc, expires_at, stack_id, expected_revision, now)
            )
        if not rows:
            raise Conflict

    async def load(self, stack_id: str) -> int | None:
        rows = await self._rows(_LOAD, (stack_id, now_ms()))
        if not rows:
            return None
        revision: int = orjson.loads(rows[0][0])["revision"]
        return revision

    async def clean_expired(self) -> int:
        assert self.db is not None
        cur = await self.db.execute(_CLEAN, (now_ms(),))
        count = cur.rowcount
        await cur.close()
        return count

    async def put_wait(self, key: str, stack_id: str) -> None:
        doc = {
            "correlationKey": key,
            "stackId": stack_id,
            "status": "waiting",
            "createdAt": now_ms(),
        }
        await self._rows(_PUT_WAIT, (key, stack_id, orjson.dumps(doc)))

    async def claim_wait(self, key: str, claimant: str) -> bool:
        now = now_ms()
        rows = await self._rows(
            _CLAIM_WAIT, (claimant, now + 60_000, orjson.dumps({"approved": True}), key, now, now)
        )
        if not rows:
            return False
        orjson.loads(rows[0][0])
        return True

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        now = now_ms()
        assert await self._rows(_IDEM_CLAIM, (key, now + 86_400_000, now))
        await self._rows(_IDEM_COMPLETE, (orjson.dumps(result), now + 86_400_000, key))

    async def lock_pair(self, key: str) -> None:
        token = f"lock_{now_ms()}_{uuid.uuid4().hex}"
        now = now_ms()
        assert await self._rows(_LOCK_ACQUIRE, (key, token, now + 10_000, now))
        now = now_ms()
        assert await self._rows(_LOCK_RELEASE, (now, key, token, now))

    async def cache_set_get(self, key: str, value: Any) -> None:
        now = now_ms()
        await self._rows(_CACHE_SET, (key, orjson.dumps(value), now + 300_000))
        rows = await self._rows(_CACHE_GET, (key, now))
        orjson.loads(rows[0][0])


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
