"""A release lost to an outage does not strand a lock for its whole lease (issue 11
defect 5).

The cause: ``with_workflow_lock`` released its lease once, in a ``finally``, and ignored a
failure; when PostgreSQL restarted during the action, the release met a connection the
restart had broken, and the lease row stayed held for ``workflow_lock_ttl_ms`` — every
other worker was refused that long. Now a failed release is retried in the background
(siglo.lease_release) until it works, so another worker gets the lock within about a
second of the server being back.

The fault is real: a TCP proxy in front of the shared PostgreSQL that closes every
connection and refuses new ones (what a restart looks like from the client), and — under
SIGLO_TEST_PRIVATE_POSTGRES=1 or CI=true — a private PostgreSQL cluster stopped and
started for real. Redis gets the same proxy test.
"""

from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import urlsplit

import pytest
from _postgres_helpers import private_postgres_server
from _redis_helpers import REDIS_URL, require_redis
from _tcp_proxy import TcpProxy, tcp_proxy
from ports import free_port
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo.lease_release import releases_pending
from siglo_postgres import drop_schema
from siglo_redis.connect import delete_prefix

CHECKPOINT = siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
LEASE_MS = 20_000
"""Far longer than the test waits: a lock freed only by its TTL fails the test."""


async def _outage_during_action(
    holder: siglo.Backend, other: siglo.Backend, down: object, up: object
) -> float:
    """``holder`` runs an action during which the server goes away; once it is back,
    how long ``other`` waits for the same workflow lock."""

    async def action() -> str:
        down()  # type: ignore[operator]
        return "done"

    assert await holder.adapter.with_workflow_lock("s", action) == "done"
    # The release failed and is being retried.
    assert releases_pending(asyncio.get_running_loop()) >= 1
    up()  # type: ignore[operator]
    began = time.monotonic()

    async def ok() -> str:
        return "ran"

    while True:
        try:
            got = await other.adapter.with_workflow_lock("s", ok, timeout_ms=8_000)
            break
        except siglo.StorageAdapterError:
            # A pooled connection the restart broke fails the call that finds it.
            assert time.monotonic() - began < 8
            await asyncio.sleep(0.1)
    assert got == "ran"
    return time.monotonic() - began


async def test_postgres_connections_cut_during_the_action() -> None:
    require_postgres()
    parts = urlsplit(POSTGRES_URL)
    schema = "siglo_test_outage_" + os.urandom(4).hex()
    options = {"schema": schema, "workflow_lock_ttl_ms": LEASE_MS}
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        via_proxy = POSTGRES_URL.replace(parts.netloc, f"{parts.username}@{proxy.url_host}")
        holder = siglo.connect(via_proxy, connect_timeout_ms=1000, **options)
        other = siglo.connect(POSTGRES_URL, **options)
        try:
            await holder.adapter.save_checkpoint(
                siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
            )
            waited = await _outage_during_action(holder, other, proxy.cut, proxy.restore)
            assert waited < 5, f"the lock stayed held {waited:.1f} s after the outage"
        finally:
            await holder.aclose()
            await other.aclose()
            await drop_schema(POSTGRES_URL, schema)


async def test_postgres_real_restart_during_the_action() -> None:
    with private_postgres_server(free_port(30160, 30170)) as server:
        options = {"workflow_lock_ttl_ms": LEASE_MS, "connect_timeout_ms": 1000}
        holder = siglo.connect(server.url, **options)
        other = siglo.connect(server.url, **options)
        try:
            await holder.adapter.save_checkpoint(
                siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
            )
            await other.adapter.get_checkpoint("s")  # both pools hold connections

            def up() -> None:
                server.start()

            waited = await _outage_during_action(holder, other, server.stop, up)
            assert waited < 5, f"the lock stayed held {waited:.1f} s after the restart"
        finally:
            await holder.aclose()
            await other.aclose()


async def test_redis_connections_cut_during_the_action() -> None:
    require_redis()
    parts = urlsplit(REDIS_URL)
    prefix = f"siglo-test-outage-{os.urandom(4).hex()}:"
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    options = {"prefix": prefix, "workflow_lock_ttl_ms": LEASE_MS, "command_timeout_ms": 1000}
    holder = siglo.connect(f"redis://{proxy.url_host}{parts.path or '/0'}", **options)
    other = siglo.connect(REDIS_URL, **options)
    try:
        await holder.adapter.save_checkpoint(
            siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
        )
        waited = await _outage_during_action(holder, other, proxy.cut, proxy.restore)
        assert waited < 5, f"the lock stayed held {waited:.1f} s after the outage"
    finally:
        proxy.close()
        await holder.aclose()
        await delete_prefix(other.adapter.client, prefix)  # type: ignore[attr-defined]
        await other.aclose()


@pytest.fixture(autouse=True)
async def _no_retries_left_behind() -> object:
    yield None
    for _ in range(100):
        if releases_pending(asyncio.get_running_loop()) == 0:
            break
        await asyncio.sleep(0.05)
