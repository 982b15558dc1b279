"""Focused checks of the idempotency store, the lock and the nonce store: concurrent
callers, real time, and ``with_lock``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from siglo.coordination import IdempotencyClaim
from siglo.errors import (
    IdempotencyKeyMismatchError,
    IdempotencyOwnershipError,
    LockNotAcquiredError,
)
from siglo.sentinel import MISSING
from siglo.settings import DEFAULTS
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


@check("lock.with-lock.wait")
async def with_lock_waits(ctx: CheckContext) -> None:
    """with_lock(wait_ms=…) enters once the holder releases, refuses after the wait, and
    queues concurrent callers one at a time."""
    lock = ctx.backend.lock
    assert lock is not None
    key = ctx.id("with-wait")
    holder = await lock.acquire(key, 60_000)
    expect(holder.acquired, "lock.with-lock.wait", "a free lock was not acquired")
    loop = asyncio.get_running_loop()

    async def entered() -> float:
        return loop.time()

    waiter = asyncio.create_task(lock.with_lock(key, entered, 60_000, wait_ms=10_000))
    await asyncio.sleep(0.2)
    if waiter.done():
        # Its outcome is read here, so a failing backend leaves no unretrieved exception.
        error = waiter.exception()
        fail(
            "lock.with-lock.wait",
            "with_lock(wait_ms=10000) did not wait for the held lock: "
            + (f"it raised {error!r}" if error is not None else "it ran fn"),
        )
    released_at = loop.time()
    await lock.release(key, holder.token)
    try:
        entered_at = await asyncio.wait_for(waiter, 10)
    except LockNotAcquiredError:
        fail(
            "lock.with-lock.wait",
            "with_lock(wait_ms=10000) raised LockNotAcquiredError although the holder "
            "released the lock after 200 ms",
        )
    expect(
        entered_at - released_at < 2.0,
        "lock.with-lock.wait",
        f"with_lock entered {entered_at - released_at:.2f} s after the lock was released",
    )

    holder = await lock.acquire(key, 60_000)
    ran: list[int] = []

    async def never() -> None:
        ran.append(1)

    started = loop.time()
    try:
        await lock.with_lock(key, never, 60_000, wait_ms=300)
    except LockNotAcquiredError:
        waited = loop.time() - started
        expect(
            waited >= 0.25,
            "lock.with-lock.wait",
            f"with_lock(wait_ms=300) gave up after {waited * 1000:.0f} ms",
        )
    else:
        fail("lock.with-lock.wait", "with_lock(wait_ms=300) on a held lock ran fn")
    expect(not ran, "lock.with-lock.wait", "with_lock ran fn although the lock stayed held")
    await lock.release(key, holder.token)

    inside = 0
    overlaps = 0
    done = 0

    async def turn() -> None:
        nonlocal inside, overlaps, done
        inside += 1
        overlaps += inside > 1
        await asyncio.sleep(0.01)
        inside -= 1
        done += 1

    outcomes = await asyncio.wait_for(
        asyncio.gather(
            *(lock.with_lock(key, turn, 60_000, wait_ms=20_000) for _ in range(6)),
            return_exceptions=True,  # every caller's outcome is read, a failure too
        ),
        30,
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    expect(
        done == 6,
        "lock.with-lock.wait",
        f"{done} of 6 waiting callers ran" + (f" (one raised {errors[0]!r})" if errors else ""),
    )
    expect(overlaps == 0, "lock.with-lock.wait", "two waiting callers ran fn at once")


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
    """A nonce is refused within its window and claimable after it, a window under a
    second too: max(1, floor(ttl_seconds * 1000)) ms, not rounded up to a second."""
    nonces = ctx.backend.nonces
    assert nonces is not None
    ttl = ctx.short_ttl_ms()
    key = ctx.id("nonce")
    expect(await nonces.claim(key, ttl / 1000), "nonce.claim.once", "first claim refused")
    expect(not await nonces.claim(key, ttl / 1000), "nonce.claim.once", "replay accepted")
    await ctx.pass_time(ttl)
    expect(await nonces.claim(key, ttl / 1000), "nonce.expiry", "not claimable after its window")
    if ttl < 1_000:
        return  # the window above is already under a second (real time, no clock to move)
    # On a clock the suite moves the window above is a second: a store that keeps every
    # nonce at least a second passed it. Half a second is 500 ms.
    short, window = ctx.id("nonce-sub-second"), 500
    expect(await nonces.claim(short, window / 1000), "nonce.claim.once", "first claim refused")
    await ctx.pass_time(window - 1)
    expect(
        not await nonces.claim(short, window / 1000),
        "nonce.claim.once",
        f"a replay {window - 1} ms into a {window} ms window (ttl_seconds={window / 1000}) "
        "was accepted",
    )
    await ctx.pass_time(1)
    expect(
        await nonces.claim(short, window / 1000),
        "nonce.expiry",
        f"a nonce claimed with ttl_seconds={window / 1000} was not claimable after its "
        f"{window} ms window",
    )


async def _refused(
    call: Callable[[], Awaitable[object]], error: type[Exception], rule_id: str, what: str
) -> None:
    try:
        await call()
    except error:
        return
    except Exception as exc:
        fail(rule_id, f"{what} raised {exc!r}, not {error.__name__}")
    fail(rule_id, f"{what} did not raise {error.__name__}")


@check("idempotency.owner")
async def idempotency_owners(ctx: CheckContext) -> None:
    """Only an owned claim's token completes or fails it; a stale token changes nothing."""
    idem = ctx.backend.idempotency
    assert idem is not None
    rid = "idempotency.owner"
    key = ctx.id("idem-owner")
    won = await idem.claim_owned(key, 60_000)
    expect(won.state == "claimed" and bool(won.token), rid, f"first claim_owned {won!r}")
    assert won.token is not None
    lost = await idem.claim_owned(key, 60_000)
    expect(lost == IdempotencyClaim("in-progress"), rid, f"second claim_owned {lost!r}")
    # The owner's token in other letter case is another token (a store comparing tokens
    # without case lets anyone who guesses the letters complete the claim).
    # (A token without letters has no other case: the wrong token then stands in.)
    other_case = won.token.swapcase()
    if other_case == won.token:
        other_case = "idem_not-it"
    for what, call in (
        ("complete with a wrong token", lambda: idem.complete(key, 1, token="idem_not-it")),
        (
            "complete with the owner's token in other case",
            lambda: idem.complete(key, 1, token=other_case),
        ),
        ("fail with the owner's token in other case", lambda: idem.fail(key, token=other_case)),
        ("complete without a token", lambda: idem.complete(key, 1)),
        ("fail with a wrong token", lambda: idem.fail(key, token="idem_not-it")),
        ("fail without a token", lambda: idem.fail(key)),
    ):
        await _refused(call, IdempotencyOwnershipError, rid, f"{what} of an owned claim")
    expect(await idem.claim(key) == "in-progress", rid, "a refused call changed the claim")
    expect(await idem.get_result(key) is MISSING, rid, "a refused complete stored a result")
    await idem.complete(key, {"paid": 1}, token=won.token)
    expect(await idem.get_result(key) == {"paid": 1}, rid, "the owner's complete was lost")
    for what, call in (
        ("complete", lambda: idem.complete(key, {"paid": 2}, token=won.token)),
        ("fail", lambda: idem.fail(key, token=won.token)),
    ):
        await _refused(call, IdempotencyOwnershipError, rid, f"{what} with a spent token")
    expect(await idem.get_result(key) == {"paid": 1}, rid, "a spent token changed the result")
    # The owner's fail frees the key; its token then owns nothing.
    other = ctx.id("idem-owner-fail")
    first = await idem.claim_owned(other, 60_000)
    await idem.fail(other, token=first.token)
    second = await idem.claim_owned(other, 60_000)
    expect(
        second.state == "claimed" and second.token not in (None, first.token),
        rid,
        f"claim_owned after the owner's fail: {second!r}",
    )
    await _refused(
        lambda: idem.complete(other, 1, token=first.token),
        IdempotencyOwnershipError,
        rid,
        "complete with the token of a failed claim",
    )
    # The seed's token-less claim has no owner: token-less calls work as in the seed.
    seed = ctx.id("idem-owner-seed")
    expect(await idem.claim(seed, 60_000) == "claimed", rid, "seed claim")
    await idem.complete(seed, 3)
    expect(await idem.get_result(seed) == 3, rid, "token-less complete of a seed claim")


@check("idempotency.lease")
async def idempotency_lease(ctx: CheckContext) -> None:
    """A claim lasts its lease; after it lapses one new owner, and the old one is refused."""
    idem = ctx.backend.idempotency
    assert idem is not None
    rid = "idempotency.lease"
    ttl = ctx.short_ttl_ms()
    key = ctx.id("idem-lease")
    old = await idem.claim_owned(key, ttl)
    expect(old.state == "claimed", rid, f"first claim {old!r}")
    await ctx.pass_time(ttl)
    async with contenders(ctx) as backends:
        claims = await asyncio.gather(*(b.idempotency.claim_owned(key, 60_000) for b in backends))  # type: ignore[union-attr]
    owners = [c for c in claims if c.state == "claimed"]
    expect(
        len(owners) == 1 and all(c.state == "in-progress" for c in claims if c not in owners),
        rid,
        f"{len(claims)} concurrent claims after the lease lapsed: {[c.state for c in claims]}",
    )
    await _refused(
        lambda: idem.complete(key, "twice", token=old.token),
        IdempotencyOwnershipError,
        rid,
        "complete by the owner whose lease lapsed",
    )
    await idem.complete(key, "once", token=owners[0].token)
    expect(await idem.get_result(key) == "once", rid, "the new owner's complete was lost")
    # The owner extends its lease; nobody else can.
    slow = ctx.id("idem-lease-extend")
    held = await idem.claim_owned(slow, ttl)
    assert held.token is not None
    expect(not await idem.extend(slow, "idem_not-it", 60_000), rid, "a wrong token extended")
    expect(await idem.extend(slow, held.token, 60_000), rid, "the owner could not extend")
    await ctx.pass_time(ttl)
    expect(await idem.claim(slow) == "in-progress", rid, "an extended claim lapsed")
    await idem.complete(slow, "done", token=held.token)
    expect(not await idem.extend(slow, held.token, 60_000), rid, "a completed claim extended")
    if not ctx.clock_controlled:
        return  # the default lease is 30 s: only a manual clock can let it pass quickly
    lease = int(getattr(idem, "default_lease_ms", DEFAULTS.idempotency_lease_ms))
    retention = int(getattr(idem, "default_ttl_ms", DEFAULTS.idempotency_ttl_ms))
    expect(lease < retention, rid, f"the lease ({lease} ms) is not shorter than {retention} ms")
    crashed = ctx.id("idem-lease-default")
    expect((await idem.claim_owned(crashed)).state == "claimed", rid, "default claim")
    await ctx.pass_time(lease - 1)
    expect(await idem.claim(crashed) == "in-progress", rid, "a claim ended before its lease")
    await ctx.pass_time(1)
    expect(
        await idem.claim(crashed) == "claimed",
        rid,
        f"a crashed claim still held its key after the {lease} ms default lease",
    )
    await idem.complete(crashed, "kept")
    await ctx.pass_time(lease * 2)
    expect(await idem.get_result(crashed) == "kept", rid, "a result expired with the lease")


@check("idempotency.fingerprint")
async def idempotency_fingerprint(ctx: CheckContext) -> None:
    """A key claimed again with another fingerprint is refused, in progress and completed."""
    idem = ctx.backend.idempotency
    assert idem is not None
    rid = "idempotency.fingerprint"
    key = ctx.id("idem-fp")
    won = await idem.claim_owned(key, 60_000, fingerprint='{"amount": 10}')
    expect(won.state == "claimed", rid, f"first claim {won!r}")
    for stage in ("in progress", "completed"):
        for what, call in (
            ("claim", lambda: idem.claim(key, fingerprint='{"amount": 99}')),
            ("claim_owned", lambda: idem.claim_owned(key, fingerprint='{"amount": 99}')),
        ):
            await _refused(
                call, IdempotencyKeyMismatchError, rid, f"{what} with another fingerprint {stage}"
            )
        want = "in-progress" if stage == "in progress" else "completed"
        same = await idem.claim(key, fingerprint='{"amount": 10}')
        expect(same == want, rid, f"claim with the same fingerprint {stage}: {same!r}")
        expect(await idem.claim(key) == want, rid, f"claim without a fingerprint {stage}")
        if stage == "in progress":
            await idem.complete(key, {"ok": True}, token=won.token)
    expect(await idem.get_result(key) == {"ok": True}, rid, "a refused claim changed the result")
