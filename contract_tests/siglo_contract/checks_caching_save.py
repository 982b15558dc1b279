"""The focused check of ``save_checkpoint_caching``: a step's checkpoint with its cache
entry, which a backend may write in one transaction with the step's context changes and
the release of the workflow lock."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.errors import CheckpointConflictError, InvalidArgumentError, LockNotAcquiredError
from siglo.records import ContextChangeEvent
from siglo.sentinel import MISSING
from siglo.settings import DEFAULTS
from siglo_contract.machine_base import canon
from siglo_contract.registry import CheckContext, check, expect, fail
from siglo_contract.target import USER_DEFAULTS

_RULE: Final = "cache.with-checkpoint"

ENTER_WITHIN_MS: Final = 2_000
"""How long the next holder may wait for the lock after an unlocking save."""


@check(_RULE, requires=(Capability.CHECKPOINTS, Capability.STEP_CACHE))
async def cache_with_checkpoint(ctx: CheckContext) -> None:
    """save_checkpoint_caching stores the entry as set_cached_step does (its value, its
    TTL, its namespace) whether the compare-and-set is accepted or refused, saves the
    checkpoint as save_checkpoint_streamed does (the changes recorded either way), raises
    a refused compare-and-set, writes nothing for bad input, and with ``unlock`` inside
    the workflow lock leaves the lock free once the action returns. Un-namespaced and
    namespaced, with the suite's options and a user's defaults. On a clock the suite
    moves, an entry given ``ttl_ms=None`` lives the adapter's default TTL, no longer
    (``cache_ttl_ms``: the option the backend was opened with, else siglo's default);
    without one (Redis) that takes minutes of real time, and only its read while live is
    checked."""
    ctx.about(_RULE)
    default = _default_ttl_ms(ctx.session.backend_options())
    for ns in (None, ctx.id("N")):
        await _CachingSaves(ctx, ctx.backend.adapter, ns, default).run()
    # A user's defaults (no checkpoint retention) take another path on some backends:
    # PostgreSQL puts the change in the checkpoint's statement.
    async with ctx.session.backend_with(**USER_DEFAULTS) as plain:
        default = _default_ttl_ms({**ctx.session.backend_options(), **USER_DEFAULTS})
        await _CachingSaves(ctx, plain.adapter, ctx.id("no-retention"), default).run()


def _default_ttl_ms(options: dict[str, Any]) -> int:
    """The TTL of an entry given none, on a backend opened with ``options``: their
    ``cache_ttl_ms``, else (not given, as under the user-defaults profile) siglo's
    default, which a backend's own must be (docs/writing-a-backend.md)."""
    return int(options.get("cache_ttl_ms", DEFAULTS.cache_ttl_ms))


def _same(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return a is b
    return canon(a) == canon(b)


class _CachingSaves:
    """One stack's caching saves and what must be stored after each."""

    def __init__(
        self,
        ctx: CheckContext,
        adapter: StorageAdapter,
        namespace: str | None,
        default_ttl_ms: int,
    ) -> None:
        self.ctx = ctx
        self.a = adapter
        self.ns = namespace
        self.default_ttl_ms = default_ttl_ms
        self.stack = ctx.id(f"caching-{namespace is not None}")
        self.streams = adapter.supports(Capability.CONTEXT_STREAM)

    def cp(self, revision: int) -> Checkpoint:
        return self.ctx.checkpoint(
            self.stack, revision, namespace=self.ns, contexts={"p": {"rev": revision}}
        )

    def changes(self, revision: int) -> list[ContextChangeEvent]:
        if not self.streams:
            return []
        change = ContextChangeEvent(
            stack_id=self.stack,
            step_id="p",
            key="rev",
            value=revision,
            timestamp=self.ctx.now_ms(),
            namespace=self.ns,
        )
        return [change]

    def entry(self, name: str, value: Any, ttl_ms: int | None) -> CacheEntry:
        # Keys of their own in the namespaced pass: an entry the pass without a
        # namespace stored (for 10 minutes) must not answer the namespaced pass's check
        # that its entries are not found without the namespace.
        key = self.ctx.id(name if self.ns is None else f"{name}-ns")
        return CacheEntry(key, value, ttl_ms, self.ns)

    async def caching(
        self, revision: int, expected: int | None, entry: CacheEntry, *, unlock: bool = False
    ) -> None:
        await self.a.save_checkpoint_caching(
            self.cp(revision),
            self.changes(revision),
            entry,
            expected_revision=expected,
            unlock=unlock,
        )

    async def revision(self) -> int | None:
        got = await self.a.get_checkpoint(self.stack, self.ns, fallback=False)
        return None if got is None else got.revision

    async def cached(self, entry: CacheEntry) -> Any:
        kw = {} if entry.namespace is None else {"namespace": entry.namespace}
        return await self.a.get_cached_step(entry.key, **kw)

    async def streamed(self, want: int, after: str) -> None:
        if not self.streams:
            return
        got = await self.a.get_context_changes(self.stack, "p", self.ns)
        expect(
            got.get("rev") == want,
            "context.streamed-save",
            f"after {after} the stream holds {got!r}; want rev={want}",
        )

    async def run(self) -> None:
        short = self.ctx.short_ttl_ms()
        # Accepted: the checkpoint, the change and the entry all stored. (A long TTL: on
        # a backend without an injectable clock a short one may lapse before the read on
        # a loaded machine; the short TTL is checked below, right before time passes.)
        first = self.entry("first", {"v": 1}, 600_000)
        try:
            await self.caching(1, 0, first)
        except CheckpointConflictError as exc:
            fail(_RULE, f"the first caching save (expected_revision=0) was refused: {exc}")
        got = await self.revision()
        expect(got == 1, _RULE, f"an accepted caching save stored revision {got}, not 1")
        got = await self.cached(first)
        expect(_same(got, {"v": 1}), _RULE, f"an accepted caching save's entry read {got!r}")
        await self.streamed(1, "an accepted caching save")
        # Refused: raised, the checkpoint kept, the entry (a falsy value) stored anyway.
        refused = self.entry("refused", 0, 600_000)
        try:
            await self.caching(3, 2, refused)
        except CheckpointConflictError:
            pass
        else:
            fail(_RULE, "a caching save with a stale expected_revision was not refused")
        got = await self.revision()
        expect(got == 1, _RULE, f"a refused caching save left revision {got}, not 1")
        got = await self.cached(refused)
        expect(
            _same(got, 0),
            _RULE,
            f"a refused caching save's entry read {got!r}, not 0: the entry is stored "
            "whatever the compare-and-set decides",
        )
        await self.streamed(3, "a refused caching save")
        # The default TTL (None) and the newest-wins form (no expected_revision).
        default = self.entry("default", [None], None)
        await self.caching(2, None, default)
        got = await self.revision()
        expect(got == 2, _RULE, f"a caching save without expected_revision left {got}, not 2")
        # Bad input writes nothing: neither the entry nor the checkpoint.
        bad = self.entry("bad", 1, -5)
        try:
            await self.caching(3, 2, bad)
        except InvalidArgumentError:
            pass
        else:
            fail(_RULE, "a caching save with ttl_ms=-5 was not refused")
        got = await self.revision()
        expect(got == 2, _RULE, f"a caching save refused for bad input stored revision {got}")
        got = await self.cached(bad)
        expect(got is MISSING, _RULE, f"a caching save refused for bad input cached {got!r}")
        if self.ns is not None:
            elsewhere = await self.a.get_cached_step(first.key)
            expect(
                elsewhere is MISSING,
                _RULE,
                f"an entry cached in namespace {self.ns!r} read {elsewhere!r} without one",
            )
        # The TTL is the entry's: an accepted save's entry with a short one is gone past
        # it, the others stay.
        brief = self.entry("brief", {"v": 2}, short)
        await self.caching(3, 2, brief)
        await self.ctx.pass_time(short)
        got = await self.cached(brief)
        expect(got is MISSING, _RULE, f"an entry past its ttl_ms ({short} ms) read {got!r}")
        for entry, want in ((first, {"v": 1}), (refused, 0), (default, [None])):
            got = await self.cached(entry)
            expect(_same(got, want), _RULE, f"an entry within its TTL read {got!r}, not {want!r}")
        if self.ctx.clock_controlled:
            await self.default_ttl(default, [None], short)
        await self.unlocking()

    async def default_ttl(self, entry: CacheEntry, want: Any, elapsed: int) -> None:
        """``entry``, saved with ``ttl_ms=None`` ``elapsed`` ms ago, lives the adapter's
        default TTL and no longer, as set_cached_step's does (cache.expiry): a backend
        whose caching save kept such an entry for 31 years passed when only its read while
        live was checked (a black-box auditor)."""
        ttl = self.default_ttl_ms
        margin = max(1, min(1_000, ttl // 4))
        before = ttl - elapsed - margin
        if before > 0:
            await self.ctx.pass_time(before)
            got = await self.cached(entry)
            expect(
                _same(got, want),
                _RULE,
                f"an entry saved with ttl_ms=None was gone {margin} ms before the adapter's "
                f"default (cache_ttl_ms={ttl}): read {got!r}, not {want!r}",
            )
        await self.ctx.pass_time(max(0, ttl - elapsed) + margin - max(0, before))
        got = await self.cached(entry)
        expect(
            got is MISSING,
            _RULE,
            f"an entry saved with ttl_ms=None was read {margin} ms past the adapter's default "
            f"(cache_ttl_ms={ttl}): {got!r}; None means the TTL set_cached_step gives it",
        )

    async def unlocking(self) -> None:
        """Inside the workflow lock with ``unlock``: stored, and the lock free after."""
        if not self.a.supports(Capability.WORKFLOW_LOCK):
            return
        last = self.entry("last", {"v": "last"}, 600_000)

        async def action() -> None:
            await self.caching(4, 3, last, unlock=True)

        await self.a.with_workflow_lock(self.stack, action, namespace=self.ns)

        async def read() -> int | None:
            return await self.revision()

        try:
            got = await asyncio.wait_for(
                self.a.with_workflow_lock(
                    self.stack, read, namespace=self.ns, timeout_ms=ENTER_WITHIN_MS
                ),
                ENTER_WITHIN_MS / 1000 + 5,
            )
        except (LockNotAcquiredError, TimeoutError):
            fail(_RULE, f"the lock was still held {ENTER_WITHIN_MS} ms after an unlocking one")
        expect(got == 4, _RULE, f"the next holder read revision {got} after an unlocking one")
        got = await self.cached(last)
        expect(_same(got, {"v": "last"}), _RULE, f"an unlocking caching save's entry: {got!r}")
