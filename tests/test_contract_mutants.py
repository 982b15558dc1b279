"""The suite's power: every deliberately broken backend fails, naming the rule it breaks."""

from __future__ import annotations

import pytest
from mutants import MUTANTS, Mutant

from siglo_contract.runner import Report, run_contract

SEEDS = (1, 2, 3)
"""The state machines search: a mutant must be caught within these seeds' budget (the
first one almost always suffices; more seeds only cost time when a search misses)."""


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.rule_id for m in MUTANTS])
def test_mutant_is_caught_by_its_rule(mutant: Mutant) -> None:
    reports: list[Report] = []
    for seed in SEEDS:
        report = run_contract(mutant.factory, rules=mutant.rules, seed=seed, keep_going=False)
        reports.append(report)
        if report.verdict(mutant.rule_id) == "FAIL":
            break
    failed = [sorted(r.rule.id for r in rep.failures) for rep in reports]
    assert reports[-1].verdict(mutant.rule_id) == "FAIL", (
        f"{mutant.description}: {mutant.rule_id} not caught with seeds {SEEDS}; failures: {failed}"
    )
    assert mutant.rule_id in reports[-1].results[mutant.rule_id].detail


def test_every_adapter_rule_has_a_mutant() -> None:
    from siglo_contract.rules import ADAPTER_RULES

    assert sorted(m.rule_id for m in MUTANTS) == sorted(r.id for r in ADAPTER_RULES)
