"""``redis://``, ``rediss://``, ``unix://`` and ``redis+sentinel://`` URLs: one client,
four Redis classes.

siglo's own options can ride in the URL's query string, so that
``siglo.connect(backend.url)`` in another process reaches the same keys:

``prefix``
    replaces the leading ``siglo:`` of every key (tests isolate with it);
``cluster``
    ``true`` to connect a :class:`redis.asyncio.RedisCluster` (seed nodes from the URL);
``auto_pipeline``
    ``false`` to send each command on its own pooled connection instead of writing
    concurrent commands together (:mod:`siglo_redis.pipelining`; default ``true``);
``checkpoint_ttl_ms``, ``cache_ttl_ms``, ``claim_lease_ms``, ``workflow_lock_ttl_ms``,
``workflow_lock_timeout_ms``, ``command_timeout_ms``, ``idempotency_ttl_ms``
    integers (``none`` for no checkpoint retention / no command timeout);
``record_context_changes``, ``strict_atomicity``
    ``true`` / ``false``;
``wait_replicas``, ``wait_timeout_ms``
    confirm every write on that many replicas (``WAIT``) within the timeout (default
    1000 ms) before answering, or fail (:mod:`siglo_redis.replication`; turns
    auto-pipelining off);
``sentinel_password``, ``sentinel_username``
    credentials of the Sentinels of a ``redis+sentinel://`` URL (the URL's own user and
    password are the master's).

``redis+sentinel://[user:password@]host:port,host:port/service_name[/db]`` (also
``rediss+sentinel://`` for TLS to the master) asks the Sentinels which server is the
master of ``service_name`` before each new connection, so a failover needs no restart.

Any other query parameter goes to redis-py (``socket_timeout``, ``db`` …). Keyword
options given to :func:`connect` win over the URL's.
"""

from __future__ import annotations

import contextlib
import uuid
import warnings
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from siglo import urls
from siglo.backend import Backend
from siglo.errors import InvalidArgumentError, StorageAdapterError
from siglo.settings import DEFAULTS
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.coordination import RedisIdempotencyStore, RedisLock, RedisNonceStore
from siglo_redis.deadlines import Deadlines
from siglo_redis.keys import DEFAULT_PREFIX, KeySpace, check_prefix

__all__ = ["client_from_url", "close_client", "connect", "isolated"]

SCHEMES: Final = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
_DEFAULT_SENTINEL_PORT: Final = 26379
# Bounds each question to a Sentinel: one that does not answer is skipped for the next.
_SENTINEL_TIMEOUT_S: Final = 1.0
_DEFAULT_WAIT_TIMEOUT_MS: Final = 1000
_DEFAULT_SOCKET_TIMEOUT_S: Final = 5.0
_DEFAULT_MAX_CONNECTIONS: Final = 64


_OPTIONS: Final[dict[str, urls.Converter]] = {
    "prefix": urls.text,
    "cluster": urls.boolean,
    "auto_pipeline": urls.boolean,
    "checkpoint_ttl_ms": urls.optional_integer,
    "cache_ttl_ms": urls.optional_integer,
    "claim_lease_ms": urls.optional_integer,
    "workflow_lock_ttl_ms": urls.optional_integer,
    "workflow_lock_timeout_ms": urls.optional_integer,
    "command_timeout_ms": urls.optional_integer,
    "idempotency_ttl_ms": urls.optional_integer,
    "record_context_changes": urls.boolean,
    "strict_atomicity": urls.boolean,
    "wait_replicas": urls.integer,
    "wait_timeout_ms": urls.integer,
    "sentinel_password": urls.text,
    "sentinel_username": urls.text,
}
# Options of the client, not of the siglo classes.
_CLIENT_OPTIONS: Final = frozenset(
    {"wait_replicas", "wait_timeout_ms", "sentinel_password", "sentinel_username"}
)


def _split(url: str) -> tuple[str, dict[str, Any]]:
    """The URL without siglo's query parameters, and those parameters (typed)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidArgumentError(
            "not a redis://, rediss://, unix:// or redis+sentinel:// URL: "
            f"{urls.mask_credentials(url)!r}"
        )
    # A Sentinel URL's path is /service_name[/db], checked where it is read.
    if parts.scheme.lower() not in ("unix", *SENTINEL_SCHEMES):
        # redis-py reads a path that is not a number as database 0, silently.
        db = parts.path.strip("/")
        if db and not (db.isascii() and db.isdigit()):
            raise InvalidArgumentError(
                f"the path of a redis URL is the database number, got {db!r}: "
                "use redis://host:port/0 (or no path for database 0)"
            )
    return urls.split_options(url, _OPTIONS)


def client_from_url(
    url: str,
    *,
    cluster: bool | None = None,
    command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    auto_pipeline: bool | None = None,
    **kwargs: Any,
) -> Any:
    """A ``redis.asyncio`` client for ``url`` with bounded timeouts and retries.

    Unless ``auto_pipeline`` is false, concurrent single commands on the client share
    socket writes and reads (:mod:`siglo_redis.pipelining`). siglo's query parameters
    are ignored here except those of the client (``cluster``, ``auto_pipeline``,
    ``wait_replicas``, ``wait_timeout_ms``, ``sentinel_*``). ``command_timeout_ms``
    is the bound the siglo classes using the client put on every call: when there is
    none, the client gets a 5 s ``socket_timeout`` so that no read waits forever (redis-py
    arms a timer for every read and starts a task for every write under a socket
    timeout, ~9 µs a call, so it is not set twice).
    """
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff

    from siglo_redis.pipelining import AutoPipelinedRedis, AutoPipelinedRedisCluster

    driver_url, ours = _split(url)
    if cluster is None:
        cluster = bool(ours.get("cluster", False))
    if auto_pipeline is None:
        auto_pipeline = bool(ours.get("auto_pipeline", True))
    redis_class: Any = AutoPipelinedRedis if auto_pipeline else redis.asyncio.Redis
    wait_replicas = ours.get("wait_replicas") or 0
    wait_timeout_ms = ours.get("wait_timeout_ms")
    if wait_replicas < 0 or (wait_timeout_ms is not None and wait_timeout_ms < 0):
        raise InvalidArgumentError(
            f"wait_replicas and wait_timeout_ms must be >= 0, got {wait_replicas!r} "
            f"and {wait_timeout_ms!r}"
        )
    if wait_replicas and cluster:
        raise InvalidArgumentError("wait_replicas is not supported with cluster=true")
    if wait_replicas:
        # Imported here: the module subclasses redis-py's client, an optional driver.
        # WAIT must follow the write on its own connection, which a shared auto-pipeline
        # connection cannot promise.
        from siglo_redis.replication import WaitingRedis

        redis_class = WaitingRedis
    cluster_class: Any = AutoPipelinedRedisCluster if auto_pipeline else redis.asyncio.RedisCluster
    query = dict(parse_qsl(urlsplit(driver_url).query))
    if "socket_connect_timeout" not in query:
        kwargs.setdefault("socket_connect_timeout", _DEFAULT_SOCKET_TIMEOUT_S)
    if cluster:
        _warn_if_cluster_driver_is_unsafe(redis.__version__)
        # No socket_timeout here: it makes redis-py 7's RedisCluster fail concurrent
        # first commands; command_timeout_ms bounds every call anyway.
        return cluster_class.from_url(driver_url, **kwargs)
    if "socket_timeout" not in query and command_timeout_ms is None:
        kwargs.setdefault("socket_timeout", _DEFAULT_SOCKET_TIMEOUT_S)
    # A few quick retries ride out a blip; a dead server fails in well under a second.
    kwargs.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 3))
    if urlsplit(driver_url).scheme.lower() in SENTINEL_SCHEMES:
        client = _sentinel_master(driver_url, ours, redis_class, kwargs)
    elif "max_connections" in query or "max_connections" in kwargs:
        client = redis_class.from_url(driver_url, **kwargs)
    else:
        # A bounded pool that makes callers queue: a burst of thousands of concurrent
        # calls reuses a few dozen sockets instead of opening one each
        # (command_timeout_ms still bounds the wait).
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            driver_url, max_connections=_DEFAULT_MAX_CONNECTIONS, timeout=None, **kwargs
        )
        client = redis_class.from_pool(pool)
    if wait_replicas:
        timeout = _DEFAULT_WAIT_TIMEOUT_MS if wait_timeout_ms is None else wait_timeout_ms
        client.require_replicas(wait_replicas, timeout)
    return client


def _sentinel_address(item: str, url: str) -> tuple[str, int]:
    """``host[:port]`` or ``[ipv6][:port]`` of one Sentinel."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = item.partition(":")
    if not host:
        raise InvalidArgumentError(f"empty Sentinel host in {urls.mask_credentials(url)!r}")
    try:
        return host, int(port) if port else _DEFAULT_SENTINEL_PORT
    except ValueError:
        shown = urls.mask_credentials(url)
        raise InvalidArgumentError(f"bad Sentinel port {port!r} in {shown!r}") from None


def _sentinel_master(
    url: str, ours: dict[str, Any], redis_class: type[Any], kwargs: dict[str, Any]
) -> Any:
    """The master of ``service_name`` as the Sentinels of ``url`` name it."""
    from urllib.parse import unquote

    from redis.asyncio.sentinel import Sentinel

    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    addresses = [_sentinel_address(h, url) for h in hosts.split(",") if h]
    path = [p for p in parts.path.split("/") if p]
    if not addresses or not path or len(path) > 2:
        raise InvalidArgumentError(
            "a Sentinel URL is redis+sentinel://host:port[,host:port…]/service_name[/db], "
            f"got {urls.mask_credentials(url)!r}"
        )
    service = unquote(path[0])
    options: dict[str, Any] = dict(parse_qsl(parts.query))
    options.update(kwargs)
    try:
        options["db"] = int(path[1] if len(path) > 1 else options.get("db", 0))
    except ValueError:
        shown = urls.mask_credentials(url)
        raise InvalidArgumentError(f"the database of {shown!r} must be a number") from None
    if userinfo:
        user, colon, password = userinfo.partition(":")
        if user:
            options["username"] = unquote(user)
        if colon:
            options["password"] = unquote(password)
    if parts.scheme.lower() == "rediss+sentinel":
        options["ssl"] = True
    sentinel_kwargs: dict[str, Any] = {
        "socket_connect_timeout": _SENTINEL_TIMEOUT_S,
        "socket_timeout": _SENTINEL_TIMEOUT_S,
    }
    for name in ("sentinel_username", "sentinel_password"):
        if ours.get(name):
            sentinel_kwargs[name.removeprefix("sentinel_")] = ours[name]
    for name in ("socket_timeout", "socket_connect_timeout", "health_check_interval"):
        if isinstance(options.get(name), str):
            options[name] = float(options[name])
    sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    return sentinel.master_for(service, redis_class=redis_class, **options)


async def close_client(client: Any) -> None:
    """Close a client siglo built, and the Sentinel connections behind it if any."""
    try:
        await client.aclose()
    finally:
        manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


def _warn_if_cluster_driver_is_unsafe(version: str) -> None:
    major = version.split(".", 1)[0]
    if major.isdigit() and int(major) >= 7:
        warnings.warn(
            f"redis-py {version}'s RedisCluster can hand one pooled connection to two "
            "callers under concurrency (replies read by the wrong caller); siglo's "
            "tests pass with redis-py 6.4. Install 'siglo[redis]' to get a safe version.",
            RuntimeWarning,
            stacklevel=3,
        )


def connect(
    url: str = "redis://127.0.0.1:6379/0", *, client: Any = None, **options: Any
) -> Backend:
    """A Redis :class:`~siglo.Backend`: the adapter and the three coordination classes.

    ``client`` (optional) is a client to use instead of building one from ``url``; it is
    never closed by siglo. Options are those of :class:`RedisStorageAdapter` plus
    ``prefix``, ``cluster``, ``idempotency_ttl_ms`` and ``strict_atomicity`` (for the
    lock), from keyword arguments or the URL's query string.
    """
    _, from_url = _split(url)
    unknown = set(options) - set(_OPTIONS) - {"key_prefix"}
    adapter_only = {"lock_key_prefix"}
    unknown -= adapter_only
    if unknown:
        raise InvalidArgumentError(
            f"unknown redis option(s): {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(set(_OPTIONS) | adapter_only))}"
        )
    settings = {**from_url, **{k: v for k, v in options.items() if k not in adapter_only}}
    prefix = check_prefix(
        "prefix", settings.pop("prefix", settings.pop("key_prefix", DEFAULT_PREFIX))
    )
    cluster = bool(settings.pop("cluster", False))
    auto_pipeline = bool(settings.pop("auto_pipeline", True))
    client_options = {k: settings.pop(k) for k in _CLIENT_OPTIONS & set(settings)}
    strict = bool(settings.pop("strict_atomicity", False))
    idempotency_ttl_ms = settings.pop("idempotency_ttl_ms", None)
    timeout = settings.get("command_timeout_ms", DEFAULTS.command_timeout_ms)
    owned = client is None
    if client is None:
        client = client_from_url(
            _with_params(url, client_options),
            cluster=cluster,
            command_timeout_ms=timeout,
            auto_pipeline=auto_pipeline,
        )
    keys = KeySpace(prefix)
    # A client that has not connected yet holds no sockets: if an option is rejected
    # below, dropping it is enough.
    adapter = RedisStorageAdapter(
        client,
        key_prefix=prefix,
        lock_key_prefix=options.get("lock_key_prefix"),
        **settings,
    )
    idempotency = RedisIdempotencyStore(
        client,
        key_prefix=keys.idempotency_prefix,
        command_timeout_ms=timeout,
        **({} if idempotency_ttl_ms is None else {"default_ttl_ms": idempotency_ttl_ms}),
    )
    lock = RedisLock(client, keys.lock_prefix, strict_atomicity=strict, command_timeout_ms=timeout)
    nonces = RedisNonceStore(client, key_prefix=keys.nonce_prefix, command_timeout_ms=timeout)
    backend = Backend(
        name="redis",
        url=_with_params(
            url, {("prefix" if k == "key_prefix" else k): v for k, v in options.items()}
        ),
        adapter=adapter,
        idempotency=idempotency,
        lock=lock,
        nonces=nonces,
    )
    if owned:
        backend.on_close.append(lambda: close_client(client))
    return backend


def _with_params(url: str, params: dict[str, Any]) -> str:
    """``url`` with siglo's options set in its query, so another process can repeat it."""
    return urls.with_options(url, {k: v for k, v in params.items() if k in _OPTIONS})


async def delete_prefix(
    client: Any, prefix: str, *, command_timeout_ms: int | None = DEFAULTS.command_timeout_ms
) -> int:
    """``SCAN`` for every key under ``prefix`` and ``UNLINK`` it (never ``FLUSHDB``).

    Each Redis call is bounded by ``command_timeout_ms``; the sweep as a whole is not (a
    million keys take a while). On a cluster, redis-py's ``scan_iter`` walks every
    primary and keys are unlinked one by one (a batch's keys live in different slots);
    on a single server each ``SCAN`` page is unlinked in one call.
    """
    import redis.asyncio

    bounded = Deadlines(None if command_timeout_ms is None else command_timeout_ms / 1000).run
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
    removed = 0
    try:
        if isinstance(client, redis.asyncio.RedisCluster):
            keys = client.scan_iter(match=pattern, count=1000)
            while True:
                try:
                    key = await bounded(anext(keys))
                except StopAsyncIteration:
                    return removed
                removed += int(await bounded(client.unlink(key)))
        cursor = 0
        while True:
            cursor, page = await bounded(client.scan(cursor, match=pattern, count=1000))
            if page:
                removed += int(await bounded(client.unlink(*page)))
            if int(cursor) == 0:
                return removed
    except (redis.RedisError, OSError, TimeoutError) as exc:
        raise StorageAdapterError(
            f"redis: removing the keys under {prefix!r} failed after {removed}: {exc!r}"
        ) from exc


@contextlib.asynccontextmanager
async def isolated(url: str = "redis://127.0.0.1:6379/0", **options: Any) -> AsyncIterator[Backend]:
    """A backend under a fresh random prefix; every key under it is deleted afterwards.

    ``backend.url`` carries the prefix, so ``siglo.connect(backend.url)`` in another
    process shares the same keys.
    """
    options.pop("prefix", None)
    options.pop("key_prefix", None)
    prefix = f"siglo-test-{uuid.uuid4().hex[:16]}:"
    backend = connect(_with_params(url, {"prefix": prefix}), **options)
    try:
        yield backend
    finally:
        adapter = backend.adapter
        assert isinstance(adapter, RedisStorageAdapter)
        try:
            await delete_prefix(adapter.client, prefix)
        finally:
            await backend.aclose()
