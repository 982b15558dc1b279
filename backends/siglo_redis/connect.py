"""``redis://``, ``rediss://``, ``unix://`` and ``redis+sentinel://`` URLs: one client,
four Redis classes.

siglo's own options can ride in the URL's query string, so that
``siglo.connect(backend.url)`` in another process reaches the same keys:

``prefix``
    replaces the leading ``siglo:`` of every key (tests isolate with it);
``lock_key_prefix``
    where ``with_workflow_lock`` takes its locks (default ``<prefix>workflow-lock:``):
    every process running one stack's actions must take them under the same prefix;
``cluster``
    ``true`` to connect a :class:`redis.asyncio.RedisCluster` (seed nodes from the URL);
``auto_pipeline``
    ``false`` to send each command on its own pooled connection instead of writing
    concurrent commands together (:mod:`siglo_redis.pipelining`; default ``true``);
``checkpoint_ttl_ms``, ``cache_ttl_ms``, ``claim_lease_ms``, ``workflow_lock_ttl_ms``,
``workflow_lock_timeout_ms``, ``command_timeout_ms``, ``idempotency_ttl_ms``,
``idempotency_lease_ms``
    integers (``none`` for no checkpoint retention / no command timeout);
``incremental_min_bytes``
    save a checkpoint document at least this many bytes long incrementally (its
    contexts in a parts hash beside the key, only the changed ones written); ``none``
    (the default) keeps every document whole, the layout TypeScript reads;
``record_context_changes``, ``strict_atomicity``
    ``true`` / ``false`` (as keywords: a ``bool``, or that text; anything else, ``None``
    included, is refused by name);
``wait_replicas``, ``wait_timeout_ms``
    confirm every write on that many replicas (``WAIT``, 0 to 2**31-1) within the
    timeout (default 1000 ms) before answering, or fail (:mod:`siglo_redis.replication`;
    turns auto-pipelining off);
``sentinel_password``, ``sentinel_username``
    credentials of the Sentinels of a ``redis+sentinel://`` URL (the URL's own user and
    password are the master's).

``redis+sentinel://[user:password@]host:port,host:port/service_name[/db]`` (also
``rediss+sentinel://`` for TLS to the master) asks the Sentinels which server is the
master of ``service_name`` before each new connection, so a failover needs no restart.

The database is the path's number or the query's ``db``; a URL whose two name different
databases is refused.

Any other query parameter must be one of redis-py's (``socket_timeout``, ``db``,
``client_name`` …) and goes to it; a name that is neither siglo's nor redis-py's is refused
at once with :class:`~siglo.errors.InvalidArgumentError` naming it. Keyword options given
to :func:`connect` win over the URL's.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from siglo import urls
from siglo.backend import Backend
from siglo.errors import InvalidArgumentError, StorageAdapterError
from siglo.settings import DEFAULTS
from siglo.validation import ms_as_seconds
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.client import (
    CLIENT_OPTIONS,
    OPTIONS,
    check_option_values,
    client_from_url,
    close_client,
    refuse_unknown_options,
    split_url,
)
from siglo_redis.coordination import RedisIdempotencyStore, RedisLock, RedisNonceStore
from siglo_redis.deadlines import Deadlines
from siglo_redis.keys import DEFAULT_PREFIX, KeySpace, check_prefix

__all__ = ["client_from_url", "close_client", "connect", "isolated"]


def connect(
    url: str = "redis://127.0.0.1:6379/0", *, client: Any = None, **options: Any
) -> Backend:
    """A Redis :class:`~siglo.Backend`: the adapter and the three coordination classes.

    ``client`` (optional) is a client to use instead of building one from ``url``; it is
    never closed by siglo. Options are those of :class:`RedisStorageAdapter` plus
    ``prefix``, ``cluster``, ``idempotency_ttl_ms``, ``idempotency_lease_ms`` and
    ``strict_atomicity`` (for the
    lock), from keyword arguments or the URL's query string.
    """
    refuse_unknown_options(url)
    _, from_url = split_url(url)
    unknown = set(options) - set(OPTIONS) - {"key_prefix"}
    if unknown:
        raise urls.unknown_option_error("redis", unknown, set(OPTIONS), where="keyword")
    if "key_prefix" in options:
        # One option by two names: given both, which one the keys take and which one
        # backend.url says could differ (a black-box auditor: a worker on backend.url
        # missed the application's keys). Taken by its URL name from here on.
        aliased = options.pop("key_prefix")
        if "prefix" in options and options["prefix"] != aliased:
            raise InvalidArgumentError(
                "prefix and key_prefix name one option (the key prefix), given "
                f"{options['prefix']!r} and {aliased!r}: give one"
            )
        options["prefix"] = aliased
    # A text value reads as in the URL's query ("none", "false"): a settings file's
    # [options] has no null, and bool("false") is True.
    options = urls.typed_keywords(options, OPTIONS)
    settings = {**from_url, **options}
    # Before any client: what is accepted is written into backend.url, and must read back
    # as the same there (a flag taken through bool() did not).
    check_option_values(settings)
    # A keyword wins over the URL's query, the alias key_prefix as much as prefix (which
    # wins over it): the store siglo.urls.same_store takes this connection for.
    chosen = options.get("prefix", from_url.get("prefix", DEFAULT_PREFIX))
    settings.pop("prefix", None)
    prefix = check_prefix("prefix", chosen)
    # In backend.url like every option: a worker connected with backend.url must take
    # the workflow locks where the application does, or both run one stack's action.
    lock_key_prefix = settings.pop("lock_key_prefix", None)
    if lock_key_prefix is not None:
        check_prefix("lock_key_prefix", lock_key_prefix)
    cluster: bool = settings.pop("cluster", False)
    auto_pipeline: bool = settings.pop("auto_pipeline", True)
    client_options = {k: settings.pop(k) for k in CLIENT_OPTIONS & set(settings)}
    strict: bool = settings.pop("strict_atomicity", False)
    idempotency_ttl_ms = settings.pop("idempotency_ttl_ms", None)
    idempotency_lease_ms = settings.pop("idempotency_lease_ms", None)
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
        lock_key_prefix=lock_key_prefix,
        **settings,
    )
    idempotency = RedisIdempotencyStore(
        client,
        key_prefix=keys.idempotency_prefix,
        command_timeout_ms=timeout,
        **({} if idempotency_ttl_ms is None else {"default_ttl_ms": idempotency_ttl_ms}),
        **({} if idempotency_lease_ms is None else {"default_lease_ms": idempotency_lease_ms}),
    )
    lock = RedisLock(client, keys.lock_prefix, strict_atomicity=strict, command_timeout_ms=timeout)
    nonces = RedisNonceStore(client, key_prefix=keys.nonce_prefix, command_timeout_ms=timeout)
    backend = Backend(
        name="redis",
        url=_with_params(url, dict(options)),
        adapter=adapter,
        idempotency=idempotency,
        lock=lock,
        nonces=nonces,
    )
    if owned:
        backend.on_close.append(lambda: close_client(client))
    return backend


def _with_params(url: str, params: dict[str, Any]) -> str:
    """``url`` with siglo's options set in its query, so another process can repeat it.

    A text option given ``None`` (``lock_key_prefix=None``: the default) is left out:
    written, it would read back as the text ``none``."""
    return urls.with_options(
        url,
        {
            k: v
            for k, v in params.items()
            if k in OPTIONS and not (v is None and OPTIONS[k] is urls.text)
        },
    )


async def delete_prefix(
    client: Any, prefix: str, *, command_timeout_ms: int | None = DEFAULTS.command_timeout_ms
) -> int:
    """``SCAN`` for every key under ``prefix`` and ``UNLINK`` it (never ``FLUSHDB``).

    Each Redis call is bounded by ``command_timeout_ms``; the sweep as a whole is not (a
    million keys take a while). On a cluster, redis-py's ``scan_iter`` walks every
    primary and keys are unlinked one by one (a batch's keys live in different slots);
    on a single server each ``SCAN`` page is unlinked in one call.
    """
    import redis.asyncio  # the optional driver (siglo[redis]): imported when used

    bound = None if command_timeout_ms is None else ms_as_seconds(command_timeout_ms)
    bounded = Deadlines(bound).run
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
