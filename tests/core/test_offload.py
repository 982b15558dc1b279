"""Offloaded values (SPEC §13, issue 34): large context values and step outputs go to a
blob store by content hash, reads resolve them, and the collector removes exactly the
blobs no live checkpoint references once their grace period is over — on every real
backend, with the directory store."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from raw_storage import KINDS, any_backend, raw_bytes

import siglo
from siglo import Checkpoint, StorageManager
from siglo.adapter import Capability
from siglo.blobs import BlobStore, DirectoryBlobStore, MemoryBlobStore, blob_digest, open_blob_store
from siglo.config import Settings
from siglo.errors import InvalidArgumentError
from siglo.offload import (
    REF_KEY,
    OffloadAdapter,
    Offloader,
    collect_blobs,
    offload_adapter,
    references,
)

pytestmark = pytest.mark.rule("blobs.offload", "blobs.collect")

BIG = "large tool output " * 2_000  # ~36 KB


@asynccontextmanager
async def offloading(kind: str, store: BlobStore, **options: Any) -> AsyncIterator[siglo.Backend]:
    """A backend of ``kind`` on private storage with values of 1 KB or more offloaded."""
    async with any_backend(kind, **options) as backend:
        own = backend.adapter
        backend.adapter = offload_adapter(own, Offloader(store, 1_024))
        try:
            yield backend
        finally:
            backend.adapter = own  # the backend's clean-up looks at its own adapter


def _cp(stack: str, revision: int, **contexts: dict[str, Any]) -> Checkpoint:
    return Checkpoint(stack_id=stack, revision=revision, timestamp=revision, contexts=contexts)


async def _blobs(store: BlobStore) -> set[str]:
    return {digest async for digest, _ in store.scan()}


@pytest.mark.parametrize("kind", KINDS)
async def test_large_values_are_stored_once_and_read_back(kind: str, tmp_path: Path) -> None:
    store = DirectoryBlobStore(tmp_path / "blobs")
    async with offloading(kind, store) as backend:
        a = backend.adapter
        cp = _cp("s", 1, chat={"history": BIG, "turns": 3}, copy={"again": BIG})
        await a.save_checkpoint(cp)
        got = await a.get_checkpoint("s")
        assert got == cp
        # One blob for the value stored twice; the stored checkpoint holds references.
        assert await _blobs(store) == {blob_digest(f'"{BIG}"'.encode())}
        stored = await backend.raw_adapter.get_checkpoint("s")
        assert (
            stored is not None
            and list(references(stored)) == [blob_digest(f'"{BIG}"'.encode())] * 2
        )
        assert stored.contexts["chat"]["turns"] == 3
        assert BIG.encode() not in await raw_bytes(kind, backend)
        # A cached step output too.
        await a.set_cached_step("fetch", {"body": BIG})
        assert await a.get_cached_step("fetch") == {"body": BIG}
        assert len(await _blobs(store)) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_the_collector_removes_only_unreferenced_stale_blobs(
    kind: str, tmp_path: Path
) -> None:
    store = DirectoryBlobStore(tmp_path / "blobs")
    async with offloading(kind, store) as backend:
        a = backend.adapter
        await a.save_checkpoint(_cp("keep", 1, s={"v": BIG}))
        await a.save_checkpoint(_cp("gone", 1, s={"v": BIG + "gone"}))
        await a.save_checkpoint(
            Checkpoint(stack_id="keep", namespace="tenant", revision=1, timestamp=1,
                       contexts={"s": {"v": BIG + "ns"}})
        )  # fmt: skip
        await a.save_checkpoint(_cp("changes", 1, s={"v": BIG + "old"}))
        await a.save_checkpoint(_cp("changes", 2, s={"v": BIG + "new"}), expected_revision=1)
        assert await a.delete_checkpoint("gone") is True
        assert len(await _blobs(store)) == 5
        # Within the grace period nothing goes.
        early = await collect_blobs(a, store)
        assert (early.referenced, early.removed, early.kept) == (3, 0, 2)
        later = await collect_blobs(a, store, now_ms=int(time.time() * 1000) + 7_200_000)
        assert (later.referenced, later.removed) == (3, 2)
        for stack, ns in (("keep", None), ("keep", "tenant"), ("changes", None)):
            assert await a.get_checkpoint(stack, ns) is not None  # nothing dangles
        assert len(await _blobs(store)) == 3


async def test_a_blob_a_save_refreshes_is_not_collected(tmp_path: Path) -> None:
    store = DirectoryBlobStore(tmp_path / "blobs")
    data = b'"x"'
    digest = blob_digest(data)
    await store.put(digest, data)
    old = time.time() - 10_000
    path = tmp_path / "blobs" / digest[:2] / digest
    os.utime(path, (old, old))
    await store.put(digest, data)  # a save referencing it again refreshes it
    assert await store.delete_stale(digest, int(time.time() * 1000) - 5_000) is False
    os.utime(path, (old, old))
    assert await store.delete_stale(digest, int(time.time() * 1000) - 5_000) is True
    assert await store.get(digest) is None
    assert list(path.parent.iterdir()) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_load_racing_a_save_and_the_collector_reads_the_new_revision(
    kind: str, tmp_path: Path
) -> None:
    """A load reads the checkpoint; a save replaces it and the collector, walking the new
    revision, removes the old revision's blob (put long ago: past its grace) before the
    load reads it. The load raised DanglingReferenceError for a healthy run, which a
    worker fails (a black-box auditor, with ``siglo collect-blobs`` in a loop); it reads
    the checkpoint again and returns the revision stored now."""
    store = DirectoryBlobStore(tmp_path / "blobs")
    async with offloading(kind, store) as backend:
        a: Any = backend.adapter
        await a.save_checkpoint(_cp("s", 1, s={"v": BIG + "old"}))
        new = _cp("s", 2, s={"v": BIG + "new"})
        read = a.inner.get_checkpoint
        raced: list[int] = []

        async def racing(*args: Any, **kwargs: Any) -> Any:
            found = await read(*args, **kwargs)
            if not raced:
                raced.append(1)
                await a.save_checkpoint(new, expected_revision=1)
                later = int(time.time() * 1000) + 7_200_000  # the old blob past its grace
                collected = await collect_blobs(a, store, now_ms=later)
                assert collected.removed == 1
            return found

        a.inner.get_checkpoint = racing
        assert await a.get_checkpoint("s") == new
        assert raced == [1]


async def test_a_dangling_reference_is_a_clear_error() -> None:
    """A value the blob store does not have is that record's fault, not an outage."""
    store = MemoryBlobStore()
    async with offloading("memory", store) as backend:
        await backend.adapter.save_checkpoint(_cp("s", 1, s={"v": BIG}))
        (digest,) = await _blobs(store)
        await store.delete(digest)
        # Not a StorageAdapterError: the store answered; the value is gone from it.
        with pytest.raises(
            siglo.DanglingReferenceError, match=f"stack 's', s.v references blob {digest}"
        ):
            await backend.adapter.get_checkpoint("s")


async def test_a_damaged_blob_is_never_read_as_the_value(tmp_path: Path) -> None:
    """A blob altered in the store (still JSON) was read as the value; a truncated one
    failed with a bare JSON error naming neither blob nor value (a black-box auditor).
    The bytes are checked against the digest their reference names; ``siglo show``
    names the blob and what to do."""
    store = DirectoryBlobStore(tmp_path / "blobs")
    url = f"sqlite:///{tmp_path / 'damaged.db'}"
    settings = Settings(offload_min_bytes=1_024, blob_url=store.url)
    async with siglo.connect(url, settings=settings) as backend:
        await backend.adapter.save_checkpoint(_cp("u", 1, c={"v": {"amount": 2000, "n": BIG}}))
        await backend.adapter.save_checkpoint(_cp("t", 1, c={"v": BIG + "t"}))
        paths = {p.name: p for p in (tmp_path / "blobs").glob("??/*")}
        (u_digest,) = [d for d, p in paths.items() if b"2000" in p.read_bytes()]
        (t_digest,) = set(paths) - {u_digest}
        altered = paths[u_digest].read_bytes().replace(b"2000", b"9000")
        paths[u_digest].write_bytes(altered)  # the same length, valid JSON
        paths[t_digest].write_bytes(paths[t_digest].read_bytes()[:100])  # truncated
        with pytest.raises(siglo.DamagedBlobError, match=f"c.v references blob {u_digest}"):
            await backend.adapter.get_checkpoint("u")
        with pytest.raises(siglo.DamagedBlobError, match=f"blob {t_digest}.*do not match"):
            await backend.adapter.get_checkpoint("t")
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "siglo", "show", url, "u"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "SIGLO_OFFLOAD_MIN_BYTES": "1024",
            "SIGLO_BLOB_URL": store.url,
            "PYTHONPATH": os.pathsep.join(sys.path),
        },
        timeout=60,
    )
    assert shown.returncode == 1, shown.stderr
    assert u_digest in shown.stderr and "restore it from a backup" in shown.stderr
    assert "9000" not in shown.stdout


def test_blobs_are_made_with_the_mode_the_umask_gives(tmp_path: Path) -> None:
    """Blob files were 0600 (``mkstemp``) whatever the umask: another account sharing
    the store's directory could not read them (a black-box auditor)."""
    store = DirectoryBlobStore(tmp_path / "blobs")
    before = os.umask(0o027)
    try:
        asyncio.run(store.put(blob_digest(b"{}"), b"{}"))
    finally:
        os.umask(before)
    (path,) = (tmp_path / "blobs").glob("??/*")
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_refresh_of_another_accounts_blob_writes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a file's owner may set its time, so a refresh (a later keep-until) of a blob
    another account wrote failed with "Operation not permitted" (a black-box auditor,
    two accounts sharing the directory). It writes the same bytes again in its place.
    The tests run as root, whom no file refuses ``utime``: the refusal is the kernel's
    answer to a non-owner, made here."""
    store = DirectoryBlobStore(tmp_path / "blobs")
    data = b'{"shared": true}'
    digest = blob_digest(data)
    asyncio.run(store.put(digest, data))
    (path,) = (tmp_path / "blobs").glob("??/*")
    first = path.stat().st_ino
    real_utime = os.utime
    refused: list[str] = []

    def utime(target: Any, times: Any = None, **kwargs: Any) -> None:
        if Path(target) == path and path.stat().st_ino == first:
            refused.append(str(target))
            raise PermissionError(1, "Operation not permitted", str(target))
        real_utime(target, times, **kwargs)

    monkeypatch.setattr(os, "utime", utime)
    keep = int(time.time() * 1000) + 3_600_000
    asyncio.run(store.put(digest, data, keep_until_ms=keep))
    assert refused == [str(path)]
    assert path.read_bytes() == data and path.stat().st_ino != first
    assert path.stat().st_mtime * 1000 >= keep - 1_000


async def test_connect_offloads_after_redaction(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    settings = Settings(offload_min_bytes=1_024, blob_url=url, redact_fields=frozenset({"key"}))
    async with siglo.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", settings=settings) as backend:
        manager = StorageManager(backend, error_mode="strict")
        stack = manager.create_stack("run")
        stack.set("step", "doc", {"key": "SECRET-9", "text": BIG})
        await manager.save_checkpoint("run")
        loaded = await backend.adapter.get_checkpoint("run")
        assert loaded is not None
        assert loaded.contexts["step"]["doc"] == {"key": "[REDACTED]", "text": BIG}
        blobs = list((tmp_path / "blobs").glob("??/*"))
        assert len(blobs) == 1 and b"SECRET-9" not in blobs[0].read_bytes()
        raw = await backend.raw_adapter.get_checkpoint("run")
        assert raw is not None and REF_KEY in raw.contexts["step"]["doc"]


async def test_a_backend_that_cannot_list_keeps_its_values_inline(tmp_path: Path) -> None:
    """Offloading for a backend without ``listing`` (the example filestore plugin) put
    blobs no collector could ever walk to: ``siglo collect-blobs`` refuses such a
    backend, so its blobs stayed for ever (a black-box auditor). Its values are stored
    inline, as another store's are."""
    url = f"filestore://{tmp_path / 'fs'}"
    blobs = tmp_path / "blobs"
    settings = Settings(url=url, offload_min_bytes=1_024, blob_url=blobs.as_uri())
    async with siglo.connect(settings=settings) as backend:
        assert Capability.LISTING not in backend.capabilities
        manager = StorageManager(backend, error_mode="strict")
        stack = manager.create_stack("run")
        stack.set("step", "doc", {"text": BIG})
        await manager.save_checkpoint("run")
        raw = await backend.raw_adapter.get_checkpoint("run")
        assert raw is not None and raw.contexts["step"]["doc"] == {"text": BIG}
    assert not blobs.exists() or not any(blobs.rglob("*"))


def test_settings_refuse_offloading_without_a_store() -> None:
    with pytest.raises(InvalidArgumentError, match="blob_url"):
        Settings(offload_min_bytes=10)
    with pytest.raises(InvalidArgumentError, match="offload_min_bytes"):
        Settings(offload_min_bytes=0, blob_url="memory://")
    with pytest.raises(InvalidArgumentError, match=r"file:///.*s3://bucket/prefix"):
        open_blob_store("gs://bucket")
    assert isinstance(open_blob_store("memory://"), MemoryBlobStore)


# -- the collector's rule, and a broken collector it catches -----------------------------------


async def _collection_holds(collect: Any, tmp_path: Path) -> None:
    """The rule ``blobs.collect`` against ``collect`` (a collector like collect_blobs)."""
    store = DirectoryBlobStore(tmp_path / "rule-blobs")
    async with offloading("memory", store) as backend:
        a = backend.adapter
        await a.save_checkpoint(_cp("live", 1, s={"v": BIG}))
        await a.save_checkpoint(
            Checkpoint(stack_id="live", namespace="n", revision=1, timestamp=1,
                       contexts={"s": {"v": BIG + "n"}})
        )  # fmt: skip
        await a.save_checkpoint(_cp("dead", 1, s={"v": BIG + "dead"}))
        await a.delete_checkpoint("dead")
        await collect(a, store, now_ms=int(time.time() * 1000) + 7_200_000)
        for stack, ns in (("live", None), ("live", "n")):
            try:
                await a.get_checkpoint(stack, ns)
            except siglo.DanglingReferenceError as exc:
                raise AssertionError(f"a reference dangles: {exc}") from exc
        assert len(await _blobs(store)) == 2, "an unreferenced blob was left behind"


async def test_collect_blobs_keeps_its_rule(tmp_path: Path) -> None:
    await _collection_holds(collect_blobs, tmp_path)


async def test_the_rule_catches_a_collector_that_forgets_namespaces(tmp_path: Path) -> None:
    async def un_namespaced_only(adapter: Any, store: BlobStore, *, now_ms: int) -> None:
        raw = adapter.inner
        referenced = set()
        page = await raw.list_checkpoints(namespace=None)
        for s in page.items:
            cp = await raw.get_checkpoint(s.stack_id, s.namespace, fallback=False)
            referenced.update(references(cp))
        async for digest, _ in store.scan():
            if digest not in referenced:
                await store.delete(digest)

    with pytest.raises(AssertionError, match="dangles"):
        await _collection_holds(un_namespaced_only, tmp_path)


async def test_the_rule_catches_a_collector_that_never_collects(tmp_path: Path) -> None:
    async def keeps_all(adapter: Any, store: BlobStore, *, now_ms: int) -> None:
        return None

    with pytest.raises(AssertionError, match="left behind"):
        await _collection_holds(keeps_all, tmp_path)


async def test_export_carries_values_and_import_offloads_them_again(tmp_path: Path) -> None:
    from siglo.transfer import export_lines, import_lines

    source_store, target_store = MemoryBlobStore(), DirectoryBlobStore(tmp_path / "target")
    async with offloading("sqlite", source_store) as source:
        await source.adapter.save_checkpoint(_cp("s", 1, step={"v": BIG, "n": 1}))
        lines = [line async for line in export_lines(source.adapter)]
    assert any(BIG.encode() in line for line in lines)  # the dump holds the value itself
    async with offloading("postgres", target_store) as target:
        await import_lines(target.adapter, lines)
        got = await target.adapter.get_checkpoint("s")
        assert got is not None and got.contexts["step"] == {"v": BIG, "n": 1}
        stored = await target.raw_adapter.get_checkpoint("s")
        assert stored is not None and len(list(references(stored))) == 1
        assert len(await _blobs(target_store)) == 1


def test_siglo_export_writes_values_and_siglo_import_offloads_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commands, not only the functions: a dump holds the offloaded value itself (it
    once held the reference, which dangles on a target with another blob store)."""
    from click.testing import CliRunner

    from siglo.cli import cli
    from siglo.config import reset_settings

    def use(name: str) -> None:
        (tmp_path / "siglo.toml").write_text(
            f'url = "sqlite:///{tmp_path / name}.db"\noffload_min_bytes = 1024\n'
            f'blob_url = "{(tmp_path / name).as_uri()}"\n'
        )
        reset_settings()

    async def save() -> None:
        async with siglo.connect() as backend:
            await backend.adapter.save_checkpoint(_cp("s", 1, step={"v": BIG, "n": 1}))

    async def load() -> Any:
        async with siglo.connect() as backend:
            got = await backend.adapter.get_checkpoint("s")
            stored = await backend.raw_adapter.get_checkpoint("s")
        assert stored is not None and len(list(references(stored))) == 1
        return None if got is None else got.contexts["step"]

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    try:
        use("source")
        asyncio.run(save())
        exported = runner.invoke(cli, ["export", "--output", str(tmp_path / "dump.jsonl")])
        assert exported.exit_code == 0, exported.output
        dump = (tmp_path / "dump.jsonl").read_bytes()
        assert BIG.encode() in dump and REF_KEY.encode() not in dump
        use("target")
        imported = runner.invoke(cli, ["import", "--input", str(tmp_path / "dump.jsonl")])
        assert imported.exit_code == 0, imported.output
        assert asyncio.run(load()) == {"v": BIG, "n": 1}
        assert len(list((tmp_path / "target").glob("??/*"))) == 1
    finally:
        reset_settings()


def test_siglo_collect_blobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from siglo.cli import cli
    from siglo.config import reset_settings

    blobs = tmp_path / "blobs"
    (tmp_path / "siglo.toml").write_text(
        f'url = "sqlite:///{tmp_path / "app.db"}"\noffload_min_bytes = 1024\n'
        f'blob_url = "{blobs.as_uri()}"\n'
    )
    monkeypatch.chdir(tmp_path)
    reset_settings()

    async def write() -> None:
        async with siglo.connect() as backend:
            await backend.adapter.save_checkpoint(_cp("kept", 1, s={"v": BIG}))
            await backend.adapter.save_checkpoint(_cp("gone", 1, s={"v": BIG + "gone"}))
            await backend.adapter.delete_checkpoint("gone")

    try:
        asyncio.run(write())
        runner = CliRunner()
        first = runner.invoke(cli, ["collect-blobs", "--json"])
        assert first.exit_code == 0, first.output
        assert '"removed": 0' in first.output and '"kept": 1' in first.output
        second = runner.invoke(cli, ["collect-blobs", "--grace-ms", "0", "--json"])
        assert '"referenced": 1' in second.output and '"removed": 1' in second.output
        assert len(list(blobs.glob("??/*"))) == 1
        (tmp_path / "siglo.toml").write_text(f'url = "sqlite:///{tmp_path / "app.db"}"\n')
        reset_settings()
        refused = runner.invoke(cli, ["collect-blobs"])
        assert refused.exit_code == 1 and "no blob store" in refused.output
    finally:
        reset_settings()


# -- every blob store ------------------------------------------------------------------------

STORES = ("directory", "redis", "postgres", "s3")


@asynccontextmanager
async def blob_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[BlobStore]:
    """A fresh, private blob store of ``kind``, removed afterwards (S3: a new bucket on
    the session's moto server)."""
    import secrets

    if kind == "directory":
        yield open_blob_store((tmp_path / "blobs").as_uri())
        return
    if kind == "s3":
        from s3_support import new_bucket, s3_url

        endpoint = request.getfixturevalue("s3_endpoint")
        store = open_blob_store(s3_url(endpoint, new_bucket(endpoint)))
        try:
            yield store
        finally:
            async for digest, _ in store.scan():
                await store.delete(digest)
            await store.aclose()
        return
    if kind == "redis":
        from _redis_helpers import REDIS_URL, require_redis

        require_redis()
        prefix = f"siglo-blobs-{secrets.token_hex(6)}:"
        store = open_blob_store(f"{REDIS_URL}?prefix={prefix}")
        try:
            yield store
        finally:
            import redis.asyncio

            client = redis.asyncio.Redis.from_url(REDIS_URL)
            keys = [k async for k in client.scan_iter(match=prefix + "*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()
            await store.aclose()
        return
    from sql_support import POSTGRES_URL, require_postgres

    from siglo_postgres import drop_schema

    require_postgres()
    schema = f"siglo_blobs_{secrets.token_hex(6)}"
    store = open_blob_store(f"{POSTGRES_URL}?schema={schema}")
    try:
        yield store
    finally:
        await store.aclose()
        await drop_schema(POSTGRES_URL, schema)


@pytest.mark.parametrize("kind", STORES)
async def test_a_blob_store_keeps_blobs_by_content_and_time(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with blob_store(kind, tmp_path, request) as store:
        data = b'{"large":"value"}'
        digest = blob_digest(data)
        assert await store.get(digest) is None
        now = int(time.time() * 1000)
        await store.put(digest, data)
        await store.put(digest, data, keep_until_ms=now + 60_000)  # a cache entry's life
        assert await store.get(digest) == data
        assert [(d, k >= now + 60_000) for d, k in [x async for x in store.scan()]] == [
            (digest, True)
        ]
        # Stale only before its keep-until: the collector's removal is conditional.
        assert await store.delete_stale(digest, now) is False
        assert await store.delete_stale(digest, now + 120_000) is True
        assert await store.get(digest) is None
        await store.put(digest, data)
        assert await store.delete(digest) is True
        assert await store.delete(digest) is False
        with pytest.raises(InvalidArgumentError, match="64 lower-case hex"):
            await store.get("../etc/passwd")


@pytest.mark.parametrize("kind", STORES)
async def test_the_collection_rule_on_every_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with (
        blob_store(kind, tmp_path, request) as store,
        offloading("sqlite", store) as backend,
    ):
        a = backend.adapter
        await a.save_checkpoint(_cp("live", 1, s={"v": BIG}))
        await a.save_checkpoint(_cp("dead", 1, s={"v": BIG + "dead"}))
        await a.delete_checkpoint("dead")
        done = await collect_blobs(a, store, now_ms=int(time.time() * 1000) + 7_200_000)
        assert (done.referenced, done.removed, done.kept) == (1, 1, 0)
        got = await a.get_checkpoint("live")
        assert got is not None and got.contexts["s"]["v"] == BIG


@pytest.mark.parametrize("kind", STORES)
async def test_a_put_racing_the_collector_never_loses_its_blob(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Each round a stored blob is stale for the collector (kept before an hour from now)
    # and a put raises its keep-until past that, both at once: whichever goes first, once
    # the put has returned the blob is there (the put refreshed it and the removal kept
    # it, or the removal took it and the put wrote it again).
    async with blob_store(kind, tmp_path, request) as store:
        for round_ in range(12):
            data = b'{"round":%d}' % round_
            digest = blob_digest(data)
            await store.put(digest, data)
            now = int(time.time() * 1000)
            put_first = round_ % 2 == 0
            calls = [
                store.put(digest, data, keep_until_ms=now + 7_200_000),
                store.delete_stale(digest, now + 3_600_000),
            ]
            await asyncio.gather(*(calls if put_first else calls[::-1]))
            assert await store.get(digest) == data, f"round {round_}: the put's blob is gone"
            kept = dict([x async for x in store.scan()])
            assert kept[digest] >= now + 7_200_000


async def test_connect_with_a_redis_blob_store(tmp_path: Path) -> None:
    from _redis_helpers import REDIS_URL, require_redis

    require_redis()
    prefix = "siglo-blobs-connect:"
    settings = Settings(offload_min_bytes=1_024, blob_url=f"{REDIS_URL}?prefix={prefix}")
    async with siglo.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", settings=settings) as backend:
        await backend.adapter.save_checkpoint(_cp("r", 1, s={"v": BIG}))
        got = await backend.adapter.get_checkpoint("r")
        assert got is not None and got.contexts["s"]["v"] == BIG
    store = open_blob_store(f"{REDIS_URL}?prefix={prefix}")
    try:
        assert [d async for d, _ in store.scan()] == [blob_digest(f'"{BIG}"'.encode())]
    finally:
        async for digest, _ in store.scan():
            await store.delete(digest)
        await store.aclose()


async def test_closing_the_backend_closes_its_blob_store(tmp_path: Path) -> None:
    closed: list[bool] = []

    class Watched(MemoryBlobStore):
        async def aclose(self) -> None:
            closed.append(True)

    async with any_backend("memory") as backend:
        backend.adapter = offload_adapter(backend.adapter, Offloader(Watched(), 1_024))
        await backend.aclose()
    assert closed == [True]


def _siglo_with(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGLO_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-m", "siglo", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _rekey_without_blob_url(
    tmp_path: Path, url: str, k1: str, k2: str
) -> subprocess.CompletedProcess[str]:
    """``siglo rekey`` from a shell with the keys (``k2`` made current) but not the blob
    store's settings: it fails."""
    shell = tmp_path / "shell.toml"
    shell.write_text(
        f'url = "{url}"\nencryption_keys = {{ k1 = "{k1}", k2 = "{k2}" }}\n'
        'encryption_key_id = "k2"\n'
    )
    done = _siglo_with(shell, "rekey")
    assert done.returncode == 1, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("encrypted", [True, False], ids=["sealed", "clear"])
async def test_rekey_without_the_blob_store_refuses_and_keeps_the_references(
    tmp_path: Path, encrypted: bool
) -> None:
    """``siglo rekey`` run with the keys but not the blob store (a shell whose settings
    lack ``blob_url``) must not seal the references themselves: the reference would then
    be inside ciphertext, the application would read it back as its value, and the
    collector, finding nothing referenced, would remove the blob — the value lost. It
    refuses, naming the setting, and the stored document stays as it was: the
    application still reads its value, and the collector keeps the blob."""
    k1, k2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
    url = f"sqlite:///{tmp_path / 'app.db'}"
    blobs = (tmp_path / "blobs").as_uri()
    keys = {"k1": k1} if encrypted else {}
    app = Settings(blob_url=blobs, offload_min_bytes=1_024, encryption_keys=keys)
    async with siglo.connect(url, settings=app) as backend:
        stack = StorageManager(backend).create_stack("doc", namespace="t")
        stack.set("step", "doc", BIG)
        await stack.save()
        before = await backend.raw_adapter.get_checkpoint("doc", "t", fallback=False)
    done = _rekey_without_blob_url(tmp_path, url, k1, k2)
    assert "blob_url" in done.stderr, done.stderr
    async with siglo.connect(url, settings=app) as backend:
        assert await backend.raw_adapter.get_checkpoint("doc", "t", fallback=False) == before
        loaded = await backend.adapter.get_checkpoint("doc", "t", fallback=False)
        assert loaded is not None and loaded.contexts["step"]["doc"] == BIG
        offloader: Any = backend.adapter
        while not isinstance(offloader, OffloadAdapter):
            offloader = offloader.inner
        collected = await collect_blobs(
            backend.adapter, offloader.offloader.store, grace_ms=0, now_ms=2**62
        )
        assert (collected.referenced, collected.removed) == (1, 0)


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_rekey_reencrypts_an_offloaded_cached_step_in_its_blob(
    tmp_path: Path, kind: str
) -> None:
    """A cached step's large output is stored as a reference to its sealed bytes in the
    blob store. ``siglo rekey`` (a process of its own, the application's settings with a
    new current key) re-encrypts it there: a new blob sealed under the new key, the entry
    a reference to it, never the reference itself sealed — which a cache hit would hand
    to the next step as the output. The new blob is kept as long as the old one (the
    entry's life), so the collector does not take it meanwhile. Run again, nothing to do."""
    from ops_support import shared_store

    k1, k2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
    blobs = tmp_path / "blobs"
    ran: list[int] = []

    async def produce(_: Any) -> dict[str, Any]:
        ran.append(1)
        return {"big": BIG}

    async def consume(value: Any) -> str:
        return str(value["big"][:5]) if set(value) == {"big"} else f"not the output: {value}"

    run = siglo.flow(
        siglo.Step.create("produce", produce).cache(ttl_ms=3_600_000, key=lambda _: "k"),
        siglo.Step.create("consume", consume),
        name="rekey-offloaded-cache",
    )

    def settings(*keys: str) -> Settings:
        named = dict(zip(("k1", "k2"), keys, strict=False))
        return Settings(
            blob_url=blobs.as_uri(),
            offload_min_bytes=1_024,
            encryption_keys=named,
            encryption_key_id=list(named)[-1],
        )

    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        async with siglo.connect(backend.url, settings=settings(k1)) as app:
            manager = StorageManager(app)
            assert await run.run(None, manager=manager, stack_id="r1", namespace="t") == "large"
            before = await app.raw_adapter.get_cached_step("k", namespace="t")
        assert isinstance(before, dict) and REF_KEY in before
        shell = tmp_path / "siglo.toml"
        shell.write_text(
            f'url = "{backend.url}"\nblob_url = "{blobs.as_uri()}"\noffload_min_bytes = 1024\n'
            f'encryption_keys = {{ k1 = "{k1}", k2 = "{k2}" }}\nencryption_key_id = "k2"\n'
        )
        done = _siglo_with(shell, "rekey")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "rekeyed 1 cached step(s)" in done.stdout, done.stdout
        async with siglo.connect(backend.url, settings=settings(k1, k2)) as app:
            after = await app.raw_adapter.get_cached_step("k", namespace="t")
            # Still a reference the offloading layer and the collector see, to a new blob
            # whose value is sealed under the new key.
            assert isinstance(after, dict) and REF_KEY in after, after
            assert after[REF_KEY] != before[REF_KEY]
            store = DirectoryBlobStore(blobs)
            sealed = (await store.get(after[REF_KEY])) or b""
            assert b'"$siglo":"v1.e.k2.' in sealed and BIG[:20].encode() not in sealed
            kept = dict([x async for x in store.scan()])
            assert kept[after[REF_KEY]] >= kept[before[REF_KEY]]
            # The collector (which does not walk cache entries) keeps it for the entry's
            # life; what it removes is the checkpoint's blobs the rekey replaced.
            await collect_blobs(app.adapter, store, grace_ms=0)
            assert await store.get(after[REF_KEY]) == sealed
            # A cache hit hands the next step the output, not a reference.
            manager = StorageManager(app)
            assert await run.run(None, manager=manager, stack_id="r2", namespace="t") == "large"
            assert ran == [1]
        again = _siglo_with(shell, "rekey")
        assert "rekeyed 0 cached step(s); 1 already under the current key" in again.stdout


async def test_rekey_without_the_blob_store_refuses_an_offloaded_cached_step(
    tmp_path: Path,
) -> None:
    """Run without ``blob_url``, ``siglo rekey`` meets a cached step's reference as it is
    stored: the codecs refuse to seal it (naming the setting), and the entry stays."""
    k1, k2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
    url = f"sqlite:///{tmp_path / 'app.db'}"
    app = Settings(
        blob_url=(tmp_path / "blobs").as_uri(), offload_min_bytes=1_024, encryption_keys={"k1": k1}
    )
    async with siglo.connect(url, settings=app) as backend:
        await backend.adapter.set_cached_step("k", {"big": BIG}, 3_600_000, namespace="t")
        before = await backend.raw_adapter.get_cached_step("k", namespace="t")
    done = _rekey_without_blob_url(tmp_path, url, k1, k2)
    assert "blob_url" in done.stderr and "step 'k'" in done.stderr, done.stderr
    async with siglo.connect(url, settings=app) as backend:
        assert await backend.raw_adapter.get_cached_step("k", namespace="t") == before
        assert await backend.adapter.get_cached_step("k", namespace="t") == {"big": BIG}


async def test_a_rotation_that_stops_on_an_error_says_it_stays_in_effect(tmp_path: Path) -> None:
    """``siglo rekey --rotate`` makes the new data keys current before it walks the
    store; stopped by an error (here: no blob store), the rotation stays in effect. The
    error's hint says so and names the keys, so that the rekey is finished without
    ``--rotate`` (which would add yet another key), and that finishes it."""
    master = "base64:" + base64.b64encode(bytes([7]) * 32).decode()
    url = f"sqlite:///{tmp_path / 'app.db'}"
    blobs = (tmp_path / "blobs").as_uri()
    app = Settings(blob_url=blobs, offload_min_bytes=1_024, master_key=master)
    async with siglo.connect(url, settings=app) as backend:
        stack = StorageManager(backend).create_stack("doc", namespace="t")
        stack.set("step", "doc", BIG)
        await stack.save()
    shell = tmp_path / "shell.toml"
    shell.write_text(f'url = "{url}"\nmaster_key = "{master}"\n')
    done = _siglo_with(shell, "rekey", "--rotate")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "blob_url" in done.stderr, done.stderr
    assert "stays in effect" in done.stderr and "without --rotate" in done.stderr, done.stderr
    full = tmp_path / "app.toml"
    full.write_text(
        f'url = "{url}"\nmaster_key = "{master}"\nblob_url = "{blobs}"\noffload_min_bytes = 1024\n'
    )
    finished = _siglo_with(full, "rekey")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "rekeyed 1 checkpoint(s)" in finished.stdout, finished.stdout
    async with siglo.connect(url, settings=app) as backend:
        loaded = await backend.adapter.get_checkpoint("doc", "t", fallback=False)
        assert loaded is not None and loaded.contexts["step"]["doc"] == BIG


async def test_turning_encryption_on_leaves_plaintext_blobs_until_collected(
    tmp_path: Path,
) -> None:
    """docs/encryption.md, "Rotation": a rekey of a store written in clear seals each
    offloaded value into a new blob; the plaintext blobs stay until the collector takes
    them — a context's at once (grace 0), a cached step's only after the entry's own end."""
    from siglo.rekeying import rekey

    url = f"sqlite:///{tmp_path / 'app.db'}"
    store = DirectoryBlobStore(tmp_path / "blobs")
    blobs = {"blob_url": (tmp_path / "blobs").as_uri(), "offload_min_bytes": 1_024}
    async with siglo.connect(url, settings=Settings(**blobs)) as backend:
        stack = StorageManager(backend).create_stack("doc")
        stack.set("step", "doc", BIG)
        await stack.save()
        await backend.adapter.set_cached_step("k", {"big": BIG + "cached"}, 3_600_000)
    keys = {"k1": base64.b64encode(bytes(32)).decode()}
    async with siglo.connect(url, settings=Settings(**blobs, encryption_keys=keys)) as backend:
        done = await rekey(backend)
        assert done.rekeyed == 1 and done.payloads["step"].rekeyed == 1

        async def plaintext() -> list[str]:
            found = [(d, await store.get(d) or b"") for d in await _blobs(store)]
            return [d for d, data in found if b"large tool output" in data]

        assert len(await plaintext()) == 2
        await collect_blobs(backend.raw_adapter, store, grace_ms=0)
        assert len(await plaintext()) == 1  # the cached step's, kept for its entry's life
        later = int(time.time() * 1000) + 3_600_000 + 1_000
        await collect_blobs(backend.raw_adapter, store, grace_ms=0, now_ms=later)
        assert await plaintext() == []
        loaded = await backend.adapter.get_checkpoint("doc")
        assert loaded is not None and loaded.contexts["step"]["doc"] == BIG


async def test_a_sealed_offloaded_context_read_without_the_blob_store_is_a_clear_error(
    tmp_path: Path,
) -> None:
    """An encrypting connection without the blob store reads a context that was sealed
    and offloaded: a clear error naming the setting, not the reference as its value."""
    keys = {"k1": base64.b64encode(bytes(32)).decode()}
    url = f"sqlite:///{tmp_path / 'app.db'}"
    app = Settings(
        blob_url=(tmp_path / "blobs").as_uri(), offload_min_bytes=1_024, encryption_keys=keys
    )
    async with siglo.connect(url, settings=app) as backend:
        stack = StorageManager(backend).create_stack("doc")
        stack.set("step", "doc", BIG)
        await stack.save()
    async with siglo.connect(url, settings=Settings(encryption_keys=keys)) as backend:
        with pytest.raises(InvalidArgumentError, match="blob_url"):
            await backend.adapter.get_checkpoint("doc", fallback=False)


@pytest.mark.parametrize("encrypted", [True, False], ids=["sealed", "clear"])
async def test_export_without_the_blob_store_refuses_to_write_references(
    tmp_path: Path, encrypted: bool
) -> None:
    """A dump carries values, never references to a blob store the target may not share:
    ``siglo export`` run with settings that lack the blob store fails naming ``blob_url``;
    to a file it writes nothing (the file is replaced only by a complete dump), and what
    it wrote to stdout has no trailer, so ``siglo import`` refuses it."""
    keys = {"k1": base64.b64encode(bytes(32)).decode()} if encrypted else {}
    url = f"sqlite:///{tmp_path / 'app.db'}"
    app = Settings(
        blob_url=(tmp_path / "blobs").as_uri(), offload_min_bytes=1_024, encryption_keys=keys
    )
    async with siglo.connect(url, settings=app) as backend:
        stack = StorageManager(backend).create_stack("doc", namespace="t")
        stack.set("step", "doc", BIG)
        await stack.save()
    shell = tmp_path / "shell.toml"
    shell.write_text(
        f'url = "{url}"\n' + (f'encryption_keys = {{ k1 = "{keys["k1"]}" }}\n' if keys else "")
    )
    dump = tmp_path / "dump.jsonl"
    done = _siglo_with(shell, "export", "-o", str(dump))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "blob_url" in done.stderr, done.stderr
    assert "Hint: run it with the application's blob store settings" in done.stderr
    assert not dump.exists()
    piped = _siglo_with(shell, "export")  # to stdout, as `siglo export … | siglo import …`
    assert piped.returncode == 1, piped.stdout + piped.stderr
    assert REF_KEY not in piped.stdout
    dump.write_text(piped.stdout)
    target = tmp_path / "target.toml"
    target.write_text(f'url = "sqlite:///{tmp_path / "target.db"}"\n')
    refused = _siglo_with(target, "import", "-i", str(dump))
    assert refused.returncode == 1, refused.stdout + refused.stderr


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_encryption_and_offloading_together_keep_waits_and_context_changes(
    kind: str, tmp_path: Path
) -> None:
    """Both on, as an application's settings may have them: a flow's durable wait is
    created, delivered (claimed) and completed, and the context stream reads back — the
    offloading layer below the pipeline passes the sealed payloads through instead of
    trying to open them without the keys."""
    from ops_support import shared_store

    keys = {"k1": base64.b64encode(bytes(32)).decode()}
    settings = Settings(
        blob_url=(tmp_path / "blobs").as_uri(), offload_min_bytes=1_024, encryption_keys=keys
    )

    async def wait(_: Any) -> Any:
        return await siglo.wait_for_event("approve:enc-off")

    run = siglo.flow(siglo.Step.create("wait", wait), name="enc-off")
    async with shared_store(kind) as store, siglo.connect(store.url, settings=settings) as backend:
        manager = StorageManager(backend, settings=settings)
        with pytest.raises(siglo.WorkflowSuspended):
            await run.run({"doc": BIG}, manager=manager, stack_id="enc-off", namespace="t")
        stored = await backend.adapter.get_wait_record("approve:enc-off", namespace="t")
        assert stored is not None and stored.status == "waiting"
        await run.deliver("approve:enc-off", {"ok": True}, manager=manager, namespace="t")
        done = await backend.adapter.get_checkpoint("enc-off", "t", fallback=False)
        assert done is not None and done.status == "completed", done
        event = siglo.ContextChangeEvent(
            stack_id="enc-off", step_id="s", key="k", value={"v": 1}, namespace="t",
            timestamp=1,
        )  # fmt: skip
        await backend.adapter.on_context_change(event)
        changes = await backend.adapter.get_context_changes("enc-off", "s", "t")
        assert changes == {"k": {"v": 1}}
        assert BIG.encode() not in await raw_bytes(kind, store)


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_with_encryption_an_unchanged_value_keeps_its_blob(kind: str, tmp_path: Path) -> None:
    """A sealed context is offloaded as its ciphertext: sealed with a fresh nonce at every
    save, an unchanged one was a new blob at every save (8 large contexts and 20 saves of a
    counter: 168 blobs instead of 8). Unchanged, it keeps its ciphertext, so its blob;
    a changed one gets a new ciphertext and a new blob."""
    from ops_support import shared_store

    keys = {"k1": base64.b64encode(bytes(32)).decode()}
    store = DirectoryBlobStore(tmp_path / "blobs")
    settings = Settings(
        blob_url=(tmp_path / "blobs").as_uri(), offload_min_bytes=1_024, encryption_keys=keys
    )
    options = {"incremental_min_bytes": 0} if kind == "redis" else {}
    async with (
        shared_store(kind, **options) as raw,
        siglo.connect(raw.url, settings=settings) as backend,
    ):
        stack = StorageManager(backend, settings=settings).create_stack("doc", namespace="t")
        for k in range(4):
            stack.set(f"doc{k}", "text", f"{k} {BIG}")
        await stack.save()
        assert len(await _blobs(store)) == 4
        for i in range(5):
            stack.set("counter", "i", i)  # small: stays in the row
            await stack.save()
        assert len(await _blobs(store)) == 4
        stack.set("doc0", "text", f"changed {BIG}")
        await stack.save()
        assert len(await _blobs(store)) == 5
        got = await backend.adapter.get_checkpoint("doc", "t", fallback=False)
        assert got is not None and got.contexts["doc0"] == {"text": f"changed {BIG}"}
        assert got.contexts["doc3"] == {"text": f"3 {BIG}"} and got.contexts["counter"] == {"i": 4}
        assert BIG.encode() not in await raw_bytes(kind, raw)


async def _big_step(_: Any) -> Any:
    return {"body": BIG}


async def _use_step(value: Any) -> Any:
    return {"got": value}


_OFFLOADED_FLOW = siglo.flow(
    siglo.Step.create("fetch", _big_step).cache(ttl_ms=600_000, key=lambda _: "fetched"),
    siglo.Step.create("use", _use_step),
    name="offloaded",
)


@pytest.mark.parametrize(
    "worker",
    [Settings(redact_fields=frozenset({"card"})), Settings()],
    ids=["with-a-pipeline", "bare"],
)
async def test_a_reference_read_without_the_blob_store_is_a_clear_error(
    tmp_path: Path, worker: Settings
) -> None:
    """A process whose settings lack the blob store (a worker started with the
    application's redaction but not its ``blob_url``, or with no settings at all) reads
    an offloaded value: a clear error naming the setting, never the reference handed to
    a step as if it were the value — a load, a resume, and a flow's cache hit, whatever
    layers the connection has. (The bare connection's adapter is the backend's own: its
    reads return what is stored, as documented for raw reads.)"""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    app = Settings(blob_url=(tmp_path / "blobs").as_uri(), offload_min_bytes=1_024)
    async with siglo.connect(url, settings=app) as backend:
        stack = StorageManager(backend).create_stack("doc", namespace="t")
        stack.set("step", "doc", BIG)
        await stack.save()
        await backend.adapter.set_cached_step("fetch", {"body": BIG})
        done = await _OFFLOADED_FLOW.run(None, manager=StorageManager(backend), stack_id="r1")
        assert done == {"got": {"body": BIG}}
    async with siglo.connect(url, settings=worker) as backend:
        if worker.redact_fields:
            with pytest.raises(InvalidArgumentError, match="blob_url"):
                await backend.adapter.get_checkpoint("doc", "t", fallback=False)
            with pytest.raises(InvalidArgumentError, match="blob_url"):
                await backend.adapter.get_cached_step("fetch")
        manager = StorageManager(backend, settings=worker)
        with pytest.raises(InvalidArgumentError, match="blob_url"):
            await manager.resume("doc", namespace="t")
        # The cached step's output is a reference here: the run stops at it, and the
        # step after it never runs on the reference.
        with pytest.raises(InvalidArgumentError, match=r"cached step 'fetched'.*blob_url"):
            await _OFFLOADED_FLOW.run(None, manager=manager, stack_id="r2")
        stored = await backend.adapter.get_checkpoint("r2")
        assert stored is None or stored.status != "completed"


@pytest.mark.parametrize(
    ("kind", "options"),
    [(kind, {}) for kind in KINDS] + [("redis", {"incremental_min_bytes": 16})],
    ids=[*KINDS, "redis-incremental"],
)
async def test_a_save_the_size_guard_refuses_puts_no_blob(
    kind: str, options: dict[str, Any]
) -> None:
    """The guard measures the document with its references before any blob is put
    (docs/large-state.md: "raises … before anything is written"), on every save path of
    the offloading layer: nothing stored changes, no orphan for the collector."""
    from siglo import DocumentTooLargeError
    from siglo.adapter import CacheEntry
    from siglo.records import ContextChangeEvent

    store = MemoryBlobStore()
    async with offloading(kind, store, **options) as backend:
        adapter = backend.adapter
        adapter.inner.max_document_bytes = 2_000  # what connect() puts on the adapter
        # 3 references (~90 bytes each) and 2.7 KB inline: over the limit as stored.
        inline = {f"w{i}": "x" * 900 for i in range(3)}
        over = _cp("big", 1, a={"v": BIG + "1"}, b={"v": BIG + "2"}, c={"v": BIG + "3", **inline})
        change = ContextChangeEvent(stack_id="big", step_id="a", key="v", value=1, timestamp=1)
        entry = CacheEntry(key="big-step", value=BIG + "4")
        saves = {
            "save": lambda: adapter.save_checkpoint(over),
            "streamed": lambda: adapter.save_checkpoint_streamed(over, [change]),
            "unlocking": lambda: adapter.save_checkpoint_unlocking(over, [change]),
            "caching": lambda: adapter.save_checkpoint_caching(over, [change], entry),
        }
        for name, save in saves.items():
            with pytest.raises(DocumentTooLargeError):
                await save()
            assert await _blobs(store) == set(), name
        assert await adapter.get_checkpoint("big") is None
        assert await adapter.get_cached_step("big-step") is siglo.MISSING
        assert not await adapter.get_context_changes("big", "a")
        # Under the limit as stored (the large values are references): stored, blobs put.
        await adapter.save_checkpoint(_cp("big", 1, a={"v": BIG + "1"}, b={"v": BIG + "2"}))
        assert len(await _blobs(store)) == 2


@pytest.mark.parametrize(
    "settings",
    [Settings(), Settings(redact_fields=frozenset({"card"}))],
    ids=["bare", "with-a-pipeline"],
)
async def test_values_of_a_reserved_form_are_refused_when_written(
    tmp_path: Path, settings: Settings
) -> None:
    """A value shaped like siglo's reference to an offloaded value, or like a sealed
    value, would read back as what it looks like, and be refused at every read after:
    it is refused when written — a context value, a whole context, a cached step's
    output, an idempotency result — and nothing is stored."""
    reference = {"$siglo.blob": "not-a-digest", "bytes": 3}
    sealed = {"$siglo": "hello"}
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with siglo.connect(url, settings=settings) as backend:
        manager = StorageManager(backend, settings=settings)
        for step, value in (("p", {"v": reference}), ("q", sealed)):
            stack = manager.create_stack(f"s-{step}")
            stack.contexts[step] = value
            with pytest.raises(InvalidArgumentError, match="reserves"):
                await stack.save()
            manager.discard_stack(stack)
            assert await manager.load_checkpoint(f"s-{step}") is None

        async def shaped(_: Any) -> Any:
            return dict(sealed)

        f = siglo.flow(siglo.Step.create("x", shaped).cache(ttl_ms=60_000), name="shaped")
        with pytest.raises(InvalidArgumentError, match="reserves"):
            await f.run(None, manager=manager, stack_id="r1")
        assert await backend.adapter.get_cached_step("x") is siglo.MISSING
        payments = backend.require_idempotency()
        claim = await payments.claim_owned("pay-1")
        with pytest.raises(InvalidArgumentError, match="reserves"):
            await payments.complete("pay-1", sealed, token=claim.token)
        assert await payments.get("pay-1") is siglo.MISSING
