"""Every check of the suite: the focused async checks and the state machines."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis.stateful import RuleBasedStateMachine

from siglo.adapter import Capability
from siglo_contract import (  # the check modules, read for their @check functions
    checks_cache,
    checks_caching_save,
    checks_checkpoints,
    checks_concurrency,
    checks_coordination,
    checks_ids,
    checks_input,
    checks_large_state,
    checks_lifecycle,
    checks_locks,
    checks_manager,
    checks_operations,
    checks_payloads,
    checks_unlocking,
    checks_wait_claims,
    checks_waits,
)
from siglo_contract.machine_cache import CacheMachine, ContextMachine
from siglo_contract.machine_checkpoints import CheckpointMachine
from siglo_contract.machine_coordination import (
    IdempotencyMachine,
    LockMachine,
    NonceMachine,
)
from siglo_contract.machine_waits import WaitMachine
from siglo_contract.registry import CHECK_ATTRIBUTE, Check

__all__ = ["all_checks"]


def _machine(
    name: str, capability: Capability, load: Callable[[], type[RuleBasedStateMachine]], doc: str
) -> Check:
    machine = load()
    return Check(
        name=name,
        rules=tuple(machine.RULE_IDS),  # type: ignore[attr-defined]
        requires=frozenset({capability}),
        machine=load,
        doc=doc,
    )


def _machines() -> list[Check]:
    return [
        _machine(
            "checkpoint_machine",
            Capability.CHECKPOINTS,
            lambda: CheckpointMachine,
            "saves, loads, namespaces, expiry and clean-up vs the reference",
        ),
        _machine(
            "wait_record_machine",
            Capability.WAIT_RECORDS,
            lambda: WaitMachine,
            "wait-record lifecycles vs the reference",
        ),
        _machine(
            "step_cache_machine",
            Capability.STEP_CACHE,
            lambda: CacheMachine,
            "step-cache sets, gets, TTLs and cache events vs the reference",
        ),
        _machine(
            "context_stream_machine",
            Capability.CONTEXT_STREAM,
            lambda: ContextMachine,
            "context-change streams vs the reference",
        ),
        _machine(
            "idempotency_machine",
            Capability.IDEMPOTENCY,
            lambda: IdempotencyMachine,
            "idempotency claims, completes, fails and TTLs vs the reference",
        ),
        _machine(
            "lock_machine",
            Capability.LOCKS,
            lambda: LockMachine,
            "lock acquires, releases, extends, fencing and TTLs vs the reference",
        ),
        _machine(
            "nonce_machine",
            Capability.NONCES,
            lambda: NonceMachine,
            "nonce claims and windows vs the reference",
        ),
    ]


def all_checks() -> list[Check]:
    """The state machines, then every ``@check`` of the check modules, in source order."""
    found = _machines()
    for module in (
        checks_checkpoints,
        checks_large_state,
        checks_waits,
        checks_wait_claims,
        checks_cache,
        checks_concurrency,
        checks_unlocking,
        checks_caching_save,
        checks_coordination,
        checks_locks,
        checks_operations,
        checks_payloads,
        checks_input,
        checks_ids,
        checks_lifecycle,
        checks_manager,
    ):
        for value in vars(module).values():
            chk = getattr(value, CHECK_ATTRIBUTE, None)
            if isinstance(chk, Check):
                found.append(chk)
    return found
