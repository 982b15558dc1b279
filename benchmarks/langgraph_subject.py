"""LangGraph's checkpoint savers, as an optional comparison (``pip install -e '.[bench]'``).

A siglo checkpoint's contexts become one LangGraph channel, ``contexts``, whose version
is the revision; a save is ``aput`` of a new checkpoint id, a load ``aget_tuple`` of the
thread's latest. LangGraph has no compare-and-set, so the CAS workload is not run for it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from typing import Any

from benchmarks.subject import Subject


class LangGraphSubject(Subject):
    """``AsyncSqliteSaver`` (``backend="sqlite"``) or ``AsyncPostgresSaver`` (``"postgres"``)."""

    kind = "langgraph"

    def __init__(
        self, backend: str, url: str | None = None, *, sqlite_synchronous: str = "NORMAL"
    ) -> None:
        self.backend = backend
        self.sqlite_synchronous = sqlite_synchronous
        self.url = url
        self._stack = contextlib.AsyncExitStack()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.schema = f"siglo_bench_lg_{secrets.token_hex(4)}"
        self.saver: Any = None

    async def open(self) -> None:
        from langgraph.checkpoint.base.id import uuid6

        self._uuid6 = uuid6
        if self.backend == "sqlite":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            self._tmp = tempfile.TemporaryDirectory(prefix="siglo-bench-lg-")
            path = os.path.join(self._tmp.name, "lg.db")
            self.saver = await self._stack.enter_async_context(
                AsyncSqliteSaver.from_conn_string(path)
            )
            await self.saver.setup()
            # The saver leaves SQLite's default, synchronous=FULL (an fsync per commit);
            # the comparison is at the durability siglo and the raw baseline run with.
            await self.saver.conn.execute(f"PRAGMA synchronous={self.sqlite_synchronous}")
            self.detail = (
                f"langgraph AsyncSqliteSaver (one lock), WAL + synchronous="
                f"{self.sqlite_synchronous} (set by the benchmark; the saver's default is FULL)"
            )
        elif self.backend == "postgres":
            import psycopg
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            assert self.url is not None
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                await conn.execute(f'CREATE SCHEMA "{self.schema}"')
            sep = "&" if "?" in self.url else "?"
            conninfo = f"{self.url}{sep}options=-csearch_path%3D{self.schema}"
            self.saver = await self._stack.enter_async_context(
                AsyncPostgresSaver.from_conn_string(conninfo)
            )
            await self.saver.setup()
            self.detail = "langgraph AsyncPostgresSaver (one connection, one lock)"
        else:
            raise NotImplementedError(self.backend)

    async def close(self) -> None:
        await self._stack.aclose()
        if self._tmp is not None:
            self._tmp.cleanup()
        if self.backend == "postgres":
            import psycopg

            assert self.url is not None
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    @staticmethod
    def _config(stack_id: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": stack_id, "checkpoint_ns": ""}}

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        if expected_revision is not None or expires_at is not None:
            raise NotImplementedError  # no compare-and-set, no expiry
        from datetime import UTC, datetime

        checkpoint = {
            "v": 4,
            "id": str(self._uuid6(clock_seq=revision)),
            "ts": datetime.now(UTC).isoformat(),
            "channel_values": {"contexts": contexts},
            "channel_versions": {"contexts": revision},
            "versions_seen": {},
            "pending_sends": [],
            "updated_channels": ["contexts"],
        }
        await self.saver.aput(
            self._config(stack_id), checkpoint, {"step": revision}, {"contexts": revision}
        )

    async def load(self, stack_id: str) -> int | None:
        found = await self.saver.aget_tuple(self._config(stack_id))
        if found is None:
            return None
        revision: int = found.checkpoint["channel_versions"]["contexts"]
        return revision
