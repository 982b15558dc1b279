"""The size guard on every real backend (SPEC §13, issue 34): a document over the limit
is refused with DocumentTooLargeError before anything is written."""

from __future__ import annotations

import asyncio
import base64
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
from siglo.records import ContextChangeEvent
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
async def test_a_refused_save_streams_none_of_the_changes_set_in_its_turn(kind: str) -> None:
    """docs/large-state.md: a change followed by a save in the same turn of the loop goes
    with the save, and a save the guard refuses writes none of them — on every backend,
    the in-memory reference included (it streamed them first, a black-box auditor's
    note), each change under the limit by itself."""
    async with any_backend(kind) as backend:
        backend.raw_adapter.max_document_bytes = 2_000
        manager = StorageManager(backend, error_mode="strict")
        stack = manager.create_stack("turn")
        stack.set("step", "note", "n" * 1_200)
        await manager.save_checkpoint("turn")
        stack.set("step", "history", "h" * 1_500)  # fits alone; the document does not
        with pytest.raises(DocumentTooLargeError):
            await manager.save_checkpoint("turn")
        await asyncio.sleep(0.05)  # nothing left to stream on its own either
        changes = await backend.adapter.get_context_changes("turn", "step")
        assert "history" not in changes, changes


@pytest.mark.parametrize("kind", KINDS)
async def test_a_context_change_over_the_limit_by_itself_is_never_streamed(kind: str) -> None:
    """A change streamed on its own (not with a save) whose value alone is over the limit
    is refused with DocumentTooLargeError naming it, and nothing is streamed: through the
    adapter, and through a manager's set() followed by a save later (refused for its
    size too)."""
    async with any_backend(kind) as backend:
        backend.raw_adapter.max_document_bytes = 2_000
        adapter = backend.adapter
        huge = ContextChangeEvent(
            stack_id="alone", step_id="step", key="big", timestamp=1, value="x" * 3_000
        )
        with pytest.raises(DocumentTooLargeError) as caught:
            await adapter.on_context_change(huge)
        err = caught.value
        assert (err.stack_id, err.limit, err.size) == ("alone", 2_000, 3_002)
        assert err.largest == (("step", 3_002),)
        assert "context change 'big' of step 'step'" in str(err)
        assert await adapter.get_context_changes("alone", "step") == {}
        fits = ContextChangeEvent(
            stack_id="alone", step_id="step", key="big", timestamp=1, value="x" * 1_998
        )
        await adapter.on_context_change(fits)  # exactly the limit: streamed
        assert await adapter.get_context_changes("alone", "step") == {"big": "x" * 1_998}

        manager = StorageManager(backend)
        stack = manager.create_stack("later")
        stack.set("step", "small", 1)
        await stack.save()
        stack.set("step", "huge", "x" * 5_000)
        await asyncio.sleep(0.05)  # the change streams on its own, before any save
        # The stream's refusal, raised for the stack by the error mode at its next call;
        # the save after it is refused for the document's own size.
        with pytest.raises(DocumentTooLargeError) as streamed:
            await stack.save(expected_revision=1)
        assert streamed.value.record == "context change 'huge' of step 'step'"
        with pytest.raises(DocumentTooLargeError) as saved:
            await stack.save(expected_revision=1)
        assert saved.value.record == "checkpoint document"
        assert await adapter.get_context_changes("later", "step") == {"small": 1}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_change_measured_for_size_that_is_not_json_is_refused_by_name(kind: str) -> None:
    """Measuring a change does not turn bad input into the encoder's TypeError: a value
    that is not JSON is refused with InvalidArgumentError naming its key, on every
    backend, whatever the limit."""
    async with any_backend(kind) as backend:
        backend.raw_adapter.max_document_bytes = 2_000
        for value in ({1, 2}, {"a": object()}, {1: "an int key"}):
            with pytest.raises(InvalidArgumentError, match="context value 'k'"):
                await backend.adapter.on_context_change(
                    ContextChangeEvent(stack_id="s", step_id="a", key="k", timestamp=1, value=value)
                )
        assert await backend.adapter.get_context_changes("s", "a") == {}


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/o.db"])
async def test_a_change_of_a_value_offloading_takes_out_is_not_refused(
    url: str, tmp_path: Path
) -> None:
    """With offloading on, a value of at least ``offload_min_bytes`` is a blob reference
    in the checkpoint, so its change streamed on its own is not refused for its size (an
    auditor's finding: it was, so the save failed or not by the loop's timing, always
    through siglo.sync); the stream holds the value as set. A value under the threshold
    and over the limit is still refused."""
    settings = Settings(
        max_document_bytes=4_096, offload_min_bytes=1_024, blob_url=f"file://{tmp_path}/blobs"
    )
    async with siglo.connect(url.format(tmp=tmp_path), settings=settings) as backend:
        manager = StorageManager(backend, error_mode="strict")
        stack = manager.create_stack("big")
        stack.set("s1", "big", "y" * 10_000)
        await asyncio.sleep(0.05)  # the change streams on its own
        await stack.save()
        stored = await backend.raw_adapter.get_checkpoint("big")
        assert stored is not None and "$siglo.blob" in stored.contexts["s1"]["big"]
        loaded = await backend.adapter.get_checkpoint("big")
        assert loaded is not None and loaded.contexts["s1"]["big"] == "y" * 10_000
        changes = await backend.adapter.get_context_changes("big", "s1")
        assert changes == {"big": "y" * 10_000}
    under = Settings(
        max_document_bytes=4_096, offload_min_bytes=8_192, blob_url=f"file://{tmp_path}/blobs"
    )
    async with siglo.connect(url.format(tmp=tmp_path), settings=under) as backend:
        with pytest.raises(DocumentTooLargeError):
            await backend.adapter.on_context_change(
                ContextChangeEvent(
                    stack_id="mid", step_id="s1", key="v", timestamp=1, value="z" * 6_000
                )
            )


@pytest.mark.parametrize("seal", ["encryption", "compression"])
async def test_a_change_is_not_refused_where_sealed_contexts_are_offloaded(
    seal: str, tmp_path: Path
) -> None:
    """With encryption (or compression) the pipeline seals a context whole, and the
    offloader takes out the sealed context: a value under ``offload_min_bytes`` whose
    sealed form is over the limit sits in a context offloaded as one, and its checkpoint
    is stored. Its change streamed on its own was refused all the same, so the save
    failed or not by the loop's timing, and always through siglo.sync (a black-box
    auditor). Both ways now store it."""
    from siglo import sync

    sealing: dict[str, object] = (
        {"encryption_keys": {"k1": base64.b64encode(b"k" * 32).decode()}}
        if seal == "encryption"
        else {"compression_min_bytes": 64}
    )
    value = "x" * 3_700 if seal == "encryption" else secrets.token_hex(2_600)
    settings = load_settings(
        max_document_bytes=4_096,
        offload_min_bytes=5_000,
        blob_url=f"file://{tmp_path}/blobs",
        **sealing,  # type: ignore[arg-type]
    )
    url = f"sqlite:///{tmp_path / 'o.db'}"
    for alone in (False, True):
        async with siglo.connect(url, settings=settings) as backend:
            manager = StorageManager(backend, settings=settings)
            stack = manager.create_stack(f"s-{alone}")
            stack.set("a", "w", "y" * 300)
            await stack.save(expected_revision=0)
            stack.set("a", "v", value)
            if alone:
                await asyncio.sleep(0.05)  # the change streams on its own
            saved = await stack.save(expected_revision=1)
            assert saved.revision == 2
            loaded = await backend.adapter.get_checkpoint(f"s-{alone}")
            assert loaded is not None and loaded.contexts["a"]["v"] == value
    backend_sync = sync.connect(url, settings=settings)
    try:
        stack_sync = sync.StorageManager(backend_sync, settings=settings).create_stack("s-sync")
        stack_sync.set("a", "w", "y" * 300)
        stack_sync.save(expected_revision=0)
        stack_sync.set("a", "v", value)
        assert stack_sync.save(expected_revision=1).revision == 2
    finally:
        backend_sync.close()


def test_a_save_refused_for_size_through_siglo_sync_streams_nothing_too_large(
    tmp_path: Path,
) -> None:
    """siglo.sync's set() streams its change at once (each call is a turn of the portal's
    loop), so a save refused for its size there carries no changes: the value refused
    is not in the stream either (an auditor's finding: it was)."""
    from siglo import sync

    settings = load_settings(max_document_bytes=3_000)
    backend = sync.connect(f"sqlite:///{tmp_path / 's.db'}", settings=settings)
    try:
        manager = sync.StorageManager(backend, settings=settings)
        stack = manager.create_stack("s", namespace="t1")
        stack.set("a", "small", 1)
        stack.save()
        stack.set("a", "huge", "x" * 5_000)
        with pytest.raises(DocumentTooLargeError):
            stack.save(expected_revision=1)
        assert sorted(backend.adapter.get_context_changes("s", "a", "t1")) == ["small"]
    finally:
        backend.close()


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


@pytest.mark.parametrize("kind", KINDS)
async def test_a_value_replaced_in_its_turn_is_not_measured_by_itself(kind: str) -> None:
    """A value over the limit set, then replaced by a small one, in the turn of a save
    whose document is under the limit: the save is stored and the stream holds the
    latest values. On the in-memory backend the carried changes were recorded one by
    one, the large one measured by itself, and the save refused (a black-box auditor)."""
    async with any_backend(kind) as backend:
        backend.raw_adapter.max_document_bytes = 3_000
        manager = StorageManager(backend, error_mode="strict")
        stack = manager.create_stack("replaced")
        stack.set("s", "a", 1)
        await manager.save_checkpoint("replaced")
        stack.set("s", "k", "x" * 5_000)
        stack.set("s", "k", "small")
        stack.set("s", "b", 2)
        saved = await manager.save_checkpoint("replaced")
        assert saved.revision == 2
        await manager.flush()
        assert await backend.adapter.get_context_changes("replaced", "s") == {
            "a": 1,
            "k": "small",
            "b": 2,
        }


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refused_save_leaves_its_redacted_restreams_to_the_next_save(kind: str) -> None:
    """A save naming ``redact_fields=`` queues the stack's values holding those keys to
    be streamed again, redacted. Refused for its size, it dropped them, and the next
    save named nothing new: the stream kept the card in clear for good (a black-box
    auditor). They go with the next save."""
    card = "4111-1111-1111-1111"
    async with any_backend(kind) as backend:
        backend.raw_adapter.max_document_bytes = 3_000
        manager = StorageManager(backend, error_mode="strict")
        stack = manager.create_stack("scrubbed")
        stack.set("pay", "card", card)
        await manager.save_checkpoint("scrubbed")
        await manager.flush()
        stack.set("pay", "big", "x" * 2_900)
        with pytest.raises(DocumentTooLargeError):
            await manager.save_checkpoint("scrubbed", redact_fields=["card"])
        stack.delete("pay", "big")
        await manager.save_checkpoint("scrubbed", redact_fields=["card"])
        await manager.flush()
        changes = await backend.adapter.get_context_changes("scrubbed", "pay")
        assert changes.get("card") == "[REDACTED]", changes
        assert "big" not in changes
