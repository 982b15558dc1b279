"""A backend behind the pipeline answers for its workflow lock as the backend itself does:
the lock, its lease and its wait (StorageAdapter declares them with class defaults, which
the pipeline's adapter used to answer instead)."""

from __future__ import annotations

from pathlib import Path

import pytest

import siglo
from siglo.pipeline import PipelineAdapter

pytest.importorskip("aiosqlite")


async def test_the_pipelines_adapter_answers_the_backends_workflow_lock(tmp_path: Path) -> None:
    settings = siglo.Settings(redact_fields=frozenset({"card"}))
    url = f"sqlite:///{tmp_path / 'lock.db'}"
    async with siglo.connect(
        url, settings=settings, workflow_lock_ttl_ms=4_321, workflow_lock_timeout_ms=1_234
    ) as backend:
        piped, raw = backend.adapter, backend.raw_adapter
        assert isinstance(piped, PipelineAdapter)
        assert raw.workflow_lock is not None
        assert piped.workflow_lock is raw.workflow_lock
        assert (piped.workflow_lock_ttl_ms, piped.workflow_lock_timeout_ms) == (4_321, 1_234)
        piped.workflow_lock_ttl_ms = 5_000
        assert raw.workflow_lock_ttl_ms == 5_000


async def test_the_pipelines_adapter_forwards_the_payload_walk_as_stored(tmp_path: Path) -> None:
    """An encrypting connection declares the backend's payload_scan, so it answers it: the
    backend's walk and rewrite, payloads as stored (sealed), as siglo rekey uses them."""
    key = "A" * 43 + "="
    settings = siglo.load_settings(encryption_keys={"k1": key})
    async with siglo.connect(f"sqlite:///{tmp_path / 'p.db'}", settings=settings) as backend:
        adapter = backend.adapter
        assert isinstance(adapter, PipelineAdapter)
        assert adapter.supports(siglo.Capability.PAYLOAD_SCAN)
        await adapter.set_cached_step("k", {"card": "4111"}, 60_000, namespace="t")
        (item,) = [i async for i in adapter.scan_payloads("step")]
        assert item.key == "@1:t:k" and item.fields["value"]["$siglo"].startswith("v1.e.k1.")
        assert await adapter.swap_payload(item, dict(item.fields))
        assert await adapter.get_cached_step("k", namespace="t") == {"card": "4111"}
        # And the compare-and-delete siglo erase uses.
        (item,) = [i async for i in adapter.scan_payloads("step")]
        assert await adapter.delete_payload(item)
        assert not await adapter.delete_payload(item)  # gone already
        assert await adapter.get_cached_step("k", namespace="t") is siglo.MISSING
