"""A finite duration too large for a float (``10**400`` ms or s, ``1e306`` s) is capped at
:data:`siglo.validation.MAX_DURATION_MS` ("never"), as a TTL past a signed 64-bit time is
clamped where it is stored; ``nan`` and the infinities are refused naming the argument.
Never a raw ``OverflowError`` (a black-box audit: ``nonces.claim(key, 10**400)``,
``lock.with_lock(key, fn, wait_ms=10**400)``, ``webhooks.verify(…, tolerance_s=10**400)``),
on every coordination primitive of every backend and through the blocking facade."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import pytest
from raw_storage import KINDS, any_backend

import siglo
from siglo import sync, webhooks
from siglo.errors import InvalidArgumentError
from siglo.locking import run_with_lock
from siglo.validation import (
    MAX_DURATION_MS,
    MAX_DURATION_S,
    capped_seconds,
    ms_as_seconds,
    seconds_as_ms,
)
from siglo.workflow.worker import RetryPolicy

HUGE_MS = (10**400, 2**64)
"""Integers of milliseconds past a signed 64-bit count (the first past a float too)."""
HUGE_S: tuple[float, ...] = (10**400, 2**64, 1e306, 1.7e308)
"""Numbers of seconds whose milliseconds are past a float (or a signed 64-bit count)."""
NOT_FINITE = (math.nan, math.inf, -math.inf)


def _key() -> str:
    return f"huge-{uuid.uuid4().hex}"


async def _one() -> int:
    return 1


def test_the_helpers_cap_what_a_float_cannot_hold() -> None:
    assert ms_as_seconds(10**400) == MAX_DURATION_S == MAX_DURATION_MS / 1000
    assert ms_as_seconds(1500) == 1.5
    assert capped_seconds(10**400) == MAX_DURATION_S
    assert capped_seconds(2.5) == 2.5
    for seconds in HUGE_S:
        assert seconds_as_ms("ttl_seconds", seconds) == MAX_DURATION_MS
    assert seconds_as_ms("ttl_seconds", 0.0001) == 1  # the seed's max(1, floor(s * 1000))
    assert seconds_as_ms("ttl_seconds", 2.5) == 2500
    for bad in (*NOT_FINITE, 0, -1, True, "5"):
        with pytest.raises(InvalidArgumentError, match="ttl_seconds"):
            seconds_as_ms("ttl_seconds", bad)


def test_a_retry_policy_of_huge_delays_is_capped() -> None:
    policy = RetryPolicy(initial_delay_s=10**400, max_delay_s=10**400, give_up_after_s=10**400)
    assert 0 < policy.delay_s(0) <= MAX_DURATION_S
    assert 0 < policy.delay_s(100) <= MAX_DURATION_S
    for bad in NOT_FINITE:
        with pytest.raises(InvalidArgumentError, match="max_delay_s"):
            RetryPolicy(max_delay_s=bad)


@pytest.mark.parametrize("kind", KINDS)
async def test_huge_durations_are_capped_on_every_primitive(kind: str) -> None:
    async with any_backend(kind) as backend:
        nonces = backend.require_nonces()
        lock = backend.require_lock()
        for seconds in HUGE_S:
            key = _key()
            # A window capped at "never": claimed once, a replay refused.
            assert await nonces.claim(key, seconds) is True
            assert await nonces.claim(key, seconds) is False
        for bad in NOT_FINITE:
            with pytest.raises(InvalidArgumentError, match="ttl_seconds"):
                await nonces.claim(_key(), bad)
        for ms in HUGE_MS:
            key = _key()
            assert await lock.with_lock(key, _one, wait_ms=ms) == 1
            assert await lock.with_lock(key, _one, ms, wait_ms=ms) == 1
            assert await run_with_lock(lock, key, _one, ttl_ms=ms, timeout_ms=ms) == 1
            assert await backend.adapter.with_workflow_lock(key, _one, timeout_ms=ms) == 1
            # A held lock is waited for (not an OverflowError) until it is released.
            held = await lock.acquire(key, 60_000)
            assert held.acquired
            waiter = asyncio.create_task(lock.with_lock(key, _one, wait_ms=ms))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            await lock.release(key, held.token)
            assert await asyncio.wait_for(waiter, 5) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_huge_webhook_tolerance_is_capped(kind: str) -> None:
    async with any_backend(kind) as backend:
        nonces = backend.require_nonces()
        for tolerance in HUGE_S:
            body = uuid.uuid4().bytes
            headers = {"Siglo-Signature": webhooks.sign("secret", body, timestamp=1)}
            # Signed in 1970, within a tolerance of "never"; its replay is still refused.
            verified = await webhooks.verify("secret", body, headers, nonces, tolerance_s=tolerance)
            assert verified.timestamp == 1
            with pytest.raises(webhooks.WebhookReplayError):
                await webhooks.verify("secret", body, headers, nonces, tolerance_s=tolerance)
        body = b"{}"
        headers = {"Siglo-Signature": webhooks.sign("secret", body)}
        for bad in (*NOT_FINITE, 0, True):
            with pytest.raises(InvalidArgumentError, match="tolerance_s"):
                await webhooks.verify("secret", body, headers, nonces, tolerance_s=bad)


DURATION_OPTIONS = [
    ("memory", "workflow_lock_timeout_ms"),
    *(
        (kind, option)
        for kind in ("sqlite", "postgres", "redis")
        for option in ("workflow_lock_ttl_ms", "workflow_lock_timeout_ms", "command_timeout_ms")
    ),
    ("sqlite", "busy_timeout_ms"),
    ("postgres", "pool_timeout_ms"),
    ("postgres", "connect_timeout_ms"),
]
"""Each backend's own duration options (milliseconds)."""


@pytest.mark.parametrize(("kind", "option"), DURATION_OPTIONS)
async def test_huge_duration_options_are_capped(kind: str, option: str) -> None:
    """A backend's own duration options are used capped too: a save, a workflow lock and
    the coordination calls all work."""
    options: dict[str, Any] = {option: 10**400}
    if option == "busy_timeout_ms":
        options["command_timeout_ms"] = None  # else the call's bound is the busy timeout
    async with any_backend(kind, **options) as backend:
        manager = siglo.StorageManager(backend, error_mode="strict")
        stack = manager.create_stack(_key())
        await stack.save()
        assert await backend.adapter.with_workflow_lock(_key(), _one) == 1
        assert await backend.require_lock().with_lock(_key(), _one, wait_ms=10) == 1
        assert await backend.require_nonces().claim(_key(), 60) is True
        claim = await backend.require_idempotency().claim_owned(_key())
        assert claim.state == "claimed"
        if option == "busy_timeout_ms":
            # SQLite's busy_timeout is a C int: a longer one read as 0, no wait at all.
            database: Any = backend.adapter.database  # type: ignore[attr-defined]
            assert await database.fetch("PRAGMA busy_timeout") == [(2**31 - 1,)]


def test_the_blocking_facade_caps_them_too(tmp_path: object) -> None:
    with sync.connect(f"sqlite:///{tmp_path}/huge.db") as backend:
        nonces = backend.require_nonces()
        key = _key()
        assert nonces.claim(key, 10**400) is True
        assert nonces.claim(key, 10**400) is False
        assert backend.require_lock().with_lock(_key(), lambda: 1, wait_ms=10**400) == 1
        body = b"{}"
        headers = {"Siglo-Signature": webhooks.sign("secret", body)}
        verified = sync.verify_webhook("secret", body, headers, nonces, tolerance_s=10**400)
        assert verified.signature
        with pytest.raises(InvalidArgumentError, match="tolerance_s"):
            sync.verify_webhook("secret", body, headers, nonces, tolerance_s=math.nan)
