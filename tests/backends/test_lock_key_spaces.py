"""The workflow lock and the public lock never share keys (SPEC §4, issue 11 defect 7):
holding the public lock ``workflow:X`` does not hold ``with_workflow_lock(X)``, and the
other way round, on every backend."""

from __future__ import annotations

import pytest
from raw_storage import KINDS
from raw_storage import any_backend as open_any


@pytest.mark.rule("lock.workflow.separate")
@pytest.mark.parametrize("kind", KINDS)
async def test_public_lock_named_like_a_workflow_lock(kind: str) -> None:
    async with open_any(kind) as backend:
        lock = backend.lock
        assert lock is not None
        for name in ("workflow:s", "s", "workflow-lock:s"):
            held = await lock.acquire(name, 60_000)
            assert held.acquired

        async def inside() -> str:
            # ... and the public lock of the same names is still free to others.
            for name in ("workflow:t", "t"):
                got = await lock.acquire(name, 60_000)
                assert got.acquired, name
                assert await lock.release(name, got.token)
            return "ran"

        ran = await backend.adapter.with_workflow_lock("s", inside, timeout_ms=500)
        assert ran == "ran"
        assert await backend.adapter.with_workflow_lock("t", inside, timeout_ms=500) == "ran"
