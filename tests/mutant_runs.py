"""Run the contract suite against one mutant exactly as a third party runs it (the whole
suite, every rule, the default profile, one seed), in a worker process."""

from __future__ import annotations

import time
from dataclasses import dataclass

from mutants import BY_NAME

from siglo_contract.runner import run_contract


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

    @property
    def killed(self) -> bool:
        """Killed with the right rule as the primary failure."""
        return self.primary == self.rule_id


def run_mutant(name: str, seed: int) -> MutantRun:
    """``siglo check`` of mutant ``name`` with ``seed`` (a module-level function, so a
    spawned worker can run it)."""
    mutant = BY_NAME[name]
    started = time.monotonic()
    report = run_contract(mutant.target(), seed=seed)
    primary = report.primary
    return MutantRun(
        name=name,
        rule_id=mutant.rule_id,
        seed=seed,
        primary=None if primary is None else primary.rule.id,
        failed=tuple(r.rule.id for r in report.failures),
        detail="" if primary is None else primary.detail[:2000],
        seconds=time.monotonic() - started,
    )
