"""The base of the suite's state machines: the backend under test against the reference.

Each example gets a backend from the run's :class:`~siglo_contract.target.Session`
and a fresh in-memory reference backend, applies the same random program to both, and
requires the same observable results at every step. The machines also assert rules
directly, so a bug the reference shares is still caught. All ids go through :meth:`k`,
which prefixes them with the example's random prefix (cheap isolation on shared storage).

Async calls run on the run's event loop, one ``run_until_complete`` per call: hypothesis
drives the machine synchronously, and backends bound to that loop keep working.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Final, TypeVar

import orjson
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from siglo.adapter import Capability
from siglo.backend import Backend
from siglo.errors import CapabilityNotSupportedError
from siglo_contract import registry
from siglo_contract.registry import EVIDENCE_DIRECT, EVIDENCE_DIVERGENCE, fail
from siglo_contract.target import Session, new_prefix

__all__ = [
    "FIELD_NAMES",
    "HOSTILE_IDS",
    "LOOK_ALIKES",
    "ContractMachine",
    "Outcome",
    "canon",
    "json_values",
    "look_alike",
    "look_alikes",
    "nested_values",
    "values",
]

T = TypeVar("T")

HOSTILE_IDS: Final = (
    "a",
    "b",
    "a:b",
    "a*",
    "*",
    "a?",
    "[a]",
    "{a}",
    "'a'",
    '"a"',
    "a%",
    "a_",
    "a\\b",
    "a b",
    "ü名🙂",
    "x" * 1000,
)
"""Logical ids the machines draw from: ``:``, globs, hash tags, quotes, SQL LIKE
wildcards, backslashes, spaces, unicode and a very long id (``ids.hostile``)."""

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.sampled_from([0.5, -1.25, 1e10]),
    st.text(max_size=8).filter(lambda s: "\x00" not in s),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(
            st.text(max_size=5).filter(lambda s: "\x00" not in s), children, max_size=3
        ),
    ),
    max_leaves=6,
)
"""JSON data, falsy values (``None``, ``0``, ``False``, ``""``, ``[]``, ``{}``) included."""

falsy_values: Final[tuple[Any, ...]] = (None, 0, False, "", [], {})

FIELD_NAMES = st.sampled_from(
    ("step", "a", "b:c", "::", "ü名🙂", "k 1", "0", "null", "x" * 300, "{h}", "*", "%_")
)
"""Names of object members the machines generate: ``:``, unicode, spaces, long, key-like."""
values = st.one_of(st.sampled_from(falsy_values), json_values)
"""JSON data with the falsy values drawn often."""
SHAPES: Final[tuple[Any, ...]] = (
    *falsy_values,
    1,
    -(2**53),
    0.5,
    "ü名🙂",
    "x" * 300,
    [None],
    [0, False, "", [], {}],
    [[{"a": None}], []],
    {"a": None},
    {"a": {"b": None, "c": 0}},
    {"b:c": {"::": [None, {"d": False}]}},
    {"ü名🙂": "", "k 1": []},
    {"null": {}, "0": {"x" * 300: None}},
    {"a": [1, {"b": {"c": [None]}}], "e": {"f": {"g": {}}}},
)
"""Values of fixed shapes: falsy ones, nested objects and lists with ``null`` and falsy
members, keys with ``:``, unicode, spaces and 300 characters."""
nested_values = st.one_of(st.sampled_from(SHAPES), json_values)
"""Values of any shape: the fixed ones above half the time (cheap to draw), else random
JSON data."""

LOOK_ALIKES: Final = ("~case", "~prefix", "~suffix", "~space", "~lead", "~cut")
"""Ways a claimant id or owner token can differ from the holder's only slightly."""


def look_alike(holder: str, how: str) -> str:
    """An id that differs from ``holder`` only slightly (``how``: one of
    :data:`LOOK_ALIKES`), never equal to it."""
    if how == "~case":
        swapped = holder.swapcase()
        return swapped if swapped != holder else holder + "X"
    if how == "~prefix":
        return "x" + holder
    if how == "~suffix":
        return holder + "2"
    if how == "~space":
        return holder + " "
    if how == "~lead":
        return " " + holder
    return holder[:-1] if len(holder) > 1 else holder + holder


def look_alikes(holder: str) -> tuple[str, ...]:
    """Every look-alike of ``holder`` (:func:`look_alike` of each of :data:`LOOK_ALIKES`):
    the focused checks try them all, so no look-alike is left to a seed's luck."""
    return tuple(look_alike(holder, how) for how in LOOK_ALIKES)


def canon(value: Any) -> bytes:
    """A canonical encoding, so ``0`` and ``False`` differ and key order does not matter."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


class Outcome:
    """What a call did: returned ``value`` or raised ``error``."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    @property
    def ok(self) -> bool:
        return self.error is None

    def kind(self) -> str:
        return "ok" if self.error is None else type(self.error).__name__

    def __repr__(self) -> str:
        return f"returned {self.value!r}" if self.error is None else f"raised {self.error!r}"


class ContractMachine(RuleBasedStateMachine):
    """Backend under test vs reference; subclasses add rules for one area of the contract."""

    session: ClassVar[Session]
    loop: ClassVar[asyncio.AbstractEventLoop]
    skip: ClassVar[frozenset[str]] = frozenset()
    """Rules already reported failing in this run: a divergence on one of them ends the
    comparisons of that example instead of failing again, so other rules get a chance."""

    def __init__(self) -> None:
        super().__init__()
        self._cm: AbstractAsyncContextManager[Backend] = self.session.backend()
        self.backend: Backend = self.run(self._cm.__aenter__())
        self.ref: Backend = self.session.reference()
        # The reference keeps to the document limit the backend declares: a save its
        # size guard rightly refuses (checkpoint.size.guard) is refused by both, not a
        # divergence (a program's grown documents pass 64 KiB).
        self.ref.raw_adapter.max_document_bytes = self.backend.raw_adapter.max_document_bytes
        self.prefix = new_prefix()
        self.tainted = False

    # -- plumbing -----------------------------------------------------------------------

    @classmethod
    def declared(cls, capability: Capability) -> bool:
        return capability in cls.session.target.capabilities

    @property
    def clock_controlled(self) -> bool:
        return self.session.clock is not None

    def now(self) -> int:
        """Now, for generating times: the manual clock (the reference's, too)."""
        if self.session.clock is not None:
            return self.session.clock.now_ms()
        return self.ref.adapter.clock.now_ms()  # type: ignore[attr-defined,no-any-return]

    def run(self, awaitable: Awaitable[T]) -> T:
        # Bounded as a focused check is: a call that never returns is a TimeoutError
        # the machine judges, not a hung run.
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, registry.CHECK_TIMEOUT_S))

    def call(self, awaitable: Awaitable[Any], rule_id: str) -> Outcome:
        """Run one call and return what it did (errors included: the caller judges them).

        A declared method that says it is not supported fails ``capability.declared``
        only as a divergence: the focused check of that rule calls every method and is
        the better witness, while a method refusing some inputs this way breaks the rule
        the machine was exercising.
        """
        try:
            return Outcome(self.run(awaitable))
        except CapabilityNotSupportedError as exc:
            return Outcome(error=exc)
        except AssertionError:
            raise
        except Exception as exc:
            return Outcome(error=exc)

    def k(self, name: str | None) -> str | None:
        """The real id of logical id ``name`` in this example (``None`` stays ``None``)."""
        return None if name is None else self.prefix + name

    def kk(self, name: str) -> str:
        return self.prefix + name

    def diverge(self, rule_id: str, message: str, evidence: int = EVIDENCE_DIVERGENCE) -> None:
        """The backend disagrees with the reference; ``rule_id`` explains the outcome."""
        if rule_id in self.skip:
            self.tainted = True
            note(f"(divergence on {rule_id}, already reported; comparisons stop here)")
            return
        fail(rule_id, message, evidence=evidence)

    def direct(self, condition: object, rule_id: str, message: str) -> None:
        """A rule asserted on the backend alone (catches bugs the reference shares)."""
        if not condition:
            self.diverge(rule_id, message, EVIDENCE_DIRECT)

    def unexpected(self, outcome: Outcome, rule_id: str, what: str) -> None:
        """Fail ``rule_id`` if ``outcome`` is an error the contract does not allow here."""
        if outcome.error is not None:
            self.diverge(rule_id, f"{what} raised {outcome.error!r}")

    def teardown(self) -> None:
        try:
            self.run(self._cm.__aexit__(None, None, None))
        finally:
            self.run(self.ref.aclose())

    def live(self) -> bool:
        return not self.tainted

    @precondition(lambda self: self.tainted)
    @rule()
    def idle(self) -> None:
        """The only step left once an already-reported rule diverged."""
