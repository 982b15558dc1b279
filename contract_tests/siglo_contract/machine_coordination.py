"""State machines of the idempotency store, the lock and the nonce store."""

from __future__ import annotations

import re
from typing import Any, Final

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from siglo.coordination import IdempotencyStore, Lock, NonceStore
from siglo.errors import IdempotencyOwnershipError
from siglo.sentinel import MISSING
from siglo_contract.machine_base import (
    LOOK_ALIKES,
    ContractMachine,
    Outcome,
    canon,
    falsy_values,
    json_values,
    look_alike,
)
from siglo_memory.coordination import MemoryIdempotencyStore, MemoryLock, MemoryNonceStore

__all__ = ["IdempotencyMachine", "LockMachine", "NonceMachine"]

KEYS = st.sampled_from(("i1", "i:2", "*", "{i}", "ü"))
TOKENS = st.one_of(st.sampled_from(("owner", "owner", "none")), st.sampled_from(LOOK_ALIKES))
"""Which token a complete or fail passes: the owner's, none, or a look-alike of it."""
TOKEN_FORMAT: Final = re.compile(r"lock_\d+_[0-9a-f]{32}")


def _same(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return a is b
    return canon(a) == canon(b)


class IdempotencyMachine(ContractMachine):
    """Claims (owned ones too), completes (``None`` results included) and fails, of
    claimed keys and of keys never claimed, with the owner's token, none, or one that
    differs from it only slightly; TTLs and leases on the clock."""

    RULE_IDS = (
        "idempotency.claim.once",
        "idempotency.complete",
        "idempotency.fail",
        "idempotency.expiry",
        "idempotency.owner",
    )

    def __init__(self) -> None:
        super().__init__()
        self.owners: dict[str, tuple[str, str]] = {}
        """Key → (reference token, backend token) of its last owned claim."""
        self.fresh = 0

    def key(self, key: str, fresh: bool) -> str:
        """The real key: ``key``, or with ``fresh`` one never claimed nor completed."""
        if fresh:
            self.fresh += 1
            return f"never-{self.fresh}"
        return key

    def tokens(self, k: str, how: str) -> tuple[str | None, str | None]:
        """(reference, backend) token for ``how`` (see :data:`TOKENS`)."""
        if how == "none":
            return None, None
        ref_tok, be_tok = self.owners.get(k, ("idem_x", "idem_x"))
        if how == "owner":
            return ref_tok, be_tok
        return look_alike(ref_tok, how), look_alike(be_tok, how)

    @precondition(lambda self: self.live())
    @rule(key=KEYS, ttl=st.sampled_from(("default", "long", "short")))
    def claim_owned(self, key: str, ttl: str) -> None:
        k = self.kk(key)
        expired = self.expired_in_ref(k)
        got = self.call(self.store.claim_owned(k, self.ttl(ttl)), "idempotency.owner")
        want = self.call(self.ref_store.claim_owned(k, self.ttl(ttl)), "idempotency.owner")
        self.unexpected(got, "idempotency.owner", "claim_owned")
        if self.tainted:
            return
        mine, theirs = got.value, want.value
        if mine.state != theirs.state:
            rule_id = (
                "idempotency.expiry"
                if expired
                else (
                    "idempotency.complete"
                    if "completed" in (mine.state, theirs.state)
                    else "idempotency.claim.once"
                )
            )
            self.diverge(rule_id, f"claim_owned({k!r}) {got!r}; reference {want!r}")
            return
        self.direct(
            (mine.token is not None) == (mine.state == "claimed"),
            "idempotency.owner",
            f"claim_owned({k!r}) returned {mine!r}: a token exactly when claimed",
        )
        if mine.state == "claimed" and mine.token is not None:
            self.owners[k] = (theirs.token, mine.token)

    @precondition(lambda self: self.live())
    @rule(
        ttl=st.sampled_from(("default", "long", "short")),
        rivals=st.lists(st.sampled_from(LOOK_ALIKES), min_size=1, max_size=3),
        result=st.one_of(st.sampled_from(falsy_values), json_values),
        finish=st.sampled_from(("complete", "fail")),
    )
    def owned_lifecycle(self, ttl: str, rivals: list[str], result: Any, finish: str) -> None:
        """An owned claim of a new key, completes and fails with tokens that differ from
        the owner's only slightly (all refused), then the owner's complete or fail."""
        key = self.key("", True)
        self.claim_owned(key, ttl)
        for how in rivals:
            if self.tainted:
                return
            self.complete(key, False, result, "long", how)
            if not self.tainted:
                self.fail_key(key, False, how)
        if self.tainted:
            return
        if finish == "complete":
            self.complete(key, False, result, "long", "owner")
        else:
            self.fail_key(key, False, "owner")

    def owned_call(self, what: str, k: str, how: str, mine: Outcome, theirs: Outcome) -> bool:
        """Compare an owned complete or fail; ``False`` once a divergence was reported."""
        if self.tainted:
            return False
        refused = isinstance(mine.error, IdempotencyOwnershipError)
        if refused and isinstance(theirs.error, IdempotencyOwnershipError):
            return True
        if refused and theirs.ok:
            self.diverge(
                "idempotency.expiry" if self.expired_in_ref(k) else "idempotency.owner",
                f"{what}({k!r}, token={how}) {mine!r}; reference {theirs!r}",
            )
            return False
        if mine.ok and isinstance(theirs.error, IdempotencyOwnershipError):
            self.diverge(
                "idempotency.owner", f"{what}({k!r}, token={how}) {mine!r}; reference {theirs!r}"
            )
            return False
        self.unexpected(mine, f"idempotency.{what}", what)
        return not self.tainted

    @property
    def store(self) -> IdempotencyStore:
        assert self.backend.idempotency is not None
        return self.backend.idempotency

    @property
    def ref_store(self) -> MemoryIdempotencyStore:
        store = self.ref.idempotency
        assert isinstance(store, MemoryIdempotencyStore)
        return store

    def expired_in_ref(self, key: str) -> bool:
        return self.ref_store.model.lapsed(key, self.now())

    def ttl(self, choice: str) -> int | None:
        return {
            "default": None,
            "long": 3_600_000,
            "short": 2_000 if self.clock_controlled else None,
        }[choice]

    @precondition(lambda self: self.live())
    @rule(key=KEYS, ttl=st.sampled_from(("default", "long", "short")))
    def claim(self, key: str, ttl: str) -> None:
        k = self.kk(key)
        expired = self.expired_in_ref(k)
        got = self.call(self.store.claim(k, self.ttl(ttl)), "idempotency.claim.once")
        want = self.call(self.ref_store.claim(k, self.ttl(ttl)), "idempotency.claim.once")
        self.unexpected(got, "idempotency.claim.once", "claim")
        if not self.tainted and got.value != want.value:
            rule_id = (
                "idempotency.expiry"
                if expired
                else (
                    "idempotency.complete"
                    if "completed" in (got.value, want.value)
                    else "idempotency.claim.once"
                )
            )
            self.diverge(rule_id, f"claim({k!r}) {got!r}; reference {want!r}")

    @precondition(lambda self: self.live())
    @rule(
        key=KEYS,
        fresh=st.booleans(),
        result=st.one_of(st.none(), st.sampled_from(falsy_values), json_values),
        ttl=st.sampled_from(("default", "long", "short")),
        how=TOKENS,
    )
    def complete(self, key: str, fresh: bool, result: Any, ttl: str, how: str) -> None:
        key = self.key(key, fresh)
        k = self.kk(key)
        ref_tok, be_tok = self.tokens(k, how)
        got = self.call(
            self.store.complete(k, result, self.ttl(ttl), token=be_tok), "idempotency.complete"
        )
        want = self.call(
            self.ref_store.complete(k, result, self.ttl(ttl), token=ref_tok),
            "idempotency.complete",
        )
        if not self.owned_call("complete", k, how, got, want) or not want.ok:
            self.compare(key, "idempotency.owner")
            return
        read = self.call(self.store.get_result(k), "idempotency.complete")
        self.direct(
            read.value is not MISSING and _same(read.value, result),
            "idempotency.complete",
            f"completed {k!r} with {result!r}, get_result {read!r}",
        )
        self.compare(key, "idempotency.complete")

    @precondition(lambda self: self.live())
    @rule(key=KEYS, fresh=st.booleans(), how=TOKENS)
    def fail_key(self, key: str, fresh: bool, how: str) -> None:
        key = self.key(key, fresh)
        k = self.kk(key)
        ref_tok, be_tok = self.tokens(k, how)
        got = self.call(self.store.fail(k, token=be_tok), "idempotency.fail")
        want = self.call(self.ref_store.fail(k, token=ref_tok), "idempotency.fail")
        if not self.owned_call("fail", k, how, got, want):
            self.compare(key, "idempotency.owner")
            return
        self.compare(key, "idempotency.fail" if want.ok else "idempotency.owner")
        if self.tainted or not fresh:
            return
        # A key failed without any claim must be claimable at once.
        got = self.call(self.store.claim(k), "idempotency.fail")
        want = self.call(self.ref_store.claim(k), "idempotency.fail")
        if not self.tainted and got.value != want.value:
            self.diverge("idempotency.fail", f"claim after fail of a never-claimed key {got!r}")

    @precondition(lambda self: self.live())
    @rule(key=KEYS)
    def read(self, key: str) -> None:
        self.compare(key, None)

    def compare(self, key: str, rule_hint: str | None) -> None:
        k = self.kk(key)
        expired = self.expired_in_ref(k)
        for method in ("get_result", "get"):
            got = self.call(getattr(self.store, method)(k), "idempotency.complete")
            want = self.call(getattr(self.ref_store, method)(k), "idempotency.complete")
            self.unexpected(got, "idempotency.complete", method)
            if not self.tainted and not _same(got.value, want.value):
                self.diverge(
                    "idempotency.expiry" if expired else rule_hint or "idempotency.complete",
                    f"{method}({k!r}) {got!r}; reference {want!r}",
                )
                return

    @precondition(lambda self: self.live() and self.clock_controlled)
    @rule(ms=st.sampled_from((1, 1_999, 2_000, 86_400_000)))
    def advance(self, ms: int) -> None:
        assert self.session.clock is not None
        self.session.clock.advance(ms)


class LockMachine(ContractMachine):
    """Acquires (custom tokens too), releases and extends by the holder and by others,
    fencing tokens and TTLs."""

    RULE_IDS = (
        "lock.acquire.exclusive",
        "lock.release.token",
        "lock.extend.token",
        "lock.expiry",
        "lock.fencing",
        "lock.token",
    )

    def __init__(self) -> None:
        super().__init__()
        self.holders: dict[str, tuple[str, str]] = {}
        self.fences: dict[str, int] = {}
        self.tokens: set[str] = set()

    @property
    def lock(self) -> Lock:
        assert self.backend.lock is not None
        return self.backend.lock

    @property
    def ref_lock(self) -> MemoryLock:
        lock = self.ref.lock
        assert isinstance(lock, MemoryLock)
        return lock

    def expired_in_ref(self, key: str) -> bool:
        return self.ref_lock.model.lapsed(key, self.now())

    def ttl(self, choice: str) -> int:
        return {"long": 600_000, "short": 2_000 if self.clock_controlled else 600_000}[choice]

    @precondition(lambda self: self.live())
    @rule(key=KEYS, ttl=st.sampled_from(("long", "short")), custom=st.booleans())
    def acquire(self, key: str, ttl: str, custom: bool) -> None:
        k = self.kk(key)
        token = self.kk(f"token-{len(self.tokens)}") if custom else None
        expired = self.expired_in_ref(k)
        got = self.call(self.lock.acquire(k, self.ttl(ttl), token), "lock.acquire.exclusive")
        want = self.call(self.ref_lock.acquire(k, self.ttl(ttl), token), "lock.acquire.exclusive")
        self.unexpected(got, "lock.acquire.exclusive", "acquire")
        if self.tainted:
            return
        mine, theirs = got.value, want.value
        if mine.acquired:
            if custom:
                self.direct(
                    mine.token == token,
                    "lock.token",
                    f"custom token {token!r}, acquire returned {mine.token!r}",
                )
            else:
                self.direct(
                    isinstance(mine.token, str) and TOKEN_FORMAT.fullmatch(mine.token),
                    "lock.token",
                    f"token {mine.token!r} is not lock_<ms>_<32 hex>",
                )
                self.direct(
                    mine.token not in self.tokens,
                    "lock.token",
                    f"token {mine.token!r} returned twice",
                )
            self.direct(
                isinstance(mine.fencing_token, int) and mine.fencing_token > self.fences.get(k, 0),
                "lock.fencing",
                f"fencing token {mine.fencing_token!r} after {self.fences.get(k)!r}",
            )
            if isinstance(mine.fencing_token, int):
                self.fences[k] = mine.fencing_token
            self.tokens.add(mine.token)
        if self.tainted:
            return
        if mine.acquired != theirs.acquired:
            self.diverge(
                "lock.expiry" if expired else "lock.acquire.exclusive",
                f"acquire({k!r}) {got!r}; reference {want!r}",
            )
            return
        if mine.acquired:
            self.holders[k] = (theirs.token, mine.token)

    @precondition(lambda self: self.live())
    @rule(key=KEYS, holder=st.booleans())
    def release(self, key: str, holder: bool) -> None:
        k = self.kk(key)
        ref_tok, be_tok = self.holders.get(k, ("stranger", "stranger"))
        if not holder:
            ref_tok = be_tok = self.kk("stranger")
        expired = self.expired_in_ref(k)
        got = self.call(self.lock.release(k, be_tok), "lock.release.token")
        want = self.call(self.ref_lock.release(k, ref_tok), "lock.release.token")
        self.unexpected(got, "lock.release.token", "release")
        if not self.tainted and got.value is not want.value:
            # As for extend: a release that succeeds on a lapsed lock breaks the release
            # rule; a lock that never lapses is the focused lock.expiry check's to name.
            self.diverge(
                "lock.expiry" if expired and not got.value else "lock.release.token",
                f"release({k!r}, {'holder' if holder else 'other'}) {got!r}; reference {want!r}",
            )
        self.probe(k, "lock.release.token")

    @precondition(lambda self: self.live())
    @rule(key=KEYS, holder=st.booleans(), ttl=st.sampled_from(("long", "short")))
    def extend(self, key: str, holder: bool, ttl: str) -> None:
        k = self.kk(key)
        ref_tok, be_tok = self.holders.get(k, ("stranger", "stranger"))
        if not holder:
            ref_tok = be_tok = self.kk("stranger")
        expired = self.expired_in_ref(k)
        got = self.call(self.lock.extend(k, be_tok, self.ttl(ttl)), "lock.extend.token")
        want = self.call(self.ref_lock.extend(k, ref_tok, self.ttl(ttl)), "lock.extend.token")
        self.unexpected(got, "lock.extend.token", "extend")
        if not self.tainted and got.value is not want.value:
            # An extend that succeeds on a lapsed lock breaks the extend rule (a lapsed
            # lease has no holder); a lock that never lapses at all is the focused
            # lock.expiry check's to name, with better evidence than this divergence.
            self.diverge(
                "lock.expiry" if expired and not got.value else "lock.extend.token",
                f"extend({k!r}, {'holder' if holder else 'other'}) {got!r}; reference {want!r}",
            )

    def probe(self, k: str, rule_id: str) -> None:
        """Whether the lock is held, observed by a try-acquire that is undone at once."""
        if self.tainted:
            return
        probe_token = self.kk("probe")
        got = self.call(self.lock.acquire(k, 600_000, probe_token), rule_id)
        want = self.call(self.ref_lock.acquire(k, 600_000, probe_token), rule_id)
        self.unexpected(got, rule_id, "acquire")
        if self.tainted:
            return
        if got.value.acquired != want.value.acquired:
            self.diverge(
                rule_id,
                f"afterwards the lock {'was' if got.value.acquired else 'was not'}"
                f" free; reference {want!r}",
            )
            return
        if got.value.acquired:
            self.fences[k] = max(self.fences.get(k, 0), got.value.fencing_token or 0)
            self.run(self.lock.release(k, probe_token))
            self.run(self.ref_lock.release(k, probe_token))

    @precondition(lambda self: self.live() and self.clock_controlled)
    @rule(ms=st.sampled_from((1, 1_999, 2_000, 600_000)))
    def advance(self, ms: int) -> None:
        assert self.session.clock is not None
        self.session.clock.advance(ms)
        note(f"# now {self.session.clock.now_ms()}")


class NonceMachine(ContractMachine):
    """First claims and replays of nonces within and after their window."""

    RULE_IDS = ("nonce.claim.once", "nonce.expiry")

    @property
    def nonces(self) -> NonceStore:
        assert self.backend.nonces is not None
        return self.backend.nonces

    @property
    def ref_nonces(self) -> MemoryNonceStore:
        nonces = self.ref.nonces
        assert isinstance(nonces, MemoryNonceStore)
        return nonces

    @precondition(lambda self: self.live())
    @rule(key=KEYS, ttl=st.sampled_from((0.0005, 1.5, 2, 60)))
    def claim(self, key: str, ttl: float) -> None:
        if not self.clock_controlled and ttl < 60:
            ttl = 60
        k = self.kk(key)
        expired = self.ref_nonces.model.lapsed(k, self.now())
        got = self.call(self.nonces.claim(k, ttl), "nonce.claim.once")
        want = self.call(self.ref_nonces.claim(k, ttl), "nonce.claim.once")
        self.unexpected(got, "nonce.claim.once", "claim")
        if not self.tainted and got.value is not want.value:
            self.diverge(
                "nonce.expiry" if expired else "nonce.claim.once",
                f"claim({k!r}, {ttl}) {got!r}; reference {want!r}",
            )

    @precondition(lambda self: self.live() and self.clock_controlled)
    @rule(ms=st.sampled_from((1, 1_499, 1_500, 2_000, 60_000)))
    def advance(self, ms: int) -> None:
        assert self.session.clock is not None
        self.session.clock.advance(ms)
