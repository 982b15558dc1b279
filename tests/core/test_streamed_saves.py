"""A stack saved right after its context changed: the change and the checkpoint together.

The storage manager hands the context changes whose stream has not started to
``StorageAdapter.save_checkpoint_streamed`` with the checkpoint. On PostgreSQL that is
one statement (the change and the checkpoint in one round trip and one commit); on
SQLite and every other backend the two calls in order. Either way the stored result is
what the two calls store, and the order of a stack's writes is kept. Against real
SQLite and PostgreSQL, statements counted where the database runs them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from sql_support import open_backend

import siglo
from siglo import Checkpoint, StorageManager
from siglo.errors import CheckpointConflictError
from siglo.records import ContextChangeEvent
from siglo_memory import MemoryStorageAdapter


@pytest.fixture(params=["postgres", "sqlite-file"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[siglo.Backend]:
    async with open_backend(request.param) as b:
        await b.adapter.open()  # type: ignore[attr-defined]
        yield b


def count_statements(backend: siglo.Backend) -> list[str]:
    """The first word of every statement the backend's database runs from now on, on
    its driver or (SQLite) its inline writer."""
    db: Any = backend.adapter.database  # type: ignore[attr-defined]
    ran: list[str] = []
    fetch = db.raw_fetch

    async def counting(sql: str, params: Any = ()) -> Any:
        ran.append(sql.split()[0])
        return await fetch(sql, params)

    db.raw_fetch = counting
    writer = getattr(db, "_writer", None)  # SQLite's keyed writes on the loop's thread
    if writer is not None:
        traced: list[str] = []

        def on_statement(sql: str) -> None:
            # A trigger's program is traced with the text of its statement: not sent.
            if not traced or traced[-1] != sql:
                ran.append(sql.split()[0])
            traced.append(sql)

        writer.set_trace_callback(on_statement)
    return ran


async def test_a_change_and_the_next_save_are_one_statement_on_postgres(
    backend: siglo.Backend,
) -> None:
    manager = StorageManager(backend, error_mode="strict")
    stack = manager.create_stack("run-1")
    await manager.save_checkpoint("run-1", expected_revision=0)
    ran = count_statements(backend)
    stack.set("step", "output", {"n": 1})
    saved = await manager.save_checkpoint("run-1", expected_revision=1)
    postgres = backend.adapter.database.dialect_name == "postgresql"  # type: ignore[attr-defined]
    # SQLite: the checkpoint and the change in one transaction on the writer (the
    # checkpoint's row first, as PostgreSQL's WITH takes them).
    assert ran == (["WITH"] if postgres else ["BEGIN", "UPDATE", "INSERT", "COMMIT"])
    adapter = backend.adapter
    assert await adapter.get_context_changes("run-1", "step") == {"output": {"n": 1}}
    stored = await adapter.get_checkpoint("run-1")
    assert stored == saved
    assert stored is not None and stored.contexts == {"step": {"output": {"n": 1}}}


async def test_a_refused_save_still_records_the_change_as_two_calls_would(
    backend: siglo.Backend,
) -> None:
    adapter = backend.adapter
    first = Checkpoint(stack_id="s", revision=1, timestamp=1)
    await adapter.save_checkpoint(first, expected_revision=0)
    change = ContextChangeEvent(
        stack_id="s", step_id="a", key="k", value=[1, 2], op="set", revision=1, timestamp=2
    )
    stale = Checkpoint(stack_id="s", revision=3, timestamp=2)
    with pytest.raises(CheckpointConflictError):
        await adapter.save_checkpoint_streamed(stale, [change], expected_revision=2)
    assert await adapter.get_context_changes("s", "a") == {"k": [1, 2]}
    assert await adapter.get_checkpoint("s") == first
    # And accepted: both stored, every compare-and-set form.
    for expected, revision in ((1, 2), (None, 3)):
        nxt = Checkpoint(stack_id="s", revision=revision, timestamp=3)
        moved = ContextChangeEvent(
            stack_id="s", step_id="a", key="k", value=revision, op="set", revision=1, timestamp=3
        )
        await adapter.save_checkpoint_streamed(nxt, [moved], expected_revision=expected)
        assert await adapter.get_context_changes("s", "a") == {"k": revision}
        assert await adapter.get_checkpoint("s") == nxt
    new = Checkpoint(stack_id="t", revision=1, timestamp=3, namespace="ns")
    born = ContextChangeEvent(
        stack_id="t",
        step_id="a",
        key="k",
        value="v",
        op="set",
        namespace="ns",
        revision=0,
        timestamp=3,
    )
    await adapter.save_checkpoint_streamed(new, [born], expected_revision=0)
    assert await adapter.get_context_changes("t", "a", "ns") == {"k": "v"}
    assert await adapter.get_checkpoint("t", "ns") == new


class Together(MemoryStorageAdapter):
    """Takes the changes with the checkpoint (as the SQL backend on PostgreSQL) and
    records what reaches it."""

    def __init__(self, order: list[str]) -> None:
        super().__init__()
        self.order = order

    async def on_context_change(self, event: ContextChangeEvent) -> None:
        self.order.append(f"{event.key}={event.value}")
        await super().on_context_change(event)

    async def save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        self.order.append(f"save {checkpoint.revision}")
        await super().save_checkpoint(checkpoint, expected_revision=expected_revision)

    def writes_with_checkpoint(self, changes: Sequence[ContextChangeEvent]) -> bool:
        return True

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        self.order.append(f"together {len(changes)}")
        await super().save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )


async def test_changes_before_a_background_save_stream_before_it() -> None:
    order: list[str] = []
    manager = StorageManager(Together(order), error_mode="strict")
    stack = manager.create_stack("run-1")
    stack.set("s", "a", 1)
    manager.checkpoint("run-1")  # in the background, after a=1
    stack.set("s", "b", 2)
    stack.set("s", "c", 3)
    await manager.save_checkpoint("run-1")
    await manager.flush()
    # Each change sent once, in order, before the first checkpoint that holds it: a=1
    # by its own job (a background save follows it), b and c with the save.
    assert order == ["a=1", "save 1", "together 2", "b=2", "c=3", "save 2"]
    stack.set("s", "d", 4)
    await manager.flush()  # no save follows: its job streams it
    assert order[-1] == "d=4"
    assert await manager.adapter.get_context_changes("run-1", "s") == {  # type: ignore[union-attr]
        "a": 1,
        "b": 2,
        "c": 3,
        "d": 4,
    }


async def test_without_an_override_the_jobs_stream_first(
    memory: siglo.Backend, manager: StorageManager
) -> None:
    order: list[str] = []
    adapter = memory.adapter
    on_change, save = adapter.on_context_change, adapter.save_checkpoint

    async def recording_change(event: ContextChangeEvent) -> None:
        order.append(f"{event.key}={event.value}")
        await on_change(event)

    async def recording_save(checkpoint: Checkpoint, **kwargs: Any) -> None:
        order.append(f"save {checkpoint.revision}")
        await save(checkpoint, **kwargs)

    adapter.on_context_change = recording_change  # type: ignore[method-assign]
    adapter.save_checkpoint = recording_save  # type: ignore[method-assign]
    stack = manager.create_stack("run-1")
    stack.set("s", "a", 1)
    await manager.save_checkpoint("run-1")
    assert order == ["a=1", "save 1"]


async def test_a_replaced_write_gets_the_two_calls(backend: siglo.Backend) -> None:
    adapter = backend.adapter
    seen: list[str] = []
    on_change = adapter.on_context_change

    async def recording(event: ContextChangeEvent) -> None:
        seen.append(event.key)
        await on_change(event)

    adapter.on_context_change = recording  # type: ignore[method-assign]
    change = ContextChangeEvent(
        stack_id="s", step_id="a", key="k", value=1, op="set", revision=0, timestamp=1
    )
    cp = Checkpoint(stack_id="s", revision=1, timestamp=1)
    await adapter.save_checkpoint_streamed(cp, [change], expected_revision=0)
    assert seen == ["k"]
    assert await adapter.get_checkpoint("s") == cp


async def test_a_failing_stream_fails_its_checkpoint_written_with_it(
    backend: siglo.Backend,
) -> None:
    # Best-effort: a context change that cannot be stored is swallowed with the
    # checkpoint written with it (one statement on PostgreSQL, one transaction on
    # SQLite): both fail or neither (docs/backends).
    manager = StorageManager(backend, error_mode="best-effort")
    stack = manager.create_stack("run-1")
    await manager.save_checkpoint("run-1", expected_revision=0)
    stack.set("step", "ok", 1)
    adapter: Any = backend.adapter
    encode = adapter._context_row

    def failing(event: ContextChangeEvent, now: int) -> Any:
        raise siglo.errors.StorageAdapterError("stream down")

    adapter._context_row = failing
    await manager.save_checkpoint("run-1", expected_revision=1)
    adapter._context_row = encode
    stored = await adapter.get_checkpoint("run-1")
    assert stored is not None
    assert stored.revision == 1
