"""Focused checks of the lock, nonce and idempotency rules that need time or exact
values: fencing across an expiry, extend really moving the expiry, tokens that differ
only slightly, replays, and results completed without a claim. Time moves on the
backend's clock, or for real with short TTLs (Redis has no injectable clock)."""

from __future__ import annotations

import re
from typing import Any, Final

from siglo.adapter import Capability
from siglo.coordination import holder_label
from siglo.sentinel import MISSING
from siglo_contract.machine_base import look_alikes
from siglo_contract.registry import CheckContext, check, expect, fail

TOKEN: Final = re.compile(r"lock_(\d+)_[0-9a-f]{32}")


async def _clean_up(ctx: CheckContext) -> None:
    """Run the store's clean-up as ``siglo clean`` does: ``clean_expired`` where the
    adapter has one, else ``clean_expired_checkpoints`` where it stores checkpoints (a
    backend without either cleans nothing)."""
    adapter: Any = ctx.backend.adapter
    everything = getattr(adapter, "clean_expired", None)
    if callable(everything):
        await everything()
    elif Capability.CHECKPOINTS in ctx.backend.capabilities:
        await adapter.clean_expired_checkpoints()


@check("lock.fencing")
async def lock_fencing(ctx: CheckContext) -> None:
    """Fencing tokens grow with every acquire of a key: after a release, after an expiry
    (the holder's TTL ran out and another took over), after a clean-up run between that
    expiry and the next acquire (a clean-up that deletes an expired lock with its fencing
    counter starts the key again at 1), and with a custom token."""
    ctx.about("lock.fencing")
    lock = ctx.backend.lock
    assert lock is not None
    key = ctx.id("fenced")
    ttl = ctx.short_ttl_ms()
    seen: list[int] = []

    def record(what: str, fencing: int | None) -> None:
        expect(
            isinstance(fencing, int) and (not seen or fencing > seen[-1]),
            "lock.fencing",
            f"{what}: fencing token {fencing!r} after {seen}",
        )
        assert fencing is not None
        seen.append(fencing)

    first = await lock.acquire(key, 600_000)
    expect(first.acquired, "lock.acquire.exclusive", "a free lock was not acquired")
    record("first acquire", first.fencing_token)
    expect(await lock.release(key, first.token), "lock.release.token", "holder's release")
    second = await lock.acquire(key, ttl, ctx.id("custom"))
    expect(second.acquired, "lock.acquire.exclusive", "a released lock was not acquired")
    record("acquire after a release", second.fencing_token)
    await ctx.pass_time(ttl)
    third = await lock.acquire(key, 600_000)
    expect(third.acquired, "lock.expiry", "a lock past its TTL could not be acquired")
    record("acquire after the holder expired", third.fencing_token)
    # The same again with the store's clean-up between the expiry and the next acquire:
    # the clean-up may free the lapsed lock, never forget how far its key's fence went.
    expect(await lock.release(key, third.token), "lock.release.token", "holder's release")
    lapsing = await lock.acquire(key, ttl)
    expect(lapsing.acquired, "lock.acquire.exclusive", "a released lock was not acquired")
    record("acquire after a release", lapsing.fencing_token)
    await ctx.pass_time(ttl)
    await _clean_up(ctx)
    fourth = await lock.acquire(key, 600_000)
    expect(fourth.acquired, "lock.expiry", "a lock past its TTL and cleaned up was not acquired")
    record("acquire after the holder expired and a clean-up ran", fourth.fencing_token)
    other = await lock.acquire(ctx.id("other-key"), 600_000)
    expect(
        isinstance(other.fencing_token, int),
        "lock.fencing",
        f"another key's fencing token is {other.fencing_token!r}",
    )
    await lock.release(key, fourth.token)
    await lock.release(ctx.id("other-key"), other.token)


@check("lock.extend.token")
async def lock_extend(ctx: CheckContext) -> None:
    """Extend by the holder moves the expiry (the lock outlives its first TTL); extend by
    anyone else, or by a token that differs slightly, changes nothing."""
    ctx.about("lock.extend.token")
    lock = ctx.backend.lock
    assert lock is not None
    ttl = ctx.short_ttl_ms()
    key = ctx.id("extended")
    held = await lock.acquire(key, ttl)
    expect(held.acquired, "lock.acquire.exclusive", "a free lock was not acquired")
    for wrong in (*look_alikes(held.token), "other"):
        expect(
            await lock.extend(key, wrong, 600_000) is False,
            "lock.extend.token",
            f"extend with token {wrong!r} (not the holder's) returned True",
        )
    expect(
        await lock.extend(key, held.token, 600_000) is True,
        "lock.extend.token",
        "the holder's extend returned False",
    )
    await ctx.pass_time(ttl)
    taken = await lock.acquire(key, 600_000)
    expect(
        not taken.acquired,
        "lock.extend.token",
        "the lock expired at its first TTL although the holder extended it",
    )
    short, control = ctx.id("not-extended"), ctx.id("control")
    await lock.acquire(short, ttl)
    await lock.acquire(control, ttl)
    expect(
        await lock.extend(short, "intruder", 600_000) is False,
        "lock.extend.token",
        "a stranger's extend returned True",
    )
    await ctx.pass_time(ttl)
    after = await lock.acquire(short, 600_000)
    untouched = await lock.acquire(control, 600_000)
    expect(
        after.acquired,
        # The control lock, never extended, tells a lock that never expires (its own
        # rule) from a refused extend that still moved the expiry.
        "lock.extend.token" if untouched.acquired else "lock.expiry",
        "a lock past its TTL (after a stranger's refused extend) was still held",
    )
    await lock.release(key, held.token)
    await lock.release(short, after.token)
    # A lease that lapsed is nobody's: its last holder's extend does not take it back.
    lapsed = ctx.id("lapsed")
    gone = await lock.acquire(lapsed, ttl)
    await ctx.pass_time(ttl)
    for token in (gone.token, "stranger"):
        expect(
            await lock.extend(lapsed, token, 600_000) is False,
            "lock.extend.token",
            f"extend by {'its last holder' if token == gone.token else 'a stranger'} of a lock "
            "whose lease lapsed returned True",
        )
    free = await lock.acquire(lapsed, 600_000)
    expect(
        free.acquired,
        "lock.extend.token",
        "a lapsed lock was held again after refused extends",
    )
    await lock.release(lapsed, free.token)


@check("lock.release.token")
async def lock_release(ctx: CheckContext) -> None:
    """Only the holder's exact token releases; a released lock does not release again."""
    ctx.about("lock.release.token")
    lock = ctx.backend.lock
    assert lock is not None
    key = ctx.id("released")
    held = await lock.acquire(key, 600_000, ctx.id("Token"))
    expect(held.acquired, "lock.acquire.exclusive", "a free lock was not acquired")
    for wrong in (ctx.id("token"), ctx.id("Toke"), ctx.id("Token "), ctx.id("Token2"), "x"):
        expect(
            await lock.release(key, wrong) is False,
            "lock.release.token",
            f"release with {wrong!r} (the holder's is {held.token!r}) returned True",
        )
        expect(
            not (await lock.acquire(key, 600_000)).acquired,
            "lock.release.token",
            f"release with {wrong!r} freed the lock",
        )
    expect(await lock.release(key, held.token) is True, "lock.release.token", "holder refused")
    expect(
        await lock.release(key, held.token) is False,
        "lock.release.token",
        "a second release by the same token returned True",
    )
    # A lease that lapsed is nobody's: neither its last holder nor a stranger releases it.
    ttl = ctx.short_ttl_ms()
    lapsed, control = ctx.id("release-lapsed"), ctx.id("release-control")
    gone = await lock.acquire(lapsed, ttl)
    await lock.acquire(control, ttl)
    await ctx.pass_time(ttl)
    for token in (gone.token, "stranger"):
        if await lock.release(lapsed, token) is False:
            continue
        # The control lock, never touched, tells a lock that never lapses (its own rule)
        # from a release that ignores the lapse.
        untouched = await lock.acquire(control, 600_000)
        fail(
            "lock.release.token" if untouched.acquired else "lock.expiry",
            f"release by {'its last holder' if token == gone.token else 'a stranger'} of a "
            "lock whose lease lapsed returned True",
        )


@check("lock.token")
async def lock_tokens(ctx: CheckContext) -> None:
    """Tokens are the custom token, or lock_<epoch ms>_<32 hex>, different every time."""
    ctx.about("lock.token")
    lock = ctx.backend.lock
    assert lock is not None
    tokens = set()
    for i in range(6):
        key = ctx.id(f"tok{i}")
        got = await lock.acquire(key, 600_000)
        match = TOKEN.fullmatch(got.token)
        expect(match is not None, "lock.token", f"token {got.token!r} is not lock_<ms>_<hex>")
        assert match is not None
        expect(
            abs(int(match.group(1)) - ctx.now_ms()) < 600_000,
            "lock.token",
            f"token {got.token!r} does not carry the time of the acquire ({ctx.now_ms()})",
        )
        tokens.add(got.token)
    expect(len(tokens) == 6, "lock.token", f"tokens repeat: {sorted(tokens)}")
    custom = await lock.acquire(ctx.id("custom"), 600_000, ctx.id("my token"))
    expect(custom.token == ctx.id("my token"), "lock.token", f"custom token {custom.token!r}")


@check("nonce.claim.once")
async def nonce_replays(ctx: CheckContext) -> None:
    """The first claim wins; every replay in the window is refused, not only the first;
    nonces that differ slightly are different nonces."""
    ctx.about("nonce.claim.once")
    nonces = ctx.backend.nonces
    assert nonces is not None
    key = ctx.id("n")
    expect(await nonces.claim(key, 600) is True, "nonce.claim.once", "first claim refused")
    for i in range(4):
        expect(
            await nonces.claim(key, 600) is False,
            "nonce.claim.once",
            f"replay {i + 1} within the window was accepted",
        )
    for other in ("N", "n ", "n2"):
        expect(
            await nonces.claim(ctx.id(other), 600) is True,
            "nonce.claim.once",
            f"nonce {other!r} was refused because of nonce 'n'",
        )


@check("idempotency.complete", "idempotency.fail")
async def idempotency_results(ctx: CheckContext) -> None:
    """A result completed without a claim is kept; falsy results are results; fail of an
    unknown key is harmless; fail with an error frees an in-progress key."""
    idem = ctx.backend.idempotency
    assert idem is not None
    ctx.about("idempotency.complete")
    results: tuple[Any, ...] = (None, 0, False, "", [], {}, {"r": [1]})
    for i, result in enumerate(results):
        key = ctx.id(f"direct{i}")
        await idem.complete(key, result, 600_000)
        got = await idem.get_result(key)
        expect(
            got is not MISSING and got == result and type(got) is type(result),
            "idempotency.complete",
            f"completed {key!r} without a claim with {result!r}; get_result {got!r}",
        )
        state = await idem.claim(key)
        expect(state == "completed", "idempotency.complete", f"claim after complete: {state!r}")
    ctx.about("idempotency.fail")
    await idem.fail(ctx.id("never-claimed"))
    expect(
        await idem.claim(ctx.id("never-claimed")) == "claimed",
        "idempotency.fail",
        "fail of an unknown key left it unclaimable",
    )
    key = ctx.id("failed")
    await idem.claim(key)
    await idem.fail(key, RuntimeError("boom"))
    expect(await idem.claim(key) == "claimed", "idempotency.fail", "fail(error) kept the key")


@check("lock.inspect")
async def lock_inspect(ctx: CheckContext) -> None:
    """``inspect`` reads who holds a lock (a label, never the token) and how long its
    lease has left, the holder's fencing token where kept; ``None`` for a lock never
    taken, released, or whose lease lapsed; and looking changes nothing."""
    ctx.about("lock.inspect")
    lock: Any = ctx.backend.lock
    assert lock is not None
    key = ctx.id("inspected")
    expect(
        await lock.inspect(key) is None,
        "lock.inspect",
        "inspect of a lock never taken is not None",
    )
    held = await lock.acquire(key, 600_000)
    expect(held.acquired, "lock.acquire.exclusive", "a free lock was not acquired")
    seen = await lock.inspect(key)
    if seen is None:
        fail("lock.inspect", "inspect of a held lock returned None")
    expect(
        seen.holder == holder_label(held.token),
        "lock.inspect",
        f"holder {seen.holder!r}, expected holder_label(token) {holder_label(held.token)!r}",
    )
    expect(held.token not in seen.holder, "lock.inspect", "the holder label shows the token")
    expect(
        0 < seen.expires_in_ms <= 600_000,
        "lock.inspect",
        f"a fresh 600 s lease has {seen.expires_in_ms!r} ms left",
    )
    expect(
        seen.fencing_token in (None, held.fencing_token),
        "lock.inspect",
        f"fencing token {seen.fencing_token!r}, the acquire returned {held.fencing_token!r}",
    )
    expect(
        not (await lock.acquire(key, 600_000)).acquired,
        "lock.inspect",
        "the lock was free after inspect",
    )
    # Another holder after a release: another label, and its own fencing token.
    expect(await lock.release(key, held.token), "lock.release.token", "holder's release")
    expect(await lock.inspect(key) is None, "lock.inspect", "a released lock has a holder")
    custom = ctx.id("inspect-custom")
    second = await lock.acquire(key, 600_000, custom)
    expect(second.acquired, "lock.acquire.exclusive", "a released lock was not acquired")
    again = await lock.inspect(key)
    if again is None:
        fail("lock.inspect", "inspect of a lock held with a custom token returned None")
    expect(
        again.holder == holder_label(custom) and again.holder != seen.holder,
        "lock.inspect",
        f"the second holder reads as {again.holder!r} (the first as {seen.holder!r})",
    )
    expect(custom not in again.holder, "lock.inspect", "the holder label shows the token")
    expect(
        again.fencing_token in (None, second.fencing_token),
        "lock.inspect",
        f"fencing token {again.fencing_token!r}, the acquire returned {second.fencing_token!r}",
    )
    await lock.release(key, custom)
    # A lapsed lease has no holder, and inspecting it does not bring it back.
    ttl = ctx.short_ttl_ms()
    lapsing, control = ctx.id("inspect-lapsing"), ctx.id("inspect-control")
    short = await lock.acquire(lapsing, ttl)
    expect(short.acquired, "lock.acquire.exclusive", "a free lock was not acquired")
    await lock.acquire(control, ttl)
    live = await lock.inspect(lapsing)
    expect(
        live is not None and 0 < live.expires_in_ms <= ttl,
        "lock.inspect",
        f"a {ttl} ms lease reads as {live!r}",
    )
    await ctx.pass_time(ttl)
    if await lock.inspect(lapsing) is not None:
        # The control lock, never inspected, tells a lock that never lapses (its own
        # rule) from an inspect that ignores the lapse.
        untouched = await lock.acquire(control, 600_000)
        fail(
            "lock.inspect" if untouched.acquired else "lock.expiry",
            "inspect of a lock whose lease lapsed reported a holder",
        )
    taken = await lock.acquire(lapsing, 600_000)
    expect(taken.acquired, "lock.inspect", "a lapsed lock was held again after inspect")
