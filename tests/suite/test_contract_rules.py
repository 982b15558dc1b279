"""The rule list, the documentation page and the tests agree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from siglo.adapter import Capability
from siglo_contract import checks_cache
from siglo_contract.checks import all_checks
from siglo_contract.machine_cache import CacheMachine
from siglo_contract.registry import CHECK_ATTRIBUTE
from siglo_contract.rules import ADAPTER_RULES, CORE_RULES, RULES, rule, select_rules

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_PAGE = ROOT / "docs" / "contract.md"
ROW = re.compile(r"^\| `([^`]+)` \| .+ \|$", re.MULTILINE)


def documented_rule_ids() -> list[str]:
    return ROW.findall(CONTRACT_PAGE.read_text(encoding="utf-8"))


def rule_ids_marked_in_tests() -> set[str]:
    """Rule ids named by ``pytest.mark.rule(...)`` anywhere under tests/."""
    found: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "rule"
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "mark"
            ):
                found.update(
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                )
    return found


def suite_rule_ids() -> set[str]:
    return {rule_id for chk in all_checks() for rule_id in chk.rules}


def test_rule_list_matches_the_contract_page() -> None:
    assert documented_rule_ids() == [r.id for r in RULES]


def test_rule_ids_are_unique() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))


def test_every_adapter_rule_is_checked_by_the_suite() -> None:
    missing = sorted({r.id for r in ADAPTER_RULES} - suite_rule_ids())
    assert not missing, f"adapter rules no suite check names: {missing}"


def test_every_documented_rule_has_a_test() -> None:
    covered = suite_rule_ids() | rule_ids_marked_in_tests()
    missing = [r for r in documented_rule_ids() if r not in covered]
    assert not missing, (
        f"rules on docs/contract.md with no suite check and no test marked "
        f"@pytest.mark.rule(...): {missing}"
    )


def test_marked_rule_ids_exist() -> None:
    unknown = sorted(rule_ids_marked_in_tests() - {r.id for r in RULES})
    assert not unknown, f"tests mark rules that are not on docs/contract.md: {unknown}"


def test_core_rules_are_not_run_against_backends() -> None:
    assert not {r.id for r in CORE_RULES} & suite_rule_ids()


def test_rule_patterns() -> None:
    assert [r.id for r in select_rules(["wait.claim.*"])] == [
        "wait.claim.once",
        "wait.claim.refused",
        "wait.claim.expired",
        "wait.claim.lease",
    ]
    assert {r.id for r in select_rules(["lock"])} == {
        r.id for r in ADAPTER_RULES if r.id.startswith("lock.")
    }
    assert select_rules(None) == ADAPTER_RULES


def test_the_recipe_for_a_rule_walks_through_a_rule_wired_as_it_says() -> None:
    """docs/adding-a-rule.md follows cache.falsy-hit through every step: its row, its
    entry in rules.py, its focused check, its state machine and its mutant."""
    from mutants import BY_NAME, MUTANTS, DropsCachedNone

    page = " ".join((ROOT / "docs" / "adding-a-rule.md").read_text(encoding="utf-8").split())
    example = rule("cache.falsy-hit")
    assert example.id in documented_rule_ids()
    assert example.kind == "adapter" and example.capability is Capability.STEP_CACHE
    assert f'`_a("cache.falsy-hit", _C.STEP_CACHE, "{example.summary}")`' in page
    focused = getattr(checks_cache.cache_falsy_hit, CHECK_ATTRIBUTE)
    assert focused.rules == ("cache.falsy-hit",)
    assert "`cache_falsy_hit` in `checks_cache.py`" in page
    assert "cache.falsy-hit" in CacheMachine.RULE_IDS
    mutant = BY_NAME["DropsCachedNone"]
    assert mutant in MUTANTS and mutant.rule_id == "cache.falsy-hit"
    assert f'_m("cache.falsy-hit", "{mutant.description}", adapter=DropsCachedNone)' in page
    assert "_do_get_cached_step" in vars(DropsCachedNone)
