"""State machines of the step cache, the context stream and cache events."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from siglo.adapter import Capability
from siglo.locking import namespaced_key
from siglo.records import CACHE_EVENT_TYPES, CacheEvent, ContextChangeEvent
from siglo.sentinel import MISSING
from siglo_contract.machine_base import (
    HOSTILE_IDS,
    ContractMachine,
    canon,
    falsy_values,
    json_values,
)
from siglo_memory.adapter import MemoryStorageAdapter

__all__ = ["CacheMachine", "ContextMachine"]

CACHE_KEYS = st.one_of(st.sampled_from(("a", "b")), st.sampled_from(HOSTILE_IDS))
VALUES = st.one_of(st.sampled_from(falsy_values), json_values)
STREAM_FIELDS: tuple[str, ...] = (
    *(f"f{i}" for i in range(12)),
    "f:g",
    "F0",
    "ü",
    "名前",
    "🙂",
    "a b",
    "*",
    "{f}",
    "%_",
    "y" * 200,
    "y" * 201,
)
"""Context field names (23): enough for streams of many fields, with ``:``, unicode, case
and length look-alikes."""
BURST_VALUES: tuple[Any, ...] = (*falsy_values, 1, "v", {"n": [None]}, [0, ""], 0.5)
"""Values of a burst, falsy ones included."""


class CacheMachine(ContractMachine):
    """Step-cache sets and gets, falsy values and ``None`` included, TTLs on the clock,
    and cache events in between (which must change nothing)."""

    RULE_IDS = (
        "cache.roundtrip",
        "cache.falsy-hit",
        "cache.miss",
        "cache.expiry",
        "cache-events.accepted",
        "ids.hostile",
    )

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[str] = set()

    @property
    def ref_adapter(self) -> MemoryStorageAdapter:
        adapter = self.ref.adapter
        assert isinstance(adapter, MemoryStorageAdapter)
        return adapter

    def compare(self, key: str, rule_hint: str | None = None) -> None:
        got = self.call(self.backend.adapter.get_cached_step(key), "cache.roundtrip")
        want = self.call(self.ref.adapter.get_cached_step(key), "cache.roundtrip")
        self.unexpected(got, "cache.roundtrip", f"get_cached_step({key!r})")
        if self.tainted:
            return
        same = (got.value is MISSING) == (want.value is MISSING) and (
            got.value is MISSING or canon(got.value) == canon(want.value)
        )
        if same:
            return
        what = f"get_cached_step({key!r}) {got!r}; reference {want!r}"
        if rule_hint is not None:
            self.diverge(rule_hint, what)
        elif want.value is MISSING:
            entry = self.ref_adapter.model.cached_step(namespaced_key(key, None))
            self.diverge("cache.expiry" if entry is not None else "cache.miss", what)
        elif got.value is MISSING and not want.value:
            self.diverge("cache.falsy-hit", what)
        else:
            self.diverge("cache.roundtrip", what)

    @precondition(lambda self: self.live())
    @rule(key=CACHE_KEYS, value=VALUES, ttl=st.sampled_from(("default", "long", "short")))
    def set(self, key: str, value: Any, ttl: str) -> None:
        ck = self.kk(key)
        ttl_ms = {
            "default": None,
            "long": 3_600_000,
            "short": 2_000 if self.clock_controlled else None,
        }[ttl]
        got = self.call(self.backend.adapter.set_cached_step(ck, value, ttl_ms), "cache.roundtrip")
        want = self.call(self.ref.adapter.set_cached_step(ck, value, ttl_ms), "cache.roundtrip")
        self.unexpected(got, "cache.roundtrip", "set_cached_step")
        if self.tainted:
            return
        assert want.ok, want
        self.keys.add(ck)
        read = self.call(self.backend.adapter.get_cached_step(ck), "cache.roundtrip")
        if read.value is MISSING:
            self.direct(
                False,
                "cache.falsy-hit" if not value else "cache.roundtrip",
                f"set {value!r} under {ck!r}, read back MISSING",
            )
        else:
            self.direct(
                canon(read.value) == canon(value),
                "cache.roundtrip",
                f"set {value!r} under {ck!r}, read back {read.value!r}",
            )

    @precondition(lambda self: self.live())
    @rule(key=CACHE_KEYS)
    def get(self, key: str) -> None:
        self.compare(self.kk(key))

    @precondition(lambda self: self.live() and self.declared(Capability.CACHE_EVENTS))
    @rule(
        key=CACHE_KEYS,
        kind=st.sampled_from(sorted(CACHE_EVENT_TYPES)),
        ttl=st.one_of(st.none(), st.integers(1, 10**9)),
    )
    def cache_event(self, key: str, kind: Any, ttl: int | None) -> None:
        ck = self.kk(key)
        event = CacheEvent(
            type=kind,
            key=ck,
            timestamp=self.now(),
            stack_id=self.kk("s"),
            step_id="step",
            ttl_ms=ttl,
        )
        got = self.call(self.backend.adapter.on_cache_event(event), "cache-events.accepted")
        self.call(self.ref.adapter.on_cache_event(event), "cache-events.accepted")
        self.unexpected(got, "cache-events.accepted", "on_cache_event")
        for k in sorted(self.keys | {ck}):
            self.compare(k, "cache-events.accepted")

    @precondition(lambda self: self.live() and self.clock_controlled)
    @rule(ms=st.sampled_from((1, 1_999, 2_000, 300_000)))
    def advance(self, ms: int) -> None:
        assert self.session.clock is not None
        self.session.clock.advance(ms)


class ContextMachine(ContractMachine):
    """Context-change events (sets and deletes) read back per ``(namespace, stack, step)``."""

    RULE_IDS = ("context.stream", "ids.hostile")

    def __init__(self) -> None:
        super().__init__()
        self.streams: set[tuple[str, str, str | None]] = set()
        self.bursts = 0

    def compare(self, stack: str, step: str, ns: str | None) -> None:
        got = self.call(self.backend.adapter.get_context_changes(stack, step, ns), "context.stream")
        want = self.call(self.ref.adapter.get_context_changes(stack, step, ns), "context.stream")
        self.unexpected(got, "context.stream", "get_context_changes")
        if self.tainted:
            return
        if canon(got.value) != canon(want.value):
            self.diverge(
                "context.stream",
                f"get_context_changes({stack!r}, {step!r}, {ns!r}) {got!r}; reference {want!r}",
            )

    @precondition(lambda self: self.live())
    @rule(
        stack=st.sampled_from(("s", "s:1", "*")),
        step=st.sampled_from(("p", "p:1", "{p}")),
        ns=st.sampled_from((None, "n", "n:s")),
        field=st.sampled_from(STREAM_FIELDS),
        delete=st.booleans(),
        value=VALUES,
    )
    def change(
        self, stack: str, step: str, ns: str | None, field: str, delete: bool, value: Any
    ) -> None:
        self.send(stack, step, ns, field, delete, value)
        for s, p, n in sorted(self.streams, key=repr):
            self.compare(s, p, n)

    # At most two bursts a program: each writes a dozen or more changes.
    @precondition(lambda self: self.live() and self.bursts < 2)
    @rule(
        stack=st.sampled_from(("s", "s:1", "*")),
        step=st.sampled_from(("p", "p:1", "{p}")),
        ns=st.sampled_from((None, "n", "n:s")),
        fields=st.lists(st.sampled_from(STREAM_FIELDS), min_size=8, max_size=20, unique=True),
        offset=st.integers(0, len(BURST_VALUES) - 1),
        again=st.lists(
            st.tuples(st.sampled_from(STREAM_FIELDS), st.sampled_from((False, False, True))),
            max_size=4,
        ),
    )
    def burst(
        self,
        stack: str,
        step: str,
        ns: str | None,
        fields: list[str],
        offset: int,
        again: list[tuple[str, bool]],
    ) -> None:
        """Many fields set on one stream in one step, then some of them set again or
        deleted: single changes from a few names never grow a stream past a handful."""
        self.bursts += 1
        # Values cycle through a fixed list (falsy ones included) from a drawn offset:
        # drawing one per field would cost more than the calls.
        n = len(BURST_VALUES)
        for i, field in enumerate(fields):
            self.send(stack, step, ns, field, False, BURST_VALUES[(offset + i) % n])
            if self.tainted:
                return
        for i, (field, delete) in enumerate(again):
            self.send(stack, step, ns, field, delete, BURST_VALUES[(offset + 7 * i + 3) % n])
            if self.tainted:
                return
        self.compare(self.kk(stack), step, self.k(ns))

    def send(
        self, stack: str, step: str, ns: str | None, field: str, delete: bool, value: Any
    ) -> None:
        event = ContextChangeEvent(
            stack_id=self.kk(stack),
            step_id=step,
            key=field,
            timestamp=self.now(),
            value=None if delete else value,
            op="delete" if delete else "set",
            namespace=self.k(ns),
        )
        got = self.call(self.backend.adapter.on_context_change(event), "context.stream")
        self.call(self.ref.adapter.on_context_change(event), "context.stream")
        self.unexpected(got, "context.stream", "on_context_change")
        self.streams.add((event.stack_id, step, event.namespace))

    @precondition(lambda self: self.live())
    @rule(
        stack=st.sampled_from(("s", "s:1", "*")),
        step=st.sampled_from(("p", "p:1", "{p}")),
        ns=st.sampled_from((None, "n", "n:s")),
    )
    def read(self, stack: str, step: str, ns: str | None) -> None:
        self.compare(self.kk(stack), step, self.k(ns))
