"""Checks and rule violations: how a check names the rules it checks and the one it broke."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NoReturn

from siglo.adapter import Capability
from siglo.backend import Backend
from siglo.checkpoint import Checkpoint
from siglo_contract.rules import rule as lookup_rule

if TYPE_CHECKING:
    from hypothesis.stateful import RuleBasedStateMachine

    from siglo_contract.target import Session

__all__ = [
    "CHECK_ATTRIBUTE",
    "Check",
    "CheckContext",
    "EVIDENCE_DIRECT",
    "EVIDENCE_DIVERGENCE",
    "EVIDENCE_FOCUSED",
    "RuleViolation",
    "check",
    "expect",
    "fail",
    "violation_type",
]


EVIDENCE_FOCUSED: Final = 3
"""A focused check saw the rule broken by a call made for that rule."""
EVIDENCE_DIRECT: Final = 2
"""A state machine saw the rule broken on the backend alone."""
EVIDENCE_DIVERGENCE: Final = 1
"""A state machine saw the backend disagree with the reference and named the likeliest rule."""


CHECK_TIMEOUT_S = 300.0
"""How long a focused check, or one call of a state machine, may take: far more than any
takes against a working backend (the slowest, racing processes, a few seconds), so a
call that never returns fails its check, naming the rule being checked, instead of
hanging the run (a black-box auditor: a plugin call awaiting for ever hung `siglo
check` until it was killed). Read when used, so a test may make it shorter."""


class RuleViolation(AssertionError):
    """A backend broke rule :attr:`rule_id`; the message says how.

    :attr:`evidence` says how directly the failing call shows it (``EVIDENCE_*``): when one
    bug breaks several rules, the report names the best-evidenced one as the primary
    failure and the others as its consequences.
    """

    rule_id: str = ""
    evidence: int = EVIDENCE_FOCUSED


_VIOLATION_TYPES: dict[str, type[RuleViolation]] = {}


def violation_type(rule_id: str) -> type[RuleViolation]:
    """One exception class per rule, so hypothesis never shrinks one rule's failure into
    another's (it tells failures apart by exception type and location)."""
    if rule_id not in _VIOLATION_TYPES:
        lookup_rule(rule_id)  # a typo in a rule id is a bug in the suite
        name = "Violation_" + rule_id.replace(".", "_").replace("-", "_")
        _VIOLATION_TYPES[rule_id] = type(name, (RuleViolation,), {"rule_id": rule_id})
    return _VIOLATION_TYPES[rule_id]


def fail(rule_id: str, message: str, *, evidence: int = EVIDENCE_FOCUSED) -> NoReturn:
    """Raise the violation of ``rule_id``."""
    exc = violation_type(rule_id)(f"[{rule_id}] {message}")
    exc.evidence = evidence
    raise exc


def expect(condition: object, rule_id: str, message: str) -> None:
    """Raise the violation of ``rule_id`` unless ``condition`` holds."""
    if not condition:
        fail(rule_id, message)


@dataclass
class CheckContext:
    """What an async check gets: a backend on isolated storage and helpers."""

    session: Session
    backend: Backend
    prefix: str
    current_rule: str | None = None
    """The rule of the step running now: an unexpected error is blamed on it."""

    def about(self, rule_id: str) -> None:
        """Start a step of the check that exercises ``rule_id``; an unexpected error
        (not a violation) from here on fails that rule, not the check's first one."""
        lookup_rule(rule_id)
        self.current_rule = rule_id

    def id(self, name: str) -> str:
        """``name`` made unique to this check (every id a check uses goes through here)."""
        return self.prefix + name

    @property
    def clock_controlled(self) -> bool:
        """Whether :meth:`pass_time` moves a manual clock (else it sleeps)."""
        return self.session.clock is not None

    def now_ms(self) -> int:
        """The backend's now (the manual clock, or wall time)."""
        if self.session.clock is not None:
            return self.session.clock.now_ms()
        import time

        return time.time_ns() // 1_000_000

    async def pass_time(self, ms: int) -> None:
        """Let ``ms`` milliseconds pass for the backend: advance its clock, or sleep.

        Real sleeps add a margin so server-side expiry (Redis PX) has surely happened.
        """
        if self.session.clock is not None:
            self.session.clock.advance(ms)
        else:
            await asyncio.sleep(ms / 1000 + 0.05)

    def checkpoint(self, stack: str, revision: int, **fields: Any) -> Checkpoint:
        """A checkpoint of ``stack`` (an id already made with :meth:`id`) stamped now."""
        return Checkpoint(stack_id=stack, revision=revision, timestamp=self.now_ms(), **fields)

    def short_ttl_ms(self) -> int:
        """A TTL that :meth:`pass_time` can outlast quickly but that outlives a few calls."""
        return 1_000 if self.session.clock is not None else 300


AsyncCheck = Callable[[CheckContext], Awaitable[None]]


@dataclass
class Check:
    """One check of the suite: an async function, or a state machine.

    ``rules`` are the rule ids it checks (a failure it raises names one of them);
    ``requires`` the capabilities it needs beyond its rules' own.
    """

    name: str
    rules: tuple[str, ...]
    requires: frozenset[Capability] = frozenset()
    fn: AsyncCheck | None = None
    machine: Callable[[], type[RuleBasedStateMachine]] | None = None
    doc: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def capabilities(self) -> frozenset[Capability]:
        """Every capability this check needs (its rules' and its own)."""
        caps = set(self.requires)
        if self.machine is not None:
            # A machine guards its optional parts with preconditions.
            return frozenset(caps)
        for rule_id in self.rules:
            cap = lookup_rule(rule_id).capability
            if cap is not None:
                caps.add(cap)
        return frozenset(caps)


CHECK_ATTRIBUTE: Final = "siglo_contract_check"
"""The attribute :func:`check` sets on a check function (collected by ``checks.all_checks``)."""


def check(
    *rule_ids: str, requires: tuple[Capability, ...] = ()
) -> Callable[[AsyncCheck], AsyncCheck]:
    """Declare an async check of ``rule_ids``."""
    for rule_id in rule_ids:
        lookup_rule(rule_id)

    def register(fn: AsyncCheck) -> AsyncCheck:
        # Marked, not appended to a global list: collecting from the modules stays right
        # when a test harness re-imports them.
        setattr(
            fn,
            CHECK_ATTRIBUTE,
            Check(
                name=fn.__name__,
                rules=rule_ids,
                requires=frozenset(requires),
                fn=fn,
                doc=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
            ),
        )
        return fn

    return register
