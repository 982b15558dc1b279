"""The raw psycopg 3 baseline: a connection pool and prepared statements.

One statement per operation (see :mod:`benchmarks.raw_sql`), ``prepare=True`` so each is
parsed and planned once per connection, binary results (as siglo's backend), autocommit
(each statement is its own transaction, as a single-statement compare-and-set needs no
more), orjson for JSON.
The data lives in a private schema that is dropped afterwards.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool

from benchmarks import raw_sql as q
from benchmarks.payloads import now_ms, wire_document
from benchmarks.subject import Conflict, Subject

DOC_TYPES = ("jsonb", "text", "bytea")
COMPRESSIONS = ("lz4", "pglz")


def _sql(stmt: str, doc_type: str = "jsonb") -> str:
    return q.render(stmt, p="%s", doc=doc_type.upper())


class RawPostgresSubject(Subject):
    """psycopg 3 (binary) with a ``psycopg_pool.AsyncConnectionPool`` of ``pool_size``."""

    kind = "raw"
    backend = "postgres"

    def __init__(
        self, url: str, *, pool_size: int = 10, doc_type: str = "jsonb", compression: str = "lz4"
    ) -> None:
        if doc_type not in DOC_TYPES:
            raise ValueError(f"doc_type must be one of {DOC_TYPES}, got {doc_type!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.url = url
        self.pool_size = pool_size
        self.doc_type = doc_type
        self.compression = compression
        self.schema = f"siglo_bench_{secrets.token_hex(4)}"
        self.detail = (
            f"psycopg 3 pool({pool_size}), prepared, binary, {doc_type.upper()} documents "
            f"({compression}), orjson"
        )
        self.pool: AsyncConnectionPool[Any] | None = None

    async def open(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(f'CREATE SCHEMA "{self.schema}"')
            await conn.execute(f'SET search_path TO "{self.schema}"')
            for stmt in q.SCHEMA:
                await conn.execute(_sql(stmt, self.doc_type).encode())
            if self.compression == "lz4":
                # As siglo's schema does where the server has lz4 (else pglz, the default).
                cur = await conn.execute(
                    "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' "
                    "AND 'lz4' = ANY (enumvals)"
                )
                if await cur.fetchone():
                    for table, column in q.DOCUMENT_COLUMNS:
                        alter = f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4"
                        await conn.execute(alter.encode())
                else:
                    self.detail = self.detail.replace("(lz4)", "(pglz: no lz4 on the server)")

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            set_json_loads(orjson.loads, conn)
            set_json_dumps(orjson.dumps, conn)

        self.pool = AsyncConnectionPool(
            self.url,
            min_size=self.pool_size,
            max_size=self.pool_size,
            kwargs={"autocommit": True, "options": f"-c search_path={self.schema}"},
            configure=configure,
            open=False,
        )
        await self.pool.open(wait=True)

    async def server_version(self) -> str | None:
        row = await self._one("SELECT current_setting('server_version')", ())
        return f"PostgreSQL {row[0]}" if row else None

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def _doc(self, value: Any) -> Any:
        """``value`` as a parameter of the document column's type (encoded once)."""
        if self.doc_type == "jsonb":
            return Jsonb(value)  # encoded by the orjson dumps set in configure()
        data = orjson.dumps(value)
        return data.decode() if self.doc_type == "text" else data

    def _decode(self, column: Any) -> Any:
        return column if self.doc_type == "jsonb" else orjson.loads(column)

    async def _one(self, stmt: str, params: tuple[Any, ...]) -> Any:
        assert self.pool is not None
        async with self.pool.connection() as conn:
            # Binary results, as siglo's backend reads them: a BYTEA document arrives as
            # its bytes, not as hex text of twice the size to decode.
            cur = await conn.execute(stmt, params, prepare=True, binary=True)
            return await cur.fetchone() if cur.description is not None else None

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        doc = self._doc(wire_document(stack_id, revision, contexts, expires_at=expires_at))
        now = now_ms()
        if expected_revision is None:
            row = await self._one(_SAVE_PLAIN, (stack_id, revision, doc, expires_at, now))
        elif expected_revision == 0:
            row = await self._one(_SAVE_ZERO, (stack_id, revision, doc, expires_at, now))
        else:
            row = await self._one(
                _SAVE_EXPECTED, (revision, doc, expires_at, stack_id, expected_revision, now)
            )
        if row is None:
            raise Conflict

    async def load(self, stack_id: str) -> int | None:
        row = await self._one(_LOAD, (stack_id, now_ms()))
        if row is None:
            return None
        revision: int = self._decode(row[0])["revision"]
        return revision

    async def clean_expired(self) -> int:
        assert self.pool is not None
        async with self.pool.connection() as conn:
            cur = await conn.execute(_CLEAN, (now_ms(),))
            count: int = cur.rowcount
            return count

    async def put_wait(self, key: str, stack_id: str) -> None:
        doc = {
            "correlationKey": key,
            "stackId": stack_id,
            "status": "waiting",
            "createdAt": now_ms(),
        }
        await self._one(_PUT_WAIT, (key, stack_id, self._doc(doc)))

    async def claim_wait(self, key: str, claimant: str) -> bool:
        now = now_ms()
        row = await self._one(
            _CLAIM_WAIT, (claimant, now + 60_000, self._doc({"approved": True}), key, now, now)
        )
        if row is None:
            return False
        self._decode(row[0])
        return True

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        now = now_ms()
        row = await self._one(_IDEM_CLAIM, (key, now + 86_400_000, now))
        assert row is not None
        await self._one(_IDEM_COMPLETE, (self._doc(result), now + 86_400_000, key))

    async def lock_pair(self, key: str) -> None:
        token = f"lock_{now_ms()}_{uuid.uuid4().hex}"
        now = now_ms()
        row = await self._one(_LOCK_ACQUIRE, (key, token, now + 10_000, now))
        assert row is not None
        now = now_ms()
        assert await self._one(_LOCK_RELEASE, (now, key, token, now)) is not None

    async def cache_set_get(self, key: str, value: Any) -> None:
        now = now_ms()
        await self._one(_CACHE_SET, (key, self._doc(value), now + 300_000))
        row = await self._one(_CACHE_GET, (key, now))
        assert row is not None
        self._decode(row[0])


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
