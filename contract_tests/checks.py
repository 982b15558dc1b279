"""Registers every check of the suite (importing this module is enough)."""

from __future__ import annotations

from siglo.adapter import Capability
from siglo.contract_tests import checks_coordination, checks_storage  # noqa: F401
from siglo.contract_tests.registry import CHECKS, Check

__all__: list[str] = []


def _machines() -> None:
    from siglo.contract_tests.machine_checkpoints import CheckpointMachine

    CHECKS.append(
        Check(
            name="checkpoint_machine",
            rules=CheckpointMachine.RULE_IDS,
            requires=frozenset({Capability.CHECKPOINTS}),
            machine=lambda: CheckpointMachine,
            doc="random programs of saves, loads, expiry and clean-up vs the reference",
        )
    )


_machines()
