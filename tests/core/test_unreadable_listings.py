"""A listing leaves out a record it cannot read and goes on with the others
(siglo.unreadable): on every path that lists — the due waits (the SQL page, Redis's
deadline index, the pipeline's decryption), a filtered listing, Redis's `siglo clean`
— the record is named to the caller's collector, else logged, and nothing stored
changes. (The worker and `siglo ls` on Redis: tests/workflows/test_worker_unreadable_runs.py.)
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sqlite3
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from ops_support import shared_store

import siglo
from siglo import Checkpoint, WaitRecord
from siglo.cli import cli
from siglo.clock import system_clock
from siglo.config import Settings
from siglo.errors import DecryptionError, MalformedRecordError
from siglo.pipeline import Pipeline, PipelineAdapter, pipeline_parts
from siglo.unreadable import collecting_unreadable

NOT_A_RECORD = b'{"neither": "a wait record nor a checkpoint"}'


def _piped(backend: siglo.Backend, key_id: str) -> PipelineAdapter:
    key = base64.b64encode(os.urandom(32)).decode()
    settings = Settings(encryption_keys={key_id: key})
    adapter, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
    assert isinstance(adapter, PipelineAdapter)
    return adapter


def _wait(key: str, expires_at: int, **more: Any) -> WaitRecord:
    return WaitRecord(
        correlation_key=key, stack_id=f"s-{key}", step_id="approve", expires_at=expires_at, **more
    )


async def _overwrite_wait(backend: siglo.Backend, kind: str, key: str) -> None:
    """The stored document of wait ``key``, replaced past siglo by JSON that is no wait."""
    if kind == "sqlite":
        raw = sqlite3.connect(urlsplit(backend.url).path)
        with raw:
            changed = raw.execute(
                "UPDATE siglo_wait_records SET document = ? WHERE correlation_key = ?",
                (NOT_A_RECORD, key),
            ).rowcount
        raw.close()
        assert changed == 1
        return
    import redis.asyncio as redis

    client = redis.from_url(backend.url.split("?", 1)[0])
    try:
        assert await client.set(backend.adapter.keys.wait(key, None), NOT_A_RECORD, xx=True)
    finally:
        await client.aclose()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_more_unreadable_due_waits_than_the_limit_hide_no_other(kind: str) -> None:
    """Three due waits that cannot be read, due first, and a page of two: the page still
    holds the one that can, and names the three, which stay as stored."""
    async with shared_store(kind) as backend:
        adapter = backend.raw_adapter
        now = system_clock.now_ms()
        for i, key in enumerate(["bad-1", "bad-2", "bad-3", "good"]):
            await adapter.save_wait_record(_wait(key, now - 1_000 + i))
        for key in ("bad-1", "bad-2", "bad-3"):
            await _overwrite_wait(backend, kind, key)
        with collecting_unreadable() as unreadable:
            due = await adapter.list_due_waits(limit=2)
        assert [r.correlation_key for r in due] == ["good"]
        named = sorted(getattr(exc, "correlation_key", "") for exc in unreadable)
        assert named == ["bad-1", "bad-2", "bad-3"]
        assert all(isinstance(exc, MalformedRecordError) for exc in unreadable)
        assert all("in the stored wait record 'bad-" in str(exc) for exc in unreadable)
        # Left as stored, and listed (left out) again.
        with collecting_unreadable() as again:
            assert [r.correlation_key for r in await adapter.list_due_waits()] == ["good"]
        assert len(again) == 3


async def test_a_due_wait_sealed_under_a_key_not_held_is_left_out_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pipeline opens each due wait: one sealed under a key this process does not
    hold is left out, named (its key, its stack), the others listed; with no collector
    the record is logged as a warning on the ``siglo`` logger."""
    async with shared_store("sqlite") as backend:
        now = system_clock.now_ms()
        before = _piped(backend, "old")
        await before.save_wait_record(_wait("sealed-elsewhere", now - 2, metadata={"a": 1}))
        after = _piped(backend, "new")
        await after.save_wait_record(_wait("readable", now - 1, metadata={"a": 2}))
        with collecting_unreadable() as unreadable:
            due = await after.list_due_waits()
        assert [(r.correlation_key, r.metadata) for r in due] == [("readable", {"a": 2})]
        [exc] = unreadable
        assert isinstance(exc, DecryptionError)
        assert "in the stored wait record 'sealed-elsewhere' of stack 's-sealed-elsewhere'" in str(
            exc
        )
        with caplog.at_level(logging.WARNING, logger="siglo"):
            assert [r.correlation_key for r in await after.list_due_waits()] == ["readable"]
        [logged] = [r for r in caplog.records if r.name == "siglo"]
        assert logged.levelno == logging.WARNING
        assert "'sealed-elsewhere'" in logged.getMessage()


async def test_a_filtered_listing_leaves_an_unreadable_checkpoint_out(tmp_path: Any) -> None:
    """A listing by metadata reads each stack's document: `siglo ls --where` lists the
    stacks that match, and names the one it cannot read on standard error (exit 1)."""
    path = tmp_path / "f.db"
    url = f"sqlite:///{path}"
    async with siglo.connect(url) as backend:
        for stack_id in ("broken", "fine"):
            await backend.adapter.save_checkpoint(
                Checkpoint(stack_id=stack_id, revision=1, timestamp=system_clock.now_ms(),
                           metadata={"customer": "acme"})
            )  # fmt: skip
    raw = sqlite3.connect(path)
    with raw:
        raw.execute(
            "UPDATE siglo_checkpoints SET document = ? WHERE stack_id = 'broken'", (b"{not",)
        )
    raw.close()
    listed = await asyncio.to_thread(
        CliRunner().invoke, cli, ["ls", url, "--where", "customer=acme"]
    )
    assert listed.exit_code == 1, listed.output
    assert "fine" in listed.stdout and "broken" not in listed.stdout
    assert "stored checkpoint of stack 'broken'" in listed.stderr
    assert "`siglo rm URL broken`" in listed.stderr


async def test_siglo_clean_on_redis_goes_on_past_an_unreadable_wait_record() -> None:
    """Redis's clean-up walks the deadline index reading each wait: one it cannot read
    keeps its entry and is named (exit 1); the stale entries after it still go."""
    async with shared_store("redis") as backend:
        adapter = backend.raw_adapter
        now = system_clock.now_ms()
        await adapter.save_wait_record(_wait("unreadable", now + 60_000))
        await adapter.save_wait_record(_wait("gone", now + 60_001))
        await _overwrite_wait(backend, "redis", "unreadable")
        import redis.asyncio as redis

        client = redis.from_url(backend.url.split("?", 1)[0])
        try:
            assert await client.delete(adapter.keys.wait("gone", None)) == 1  # its entry stale
            cleaned = await asyncio.to_thread(
                CliRunner().invoke, cli, ["clean", backend.url, "--json"]
            )
            assert cleaned.exit_code == 1, cleaned.output
            assert '"wait_deadlines": 1' in cleaned.stdout
            assert cleaned.stderr.startswith("Left out: MalformedRecordError")
            assert "wait record 'unreadable'" in cleaned.stderr
            entries = await client.zrange(adapter.keys.wait_deadlines, 0, -1)
            assert [e.decode() for e in entries] == ["unreadable"]
        finally:
            await client.aclose()
