"""The collector's grace period is a setting (``blob_grace_ms``), and an S3 blob store
opened for a backend spaces its refreshes by it (``refresh_ms`` = a quarter of it, unless
the URL names one): a collector run with the configured grace never removes a blob that a
save referenced within three quarters of it, even when its walk missed that save's
checkpoint (docs/large-state.md, "Collecting blobs")."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from s3_support import new_bucket, s3_url

import siglo
from siglo import Checkpoint
from siglo.blobs import BoundedBlobStore, blob_digest
from siglo.config import DEFAULT_BLOB_GRACE_MS, Settings, load_settings
from siglo.errors import InvalidArgumentError
from siglo.offload import OffloadAdapter, collect_blobs, resolving
from siglo.s3 import S3BlobStore

pytestmark = pytest.mark.rule("blobs.offload", "blobs.collect")

BIG = "large tool output " * 2_000
GRACE_MS = 8_000
REFRESH_MS = GRACE_MS // 4


def _cp(stack: str, value: str) -> Checkpoint:
    return Checkpoint(stack_id=stack, revision=1, timestamp=1, contexts={"s": {"v": value}})


def _now() -> int:
    return int(time.time() * 1000)


async def _keep_until(store: Any) -> dict[str, int]:
    return {digest: keep async for digest, keep in store.scan()}


async def test_a_collector_with_the_configured_grace_keeps_what_a_save_referenced(
    s3_endpoint: str, tmp_path: Path
) -> None:
    settings = Settings(
        offload_min_bytes=1_024,
        blob_url=s3_url(s3_endpoint, new_bucket(s3_endpoint)),
        blob_grace_ms=GRACE_MS,
    )
    digest = blob_digest(f'"{BIG}"'.encode())
    async with (
        siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as backend,
        # A collector whose walk missed the save's checkpoint (it walked before the
        # checkpoint was written): it sees no reference at all.
        siglo.connect(f"sqlite:///{tmp_path / 'empty.db'}") as missed,
    ):
        adapter = resolving(backend.adapter)  # the offloading layer, below the pipeline
        assert isinstance(adapter, OffloadAdapter)
        store = adapter.offloader.store
        assert isinstance(store, BoundedBlobStore) and isinstance(store.inner, S3BlobStore)
        assert store.inner.refresh_ms == REFRESH_MS
        await adapter.save_checkpoint(_cp("a", BIG))
        await adapter.delete_checkpoint("a")  # the blob is unreferenced now
        (kept,) = (await _keep_until(store)).values()
        # A save references the blob again, late in the refresh window: its put sends no
        # upload (the keep-until stays where it was, up to refresh_ms behind).
        await asyncio.sleep(max(0, kept + REFRESH_MS - 500 - _now()) / 1000)
        put_at = _now()
        await adapter.save_checkpoint(_cp("b", BIG))
        assert await _keep_until(store) == {digest: kept}
        assert put_at - kept <= REFRESH_MS
        # Every collector that started within grace - refresh_ms of the put keeps it.
        for started in (
            put_at,
            put_at + (GRACE_MS - REFRESH_MS) // 2,
            put_at + GRACE_MS - REFRESH_MS,
        ):
            done = await collect_blobs(missed.adapter, store, grace_ms=GRACE_MS, now_ms=started)
            assert done.removed == 0, f"a collector at put + {started - put_at} ms removed it"
        got = await adapter.get_checkpoint("b")
        assert got is not None and got.contexts["s"]["v"] == BIG
        # The condition is exact, not loose: a collector that missed the reference and
        # started past keep-until + grace removes the blob (a save that took that long
        # between its put and its checkpoint write would dangle).
        done = await collect_blobs(
            missed.adapter, store, grace_ms=GRACE_MS, now_ms=kept + GRACE_MS + 1
        )
        assert done.removed == 1


async def test_a_refresh_ms_in_the_url_wins(s3_endpoint: str, tmp_path: Path) -> None:
    url = s3_url(s3_endpoint, new_bucket(s3_endpoint))
    for option, expected in (("", DEFAULT_BLOB_GRACE_MS // 4), ("&refresh_ms=0", 0)):
        settings = Settings(offload_min_bytes=1_024, blob_url=url + option)
        async with siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as b:
            adapter = resolving(b.adapter)  # the offloading layer, below the pipeline
            assert isinstance(adapter, OffloadAdapter)
            store = adapter.offloader.store
            assert isinstance(store, BoundedBlobStore) and isinstance(store.inner, S3BlobStore)
            assert store.inner.refresh_ms == expected


def test_blob_grace_ms_is_a_setting() -> None:
    assert Settings().blob_grace_ms == DEFAULT_BLOB_GRACE_MS == 3_600_000
    loaded = load_settings(environ={"SIGLO_BLOB_GRACE_MS": "120000"})
    assert loaded.blob_grace_ms == 120_000
    assert loaded.describe()["blob_grace_ms"] == 120_000
    with pytest.raises(InvalidArgumentError, match="blob_grace_ms must be an integer"):
        Settings(blob_grace_ms=-1)
    with pytest.raises(InvalidArgumentError, match="SIGLO_BLOB_GRACE_MS must be an integer"):
        load_settings(environ={"SIGLO_BLOB_GRACE_MS": "soon"})


def test_siglo_collect_blobs_uses_the_settings_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from siglo.cli import cli
    from siglo.config import reset_settings

    blobs = tmp_path / "blobs"
    toml = (
        f'url = "sqlite:///{tmp_path / "app.db"}"\noffload_min_bytes = 1024\n'
        f'blob_url = "{blobs.as_uri()}"\n'
    )
    (tmp_path / "siglo.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    reset_settings()

    async def write() -> None:
        async with siglo.connect() as backend:
            await backend.adapter.save_checkpoint(_cp("gone", BIG))
            await backend.adapter.delete_checkpoint("gone")

    try:
        asyncio.run(write())
        runner = CliRunner()
        kept = runner.invoke(cli, ["collect-blobs", "--json"])  # the default grace: 1 h
        assert kept.exit_code == 0 and '"kept": 1' in kept.output, kept.output
        (tmp_path / "siglo.toml").write_text(toml + "blob_grace_ms = 0\n")
        reset_settings()
        removed = runner.invoke(cli, ["collect-blobs", "--json"])
        assert removed.exit_code == 0 and '"removed": 1' in removed.output, removed.output
    finally:
        reset_settings()
