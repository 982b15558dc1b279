"""``backend.closed`` calls every public method: the list of calls its check makes is
compared with the public coroutine methods of the adapter and the coordination stores, so
a method added later is not left out of the rule."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from siglo import connect
from siglo.adapter import StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.coordination import IdempotencyStoreBase, LockBase, NonceStoreBase
from siglo_contract.checks_lifecycle import closed_calls


def _public_coroutines(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    }


@pytest.mark.rule("backend.closed")
def test_the_closed_backend_check_calls_every_public_method() -> None:
    backend = connect("memory://")
    ctx: Any = SimpleNamespace(
        checkpoint=lambda stack, revision: Checkpoint(stack_id=stack, revision=revision)
    )
    called = {name for _, name, _ in closed_calls(ctx, backend, "s", "k", [])}
    want = (
        (_public_coroutines(StorageAdapter) - {"aclose"})
        # Not a coroutine function, but a public call all the same: it returns the walk.
        | {"scan_payloads", "idempotency.scan_results"}
        | {f"idempotency.{m}" for m in _public_coroutines(IdempotencyStoreBase) - {"aclose"}}
        | {f"lock.{m}" for m in _public_coroutines(LockBase) - {"aclose"}}
        | {f"nonces.{m}" for m in _public_coroutines(NonceStoreBase) - {"aclose"}}
    )
    assert called == want, (sorted(want - called), sorted(called - want))
