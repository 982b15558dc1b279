"""Bad ids are ``InvalidArgumentError`` on every backend, identically (issue 11 defect 6).

Before: a lone surrogate in an id was accepted by memory, a ``StorageAdapterError`` on
SQL and Redis (so best-effort mode swallowed the caller's bug) and a raw
``UnicodeEncodeError`` from the Redis lock; ``on_context_change`` accepted NUL and empty
ids, and on SQL an empty namespace wrote into the un-namespaced stream. Nothing stored
may change on a rejected call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from raw_storage import KINDS, any_backend, raw_bytes

import siglo
from siglo import Checkpoint, ContextChangeEvent, InvalidArgumentError, WaitRecord

LONE = "order-\ud800-7"


def _event(**changes: Any) -> ContextChangeEvent:
    fields: dict[str, Any] = {
        "stack_id": "s",
        "step_id": "step",
        "key": "k",
        "value": 1,
        "timestamp": 1,
        "namespace": None,
    }
    fields.update(changes)
    return ContextChangeEvent(**fields)


def _calls(backend: siglo.Backend) -> dict[str, Callable[[], Awaitable[Any]]]:
    a = backend.adapter
    cp = Checkpoint.from_wire(
        {
            "version": 2,
            "schemaVersion": "2.0.0",
            "stackId": "s",
            "type": "execution",
            "status": "running",
            "revision": 1,
            "chains": [],
            "contexts": {},
            "timestamp": 1,
        }
    )

    async def nothing() -> None:
        raise AssertionError("the action ran")

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "save_checkpoint(stack)": lambda: a.save_checkpoint(cp.replace(stack_id=LONE)),
        "save_checkpoint(namespace)": lambda: a.save_checkpoint(cp.replace(namespace=LONE)),
        "get_checkpoint(stack)": lambda: a.get_checkpoint(LONE),
        "get_checkpoint(namespace)": lambda: a.get_checkpoint("s", LONE),
        "save_wait_record": lambda: a.save_wait_record(
            WaitRecord(correlation_key=LONE, stack_id="s")
        ),
        "save_wait_record(namespace)": lambda: a.save_wait_record(
            WaitRecord(correlation_key="w", stack_id="s", namespace=LONE)
        ),
        "get_wait_record": lambda: a.get_wait_record(LONE),
        "claim_wait_record": lambda: a.claim_wait_record(LONE),
        "claim_wait_record(claimant)": lambda: a.claim_wait_record("w", LONE),
        "complete_wait_record": lambda: a.complete_wait_record(LONE, "c"),
        "cancel_wait_record": lambda: a.cancel_wait_record(LONE),
        "cancel_workflow": lambda: a.cancel_workflow(LONE),
        "with_workflow_lock": lambda: a.with_workflow_lock(LONE, nothing),
        "get_cached_step": lambda: a.get_cached_step(LONE),
        "set_cached_step": lambda: a.set_cached_step(LONE, 1),
        "get_context_changes": lambda: a.get_context_changes(LONE, "step"),
        "on_context_change(stack)": lambda: a.on_context_change(_event(stack_id=LONE)),
        "on_context_change(key)": lambda: a.on_context_change(_event(key=LONE)),
        "on_context_change(empty step)": lambda: a.on_context_change(_event(step_id="")),
        "on_context_change(empty key)": lambda: a.on_context_change(_event(key="")),
        "on_context_change(NUL stack)": lambda: a.on_context_change(_event(stack_id="a\x00")),
        "on_context_change(NUL key)": lambda: a.on_context_change(_event(key="k\x00")),
        "on_context_change(empty namespace)": lambda: a.on_context_change(_event(namespace="")),
    }
    if backend.lock is not None:
        lock = backend.lock
        calls["lock.acquire"] = lambda: lock.acquire(LONE, 1_000)
        calls["lock.release"] = lambda: lock.release(LONE, "token")
        calls["lock.extend"] = lambda: lock.extend("k", LONE, 1_000)
    if backend.nonces is not None:
        nonces = backend.nonces
        calls["nonces.claim"] = lambda: nonces.claim(LONE, 10)
    if backend.idempotency is not None:
        idem = backend.idempotency
        calls["idempotency.claim"] = lambda: idem.claim(LONE)
        calls["idempotency.get_result"] = lambda: idem.get_result(LONE)
    return calls


@pytest.mark.parametrize("kind", KINDS)
async def test_bad_ids_are_invalid_argument_errors_and_change_nothing(kind: str) -> None:
    async with any_backend(kind) as backend:
        # Something stored, so "nothing changed" is a real comparison.
        await backend.adapter.set_cached_step("present", {"n": 1})
        await backend.adapter.on_context_change(_event())
        before = await raw_bytes(kind, backend)
        wrong: dict[str, str] = {}
        for name, call in _calls(backend).items():
            try:
                await call()
            except InvalidArgumentError:
                continue
            except BaseException as exc:
                wrong[name] = f"{type(exc).__name__}: {exc}"
            else:
                wrong[name] = "accepted"
        assert not wrong, wrong
        assert await raw_bytes(kind, backend) == before
        # The un-namespaced stream kept its one field.
        assert await backend.adapter.get_context_changes("s", "step") == {"k": 1}
