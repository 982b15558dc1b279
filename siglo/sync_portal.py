"""The portal of :mod:`siglo.sync`: an event loop in a daemon thread, and the way into
it from other threads (one per process, started on first use, closed at exit)."""

from __future__ import annotations

import asyncio
import atexit
import os
import selectors
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import ParamSpec, TypeVar

__all__ = ["Portal", "get_portal"]

P = ParamSpec("P")
T = TypeVar("T")


class Portal:
    """An asyncio event loop in a daemon thread, and the way into it from other threads."""

    def __init__(self, name: str = "siglo-sync") -> None:
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        while True:
            try:
                self._loop.run_forever()
                return  # stopped by close()
            except (KeyboardInterrupt, SystemExit):
                # Raised by an application's code in a task of the loop (a step): asyncio
                # sets it on the task and lets it out of the loop, which ended this thread
                # with every caller's call unanswered and the portal closed for all. Its
                # caller gets it through its future once the loop runs again (the
                # handles not run yet stay queued), and the other threads' calls go on.
                # Ctrl-C never lands here: signals go to the main thread.
                continue

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The portal's event loop."""
        return self._loop

    @property
    def pid(self) -> int:
        """The process the portal was started in (its loop runs in no other)."""
        return self._pid

    @property
    def running(self) -> bool:
        """Whether the loop still accepts calls."""
        return self._thread.is_alive() and not self._loop.is_closed()

    def run(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` on the portal's loop; return or raise its outcome."""

        async def call() -> T:
            return await fn(*args, **kwargs)

        return self._wait(call)

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call the plain function ``fn`` on the portal's loop thread (where the objects it
        touches live), and return or raise its outcome."""

        async def call() -> T:
            return fn(*args, **kwargs)

        return self._wait(call)

    def check(self) -> None:
        """Raise :class:`RuntimeError` if a call from here could not be served: from
        inside the portal's own loop, in a process forked after the portal started (its
        connections are the parent's sockets), or once the portal is closed. Every call
        checks this first; an object built from a facade checks it before it is built."""
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "siglo.sync called from inside its own event loop: in async code use the "
                "async API (await …), not siglo.sync"
            )
        if os.getpid() != self._pid:
            # The loop's thread did not survive the fork, and the connections opened
            # through it are the parent's sockets: never to be used from here.
            raise RuntimeError(
                f"this siglo.sync object was opened in process {self._pid}, before this "
                f"process ({os.getpid()}) was forked from it: a forked process opens its "
                "own (siglo.sync.connect after the fork: gunicorn's post_fork hook or no "
                "--preload, uWSGI's lazy-apps; docs/sync.md)"
            )
        if not self.running:
            raise RuntimeError("the siglo.sync portal is closed")

    def _wait(self, make: Callable[[], Awaitable[T]]) -> T:
        self.check()
        future: Future[T] = asyncio.run_coroutine_threadsafe(_as_coroutine(make), self._loop)
        try:
            return future.result()
        except BaseException:
            # An interrupted caller (Ctrl-C, a signal's time limit) is told at once, and
            # its call is cancelled on the loop, not left running. What cannot be
            # cancelled — a lock helper's function, in a thread — runs to its end there
            # with the lock held (sync_facades.run_in_own_thread).
            future.cancel()
            raise

    def forked_away(self) -> None:
        """In a child forked from the portal's process: give the inherited loop a
        selector of this process's own. The loop's ``epoll`` instance is shared with the
        parent, so the child removing one of its inherited sockets from it — a
        connection finalized as the child's interpreter exits, never used — removed the
        parent's registration of that socket: the parent's calls on it were never
        answered again (a black-box auditor, Redis under ``siglo.sync``, a child ending
        with ``sys.exit``)."""
        if os.getpid() == self._pid:
            return
        loop = self._loop
        if isinstance(getattr(loop, "_selector", None), selectors.BaseSelector):
            loop._selector = selectors.DefaultSelector()  # type: ignore[attr-defined]
        for task in asyncio.all_tasks(loop):
            # The parent's tasks (a connection's reader), which never run here: not
            # reported as destroyed while pending when this process exits.
            task._log_destroy_pending = False  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop the loop (after the calls in flight) and its thread."""
        if not self.running:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _as_coroutine(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


_portal_lock = threading.Lock()
_portal: Portal | None = None


def get_portal() -> Portal:
    """The process-wide portal every facade object uses, started on first use."""
    global _portal
    with _portal_lock:
        if _portal is None or not _portal.running:
            _portal = Portal()
        return _portal


def _after_fork_in_child() -> None:
    # A fork while another thread held the lock would leave it held here forever; the
    # parent's portal is of no use here (its thread is gone): the next call starts one.
    global _portal_lock
    _portal_lock = threading.Lock()
    if _portal is not None:
        _portal.forked_away()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_portal() -> None:
    with _portal_lock:
        if _portal is not None:
            _portal.close()
