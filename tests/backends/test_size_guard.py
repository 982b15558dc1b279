"""The size guard on every real backend (SPEC §13, issue 34): a document over the limit
is refused with DocumentTooLargeError before anything is written."""

from __future__ import annotations

import pickle
import secrets
from pathlib import Path

import pytest
from _redis_helpers import REDIS_URL, require_redis
from raw_storage import KINDS, any_backend

import siglo
from siglo import Checkpoint, DocumentTooLargeError, StorageManager
from siglo.config import Settings, load_settings
from siglo.errors import InvalidArgumentError, PluginError
from siglo.plugins import BackendRegistry, get_registry
from siglo.sizing import check_document_size, largest_contexts

pytestmark = pytest.mark.rule("checkpoint.size.guard")


def _checkpoint(stack: str, revision: int, pad: int) -> Checkpoint:
    return Checkpoint(
        stack_id=stack,
        revision=revision,
        timestamp=1,
        contexts={"small": {"n": revision}, "history": {"text": "h" * pad}},
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_a_manager_save_over_the_limit_writes_nothing(kind: str) -> None:
    async with any_backend(kind) as backend:
        backend.raw_adapter.max_document_bytes = 2_000
        manager = StorageManager(backend, error_mode="best-effort")
        stack = manager.create_stack("grows")
        stack.set("step", "note", "short")
        await manager.save_checkpoint("grows")
        stored = await backend.adapter.get_checkpoint("grows")
        assert stored is not None
        # Raised in every error mode: a contract outcome, not an adapter failure. (The
        # context-change stream records each change on its own, as it always does; a
        # streamed save that carries changes writes none of them: the contract check.)
        stack.set("step", "history", "x" * 5_000)
        with pytest.raises(DocumentTooLargeError) as caught:
            await manager.save_checkpoint("grows")
        err = caught.value
        assert (err.stack_id, err.limit) == ("grows", 2_000)
        assert err.size > 5_000 and err.largest[0][0] == "step"
        assert "'grows'" in str(err) and "2000 bytes" in str(err) and "'step'" in str(err)
        assert await backend.adapter.get_checkpoint("grows") == stored
        # The stack is not lost: once the value shrinks, the next save goes through.
        stack.set("step", "history", "short again")
        await manager.save_checkpoint("grows")
        again = await backend.adapter.get_checkpoint("grows")
        assert again is not None and again.contexts["step"]["history"] == "short again"


@pytest.mark.parametrize("kind", KINDS)
async def test_the_declared_maximum_is_the_plugins(kind: str) -> None:
    async with any_backend(kind) as backend:
        declared = get_registry().backend(backend.name).max_document_bytes
        assert backend.raw_adapter.max_document_bytes == declared
        if kind == "memory":
            assert declared is None  # nothing in its store limits one item
        else:
            assert declared is not None and declared >= 512 * 1024 * 1024


async def test_settings_lower_the_limit_through_connect(tmp_path: Path) -> None:
    settings = Settings(max_document_bytes=1_000)
    url = f"sqlite:///{tmp_path / 'guard.db'}"
    async with siglo.connect(url, settings=settings) as backend:
        assert backend.raw_adapter.max_document_bytes == 1_000
        await backend.adapter.save_checkpoint(_checkpoint("s", 1, 10))
        with pytest.raises(DocumentTooLargeError):
            await backend.adapter.save_checkpoint(_checkpoint("s", 2, 2_000))
        got = await backend.adapter.get_checkpoint("s")
        assert got is not None and got.revision == 1
    # The class keeps the store's own maximum: another connection is not lowered.
    async with siglo.connect(url, settings=Settings()) as backend:
        assert backend.raw_adapter.max_document_bytes == 1_000_000_000


async def test_settings_limit_on_redis() -> None:
    require_redis()
    prefix = f"siglo-size-{secrets.token_hex(4)}:"
    settings = Settings(max_document_bytes=1_500)
    async with siglo.connect(REDIS_URL, settings=settings, prefix=prefix) as backend:
        with pytest.raises(DocumentTooLargeError) as caught:
            await backend.adapter.save_checkpoint(_checkpoint("r", 1, 3_000))
        assert caught.value.largest[0][0] == "history"
        assert await backend.adapter.get_checkpoint("r") is None
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        # Refused before anything was written: not a key under the prefix.
        assert [k async for k in client.scan_iter(match=prefix + "*")] == []
    finally:
        await client.aclose()


def test_the_limit_is_measured_after_the_pipeline() -> None:
    # A redacted value counts as "[REDACTED]": what is stored is what is measured.
    backend = siglo.connect(
        "memory://", settings=Settings(max_document_bytes=400, redact_fields=frozenset({"big"}))
    )
    cp = Checkpoint(stack_id="p", revision=1, timestamp=1, contexts={"s": {"big": "x" * 5_000}})
    import asyncio

    asyncio.run(backend.adapter.save_checkpoint(cp))
    stored = asyncio.run(backend.adapter.get_checkpoint("p"))
    assert stored is not None and stored.contexts["s"]["big"] == "[REDACTED]"


def test_the_error_names_the_largest_contexts_and_pickles() -> None:
    cp = Checkpoint(
        stack_id="s",
        revision=1,
        timestamp=1,
        namespace="ns",
        contexts={"a": {"v": "x" * 10}, "b": {"v": "x" * 300}, "c": {"v": "x" * 50}, "d": {}},
    )
    assert [step for step, _ in largest_contexts(cp)] == ["b", "c", "a"]
    check_document_size(cp, None)
    check_document_size(cp, len(cp.to_json()))
    with pytest.raises(DocumentTooLargeError) as caught:
        check_document_size(cp, 100)
    err = caught.value
    assert err.size == len(cp.to_json()) and err.namespace == "ns"
    again = pickle.loads(pickle.dumps(err))
    assert (again.stack_id, again.size, again.limit, again.largest) == (
        err.stack_id,
        err.size,
        err.limit,
        err.largest,
    )
    assert isinstance(err, InvalidArgumentError)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True])
def test_a_bad_limit_is_refused_by_name(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_document_bytes"):
        Settings(max_document_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(PluginError, match="max_document_bytes"):
        BackendRegistry("p").add_backend(
            "b",
            schemes=("b",),
            factory=lambda url: None,
            max_document_bytes=bad,  # type: ignore[arg-type]
        )


def test_the_limit_is_read_from_the_environment_and_files(tmp_path: Path) -> None:
    env = {"SIGLO_MAX_DOCUMENT_BYTES": "4096"}
    assert load_settings(start=tmp_path, environ=env).max_document_bytes == 4096
    assert (
        load_settings(
            start=tmp_path, environ={"SIGLO_MAX_DOCUMENT_BYTES": "none"}
        ).max_document_bytes
        is None
    )
    with pytest.raises(InvalidArgumentError, match="SIGLO_MAX_DOCUMENT_BYTES"):
        load_settings(start=tmp_path, environ={"SIGLO_MAX_DOCUMENT_BYTES": "big"})
    (tmp_path / "siglo.toml").write_text("max_document_bytes = 8192\n")
    assert load_settings(start=tmp_path, environ={}).max_document_bytes == 8192
    assert Settings(max_document_bytes=5).describe()["max_document_bytes"] == 5
