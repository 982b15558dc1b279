"""State machine of the wait-record rules: lifecycle, claims, leases, cancel, retention."""

from __future__ import annotations

from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import multiple, precondition, rule

from siglo.adapter import Capability
from siglo.errors import WaitRecordClaimError
from siglo.listing import MAX_PAGE_SIZE
from siglo.records import WaitRecord
from siglo.sentinel import MISSING
from siglo_contract.machine_base import (
    LOOK_ALIKES,
    canon,
    falsy_values,
    look_alike,
    nested_values,
)
from siglo_contract.machine_wait_state import (
    CLAIMANTS,
    EMBED_ONLY,
    KEYS,
    NAMESPACES,
    STACKS,
    WAIT_EXTRA,
    WaitMachineBase,
)

__all__ = ["WaitMachine"]

CLAIM_PAYLOADS = (*falsy_values, {"a": [1, {"b": None}]}, [[None]])
"""Event payloads a claim passes: falsy ones (``null`` included) and nested."""

saved = WaitMachineBase.saved
claimed = WaitMachineBase.claimed


class WaitMachine(WaitMachineBase):
    """Wait-record lifecycles: save, get by key / by stack / from the checkpoint, claim
    (with ``allow_expired``, payloads, leases), complete by the right and the wrong
    claimant, cancel and ``cancel_workflow``, with retention and deadlines on the clock."""

    @precondition(lambda self: self.live())
    @rule(
        target=claimed,
        key=st.one_of(saved, st.sampled_from(KEYS)),
        who=CLAIMANTS,
        allow_expired=st.booleans(),
        payload=st.one_of(st.just(MISSING), st.sampled_from(CLAIM_PAYLOADS), nested_values),
        lease=st.sampled_from(("default", "short", "long")),
    )
    def claim(
        self, key: str, who: str | None, allow_expired: bool, payload: Any, lease: str
    ) -> Any:
        ck = self.kk(key)
        lease_ms = {
            "default": None,
            "long": 600_000,
            "short": 1_500 if self.clock_controlled else None,
        }[lease]
        ref_who, be_who = self.claimants(ck, who)
        known = self.ref_has(ck)
        ref_pre = self.ref_adapter.model.live_wait_record(ck, self.now())
        pre = self.by_key("backend", ck) if known else None
        got = self.call(
            self.backend.adapter.claim_wait_record(
                ck, be_who, allow_expired=allow_expired, event_payload=payload, lease_ms=lease_ms
            ),
            "wait.claim.once",
        )
        want = self.call(
            self.ref.adapter.claim_wait_record(
                ck, ref_who, allow_expired=allow_expired, event_payload=payload, lease_ms=lease_ms
            ),
            "wait.claim.once",
        )
        self.unexpected(got, "wait.claim.once", "claim_wait_record")
        if self.tainted:
            return multiple()
        mine: WaitRecord | None = got.value
        theirs: WaitRecord | None = want.value
        now = self.now()
        # Why the reference answered as it did.
        reason = "wait.claim.once"
        entry = self.ref_adapter.model.wait_record(ck)
        if entry is not None and not entry.live(now):
            reason = "wait.retention"
        elif ref_pre is None or ref_pre.status in ("completed", "cancelled"):
            reason = "wait.claim.refused"
        elif ref_pre.status == "claimed" and ref_pre.claimant_id != ref_who:
            reason = "wait.claim.lease" if ref_pre.lease_expired(now) else "wait.claim.refused"
        elif ref_pre.status == "claimed":
            reason = "wait.claim.refused"  # the claimant renewing its lease
        if (
            reason in ("wait.claim.once", "wait.claim.lease")
            and ref_pre is not None
            and (ref_pre.is_expired(now))
        ):
            reason = "wait.claim.expired"
        note(f"# claim of a record {ref_pre and ref_pre.status} by {ref_who!r}: {reason}")
        if mine is not None and who is None and mine.claimant_id and theirs is not None:
            assert theirs.claimant_id is not None
            self.alias[mine.claimant_id] = theirs.claimant_id
        # Direct rules.
        if mine is not None and pre is not None and pre.status == "claimed":
            # Refusal first: a record held by another claimant under a live lease is
            # not handed over, so a wrong claimant on it is that rule's failure.
            self.direct(
                pre.claimant_id == be_who or pre.lease_expired(now) or pre.is_expired(now),
                "wait.claim.refused",
                f"{be_who!r} claimed a record held by {pre.claimant_id!r} under a live lease",
            )
        if mine is not None and not self.tainted:
            self.direct(
                mine.status == "claimed" and mine.correlation_key == ck,
                "wait.claim.once",
                f"claim returned {mine!r}, not a claimed record of {ck!r}",
            )
            self.direct(
                mine.claimant_id == be_who if be_who else bool(mine.claimant_id),
                "wait.claim.once",
                f"claimant_id {mine.claimant_id!r}, want {be_who!r}",
            )
            self.direct(
                mine.claimed_at is not None
                and mine.lease_expires_at == mine.claimed_at + (lease_ms or self.lease_default),
                "wait.claim.once",
                f"claimed_at {mine.claimed_at}, lease_expires_at {mine.lease_expires_at}, "
                f"lease {lease_ms or self.lease_default} ms",
            )
            if pre is not None:
                expected_payload = pre.event_payload if payload is MISSING else payload
                self.direct(
                    canon(mine.event_payload) == canon(expected_payload),
                    "wait.claim.once",
                    f"event_payload {mine.event_payload!r}, want {expected_payload!r}",
                )
                self.direct(
                    not pre.is_expired(now) or allow_expired,
                    "wait.claim.expired",
                    f"claimed a record past its deadline without allow_expired: {pre!r}",
                )
                self.direct(
                    pre.status not in ("completed", "cancelled"),
                    "wait.claim.refused",
                    f"claimed a {pre.status} record",
                )
            after = self.by_key("backend", ck)
            self.direct(
                after == mine,
                "wait.claim.once",
                f"claim returned {mine!r} but the store has {after!r}",
            )
        elif pre is not None:
            after = self.by_key("backend", ck)
            self.direct(
                after == pre,
                "wait.claim.refused",
                f"a refused claim changed {pre!r} into {after!r}",
            )
        if self.tainted:
            return multiple()
        if self.norm(mine, True) != self.norm(theirs, False):
            rule_id = reason
            if mine is not None and theirs is not None:
                rule_id = "wait.claim.once" if reason == "wait.claim.refused" else reason
            self.diverge(
                rule_id, f"claim_wait_record({ck!r}, {ref_who!r}) {got!r}; reference {want!r}"
            )
            return multiple()
        if theirs is not None and mine is not None:
            assert mine.claimant_id
            assert theirs.claimant_id
            self.holders[ck] = (theirs.claimant_id, mine.claimant_id)
            self.last_rule[ck] = reason if reason != "wait.claim.refused" else "wait.claim.once"
            return key
        return multiple()

    def claimants(self, ck: str, who: str | None) -> tuple[Any, Any]:
        """(reference, backend) claimant ids for ``who``: the holder of ``ck``, one that
        differs from the holder's only slightly, or a plain id (``None``: generated)."""
        if who == "holder":
            return self.holders.get(ck, ("c1", "c1"))
        if who in LOOK_ALIKES:
            ref_holder, be_holder = self.holders.get(ck, ("c1", "c1"))
            ref_id, be_id = look_alike(ref_holder, who), look_alike(be_holder, who)
            if be_id != ref_id:
                # A look-alike of an anonymous holder (each side generated its own id):
                # the same claimant on both sides, as the holders themselves are.
                self.alias[be_id] = ref_id
            return ref_id, be_id
        return who, who

    @precondition(lambda self: self.live())
    @rule(
        key=st.one_of(claimed, saved),
        who=st.one_of(
            st.sampled_from(("holder", "holder", "c1", "c2")), st.sampled_from(LOOK_ALIKES)
        ),
    )
    def complete(self, key: str, who: str) -> None:
        ck = self.kk(key)
        ref_who, be_who = self.claimants(ck, who)
        known = self.ref_has(ck)
        pre = self.by_key("backend", ck) if known else None
        got = self.call(
            self.backend.adapter.complete_wait_record(ck, be_who), "wait.complete.claimant"
        )
        want = self.call(
            self.ref.adapter.complete_wait_record(ck, ref_who), "wait.complete.claimant"
        )
        if self.tainted:
            return
        for out in (got,):
            if out.error is not None and not isinstance(out.error, WaitRecordClaimError):
                self.diverge("wait.complete.claimant", f"complete raised {out.error!r}")
                return
        if pre is not None:
            after = self.by_key("backend", ck)
            if got.ok:
                self.direct(
                    pre.status == "claimed" and pre.claimant_id == be_who,
                    "wait.complete.claimant",
                    f"{be_who!r} completed a record {pre.status} by {pre.claimant_id!r}",
                )
                self.direct(
                    after is not None and after.status == "completed",
                    "wait.complete.claimant",
                    f"after complete the record is {after!r}",
                )
            else:
                self.direct(
                    after == pre,
                    "wait.complete.claimant",
                    f"a refused complete changed {pre!r} into {after!r}",
                )
        if self.tainted:
            return
        entry = self.ref_adapter.model.wait_record(ck)
        if got.ok != want.ok:
            rule_id = (
                "wait.retention"
                if entry is not None and not entry.live(self.now())
                else "wait.complete.claimant"
            )
            self.diverge(
                rule_id, f"complete_wait_record({ck!r}, {be_who!r}) {got!r}; reference {want!r}"
            )
            return
        if want.ok:
            self.last_rule[ck] = "wait.complete.claimant"
        self.compare_get(ck)

    @precondition(lambda self: self.live())
    @rule(
        key=st.one_of(claimed, saved),
        who=st.one_of(
            st.sampled_from(("holder", "holder", "c1", "c2")), st.sampled_from(LOOK_ALIKES)
        ),
    )
    def release(self, key: str, who: str) -> None:
        """release_wait_record by the holder, another claimant or a look-alike (before
        and after the lease lapsed), vs the reference; a refused release changes nothing."""
        ck = self.kk(key)
        ref_who, be_who = self.claimants(ck, who)
        pre = self.by_key("backend", ck) if self.ref_has(ck) else None
        got = self.call(self.backend.adapter.release_wait_record(ck, be_who), "wait.release")
        want = self.call(self.ref.adapter.release_wait_record(ck, ref_who), "wait.release")
        self.unexpected(got, "wait.release", "release_wait_record")
        if self.tainted:
            return
        if pre is not None:
            after = self.by_key("backend", ck)
            if got.value is True:
                self.direct(
                    pre.status == "claimed" and pre.claimant_id == be_who,
                    "wait.release",
                    f"{be_who!r} released a record {pre.status} by {pre.claimant_id!r}",
                )
                self.direct(
                    after is not None
                    and after.status == "waiting"
                    and after.claimant_id is None
                    and after.lease_expires_at is None,
                    "wait.release",
                    f"after a release the record is {after!r}",
                )
            else:
                self.direct(
                    after == pre,
                    "wait.release",
                    f"a refused release by {be_who!r} changed {pre!r} into {after!r}",
                )
        if self.tainted:
            return
        if got.value != want.value:
            entry = self.ref_adapter.model.wait_record(ck)
            rule_id = (
                "wait.retention"
                if entry is not None and not entry.live(self.now())
                else "wait.release"
            )
            self.diverge(
                rule_id, f"release_wait_record({ck!r}, {be_who!r}) {got!r}; reference {want!r}"
            )
            return
        if want.value:
            self.last_rule[ck] = "wait.release"
        self.compare_get(ck)

    @precondition(lambda self: self.live() and self.declared(Capability.DUE_WAITS))
    @rule(limit=st.sampled_from((1, 2, 5)))
    def due(self, limit: int) -> None:
        """list_due_waits: this example's due records equal the reference's, earliest
        deadline first, and ``limit`` returns the first records of the whole list."""
        got = self.call(self.backend.adapter.list_due_waits(limit=MAX_PAGE_SIZE), "waits.due")
        want = self.call(self.ref.adapter.list_due_waits(limit=MAX_PAGE_SIZE), "waits.due")
        self.unexpected(got, "waits.due", "list_due_waits")
        if self.tainted:
            return
        records: list[WaitRecord] = got.value
        deadlines = [r.expires_at or 0 for r in records]
        self.direct(
            deadlines == sorted(deadlines),
            "waits.due",
            f"due waits not earliest deadline first: {deadlines}",
        )
        some = self.call(self.backend.adapter.list_due_waits(limit=limit), "waits.due")
        self.unexpected(some, "waits.due", "list_due_waits")
        if self.tainted:
            return
        self.direct(
            [r.expires_at for r in some.value] == [r.expires_at for r in records[:limit]],
            "waits.due",
            f"list_due_waits(limit={limit}) returned deadlines "
            f"{[r.expires_at for r in some.value]}; the earliest due are "
            f"{[r.expires_at for r in records[:limit]]}",
        )
        if self.tainted:
            return
        mine = {r.correlation_key: r for r in records if r.correlation_key.startswith(self.prefix)}
        theirs = {r.correlation_key: r for r in want.value}
        for ck in sorted(mine.keys() ^ theirs.keys()):
            entry = self.ref_adapter.model.wait_record(ck)
            gone = entry is not None and not entry.live(self.now())
            self.diverge(
                "wait.retention" if gone and ck in mine else "waits.due",
                f"list_due_waits: {ck!r} {'listed' if ck in mine else 'not listed'}; the "
                f"reference {'did not list it' if ck in mine else 'listed ' + repr(theirs[ck])}"
                f" (the backend has {self.by_key('backend', ck)!r})",
            )
            return
        for ck, record in sorted(mine.items()):
            if self.norm(record, True) != self.norm(theirs[ck], False):
                self.diverge(
                    "waits.due",
                    f"list_due_waits listed {record!r}; the reference {theirs[ck]!r}",
                )
                return

    @precondition(lambda self: self.live())
    @rule(key=st.one_of(saved, claimed))
    def cancel(self, key: str) -> None:
        ck = self.kk(key)
        known = self.ref_has(ck)
        pre = self.by_key("backend", ck) if known else None
        got = self.call(self.backend.adapter.cancel_wait_record(ck), "wait.cancel")
        want = self.call(self.ref.adapter.cancel_wait_record(ck), "wait.cancel")
        self.unexpected(got, "wait.cancel", "cancel_wait_record")
        if self.tainted:
            return
        if pre is not None:
            after = self.by_key("backend", ck)
            if got.value is True:
                self.direct(
                    pre.status in ("waiting", "claimed")
                    and after is not None
                    and after.status == "cancelled",
                    "wait.cancel",
                    f"cancel returned True: {pre!r} → {after!r}",
                )
            else:
                self.direct(
                    after == pre,
                    "wait.cancel",
                    f"cancel returned {got.value!r} but changed {pre!r} into {after!r}",
                )
        if self.tainted:
            return
        if got.value is not want.value:
            entry = self.ref_adapter.model.wait_record(ck)
            rule_id = (
                "wait.retention"
                if entry is not None and not entry.live(self.now())
                else "wait.cancel"
            )
            self.diverge(rule_id, f"cancel_wait_record({ck!r}) {got!r}; reference {want!r}")
            return
        if want.value:
            self.last_rule[ck] = "wait.cancel"
        self.compare_get(ck)

    @precondition(lambda self: self.live())
    @rule(
        key=saved,
        who=CLAIMANTS,
        completer=st.one_of(st.sampled_from(("holder", "c2")), st.sampled_from(LOOK_ALIKES)),
        lapse=st.booleans(),
        then_cancel=st.booleans(),
    )
    def claim_complete(
        self, key: str, who: str | None, completer: str, lapse: bool, then_cancel: bool
    ) -> None:
        """A whole lifecycle in one step (hypothesis enables a random subset of rules per
        example, so separate claim and complete steps rarely meet); with ``lapse``, the
        complete comes after the claim's lease ran out."""
        lapse = lapse and self.clock_controlled
        self.claim(key, who, False, MISSING, "short" if lapse else "default")
        if lapse and not self.tainted:
            self.advance(2_000)
        if not self.tainted:
            self.complete(key, completer)
        if then_cancel and not self.tainted:
            self.cancel(key)

    @precondition(lambda self: self.live())
    @rule(stack=st.sampled_from(STACKS + EMBED_ONLY), ns=NAMESPACES)
    def cancel_workflow(self, stack: str, ns: str | None) -> None:
        sid, nsk = self.kk(stack), self.k(ns)
        got = self.call(self.backend.adapter.cancel_workflow(sid, nsk), "wait.cancel-workflow")
        want = self.call(self.ref.adapter.cancel_workflow(sid, nsk), "wait.cancel-workflow")
        self.unexpected(got, "wait.cancel-workflow", "cancel_workflow")
        if self.tainted:
            return
        assert want.ok, want
        for ck in sorted(self.keys):
            rec = self.ref_adapter.model.live_wait_record(ck, self.now())
            if rec is not None and rec.stack_id == sid and rec.namespace == nsk:
                self.last_rule[ck] = "wait.cancel-workflow"
            self.compare_get(ck, "wait.cancel-workflow")
            if self.tainted:
                return
        if self.declared(Capability.CHECKPOINTS):
            for cns, cstack in sorted(self.cp_keys, key=repr):
                mine = self.call(
                    self.backend.adapter.get_checkpoint(cstack, cns, fallback=False),
                    "wait.cancel-workflow",
                )
                theirs = self.ref_adapter.model.live_checkpoint((cns, cstack), self.now())
                if self.norm_cp(mine.value) != self.norm_cp(theirs):
                    self.diverge(
                        "wait.cancel-workflow",
                        f"after cancel_workflow({sid!r}, {nsk!r}) the checkpoint at "
                        f"({cns!r}, {cstack!r}) is {mine!r}; reference {theirs!r}",
                    )
                    return

    @precondition(lambda self: self.live())
    @rule(
        stack=st.sampled_from(STACKS),
        keys=st.lists(st.sampled_from(KEYS), min_size=2, max_size=4, unique=True),
        steps=st.lists(
            st.sampled_from(("open", "open", "claim", "claim", "lapse", "done", "cancel")),
            min_size=4,
            max_size=4,
        ),
        payloads=st.lists(st.sampled_from(CLAIM_PAYLOADS), min_size=4, max_size=4),
        extra=WAIT_EXTRA,
        rival=st.sampled_from(LOOK_ALIKES),
        then=st.sampled_from(("cancel_workflow", "cancel_workflow", "nothing")),
    )
    def several_waits(
        self,
        stack: str,
        keys: list[str],
        steps: list[str],
        payloads: list[Any],
        extra: dict[str, Any],
        rival: str,
        then: str,
    ) -> None:
        """Two to four waits of one stack at once, in every state (waiting, claimed,
        claimed with a lapsed lease, completed, cancelled), claimed with payloads of any
        shape (falsy ones included) and raced by a claimant whose id differs from the
        holder's only slightly; then most often ``cancel_workflow`` of that stack:
        separate steps rarely leave a stack with two open waits."""
        lapse = self.clock_controlled and "lapse" in steps[: len(keys)]
        raced = False
        for key, step, payload in zip(keys, steps, payloads, strict=False):
            if self.tainted:
                return
            self.save(key, stack, "waiting", "far", "long", {"stored": key}, extra)
            if self.tainted:
                return
            if step in ("claim", "done") or (step == "lapse" and lapse):
                short = step == "lapse"
                self.claim(key, f"c-{key}", False, payload, "short" if short else "long")
                if not raced and not self.tainted:
                    # One race per step: the look-alike claims, then completes.
                    raced = True
                    self.claim(key, rival, False, MISSING, "long")
                    if not self.tainted:
                        self.complete(key, rival)
                if step == "done" and not self.tainted:
                    self.complete(key, "holder")
            elif step == "cancel":
                self.cancel(key)
        if lapse and not self.tainted:
            self.advance(2_000)
        if then == "cancel_workflow" and not self.tainted:
            self.cancel_workflow(stack, None)
