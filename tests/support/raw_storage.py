"""Open a backend of every built-in kind on private storage, and read back its raw bytes.

The redaction tests look for a secret in what each backend really stores: every Redis
key under the test's prefix, every row of every table of the test's PostgreSQL schema
(as the server renders it, so compressed documents are read decompressed), the SQLite
database file with its write-ahead log, and every bytes or str the memory backend holds.
Tables, rows and keys are read in a sorted order, so two reads of storage whose content
did not change compare equal (``tests/backends/test_bad_ids.py`` relies on it).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from _redis_helpers import REDIS_URL, require_redis
from sql_support import open_backend

import siglo
from siglo.backend import Backend

KINDS = ("memory", "sqlite", "postgres", "redis")


@asynccontextmanager
async def any_backend(kind: str, **options: Any) -> AsyncIterator[Backend]:
    """A backend of ``kind`` on private storage, removed afterwards."""
    if kind == "memory":
        async with siglo.connect("memory://", **options) as backend:
            yield backend
    elif kind == "sqlite":
        async with open_backend("sqlite-file", **options) as backend:
            yield backend
    elif kind == "postgres":
        async with open_backend("postgres", **options) as backend:
            yield backend
    elif kind == "redis":
        require_redis()
        from siglo_redis import isolated

        async with isolated(REDIS_URL, **options) as backend:
            yield backend
    else:  # pragma: no cover
        raise ValueError(kind)


def _memory_bytes(value: Any, seen: set[int], out: list[bytes]) -> None:
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, bytes | bytearray):
            out.append(bytes(item))
        elif isinstance(item, str):
            out.append(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            todo.extend(item)
        elif hasattr(item, "__dict__") or hasattr(item, "__slots__"):
            for name in getattr(item, "__slots__", ()):
                todo.append(getattr(item, name, None))
            todo.extend(vars(item).values() if hasattr(item, "__dict__") else ())


async def raw_bytes(kind: str, backend: Backend) -> bytes:
    """Everything ``backend`` has stored, as raw bytes (see the module docstring)."""
    adapter: Any = backend.adapter
    if kind == "memory":
        out: list[bytes] = []
        _memory_bytes([adapter, backend.idempotency, backend.lock, backend.nonces], set(), out)
        return b"\n".join(out)
    if kind == "sqlite":
        files = [Path(adapter.database.path + suffix) for suffix in ("", "-wal", "-journal")]
        return b"\n".join(f.read_bytes() for f in files if f.exists())
    if kind == "postgres":
        import psycopg
        from sql_support import POSTGRES_URL

        schema = adapter.schema
        out = []
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn:
            tables = await (
                await conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
                    " ORDER BY table_name",
                    (schema,),
                )
            ).fetchall()
            for (table,) in tables:
                # Sorted: a heap's physical order (and so an unordered SELECT's) may
                # change without any row changing, which is not what callers compare.
                rows = sorted(
                    await (
                        await conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t')
                    ).fetchall()
                )
                out.extend(row[0].encode() for row in rows)
                # bytea renders as hex: decode every \\x… run back to its bytes too.
                for (text,) in rows:
                    for match in re.finditer(r"\\x([0-9a-f]+)", text):
                        digits = match.group(1)
                        out.append(bytes.fromhex(digits[: len(digits) // 2 * 2]))
        return b"\n".join(out)
    if kind == "redis":
        import redis.asyncio

        prefix = adapter.keys.prefix
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        out = []
        try:
            # SCAN's order is the hash table's, which may change with no key changing.
            keys = sorted([key async for key in client.scan_iter(match=prefix + "*", count=1000)])
            for key in keys:
                out.append(key)
                kind_of = (await client.type(key)).decode()
                if kind_of == "string":
                    out.append(await client.get(key) or b"")
                elif kind_of == "hash":
                    for field, value in sorted((await client.hgetall(key)).items()):
                        out.extend((field, value))
                elif kind_of == "zset":
                    out.extend(await client.zrange(key, 0, -1))
                elif kind_of == "set":
                    out.extend(sorted(await client.smembers(key)))
                elif kind_of == "list":
                    out.extend(await client.lrange(key, 0, -1))
        finally:
            await client.aclose()
        return b"\n".join(out)
    raise ValueError(kind)  # pragma: no cover
