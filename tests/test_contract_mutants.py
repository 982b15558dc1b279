"""The suite's power: every deliberately broken backend fails, naming the rule it breaks."""

from __future__ import annotations

import pytest

from siglo.contract_tests.runner import run_contract
from mutants import MUTANTS, Mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.rule_id for m in MUTANTS])
def test_mutant_is_caught_by_its_rule(mutant: Mutant) -> None:
    report = run_contract(mutant.factory, rules=mutant.rules, seed=1, keep_going=False)
    failed = sorted(r.rule.id for r in report.failures)
    assert report.verdict(mutant.rule_id) == "FAIL", (
        f"{mutant.description}: {mutant.rule_id} not caught; failures: {failed}"
    )
    detail = report.results[mutant.rule_id].detail
    assert mutant.rule_id in detail or detail, detail
