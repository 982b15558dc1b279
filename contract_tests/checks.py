"""Registers every check of the suite (importing this module is enough)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis.stateful import RuleBasedStateMachine

from siglo.adapter import Capability
from siglo.contract_tests import checks_coordination, checks_storage  # noqa: F401
from siglo.contract_tests.registry import CHECKS, Check

__all__: list[str] = []


def _machine(
    name: str, capability: Capability, load: Callable[[], type[RuleBasedStateMachine]], doc: str
) -> None:
    machine = load()
    CHECKS.append(
        Check(
            name=name,
            rules=tuple(machine.RULE_IDS),  # type: ignore[attr-defined]
            requires=frozenset({capability}),
            machine=load,
            doc=doc,
        )
    )


def _machines() -> None:
    from siglo.contract_tests.machine_cache import CacheMachine, ContextMachine
    from siglo.contract_tests.machine_checkpoints import CheckpointMachine
    from siglo.contract_tests.machine_coordination import (
        IdempotencyMachine,
        LockMachine,
        NonceMachine,
    )
    from siglo.contract_tests.machine_waits import WaitMachine

    _machine("checkpoint_machine", Capability.CHECKPOINTS, lambda: CheckpointMachine,
             "saves, loads, namespaces, expiry and clean-up vs the reference")
    _machine("wait_record_machine", Capability.WAIT_RECORDS, lambda: WaitMachine,
             "wait-record lifecycles vs the reference")
    _machine("step_cache_machine", Capability.STEP_CACHE, lambda: CacheMachine,
             "step-cache sets, gets, TTLs and cache events vs the reference")
    _machine("context_stream_machine", Capability.CONTEXT_STREAM, lambda: ContextMachine,
             "context-change streams vs the reference")
    _machine("idempotency_machine", Capability.IDEMPOTENCY, lambda: IdempotencyMachine,
             "idempotency claims, completes, fails and TTLs vs the reference")
    _machine("lock_machine", Capability.LOCKS, lambda: LockMachine,
             "lock acquires, releases, extends, fencing and TTLs vs the reference")
    _machine("nonce_machine", Capability.NONCES, lambda: NonceMachine,
             "nonce claims and windows vs the reference")


_machines()
