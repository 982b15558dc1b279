"""``lock.with_lock(key, fn, wait_ms=…)``: a bounded wait for a held lock, under
contention, on every backend and through the blocking facade (issue 31, item 12: the
docs show ``with_lock`` like a mutex, but it never waited — the second of two callers got
``LockNotAcquiredError`` at once)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from raw_storage import KINDS, any_backend

from siglo import sync
from siglo.errors import InvalidArgumentError, LockNotAcquiredError

CALLERS = 12


@pytest.mark.rule("lock.with-lock.wait")
@pytest.mark.parametrize("kind", KINDS)
async def test_callers_queue_behind_the_holder_and_each_runs_once(kind: str) -> None:
    async with any_backend(kind) as backend:
        lock = backend.require_lock()
        inside = 0
        most = 0
        ran: list[int] = []

        async def turn(n: int) -> int:
            nonlocal inside, most
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1
            ran.append(n)
            return n

        results = await asyncio.gather(
            *(
                lock.with_lock("report", lambda n=n: turn(n), 10_000, wait_ms=20_000)  # type: ignore[misc]
                for n in range(CALLERS)
            )
        )
        assert sorted(results) == list(range(CALLERS))
        assert sorted(ran) == list(range(CALLERS))
        assert most == 1, "two callers ran under the lock at once"


@pytest.mark.rule("lock.with-lock.wait")
@pytest.mark.parametrize("kind", KINDS)
async def test_the_wait_is_bounded_and_the_default_does_not_wait(kind: str) -> None:
    async with any_backend(kind) as backend:
        lock = backend.require_lock()
        held = await lock.acquire("busy", 60_000)
        assert held.acquired
        ran: list[int] = []

        async def never() -> None:
            ran.append(1)

        started = time.monotonic()
        with pytest.raises(LockNotAcquiredError, match="after waiting 300 ms"):
            await lock.with_lock("busy", never, wait_ms=300)
        assert 0.28 <= time.monotonic() - started < 3.0
        started = time.monotonic()
        with pytest.raises(LockNotAcquiredError):
            await lock.with_lock("busy", never)  # the seed's behaviour: one attempt
        assert time.monotonic() - started < 1.0
        assert not ran
        for bad in (-1, 1.5, True, "100"):
            with pytest.raises(InvalidArgumentError, match="wait_ms"):
                await lock.with_lock("busy", never, wait_ms=bad)  # type: ignore[arg-type]
        # Released during the wait: the waiter enters soon after.
        waiter = asyncio.create_task(
            lock.with_lock("busy", lambda: asyncio.sleep(0, "in"), wait_ms=10_000)
        )
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await lock.release("busy", held.token)
        assert await asyncio.wait_for(waiter, 5) == "in"


@pytest.mark.rule("lock.with-lock.wait")
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_threads_wait_through_the_blocking_facade(kind: str, tmp_path: object) -> None:
    url = {"sqlite": f"sqlite:///{tmp_path}/locks.db", "redis": None}[kind]
    prefix = None
    if url is None:
        from _redis_helpers import REDIS_URL, require_redis

        require_redis()
        import uuid

        from siglo import urls

        prefix = f"siglo-test-{uuid.uuid4().hex[:12]}:"
        url = urls.with_options(REDIS_URL, {"prefix": prefix})
    backend = sync.connect(url)
    try:
        lock = backend.require_lock()
        inside = 0
        most = 0
        guard = threading.Lock()
        done: list[int] = []

        def work(n: int) -> None:
            nonlocal inside, most
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.01)
            with guard:
                inside -= 1
                done.append(n)

        threads = [
            threading.Thread(
                target=lambda n=n: lock.with_lock("t", lambda: work(n), wait_ms=20_000)  # type: ignore[misc]
            )
            for n in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(done) == list(range(8))
        assert most == 1
    finally:
        backend.close()
        if prefix is not None:  # the lock's fencing counter stays after its release
            import redis
            from _redis_helpers import REDIS_URL

            client = redis.Redis.from_url(REDIS_URL)
            try:
                for key in client.scan_iter(match=prefix + "*"):
                    client.delete(key)
            finally:
                client.close()
