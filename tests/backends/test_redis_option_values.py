"""Values of the Redis backend's options that ``siglo.connect`` took and used badly are
refused there, naming the option, before any connection:

- a flag (``strict_atomicity``, ``auto_pipeline``, ``cluster``) went through ``bool()``,
  so ``[1]``, ``2`` or ``nan`` meant true and ``None`` false, and ``backend.url`` carried
  the raw value, which ``siglo.connect(backend.url)`` then refused;
- ``wait_replicas=2**63`` was accepted, and Redis refused the count in the ``WAIT`` after
  every write, which had run: a stored save reported as a plain failure (and a ``WAIT``'s
  error reply after a write is now an unknown outcome);
- ``redis://host/9?db=3`` named two databases, and the query's silently won;
- ``?max_connections=0`` meant no limit (redis-py's reading), and a ``socket_timeout`` of
  0 or below failed every call.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo import urls
from siglo.config import Settings
from siglo.errors import InvalidArgumentError, OutcomeUnknownError
from siglo_redis import RedisStorageAdapter
from siglo_redis.client import client_from_url, close_client

# Nothing listens there: a refusal at connect needs no server, and a value accepted
# connects nowhere until a command is sent.
NOWHERE = "redis://127.0.0.1:1/0?prefix=siglo-option-values:"
FLAGS = ["strict_atomicity", "auto_pipeline", "cluster", "record_context_changes"]


@pytest.mark.parametrize("option", FLAGS)
@pytest.mark.parametrize("value", [[1], 2, 1.5, math.nan, None, 0, 1, "maybe", b"true"])
def test_a_flag_that_is_not_a_bool_is_refused_at_connect(option: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"option {option} must be true or false"):
        siglo.connect(NOWHERE, **{option: value})


@pytest.mark.parametrize("option", FLAGS)
def test_a_flag_from_the_settings_options_that_is_not_a_bool_is_refused(option: str) -> None:
    # TOML has integers: `strict_atomicity = 1` in [options] is no flag either.
    settings = Settings(url=NOWHERE, options={option: 1})
    with pytest.raises(InvalidArgumentError, match=rf"option {option} must be true or false"):
        siglo.connect(settings=settings)


@pytest.mark.parametrize("option", FLAGS)
@pytest.mark.parametrize(
    ("value", "meant"), [(True, True), (False, False), ("true", True), ("0", False)]
)
async def test_a_flag_accepted_reads_back_from_backend_url(
    option: str, value: Any, meant: bool
) -> None:
    written = "true" if meant else "false"
    async with siglo.connect(NOWHERE, **{option: value}) as backend:
        assert f"{option}={written}" in backend.url
        async with siglo.connect(backend.url) as again:
            assert again.url == backend.url


async def test_the_flags_reach_what_they_configure() -> None:
    async with siglo.connect(NOWHERE, strict_atomicity="yes", auto_pipeline="off") as backend:
        lock: Any = backend.lock
        assert lock.strict_atomicity is True
        adapter: Any = backend.raw_adapter
        assert type(adapter.client).__name__ == "SentOnceRedis"


@pytest.mark.parametrize("value", [2**31, 2**63, 10**400, -1, True, 1.5, None, "many"])
def test_a_wait_replicas_out_of_range_or_not_an_integer_is_refused_at_connect(
    value: Any,
) -> None:
    with pytest.raises(InvalidArgumentError, match="wait_replicas must be"):
        siglo.connect(NOWHERE, wait_replicas=value)


@pytest.mark.parametrize("value", [2**31, 2**63, 10**400, -1])
def test_a_wait_replicas_out_of_range_in_the_url_is_refused(value: int) -> None:
    url = f"{NOWHERE}&wait_replicas={value}"
    with pytest.raises(InvalidArgumentError, match="wait_replicas must be"):
        siglo.connect(url)
    # Where a siglo class builds its client from a URL too.
    with pytest.raises(InvalidArgumentError, match="wait_replicas must be"):
        RedisStorageAdapter(url)


@pytest.mark.parametrize("value", [2**62 + 1, 2**63, 10**400, -1])
def test_a_wait_timeout_redis_cannot_add_to_its_clock_is_refused_at_connect(value: int) -> None:
    """Redis refuses a WAIT timeout past a signed 64-bit time only in the WAIT after each
    write, which has then run: every save an unknown outcome, though stored."""
    with pytest.raises(InvalidArgumentError, match="wait_timeout_ms must be from 0 to"):
        siglo.connect(NOWHERE, wait_replicas=1, wait_timeout_ms=value)
    url = f"{NOWHERE}&wait_replicas=1&wait_timeout_ms={value}"
    with pytest.raises(InvalidArgumentError, match="wait_timeout_ms must be from 0 to"):
        siglo.connect(url)
    with pytest.raises(InvalidArgumentError, match="wait_timeout_ms must be from 0 to"):
        RedisStorageAdapter(url)
    assert siglo.connect(NOWHERE, wait_replicas=1, wait_timeout_ms=2**62).url


async def test_the_largest_wait_replicas_is_accepted_and_reads_back() -> None:
    # WAIT's count is a C long to Redis; siglo takes up to a signed 32-bit one.
    async with siglo.connect(NOWHERE, wait_replicas=2**31 - 1) as backend:
        assert f"wait_replicas={2**31 - 1}" in backend.url
        async with siglo.connect(backend.url) as again:
            assert again.url == backend.url


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A fresh key prefix on the shared server, its keys removed afterwards."""
    require_redis()
    import redis.asyncio

    prefix = f"siglo-test-{uuid.uuid4().hex[:16]}:"
    yield prefix
    raw = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        async for key in raw.scan_iter(match=f"{prefix}*"):
            await raw.unlink(key)
    finally:
        await raw.aclose()


async def _refused_wait_leaves_the_write(url: str, prefix: str) -> None:
    """A write through a client whose ``WAIT`` the server refuses (a count past what it
    holds, set past siglo's own check): the write ran, so its outcome is unknown."""
    client = client_from_url(f"{url}&wait_replicas=1&wait_timeout_ms=100")
    client.require_replicas(2**63, 100)
    adapter = RedisStorageAdapter(client, key_prefix=prefix)
    try:
        with pytest.raises(OutcomeUnknownError, match=r"WAIT .* after it failed"):
            await adapter.set_cached_step("k", 1)
        assert await adapter.get_cached_step("k") == 1
    finally:
        await adapter.aclose()
        await close_client(client)


async def test_a_wait_error_reply_after_a_write_is_an_unknown_outcome(prefix: str) -> None:
    await _refused_wait_leaves_the_write(urls.with_options(REDIS_URL, {"prefix": prefix}), prefix)


@pytest.mark.redis_cluster
async def test_a_wait_error_reply_after_a_write_on_a_cluster_is_an_unknown_outcome(
    cluster_url: str,
) -> None:
    await _refused_wait_leaves_the_write(cluster_url, "siglo-wait-error:")


@pytest.mark.parametrize(
    ("url", "path", "query"),
    [
        ("redis://127.0.0.1:1/9?db=3", "9", "3"),
        ("redis://127.0.0.1:1/0?db=", "0", ""),
        ("rediss://127.0.0.1:1/2?prefix=x:&db=5", "2", "5"),
        ("redis://127.0.0.1:1/0?cluster=true&db=1", "0", "1"),
        ("redis+sentinel://127.0.0.1:1/mymaster/9?db=3", "9", "3"),
        ("rediss+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster/1?db=0", "1", "0"),
    ],
)
def test_a_database_given_in_the_path_and_the_query_is_refused(
    url: str, path: str, query: str
) -> None:
    message = rf"database is given twice, '{path}' in the path and '{query}' in the query"
    with pytest.raises(InvalidArgumentError, match=message):
        siglo.connect(url)
    with pytest.raises(InvalidArgumentError, match=message):
        client_from_url(url)


def test_a_database_given_twice_is_refused_without_showing_a_password() -> None:
    with pytest.raises(InvalidArgumentError, match="given twice") as raised:
        siglo.connect("redis://:s3cret-pw@127.0.0.1:1/9?db=3")
    assert "s3cret-pw" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1?db=3",
        "redis://127.0.0.1:1/?db=3",
        "redis://127.0.0.1:1/3",
        "unix:///tmp/siglo-none.sock?db=3",
        "redis+sentinel://127.0.0.1:1/mymaster?db=3",
        "redis+sentinel://127.0.0.1:1/mymaster/3",
        # One database both ways leaves no doubt (tests/core/test_urls.py spells it so).
        "redis://127.0.0.1:1/0?db=0",
        "redis://127.0.0.1:1/03?db=3",
        "redis+sentinel://127.0.0.1:1/mymaster/1?db=1",
    ],
)
async def test_a_database_given_once_is_accepted(url: str) -> None:
    async with siglo.connect(url):
        pass


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:6379/11?db=12&prefix=blobs:", "the database is given twice"),
        ("redis://127.0.0.1:6379/app?prefix=blobs:", "the path of a redis URL is the database"),
    ],
)
def test_a_blob_store_url_names_its_database_as_a_backend_url_does(url: str, message: str) -> None:
    """A blob store URL's options are checked as a backend's (docs/large-state.md):
    `/11?db=12` stored the blobs in db 12 and `/app` in db 0, silently."""
    from siglo.blobs import open_blob_store

    with pytest.raises(InvalidArgumentError, match=message):
        open_blob_store(url)


@pytest.mark.parametrize("value", ["false", 1, None])
def test_a_redis_lock_built_directly_takes_strict_atomicity_as_a_bool(value: Any) -> None:
    """bool("false") is True: the lock ran strictly when asked not to."""
    from siglo_redis.coordination import RedisLock

    with pytest.raises(InvalidArgumentError, match="strict_atomicity must be a bool"):
        RedisLock(REDIS_URL, strict_atomicity=value)


@pytest.mark.parametrize(
    ("parameter", "value"),
    [
        # redis-py reads 0 as a pool without a limit: a burst opens a socket a caller.
        ("max_connections", "0"),
        ("max_connections", "-3"),
        # A timeout that has always passed: every call failed, after its retries.
        ("socket_timeout", "-1"),
        ("socket_timeout", "0"),
        ("socket_connect_timeout", "0"),
        ("socket_connect_timeout", "nan"),
    ],
)
def test_a_driver_bound_that_bounds_nothing_is_refused_naming_it(
    parameter: str, value: str
) -> None:
    from siglo.blobs import open_blob_store

    for url in (
        f"{NOWHERE}&{parameter}={value}",
        f"redis://127.0.0.1:1/0?prefix=blobs:&{parameter}={value}",
    ):
        opener = siglo.connect if "option-values" in url else open_blob_store
        with pytest.raises(InvalidArgumentError, match=rf"{parameter} must be .*{value!r}"):
            opener(url)


@pytest.mark.parametrize(
    "query", ["max_connections=1", "socket_timeout=0.25", "socket_connect_timeout=3"]
)
async def test_a_driver_bound_given_is_used(query: str) -> None:
    require_redis()
    url = f"{REDIS_URL.split('?')[0]}?prefix=siglo-option-values-{uuid.uuid4().hex}:&{query}"
    async with siglo.connect(url) as backend:
        assert await backend.adapter.get_checkpoint("nobody") is None
