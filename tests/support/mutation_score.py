"""The suite's mutation score: ``python tests/support/mutation_score.py --seeds 1,2,3,4``.

``--write-power`` runs the mutants of the reference backend (every memory mutant: not
the real SQLite, PostgreSQL and Redis ones) and records the score in
``contract_tests/siglo_contract/power.json``, which reports print as the suite's power
(``python tests/support/mutation_score.py --write-power --seeds 1``). With ``--only``
it measures just those mutants (new ones, or ones whose rule's checks changed) and
updates their entries, keeping the others' (each entry says when it was measured).

Runs every mutant of tests/support/mutants.py through the suite as a third party would
(``siglo check``: every rule, the default profile, one seed per run; trimmed without
changing the verdict, tests/support/mutant_runs.py) in worker processes, and prints,
per seed, how many were killed with the right rule as the primary failure, and every
miss. docs/contract.md publishes its output.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutant_runs import MutantRun, run_mutant
from mutants import ALL_MUTANTS, BY_NAME

POWER_FILE = (
    Path(__file__).resolve().parents[2] / "contract_tests" / "siglo_contract" / "power.json"
)


def reference_mutants() -> list[str]:
    """The mutants over the reference (memory) backend, whose score the power file records."""
    return [m.name for m in ALL_MUTANTS if not hasattr(m, "kind")]


def write_power(
    runs: list[MutantRun], seeds: list[int], seconds: float, *, update: bool = False
) -> None:
    """Record the reference backend's score in :data:`POWER_FILE` (with ``update``, only
    the mutants run now change; the others keep their recorded entries)."""
    from siglo_contract.version import CONTRACT_VERSION, rule_set_hash

    today = datetime.date.today().isoformat()
    entries = {
        name: {
            "rule": BY_NAME[name].rule_id,
            "killed": all(r.killed for r in runs if r.name == name),
            "measured": today,
        }
        for name in sorted({r.name for r in runs})
    }
    minutes = round(seconds / 60, 1)
    if update:
        old = json.loads(POWER_FILE.read_text(encoding="utf-8"))
        if old["seeds"] != seeds:
            raise SystemExit(f"--only updates need the recorded seeds {old['seeds']}")
        kept = {
            name: {**entry, "measured": entry.get("measured", old["measured"])}
            for name, entry in old["byMutant"].items()
            if name in reference_mutants() and name not in entries
        }
        entries = dict(sorted({**kept, **entries}.items()))
        minutes = round(old["minutes"] + minutes, 1)
    doc = {
        "contractVersion": CONTRACT_VERSION,
        "ruleSetHash": rule_set_hash(),
        "backend": "memory://",
        "seeds": seeds,
        "measured": today,
        "mutants": len(entries),
        "runs": len(entries) * len(seeds),
        "killedWithTheRightRule": sum(e["killed"] for e in entries.values()) * len(seeds),
        "minutes": minutes,
        "command": "python tests/support/mutation_score.py --write-power --seeds "
        + ",".join(map(str, seeds)),
        "byMutant": entries,
    }
    POWER_FILE.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {POWER_FILE}")


def score(seeds: list[int], workers: int, names: list[str] | None = None) -> list[MutantRun]:
    """Every (mutant, seed) run, in parallel."""
    chosen = names or [m.name for m in ALL_MUTANTS]
    context = multiprocessing.get_context("spawn")
    # The slow real-backend runs first, as tests/suite/test_contract_mutants.py does.
    slow = {m.name for m in ALL_MUTANTS if hasattr(m, "kind")}
    chosen = sorted(chosen, key=lambda name: name not in slow)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(run_mutant, name, seed) for name in chosen for seed in seeds]
        return [f.result() for f in futures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="1", help="comma-separated seeds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument(
        "--write-power",
        action="store_true",
        help="run the reference backend's mutants and record the score in power.json",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.monotonic()
    names = [n for n in args.only.split(",") if n] or None
    update = args.write_power and names is not None
    if args.write_power:
        unknown = sorted(set(names or ()) - set(reference_mutants()))
        if unknown:
            raise SystemExit(f"not mutants over the reference backend: {', '.join(unknown)}")
        names = names or reference_mutants()
    runs = score(seeds, args.workers, names)
    if args.write_power:
        write_power(runs, seeds, time.monotonic() - started, update=update)
    print("| seed | killed with the right rule as primary failure | time per run |")
    print("|---|---|---|")
    for seed in seeds:
        mine = [r for r in runs if r.seed == seed]
        killed = sum(r.killed for r in mine)
        mean = sum(r.seconds for r in mine) / len(mine)
        print(f"| {seed} | {killed} / {len(mine)} | {mean:.1f} s |")
    kinds: dict[str, list[float]] = {}
    for r in runs:
        kinds.setdefault(getattr(BY_NAME[r.name], "kind", "memory"), []).append(r.seconds)
    for kind, seconds in sorted(kinds.items()):
        print(f"{kind}: {len(seconds)} runs, {sum(seconds) / len(seconds):.1f} s each on average")
    for r in runs:
        if not r.killed:
            print(
                f"MISS {r.name} seed {r.seed}: breaks {r.rule_id}, primary {r.primary}, "
                f"failures {list(r.failed)}\n    {r.detail[:500]!r}"
            )
    print(f"{len(runs)} runs in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
