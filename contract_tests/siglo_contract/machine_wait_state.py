"""The wait machine's state and comparisons with the reference, and its steps that store
(records, checkpoints) or read; the lifecycle steps are in :mod:`siglo_contract.machine_waits`."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, precondition, rule

from siglo.adapter import Capability
from siglo.checkpoint import Checkpoint
from siglo.records import WaitRecord
from siglo.settings import DEFAULTS
from siglo_contract.machine_base import LOOK_ALIKES, ContractMachine, canon, nested_values
from siglo_memory.adapter import MemoryStorageAdapter

__all__ = [
    "CLAIMANTS",
    "EMBED_ONLY",
    "KEYS",
    "NAMESPACES",
    "STACKS",
    "WAIT_EXTRA",
    "WaitMachineBase",
]

KEYS = ("k1", "k2", "k:1", "*", "{k}", "ü名", "s1")
STACKS = ("s1", "s2", "s:1", "k1")
EMBED_ONLY = ("e1",)
NAMESPACES = st.sampled_from((None, "n", "n:x"))
CLAIMANTS = st.one_of(st.sampled_from(("holder", "c1", "c2", None)), st.sampled_from(LOOK_ALIKES))
WAIT_EXTRA = st.sampled_from(
    (
        {},
        {},
        {"customField": 0},
        {"x-vendor": [None, {}], "ünknown": ""},
        {"nullField": None},
        {"customField": False, "x-vendor": {"a": {"b": None}}},
        {"ünknown": "v", "nullField": []},
    )
)
"""Unknown wire fields of a wait record (kept by the wire format), falsy ones included."""


class WaitMachineBase(ContractMachine):
    """State, comparisons and storing steps of the wait machine
    (:class:`siglo_contract.machine_waits.WaitMachine`)."""

    RULE_IDS = (
        "wait.roundtrip",
        "wait.by-stack",
        "wait.checkpoint-fallback",
        "wait.claim.once",
        "wait.claim.refused",
        "wait.claim.expired",
        "wait.claim.lease",
        "wait.complete.claimant",
        "wait.release",
        "wait.cancel",
        "wait.cancel-workflow",
        "wait.retention",
        "waits.due",
        "ids.hostile",
    )

    saved = Bundle("saved")
    """Keys of saved records: lifecycle steps draw from it, so programs reach them."""
    claimed = Bundle("claimed")

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[str] = set()
        self.last_rule: dict[str, str] = {}
        self.holders: dict[str, tuple[str, str]] = {}
        """Correlation key → (reference claimant, backend claimant) of the last claim."""
        self.alias: dict[str, str] = {}
        """Backend-generated claimant id → the reference's, for comparisons."""
        self.cp_keys: set[tuple[str | None, str]] = set()

    @property
    def ref_adapter(self) -> MemoryStorageAdapter:
        adapter = self.ref.adapter
        assert isinstance(adapter, MemoryStorageAdapter)
        return adapter

    @property
    def lease_default(self) -> int:
        # Not given (the user-defaults profile): the backend's own default, which must be
        # siglo's.
        return int(self.session.target.options.get("claim_lease_ms", DEFAULTS.claim_lease_ms))

    def norm(self, rec: Any, backend_side: bool) -> Any:
        """A record comparable across sides: generated claimants aliased, and without
        times when the backend keeps its own clock."""
        if not isinstance(rec, WaitRecord):
            return rec
        if backend_side and rec.claimant_id in self.alias:
            rec = rec.replace(claimant_id=self.alias[rec.claimant_id])
        if not self.clock_controlled:
            rec = rec.replace(claimed_at=None, lease_expires_at=None, completed_at=None)
        return rec.replace(event_payload=canon(rec.event_payload))

    def norm_cp(self, cp: Any) -> Any:
        if isinstance(cp, Checkpoint) and not self.clock_controlled:
            return cp.replace(timestamp=0)
        return cp

    def explain(self, key: str, got: Any) -> str:
        """The rule behind the reference's answer to ``get_wait_record(key)``, given the
        backend's answer ``got``."""
        now = self.now()
        model = self.ref_adapter.model
        entry = model.wait_record(key)
        if entry is not None:
            if entry.live(now):
                return self.last_rule.get(key, "wait.roundtrip")
            if isinstance(got, WaitRecord) and got.correlation_key == key:
                return "wait.retention"
        latest = model.latest_wait_of_stack(key)
        latest_entry = None if latest is None else model.wait_record(latest)
        if latest_entry is not None:
            if latest_entry.live(now):
                return "wait.by-stack"
            if isinstance(got, WaitRecord) and got.correlation_key == latest:
                return "wait.retention"
        if any(stack == key for _, stack in self.cp_keys):
            return "wait.checkpoint-fallback"
        return "wait.roundtrip"

    def by_key(self, side: str, key: str) -> WaitRecord | None:
        """The record stored under correlation key ``key`` (through the public API, only
        when the reference knows the key has one, so no other index answers instead)."""
        adapter = self.backend.adapter if side == "backend" else self.ref.adapter
        out = self.call(adapter.get_wait_record(key), "wait.roundtrip")
        self.unexpected(out, "wait.roundtrip", f"get_wait_record({key!r})")
        value: WaitRecord | None = out.value
        return value

    def ref_has(self, key: str) -> bool:
        return self.ref_adapter.model.live_wait_record(key, self.now()) is not None

    def compare_get(self, key: str, rule_hint: str | None = None) -> None:
        got = self.call(self.backend.adapter.get_wait_record(key), "wait.roundtrip")
        want = self.call(self.ref.adapter.get_wait_record(key), "wait.roundtrip")
        self.unexpected(got, "wait.roundtrip", f"get_wait_record({key!r})")
        if self.tainted:
            return
        if self.norm(got.value, True) != self.norm(want.value, False):
            self.diverge(
                rule_hint or self.explain(key, got.value),
                f"get_wait_record({key!r}) {got!r}; reference {want!r}",
            )

    # -- rules --------------------------------------------------------------------------

    @precondition(lambda self: self.live())
    @rule(
        target=saved,
        key=st.sampled_from(KEYS),
        stack=st.sampled_from(STACKS),
        status=st.sampled_from(("waiting", "waiting", "waiting", "completed", "cancelled")),
        deadline=st.sampled_from(("none", "past", "recent", "now", "soon", "far", "far")),
        ttl=st.sampled_from(("default", "long", "short")),
        payload=nested_values,
        extra=WAIT_EXTRA,
    )
    def save(
        self,
        key: str,
        stack: str,
        status: Any,
        deadline: str,
        ttl: str,
        payload: Any,
        extra: dict[str, Any],
    ) -> Any:
        now = self.now()
        expires = {
            "none": None,
            "past": now - 600_000,
            # Deadlines of their own (due waits are ordered by them), and one exactly
            # now: a wait at its deadline is due.
            "recent": now - 1_000,
            "now": now,
            "far": now + 3_600_000,
            "soon": now + 2_000 if self.clock_controlled else None,
        }[deadline]
        ttl_ms = {
            "default": None,
            "long": 7_200_000,
            "short": 4_000 if self.clock_controlled else None,
        }[ttl]
        record = WaitRecord(
            correlation_key=self.kk(key),
            stack_id=self.kk(stack),
            # Records of un-namespaced stacks only: this machine looks records up by
            # key alone. Namespaced records: the wait.namespace.isolation check.
            namespace=None,
            status=status,
            step_id="step",
            event_type="evt",
            created_at=now,
            expires_at=expires,
            event_payload=payload,
            metadata={"m": [1]},
            extra=extra,
        )
        got = self.call(
            self.backend.adapter.save_wait_record(record, ttl_ms=ttl_ms), "wait.roundtrip"
        )
        want = self.call(self.ref.adapter.save_wait_record(record, ttl_ms=ttl_ms), "wait.roundtrip")
        self.unexpected(got, "wait.roundtrip", "save_wait_record")
        if self.tainted:
            return key
        assert want.ok, want
        self.keys.add(record.correlation_key)
        self.last_rule[record.correlation_key] = "wait.roundtrip"
        self.holders.pop(record.correlation_key, None)
        stored = self.by_key("backend", record.correlation_key)
        self.direct(
            stored is not None and self.norm(stored, True) == self.norm(record, False),
            "wait.roundtrip",
            f"saved {record!r}, read back {stored!r}",
        )
        self.compare_get(record.stack_id)
        return key

    @precondition(lambda self: self.live())
    @rule(key=st.sampled_from(KEYS + STACKS + EMBED_ONLY))
    def get(self, key: str) -> None:
        self.compare_get(self.kk(key))

    @precondition(lambda self: self.live() and self.declared(Capability.CHECKPOINTS))
    @rule(
        stack=st.sampled_from(STACKS + EMBED_ONLY),
        ns=NAMESPACES,
        status=st.sampled_from(("running", "waiting", "completed", "failed", "cancelled")),
        embed=st.booleans(),
    )
    def save_checkpoint(self, stack: str, ns: str | None, status: Any, embed: bool) -> None:
        key = (self.k(ns), self.kk(stack))
        current = self.ref_adapter.model.live_checkpoint(key, self.now())
        metadata = None
        if embed:
            embedded = WaitRecord(
                correlation_key=self.kk("embedded"),
                stack_id=key[1],
                namespace=key[0],
                event_type="evt",
            )
            metadata = {"waitRecord": embedded.to_wire()}
        cp = Checkpoint(
            stack_id=key[1],
            namespace=key[0],
            status=status,
            revision=(current.revision if current else 0) + 1,
            timestamp=self.now(),
            metadata=metadata,
        )
        got = self.call(self.backend.adapter.save_checkpoint(cp), "checkpoint.roundtrip")
        want = self.call(self.ref.adapter.save_checkpoint(cp), "checkpoint.roundtrip")
        if self.tainted:
            return
        if got.kind() != want.kind():
            self.diverge("checkpoint.occ.monotonic", f"save {got!r}; reference {want!r}")
        self.cp_keys.add(key)

    @precondition(lambda self: self.live() and self.clock_controlled)
    @rule(ms=st.sampled_from((1, 1_000, 1_500, 2_000, 4_000, 60_000)))
    def advance(self, ms: int) -> None:
        assert self.session.clock is not None
        self.session.clock.advance(ms)
