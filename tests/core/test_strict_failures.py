"""Strict mode raises a background failure once, to the call it belongs to (SPEC §4).

Issue 11 defect 4: after the backend recovered, 20 of the next 25 unrelated calls raised
old background failures (one unbounded queue, popped by any call). Reproduced on a
private redis-server of our own that is stopped during the saves and started again.
"""

from __future__ import annotations

import pytest
from _redis_helpers import RedisServer, require_redis
from ports import free_port

import siglo
from siglo import StorageAdapterError, StorageManager


@pytest.fixture
def private_redis() -> RedisServer:
    require_redis()
    server = RedisServer(free_port(30200, 30300)).start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest.mark.rule("manager.error-mode")
async def test_old_failures_are_not_replayed_on_unrelated_calls(
    private_redis: RedisServer,
) -> None:
    url = private_redis.url + "?command_timeout_ms=1000"
    async with siglo.connect(url) as backend:
        manager = StorageManager(backend, error_mode="strict")
        failing = [f"failing-{i}" for i in range(20)]
        for stack_id in failing:
            manager.create_stack(stack_id).set("s", "n", 1)
        private_redis.kill()
        for stack_id in failing:
            manager.checkpoint(stack_id)  # fails in the background: the server is gone
        # Let the background saves fail without raising them (flush() would raise).
        await manager._jobs.drain()
        private_redis.start()

        raised = 0
        for i in range(25):
            unrelated = f"unrelated-{i}"
            manager.create_stack(unrelated)
            try:
                await manager.save_checkpoint(unrelated)
                assert await manager.load_checkpoint(unrelated) is not None
            except StorageAdapterError:
                raised += 1
        assert raised == 0, f"{raised} of 25 unrelated calls raised old background failures"

        # Each failing stack's own next call raises its failure, once.
        for stack_id in failing:
            with pytest.raises(StorageAdapterError):
                await manager.save_checkpoint(stack_id)
            saved = await manager.save_checkpoint(stack_id)
            assert (await manager.load_checkpoint(stack_id)) == saved
        await manager.flush()  # nothing left over


@pytest.mark.rule("manager.error-mode")
async def test_failures_are_bounded_per_stack_and_flush_raises_once(
    private_redis: RedisServer,
) -> None:
    async with siglo.connect(private_redis.url + "?command_timeout_ms=1000") as backend:
        manager = StorageManager(backend, error_mode="strict")
        manager.create_stack("a")
        manager.create_stack("b")
        private_redis.kill()
        for _ in range(5):
            manager.checkpoint("a")
        manager.checkpoint("b")
        with pytest.raises(StorageAdapterError) as info:
            await manager.flush()
        notes = "\n".join(getattr(info.value, "__notes__", []))
        # The stacks fail concurrently: whichever is raised, the other is named, and
        # the four later failures of "a" are counted, not kept.
        assert "'b'" in notes or "'a'" in notes
        assert "4 later background failure(s) of this stack were dropped" in notes or (
            "'a' (+4 later)" in notes
        )
        private_redis.start()
        await manager.flush()  # raised once, then gone
        await manager.save_checkpoint("a")
        await manager.save_checkpoint("b")


@pytest.mark.rule("manager.error-mode")
async def test_kept_failures_are_capped_and_the_rest_logged(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past MAX_DEFERRED_STACKS stacks a failure is logged at ERROR instead of kept."""
    import logging

    import siglo.deferred_failures

    monkeypatch.setattr(siglo.deferred_failures, "MAX_DEFERRED_STACKS", 3)
    async with siglo.connect(private_redis.url + "?command_timeout_ms=1000") as backend:
        manager = StorageManager(backend, error_mode="strict")
        stacks = [f"capped-{i}" for i in range(5)]
        for stack_id in stacks:
            manager.create_stack(stack_id)
        private_redis.kill()
        with caplog.at_level(logging.ERROR, logger="siglo"):
            for stack_id in stacks:
                manager.checkpoint(stack_id)
            with pytest.raises(StorageAdapterError) as info:
                await manager.flush()
        notes = "\n".join(getattr(info.value, "__notes__", []))
        noted = {repr(stack_id) for stack_id in stacks if repr(stack_id) in notes}
        logged = {
            r.args[0]  # type: ignore[index]  # the stack, as the note names it: 'capped-3'
            for r in caplog.records
            if r.levelno == logging.ERROR and r.args
        }
        # Three kept (one raised, two named with it), the other two logged.
        assert len(noted) == 2 and len(logged) == 2 and not noted & logged
        await manager.flush()  # nothing kept beyond the cap, nothing raised twice
