"""The Redis classes' call timeout (siglo_redis.deadlines): one timer for every
call in flight, with ``asyncio.timeout``'s behaviour. Real tasks and real sleeps; the
paused-server test in test_redis_failures.py checks it against a real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest

from siglo_redis.deadlines import Deadlines


async def test_a_late_call_times_out_and_leaves_its_task_usable() -> None:
    deadlines = Deadlines(0.05)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await deadlines.run(asyncio.sleep(5))
    assert 0.04 < time.monotonic() - started < 1
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    assert await deadlines.run(asyncio.sleep(0, "after")) == "after"


async def test_calls_in_time_return_their_result() -> None:
    deadlines = Deadlines(1)
    assert await deadlines.run(asyncio.sleep(0.01, 42)) == 42


async def test_many_concurrent_calls_each_get_their_own_deadline() -> None:
    deadlines = Deadlines(0.1)

    async def call(i: int) -> int:
        # Staggered starts: calls that started later must not be cut short by earlier
        # deadlines, nor outlive their own.
        await asyncio.sleep(i * 0.005)
        return await deadlines.run(asyncio.sleep(0.3 if i % 3 == 0 else 0.01, i))

    results = await asyncio.gather(*(call(i) for i in range(30)), return_exceptions=True)
    for i, result in enumerate(results):
        if i % 3 == 0:
            assert isinstance(result, TimeoutError), (i, result)
        else:
            assert result == i


async def test_a_cancellation_from_elsewhere_is_not_a_timeout() -> None:
    deadlines = Deadlines(5)
    task = asyncio.ensure_future(deadlines.run(asyncio.sleep(5)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelled_while_expiring_stays_cancelled() -> None:
    # The deadline fires and, before the task runs again, it is cancelled from elsewhere
    # too: the outer cancellation wins, as with asyncio.timeout.
    deadlines = Deadlines(0.02)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(deadlines.run(asyncio.sleep(5)))
    await asyncio.sleep(0)  # the call is in flight
    loop.call_at(loop.time() + 0.03, task.cancel)  # due just after the deadline
    time.sleep(0.06)  # noqa: ASYNC251 - block the loop on purpose: both timers come due together
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_call_that_swallows_the_cancellation_restores_the_count() -> None:
    deadlines = Deadlines(0.02)

    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    assert await deadlines.run(stubborn()) == "swallowed"
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_nested_call_is_bounded_too() -> None:
    deadlines = Deadlines(0.05)

    async def outer() -> None:
        await deadlines.run(asyncio.sleep(5))

    with pytest.raises(TimeoutError):
        await deadlines.run(outer())


async def test_no_timeout_means_unbounded() -> None:
    deadlines = Deadlines(None)
    assert await deadlines.run(asyncio.sleep(0.05, "done")) == "done"


def test_one_instance_serves_successive_event_loops() -> None:
    deadlines = Deadlines(0.05)

    async def late() -> None:
        await deadlines.run(asyncio.sleep(5))

    for _ in range(2):  # the first loop's timer is gone with it; the second arms its own
        with pytest.raises(TimeoutError):
            asyncio.run(late())
