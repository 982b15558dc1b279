"""The suite's power, measured as a third party would: every deliberately broken backend
(tests/support/mutants.py: over memory, and over real SQLite, PostgreSQL and Redis) is run
through the suite — every rule, the default profile, one seed — and must fail with the
rule it breaks as the report's primary failure.

Seeds rotate: the default seed is derived from the commit and printed in the header
(``--mutant-seed`` fixes it); ``--mutant-seeds N`` runs N consecutive seeds. A run is
trimmed without changing its verdict (tests/support/mutant_runs.py); ``--mutant-whole`` runs
the whole suite against every mutant. The full sweep, two seeds of whole runs, is
``SIGLO_MUTANT_SEEDS=2 SIGLO_MUTANT_WHOLE=1 python -m pytest tests/suite/test_contract_mutants.py``
(docs/testing.md). The runs go to a pool of worker processes.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from _redis_helpers import require_redis
from mutant_runs import MutantRun, run_mutant
from mutant_seeds import mutant_base_seed
from mutants import ALL_MUTANTS, BACKENDS, BY_NAME, HOLES, MANAGERS, MUTANTS, VALUES, Mutant
from mutants_backends import BackendMutant
from sql_support import require_postgres

from siglo_contract.rules import ADAPTER_RULES

# One worker runs every mutant test (pytest-xdist --dist loadgroup): the runs are one
# module fixture, which each worker would otherwise start again.
pytestmark = pytest.mark.xdist_group("mutants")


def mutant_seeds(config: pytest.Config) -> list[int]:
    """The seeds this run tries: ``--mutant-seeds`` consecutive ones from the base."""
    base = mutant_base_seed(config)
    count = config.getoption("mutant_seeds")
    return [base + i for i in range(count)]


@pytest.fixture(scope="module")
def mutant_runs(request: pytest.FixtureRequest) -> dict[str, list[MutantRun | Exception]]:
    """Every mutant under every seed, run in parallel worker processes; a run that could
    not start (its PostgreSQL or Redis unreachable) keeps its exception."""
    seeds = mutant_seeds(request.config)
    # A run spends most of its time waiting: a trimmed run against an in-memory mutant
    # about 2.6 s, 0.1 s of it on the CPU (the workflow-lock holds of the lock rules'
    # focused checks), a real backend's on its server. Four workers a core (at most
    # eight) keep the cores busy: on two cores the pool took 58 s alone, 95 s with four.
    workers = max(1, min(4 * (os.cpu_count() or 1), 8))
    runs: dict[str, list[MutantRun | Exception]] = {m.name: [] for m in ALL_MUTANTS}
    # The real-backend mutants take 3-8 times as long as the memory ones: started first,
    # they do not leave one worker finishing a long run after the others are done.
    started = time.monotonic()
    ordered = [*BACKENDS, *(m for m in ALL_MUTANTS if m not in BACKENDS)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        whole = request.config.getoption("mutant_whole")
        futures = {
            pool.submit(run_mutant, m.name, seed, whole): m.name for m in ordered for seed in seeds
        }
        for future, name in futures.items():
            try:
                runs[name].append(future.result())
            except Exception as exc:
                runs[name].append(exc)
    _print_times(runs, time.monotonic() - started)
    return runs


def _print_times(runs: dict[str, list[MutantRun | Exception]], seconds: float) -> None:
    """Where the time went (shown with ``-s``): the mean run per kind of backend."""
    by_kind: dict[str, list[float]] = {}
    for name, done in runs.items():
        kind = getattr(BY_NAME[name], "kind", "memory")
        by_kind.setdefault(kind, []).extend(r.seconds for r in done if isinstance(r, MutantRun))
    print(f"\nmutant runs: {sum(map(len, runs.values()))} in {seconds:.0f} s")
    for kind, times in sorted(by_kind.items()):
        if times:
            print(f"  {kind}: {len(times)} runs, {sum(times) / len(times):.1f} s on average")


def _require(mutant: Mutant | BackendMutant) -> None:
    """Skip (fail under CI=true) a real-backend mutant whose server is unreachable."""
    kind = getattr(mutant, "kind", None)
    if kind == "postgres":
        require_postgres()
    elif kind == "redis":
        require_redis()


_CRASH = re.compile(r"\braised (AttributeError|NameError|TypeError|UnboundLocalError)\(")
"""A check that failed because calling the mutant raised a programming error: the
mutant no longer fits the code it subclasses (two manager mutants set an attribute
the manager had lost, and were "killed" by the AttributeError)."""


# The first test waits for the whole pool (minutes): past pytest-timeout's default.
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mutant", ALL_MUTANTS, ids=[m.name for m in ALL_MUTANTS])
def test_mutant_is_killed_with_its_rule_as_primary_failure(
    mutant: Mutant | BackendMutant, mutant_runs: dict[str, list[MutantRun | Exception]]
) -> None:
    for run in mutant_runs[mutant.name]:
        if isinstance(run, Exception):
            _require(mutant)
            raise run
        assert run.killed, (
            f"{mutant.description} ({mutant.name}) breaks {mutant.rule_id}; with seed "
            f"{run.seed} the primary failure was {run.primary!r} (failures: "
            f"{list(run.failed)})\n{run.detail}"
        )
        crash = _CRASH.search(run.detail)
        assert crash is None, (
            f"{mutant.name} was killed by a {crash[1]} of its own, not by the behaviour "
            f"it describes ({mutant.description}): a mutant left behind by a change of "
            f"the code it subclasses proves nothing\n{run.detail}"
        )


def test_every_adapter_rule_has_a_mutant() -> None:
    covered = {m.rule_id for m in ALL_MUTANTS}
    assert covered == {r.id for r in ADAPTER_RULES}


def test_mutant_names_are_unique() -> None:
    assert len({m.name for m in ALL_MUTANTS}) == len(ALL_MUTANTS)


def test_the_contract_page_counts_the_mutants_there_are() -> None:
    """docs/contract.md, "The suite's power", says how many mutants of each kind the score
    is over."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text()
    power = " ".join(page.split("## The suite's power", 1)[1].split("\n## ", 1)[0].split())
    kinds = Counter(getattr(m, "kind", None) for m in BACKENDS)
    manager_over_sqlite = sum(1 for m in BACKENDS if m.rule_id.startswith("manager."))
    claims = [
        f"backends, {len(ALL_MUTANTS)} of them",
        f"`MUTANTS`, {len(MUTANTS)} for {len({m.rule_id for m in MUTANTS})} rules",
        f"and {len(MANAGERS)} broken storage managers",
        f"`tests/support/mutants_holes.py`, {len(HOLES)}:",
        f"`tests/support/mutants_values.py`, {len(VALUES)});",
        f"`tests/support/mutants_backends.py`, {len(BACKENDS)}: "
        f"{kinds['sqlite'] - manager_over_sqlite} on SQLite and a broken manager over SQLite",
        f"{kinds['postgres']} on PostgreSQL, {kinds['redis']} on Redis",
    ]
    assert manager_over_sqlite == 1
    for claim in claims:
        assert claim in power, claim
    # Each measurement row: every mutant it ran killed; a row over all of them names the
    # current count, a partial one (``N of the M``) the current M.
    rows = re.findall(r"^\| (\d+)( of the \d+)?[^|]* \|[^|]*\| \*\*(\d+) / (\d+)\*\*", page, re.M)
    assert rows
    for ran, of_the, killed, total in rows:
        assert killed == total == ran, (ran, killed, total)
        if of_the:
            assert of_the == f" of the {len(ALL_MUTANTS)}", of_the
    # The last full row is a run over every mutant there is now: a mutant added without
    # measuring the whole set again fails here.
    latest_full = [ran for ran, of_the, _, _ in rows if not of_the][-1]
    assert int(latest_full) == len(ALL_MUTANTS), (latest_full, len(ALL_MUTANTS))
