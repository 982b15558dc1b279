"""State machines of the idempotency store, the lock and the nonce store."""

from __future__ import annotations

import re
from typing import Any, Final

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from siglo.coordination import IdempotencyStore, Lock, NonceStore
from siglo.sentinel import MISSING
from siglo_contract.machine_base import ContractMachine, canon, json_values

__all__ = ["IdempotencyMachine", "LockMachine", "NonceMachine"]

KEYS = st.sampled_from(("i1", "i:2", "*", "{i}", "ü"))
TOKEN_FORMAT: Final = re.compile(r"lock_\d+_[0-9a-f]{32}")


def _same(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return a is b
    return canon(a) == canon(b)


class IdempotencyMachine(ContractMachine):
    """Claims, completes (``None`` results included), fails and TTLs of idempotency keys."""

    RULE_IDS = (
        "idempotency.claim.once",
        "idempotency.complete",
        "idempotency.fail",
        "idempotency.expiry",
    )

    @property
    def store(self) -> IdempotencyStore:
        assert self.backend.idempotency is not None
        return self.backend.idempotency

    @property
    def ref_store(self) -> Any:
        return self.ref.idempotency

    def expired_in_ref(self, key: str) -> bool:
        item = self.ref_store._keys._items.get(key)
        return item is not None and self.now() >= item[1]

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
        result=st.one_of(st.none(), json_values),
        ttl=st.sampled_from(("default", "long", "short")),
    )
    def complete(self, key: str, result: Any, ttl: str) -> None:
        k = self.kk(key)
        got = self.call(self.store.complete(k, result, self.ttl(ttl)), "idempotency.complete")
        self.call(self.ref_store.complete(k, result, self.ttl(ttl)), "idempotency.complete")
        self.unexpected(got, "idempotency.complete", "complete")
        if self.tainted:
            return
        read = self.call(self.store.get_result(k), "idempotency.complete")
        self.direct(
            read.value is not MISSING and _same(read.value, result),
            "idempotency.complete",
            f"completed {k!r} with {result!r}, get_result {read!r}",
        )
        self.compare(key, "idempotency.complete")

    @precondition(lambda self: self.live())
    @rule(key=KEYS)
    def fail_key(self, key: str) -> None:
        k = self.kk(key)
        got = self.call(self.store.fail(k), "idempotency.fail")
        self.call(self.ref_store.fail(k), "idempotency.fail")
        self.unexpected(got, "idempotency.fail", "fail")
        self.compare(key, "idempotency.fail")

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
    def ref_lock(self) -> Any:
        return self.ref.lock

    def expired_in_ref(self, key: str) -> bool:
        item = self.ref_lock._holders._items.get(key)
        return item is not None and self.now() >= item[1]

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
            self.diverge(
                "lock.expiry" if expired else "lock.release.token",
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
            self.diverge(
                "lock.expiry" if expired else "lock.extend.token",
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

    @precondition(lambda self: self.live())
    @rule(key=KEYS, ttl=st.sampled_from((0.0005, 1.5, 2, 60)))
    def claim(self, key: str, ttl: float) -> None:
        if not self.clock_controlled and ttl < 60:
            ttl = 60
        k = self.kk(key)
        item = self.ref.nonces._seen._items.get(k)  # type: ignore[union-attr]
        expired = item is not None and self.now() >= item[1]
        got = self.call(self.nonces.claim(k, ttl), "nonce.claim.once")
        want = self.call(self.ref.nonces.claim(k, ttl), "nonce.claim.once")  # type: ignore[union-attr]
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
