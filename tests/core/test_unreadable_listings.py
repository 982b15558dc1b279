"""A listing leaves out a record it cannot read and goes on with the others
(siglo.unreadable): on every path that lists — the due waits (the SQL page, Redis's
deadline index, the pipeline's decryption and its require_encryption), a filtered
listing, Redis's `siglo clean` — the record is named to the caller's collector, else
logged, and nothing stored changes. The walks whose output must hold every stack (a
dump, a re-key, a blob collection) stop at it instead; `siglo erase` deletes it with its
namespace; `siglo prune` names it. A registry places every listing siglo calls. (The
worker and `siglo ls` on Redis: tests/workflows/test_worker_unreadable_runs.py; the UI:
tests/observability/test_ui.py.)
"""

from __future__ import annotations

import ast
import asyncio
import base64
import logging
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from ops_support import shared_store

import siglo
from siglo import Checkpoint, WaitRecord
from siglo.blobs import DirectoryBlobStore
from siglo.cli import cli
from siglo.clock import system_clock
from siglo.config import Settings
from siglo.errors import DecryptionError, EncryptionRequiredError, MalformedRecordError
from siglo.offload import Offloader, collect_blobs, offload_adapter
from siglo.pipeline import Pipeline, PipelineAdapter, pipeline_parts
from siglo.rekeying import erase, rekey
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


async def test_a_due_wait_in_clear_is_left_out_where_encryption_is_required() -> None:
    """``require_encryption``: a due wait stored in clear (before encryption was on) is
    left out of the pipeline's listing with its EncryptionRequiredError, named."""
    async with shared_store("sqlite") as backend:
        now = system_clock.now_ms()
        await backend.raw_adapter.save_wait_record(_wait("in-clear", now - 2, metadata={"a": 1}))
        key = base64.b64encode(os.urandom(32)).decode()
        settings = Settings(encryption_keys={"k1": key}, require_encryption=True)
        strict, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
        await strict.save_wait_record(_wait("sealed", now - 1, metadata={"a": 2}))
        with collecting_unreadable() as unreadable:
            due = await strict.list_due_waits()
        assert [r.correlation_key for r in due] == ["sealed"]
        [exc] = unreadable
        assert isinstance(exc, EncryptionRequiredError)
        assert "in the stored wait record 'in-clear' of stack 's-in-clear'" in str(exc)


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


async def _overwrite_checkpoint(
    backend: siglo.Backend, stack_id: str, namespace: str | None
) -> None:
    """On Redis, whose listings read each document: one written past siglo (that still
    reads as a completed one to a listing's status filter)."""
    import redis.asyncio as redis

    client = redis.from_url(backend.url.split("?", 1)[0])
    try:
        key = backend.raw_adapter.keys.checkpoint(stack_id, namespace)
        assert await client.set(key, b'{"status":"completed", not JSON', xx=True)
    finally:
        await client.aclose()


async def test_walks_that_must_hold_every_stack_stop_at_one_they_cannot_read() -> None:
    """On Redis the listing itself reads each document. A dump, a re-key and a blob
    collection list within `stopping_at_unreadable`: they fail naming the stack, where
    leaving it out would be a dump without it, a stack left under an old key, and its
    blobs taken for orphans; `siglo prune` deletes the others and names it (exit 1)."""
    store = DirectoryBlobStore(Path(tempfile.mkdtemp(prefix="siglo-blobs-")))
    big = "large tool output " * 2_000
    async with shared_store("redis", checkpoint_ttl_ms=None) as backend:
        adapter = offload_adapter(backend.adapter, Offloader(store, 1_024))
        for stack_id, value in (("broken", big), ("fine", "small")):  # one blob: broken's
            await adapter.save_checkpoint(
                Checkpoint(stack_id=stack_id, namespace="t", revision=1, timestamp=1,
                           status="completed", contexts={"c": {"v": value}})
            )  # fmt: skip
        await _overwrite_checkpoint(backend, "broken", "t")
        runner = CliRunner()
        dumped = await asyncio.to_thread(runner.invoke, cli, ["export", backend.url])
        assert dumped.exit_code == 1
        assert "in the stored checkpoint of stack 'broken' (namespace 't')" in dumped.stderr
        with pytest.raises(MalformedRecordError, match="stack 'broken'"):
            await collect_blobs(adapter, store, now_ms=int(time.time() * 1000) + 7_200_000)
        assert len([d async for d, _ in store.scan()]) == 1  # the broken stack's blob kept
        settings = Settings(encryption_keys={"k1": base64.b64encode(os.urandom(32)).decode()})
        piped, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
        rotator = siglo.Backend(name=backend.name, url=backend.url, adapter=piped)
        with pytest.raises(MalformedRecordError, match="stack 'broken'"):
            await rekey(rotator)
        pruned = await asyncio.to_thread(
            runner.invoke, cli, ["prune", backend.url, "--older-than", "1s"]
        )
        assert pruned.exit_code == 1, pruned.output
        assert "deleted 1 stack(s)" in pruned.stdout
        assert "stack 'broken' (namespace 't')" in pruned.stderr
        assert await backend.raw_adapter.get_checkpoint("fine", "t", fallback=False) is None


async def test_erase_deletes_a_stack_of_its_namespace_it_cannot_read() -> None:
    """`siglo erase` deletes every stack of the namespace, the ones its listing cannot
    read too (named, by the stack), and no other namespace's."""
    settings = Settings(master_key=f"base64:{base64.b64encode(os.urandom(32)).decode()}")
    async with shared_store("redis", checkpoint_ttl_ms=None) as backend:
        piped, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
        for stack_id, namespace in (("broken", "gone"), ("fine", "gone"), ("broken", "kept")):
            await piped.save_checkpoint(
                Checkpoint(stack_id=stack_id, namespace=namespace, revision=1, timestamp=1,
                           contexts={"c": {"n": 1}})
            )  # fmt: skip
        await _overwrite_checkpoint(backend, "broken", "gone")
        await _overwrite_checkpoint(backend, "broken", "kept")
        eraser = siglo.Backend(name=backend.name, url=backend.url, adapter=piped)
        with collecting_unreadable() as unreadable:
            report = await erase(eraser, "gone", settle_s=0)
        assert report.deleted == 2
        raw = backend.raw_adapter
        for stack_id in ("broken", "fine"):
            with collecting_unreadable():
                assert await raw.get_checkpoint(stack_id, "gone", fallback=False) is None
        # Another namespace's unreadable stack is left as stored (and was not listed).
        assert unreadable == []
        with pytest.raises(MalformedRecordError):
            await raw.get_checkpoint("broken", "kept", fallback=False)


# Every listing siglo itself calls, by module and function, and what it does with a
# record it cannot read: "stops" (lists within stopping_at_unreadable: its output must
# hold every record), or what it does with the records left out.
_LISTINGS = {
    ("siglo/transfer.py", "export_lines"): "stops",
    ("siglo/offload.py", "_stored_checkpoints"): "stops",
    ("siglo/keys.py", "namespaces"): "stops",
    ("siglo/keys.py", "_check_master"): "leaves out: another keyring serves the check",
    ("siglo/rekeying.py", "_summaries"): "stops (rekey), or erase collects and deletes them",
    ("siglo/rekeying.py", "_holds_data"): (
        "collects: a stack it cannot read is one of the namespace's (erase deletes it)"
    ),
    ("siglo/blind.py", "list_matching"): "leaves out: a listing by metadata",
    ("siglo/blind.py", "scan_tokens"): "leaves out: a listing by blind-index tokens",
    ("siglo/pipeline.py", "list_checkpoints"): "the backend's listing, passed on",
    ("siglo/pipeline.py", "list_due_waits"): "leaves out what it cannot decrypt",
    ("siglo/workflow/worker.py", "_fire_timers"): "says each once (Worker._listed)",
    ("siglo/workflow/worker.py", "_recover"): "says each once (Worker._listed)",
    ("siglo/cli/store.py", "run"): "siglo ls and siglo prune name them (cli.errors.left_out)",
    ("siglo/ui/data.py", "runs_page"): "leaves out: the runs page says how many",
    ("siglo/ui/data.py", "status_counts"): "leaves out: not counted (logged)",
    ("siglo/ui/data.py", "attention"): "leaves out: the attention page names them",
    ("siglo/ui/data.py", "_overdue"): "leaves out: the attention page names them",
}


def test_every_listing_siglo_calls_says_what_it_does_with_a_record_it_cannot_read() -> None:
    """A call of ``list_checkpoints`` or ``list_due_waits`` added to siglo fails this
    test until it is placed in :data:`_LISTINGS`; those that stop list within
    ``stopping_at_unreadable``."""
    root = Path(__file__).resolve().parents[2]
    found: set[tuple[str, str]] = set()
    for path in sorted((root / "siglo").rglob("*.py")):
        name = str(path.relative_to(root))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            stopping = {
                id(inner)
                for node in ast.walk(function)
                if isinstance(node, ast.With)
                and any("stopping_at_unreadable" in ast.unparse(i.context_expr) for i in node.items)
                for inner in ast.walk(node)
            }
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("list_checkpoints", "list_due_waits")
                    and not any(  # the nested function's own entry names it
                        node in ast.walk(f)
                        for f in ast.walk(function)
                        if f is not function
                        and isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                    )
                ):
                    found.add((name, function.name))
                    if _LISTINGS.get((name, function.name), "").startswith("stops"):
                        assert id(node) in stopping, f"{name}:{node.lineno} lists without stopping"
    assert found == set(_LISTINGS), (found - set(_LISTINGS), set(_LISTINGS) - found)
