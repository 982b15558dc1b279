"""Values of a form siglo reserves for its own (a sealed value ``{"$siglo": "…"}``, a
reference to an offloaded value ``{"$siglo.blob": "…", "bytes": n}``, the metadata keys
``$siglo`` and ``$sigloIndex``) are refused where an application hands them over —
the manager, a flow, and the adapter of a connection with a pipeline — before anything
is written: stored, each would read back as what it looks like (a stack that no load
can open, a value taken for a blob). The backend's own adapter (``raw_adapter``) stores
what it is given: it is how stored forms are moved (docs/encryption.md).
"""

from __future__ import annotations

import base64
import inspect
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import siglo
from siglo import Checkpoint, StorageManager
from siglo.adapter import CacheEntry, StorageAdapter
from siglo.config import Settings
from siglo.errors import ReservedFormError
from siglo.records import ContextChangeEvent, WaitRecord
from siglo.transfer import export_lines, import_lines

SEALED = {"$siglo": "v1.e.k1.not-a-ciphertext"}
REFERENCE = {"$siglo.blob": "0" * 64, "bytes": 3}
KEY = base64.b64encode(bytes(32)).decode()


def _settings(kind: str, tmp_path: Path) -> Settings:
    """A connection with a pipeline of each kind: redaction alone, encryption, and a
    blob store (offloading, below the pipeline)."""
    if kind == "redaction":
        return Settings(redact_fields=frozenset({"card"}))
    if kind == "encryption":
        return siglo.load_settings(encryption_keys={"k1": KEY})
    return siglo.load_settings(blob_url=f"file://{tmp_path / 'blobs'}", offload_min_bytes=1024)


PIPELINES = ["redaction", "encryption", "offloading"]


def _cp(stack: str = "s", **fields: Any) -> Checkpoint:
    return Checkpoint(stack_id=stack, revision=1, timestamp=1, **fields)


def _change(value: Any) -> ContextChangeEvent:
    return ContextChangeEvent(stack_id="s", step_id="a", key="v", value=value, timestamp=1)


def _wait(**fields: Any) -> WaitRecord:
    return WaitRecord(correlation_key="w", stack_id="s", **fields)


Write = Callable[[StorageAdapter], Awaitable[Any]]

# Each write of the adapter that takes an application value, with that value of a form
# siglo reserves. `test_every_write_of_a_value_is_listed` holds the table to the
# adapter's methods.
WRITES: dict[str, list[Write]] = {
    "save_checkpoint": [
        lambda a: a.save_checkpoint(_cp(contexts={"a": SEALED})),
        lambda a: a.save_checkpoint(_cp(contexts={"a": {"v": REFERENCE}})),
        lambda a: a.save_checkpoint(_cp(metadata={"$siglo": "x"})),
        lambda a: a.save_checkpoint(_cp(metadata={"$sigloIndex": {"f": "t"}, "ok": 1})),
    ],
    "save_checkpoint_streamed": [
        lambda a: a.save_checkpoint_streamed(_cp(contexts={"a": SEALED}), []),
        lambda a: a.save_checkpoint_streamed(_cp(), [_change(SEALED)]),
    ],
    "save_checkpoint_unlocking": [
        lambda a: a.save_checkpoint_unlocking(_cp(contexts={"a": {"v": REFERENCE}})),
        lambda a: a.save_checkpoint_unlocking(_cp(), [_change(REFERENCE)]),
    ],
    "save_checkpoint_caching": [
        lambda a: a.save_checkpoint_caching(_cp(metadata={"$siglo": "x"}), [], _entry(1)),
        lambda a: a.save_checkpoint_caching(_cp(), [], _entry(SEALED)),
        lambda a: a.save_checkpoint_caching(_cp(), [_change(SEALED)], _entry(1)),
    ],
    "on_context_change": [lambda a: a.on_context_change(_change(SEALED))],
    "set_cached_step": [
        lambda a: a.set_cached_step("k", SEALED),
        lambda a: a.set_cached_step("k", REFERENCE),
    ],
    "save_wait_record": [
        lambda a: a.save_wait_record(_wait(event_payload=SEALED)),
        lambda a: a.save_wait_record(_wait(metadata=SEALED)),
    ],
    "create_wait_record": [
        lambda a: a.create_wait_record(_wait(event_payload=REFERENCE)),
        lambda a: a.create_wait_record(_wait(metadata=SEALED)),
    ],
    "claim_wait_record": [lambda a: a.claim_wait_record("c", "me", event_payload=SEALED)],
}


def _entry(value: Any) -> CacheEntry:
    return CacheEntry(key="k", value=value)


def test_every_write_of_a_value_is_listed() -> None:
    """Every public method of the adapter with a parameter that carries an application
    value is in WRITES: a write added later is refused here until it is listed (and
    checked). ``on_cache_event`` carries a cache event (a key, a type, a time), no value;
    ``swap_payload`` writes stored forms (``siglo rekey``), as the backend's own adapter
    does."""
    carrying = {"checkpoint", "changes", "entry", "record", "value", "event_payload", "event"}
    writes = {
        name
        for name, method in inspect.getmembers(StorageAdapter, inspect.iscoroutinefunction)
        if not name.startswith("_") and carrying & set(inspect.signature(method).parameters)
    }
    assert writes - {"on_cache_event"} == set(WRITES)


async def _nothing_stored(adapter: StorageAdapter) -> None:
    assert await adapter.get_checkpoint("s") is None
    assert await adapter.get_cached_step("k") is siglo.MISSING
    assert await adapter.get_wait_record("w") is None
    assert await adapter.get_context_changes("s", "a") == {}
    claimable = await adapter.get_wait_record("c")
    assert claimable is not None and claimable.status == "waiting"
    assert claimable.event_payload is None


@pytest.mark.parametrize("kind", PIPELINES)
async def test_the_adapter_of_a_connection_with_a_pipeline_refuses_them(
    kind: str, tmp_path: Path
) -> None:
    settings = _settings(kind, tmp_path)
    async with siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as backend:
        adapter = backend.adapter
        assert adapter is not backend.raw_adapter
        await adapter.create_wait_record(WaitRecord(correlation_key="c", stack_id="t"))
        for name, writes in WRITES.items():
            for number, write in enumerate(writes):
                with pytest.raises(ReservedFormError, match="reserves"):
                    await write(adapter)
                await _nothing_stored(adapter)
                assert name and number >= 0  # which write, in the failure's locals


@pytest.mark.parametrize("kind", ["bare", *PIPELINES])
async def test_the_manager_refuses_reserved_metadata_keys(kind: str, tmp_path: Path) -> None:
    """``$siglo`` would be read back as sealed metadata (every load of the stack then
    failing), ``$sigloIndex`` replaced by the blind index: refused at the save, nothing
    stored; the same stack saves once its metadata is renamed."""
    settings = Settings() if kind == "bare" else _settings(kind, tmp_path)
    async with siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as backend:
        manager = StorageManager(backend, settings=settings)
        for number, key in enumerate(("$siglo", "$sigloIndex")):
            stack = manager.create_stack(f"s{number}")
            stack.set("a", "v", 1)
            stack.metadata[key] = "x"
            with pytest.raises(ReservedFormError, match=f"metadata key '\\{key}'"):
                await stack.save()
            assert await manager.load_checkpoint(f"s{number}") is None
            del stack.metadata[key]
            stack.metadata["siglo"] = "x"
            await stack.save()
            loaded = await manager.load_checkpoint(f"s{number}")
            assert loaded is not None and loaded.metadata["siglo"] == "x"


async def test_the_backends_own_adapter_stores_what_it_is_given(tmp_path: Path) -> None:
    """The stored forms a pipeline writes, moved with ``raw_adapter`` (as
    docs/encryption.md moves a sealed checkpoint): stored as given."""
    settings = _settings("encryption", tmp_path)
    async with siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as backend:
        await backend.raw_adapter.save_checkpoint(_cp(contexts={"a": SEALED}))
        stored = await backend.raw_adapter.get_checkpoint("s")
        assert stored is not None and stored.contexts == {"a": SEALED}


async def test_an_import_of_a_reserved_form_writes_nothing(tmp_path: Path) -> None:
    """A dump whose checkpoint holds a reserved form (exported from a store without a
    pipeline, where the backend's adapter stored it) is refused whole by a store with
    one: the line named, nothing imported."""
    source = f"sqlite:///{tmp_path / 'source.db'}"
    async with siglo.connect(source) as backend:
        await backend.adapter.save_checkpoint(_cp("good", contexts={"a": {"v": 1}}))
        await backend.adapter.save_checkpoint(_cp("bad", metadata={"$sigloIndex": "x"}))
        lines = [line async for line in export_lines(backend.adapter)]
    ids = [json.loads(line).get("document", {}).get("stackId") for line in lines]
    assert sorted(ids[1:3]) == ["bad", "good"]
    target = f"sqlite:///{tmp_path / 'target.db'}"
    settings = _settings("redaction", tmp_path)
    async with siglo.connect(target, settings=settings) as backend:
        bad = ids.index("bad") + 1
        with pytest.raises(
            ReservedFormError, match=rf"line {bad} of the dump.*nothing was imported"
        ):
            await import_lines(backend.adapter, lines)
        assert await backend.adapter.get_checkpoint("good") is None


@pytest.mark.parametrize("kind", ["bare", *PIPELINES, "encryption and offloading"])
async def test_a_reference_deeper_than_siglo_puts_them_is_plain_data(
    kind: str, tmp_path: Path
) -> None:
    """References stand where the offloading layer puts them: a context's top-level
    values, a cached step's output, whole. One form deeper (a context value's field, an
    event payload's, a stream value's, a step output's) is the application's data, and
    reads back as given on every connection: with encryption it was refused as a
    reference "this connection cannot resolve (no blob store)", beside a blob store (a
    black-box auditor)."""
    if kind == "bare":
        settings = Settings()
    elif kind == "encryption and offloading":
        settings = siglo.load_settings(
            encryption_keys={"k1": KEY},
            blob_url=f"file://{tmp_path / 'blobs'}",
            offload_min_bytes=1024,
        )
    else:
        settings = _settings(kind, tmp_path)
    nested = {"x": REFERENCE}
    async with siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as backend:
        manager = StorageManager(backend, settings=settings)
        stack = manager.create_stack("s")
        stack.set("a", "v", nested)
        await stack.save()
        adapter = backend.adapter
        await adapter.set_cached_step("k", nested)
        await adapter.create_wait_record(_wait(metadata=nested))
        assert await adapter.claim_wait_record("w", "me", event_payload=nested) is not None
        loaded = await manager.load_checkpoint("s")
        assert loaded is not None and loaded.contexts["a"] == {"v": nested}
        assert await adapter.get_context_changes("s", "a") == {"v": nested}
        assert await adapter.get_cached_step("k") == nested
        wait = await adapter.get_wait_record("w")
        assert wait is not None and (wait.event_payload, wait.metadata) == (nested, nested)


def test_a_flows_key_is_not_reserved() -> None:
    """Only the exact forms are reserved: a dict with ``$siglo`` beside other keys, a
    reference with a third key, a ``$siglo`` that is not text — plain data."""
    from siglo import codec

    for value in (
        {"$siglo": "x", "other": 1},
        {"$siglo": 1},
        {**REFERENCE, "extra": True},
        {"$siglo.blob": "d", "bytes": "3"},
    ):
        codec.refuse_reserved_value(value, "value")
        codec.refuse_reserved_forms({"a": value}, "stack")
