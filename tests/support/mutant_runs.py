"""Run the contract suite against one mutant exactly as a third party runs it (every rule,
the default profile, one seed), in a worker process, and say whether the report's primary
failure is the rule the mutant breaks.

A run is *trimmed* unless asked for whole, without changing the verdict:

1. the focused checks (not the state machines) of the mutant's own rule run first;
2. if they fail that rule with focused evidence (a call made for that rule, the highest
   evidence there is), only a focused failure of a *more basic* rule can outrank it — a
   state machine's evidence is at most direct (``siglo_contract.runner`` caps it), and
   among equals the most basic rule is primary (``rules.primary_order``) — so the focused
   checks of a rule before the mutant's in that order run, and the rest, every state
   machine among them, are skipped (each check seeds its own randomness: which others run
   does not change it);
3. otherwise the whole suite runs, as without trimming.

The state machines are nine tenths of a run's time against the in-memory mutants
(``KeepsWaitsForever``: its focused checks fail it in 0.01 s, the machines over its rule
take 14 s).

The primary failure is then chosen over every failure seen, exactly as
:attr:`siglo_contract.runner.Report.primary` chooses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mutants import BY_NAME

from siglo_contract.registry import EVIDENCE_FOCUSED, Check
from siglo_contract.rules import primary_order
from siglo_contract.runner import Report, RuleResult, run_contract


@dataclass(frozen=True)
class MutantRun:
    """What one run of the suite against a mutant found."""

    name: str
    rule_id: str
    seed: int
    primary: str | None
    failed: tuple[str, ...]
    detail: str
    seconds: float
    trimmed: bool = False
    """Whether the state machines were skipped (step 2 of the module's docstring)."""

    @property
    def killed(self) -> bool:
        """Killed with the right rule as the primary failure."""
        return self.primary == self.rule_id


def _merged(first: Report, rest: Report) -> Report:
    """One report of two runs of disjoint checks: a rule failed in either is failed, with
    the better evidence of the two."""
    results: dict[str, RuleResult] = {}
    for rule_id, a in first.results.items():
        b = rest.results[rule_id]
        failed = [r for r in (a, b) if r.verdict == "FAIL"]
        if failed:
            results[rule_id] = max(failed, key=lambda r: r.evidence)
        else:
            results[rule_id] = a if a.verdict == "pass" else b
    return Report(first.target, first.seed, first.profile, results, first.seconds + rest.seconds)


def run_mutant(name: str, seed: int, whole: bool = False) -> MutantRun:
    """``siglo check`` of mutant ``name`` with ``seed`` (a module-level function, so a
    spawned worker can run it), trimmed unless ``whole``."""
    mutant = BY_NAME[name]
    rule_id = mutant.rule_id
    started = time.monotonic()
    report: Report | None = None
    trimmed = False
    if not whole:

        def own(check: Check) -> bool:
            return check.machine is None and rule_id in check.rules

        order = primary_order()
        rank = order[rule_id]

        def may_outrank(check: Check) -> bool:
            return (
                check.machine is None
                and rule_id not in check.rules
                and any(order[r] < rank for r in check.rules)
            )

        first = run_contract(mutant.target(), seed=seed, only=own)
        seen = first.results[rule_id]
        if seen.verdict == "FAIL" and seen.evidence >= EVIDENCE_FOCUSED:
            rest = run_contract(mutant.target(), seed=seed, only=may_outrank)
            report = _merged(first, rest)
            trimmed = True
    if report is None:
        report = run_contract(mutant.target(), seed=seed)
    primary = report.primary
    return MutantRun(
        name=name,
        rule_id=rule_id,
        seed=seed,
        primary=None if primary is None else primary.rule.id,
        failed=tuple(r.rule.id for r in report.failures),
        detail="" if primary is None else primary.detail[:2000],
        seconds=time.monotonic() - started,
        trimmed=trimmed,
    )
