"""A seed's programs do not depend on what else the process loaded
(:mod:`siglo_contract.determinism`).

Hypothesis draws now and then a literal it read from a "local" module loaded in the
process. In the full test run that made the suite's seed test draw another
counter-example than it drew alone (15 s of shrinking against 2 s), and ``--seed N``
reproduced a run only where the same modules were loaded. A contract run draws from no
local module.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis.internal.conjecture import providers
from mutants import MUTANTS

from siglo_contract.determinism import fixed_constants
from siglo_contract.runner import run_contract

# Unlikely to be drawn unless read from a module: 13 digits, no boundary of anything.
ODD = 4_711_000_004_711


@pytest.fixture
def restored_pool() -> Iterator[None]:
    """Hypothesis's pool of local constants as it was before the test: the modules the
    test imports must not leave their constants to the worker's later tests."""
    before = providers._local_constants
    yield
    providers._local_constants = before
    providers.CONSTANTS_CACHE.cache.clear()


def _import_from(where: Path, name: str, source: str) -> None:
    where.mkdir()
    (where / f"{name}.py").write_text(source)
    sys.path.insert(0, str(where))
    try:
        importlib.import_module(name)
        # Hypothesis reads it, as its next draw would. It looks for new modules only when
        # sys.modules has changed length since its last look, which an earlier test that
        # removed a module can hide: it is made to look.
        providers._sys_modules_len = None
        providers._get_local_constants()
    finally:
        sys.path.remove(str(where))
        sys.modules.pop(name, None)


@pytest.fixture
def local_module(tmp_path: Path, restored_pool: None) -> None:
    """A module outside site-packages and the standard library (hypothesis's "local"),
    holding ``ODD``, imported."""
    _import_from(tmp_path / "probe", "siglo_local_constants_probe", f"THRESHOLD = {ODD}\n")


def _provider_pool() -> Any:
    """The pool a Hypothesis provider draws local constants from."""
    return providers.HypothesisProvider(None)._local_constants


def test_a_run_draws_no_constant_of_a_loaded_module(local_module: None) -> None:
    assert ODD in providers._get_local_constants().integers  # read from the module
    with fixed_constants():
        pool = _provider_pool()
        assert len(pool) == 0, pool
    # Afterwards, Hypothesis is as it was.
    assert ODD in _provider_pool().integers


def test_run_contract_runs_inside_the_pin(local_module: None) -> None:
    pools: list[int] = []
    mutant = next(m for m in MUTANTS if m.rule_id == "checkpoint.occ.conflict")
    run_contract(
        mutant.factory,
        rules=["checkpoint.occ.conflict"],
        seed=5,
        on_plan=lambda _checks: pools.append(len(providers._get_local_constants())),
    )
    assert pools == [0]


def test_a_seed_draws_the_same_counterexample_after_a_module_is_loaded(
    tmp_path: Path, restored_pool: None
) -> None:
    mutant = next(m for m in MUTANTS if m.rule_id == "checkpoint.occ.conflict")

    def detail() -> str:
        report = run_contract(
            mutant.factory, rules=["checkpoint.occ.conflict"], seed=5, keep_going=False
        )
        return report.results["checkpoint.occ.conflict"].detail

    before = detail()
    # Constants of the kinds the checkpoint machine draws: small integers, short strings
    # (without the pin, they change this counter-example).
    values = ", ".join([*map(str, range(-20, 200)), *(repr("abc"[i % 3] * i) for i in range(1, 9))])
    _import_from(tmp_path / "more", "siglo_more_constants", f"VALUES = [{values}]\n")
    assert detail() == before
