"""A blob store used on behalf of a backend is bounded by that backend's
``command_timeout_ms`` (SPEC §4 "One configuration, every path"; docs/large-state.md):
a save that offloads a value, a load that resolves one, and the collector fail within the
bound with siglo's timeout errors when the blob store stops answering, and a save whose
blob put timed out wrote nothing of its checkpoint.

Real stalls, no mocks: a Redis blob store and the S3 store (moto's server) reached through
a loopback proxy that freezes (bytes stop flowing, connections stay open: a server stopped
with SIGSTOP), and a PostgreSQL blob store whose table another connection holds locked."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from _tcp_proxy import TcpProxy, tcp_proxy

import siglo
from siglo import Checkpoint
from siglo.blobs import BoundedBlobStore, blob_digest, bounded, open_blob_store
from siglo.config import Settings
from siglo.connect import command_timeout_ms
from siglo.errors import InvalidArgumentError, OutcomeUnknownError, StorageAdapterError
from siglo.offload import OffloadAdapter, Offloader, collect_blobs, offload_adapter, resolving

pytestmark = pytest.mark.rule("blobs.bounded", "blobs.offload", "blobs.collect")

T = TypeVar("T")

TIGHT_MS = 300
BOUND_S = 4.0
"""How long a call may take to fail against a stalled blob store: the tight bound plus
room for a loaded machine, far below the default bound (10 s)."""
BIG = "large tool output " * 2_000
LATER_MS = 7_200_000


def _cp(stack: str, revision: int, value: str) -> Checkpoint:
    return Checkpoint(
        stack_id=stack, revision=revision, timestamp=revision, contexts={"s": {"v": value}}
    )


@asynccontextmanager
async def _proxied_blob_url(
    kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[str, TcpProxy]]:
    """The blob_url of a fresh Redis or S3 blob store reached through a freezable proxy."""
    if kind == "redis":
        from _redis_helpers import REDIS_URL, require_redis

        require_redis()
        parts = urlsplit(REDIS_URL)
        import redis.asyncio

        from siglo_redis.connect import delete_prefix

        prefix = f"siglo-blob-timeouts-{secrets.token_hex(6)}:"
        with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
            try:
                yield f"redis://{proxy.url_host}/0?prefix={prefix}", proxy
            finally:
                proxy.thaw()
                client = redis.asyncio.Redis(
                    host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=0
                )
                try:
                    await delete_prefix(client, prefix)  # the blobs the test stored
                finally:
                    await client.aclose()
        return
    if kind == "postgres":
        # psycopg, cancelled at the bound, waited up to 10 s for the stalled server to
        # acknowledge the cancel (a black-box auditor: 10.3 s at a bound of 300 ms).
        from sql_support import POSTGRES_URL, require_postgres

        from siglo_postgres import drop_schema

        require_postgres()
        parts = urlsplit(POSTGRES_URL)
        schema = f"siglo_blob_timeouts_{secrets.token_hex(6)}"
        with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
            try:
                url = parts._replace(netloc=f"{parts.username}@{proxy.url_host}").geturl()
                yield f"{url}?schema={schema}", proxy
            finally:
                proxy.thaw()
                await drop_schema(POSTGRES_URL, schema)
        return
    from s3_support import new_bucket, s3_url

    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = new_bucket(endpoint)
    parts = urlsplit(endpoint)
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 80) as proxy:
        yield s3_url(f"http://{proxy.url_host}", bucket), proxy


async def _fails_in_time(
    call: Any, error: type[BaseException], hung_s: float = 30
) -> BaseException:
    began = time.monotonic()
    with pytest.raises(error) as failed:
        await asyncio.wait_for(call, hung_s)
    took = time.monotonic() - began
    assert took < BOUND_S, f"took {took:.1f} s to fail: {failed.value!r}"
    assert "command_timeout_ms=300" in str(failed.value), failed.value
    return failed.value


async def _once_drained(call: Callable[[], Awaitable[T]], within_s: float = 20) -> T:
    """``call()`` retried while it times out at the tight bound, for up to ``within_s``:
    any other failure, or one that outlasts the drain, is raised."""
    ends = time.monotonic() + within_s
    while True:
        try:
            return await call()
        except StorageAdapterError as exc:
            if "timed out" not in str(exc) or time.monotonic() > ends:
                raise
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("how", ["settings", "url"])
@pytest.mark.parametrize("kind", ["redis", "s3", "postgres"])
async def test_offloading_is_bounded_by_the_backends_timeout(
    kind: str, how: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The bound comes from where the backend's comes from: the settings, or the backend
    URL (which wins over the settings)."""
    async with _proxied_blob_url(kind, request) as (blob_url, proxy):
        db = f"sqlite:///{tmp_path / 'app.db'}"
        if how == "settings":
            settings = Settings(offload_min_bytes=1_024, blob_url=blob_url, command_timeout_ms=300)
        else:
            settings = Settings(offload_min_bytes=1_024, blob_url=blob_url)
            db += f"?command_timeout_ms={TIGHT_MS}"
        backend = siglo.connect(db, settings=settings)
        try:
            adapter = resolving(backend.adapter)  # the offloading layer, below the pipeline
            assert isinstance(adapter, OffloadAdapter)
            store = adapter.offloader.store
            assert isinstance(store, BoundedBlobStore) and store.command_timeout_ms == TIGHT_MS
            await adapter.save_checkpoint(_cp("a", 1, BIG))
            proxy.freeze()
            # A save whose put stalls: the outcome of the put is unknown, the save's
            # checkpoint was not written (the put comes first).
            late = await _fails_in_time(
                adapter.save_checkpoint(_cp("a", 2, BIG + " two"), expected_revision=1),
                OutcomeUnknownError,
            )
            assert "a put of" in str(late)
            stored = await adapter.inner.get_checkpoint("a")
            assert stored is not None and stored.revision == 1
            # A load that resolves a reference: a timeout, not a dangling reference.
            read = await _fails_in_time(adapter.get_checkpoint("a"), StorageAdapterError)
            assert "timed out a get of" in str(read)
            # The collector on the backend's (bounded) store.
            await _fails_in_time(
                collect_blobs(adapter, store, now_ms=int(time.time() * 1000) + LATER_MS),
                StorageAdapterError,
            )
            proxy.thaw()
            # Nothing was left broken: the same backend reads and saves again — once the
            # calls the stall held up have drained (obstore's cut-off requests go on in
            # its runtime: on a loaded machine moto answered the first read after the
            # thaw past 300 ms).
            got = await _once_drained(lambda: adapter.get_checkpoint("a"))
            assert got is not None and got.contexts["s"]["v"] == BIG
            await _once_drained(
                lambda: adapter.save_checkpoint(_cp("a", 2, BIG + " two"), expected_revision=1)
            )
            done = await _once_drained(
                lambda: collect_blobs(adapter, store, now_ms=int(time.time() * 1000) + LATER_MS)
            )
            assert done.referenced == 1
            async for digest, _ in store.scan():
                await store.delete(digest)
        finally:
            proxy.thaw()
            await backend.aclose()


async def test_a_postgres_blob_store_behind_a_lock_is_bounded(tmp_path: Path) -> None:
    import psycopg
    from sql_support import POSTGRES_URL, require_postgres

    from siglo_postgres import drop_schema

    require_postgres()
    schema = f"siglo_blob_timeouts_{secrets.token_hex(6)}"
    settings = Settings(
        offload_min_bytes=1_024, blob_url=f"{POSTGRES_URL}?schema={schema}", command_timeout_ms=300
    )
    backend = siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings)
    locker = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
    try:
        adapter = resolving(backend.adapter)  # the offloading layer, below the pipeline
        assert isinstance(adapter, OffloadAdapter)
        await adapter.save_checkpoint(_cp("a", 1, BIG))
        await locker.execute("BEGIN")
        await locker.execute(f'LOCK TABLE "{schema}"."siglo_blobs" IN ACCESS EXCLUSIVE MODE')
        await _fails_in_time(adapter.get_checkpoint("a"), StorageAdapterError)
        await _fails_in_time(
            adapter.save_checkpoint(_cp("a", 2, BIG + " two"), expected_revision=1),
            OutcomeUnknownError,
        )
        await _fails_in_time(
            collect_blobs(
                adapter, adapter.offloader.store, now_ms=int(time.time() * 1000) + LATER_MS
            ),
            StorageAdapterError,
        )
        # Cancelled in the server, not left waiting on the lock to run later.
        await asyncio.sleep(0.2)
        waiting = await locker.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND pid <> pg_backend_pid() AND query LIKE %s",
            (f"%{schema}%",),
        )
        assert await waiting.fetchone() == (0,)
        await locker.execute("ROLLBACK")
        stored = await adapter.inner.get_checkpoint("a")
        assert stored is not None and stored.revision == 1
        # The statements were cancelled in the server, and the connection serves again.
        got = await adapter.get_checkpoint("a")
        assert got is not None and got.contexts["s"]["v"] == BIG
    finally:
        await locker.close()
        await backend.aclose()
        await drop_schema(POSTGRES_URL, schema)


@pytest.mark.parametrize("command", [("collect-blobs",), ("export",), ("show", "a")])
def test_siglo_commands_are_bounded_by_a_stalled_blob_store(
    command: tuple[str, ...], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The commands that reach the blob store (the collector; export and show, which
    resolve references) bound it by the settings' command_timeout_ms too."""

    async def prepare(blob_url: str) -> None:
        settings = Settings(offload_min_bytes=1_024, blob_url=blob_url)
        async with siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as b:
            await b.adapter.save_checkpoint(_cp("a", 1, BIG))

    async def run() -> subprocess.CompletedProcess[str]:
        async with _proxied_blob_url("redis", request) as (blob_url, proxy):
            await prepare(blob_url)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SIGLO_")}
            env |= {
                "SIGLO_URL": f"sqlite:///{tmp_path / 'app.db'}",
                "SIGLO_BLOB_URL": blob_url,
                "SIGLO_OFFLOAD_MIN_BYTES": "1024",
                "SIGLO_COMMAND_TIMEOUT_MS": str(TIGHT_MS),
            }
            proxy.freeze()
            began = time.monotonic()
            try:
                done = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "siglo", *command],
                    env=env,
                    cwd=tmp_path,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            finally:
                proxy.cut()
            took = time.monotonic() - began
            assert took < 8.0, f"siglo {command[0]} took {took:.1f} s against a stalled store"
            return done

    done = asyncio.run(run())
    assert done.returncode == 1, done
    assert "timed out" in done.stdout + done.stderr, done


def test_the_bound_a_backend_is_connected_with() -> None:
    assert command_timeout_ms("redis://h/0", {}) == 10_000
    assert command_timeout_ms("redis://h/0?command_timeout_ms=250", {}) == 250
    assert command_timeout_ms("redis://h/0?command_timeout_ms=none", {}) is None
    assert (
        command_timeout_ms("redis://h/0?command_timeout_ms=250", {"command_timeout_ms": 90}) == 90
    )
    assert command_timeout_ms("redis://h/0", {"command_timeout_ms": None}) is None


async def test_an_unbounded_backend_leaves_the_store_unbounded(tmp_path: Path) -> None:
    settings = Settings(
        offload_min_bytes=1_024, blob_url=(tmp_path / "b").as_uri(), command_timeout_ms=None
    )
    async with siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings) as backend:
        adapter = resolving(backend.adapter)  # the offloading layer, below the pipeline
        assert isinstance(adapter, OffloadAdapter)
        assert not isinstance(adapter.offloader.store, BoundedBlobStore)


async def test_a_bounded_store_refuses_bad_input_as_such(tmp_path: Path) -> None:
    store = bounded(open_blob_store((tmp_path / "b").as_uri()), TIGHT_MS)
    with pytest.raises(InvalidArgumentError, match="64 lower-case hex digits"):
        await store.put("nope", b"x")
    with pytest.raises(InvalidArgumentError, match="command_timeout_ms"):
        BoundedBlobStore(store, 0)
    data = b'"x"'
    await store.put(blob_digest(data), data)
    assert await store.get(blob_digest(data)) == data
    assert await store.get(blob_digest(b'"y"')) is None


async def test_a_bounded_s3_put_on_a_marker_left_behind_is_taken_over_on_retry(
    s3_endpoint: str,
) -> None:
    """A put waits ``takeover_ms`` on a marker a collector left before taking it over; a
    bound shorter than that ends the put first. The store remembers when it first saw the
    marker, so a retry once ``takeover_ms`` has passed takes it over (otherwise every
    retry would wait from the start, and time out, until a collection came)."""
    from s3_support import new_bucket, s3_url

    from siglo.s3 import S3BlobStore

    url = s3_url(s3_endpoint, new_bucket(s3_endpoint))
    collector = open_blob_store(url)
    inner = open_blob_store(url + "&takeover_ms=600")
    assert isinstance(collector, S3BlobStore) and isinstance(inner, S3BlobStore)
    writer = bounded(inner, TIGHT_MS)
    data = b'{"large":"value"}'
    digest = blob_digest(data)
    await writer.put(digest, data)

    async def dies_before_delete(digest: str) -> None:
        raise StorageAdapterError("the collector stopped")

    collector._remove = dies_before_delete  # type: ignore[method-assign]
    with pytest.raises(StorageAdapterError, match="stopped"):
        await collector.delete_stale(digest, int(time.time() * 1000) + LATER_MS)
    await _fails_in_time(writer.put(digest, data), OutcomeUnknownError)
    await asyncio.sleep(0.4)  # 0.3 s waited, 0.4 s more: past takeover_ms since first seen
    began = time.monotonic()
    await writer.put(digest, data)
    assert time.monotonic() - began < TIGHT_MS / 1000
    assert await writer.get(digest) == data


async def test_the_check_catches_an_unbounded_blob_store(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The check above fails a blob store that is not bounded (as every store was): the
    load hangs on the stalled store instead of failing with siglo's timeout."""
    async with _proxied_blob_url("redis", request) as (blob_url, proxy):
        settings = Settings(command_timeout_ms=TIGHT_MS)
        backend = siglo.connect(f"sqlite:///{tmp_path / 'app.db'}", settings=settings)
        unbounded = open_blob_store(blob_url)
        backend.adapter = offload_adapter(backend.adapter, Offloader(unbounded, 1_024))
        try:
            await backend.adapter.save_checkpoint(_cp("a", 1, BIG))
            proxy.freeze()
            with pytest.raises(TimeoutError):  # the check's own limit, not siglo's bound
                await _fails_in_time(backend.adapter.get_checkpoint("a"), StorageAdapterError, 2)
        finally:
            proxy.cut()
            await backend.aclose()


def test_a_directory_put_that_fails_mid_write_leaves_no_partial_file(tmp_path: Path) -> None:
    """A blob whose write fails half-way (here a real file size limit, ``RLIMIT_FSIZE``,
    in a child process: the kernel refuses the write past it) raises
    StorageAdapterError and leaves nothing in the directory — no blob, no temporary
    file that no collection would ever remove."""
    script = f"""
import asyncio, resource, signal
from siglo.blobs import DirectoryBlobStore, blob_digest
from siglo.errors import StorageAdapterError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write, not a killed process
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
data = b"x" * 100_000
try:
    asyncio.run(DirectoryBlobStore({str(tmp_path)!r}).put(blob_digest(data), data))
except StorageAdapterError as exc:
    print("refused:", exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:"), done.stdout
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
