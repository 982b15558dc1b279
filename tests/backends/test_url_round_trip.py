"""``siglo.connect(backend.url)`` in another process connects as the first process did:
every option a backend's ``connect`` takes, given as a keyword, rides in ``backend.url``
and builds an equal backend from it (docs/backends/redis.md: "Everything
siglo.connect() needs can ride in the URL").

A black-box audit found Redis's ``lock_key_prefix`` accepted as a keyword, left out of
``backend.url`` and refused in a URL's query: a worker connected with ``backend.url``
took the workflow locks under another prefix, and ran one stack's action while the
application ran it too. The options are enumerated from each backend's own list, so an
option added later without a sample here, or not carried in the URL, fails.

A ``memory://`` URL takes no options: a named store is one object in one process, made
with the options of its first ``connect``; it is not enumerated here.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis

import siglo
from siglo import urls
from siglo.errors import InvalidArgumentError
from siglo.urls import OBJECT_OPTIONS
from siglo_postgres.connect import POSTGRES_OPTIONS
from siglo_redis.client import OPTIONS as REDIS_OPTIONS
from siglo_redis.connect import delete_prefix
from siglo_sqlite.connect import SQLITE_OPTIONS

_SQL_COMMON: list[dict[str, Any]] = [
    {"auto_migrate": False},
    {"table_prefix": "rt_"},
    {"table_prefix": ""},
    {"table_prefix": None},  # no prefix, as "" (not the text "none")
    {"idempotency_ttl_ms": 12_345},
    {"idempotency_lease_ms": 2_345},
    {"command_timeout_ms": 4_321},
    {"command_timeout_ms": None},
    {"checkpoint_ttl_ms": 3_456},
    {"cache_ttl_ms": 4_567},
    {"claim_lease_ms": 5_678},
    {"workflow_lock_timeout_ms": 6_789},
    {"workflow_lock_ttl_ms": 7_890},
    {"clean_batch_size": 77},
    {"incremental_min_bytes": 1_024},
]
PG = "postgresql://siglo@127.0.0.1:5432/round_trip"
RD = "redis://127.0.0.1:6379/0"
SAMPLES: dict[str, tuple[frozenset[str], list[tuple[str, dict[str, Any]]]]] = {
    "sqlite": (
        SQLITE_OPTIONS,
        [
            *(("sqlite:////tmp/siglo-round-trip.db", sample) for sample in _SQL_COMMON),
            ("sqlite:////tmp/siglo-round-trip.db", {"busy_timeout_ms": 999}),
            ("sqlite:////tmp/siglo-round-trip.db", {"synchronous": "FULL"}),
        ],
    ),
    "postgres": (
        POSTGRES_OPTIONS,
        [
            *((PG, sample) for sample in _SQL_COMMON),
            (PG, {"schema": "rt_schema"}),
            (PG, {"schema": None}),  # the search_path's, as without it
            (PG, {"pool_min_size": 2}),
            (PG, {"pool_max_size": 7}),
            (PG, {"pool_timeout_ms": 3_333}),
            (PG, {"connect_timeout_ms": 4_444}),
            (PG, {"prepare_threshold": None}),
            (PG, {"prepare_threshold": 3}),
            (PG, {"pgbouncer": "transaction"}),
        ],
    ),
    "redis": (
        frozenset(REDIS_OPTIONS) | {"key_prefix"},
        [
            (RD, {"prefix": "rt:"}),
            (RD, {"key_prefix": "rt-alias:"}),
            (RD, {"lock_key_prefix": "rt:wl-app:"}),
            (RD, {"lock_key_prefix": None}),  # the default, as without it
            (RD, {"cluster": True}),
            (RD, {"auto_pipeline": False}),
            (RD, {"checkpoint_ttl_ms": None}),
            (RD, {"checkpoint_ttl_ms": 3_456}),
            (RD, {"cache_ttl_ms": 4_567}),
            (RD, {"claim_lease_ms": 5_678}),
            (RD, {"workflow_lock_ttl_ms": 7_890}),
            (RD, {"workflow_lock_timeout_ms": 6_789}),
            (RD, {"command_timeout_ms": 4_321}),
            (RD, {"command_timeout_ms": None}),
            (RD, {"idempotency_ttl_ms": 12_345}),
            (RD, {"idempotency_lease_ms": 2_345}),
            (RD, {"incremental_min_bytes": 1_024}),
            (RD, {"record_context_changes": False}),
            (RD, {"strict_atomicity": True}),
            (RD, {"wait_replicas": 1}),
            (RD, {"wait_replicas": 1, "wait_timeout_ms": 500}),
            ("redis+sentinel://127.0.0.1:26379/mymaster", {"sentinel_password": "pw"}),
            ("redis+sentinel://127.0.0.1:26379/mymaster", {"sentinel_username": "u"}),
            (f"{RD}?cluster=true", {"reinitialize_steps": 5}),
        ],
    ),
}
"""Per backend: every option its ``connect`` takes, and samples of them (on the base URL
they apply to) that must come back from ``backend.url``."""
MEANS_THE_DEFAULT = [{"table_prefix": None}, {"schema": None}, {"lock_key_prefix": None}]

_OURS = ("siglo", "siglo_sql", "siglo_sqlite", "siglo_postgres", "siglo_redis", "redis", "abc")
"""Modules whose objects a configuration is read from (``abc``: siglo's Redis client
classes are made at run time)."""
_PLAIN = (int, str, bool, float, type(None))


def configuration(backend: siglo.Backend) -> dict[str, Any]:
    """Every plain value held by the backend's parts and what they hold (their clients,
    databases, pools, statements, bound settings), by path, with each object's class:
    what two backends built alike have equal. Nothing is sent anywhere."""
    found: dict[str, Any] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen or depth > 9:
            return
        seen.add(id(obj))
        if hasattr(obj, "__self__") and hasattr(obj, "__func__"):  # a bound method
            walk(obj.__self__, f"{path}.__self__", depth + 1)
            return
        items: Any
        if isinstance(obj, dict):
            items = obj.items()
        elif isinstance(obj, list | tuple):
            items = enumerate(obj)
        elif type(obj).__module__.split(".")[0] in _OURS:
            found[f"{path}.__class__"] = type(obj).__qualname__
            attrs = dict(getattr(obj, "__dict__", {}))
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if name not in attrs and hasattr(obj, name):
                        attrs[name] = getattr(obj, name)
            items = attrs.items()
        else:
            return
        for name, value in items:
            if isinstance(value, _PLAIN):
                found[f"{path}.{name}"] = value
            else:
                walk(value, f"{path}.{name}", depth + 1)

    for part in ("adapter", "idempotency", "lock", "nonces"):
        walk(getattr(backend, part), part, 0)
    return found


CASES = [
    pytest.param(kind, base, sample, id=f"{kind}-{'-'.join(f'{k}={v}' for k, v in sample.items())}")
    for kind, (_, samples) in SAMPLES.items()
    for base, sample in samples
]


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_every_option_of_each_backend_has_a_sample(kind: str) -> None:
    options, samples = SAMPLES[kind]
    sampled = {name for _, sample in samples for name in sample}
    assert sampled == set(options) - set(OBJECT_OPTIONS), (
        "an option of the backend's connect has no sample here (or a sample names an "
        "option the backend no longer takes): add one, and make it ride in backend.url"
    )


@pytest.mark.parametrize(("kind", "base", "sample"), CASES)
async def test_each_keyword_option_rides_in_backend_url(
    kind: str, base: str, sample: dict[str, Any]
) -> None:
    """Given as a keyword, the option changes the backend; ``siglo.connect(backend.url)``
    builds one equal to it."""
    default = siglo.connect(base)
    given = siglo.connect(base, **sample)
    again = siglo.connect(given.url)
    try:
        if sample not in MEANS_THE_DEFAULT:
            assert configuration(given) != configuration(default), (
                f"{sample} changed nothing this test sees: pick another sample value"
            )
        mine, theirs = configuration(given), configuration(again)
        differ = {k: (mine.get(k), theirs.get(k)) for k in mine.keys() | theirs.keys()}
        differ = {k: pair for k, pair in differ.items() if pair[0] != pair[1]}
        assert not differ, f"{sample}: siglo.connect({given.url!r}) differs: {differ}"
    finally:
        await asyncio.gather(default.aclose(), given.aclose(), again.aclose())


async def test_redis_lock_key_prefix_rides_in_the_url_and_is_checked() -> None:
    prefix = "rt:"
    url = urls.with_options(RD, {"prefix": prefix, "lock_key_prefix": "rt:wl-app:"})
    backend = siglo.connect(url)
    try:
        assert "lock_key_prefix=rt%3Awl-app%3A" in backend.url
        assert backend.adapter.workflow_lock.key_prefix == "rt:wl-app:"  # type: ignore[attr-defined]
    finally:
        await backend.aclose()
    refused = {
        "": "lock_key_prefix must be a non-empty string",
        "rt:{wl": "lock_key_prefix 'rt:{wl' has a brace",
        "rt:lock:": "lock_key_prefix 'rt:lock:' is the public RedisLock's prefix",
    }
    for value, message in refused.items():
        with pytest.raises(InvalidArgumentError, match=message):
            siglo.connect(urls.with_options(RD, {"prefix": prefix, "lock_key_prefix": value}))
        with pytest.raises(InvalidArgumentError, match=message):
            siglo.connect(urls.with_options(RD, {"prefix": prefix}), lock_key_prefix=value)


async def test_a_worker_connected_with_backend_url_shares_the_workflow_lock() -> None:
    """The audit's double run: the application connects with ``lock_key_prefix``, a
    worker with ``backend.url``; their actions on one stack never overlap."""
    require_redis()
    prefix = f"siglo-test-{uuid.uuid4().hex[:16]}:"
    app = siglo.connect(
        urls.with_options(REDIS_URL, {"prefix": prefix}), lock_key_prefix=f"{prefix}wl-app:"
    )
    worker = siglo.connect(app.url)
    inside: list[str] = []
    overlapped = False

    async def act(who: str) -> None:
        nonlocal overlapped
        overlapped = overlapped or bool(inside)
        inside.append(who)
        await asyncio.sleep(0.3)
        inside.remove(who)

    try:
        await asyncio.gather(
            app.adapter.with_workflow_lock("order-1", lambda: act("app")),
            worker.adapter.with_workflow_lock("order-1", lambda: act("worker")),
        )
        assert not overlapped, "two processes ran one stack's action at once"
    finally:
        try:
            await delete_prefix(app.adapter.client, prefix)  # type: ignore[attr-defined]
        finally:
            await asyncio.gather(app.aclose(), worker.aclose())


async def test_the_redis_key_prefix_by_either_name_is_the_one_backend_url_says() -> None:
    """``prefix`` and ``key_prefix`` are one option: given both, the keys took one and
    ``backend.url`` said the other; a settings file's ``prefix`` beat a keyword
    ``key_prefix`` — and a worker on ``backend.url`` missed the application's keys (a
    black-box auditor). Both given differently are refused; a keyword wins by any name."""
    from siglo.config import Settings

    with pytest.raises(InvalidArgumentError, match="prefix and key_prefix name one option"):
        siglo.connect(RD, prefix="rt:a:", key_prefix="rt:b:")
    same = siglo.connect(RD, prefix="rt:a:", key_prefix="rt:a:")
    try:
        assert "prefix=rt%3Aa%3A" in same.url
    finally:
        await same.aclose()
    filed = Settings(options={"prefix": "rt:file:"})
    backend = siglo.connect(RD, settings=filed, key_prefix="rt:code:")
    try:
        assert backend.adapter.keys.prefix == "rt:code:"  # type: ignore[attr-defined]
        assert "prefix=rt%3Acode%3A" in backend.url and "rt%3Afile" not in backend.url
        again = siglo.connect(backend.url)
        try:
            assert again.adapter.keys.prefix == "rt:code:"  # type: ignore[attr-defined]
        finally:
            await again.aclose()
    finally:
        await backend.aclose()


@pytest.mark.parametrize("how", ["keyword", "url"])
async def test_an_idempotency_ttl_of_none_is_the_default_on_sql_as_on_redis(
    tmp_path: Any, how: str
) -> None:
    """``idempotency_ttl_ms=None`` (``none`` in a URL or a settings file) was refused on
    SQLite and PostgreSQL with "default_ttl_ms is required", naming no option the user
    gave (a black-box auditor); Redis takes it as the default. So do the SQL backends."""
    from siglo.settings import DEFAULTS

    url = f"sqlite:///{tmp_path / 'i.db'}"
    options: dict[str, Any] = {"idempotency_ttl_ms": None, "idempotency_lease_ms": None}
    if how == "url":
        url, options = urls.with_options(url, {"idempotency_ttl_ms": "none"}), {}
    backend = siglo.connect(url, **options)
    try:
        store = backend.idempotency
        assert store.default_ttl_ms == DEFAULTS.idempotency_ttl_ms  # type: ignore[attr-defined]
        assert store.default_lease_ms == DEFAULTS.idempotency_lease_ms  # type: ignore[attr-defined]
    finally:
        await backend.aclose()
