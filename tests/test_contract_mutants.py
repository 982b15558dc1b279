"""The suite's power, measured as a third party would: every deliberately broken backend
(tests/mutants.py) is run through the whole suite — every rule, the default profile, one
seed — and must fail with the rule it breaks as the report's primary failure.

Seeds rotate: each run picks a random base seed and prints it (``--mutant-seed`` fixes
it); ``--mutant-seeds N`` runs N seeds (CI uses several; the default is one, to keep
``python -m pytest`` within minutes). The runs go to a pool of worker processes.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest
from mutant_runs import MutantRun, run_mutant
from mutants import ALL_MUTANTS, MANAGERS, MUTANTS, Mutant

from siglo_contract.rules import ADAPTER_RULES


def mutant_seeds(config: pytest.Config) -> list[int]:
    """The seeds this run tries: ``--mutant-seeds`` consecutive ones from the base."""
    base = config.getoption("mutant_seed")
    count = config.getoption("mutant_seeds")
    return [base + i for i in range(count)]


@pytest.fixture(scope="module")
def mutant_runs(request: pytest.FixtureRequest) -> dict[str, list[MutantRun]]:
    """Every mutant under every seed, run in parallel worker processes."""
    seeds = mutant_seeds(request.config)
    workers = max(1, min(os.cpu_count() or 1, 4))
    runs: dict[str, list[MutantRun]] = {m.name: [] for m in ALL_MUTANTS}
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_mutant, m.name, seed) for m in ALL_MUTANTS for seed in seeds]
        for future in futures:
            run = future.result()
            runs[run.name].append(run)
    return runs


# The first test waits for the whole pool (minutes): past pytest-timeout's default.
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mutant", ALL_MUTANTS, ids=[m.name for m in ALL_MUTANTS])
def test_mutant_is_killed_with_its_rule_as_primary_failure(
    mutant: Mutant, mutant_runs: dict[str, list[MutantRun]]
) -> None:
    for run in mutant_runs[mutant.name]:
        assert run.killed, (
            f"{mutant.description} ({mutant.name}) breaks {mutant.rule_id}; with seed "
            f"{run.seed} the primary failure was {run.primary!r} (failures: "
            f"{list(run.failed)})\n{run.detail}"
        )


def test_every_adapter_rule_has_a_mutant() -> None:
    covered = {m.rule_id for m in MUTANTS + MANAGERS}
    assert covered == {r.id for r in ADAPTER_RULES}


def test_mutant_names_are_unique() -> None:
    assert len({m.name for m in ALL_MUTANTS}) == len(ALL_MUTANTS)
