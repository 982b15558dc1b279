"""Connection failures against a Redis of our own: killed, paused, script cache flushed.

Every driver failure surfaces as ``StorageAdapterError`` with the driver's exception as
``__cause__``, the storage manager applies its error mode to it, and a server that stops
answering makes calls fail after ``command_timeout_ms`` instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
from _redis_helpers import RedisServer
from ports import free_port

import siglo
from siglo import Checkpoint, OutcomeUnknownError, StorageAdapterError, StorageWarning

rule = pytest.mark.rule


@pytest.fixture
def server() -> Iterator[RedisServer]:
    own = RedisServer(free_port(30000, 30100)).start()
    try:
        yield own
    finally:
        own.stop()


async def every_call_fails(backend: siglo.Backend) -> None:
    a, lock, idem, nonces = backend.adapter, backend.lock, backend.idempotency, backend.nonces
    assert lock is not None and idem is not None and nonces is not None
    calls = [
        a.save_checkpoint(Checkpoint(stack_id="s", revision=9, timestamp=1)),
        a.get_checkpoint("s"),
        a.get_wait_record("k"),
        a.claim_wait_record("k", "c"),
        a.get_cached_step("k"),
        a.set_cached_step("k", 1),
        a.with_workflow_lock("s", lambda: asyncio.sleep(0), timeout_ms=100),
        lock.acquire("L"),
        idem.claim("i"),
        nonces.claim("n", 1),
    ]
    for call in calls:
        with pytest.raises(StorageAdapterError) as err:
            await call
        assert err.value.__cause__ is not None


@rule("manager.error-mode")
async def test_killed_server_raises_storage_adapter_error(server: RedisServer) -> None:
    async with siglo.connect(server.url) as backend:
        await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        server.kill()
        started = time.monotonic()
        await every_call_fails(backend)
        assert time.monotonic() - started < 15


@rule("manager.error-mode")
async def test_manager_error_modes_with_a_dead_server(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with siglo.connect(server.url) as backend:
        server.kill()
        best = siglo.StorageManager(backend, error_mode="best-effort")
        best.create_stack("s")
        await best.save_checkpoint("s")  # swallowed
        assert await best.load_checkpoint("s") is None

        warn = siglo.StorageManager(backend, error_mode="warn")
        warn.create_stack("s")
        with caplog.at_level(logging.WARNING, logger="siglo"), pytest.warns(StorageWarning):
            await warn.save_checkpoint("s")
        assert any("failed" in r.message for r in caplog.records)

        strict = siglo.StorageManager(backend, error_mode="strict")
        stack = strict.create_stack("s")
        with pytest.raises(StorageAdapterError) as err:
            await strict.save_checkpoint("s")
        assert err.value.__cause__ is not None
        # A background context-change stream fails too, raised by flush() in strict mode.
        stack.set("step", "field", 1)
        with pytest.raises(StorageAdapterError) as err:
            await strict.flush()
        assert err.value.__cause__ is not None
        strict.checkpoint("s")
        with pytest.raises(StorageAdapterError):
            await strict.flush()


@rule("manager.error-mode")
async def test_an_unknown_outcome_is_raised_in_every_error_mode(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A save whose reply did not come within command_timeout_ms may be stored: the
    manager never reports it as done, whatever its error mode (SPEC §4)."""
    async with siglo.connect(server.url, command_timeout_ms=300) as backend:
        assert await backend.adapter.get_checkpoint("s") is None  # connected
        server.pause()
        try:
            for mode in ("best-effort", "warn", "strict"):
                manager = siglo.StorageManager(backend, error_mode=mode)  # type: ignore[arg-type]
                manager.create_stack("s")
                with (
                    caplog.at_level(logging.WARNING, logger="siglo"),
                    pytest.raises(OutcomeUnknownError, match="may or may not"),
                ):
                    await manager.save_checkpoint("s")
                # A background save's unknown outcome surfaces from the next call.
                manager.checkpoint("s")
                with pytest.raises(OutcomeUnknownError):
                    await manager.flush()
            assert any("outcome unknown" in r.getMessage() for r in caplog.records)
        finally:
            server.resume()


async def test_paused_server_times_out_instead_of_hanging(server: RedisServer) -> None:
    async with siglo.connect(server.url, command_timeout_ms=300) as backend:
        assert await backend.adapter.get_checkpoint("s") is None  # connected
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(StorageAdapterError, match="timed out") as err:
                await backend.adapter.get_checkpoint("s")
            # A read: it changed nothing stored, so its outcome is not unknown.
            assert not isinstance(err.value, OutcomeUnknownError), err.value
            assert isinstance(err.value.__cause__, TimeoutError)
            assert time.monotonic() - started < 2
            assert backend.lock is not None
            with pytest.raises(StorageAdapterError):
                await backend.lock.acquire("L")
            assert time.monotonic() - started < 4
        finally:
            server.resume()


async def test_scripts_reload_after_noscript(server: RedisServer) -> None:
    async with siglo.connect(server.url) as backend:
        a = backend.adapter
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        client = a.client  # type: ignore[attr-defined]
        await client.script_flush()
        from siglo_redis.scripts import CHECKPOINT_CAS

        # The cache is empty: the next EVALSHA gets NOSCRIPT.
        assert await client.script_exists(CHECKPOINT_CAS.sha) == [False]
        await a.save_checkpoint(Checkpoint(stack_id="s", revision=2, timestamp=1))
        assert (await a.get_checkpoint("s")).revision == 2  # type: ignore[union-attr]
        assert await client.script_exists(CHECKPOINT_CAS.sha) == [True]  # reloaded


async def test_a_script_sent_again_after_noscript_keeps_one_bound(server: RedisServer) -> None:
    """A script the server does not hold (a replica just promoted) takes two round trips,
    EVALSHA then EVAL; both are one call under one ``command_timeout_ms``. Each slowed
    by 0.8 s under a 1.2 s bound: the call fails at the bound, where each round trip
    with a bound of its own let it succeed after 1.6 s."""
    import redis.asyncio

    from siglo_redis.commands import Commands
    from siglo_redis.scripts import Script

    class Slowed:
        """The server's client, each script round trip 0.8 s late."""

        def __init__(self, client: redis.asyncio.Redis) -> None:
            self.client = client

        async def evalsha(self, *args: object) -> object:
            await asyncio.sleep(0.8)
            return await self.client.evalsha(*args)  # type: ignore[arg-type]

        async def eval(self, *args: object) -> object:
            await asyncio.sleep(0.8)
            return await self.client.eval(*args)  # type: ignore[arg-type]

    async with redis.asyncio.Redis.from_url(server.url) as client:
        commands = Commands(Slowed(client), command_timeout_ms=1200)
        # A source no server has seen: its EVALSHA gets NOSCRIPT.
        script = Script("probe", f"return 1 -- {time.monotonic_ns()}")
        started = time.monotonic()
        with pytest.raises(OutcomeUnknownError, match="command_timeout_ms"):
            await commands.script(script, [], [])
        assert time.monotonic() - started < 1.5
        # The same two round trips, not slowed, answer within the bound.
        assert await Commands(client, command_timeout_ms=1200).script(script, [], []) == 1


async def test_a_failover_master_without_scripts_keeps_the_save_in_its_bound(
    server: RedisServer,
) -> None:
    """The failover case for real: ``wait_replicas=1`` on a server with no replica and no
    scripts (a replica just promoted). The ``NOSCRIPT`` round trip waits a second for
    ``WAIT``; the script sent again then has what is left of ``command_timeout_ms``
    (1.5 s), where with a bound of its own the save took two seconds."""
    url = f"{server.url}?wait_replicas=1&wait_timeout_ms=1000&command_timeout_ms=1500"
    async with siglo.connect(url) as backend:
        await backend.adapter.client.script_flush()  # type: ignore[attr-defined]
        started = time.monotonic()
        with pytest.raises(OutcomeUnknownError, match="timed out"):
            await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        assert time.monotonic() - started < 1.9


async def test_restarted_server_is_reached_again(server: RedisServer) -> None:
    async with siglo.connect(server.url) as backend:
        await backend.adapter.set_cached_step("k", 1)
        server.kill()
        with pytest.raises(StorageAdapterError):
            await backend.adapter.get_cached_step("k")
        server.start()
        await backend.adapter.set_cached_step("k", 2)  # fresh server, scripts reloaded too
        await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
        assert await backend.adapter.get_cached_step("k") == 2
