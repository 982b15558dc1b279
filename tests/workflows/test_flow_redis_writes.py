"""What one run of a 3-step flow (one step cached) writes to Redis: each command and
script recorded at the adapter's :class:`siglo_redis.commands.Commands`, a script counted
as one write (one atomic call, whatever it touches), the way benchmarks/writes.py counts
them. The Redis counterpart of tests/workflows/test_flow_statements.py.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _redis_helpers import REDIS_URL, require_redis
from test_flow_statements import three_steps

import siglo
from siglo_redis.scripts import STEP_SAVE

READS = frozenset({"GET", "MGET", "HGETALL", "checkpoint_load", "lock_inspect", "PTTL", "TYPE"})


@pytest.fixture
async def backend() -> AsyncIterator[siglo.Backend]:
    require_redis()
    prefix = f"siglo-test-{uuid.uuid4().hex[:12]}:"
    async with siglo.connect(f"{REDIS_URL}?prefix={prefix}") as b:
        yield b
        client: Any = b.adapter.client  # type: ignore[attr-defined]
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)


def record(backend: siglo.Backend) -> list[str]:
    """The name of every command and script the adapter and its workflow lock send from
    now on."""
    adapter: Any = backend.adapter
    sent: list[str] = []
    # A script sent again after a NOSCRIPT goes through call(): counted once, as the
    # script (a flag of the task that runs it, not of the others meanwhile).
    in_script: contextvars.ContextVar[bool] = contextvars.ContextVar("in_script", default=False)
    for commands in (adapter._redis, adapter.workflow_lock._redis):
        call, script = commands.call, commands.script

        async def calling(what: str, awaitable: Any, _call: Any = call) -> Any:
            if not in_script.get():
                sent.append(what)
            return await _call(what, awaitable)

        async def scripting(s: Any, keys: Any, args: Any, _script: Any = script) -> Any:
            sent.append(s.name)
            token = in_script.set(True)
            try:
                return await _script(s, keys, args)
            finally:
                in_script.reset(token)

        commands.call, commands.script = calling, scripting
    return sent


async def test_a_run_writes_once_per_step(backend: siglo.Backend) -> None:
    """Five writes: the workflow lock taken, the creation, and one script per step —
    its context change and checkpoint, the cached step's with its cache entry, the last
    with the completion and the lock's release. The one read: the cache look-up."""
    manager = siglo.StorageManager(backend, error_mode="strict")
    work = three_steps()
    await work.run({"run": "warm"}, manager=manager, stack_id="warm")
    sent = record(backend)
    out = await work.run({"run": "r1"}, manager=manager, stack_id="r1")
    assert out == {"run": "r1", "step": 3}
    writes = [s for s in sent if s not in READS]
    assert writes == ["lock_acquire", "checkpoint_cas", *[STEP_SAVE.name] * 3], sent
    assert await backend.adapter.get_cached_step("price-r1") == {"run": "r1", "step": 2}
    stored = await backend.adapter.get_checkpoint("r1")
    assert stored is not None and stored.status == "completed"
    assert await backend.adapter.get_context_changes("r1", "settle") == {
        "output": {"run": "r1", "step": 3}
    }

    async def enter() -> str:
        return "entered"

    assert await backend.adapter.with_workflow_lock("r1", enter, timeout_ms=50) == "entered"


async def test_a_refused_save_keeps_its_entry_and_changes(backend: siglo.Backend) -> None:
    """The script writes the entry and the changes whatever the compare-and-set decides."""
    a: Any = backend.adapter
    first = siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
    await a.save_checkpoint(first, expected_revision=0)
    change = siglo.records.ContextChangeEvent(
        stack_id="s", step_id="p", key="k", value=[1], op="set", revision=1, timestamp=2
    )
    entry = siglo.adapter.CacheEntry("key", {"v": 0}, 60_000)
    sent = record(backend)
    stale = siglo.Checkpoint(stack_id="s", revision=3, timestamp=2)
    with pytest.raises(siglo.CheckpointConflictError):
        await a.save_checkpoint_caching(stale, [change], entry, expected_revision=2)
    assert sent == [STEP_SAVE.name]
    assert await a.get_checkpoint("s") == first
    assert await a.get_cached_step("key") == {"v": 0}
    assert await a.get_context_changes("s", "p") == {"k": [1]}
