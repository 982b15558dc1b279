"""The S3 blob store (siglo.s3, ``blob_url = "s3://bucket/prefix"``) against moto's S3
server on loopback: the interleavings of a put and the collector's two-step removal that a
random race rarely hits, the URL (options, credentials from the URL or the environment,
secrets masked wherever it is shown), a missing driver, and the whole path from
``siglo.connect`` to ``siglo collect-blobs``. The semantics every store shares are in
test_offload.py, parametrized over this store too."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from raw_storage import any_backend
from s3_support import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, new_bucket, s3_url

import siglo
from siglo import Checkpoint
from siglo.blobs import BlobStore, blob_digest, open_blob_store
from siglo.config import Settings
from siglo.errors import DriverNotInstalledError, InvalidArgumentError, StorageAdapterError
from siglo.offload import Offloader, collect_blobs, offload_adapter, references
from siglo.s3 import S3BlobStore

pytestmark = pytest.mark.rule("blobs.offload", "blobs.collect")

BIG = "large tool output " * 2_000  # ~36 KB
DATA = b'{"large":"value"}'
DIGEST = blob_digest(DATA)
LATER = 7_200_000  # past the collector's default grace period


def _store(
    endpoint: str, bucket: str, kind: type[S3BlobStore] = S3BlobStore, **options: Any
) -> S3BlobStore:
    url = s3_url(endpoint, bucket)
    for name, value in options.items():
        url += f"&{name}={value}"
    store = open_blob_store(url)
    assert isinstance(store, S3BlobStore)
    if kind is not S3BlobStore:
        store.__class__ = kind  # the same store, broken in one place
    return store


def _cp(stack: str, **contexts: dict[str, Any]) -> Checkpoint:
    return Checkpoint(stack_id=stack, revision=1, timestamp=1, contexts=contexts)


def _stale_now() -> int:
    """A kept-before time that makes a blob put just now stale for the collector."""
    return int(time.time() * 1000) + 3_600_000


# -- the collector's removal against a put, step by step ------------------------------------


async def _refresh_before_the_marker(kind: type[S3BlobStore], endpoint: str) -> None:
    """A put between the collector's look and its marker keeps the blob."""
    bucket = new_bucket(endpoint)
    collector, writer = _store(endpoint, bucket, kind), _store(endpoint, bucket, kind)
    await writer.put(DIGEST, DATA)
    marking = collector._write

    async def refreshed_first(digest: str, body: bytes, attributes: Any, mode: Any) -> bool:
        if body.startswith(b"doomed"):  # the collector looked: now a save refreshes the blob
            await writer.put(digest, DATA, keep_until_ms=int(time.time() * 1000) + LATER)
        return await marking(digest, body, attributes, mode)

    collector._write = refreshed_first  # type: ignore[method-assign]
    await collector.delete_stale(DIGEST, _stale_now())
    assert await writer.get(DIGEST) == DATA, "the collector removed a blob a put refreshed"


async def _put_on_the_marker(kind: type[S3BlobStore], endpoint: str) -> None:
    """A put that finds the collector's marker waits for its delete and writes again."""
    bucket = new_bucket(endpoint)
    collector, writer = _store(endpoint, bucket, kind), _store(endpoint, bucket, kind)
    await writer.put(DIGEST, DATA)
    removing, looking = collector._remove, writer._look
    put: list[asyncio.Task[None]] = []
    saw_marker = asyncio.Event()

    async def look(digest: str) -> Any:
        found = await looking(digest)
        if found is not None and found.doomed:
            saw_marker.set()
        return found

    async def put_before_delete(digest: str) -> None:
        # The marker is in place: a save puts the blob now. It sees the marker and waits
        # (a put that wrote over the marker here would have its blob deleted next).
        put.append(asyncio.create_task(writer.put(DIGEST, DATA)))
        await asyncio.wait_for(saw_marker.wait(), 10)
        await asyncio.wait(put, timeout=0.5)
        await removing(digest)

    writer._look = look  # type: ignore[method-assign]

    collector._remove = put_before_delete  # type: ignore[method-assign]
    assert await collector.delete_stale(DIGEST, _stale_now()) is True
    await asyncio.wait_for(put[0], 10)
    assert await writer.get(DIGEST) == DATA, "a put returned and its blob is gone"


async def test_a_put_between_the_collectors_look_and_its_marker_keeps_the_blob(
    s3_endpoint: str,
) -> None:
    await _refresh_before_the_marker(S3BlobStore, s3_endpoint)


async def test_a_put_that_finds_the_marker_waits_for_the_delete_and_writes_again(
    s3_endpoint: str,
) -> None:
    await _put_on_the_marker(S3BlobStore, s3_endpoint)


class _MarksWhatever(S3BlobStore):
    """Broken: the collector's marker is written without ``If-Match``."""

    async def _write(self, digest: str, body: bytes, attributes: Any, mode: Any) -> bool:
        doomed = body.startswith(b"doomed")
        return await super()._write(digest, body, attributes, "overwrite" if doomed else mode)


class _WritesOverMarkers(S3BlobStore):
    """Broken: a put writes over a collector's marker at once instead of waiting."""

    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        want = max(int(time.time() * 1000), keep_until_ms or 0)
        body = b"%d\n" % want + data
        while True:
            found = await self._look(digest)
            mode: Any = "create" if found is None else {"e_tag": found.etag}
            if found is not None and not found.doomed and found.keep_until_ms >= want:
                return
            if await self._write(digest, body, {"siglo-keep-until": str(want)}, mode):
                return


@pytest.mark.parametrize(
    ("broken", "check"),
    [(_MarksWhatever, _refresh_before_the_marker), (_WritesOverMarkers, _put_on_the_marker)],
)
async def test_the_checks_catch_a_broken_s3_store(
    broken: type[S3BlobStore], check: Any, s3_endpoint: str
) -> None:
    with pytest.raises(AssertionError, match=r"gone|removed a blob"):
        await check(broken, s3_endpoint)


async def test_a_marker_a_collector_left_is_taken_over_and_then_collected(
    s3_endpoint: str,
) -> None:
    bucket = new_bucket(s3_endpoint)
    collector = _store(s3_endpoint, bucket)
    writer = _store(s3_endpoint, bucket, takeover_ms=300)

    async def dies_before_delete(digest: str) -> None:
        raise StorageAdapterError("the collector stopped")

    collector._remove = dies_before_delete  # type: ignore[method-assign]
    # A put waits out the marker, then writes its blob over it.
    await writer.put(DIGEST, DATA)
    with pytest.raises(StorageAdapterError, match="stopped"):
        await collector.delete_stale(DIGEST, _stale_now())
    assert await writer.get(DIGEST) is None  # being removed: gone for readers
    assert [x async for x in writer.scan()] == []  # not yet abandoned
    started = time.monotonic()
    await writer.put(DIGEST, DATA)
    assert time.monotonic() - started >= 0.3
    assert await writer.get(DIGEST) == DATA
    # Left alone, a marker is stale once a put could take it over: a collection clears it.
    with pytest.raises(StorageAdapterError, match="stopped"):
        await collector.delete_stale(DIGEST, _stale_now())
    await asyncio.sleep(0.35)
    assert [x async for x in writer.scan()] == [(DIGEST, 0)]
    assert await writer.delete_stale(DIGEST, int(time.time() * 1000)) is False  # a marker
    assert [x async for x in writer.scan()] == []


async def test_the_emulator_accepts_one_of_concurrent_conditional_puts(s3_endpoint: str) -> None:
    """The tests' S3 emulator must be as atomic as S3: of several puts conditional on the
    same ETag, sent together, exactly one is accepted. moto's own threaded server checks
    the condition and writes without a lock and accepted two in a few rounds of 300 with
    a short thread switch interval (tests/support/s3_support.py), which lost a blob in
    ``test_a_put_racing_the_collector_never_loses_its_blob[s3]``."""
    import obstore
    from obstore.exceptions import PreconditionError

    store = _store(s3_endpoint, new_bucket(s3_endpoint))._store
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave often: the unlocked window shows
    try:
        for round_ in range(100):
            await obstore.put_async(store, DIGEST, b"base %d" % round_)
            head = await obstore.get_async(store, DIGEST, options={"head": True})
            etag = head.meta["e_tag"]

            async def conditional(n: int, round_: int = round_, etag: Any = etag) -> bool:
                try:
                    await obstore.put_async(
                        store,
                        DIGEST,
                        b"%d-%d" % (round_, n),
                        mode={"e_tag": etag},
                        use_multipart=False,
                    )
                except PreconditionError:
                    return False
                return True

            accepted = await asyncio.gather(*(conditional(n) for n in range(6)))
            assert sum(accepted) == 1, f"round {round_}: {sum(accepted)} of 6 accepted"
    finally:
        sys.setswitchinterval(switching)


async def test_what_an_object_holds(s3_endpoint: str) -> None:
    import obstore

    bucket = new_bucket(s3_endpoint)
    store = _store(s3_endpoint, bucket)
    keep = int(time.time() * 1000) + LATER
    await store.put(DIGEST, DATA, keep_until_ms=keep)
    got = await obstore.get_async(store._store, DIGEST)
    # The keep-until first (so a refresh changes the ETag), then the blob's bytes.
    assert bytes(await got.bytes_async()) == b"%d\n" % keep + DATA
    assert got.attributes["siglo-keep-until"] == str(keep)
    # A put of a blob whose keep-until is late enough writes nothing (a HEAD, no more).
    writes: list[str] = []
    writing = store._write

    async def counted(digest: str, body: bytes, attributes: Any, mode: Any) -> bool:
        writes.append(digest)
        return await writing(digest, body, attributes, mode)

    store._write = counted  # type: ignore[method-assign]
    await store.put(DIGEST, DATA)
    assert writes == []
    await store.put(DIGEST, DATA, keep_until_ms=keep + 1)  # raised: written again
    assert writes == [DIGEST]
    # An object under a digest's name that siglo did not write is refused, not misread.
    other = blob_digest(b"other")
    await obstore.put_async(store._store, other, b"other")
    with pytest.raises(StorageAdapterError, match="not a blob siglo wrote"):
        await store.get(other)


async def test_an_object_siglo_did_not_write_is_never_collected_nor_overwritten(
    s3_endpoint: str,
) -> None:
    """A prefix shared with another tool whose objects are named by 64 hex digits:
    `collect-blobs` took them for stale blobs and deleted them (a black-box auditor).
    They are not listed, not collected, not deleted, and a put of that name is refused
    rather than overwrite them."""
    import obstore

    store = _store(s3_endpoint, new_bucket(s3_endpoint))
    foreign = blob_digest(b"another tool's object")
    await obstore.put_async(store._store, foreign, b"another tool's object")
    await store.put(DIGEST, DATA)
    assert [digest async for digest, _ in store.scan()] == [DIGEST]
    assert await store.delete_stale(foreign, int(time.time() * 1000) + LATER) is False
    assert await store.delete(foreign) is False
    with pytest.raises(StorageAdapterError, match="not a blob siglo wrote"):
        await store.put(foreign, b"{}")
    async with any_backend("sqlite") as backend:
        done = await collect_blobs(backend.adapter, store, now_ms=int(time.time() * 1000) + LATER)
    assert (done.removed, done.kept) == (1, 0)  # siglo's unreferenced blob alone
    got = await obstore.get_async(store._store, foreign)
    assert bytes(await got.bytes_async()) == b"another tool's object"


async def test_refresh_ms_spares_uploads_within_its_slack(s3_endpoint: str) -> None:
    bucket = new_bucket(s3_endpoint)
    exact = _store(s3_endpoint, bucket)
    slack = _store(s3_endpoint, bucket, refresh_ms=60_000)
    writes: list[str] = []

    def counting(store: S3BlobStore) -> None:
        writing = store._write

        async def counted(digest: str, body: bytes, attributes: Any, mode: Any) -> bool:
            writes.append("write")
            return await writing(digest, body, attributes, mode)

        store._write = counted  # type: ignore[method-assign]

    async def kept_since(ago_ms: int) -> int:
        old = int(time.time() * 1000) - ago_ms
        body = b"%d\n" % old + DATA
        assert await exact._write(DIGEST, body, {"siglo-keep-until": str(old)}, "overwrite")
        return old

    counting(exact)
    counting(slack)
    await kept_since(30_000)
    writes.clear()
    await slack.put(DIGEST, DATA)  # 30 s behind, within the 60 s slack: left alone
    assert writes == []
    await exact.put(DIGEST, DATA)  # the default: raised to now, uploaded again
    assert writes == ["write"]
    await kept_since(120_000)
    writes.clear()
    before = int(time.time() * 1000)
    await slack.put(DIGEST, DATA)  # past the slack: raised to now
    assert writes == ["write"]
    ((_, kept),) = [x async for x in slack.scan()]
    assert kept >= before
    # A keep-until asked for (a cache entry's end) is always met.
    writes.clear()
    await slack.put(DIGEST, DATA, keep_until_ms=before + LATER)
    assert writes == ["write"]
    with pytest.raises(InvalidArgumentError, match="refresh_ms must be >= 0"):
        _store(s3_endpoint, bucket, refresh_ms=-1)


# Through siglo.connect the default refresh_ms is a quarter of blob_grace_ms (15 min).
@pytest.mark.parametrize(("option", "uploads"), [("&refresh_ms=0", 10), ("", 1)])
async def test_saves_of_an_unchanged_value_upload_it_each_time_or_once(
    s3_endpoint: str, tmp_path: Path, option: str, uploads: int
) -> None:
    import logging

    requests: list[str] = []

    class Requests(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            requests.append(record.getMessage())

    url = s3_url(s3_endpoint, new_bucket(s3_endpoint)) + option
    settings = Settings(offload_min_bytes=1_024, blob_url=url)
    server_log = logging.getLogger("werkzeug")  # moto's server logs each request it serves
    handler, level = Requests(), server_log.level
    server_log.addHandler(handler)
    server_log.setLevel(logging.INFO)
    try:
        async with siglo.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", settings=settings) as b:
            manager = siglo.StorageManager(b)
            stack = manager.create_stack("run")
            stack.set("doc", "text", BIG)
            for step in range(10):
                stack.set("step", "n", step)
                await manager.save_checkpoint("run")
        # The server logs a request after answering it: wait for the last line.
        for _ in range(250):
            if len(requests) >= 10 + uploads:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # and for any line too many
    finally:
        server_log.removeHandler(handler)
        server_log.setLevel(level)
    # (A 404 is logged in colour: the method follows an escape sequence, not the quote.)
    assert sum("PUT /" in line for line in requests) == uploads
    assert sum("HEAD /" in line for line in requests) == 10


# -- the URL -----------------------------------------------------------------------------


def test_the_url_names_bucket_prefix_options_and_hides_secrets() -> None:
    url = (
        f"s3://bucket/some/prefix?region={REGION}&access_key_id={ACCESS_KEY_ID}"
        f"&secret_access_key={SECRET_ACCESS_KEY}"
    )
    store = open_blob_store(url + "&session_token=tok-SECRET&endpoint=http://127.0.0.1:1")
    assert SECRET_ACCESS_KEY not in store.url and "tok-SECRET" not in store.url
    assert store.url.startswith("s3://bucket/some/prefix?") and "***" in store.url
    with pytest.raises(InvalidArgumentError, match="'endpont' — did you mean endpoint") as bad:
        open_blob_store(url + "&endpont=http://127.0.0.1:1")
    assert SECRET_ACCESS_KEY not in str(bad.value)
    with pytest.raises(InvalidArgumentError, match=r"s3://bucket\[/prefix\]"):
        open_blob_store("s3:///prefix")
    with pytest.raises(InvalidArgumentError, match="takeover_ms must be an integer"):
        open_blob_store("s3://bucket?takeover_ms=soon")
    with pytest.raises(InvalidArgumentError, match="takeover_ms must be >= 3"):
        open_blob_store("s3://bucket?takeover_ms=0")
    settings = Settings(offload_min_bytes=1_024, blob_url=url)
    assert SECRET_ACCESS_KEY not in repr(settings)
    assert SECRET_ACCESS_KEY not in str(settings.describe())


def test_without_obstore_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "obstore.store", None)
    with pytest.raises(DriverNotInstalledError, match=r"pip install 'siglo\[s3\]>=0.1,<1'") as e:
        open_blob_store(f"s3://bucket?secret_access_key={SECRET_ACCESS_KEY}")
    assert SECRET_ACCESS_KEY not in str(e.value)


async def test_credentials_from_the_environment(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(name, value)
    store = open_blob_store(f"s3://{new_bucket(s3_endpoint)}/p")
    await store.put(DIGEST, DATA)
    assert await store.get(DIGEST) == DATA


# -- end to end ----------------------------------------------------------------------------


@asynccontextmanager
async def _offloading(kind: str, store: BlobStore) -> AsyncIterator[siglo.Backend]:
    async with any_backend(kind) as backend:
        own = backend.adapter
        backend.adapter = offload_adapter(own, Offloader(store, 1_024))
        try:
            yield backend
        finally:
            backend.adapter = own


async def test_postgres_offloads_to_s3_and_the_collector_leaves_no_orphans(
    s3_endpoint: str,
) -> None:
    store = _store(s3_endpoint, new_bucket(s3_endpoint))
    async with _offloading("postgres", store) as backend:
        a = backend.adapter
        await a.save_checkpoint(_cp("live", chat={"history": BIG, "turns": 2}))
        await a.save_checkpoint(_cp("dead", chat={"history": BIG + "dead"}))
        got = await a.get_checkpoint("live")
        assert got is not None and got.contexts["chat"] == {"history": BIG, "turns": 2}
        assert await a.delete_checkpoint("dead") is True
        done = await collect_blobs(a, store, now_ms=int(time.time() * 1000) + LATER)
        assert (done.referenced, done.removed, done.kept) == (1, 1, 0)
        stored = await backend.raw_adapter.get_checkpoint("live")
        assert stored is not None
        assert {d async for d, _ in store.scan()} == set(references(stored))  # no orphans
        got = await a.get_checkpoint("live")
        assert got is not None and got.contexts["chat"]["history"] == BIG  # nothing dangles


def test_siglo_collect_blobs_on_s3(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import obstore
    from click.testing import CliRunner

    from siglo.cli import cli
    from siglo.config import reset_settings

    url = s3_url(s3_endpoint, new_bucket(s3_endpoint), "app/blobs")
    (tmp_path / "siglo.toml").write_text(
        f'url = "sqlite:///{tmp_path / "app.db"}"\noffload_min_bytes = 1024\n'
        f'blob_url = "{url}"\nredact_fields = ["api_key"]\n'
    )
    monkeypatch.chdir(tmp_path)
    reset_settings()

    async def write() -> None:
        async with siglo.connect() as backend:
            doc = {"api_key": "KEY-7781", "text": BIG}
            await backend.adapter.save_checkpoint(_cp("kept", s={"v": doc}))
            await backend.adapter.save_checkpoint(_cp("gone", s={"v": BIG + "gone"}))
            await backend.adapter.delete_checkpoint("gone")

    async def read() -> tuple[Any, list[bytes]]:
        async with siglo.connect() as backend:
            kept = await backend.adapter.get_checkpoint("kept")
        raw = open_blob_store(url)
        assert isinstance(raw, S3BlobStore)
        found = [
            bytes(await (await obstore.get_async(raw._store, d)).bytes_async())
            async for d, _ in raw.scan()
        ]
        return kept, found

    try:
        asyncio.run(write())
        runner = CliRunner()
        first = runner.invoke(cli, ["collect-blobs", "--json"])
        assert first.exit_code == 0, first.output
        assert '"removed": 0' in first.output and '"kept": 1' in first.output
        second = runner.invoke(cli, ["collect-blobs", "--grace-ms", "0"])
        assert second.exit_code == 0, second.output
        # rich folds the title to the table's width, centred.
        title = "".join(line.strip() for line in second.output.splitlines())
        assert SECRET_ACCESS_KEY not in title and "secret_access_key=***" in title
        assert "removed" in second.output
        kept, objects = asyncio.run(read())
        assert kept.contexts["s"]["v"] == {"api_key": "[REDACTED]", "text": BIG}
        # One blob left, the live one, redacted before it was offloaded.
        assert len(objects) == 1 and b"KEY-7781" not in objects[0]
        shown = runner.invoke(cli, ["config"])
        assert SECRET_ACCESS_KEY not in shown.output
    finally:
        reset_settings()


def test_credentials_in_the_user_info_are_refused_naming_the_options() -> None:
    """``s3://KEY:SECRET@bucket`` is not how an S3 URL carries credentials: the user
    info became part of the bucket name, the credentials were ignored and the client
    went looking for instance credentials. Refused at once, naming the options, and
    without the secret in the message."""
    with pytest.raises(InvalidArgumentError, match="secret_access_key") as bad:
        open_blob_store(f"s3://{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}@bucket/prefix")
    assert SECRET_ACCESS_KEY not in str(bad.value)
    with pytest.raises(InvalidArgumentError, match="access_key_id"):
        open_blob_store("s3://someone@bucket/prefix")
