"""``siglo.sync`` where the facade meets what it wraps: the portal an object built from a
facade runs on (after a fork), the lock helpers' threads (interrupted, nested) and the
async iterators a facade's method returns. Each test is a black-box auditor's defect.

Each backend is on private storage (``raw_storage.any_backend``: a temporary SQLite
file, a Redis key prefix, a PostgreSQL schema), entered on the portal's loop; what could
hang the old code runs in a child process, so that a regression fails the test and does
not hang the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import abc
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from raw_storage import KINDS, any_backend

import siglo
from siglo import sync
from siglo.payloads import StoredPayload
from siglo.sync_facades import Facade

SUPPORT = Path(__file__).resolve().parents[1] / "support"
ROOT = Path(__file__).resolve().parents[2]


def _require(kind: str) -> None:
    """Skip (fail under CI=true) when ``kind``'s server is not there."""
    if kind == "redis":
        from _redis_helpers import require_redis

        require_redis()
    elif kind == "postgres":
        from sql_support import require_postgres

        require_postgres()


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest) -> Iterator[sync.SyncBackend]:
    kind: str = request.param
    _require(kind)
    portal = sync.get_portal()
    cm: Any = any_backend(kind)
    inner = portal.run(cm.__aenter__)
    try:
        yield sync.SyncBackend(inner, portal)
    finally:
        portal.run(cm.__aexit__, None, None, None)


def _run_script(kind: str, body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``body`` in a fresh interpreter, with ``backend`` (a :class:`sync.SyncBackend` of
    ``kind`` on private storage) opened first; the script ends with ``os._exit``, so a
    thread it leaves stuck does not keep the child alive."""
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys, threading, time
            sys.path[:0] = [{str(SUPPORT)!r}, {str(ROOT / "backends")!r}, {str(ROOT)!r}]
            from raw_storage import any_backend
            from siglo import sync

            portal = sync.get_portal()
            cm = any_backend({kind!r})
            backend = sync.SyncBackend(portal.run(cm.__aenter__), portal)
            print("url:", backend.url, flush=True)
            """
        )
        + textwrap.dedent(body)
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=tmp_path
    )
    if kind == "redis":
        _delete_redis_prefix(done.stdout)
    return done


def _delete_redis_prefix(out: str) -> None:
    """The keys of the script's private Redis prefix: gone with its backend when the
    script ran to its end, left when a regression left it stuck (and removed here)."""
    import redis
    from _redis_helpers import REDIS_URL

    for line in out.splitlines():
        if line.startswith("url: "):
            prefix = parse_qs(urlsplit(line[5:]).query)["prefix"][0]
            client = redis.Redis.from_url(REDIS_URL)
            for stale in client.scan_iter(f"{prefix}*"):
                client.delete(stale)
            client.close()


# -- 1. after a fork: what is built from a pre-fork facade runs on its portal ----------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forking is POSIX")
@pytest.mark.parametrize("kind", KINDS)
def test_what_a_child_builds_from_a_pre_fork_backend_names_the_fork(
    kind: str, tmp_path: Path
) -> None:
    """gunicorn --preload: a module-level sync backend, then the fork. A
    ``sync.StorageManager(backend)`` made per request in the child, and
    ``sync.verify_webhook(…, backend.require_nonces())``, ran on the child's new portal
    with the parent's connections (on PostgreSQL the two processes' loads corrupted each
    other: a black-box auditor). Both take the portal of the facade they are handed,
    which names the fork, as does every other way in; the parent's backend still works."""
    _require(kind)
    done = _run_script(
        kind,
        """
        import signal
        import siglo.webhooks as wh

        manager = sync.StorageManager(backend)
        manager.create_stack("before").save()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # the old code could wait for ever on the parent's sockets
            body = b'{"x": 1}'
            headers = {"Siglo-Signature": wh.sign("k" * 32, body)}
            mine = sync.StorageManager()  # on the child's own portal

            def per_request():
                sync.StorageManager(backend).load_checkpoint("before")

            def from_the_adapter():
                sync.StorageManager(backend.adapter).load_checkpoint("before")

            def webhook():
                sync.verify_webhook("k" * 32, body, headers, backend.require_nonces())

            def swapped_in():
                mine.use_storage(backend)
                mine.load_checkpoint("before")

            for check in (per_request, from_the_adapter, webhook, swapped_in):
                try:
                    check()
                    print(check.__name__, "ran", flush=True)
                except RuntimeError as exc:
                    named = "was forked from it" in str(exc)
                    print(check.__name__, "refused" if named else exc, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("parent:", manager.load_checkpoint("before").revision, flush=True)
        portal.run(cm.__aexit__, None, None, None)
        os._exit(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for check in ("per_request", "from_the_adapter", "webhook", "swapped_in"):
        assert f"{check} refused" in out, out
    assert "parent: 1" in out, out


# -- 2. an interrupted caller: the lock is held until the function returns -------------


class Interrupted(Exception):
    """What the test's signal handler raises in the calling thread (a Celery soft time
    limit does the same; Ctrl-C raises KeyboardInterrupt the same way)."""


def _interrupt_main_thread_when(inside: threading.Event) -> Callable[[], None]:
    """A function for the lock helper: it signals the main thread (blocked in the call)
    and then runs on until ``inside`` — set by the test — lets it return."""
    main = threading.main_thread().ident
    assert main is not None

    def locked() -> None:
        # Once the main thread waits for the call's outcome (an interrupt landing before
        # that would not cancel the call at all).
        time.sleep(0.1)
        signal.pthread_kill(main, signal.SIGALRM)
        assert inside.wait(10)

    return locked


@pytest.fixture
def interruptible() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread")

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.usefixtures("interruptible")
@pytest.mark.parametrize("helper", ["with_lock", "with_workflow_lock"])
def test_an_interrupted_caller_leaves_the_lock_held_until_its_function_returns(
    backend: sync.SyncBackend, helper: str
) -> None:
    """Interrupted while its function ran (Ctrl-C, a signal-based time limit), the caller
    was told at once — and the lock was released at once too, the function still running
    in its worker thread: a second caller took the lock and ran alongside it (a
    black-box auditor). The caller is still told at once; the lock is released when the
    function returns, and not before."""
    key = f"seam-{uuid.uuid4()}"
    lock = backend.require_lock()
    finish = threading.Event()
    first = _interrupt_main_thread_when(finish)

    def call(fn: Callable[[], Any], *, wait_ms: int = 0) -> Any:
        if helper == "with_lock":
            return lock.with_lock(key, fn, 30_000, wait_ms=wait_ms)
        return backend.adapter.with_workflow_lock(key, fn, timeout_ms=max(wait_ms, 50))

    with pytest.raises(Interrupted):
        call(first)
    assert not finish.is_set()  # told at once, its function still running
    entered: list[str] = []
    with pytest.raises(siglo.LockNotAcquiredError):
        call(lambda: entered.append("second"))
    assert entered == []

    finished_at: list[float] = []
    threading.Timer(0.2, lambda: (finished_at.append(time.monotonic()), finish.set())).start()
    call(lambda: entered.append(f"{time.monotonic()}"), wait_ms=10_000)
    assert len(entered) == 1 and finished_at
    assert float(entered[0]) >= finished_at[0]  # only once the first function was done


@pytest.mark.usefixtures("interruptible")
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_closing_waits_for_an_interrupted_callers_function(kind: str) -> None:
    """The ``with sync.connect(…)`` block left by the interrupt closes the backend while
    the interrupted caller's function still runs. Closed under it, the backend could not
    release the lock once the function returned, and the lock would stay held for its
    whole lease; ``close()`` waits for the function to return and its lock to be
    released (it returned at once, the function still running)."""
    url = "memory://"
    if kind == "redis":
        from _redis_helpers import REDIS_URL, require_redis

        require_redis()
        prefix = f"siglo-test-{uuid.uuid4().hex[:16]}:"
        url = f"{REDIS_URL}?prefix={prefix}"
    finish = threading.Event()
    done: list[str] = []
    first = _interrupt_main_thread_when(finish)

    def locked() -> None:
        first()
        done.append("function")

    def interrupted_in_a_with_block() -> None:
        with sync.connect(url) as backend:
            threading.Timer(0.3, finish.set).start()
            backend.require_lock().with_lock("closing", locked, 30_000)

    try:
        with pytest.raises(Interrupted):
            interrupted_in_a_with_block()
        assert done == ["function"]  # close() returned after the function
        if kind == "redis":
            with sync.connect(url) as again:
                assert again.require_lock().inspect("closing") is None  # released
    finally:
        finish.set()
        if kind == "redis":
            import redis

            client = redis.Redis.from_url(REDIS_URL)
            for stale in client.scan_iter(f"{prefix}*"):  # the lock's fencing counter
                client.delete(stale)
            client.close()


# -- 3. nested locked functions: a thread each, never a bounded pool --------------------


@pytest.mark.parametrize("kind", KINDS)
def test_nested_locked_functions_deeper_than_any_pool(kind: str, tmp_path: Path) -> None:
    """The locked functions ran in the portal loop's default thread pool (min(32, cores
    + 4) threads): a locked function taking another lock through siglo.sync waits for
    an inner function queued behind the waiting outer ones, and the calls hung for ever
    (a black-box auditor: 40 requests, 27 stuck). Each function has a thread of its own:
    a chain 40 deep (deeper than any such pool) alternating the workflow lock and the
    public lock returns, and so do 8 threads running such a chain at once."""
    _require(kind)
    done = _run_script(
        kind,
        """
        DEPTH = 40
        lock = backend.require_lock()

        def chain(prefix, level=0):
            if level == DEPTH:
                return level
            key = f"{prefix}-{level}"
            inner = lambda: chain(prefix, level + 1)
            if level % 2:
                return lock.with_lock(key, inner, 30_000)
            return backend.adapter.with_workflow_lock(key, inner)

        results = []

        def request(i):
            results.append(chain(f"nest-{i}"))

        threads = [threading.Thread(target=request, args=(i,), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        print("finished", len(results), "of", len(threads), "at depth", set(results), flush=True)
        if len(results) == len(threads):
            portal.run(cm.__aexit__, None, None, None)
        os._exit(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "finished 8 of 8 at depth {40}" in done.stdout, done.stdout + done.stderr


# -- 4. an async iterator of a facade's method is a plain iterator ----------------------


def test_an_adapters_scans_are_plain_iterators(backend: sync.SyncBackend) -> None:
    """``backend.adapter.scan_payloads(kind)`` returned the portal loop's raw async
    generator, which synchronous code cannot iterate (a black-box auditor); so did the
    idempotency store's ``scan_results()``. Each is an iterator driven through the
    portal."""
    stack_id = f"scan-{uuid.uuid4()}"
    manager = sync.StorageManager(backend, error_mode="strict")
    stack = manager.create_stack(stack_id)
    stack.set("step", "key", "value")
    stack.save()
    backend.adapter.set_cached_step(stack_id, {"cached": True})
    idempotency = backend.require_idempotency()
    assert idempotency.claim(stack_id) == "claimed"
    idempotency.complete(stack_id, {"done": 1})

    for kind, scan in (
        ("context", backend.adapter.scan_payloads("context")),
        ("step", backend.adapter.scan_payloads("step")),
        ("idempotency", idempotency.scan_results()),
    ):
        assert isinstance(scan, abc.Iterator) and not isinstance(scan, abc.AsyncIterator)
        items = list(scan)
        assert all(isinstance(item, StoredPayload) for item in items), kind
        assert any(stack_id in item.key for item in items), (kind, items)
        assert list(scan) == []  # exhausted, as any iterator


class Source:
    """An object with an async generator method, behind a plain :class:`Facade`."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.closed_in: str | None = None

    async def items(self, count: int) -> AsyncIterator[int]:
        try:
            for i in range(count):
                yield i
            if count < 0:
                yield -1
        finally:
            self.closed_in = threading.current_thread().name
            self.closed.set()

    async def failing(self) -> AsyncIterator[int]:
        yield 1
        raise siglo.InvalidArgumentError("broken")


def test_an_async_generator_method_is_iterated_and_closed_on_the_loop() -> None:
    """Any async generator method of a facaded object (not only ``scan_payloads``) is a
    plain iterator: each item awaited on the portal's loop, its exception raised, and
    the generator closed on the loop (its ``finally`` run there) when the iteration
    stops early — by ``close()``, by a ``with`` block, or by dropping the iterator."""
    portal = sync.get_portal()
    loop_thread = portal.call(lambda: threading.current_thread().name)

    whole = Source()
    assert list(Facade(whole, portal).items(3)) == [0, 1, 2]
    assert whole.closed.is_set() and whole.closed_in == loop_thread

    closed = Source()
    iterator = Facade(closed, portal).items(10)
    assert next(iterator) == 0
    assert not closed.closed.is_set()
    iterator.close()
    assert closed.closed.is_set() and closed.closed_in == loop_thread
    with pytest.raises(StopIteration):
        next(iterator)

    within = Source()
    with Facade(within, portal).items(10) as items:
        assert next(items) == 0
    assert within.closed.is_set()

    dropped = Source()
    for item in Facade(dropped, portal).items(10):
        if item == 1:
            break
    assert dropped.closed.wait(5) and dropped.closed_in == loop_thread

    failing = Facade(Source(), portal).failing()
    assert next(failing) == 1
    with pytest.raises(siglo.InvalidArgumentError, match="broken"):
        next(failing)
