"""Focused checks of the idempotency store, the lock and the nonce store: concurrent
callers, real time, and ``with_lock``."""

from __future__ import annotations

import asyncio

from siglo.errors import LockNotAcquiredError
from siglo.sentinel import MISSING
from siglo_contract.concurrency import (
    PROCESSES,
    TASKS,
    contenders,
    in_processes,
    shares_across_processes,
)
from siglo_contract.registry import CheckContext, check, expect, fail


@check("idempotency.claim.once")
async def concurrent_idempotency_claims(ctx: CheckContext) -> None:
    """Of N concurrent claims of a key exactly one returns "claimed"."""
    key = ctx.id("idem-race")
    async with contenders(ctx) as backends:
        states = await asyncio.gather(*(b.idempotency.claim(key) for b in backends))  # type: ignore[union-attr]
    expect(
        states.count("claimed") == 1 and states.count("in-progress") == TASKS - 1,
        "idempotency.claim.once",
        f"{TASKS} concurrent claims returned {states}",
    )
    if shares_across_processes(ctx):
        out = await in_processes(ctx, "idem_claim", [{"key": ctx.id("idem-race-2")}] * PROCESSES)
        expect(
            out.count("claimed") == 1,
            "idempotency.claim.once",
            f"{PROCESSES} processes' claims returned {out}",
        )


@check("nonce.claim.once")
async def concurrent_nonce_claims(ctx: CheckContext) -> None:
    """Of N concurrent claims of a nonce exactly one returns True."""
    key = ctx.id("nonce-race")
    async with contenders(ctx) as backends:
        results = await asyncio.gather(*(b.nonces.claim(key, 60) for b in backends))  # type: ignore[union-attr]
    expect(results.count(True) == 1, "nonce.claim.once", f"{TASKS} concurrent claims: {results}")
    if shares_across_processes(ctx):
        out = await in_processes(ctx, "nonce_claim", [{"key": ctx.id("nonce-race-2")}] * PROCESSES)
        expect(out.count(True) == 1, "nonce.claim.once", f"{PROCESSES} processes' claims: {out}")


@check("lock.acquire.exclusive")
async def concurrent_lock_acquires(ctx: CheckContext) -> None:
    """Of N concurrent acquires of a free lock exactly one succeeds."""
    key = ctx.id("lock-race")
    async with contenders(ctx) as backends:
        results = await asyncio.gather(*(b.lock.acquire(key, 60_000) for b in backends))  # type: ignore[union-attr]
    won = [r for r in results if r.acquired]
    expect(len(won) == 1, "lock.acquire.exclusive", f"{len(won)} of {TASKS} acquires succeeded")
    if shares_across_processes(ctx):
        out = await in_processes(ctx, "lock_acquire", [{"key": ctx.id("lock-race-2")}] * PROCESSES)
        expect(
            out.count(True) == 1,
            "lock.acquire.exclusive",
            f"{out.count(True)} of {PROCESSES} processes acquired the same lock",
        )


@check("lock.with-lock")
async def with_lock(ctx: CheckContext) -> None:
    """with_lock runs under the lock and releases it, also on error; a held lock refuses."""
    lock = ctx.backend.lock
    assert lock is not None
    key = ctx.id("with")
    held_inside: list[bool] = []

    async def body() -> str:
        probe = await lock.acquire(key, 60_000)
        held_inside.append(not probe.acquired)
        if probe.acquired:
            await lock.release(key, probe.token)
        return "result"

    expect(await lock.with_lock(key, body) == "result", "lock.with-lock", "result not returned")
    expect(held_inside == [True], "lock.with-lock", "fn ran without the lock held")
    after = await lock.acquire(key, 60_000)
    expect(after.acquired, "lock.with-lock", "the lock was not released after fn")
    ran: list[int] = []

    async def never() -> None:
        ran.append(1)

    try:
        await lock.with_lock(key, never)
    except LockNotAcquiredError:
        pass
    else:
        fail("lock.with-lock", "with_lock on a held lock did not raise LockNotAcquiredError")
    expect(not ran, "lock.with-lock", "with_lock ran fn although the lock was held")
    await lock.release(key, after.token)

    class Boom(Exception):
        pass

    async def explode() -> None:
        raise Boom

    try:
        await lock.with_lock(key, explode)
    except Boom:
        pass
    else:
        fail("lock.with-lock", "fn's exception did not propagate")
    again = await lock.acquire(key, 60_000)
    expect(again.acquired, "lock.with-lock", "the lock stayed held after fn raised")


@check("idempotency.expiry", "idempotency.complete", "idempotency.fail")
async def idempotency_in_time(ctx: CheckContext) -> None:
    """Keys expire; a None result is a result; fail keeps a completed result."""
    idem = ctx.backend.idempotency
    assert idem is not None
    ttl = ctx.short_ttl_ms()
    key = ctx.id("idem")
    expect(await idem.get_result(key) is MISSING, "idempotency.complete", "result before complete")
    expect(await idem.claim(key, ttl) == "claimed", "idempotency.claim.once", "first claim")
    await ctx.pass_time(ttl)
    expect(
        await idem.claim(key, 60_000) == "claimed",
        "idempotency.expiry",
        "a key past its TTL was not claimable again",
    )
    await idem.complete(key, None, ttl)
    expect(await idem.claim(key) == "completed", "idempotency.complete", "not completed")
    got = await idem.get_result(key)
    expect(got is None, "idempotency.complete", f"a None result read back as {got!r}")
    await idem.fail(key)
    expect(await idem.get(key) is None, "idempotency.fail", "fail removed a completed result")
    await ctx.pass_time(ttl)
    expect(await idem.get_result(key) is MISSING, "idempotency.expiry", "result past its TTL")
    other = ctx.id("idem-fail")
    await idem.claim(other)
    await idem.fail(other)
    expect(await idem.claim(other) == "claimed", "idempotency.fail", "fail did not free the key")


@check("lock.expiry", "lock.release.token", "lock.extend.token")
async def lock_in_time(ctx: CheckContext) -> None:
    """Tokens guard release and extend; a lock past its TTL is free."""
    lock = ctx.backend.lock
    assert lock is not None
    ttl = ctx.short_ttl_ms()
    key = ctx.id("lock")
    first = await lock.acquire(key, ttl)
    expect(first.acquired, "lock.acquire.exclusive", "a free lock was not acquired")
    expect(
        not await lock.release(key, "not-the-token"), "lock.release.token", "wrong token released"
    )
    expect(
        not await lock.extend(key, "not-the-token", ttl),
        "lock.extend.token",
        "wrong token extended",
    )
    expect(
        not (await lock.acquire(key, ttl)).acquired, "lock.acquire.exclusive", "held lock acquired"
    )
    await ctx.pass_time(ttl)
    second = await lock.acquire(key, 60_000)
    expect(second.acquired, "lock.expiry", "a lock past its TTL could not be acquired")
    expect(
        not await lock.extend(key, first.token, 60_000),
        "lock.extend.token",
        "an expired holder extended the lock",
    )
    expect(
        not await lock.release(key, first.token),
        "lock.release.token",
        "an expired holder released another holder's lock",
    )
    expect(
        await lock.extend(key, second.token, 60_000), "lock.extend.token", "holder could not extend"
    )
    expect(await lock.release(key, second.token), "lock.release.token", "holder could not release")


@check("nonce.expiry")
async def nonce_in_time(ctx: CheckContext) -> None:
    """A nonce is refused within its window and claimable after it."""
    nonces = ctx.backend.nonces
    assert nonces is not None
    ttl = ctx.short_ttl_ms()
    key = ctx.id("nonce")
    expect(await nonces.claim(key, ttl / 1000), "nonce.claim.once", "first claim refused")
    expect(not await nonces.claim(key, ttl / 1000), "nonce.claim.once", "replay accepted")
    await ctx.pass_time(ttl)
    expect(await nonces.claim(key, ttl / 1000), "nonce.expiry", "not claimable after its window")
