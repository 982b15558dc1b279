"""``delete_checkpoint`` (``siglo rm``/``prune``) racing a re-run under the same stack id
never deletes the new run's wait record or context (issue 31, defect 9). On Redis the
delete reached the waits after the checkpoint, in calls of their own, and deleted
whatever wait the stack had by then: the new run's (29–36 of 150–200 rounds in the
report), which then waited forever.

Each round: a run waits on an event; ``delete_checkpoint`` and a re-run of the same id
start together, the re-run creating its checkpoint the moment the old one is gone (a
compare-and-set on revision 0), then saving its wait record, context and waiting
checkpoint. Afterwards, if the new run is stored, its wait and context must be too."""

from __future__ import annotations

import asyncio
import time

import pytest
from raw_storage import KINDS, any_backend

from siglo import Backend, Checkpoint
from siglo.errors import CheckpointConflictError
from siglo.records import ContextChangeEvent, WaitRecord

ROUNDS = 60
NAMESPACES = (None, "tenant-a")


def _checkpoint(stack: str, namespace: str | None, revision: int, status: str) -> Checkpoint:
    return Checkpoint(
        stack_id=stack,
        namespace=namespace,
        revision=revision,
        status=status,  # type: ignore[arg-type]
        chains=("approve",),
        contexts={"approve": {"run": "x"}},
        timestamp=time.time_ns() // 1_000_000,
    )


async def _start_run(
    backend: Backend, stack: str, ns: str | None, run: str, context: str | None = None
) -> None:
    """What a flow stores when its step waits: checkpoint, context, wait record."""
    a = backend.adapter
    await a.save_checkpoint(_checkpoint(stack, ns, 1, "running"), expected_revision=0)
    await a.on_context_change(
        ContextChangeEvent(
            stack_id=stack,
            step_id="approve",
            key="run",
            value=context or run,
            op="set",
            namespace=ns,
            timestamp=time.time_ns() // 1_000_000,
        )
    )
    await a.save_wait_record(
        WaitRecord(
            correlation_key=f"{stack}:approve",
            stack_id=stack,
            namespace=ns,
            step_id="approve",
            created_at=time.time_ns() // 1_000_000,
            metadata={"run": run},
        )
    )
    await a.save_checkpoint(_checkpoint(stack, ns, 2, "waiting"), expected_revision=1)


async def _rerun(backend: Backend, stack: str, ns: str | None, context: str) -> bool:
    """Re-run as soon as the old run is gone; ``False`` if it never went."""
    for _ in range(2_000):
        try:
            await _start_run(backend, stack, ns, "new", context)
            return True
        except CheckpointConflictError:
            await asyncio.sleep(0)
    return False


@pytest.mark.parametrize("same_context", [False, True], ids=["new-values", "same-values"])
@pytest.mark.parametrize("kind", KINDS)
async def test_delete_racing_a_rerun_keeps_the_new_runs_wait(kind: str, same_context: bool) -> None:
    """``same-values``: the new run writes the very context value the old one had (a
    re-run with the same input), which no comparison of values tells apart."""
    async with any_backend(kind) as backend:
        a = backend.adapter
        lost: list[str] = []
        reran = 0
        for i in range(ROUNDS):
            ns = NAMESPACES[i % 2]
            stack = f"order-{i}"
            context = "same" if same_context else "new"
            await _start_run(backend, stack, ns, "old", "same" if same_context else "old")
            # Every other round a compare-and-set delete, as `siglo rm --revision` sends.
            revision = 2 if i % 4 < 2 else None
            deleted, started = await asyncio.gather(
                a.delete_checkpoint(stack, ns, expected_revision=revision),
                _rerun(backend, stack, ns, context),
            )
            assert deleted
            assert started
            reran += 1
            stored = await a.get_checkpoint(stack, ns)
            assert stored is not None and stored.status == "waiting"
            wait = await a.get_wait_record(f"{stack}:approve", namespace=ns)
            if wait is None or dict(wait.metadata or {}).get("run") != "new":
                lost.append(f"{stack} (ns {ns}): wait {wait}")
            changes = await a.get_context_changes(stack, "approve", ns)
            if changes.get("run") != context:
                lost.append(f"{stack} (ns {ns}): context {changes}")
        assert reran == ROUNDS
        rounds = len({entry.split(" ")[0] for entry in lost})
        assert not lost, f"{rounds} of {ROUNDS} re-runs lost what they stored: {lost[:4]}"
