"""A worker's and a flow's arguments are checked where they are given, refused with
``InvalidArgumentError`` naming the argument and the value (docs/workflows.md).

A black-box auditor found ``Worker(manager, flows, batch=20000)`` accepted though every
pass then failed to list the running runs (no crashed run was ever recovered; ``siglo
worker --batch`` stops at 10000), ``worker_id=5`` accepted though every timer's claim
then failed, ``notify=5`` accepted, and ``Worker("x", flows)`` and ``flow.run(…,
manager="x")`` escaping as a bare ``AttributeError``."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import siglo
from siglo import Step, StorageManager, WorkflowSuspended, flow, sync
from siglo.errors import InvalidArgumentError
from siglo.listing import MAX_PAGE_SIZE
from siglo.workflow import Flow, Worker, WorkerPass, sleep


async def _echo(value: Any) -> Any:
    return value


async def _nap(_: Any) -> str:
    await sleep(1)
    return "woke"


ECHO = flow(Step.create("echo", _echo), name="echo")
NAP = flow(Step.create("nap", _nap), name="nap")


@pytest.fixture
async def manager() -> AsyncIterator[StorageManager]:
    async with siglo.connect("memory://") as backend:
        yield StorageManager(backend)


def _refused(name: str, build: Callable[[], object]) -> str:
    with pytest.raises(InvalidArgumentError) as refused:
        build()
    message = str(refused.value)
    assert name in message, message
    return message


async def _refused_async(name: str, call: Callable[[], Awaitable[object]]) -> str:
    with pytest.raises(InvalidArgumentError) as refused:
        await call()
    message = str(refused.value)
    assert name in message, message
    return message


@pytest.mark.parametrize("batch", [MAX_PAGE_SIZE + 1, 20_000, 0, -1, True, 1.5, "5", None])
async def test_batch_is_an_integer_the_listing_takes(manager: StorageManager, batch: Any) -> None:
    message = _refused("batch", lambda: Worker(manager, [ECHO], batch=batch))
    assert repr(batch) in message and str(MAX_PAGE_SIZE) in message


async def test_the_largest_batch_still_lists_the_running_runs(manager: StorageManager) -> None:
    worker = Worker(manager, [ECHO], batch=MAX_PAGE_SIZE)
    done = await worker.run_once()
    assert done.failures == []


@pytest.mark.parametrize("worker_id", [5, True, b"w", ["w"], "", "w\x00"])
async def test_worker_id_is_a_claimant_id(manager: StorageManager, worker_id: Any) -> None:
    message = _refused("worker_id", lambda: Worker(manager, [ECHO], worker_id=worker_id))
    if not isinstance(worker_id, str):
        assert repr(worker_id) in message


async def test_a_worker_id_given_claims_the_timers(manager: StorageManager) -> None:
    with pytest.raises(WorkflowSuspended):
        await NAP.run(None, manager=manager, stack_id="nap-1")
    assert manager.adapter is not None
    worker = Worker(manager, [NAP], worker_id="worker-a")
    assert worker.worker_id == "worker-a"
    for _ in range(200):
        if (await worker.run_once()).timers_fired:
            break
        await asyncio.sleep(0.01)
    assert await NAP.run(None, manager=manager, stack_id="nap-1") == "woke"


@pytest.mark.parametrize("given", ["x", 5, None, object()])
async def test_manager_is_a_storage_manager(given: Any) -> None:
    message = _refused("manager", lambda: Worker(given, [ECHO]))
    assert type(given).__name__ in message


async def test_a_sync_manager_is_refused_naming_the_one_to_give(manager: StorageManager) -> None:
    assert manager.backend is not None
    facade = sync.StorageManager(manager.backend)
    message = _refused("siglo.StorageManager", lambda: Worker(facade, [ECHO]))  # type: ignore[arg-type]
    assert "got siglo.sync.StorageManager" in message


@pytest.mark.parametrize("flows", [ECHO, 5, None])
async def test_flows_is_a_list_of_flows(manager: StorageManager, flows: Any) -> None:
    _refused("flows", lambda: Worker(manager, flows))


async def test_flows_hold_flows_only(manager: StorageManager) -> None:
    _refused("flows", lambda: Worker(manager, [ECHO, "nap"]))  # type: ignore[list-item]
    _refused("at least one flow", lambda: Worker(manager, []))


@pytest.mark.parametrize("notify", [5, "print", [print]])
async def test_notify_is_a_callable(manager: StorageManager, notify: Any) -> None:
    _refused("notify", lambda: Worker(manager, [ECHO], notify=notify))


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("interval_s", 0),
        ("interval_s", -1),
        ("interval_s", math.nan),
        ("interval_s", math.inf),
        ("interval_s", "1"),
        ("interval_s", True),
        ("stop", True),
        ("stop", "x"),
        ("retry", 5),
        ("retry", {"give_up_after_s": 1}),
        ("on_pass", 5),
    ],
)
async def test_the_loops_arguments_are_checked_before_the_first_pass(
    manager: StorageManager, argument: str, value: Any
) -> None:
    worker = Worker(manager, [ECHO])
    passes: list[WorkerPass] = []
    options: dict[str, Any] = {"on_pass": passes.append, argument: value}
    # Bounded: a loop that took the value could spin (an interval of 0 or NaN) for ever.
    await _refused_async(argument, lambda: asyncio.wait_for(worker.run(**options), 5))
    assert passes == []  # refused before any pass, not after the first


async def test_run_once_checks_its_stop(manager: StorageManager) -> None:
    worker = Worker(manager, [ECHO])
    await _refused_async("stop", lambda: worker.run_once(stop=True))  # type: ignore[arg-type]


async def test_the_loop_takes_its_documented_arguments(manager: StorageManager) -> None:
    worker = Worker(manager, [ECHO], notify=lambda line: None)
    stop = asyncio.Event()
    passes: list[WorkerPass] = []

    def on_pass(done: WorkerPass) -> None:
        passes.append(done)
        stop.set()

    await worker.run(
        interval_s=0.01, stop=stop, retry=siglo.workflow.RetryPolicy(), on_pass=on_pass
    )
    assert len(passes) == 1


@pytest.mark.parametrize("given", ["x", 5, 0, object()])
async def test_every_flow_call_checks_its_manager(given: Any) -> None:
    """``manager or default_storage_manager`` took a falsy value for none, and anything
    else failed on its first attribute (an AttributeError)."""
    await _refused_async("manager", lambda: ECHO.run(1, manager=given))
    await _refused_async("manager", lambda: ECHO.resume("r1", manager=given))
    await _refused_async("manager", lambda: ECHO.recover("r1", manager=given))
    await _refused_async("manager", lambda: ECHO.deliver("k", 1, manager=given))
    await _refused_async("manager", lambda: ECHO.fire_timeout("k", manager=given))
    _refused("manager", lambda: sync.SyncFlow(ECHO).run(1, manager=given))


async def test_delivery_arguments_are_checked_before_any_claim(manager: StorageManager) -> None:
    await _refused_async("correlation_key", lambda: ECHO.deliver(5, manager=manager))  # type: ignore[arg-type]
    await _refused_async("correlation_key", lambda: ECHO.fire_timeout(5, manager=manager))  # type: ignore[arg-type]
    await _refused_async("claimant_id", lambda: ECHO.deliver("k", claimant_id=5, manager=manager))  # type: ignore[arg-type]
    await _refused_async("namespace", lambda: ECHO.deliver("k", namespace=5, manager=manager))  # type: ignore[arg-type]
    message = await _refused_async(
        "allow_expired",
        lambda: ECHO.deliver("k", allow_expired="false", manager=manager),  # type: ignore[arg-type]
    )
    assert "'false'" in message


async def test_resume_and_recover_check_their_namespace(manager: StorageManager) -> None:
    await _refused_async("namespace", lambda: ECHO.resume("r1", manager=manager, namespace=5))  # type: ignore[arg-type]
    await _refused_async("namespace", lambda: ECHO.recover("r1", manager=manager, namespace=5))  # type: ignore[arg-type]


def test_a_migration_is_checked_where_it_is_registered() -> None:
    def migrate(stack: siglo.ExecutionStack) -> None:
        return None

    _refused("from_version", lambda: ECHO.with_migration(5, migrate))  # type: ignore[arg-type]
    _refused("from_version", lambda: ECHO.with_migration("", migrate))
    _refused("migrate", lambda: ECHO.with_migration(NAP.version, 5))  # type: ignore[arg-type]
    migrated: Flow = ECHO.with_migration(NAP.version, migrate)
    assert migrated.migrations[NAP.version] is migrate
