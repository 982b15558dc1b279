"""Unknown URL options are refused at once, naming the option and the closest known one
(issue 31, defect 6). Before, ``redis://…?prefx=`` went to redis-py, whose connections
then failed and were retried until the call timed out (10 s, reported as a timeout);
SQLite, memory and the example plugin ignored an unknown option silently.

A backend built from a good URL still reaches its server with the driver's own
parameters (redis-py's ``client_name``, libpq's ``application_name``)."""

from __future__ import annotations

import importlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis
from sql_support import POSTGRES_URL

import siglo
from siglo import urls
from siglo.errors import InvalidArgumentError


def _refused(url: str, *names: str) -> str:
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError) as info:
        siglo.connect(url)
    # At once: no connection is tried (the Redis typo took 10 s to fail before).
    assert time.monotonic() - started < 1.0
    message = str(info.value)
    for name in names:
        assert name in message, message
    return message


@pytest.mark.rule("plugins.url-options")
@pytest.mark.parametrize(
    ("url", "typo", "meant"),
    [
        ("redis://127.0.0.1:6379/0?prefx=app:", "prefx", "prefix"),
        ("redis://127.0.0.1:6379/0?socket_timout=1", "socket_timout", "socket_timeout"),
        ("redis://127.0.0.1:6379/0?comand_timeout_ms=5", "comand_timeout_ms", "command_timeout_ms"),
        ("postgresql://127.0.0.1:5432/test?shema=app", "shema", "schema"),
        ("postgresql://127.0.0.1:5432/test?sslmod=disable", "sslmod", "sslmode"),
        ("sqlite:///typo.db?busy_timout_ms=5", "busy_timout_ms", "busy_timeout_ms"),
        ("sqlite://?table_prefx=app_", "table_prefx", "table_prefix"),
    ],
)
def test_an_unknown_option_is_refused_naming_the_closest_known_one(
    url: str, typo: str, meant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    message = _refused(url, repr(typo), f"did you mean {meant}?", "known:")
    assert "prefix" in message or "schema" in message or "busy_timeout_ms" in message
    assert not (tmp_path / "typo.db").exists()  # nothing was created


@pytest.mark.rule("plugins.url-options")
@pytest.mark.parametrize(
    "url",
    [
        "memory://?checkpoint_ttl_ms=5",
        "memory://shared-name?x=1",
        "filestore://{tmp}/never?cache_ttl_ms=5",
    ],
)
def test_a_backend_that_reads_no_url_options_refuses_any(url: str, tmp_path: Path) -> None:
    _refused(url.format(tmp=tmp_path), "takes no options", "keyword arguments")
    assert not (tmp_path / "never").exists()  # refused before the plugin made its directory


@pytest.mark.rule("plugins.url-options")
@pytest.mark.parametrize(
    ("url", "typo", "meant"),
    [
        ("memory://", "prefix", None),
        ("memory://", "cache_tl_ms", "cache_ttl_ms"),
        # A plugin whose factory names its options (docs/writing-a-backend.md).
        ("filestore://{tmp}/never", "cache_tl_ms", "cache_ttl_ms"),
        # The built-in backends, which take **options and refuse what they do not know.
        ("sqlite:///{tmp}/never", "busy_timout_ms", "busy_timeout_ms"),
        (POSTGRES_URL, "shema", "schema"),
        (REDIS_URL, "prefx", "prefix"),
    ],
)
def test_a_keyword_option_the_factory_does_not_take_is_refused_by_name(
    url: str, typo: str, meant: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given as a keyword or by a siglo.toml's [options] (which then names its file): an
    InvalidArgumentError naming the option, never a TypeError of the factory nor an
    option silently dropped (an auditor's finding: memory:// raised TypeError, a plugin
    that took ``**unused`` dropped the typo)."""
    url = url.format(tmp=tmp_path)
    with pytest.raises(InvalidArgumentError) as info:
        siglo.connect(url, **{typo: 5})
    assert repr(typo) in str(info.value) and "keyword option" in str(info.value)
    if meant is not None:
        assert f"did you mean {meant}?" in str(info.value)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "siglo.toml").write_text(f"[options]\n{typo} = 5\n", encoding="utf-8")
    from siglo.config import reset_settings

    reset_settings()
    try:
        with pytest.raises(InvalidArgumentError) as from_file:
            siglo.connect(url)
        assert "from the [options] of" in str(from_file.value)
        assert "siglo.toml" in str(from_file.value)
    finally:
        reset_settings()
    assert not (tmp_path / "never").exists()


def test_unrelated_names_are_listed_without_a_guess() -> None:
    message = _refused("sqlite://?zzz=1&qqq=2", "'qqq'", "'zzz'", "options")
    assert "did you mean" not in message


def test_the_helper_suggests_from_driver_names_but_lists_only_its_own() -> None:
    error = urls.unknown_option_error(
        "x", ["socket_timout"], ["prefix"], suggest=["socket_timeout", "db"]
    )
    assert "did you mean socket_timeout?" in str(error)
    assert "known: prefix" in str(error)
    assert "db" not in str(error).split("known:")[1]


async def test_redis_driver_parameters_still_reach_redis_py() -> None:
    require_redis()
    name = f"siglo-{uuid.uuid4().hex[:8]}"
    prefix = f"siglo-test-{uuid.uuid4().hex[:12]}:"
    url = urls.with_options(REDIS_URL, {"client_name": name, "prefix": prefix})
    async with siglo.connect(url) as backend:
        assert await backend.adapter.get_checkpoint("nothing") is None
        client = backend.adapter.client  # type: ignore[attr-defined]
        assert await client.client_getname() == name


async def test_libpq_parameters_still_reach_postgresql() -> None:
    from siglo_postgres import isolated

    url = urls.with_options(POSTGRES_URL, {"application_name": "siglo-url-options"})
    async with isolated(url) as backend:
        assert await backend.adapter.get_checkpoint("nothing") is None
    with pytest.raises(InvalidArgumentError, match="'sslmod' — did you mean sslmode"):
        async with isolated(urls.with_options(POSTGRES_URL, {"sslmod": "disable"})):
            pass


@pytest.mark.parametrize(
    ("url", "typo", "meant"),
    [
        ("redis://127.0.0.1:6379/0?prefx=app:", "prefx", "prefix"),
        ("redis://127.0.0.1:6379/0?socket_timout=1", "socket_timout", "socket_timeout"),
        ("postgresql://127.0.0.1:5432/test?table_prefx=b_", "table_prefx", "table_prefix"),
        ("postgresql://127.0.0.1:5432/test?sslmod=disable", "sslmod", "sslmode"),
    ],
)
def test_a_blob_store_url_refuses_an_unknown_option(url: str, typo: str, meant: str) -> None:
    """A blob store's URL (``blob_url``) is checked like a backend's: the Redis store
    dropped every query parameter but ``prefix`` (a ``prefx=`` typo put the blobs under
    the default prefix, shared with any other application), the PostgreSQL one left an
    unknown name to fail at the first put."""
    from siglo.blobs import open_blob_store

    # At once, not at the first put (a connection's timeout): timed after the driver is
    # imported, which on a loaded machine took 2 s by itself.
    importlib.import_module("redis.asyncio" if url.startswith("redis") else "psycopg")
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError) as info:
        open_blob_store(url)
    assert time.monotonic() - started < 1.0
    assert repr(typo) in str(info.value) and f"did you mean {meant}?" in str(info.value)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("file:///tmp/siglo-blobs-never?prefx=1", "directory"),
        ("file:///tmp/siglo-blobs-never?table_prefix=x", "directory"),
        ("memory://?prefx=1", "memory"),
    ],
)
def test_a_blob_store_that_takes_no_option_refuses_one(url: str, kind: str) -> None:
    """The directory and the memory blob stores take no option: one in their URL was
    dropped (``file://…?prefx=1``), or refused as "not a blob store siglo knows"
    (``memory://?prefx=1``) — both auditors' findings. Each is refused by name."""
    from siglo.blobs import open_blob_store

    with pytest.raises(InvalidArgumentError) as info:
        open_blob_store(url)
    option = url.rpartition("?")[2].partition("=")[0]
    assert f"unknown {kind} blob store URL option {option!r}" in str(info.value)
    assert "takes no options" in str(info.value)
    assert not os.path.exists("/tmp/siglo-blobs-never")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("file://./siglo-blobs-never", "names host '.'"),
        ("file:///tmp/siglo-blobs-never#part", "has a fragment"),
        ("redis://127.0.0.1:6379/0#part", "has a fragment"),
    ],
)
def test_a_blob_store_url_with_a_host_or_a_fragment_it_would_drop_is_refused(
    url: str, said: str
) -> None:
    """``file://./dir`` is the host ``.`` and the path ``/dir``: the blobs went to
    ``/dir`` at the file system's root; a fragment was dropped (a black-box auditor)."""
    from siglo.blobs import open_blob_store

    with pytest.raises(InvalidArgumentError, match=said):
        open_blob_store(url)
    assert not os.path.exists("/siglo-blobs-never")


async def test_redis_driver_parameters_reach_the_redis_blob_store() -> None:
    """What the Redis blob store does not read itself goes to redis-py, as for the
    backend: a ``client_name`` is seen by the server."""
    require_redis()
    from siglo.blobs import blob_digest, open_blob_store

    name = f"siglo-blobs-{uuid.uuid4().hex[:8]}"
    prefix = f"url-options-{name}:"
    store = open_blob_store(f"{REDIS_URL}?prefix={prefix}&client_name={name}")
    try:
        await store.put(blob_digest(b"x"), b"x")
        client: Any = store._client  # type: ignore[attr-defined]
        assert await client.client_getname() == name
    finally:
        await store.delete_stale(blob_digest(b"x"), 2**62)
        await store.aclose()
