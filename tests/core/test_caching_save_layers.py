"""A cached step's entry, saved with its checkpoint (``save_checkpoint_caching``), goes
through every layer ``set_cached_step`` goes through: redaction (by the flow), sealing at
the entry's own location (encrypted per namespace), offloading of a large value, the
traced adapter's span; and a third-party adapter that does not override it gets the two
calls. On SQLite, PostgreSQL and Redis (one transaction or script there) and memory.
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ops_support import shared_store

import siglo
from siglo import Step, flow
from siglo.adapter import CacheEntry
from siglo.codec import REF_KEY
from siglo.config import Settings
from siglo.records import ContextChangeEvent
from siglo.sealing import is_sealed
from siglo_memory import MemoryStorageAdapter

SECRET = "cached-SECRET-7f1e"
BIG = "x" * 4_096


def cached_flow(name: str) -> Any:
    async def fetch(inp: dict[str, Any]) -> dict[str, Any]:
        return {"run": inp["run"], "card": SECRET, "text": BIG}

    async def settle(inp: dict[str, Any]) -> str:
        return f"settled {inp['run']}"

    return flow(
        Step.create("fetch", fetch).cache(ttl_ms=600_000, key=lambda inp: f"fetch-{inp['run']}"),
        Step.create("settle", settle),
        name=name,
    )


@contextlib.asynccontextmanager
async def _url(kind: str) -> AsyncIterator[str]:
    if kind == "memory":
        yield "memory://"
        return
    async with shared_store(kind) as store:
        yield store.url


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres", "redis"])
async def test_a_cached_steps_entry_is_redacted_sealed_and_offloaded(
    kind: str, tmp_path: Path
) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    settings = Settings(
        encryption_keys={"k1": key},
        redact_fields=frozenset({"card"}),
        offload_min_bytes=1_024,
        blob_url=(tmp_path / "blobs").as_uri(),
    )
    async with _url(kind) as url, siglo.connect(url, settings=settings) as backend:
        manager = siglo.StorageManager(backend, error_mode="strict")
        work = cached_flow(f"layers-{kind}")
        for ns in (None, "tenant-a"):
            # Another stack id per namespace: a namespaced run would otherwise find
            # the un-namespaced one (namespace fallback) and run nothing.
            out = await work.run({"run": "r"}, manager=manager, stack_id=f"r-{ns}", namespace=ns)
            assert out == "settled r"
            got = await backend.adapter.get_cached_step(
                "fetch-r", **({} if ns is None else {"namespace": ns})
            )
            assert got == {"run": "r", "card": "[REDACTED]", "text": BIG}
            raw = await backend.raw_adapter.get_cached_step(
                "fetch-r", **({} if ns is None else {"namespace": ns})
            )
            # Sealed, then offloaded (a reference to the sealed bytes): neither the
            # secret nor the value is in what the store holds.
            assert REF_KEY in raw or is_sealed(raw), raw
            assert SECRET not in repr(raw) and BIG not in repr(raw)
        assert list((tmp_path / "blobs").glob("??/*"))


class Apart(MemoryStorageAdapter):
    """A third-party adapter: save_checkpoint_caching not overridden."""

    save_checkpoint_caching = siglo.StorageAdapter.save_checkpoint_caching  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def set_cached_step(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("set_cached_step")
        await super().set_cached_step(*args, **kwargs)

    async def save_checkpoint_streamed(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("save_checkpoint_streamed")
        await super().save_checkpoint_streamed(*args, **kwargs)


async def test_an_adapter_that_does_not_override_it_gets_the_two_calls() -> None:
    adapter = Apart()
    first = siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
    await adapter.save_checkpoint(first, expected_revision=0)
    change = ContextChangeEvent(stack_id="s", step_id="p", key="k", value=1, timestamp=1)
    stale = siglo.Checkpoint(stack_id="s", revision=3, timestamp=2)
    with pytest.raises(siglo.CheckpointConflictError):
        await adapter.save_checkpoint_caching(
            stale, [change], CacheEntry("e", {"v": 1}, 60_000, "ns"), expected_revision=2
        )
    assert sorted(adapter.calls) == ["save_checkpoint_streamed", "set_cached_step"]
    assert await adapter.get_cached_step("e", namespace="ns") == {"v": 1}
    assert await adapter.get_checkpoint("s") == first
    # Bad input writes nothing.
    with pytest.raises(siglo.InvalidArgumentError):
        await adapter.save_checkpoint_caching(
            stale, [], CacheEntry("bad", 1, -1), expected_revision=1
        )
    assert await adapter.get_cached_step("bad") is siglo.MISSING
