"""Building a redis-py client from a ``redis://``, ``rediss://``, ``unix://`` or
``redis+sentinel://`` URL, and reading siglo's options out of its query string.

The options are listed in :mod:`siglo_redis.connect`. The adapter and the coordination
classes build their client here when given a URL, so this module imports neither them
nor :mod:`siglo_redis.connect`. redis-py itself is imported inside
:func:`client_from_url`: the driver is an optional extra (``siglo[redis]``), and
importing this package (its plugin registration) must work without it.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import warnings
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from siglo import urls
from siglo.errors import InvalidArgumentError
from siglo.settings import DEFAULTS

__all__ = [
    "CLIENT_OPTIONS",
    "MAX_WAIT_REPLICAS",
    "MAX_WAIT_TIMEOUT_MS",
    "OPTIONS",
    "SCHEMES",
    "check_option_values",
    "check_wait_replicas",
    "check_wait_timeout_ms",
    "client_for",
    "client_from_url",
    "close_client",
    "refuse_unknown_options",
    "split_url",
]

SCHEMES: Final = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
_DEFAULT_SENTINEL_PORT: Final = 26379
# Bounds each question to a Sentinel: one that does not answer is skipped for the next.
_SENTINEL_TIMEOUT_S: Final = 1.0
_DEFAULT_WAIT_TIMEOUT_MS: Final = 1000
_DEFAULT_SOCKET_TIMEOUT_S: Final = 5.0
_DEFAULT_MAX_CONNECTIONS: Final = 64
MAX_WAIT_TIMEOUT_MS: Final = 2**62
"""The longest ``wait_timeout_ms``: Redis adds it to its clock, and refuses a sum past a
signed 64-bit integer (``2**63`` failed every ``WAIT``)."""
MAX_WAIT_REPLICAS: Final = 2**31 - 1
"""The most replicas ``wait_replicas`` may ask ``WAIT`` for. Redis refuses a
``numreplicas`` past a signed 64-bit integer only when the ``WAIT`` runs, after the write
(``2**63``: every save failed, yet stored); no deployment has anywhere near this many."""


OPTIONS: Final[dict[str, urls.Converter]] = {
    "prefix": urls.text,
    "lock_key_prefix": urls.text,
    "cluster": urls.boolean,
    "auto_pipeline": urls.boolean,
    "checkpoint_ttl_ms": urls.optional_integer,
    "cache_ttl_ms": urls.optional_integer,
    "claim_lease_ms": urls.optional_integer,
    "workflow_lock_ttl_ms": urls.optional_integer,
    "workflow_lock_timeout_ms": urls.optional_integer,
    "command_timeout_ms": urls.optional_integer,
    "idempotency_ttl_ms": urls.optional_integer,
    "idempotency_lease_ms": urls.optional_integer,
    "incremental_min_bytes": urls.optional_integer,
    "record_context_changes": urls.boolean,
    "strict_atomicity": urls.boolean,
    "wait_replicas": urls.integer,
    "wait_timeout_ms": urls.integer,
    "sentinel_password": urls.text,
    "sentinel_username": urls.text,
    "reinitialize_steps": urls.integer,
}
# Options of the client, not of the siglo classes.
CLIENT_OPTIONS: Final = frozenset(
    {
        "wait_replicas",
        "wait_timeout_ms",
        "sentinel_password",
        "sentinel_username",
        "reinitialize_steps",
    }
)


def refuse_unknown_options(url: str) -> None:
    """Refuse a query parameter that is neither siglo's nor redis-py's, naming it.

    redis-py hands an unknown parameter to its connection class, which fails only when
    a connection is made, and the retries then report a timeout (``?prefx=`` took
    10 s to say "timed out"): the name is checked here, before any connection.
    """
    driver = _driver_parameters()
    urls.refuse_unknown(
        url,
        OPTIONS,
        backend="redis",
        driver=driver,
        also="and redis-py's connection parameters (db, socket_timeout, client_name, …)",
    )


@functools.cache
def _driver_parameters() -> frozenset[str] | None:
    """The keyword parameters redis-py's clients and connections take from a URL's query,
    or ``None`` without the driver (connecting then says which extra to install)."""
    try:
        import redis.asyncio
        from redis.asyncio import connection
    except ImportError:
        return None
    names = set(connection.URL_QUERY_ARGUMENT_PARSERS)
    for cls in (
        connection.AbstractConnection,
        connection.Connection,
        connection.SSLConnection,
        connection.UnixDomainSocketConnection,
        connection.BlockingConnectionPool,
        redis.asyncio.RedisCluster,
    ):
        for parameter in inspect.signature(cls.__init__).parameters.values():
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                names.add(parameter.name)
    names.discard("self")
    return frozenset(names)


def check_option_values(options: Mapping[str, Any]) -> None:
    """Refuse a value of one of siglo's options (:data:`OPTIONS`, typed: read from a URL's
    query, or a keyword after :func:`siglo.urls.typed_keywords`) that could not be
    written into ``backend.url`` and read back as the same, naming the option.

    A flag must be a ``bool``: ``bool()`` of anything else took ``[1]``, ``2`` or
    ``nan`` for true and ``None`` or ``0`` for false, and ``backend.url`` then carried
    the raw value, which ``siglo.connect(backend.url)`` refused. ``None`` is not a flag's
    value, as ``none`` is not in the query: leaving the option out gives its default.
    An integer of the client's must be an ``int`` (not a ``bool``), and ``wait_replicas``
    one that ``WAIT`` takes (:func:`check_wait_replicas`).
    """
    for name, value in options.items():
        convert = OPTIONS.get(name)
        if convert is urls.boolean and not isinstance(value, bool):
            raise InvalidArgumentError(
                f"option {name} must be true or false (a bool, or the text a URL's query "
                f"takes: 'true', 'false' …), got {value!r}"
            )
        if convert is urls.integer and type(value) is not int:
            raise InvalidArgumentError(f"option {name} must be an integer, got {value!r}")
    if "wait_replicas" in options:
        check_wait_replicas(options["wait_replicas"])
    if options.get("wait_timeout_ms") is not None:
        check_wait_timeout_ms(options["wait_timeout_ms"])


def check_wait_replicas(value: int) -> int:
    """``value``, a count of replicas for ``WAIT``, if it is one: from 0 (no ``WAIT``) to
    :data:`MAX_WAIT_REPLICAS`. Checked before any connection: Redis refuses a count it
    cannot hold only in the ``WAIT`` that follows each write, which has then run."""
    if not 0 <= value <= MAX_WAIT_REPLICAS:
        raise InvalidArgumentError(
            f"wait_replicas must be a number of replicas from 0 to {MAX_WAIT_REPLICAS}, "
            f"got {value!r}"
        )
    return value


def check_wait_timeout_ms(value: int) -> int:
    """``value``, the ``WAIT``'s timeout, if Redis takes it: from 0 (no timeout) to
    :data:`MAX_WAIT_TIMEOUT_MS`. Redis refuses one it cannot add to its clock only in the
    ``WAIT`` that follows each write, which has then run (every save an unknown outcome,
    stored)."""
    if not 0 <= value <= MAX_WAIT_TIMEOUT_MS:
        raise InvalidArgumentError(
            f"wait_timeout_ms must be from 0 to {MAX_WAIT_TIMEOUT_MS} (2**62), got {value!r}"
        )
    return value


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """The URL without siglo's query parameters, and those parameters (typed)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidArgumentError(
            "not a redis://, rediss://, unix:// or redis+sentinel:// URL: "
            f"{urls.mask_credentials(url)!r}"
        )
    # A Sentinel URL's path is /service_name[/db], checked where it is read.
    db = ""
    if parts.scheme.lower() in SENTINEL_SCHEMES:
        names = [p for p in parts.path.split("/") if p]
        db = names[1] if len(names) > 1 else ""
    elif parts.scheme.lower() != "unix":
        # redis-py reads a path that is not a number as database 0, silently.
        db = parts.path.strip("/")
        if db and not (db.isascii() and db.isdigit()):
            raise InvalidArgumentError(
                f"the path of a redis URL is the database number, got {db!r}: "
                "use redis://host:port/0 (or no path for database 0)"
            )
    given = dict(parse_qsl(parts.query, keep_blank_values=True)).get("db")
    if db and given is not None and not _same_database(db, given):
        # Two databases: redis-py takes the query's and drops the path's silently (a
        # Sentinel URL took the path's), where siglo refuses any other option given
        # twice. The same one both ways (`/0?db=0`) leaves no doubt, and is kept.
        raise InvalidArgumentError(
            f"the database is given twice, {db!r} in the path and {given!r} in the "
            f"query's db, in {urls.mask_credentials(url)!r}: give one"
        )
    return urls.split_options(url, OPTIONS)


def _same_database(path: str, query: str) -> bool:
    """Whether a URL's path and its query's ``db`` name one database, as redis-py reads
    each (a number: ``/03`` is ``db=3``)."""
    if path.isascii() and path.isdigit() and query.isascii() and query.strip().isdigit():
        return int(path) == int(query)
    return path == query


def client_for(client: Any, *, command_timeout_ms: int | None) -> Any:
    """The client a siglo class sends its commands through, given ``client``: for a URL,
    one built here (:func:`client_from_url`); for an application's redis-py ``Redis``,
    one of siglo's over the same connection pool (its connections, their parameters,
    ``decode_responses``), so that a write is sent once (:mod:`siglo_redis.sent_once`:
    with the application's own client, a write whose reply was lost raised a plain
    error though it may have run, or was sent again under a ``Retry``); any other client
    (a ``RedisCluster``, valkey's, a client of another shape) as it is."""
    if isinstance(client, str):
        return client_from_url(client, command_timeout_ms=command_timeout_ms)
    if getattr(client, "sends_writes_once", False):
        return client
    # Only a redis-py client can be one (its module is loaded if so): the driver stays
    # optional for a client of another kind.
    driver = sys.modules.get("redis.asyncio")
    if driver is None or not isinstance(client, driver.Redis):
        return client
    from redis.asyncio.client import Pipeline

    from siglo_redis.sent_once import SentOnceRedis

    if isinstance(client, Pipeline):
        return client
    return SentOnceRedis(connection_pool=client.connection_pool)


def client_from_url(
    url: str,
    *,
    cluster: bool | None = None,
    command_timeout_ms: int | None = DEFAULTS.command_timeout_ms,
    auto_pipeline: bool | None = None,
    **kwargs: Any,
) -> Any:
    """A ``redis.asyncio`` client for ``url`` (see :func:`_client_from_url`); a driver
    parameter whose value redis-py cannot convert (``?socket_timeout=abc``) is an
    :class:`~siglo.errors.InvalidArgumentError` naming the URL, not a ``ValueError``."""
    try:
        return _client_from_url(
            url,
            cluster=cluster,
            command_timeout_ms=command_timeout_ms,
            auto_pipeline=auto_pipeline,
            **kwargs,
        )
    except (ValueError, TypeError) as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise InvalidArgumentError(
            f"a parameter of {urls.mask_credentials(url)!r} is not valid for redis-py: {exc}"
        ) from None


def _client_from_url(
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
    # The driver is optional (siglo[redis]): it, and the modules built on it, are
    # imported when a client is built, never when the plugin is listed.
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff

    from siglo_redis.pipelining import AutoPipelinedRedis, AutoPipelinedRedisCluster
    from siglo_redis.sent_once import SentOnceRedis, SentOnceRedisCluster

    refuse_unknown_options(url)
    driver_url, ours = split_url(url)
    if cluster is None:
        cluster = bool(ours.get("cluster", False))
    if auto_pipeline is None:
        auto_pipeline = bool(ours.get("auto_pipeline", True))
    # Every client sends a write once: a lost reply is an unknown outcome, never a
    # retry that meets its own write (siglo_redis.sent_once).
    redis_class: Any = AutoPipelinedRedis if auto_pipeline else SentOnceRedis
    wait_replicas = check_wait_replicas(ours.get("wait_replicas") or 0)
    wait_timeout_ms = ours.get("wait_timeout_ms")
    if wait_timeout_ms is not None:
        check_wait_timeout_ms(wait_timeout_ms)
    reinitialize_steps = ours.get("reinitialize_steps")
    if reinitialize_steps is not None and (not cluster or reinitialize_steps < 0):
        raise InvalidArgumentError(
            "reinitialize_steps is an option of cluster=true, a number >= 0 "
            f"(0 recommended), got {reinitialize_steps!r}"
            + ("" if cluster else " without cluster=true")
        )
    if wait_replicas:
        # Imported here: the module subclasses redis-py's client, an optional driver.
        # WAIT must follow the write on its own connection, which a shared auto-pipeline
        # connection cannot promise.
        from siglo_redis.replication import WaitingRedis

        redis_class = WaitingRedis
    # Every cluster client keeps nodes to read the topology from (siglo_redis.cluster_seeds).
    cluster_class: Any = AutoPipelinedRedisCluster if auto_pipeline else SentOnceRedisCluster
    if wait_replicas and cluster:
        # WAIT per shard: each write goes with a WAIT to its own slot's master.
        from siglo_redis.replication import WaitingRedisCluster

        cluster_class = WaitingRedisCluster
    query = dict(parse_qsl(urlsplit(driver_url).query))
    check_driver_numbers({**kwargs, **query}, url)
    if "socket_connect_timeout" not in query:
        kwargs.setdefault("socket_connect_timeout", _DEFAULT_SOCKET_TIMEOUT_S)
    if cluster:
        database = urlsplit(driver_url).path.strip("/") or query.get("db", "0")
        if database not in ("", "0"):
            # redis-py would raise its own RedisClusterException here, unwrapped.
            raise InvalidArgumentError(
                f"a Redis Cluster has only database 0, got database {database!r} with "
                f"cluster=true in {urls.mask_credentials(url)!r}"
            )
        _warn_if_cluster_driver_is_unsafe(redis.__version__)
        # No socket_timeout here: it makes redis-py 7's RedisCluster fail concurrent
        # first commands; command_timeout_ms bounds every call anyway.
        # redis-py re-reads the whole topology after every 5th MOVED by closing the
        # client, which cuts connections other calls have written on: their commands,
        # possibly run, are sent again (a won compare-and-set reported as a conflict, a
        # lock handed out twice while slots move). 0: each MOVED patches the slot table
        # instead; a failed connection still re-reads it all. Read here as a number:
        # redis-py would take the URL's value as a string and fail on every MOVED.
        kwargs.setdefault("reinitialize_steps", reinitialize_steps or 0)
        client = cluster_class.from_url(driver_url, **kwargs)
        if wait_replicas:
            timeout = _DEFAULT_WAIT_TIMEOUT_MS if wait_timeout_ms is None else wait_timeout_ms
            client.require_replicas(wait_replicas, timeout)
        return client
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


def check_driver_numbers(parameters: Mapping[str, Any], url: str) -> None:
    """Refuse a redis-py timeout or pool size that would not bound anything, naming it.

    redis-py takes ``max_connections=0`` for no limit at all (a burst of callers opens a
    socket each, where siglo's default pool makes them queue) and a timeout of 0 or
    below for one that has always passed (every call then fails, each after its
    retries, as a timeout). ``parameters`` are the keywords and the URL's query merged
    as redis-py merges them (the query wins).
    """
    for name in ("socket_timeout", "socket_connect_timeout", "max_connections"):
        value = parameters.get(name)
        if value is None:
            continue
        try:
            number = float(value) if name != "max_connections" else int(value)
        except (TypeError, ValueError):
            continue  # redis-py's own conversion fails, and client_from_url says so
        if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
            what = (
                "a number of connections >= 1"
                if name == "max_connections"
                else ("a number of seconds > 0")
            )
            raise InvalidArgumentError(
                f"{name} must be {what}, got {value!r} in {urls.mask_credentials(url)!r}"
            )


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
    from siglo_redis.master_watch import FailoverAwareSentinel, MasterWatch, watching

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
    sentinel = FailoverAwareSentinel(addresses, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(service, redis_class=watching(redis_class), **options)
    # Connections made before a failover follow it (siglo_redis.master_watch).
    client._master_watch = MasterWatch(client)
    sentinel.probe_pool = client.connection_pool
    return client


async def close_client(client: Any) -> None:
    """Close a client siglo built, and the Sentinel connections behind it if any."""
    try:
        watch = getattr(client, "_master_watch", None)
        if watch is not None:
            await watch.aclose()
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
