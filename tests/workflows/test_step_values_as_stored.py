"""A step sees the values a resume would read from the store (docs/workflows.md, what
is stored): a run's input, the previous step's output and a delivered event are handed
on in their JSON form — a ``datetime`` as text, a tuple as a list, a NaN as ``None`` —
whether the step before ran in this process or the run was taken up from its checkpoint
after a wait, a crash or a cache hit. Before, a step saw the ``datetime`` the previous
step returned on the first run and its text after a resume (a black-box auditor's
finding, left open one stop): code that worked until the first recovery."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import uuid
from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Step, WorkflowSuspended, flow, wait_for_event
from siglo.errors import NotJSONError, WaitRecordClaimError

AT = datetime.datetime(2026, 12, 7, 9, 30, tzinfo=datetime.UTC)
ID = uuid.UUID(int=5)


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Receipt:
    amount: int
    at: datetime.datetime


RICH = {
    "at": AT,
    "day": AT.date(),
    "id": ID,
    "pair": (1, 2),
    "nan": math.nan,
    "colour": Colour.RED,
    "receipt": Receipt(5, AT),
}
AS_STORED = {
    "at": "2026-12-07T09:30:00+00:00",
    "day": "2026-12-07",
    "id": "00000000-0000-0000-0000-000000000005",
    "pair": [1, 2],
    "nan": None,
    "colour": "red",
    "receipt": {"amount": 5, "at": "2026-12-07T09:30:00+00:00"},
}

seen: dict[str, list[Any]] = {}


def _saw(what: str, value: Any) -> None:
    seen.setdefault(what, []).append(value)


async def stamp(value: Any) -> Any:
    _saw("input", value)
    return RICH


async def look(value: Any) -> Any:
    _saw("output", value)
    event = await wait_for_event("receipt:rich", timeout_ms=60_000)
    _saw("event", event)
    return event


rich = flow(Step.create("stamp", stamp), Step.create("look", look), name="rich-values")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_step_sees_the_same_values_before_and_after_a_resume(kind: str) -> None:
    seen.clear()
    async with shared_store(kind) as store:
        async with siglo.connect(store.url) as backend:
            with pytest.raises(WorkflowSuspended):
                await rich.run({"at": AT}, manager=siglo.StorageManager(backend), stack_id="r1")
        # Another process: the run is read from the store.
        async with siglo.connect(store.url) as backend:
            manager = siglo.StorageManager(backend)
            result = await rich.deliver("receipt:rich", {"at": AT, "id": ID}, manager=manager)
            stored = await manager.load_checkpoint("r1")
    assert seen["input"] == [{"at": "2026-12-07T09:30:00+00:00"}]
    # ``look`` ran twice: before its wait, with the output as ``stamp`` returned it
    # here, and after the delivery, with the output read from the checkpoint.
    assert seen["output"] == [AS_STORED, AS_STORED]
    assert seen["event"] == [{"at": AS_STORED["at"], "id": AS_STORED["id"]}]
    assert result == seen["event"][0]
    assert stored is not None and stored.contexts["stamp"]["output"] == AS_STORED


async def test_a_cached_steps_output_is_handed_on_as_a_hit_reads_it() -> None:
    """A miss hands on what a later hit reads from the cache entry."""
    outputs: list[Any] = []

    async def keep(value: Any) -> Any:
        outputs.append(value)
        return value

    cached = flow(
        Step.create("stamp", stamp).cache(ttl_ms=60_000, key=lambda: "rich"),
        Step.create("keep", keep),
        name="rich-cached",
    )
    async with shared_store("sqlite") as store, siglo.connect(store.url) as backend:
        manager = siglo.StorageManager(backend)
        first = await cached.run(None, manager=manager, stack_id="c1")
        second = await cached.run(None, manager=manager, stack_id="c2")
    assert outputs == [AS_STORED, AS_STORED]
    assert first == second == AS_STORED


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_an_event_that_is_not_json_is_refused_before_the_claim(kind: str) -> None:
    """Refused before anything is stored: the wait is still there for a valid event."""
    seen.clear()
    async with shared_store(kind) as store, siglo.connect(store.url) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await rich.run(None, manager=manager, stack_id="e1")
        with pytest.raises(NotJSONError, match="event delivered for 'receipt:rich'"):
            await rich.deliver("receipt:rich", {"seen": {1, 2}}, manager=manager)
        assert await rich.deliver("receipt:rich", {"ok": True}, manager=manager) == {"ok": True}
        with pytest.raises(WaitRecordClaimError):
            await rich.deliver("receipt:rich", {"ok": True}, manager=manager)


async def test_an_input_that_is_not_json_stores_nothing() -> None:
    async with shared_store("sqlite") as store, siglo.connect(store.url) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(NotJSONError, match="input of run 'n1'"):
            await rich.run({"tags": {"a"}}, manager=manager, stack_id="n1")
        assert await manager.load_checkpoint("n1") is None


counted: list[Any] = []


async def _one(value: Any) -> Any:
    value["seen"] = True  # changes its input in place: the run's stored input
    return {"n": 1}


async def _count(state: Any) -> Any:
    state["n"] += 1  # changes its input in place: the stored output of the step before
    counted.append(dict(state))
    await wait_for_event("count:go", timeout_ms=60_000)
    return state


counting = flow(Step.create("one", _one), Step.create("count", _count), name="in-place")


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_step_changing_its_input_in_place_changes_nothing_stored(kind: str) -> None:
    """A step was handed the very objects the run stores — its input, the previous
    step's output — so ``state["n"] += 1`` before a wait changed step ``one``'s stored
    output, and the step, run again after the wait, counted twice (a black-box
    auditor). Each step is handed copies."""
    counted.clear()
    async with shared_store(kind) as store, siglo.connect(store.url) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await counting.run({"order": 7}, manager=manager, stack_id="c1")
        result = await counting.deliver("count:go", None, manager=manager)
        stored = await manager.load_checkpoint("c1")
    assert counted == [{"n": 2}, {"n": 2}]
    assert result == {"n": 2}
    assert stored is not None
    assert stored.contexts["one"]["output"] == {"n": 1}
    assert stored.metadata["input"] == {"order": 7}


migrated: list[str] = []


async def _reserve(order: Any) -> Any:
    return {"order": order}


async def _approve(state: Any) -> Any:
    migrated.append(type(state.get("at")).__name__)
    return {**state, "by": await wait_for_event(f"approve:{state['order']}", timeout_ms=60_000)}


def _add_at(stack: Any) -> None:
    stack.contexts["reserve"]["output"]["at"] = AT


async def test_what_a_migration_sets_is_handed_on_in_its_stored_form() -> None:
    """A flow migration setting a ``datetime`` in a restored run: the waiting step saw
    the object on the resume that migrated, and text on any later resume."""
    migrated.clear()
    v1 = flow(Step.create("reserve", _reserve), Step.create("approve", _approve), name="mig")
    v2 = flow(
        Step.create("reserve", _reserve),
        Step.create("approve", _approve),
        Step.create("after", _reserve),
        name="mig",
    ).with_migration(v1.version, _add_at)
    async with shared_store("sqlite") as store, siglo.connect(store.url) as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(WorkflowSuspended):
            await v1.run(7, manager=manager, stack_id="m1")
        await v2.deliver("approve:7", "ada", manager=manager)
    assert migrated == ["NoneType", "str"]
