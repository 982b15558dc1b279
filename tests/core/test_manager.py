"""The storage manager: snapshots, revisions, redaction, namespaces, error modes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

import siglo
from siglo import (
    Capability,
    Checkpoint,
    CheckpointConflictError,
    ManualClock,
    StorageAdapter,
    StorageAdapterError,
    StorageManager,
)
from siglo.redaction import REDACTED, redact


class RecordingAdapter(StorageAdapter):
    """Records what reaches the adapter; `fail` makes every call raise the given error.

    The manager's error-mode policy is what these tests check, so the failure is
    injected here; the backends' own tests produce real connection failures.
    """

    name: ClassVar[str] = "recording"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.CHECKPOINTS, Capability.CONTEXT_STREAM}
    )

    def __init__(self) -> None:
        self.saved: list[tuple[int, int | None]] = []
        self.events: list[siglo.ContextChangeEvent] = []
        self.fail: Exception | None = None
        self.delay = 0.0

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        self.saved.append((checkpoint.revision, expected_revision))

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        if self.fail is not None:
            raise self.fail
        return None

    async def _do_clean_expired_checkpoints(self) -> int:
        if self.fail is not None:
            raise self.fail
        return 0

    async def _do_on_context_change(self, event: siglo.ContextChangeEvent) -> None:
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        self.events.append(event)


@pytest.mark.rule("manager.snapshot")
async def test_snapshot_is_synchronous_immutable_and_has_the_next_revision(
    manager: StorageManager, clock: ManualClock
) -> None:
    stack = manager.create_stack("s", workflow_id="wf", namespace="ns", metadata={"m": 1})
    stack.set("step", "items", [1, 2])
    stack.push_chain("step")
    cp = manager.checkpoint("s", ttl_ms=1_000)
    assert cp.revision == 1
    assert stack.revision == 1
    assert cp.timestamp == clock.now_ms()
    assert cp.expires_at == clock.now_ms() + 1_000
    assert cp.workflow_id == "wf"
    assert cp.namespace == "ns"
    assert cp.chains == ("step",)
    assert cp.metadata == {"m": 1}
    stack.context("step")["items"].append(3)
    stack.set("step", "new", True)
    assert cp.contexts == {"step": {"items": [1, 2]}}
    assert manager.checkpoint("s").revision == 2
    await manager.flush()
    stored = await manager.load_checkpoint("s", namespace="ns")
    assert stored is not None
    assert stored.revision == 2
    assert stored.contexts == {"step": {"items": [1, 2, 3], "new": True}}


@pytest.mark.rule("manager.snapshot")
async def test_snapshot_of_non_json_context_fails_synchronously(manager: StorageManager) -> None:
    stack = manager.create_stack("s")
    stack.contexts["step"] = {"bad": {1, 2}}
    with pytest.raises(siglo.InvalidArgumentError, match="not JSON"):
        manager.checkpoint("s")
    assert stack.revision == 0


@pytest.mark.rule("manager.redaction")
async def test_redaction_reaches_every_depth_and_leaves_the_live_stack(
    manager: StorageManager,
) -> None:
    stack = manager.create_stack("s")
    stack.set("login", "password", "hunter2")
    stack.set("login", "user", {"name": "ada", "token": "t0", "keys": [{"apiKey": "k"}, "x"]})
    stack.set("login", "batches", [[{"token": "deep"}], {"ok": 1}])
    cp = await manager.save_checkpoint("s", redact_fields=["password", "token", "apiKey"])
    assert cp.contexts["login"] == {
        "password": REDACTED,
        "user": {"name": "ada", "token": REDACTED, "keys": [{"apiKey": REDACTED}, "x"]},
        "batches": [[{"token": REDACTED}], {"ok": 1}],
    }
    stored = await manager.load_checkpoint("s")
    assert stored is not None and stored.contexts == cp.contexts
    assert stack.contexts["login"]["password"] == "hunter2"
    assert stack.contexts["login"]["user"]["keys"][0]["apiKey"] == "k"


json_leaf = st.none() | st.integers() | st.text(max_size=5)
json_tree = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["token", "a", "b", "password"]), inner, max_size=3)
    ),
    max_leaves=15,
)


def _keys_with_values(value: Any, field: str) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == field:
                found.append(v)
            found.extend(_keys_with_values(v, field))
    elif isinstance(value, list):
        for v in value:
            found.extend(_keys_with_values(v, field))
    return found


@pytest.mark.rule("manager.redaction")
@given(json_tree)
def test_redact_property(tree: Any) -> None:
    before = repr(tree)
    out = redact(tree, {"token", "password"})
    assert repr(tree) == before  # the input is untouched
    for field in ("token", "password"):
        assert all(v == REDACTED for v in _keys_with_values(out, field))
    assert redact(out, {"token", "password"}) == out


@pytest.mark.rule("manager.background.order")
async def test_background_saves_land_in_order() -> None:
    adapter = RecordingAdapter()
    manager = StorageManager(adapter)
    manager.create_stack("s")
    adapter.delay = 0.001
    for _ in range(20):
        manager.checkpoint("s")
    saved = await manager.save_checkpoint("s")
    assert [rev for rev, _ in adapter.saved] == list(range(1, 22))
    assert saved.revision == 21


@pytest.mark.rule("manager.background.order")
def test_snapshots_taken_outside_an_event_loop_are_saved_by_flush() -> None:
    adapter = RecordingAdapter()
    manager = StorageManager(adapter)
    manager.create_stack("s")
    manager.checkpoint("s")
    manager.checkpoint("s")
    assert adapter.saved == []
    asyncio.run(manager.flush())
    assert adapter.saved == [(1, None), (2, None)]


@pytest.mark.rule("manager.conflict.always", "checkpoint.occ.conflict")
@pytest.mark.parametrize("mode", ["best-effort", "warn", "strict"])
async def test_conflicts_are_raised_in_every_mode(
    mode: siglo.ErrorMode, memory: siglo.Backend, clock: ManualClock
) -> None:
    manager = StorageManager(memory, clock=clock, error_mode=mode)
    manager.create_stack("s")
    await manager.save_checkpoint("s")  # revision 1 stored
    with pytest.raises(CheckpointConflictError) as info:
        await manager.save_checkpoint("s", expected_revision=0)
    assert (info.value.stack_id, info.value.current_revision, info.value.expected_revision) == (
        "s",
        1,
        0,
    )
    # In the background, the conflict surfaces from the next awaited call.
    manager.checkpoint("s", expected_revision=0)
    with pytest.raises(CheckpointConflictError):
        await manager.flush()
    await manager.flush()  # raised once, then gone


@pytest.mark.rule("manager.conflict.always")
async def test_background_conflict_surfaces_from_the_next_awaited_call(
    memory: siglo.Backend, clock: ManualClock
) -> None:
    writer_a = StorageManager(memory, clock=clock)
    writer_b = StorageManager(memory, clock=clock)
    writer_a.create_stack("s")
    writer_b.create_stack("s")
    await writer_a.save_checkpoint("s", expected_revision=0)
    writer_b.checkpoint("s", expected_revision=0)  # loses in the background
    await asyncio.sleep(0.01)
    # SPEC §4: raised to the next call for THAT stack, never to an unrelated one.
    assert await writer_b.load_checkpoint("other") is None
    with pytest.raises(CheckpointConflictError):
        await writer_b.load_checkpoint("s")
    await writer_b.flush()  # raised once, then gone


@pytest.mark.rule("manager.error-mode")
async def test_best_effort_swallows_adapter_failures() -> None:
    adapter = RecordingAdapter()
    adapter.fail = ConnectionError("connection refused")
    manager = StorageManager(adapter, error_mode="best-effort")
    manager.create_stack("s")
    cp = await manager.save_checkpoint("s")
    assert cp.revision == 1
    manager.checkpoint("s")
    await manager.flush()
    assert await manager.load_checkpoint("s") is None
    assert await manager.clean_expired_checkpoints() == 0


@pytest.mark.rule("manager.error-mode.default")
async def test_a_durable_adapter_is_strict_by_default() -> None:
    adapter = RecordingAdapter()  # durable, as every adapter but memory:// is
    adapter.fail = ConnectionError("connection refused")
    manager = StorageManager(adapter)
    assert manager.error_mode == "strict"
    manager.create_stack("s")
    with pytest.raises(StorageAdapterError, match="connection refused"):
        await manager.save_checkpoint("s")


@pytest.mark.rule("manager.error-mode.default")
def test_memory_and_no_adapter_stay_best_effort(memory: siglo.Backend) -> None:
    assert StorageManager().error_mode == "best-effort"
    assert StorageManager(memory).error_mode == "best-effort"
    assert siglo.default_error_mode(memory.adapter) == "best-effort"
    assert siglo.default_error_mode(RecordingAdapter()) == "strict"


@pytest.mark.rule("manager.error-mode.default")
@pytest.mark.parametrize("url", ["sqlite://", "redis://127.0.0.1:6379/0"])
async def test_built_in_durable_backends_are_strict_by_default(url: str) -> None:
    backend = siglo.connect(url)
    try:
        assert StorageManager(backend).error_mode == "strict"
    finally:
        await backend.aclose()


@pytest.mark.rule("manager.error-mode.default")
def test_the_default_follows_use_storage_until_a_mode_is_set(memory: siglo.Backend) -> None:
    manager = StorageManager()
    manager.use_storage(RecordingAdapter())
    assert manager.error_mode == "strict"
    manager.use_storage(memory)
    assert manager.error_mode == "best-effort"
    manager.set_error_mode("warn")
    manager.use_storage(RecordingAdapter())
    assert manager.error_mode == "warn"
    # An explicit mode wins, in either direction.
    assert StorageManager(RecordingAdapter(), error_mode="best-effort").error_mode == (
        "best-effort"
    )
    assert StorageManager(memory, error_mode="strict").error_mode == "strict"


@pytest.mark.rule("manager.error-mode")
async def test_warn_logs_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    adapter = RecordingAdapter()
    adapter.fail = ConnectionError("connection refused")
    manager = StorageManager(adapter, error_mode="warn")
    manager.create_stack("s")
    with caplog.at_level(logging.WARNING, logger="siglo"), pytest.warns(siglo.StorageWarning):
        await manager.save_checkpoint("s")
    assert "connection refused" in caplog.text


@pytest.mark.rule("manager.error-mode")
async def test_strict_raises_wrapped_failures_awaited_and_from_background() -> None:
    adapter = RecordingAdapter()
    cause = ConnectionError("connection refused")
    adapter.fail = cause
    manager = StorageManager(adapter)
    manager.set_error_mode("strict")
    manager.create_stack("s")
    with pytest.raises(StorageAdapterError) as info:
        await manager.save_checkpoint("s")
    assert info.value.__cause__ is cause
    manager.checkpoint("s")
    await asyncio.sleep(0.01)
    with pytest.raises(StorageAdapterError):
        await manager.load_checkpoint("s")
    # A StorageAdapterError from the adapter is raised as it is.
    adapter.fail = StorageAdapterError("timed out")
    with pytest.raises(StorageAdapterError, match="timed out"):
        await manager.save_checkpoint("s")
    with pytest.raises(siglo.InvalidArgumentError):
        manager.set_error_mode("loud")  # type: ignore[arg-type]


@pytest.mark.rule("manager.error-mode")
async def test_context_stream_failures_follow_the_error_mode() -> None:
    adapter = RecordingAdapter()
    adapter.fail = ConnectionError("down")
    manager = StorageManager(adapter, error_mode="strict")
    manager.create_stack("s").set("a", "k", 1)
    with pytest.raises(StorageAdapterError):
        await manager.flush()


@pytest.mark.rule("manager.restore.namespace")
async def test_restore_checks_the_namespace(manager: StorageManager) -> None:
    manager.create_stack("s", namespace="ns-A").set("step", "x", 1)
    cp = await manager.save_checkpoint("s")
    with pytest.raises(siglo.NamespaceMismatchError) as info:
        manager.restore_checkpoint(cp, expected_namespace="ns-B")
    assert (info.value.expected_namespace, info.value.actual_namespace) == ("ns-B", "ns-A")
    stack = manager.restore_checkpoint(cp, expected_namespace="ns-A")
    assert stack.contexts == {"step": {"x": 1}}
    assert stack.revision == 1
    stack.set("step", "x", 2)
    assert cp.contexts["step"]["x"] == 1  # the live stack does not share the snapshot
    # No expected namespace, or an un-namespaced checkpoint: no check.
    manager.restore_checkpoint(cp)
    bare = cp.replace(namespace=None)
    manager.restore_checkpoint(bare, expected_namespace="ns-B")
    # A wire document or JSON restores too, and a future version is refused.
    manager.restore_checkpoint(cp.to_json())
    with pytest.raises(siglo.CheckpointVersionError):
        manager.restore_checkpoint({**cp.to_wire(), "version": 3})


@pytest.mark.rule("manager.restore.namespace")
async def test_resume_loads_and_restores(manager: StorageManager) -> None:
    manager.create_stack("s", namespace="t").set("a", "v", [1])
    await manager.save_checkpoint("s")
    manager.discard_stack("s")
    stack = await manager.resume("s", namespace="t")
    assert stack is not None and stack.contexts == {"a": {"v": [1]}}
    assert await manager.resume("missing") is None


@pytest.mark.rule("manager.context-stream", "context.stream")
async def test_context_mutations_stream_in_order(
    manager: StorageManager, memory: siglo.Backend
) -> None:
    adapter = RecordingAdapter()
    adapter.delay = 0.001
    recording = StorageManager(adapter)
    stack = recording.create_stack("s", namespace="ns")
    for i in range(10):
        stack.set("step", "counter", i)
    stack.delete("step", "counter")
    await recording.flush()
    assert [(e.op, e.value) for e in adapter.events] == [("set", i) for i in range(10)] + [
        ("delete", None)
    ]
    assert all(e.namespace == "ns" and e.step_id == "step" for e in adapter.events)

    live = manager.create_stack("m", namespace="ns")
    live.set("step", "a", {"x": 1})
    live.set("step", "b", 2)
    live.delete("step", "b")
    await manager.flush()
    assert await memory.adapter.get_context_changes("m", "step", "ns") == {"a": {"x": 1}}
    assert await memory.adapter.get_context_changes("m", "step") == {}


@pytest.mark.rule("manager.status")
def test_status_transitions(manager: StorageManager) -> None:
    stack = manager.create_stack("s")
    stack.transition("waiting")
    stack.transition("running")
    stack.transition("completed")
    assert stack.is_terminal
    with pytest.raises(siglo.InvalidStateTransitionError):
        stack.transition("running")
    with pytest.raises(siglo.InvalidArgumentError):
        manager.create_stack("t").transition("paused")


@pytest.mark.rule("manager.snapshot")
def test_manager_argument_checks(manager: StorageManager) -> None:
    first = manager.create_stack("s")
    # Another live stack of the id is no reason to refuse one (docs/configuration.md, "One
    # manager, many requests"); a call that names only the id is ambiguous then.
    second = manager.create_stack("s")
    with pytest.raises(siglo.AmbiguousStackError):
        manager.checkpoint("s")
    manager.discard_stack(second)
    assert manager.get_stack("s") is first  # one live stack of the id again
    with pytest.raises(siglo.UnknownStackError):
        manager.checkpoint("nope")
    with pytest.raises(siglo.InvalidArgumentError, match="ttl_ms"):
        manager.checkpoint("s", ttl_ms=0)
    with pytest.raises(siglo.InvalidArgumentError, match="expected_revision"):
        manager.checkpoint("s", expected_revision=-1)
    with pytest.raises(siglo.InvalidArgumentError, match="redact_fields"):
        manager.checkpoint("s", redact_fields="token")
    with pytest.raises(siglo.InvalidArgumentError, match="use_storage"):
        manager.use_storage(object())  # type: ignore[arg-type]
    assert manager.get_stack("s").revision == 0
    assert len(manager.create_stack().stack_id) == 36


async def test_use_storage_configures_the_default_manager(memory: siglo.Backend) -> None:
    previous = siglo.default_storage_manager.adapter
    try:
        siglo.use_storage(memory)
        assert siglo.default_storage_manager.adapter is memory.adapter
    finally:
        siglo.use_storage(previous)


def test_manager_without_adapter_still_snapshots() -> None:
    manager = StorageManager()
    manager.create_stack("s")
    assert manager.checkpoint("s").revision == 1
    assert asyncio.run(manager.load_checkpoint("s")) is None


async def test_the_manager_keeps_each_ids_latest_stack_until_discarded(
    manager: StorageManager,
) -> None:
    """docs/configuration.md, "One manager, many requests": a long-lived manager holds
    the latest stack of every id it served, and a handler's discard lets it go."""
    for i in range(20):
        await manager.create_stack(f"kept-{i}").save()
    assert len(manager.stacks) == 20
    for i in range(20):
        stack = await manager.resume(f"kept-{i}")
        assert stack is not None
        manager.discard_stack(stack)
    # Each resume replaced the id's latest, and discarding it left nothing behind.
    assert manager.stacks == {}


async def test_resuming_one_id_again_and_again_keeps_no_dead_references(
    manager: StorageManager,
) -> None:
    """The manager's record of who holds a stack of an id (weak references) drops the
    ones whose stack is gone as it adds one: a long-lived manager that resumes an id on
    every request does not grow with the requests."""
    await manager.create_stack("often").save()
    for _ in range(500):
        stack = await manager.resume("often")
        assert stack is not None
        del stack
    # The latest (the manager holds it) and at most one more not yet pruned.
    assert len(manager._live["often"]) <= 2


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_stack_read_through_the_fallback_is_saved_in_its_namespace(
    kind: str, tmp_path: Any
) -> None:
    """``namespace_fallback`` (on by default) lets tenant T read the un-namespaced ``c7``;
    the stack resumed is T's, at revision 0: its save creates T's checkpoint and never
    overwrites the un-namespaced one, which another owner still holds."""
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'fallback.db'}"
    async with siglo.connect(url) as backend:
        manager = StorageManager(backend)
        legacy = manager.create_stack("c7")
        legacy.set("x", "owner", "legacy")
        await legacy.save(expected_revision=0)
        manager.discard_stack(legacy)
        stack = await manager.resume("c7", namespace="tenant-t")
        assert stack is not None and stack.context("x") == {"owner": "legacy"}
        assert (stack.namespace, stack.revision) == ("tenant-t", 0)
        stack.set("x", "owner", "tenant-t")
        saved = await stack.save(expected_revision=stack.revision)
        assert (saved.namespace, saved.revision) == ("tenant-t", 1)
        kept = await backend.adapter.get_checkpoint("c7")
        assert kept is not None and kept.revision == 1 and kept.contexts["x"] == {"owner": "legacy"}
        own = await backend.adapter.get_checkpoint("c7", "tenant-t", fallback=False)
        assert own is not None and own.contexts["x"] == {"owner": "tenant-t"}


@pytest.mark.parametrize("optional", ["none", "all"])
async def test_a_snapshot_is_encoded_in_the_wire_order_a_backend_encodes_again(
    optional: str,
) -> None:
    """The manager's snapshot put ``workflowId`` and ``namespace`` after ``timestamp``
    (and fields it does not know first), where ``Checkpoint.to_wire`` — what a backend
    that encodes a checkpoint again writes, as an import into PostgreSQL does — puts
    them after ``stackId``: an export, imported elsewhere and exported again, was not
    the same bytes (docs/operating.md says it is; a black-box auditor). A snapshot's
    bytes are now to_wire's, key for key, every optional field present or none."""
    import orjson

    async with siglo.connect("memory://") as backend:
        manager = siglo.StorageManager(backend)
        if optional == "all":
            stack = manager.restore_checkpoint(
                {
                    "version": 2,
                    "schemaVersion": "2.0.0",
                    "stackId": "s",
                    "workflowId": "wf",
                    "namespace": "t",
                    "type": "execution",
                    "status": "running",
                    "revision": 0,
                    "chains": [],
                    "contexts": {"a": {"v": 1}},
                    "timestamp": 1,
                    "metadata": {"k": 1},
                    "vendorField": {"kept": True},  # a field siglo does not know
                }
            )
        else:
            stack = manager.create_stack("s")
            stack.set("a", "v", 1)
        await manager.save(stack, ttl_ms=60_000 if optional == "all" else None)
        stored = await backend.raw_adapter.get_checkpoint("s", stack.namespace, fallback=False)
        assert stored is not None
        if optional == "all":
            assert stored.extra == {"vendorField": {"kept": True}}
            assert stored.expires_at is not None and stored.workflow_id == "wf"
        assert stored.to_json() == orjson.dumps(stored.to_wire())
