"""Checkpoints of the WAL that the inline writes append to, on the backend's own thread.

The writer on the event loop's thread never checkpoints the WAL (``wal_autocheckpoint =
0``): a checkpoint copies pages back into the file and syncs, which would stall the loop.
Every so many inline writes, :class:`WalCheckpoints` runs one on a connection and a
thread of its own, beside them; it changes nothing a call reads, so calls go on while it
runs, and it is submitted without a turn of the loop, so a caller saving in a loop that
never waits still has its WAL checkpointed. (Before, one write in 32 went through the
driver, whose commit checkpointed: with 32 callers the driver then always had one in
flight, and every write took the hop.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import time
from typing import Final

from siglo import masking

__all__ = [
    "CHECKPOINT_EVERY_MAX",
    "CHECKPOINT_EVERY_MIN",
    "CHECKPOINT_FRAMES",
    "CHECKPOINT_RESTART_WAIT_MAX_MS",
    "CHECKPOINT_RESTART_WAIT_MS",
    "WalCheckpoints",
]

_log = masking.logger("siglo.sqlite")

CHECKPOINT_FRAMES: Final = 1_000
"""The WAL frames (pages) the inline writes let the WAL reach before it starts over:
SQLite's own ``wal_autocheckpoint`` default. A checkpoint starts at about half, and writes
wait for it if they reach the other half before it ends."""
CHECKPOINT_EVERY_MIN: Final = 32
"""The fewest inline writes between two checkpoints of the WAL; also the first interval."""
CHECKPOINT_EVERY_MAX: Final = 4_096
"""The most (small writes fill 1,000 frames slowly)."""
CHECKPOINT_RESTART_WAIT_MS: Final = 10
"""How long the checkpoint's last step tries to start the WAL over while another
connection reads or writes it, before leaving that to a later checkpoint: the inline
writes wait for that step, so it must stay short."""
CHECKPOINT_RESTART_WAIT_MAX_MS: Final = 640
"""The longest that step tries: after each checkpoint that could not start the WAL over
(a loaded machine, where the thread holding the write lock is not scheduled for 10 ms),
the next one tries twice as long, up to this; one that succeeds starts again from
:data:`CHECKPOINT_RESTART_WAIT_MS`. Without it a busy machine's WAL grew unbounded, every
checkpoint giving up; with a maximum of 160 ms a full test run's 32 writers still grew
it to 8.5 MB once (the writes wait for this step on the loop, never blocking it)."""


class WalCheckpoints:
    """The checkpoints of one open file's WAL: when the next is due, whether one is under
    way, and whether a write must wait for it.

    ``conn`` is the connection that checkpoints (opened by
    :func:`siglo_sqlite.connections.open_checkpointer`), ``thread`` the backend's own
    worker thread, ``description`` names the database in the log.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        thread: concurrent.futures.ThreadPoolExecutor,
        description: str,
    ) -> None:
        self.conn = conn
        self.thread = thread
        self.description = description
        self._writes = 0
        """Inline writes since the last checkpoint was asked."""
        self._every = CHECKPOINT_EVERY_MIN
        """Inline writes between two checkpoints (adapts to the frames found)."""
        self._submitted: concurrent.futures.Future[None] | None = None
        """The checkpoint submitted last (done once it has answered)."""
        self._done: asyncio.Future[None] | None = None
        """The same, as the loop's future: what a write the checkpoint holds up waits for."""
        self._restarting = False
        """True while the checkpoint's last step runs: writes wait for it to end."""
        self._since_restart = 0
        """Inline writes since the WAL last started over (frames per write, for the interval)."""
        self._stopped = False
        self._gave_up = 0
        """Checkpoints in a row whose last step gave up (each doubles the next one's try)."""

    def wrote(self) -> None:
        """Count one inline write; start a checkpoint once the interval's worth are in."""
        self._writes += 1
        self._since_restart += 1
        if self._writes >= self._every:
            self.soon()

    def under_way(self) -> bool:
        """Whether a checkpoint is under way."""
        return self._done is not None and not self._done.done()

    def in_the_way(self) -> bool:
        """Whether a write must wait for the checkpoint under way: its last step holds the
        write lock, or the WAL has grown as far as it may before that step."""
        return self.under_way() and (self._restarting or self._writes >= self._every)

    async def answered(self) -> None:
        """Wait for the checkpoint under way: work, like a checkpoint a commit on the
        driver runs (its last step waits at most :data:`CHECKPOINT_RESTART_WAIT_MS` for
        other connections), so not cut short by the call's bound."""
        checkpoint = self._done
        if checkpoint is not None and not checkpoint.done():
            await asyncio.wait({checkpoint})

    def soon(self) -> None:
        """Start a checkpoint on :attr:`thread`, unless one runs (or this file is closing)."""
        if not self._stopped and (self._submitted is None or self._submitted.done()):
            self._writes = 0
            self._submitted = self.thread.submit(self._checkpoint)
            self._done = asyncio.wrap_future(self._submitted)

    async def stop(self) -> None:
        """Start no more checkpoints, and wait for the one under way to end (milliseconds;
        it never raises): its connection is closed next."""
        self._stopped = True
        checkpoint, self._submitted = self._submitted, None
        self._done = None
        if checkpoint is not None and not checkpoint.done():
            await asyncio.wait({asyncio.wrap_future(checkpoint)})

    def _checkpoint(self) -> None:
        """Checkpoint the WAL and start it over. Runs on :attr:`thread`; never raises (a
        failed checkpoint is tried again at the next interval; one whose last step gave up,
        after :data:`CHECKPOINT_EVERY_MIN` writes).

        Two steps. ``PASSIVE`` copies the WAL's frames into the file without taking a
        lock, while the inline writes go on (they append more). ``RESTART`` then copies
        the frames appended meanwhile and makes the next write start the WAL from its
        beginning, so the file stops growing. It needs the write lock and no reader in
        the WAL: new writes wait on the loop while it runs (:meth:`in_the_way`), and it
        tries again for at most :data:`CHECKPOINT_RESTART_WAIT_MS` while another
        connection reads or writes — longer after one that gave up
        (:data:`CHECKPOINT_RESTART_WAIT_MAX_MS`). (SQLite's own busy wait would sleep a
        millisecond first, with the writes waiting.) The frames the WAL held at the end set the
        interval to the next checkpoint, aiming at :data:`CHECKPOINT_FRAMES`."""
        conn = self.conn
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self._restarting = True
            wait_ms = CHECKPOINT_RESTART_WAIT_MS * 2 ** min(self._gave_up, 8)
            wait_ms = min(wait_ms, max(CHECKPOINT_RESTART_WAIT_MAX_MS, CHECKPOINT_RESTART_WAIT_MS))
            give_up = time.monotonic() + wait_ms / 1000
            while True:
                busy, frames, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                if not busy or time.monotonic() >= give_up:
                    break
                time.sleep(0.0002)
        except Exception as exc:
            _log.debug("checkpointing the WAL of %s failed: %s", self.description, exc)
            return
        finally:
            self._restarting = False
        if busy:
            # Try again soon, and longer: left at the interval that aims at 1,000 frames,
            # a loaded machine's WAL had only a few tries in 600 writes, and grew past
            # 10 MB once every one of them gave up (a full test run on two cores).
            self._gave_up += 1
            self._every = CHECKPOINT_EVERY_MIN
            return
        self._gave_up = 0
        writes, self._since_restart = self._since_restart, 0
        # The WAL starts over: the writes counted while this checkpoint ran are in the
        # frames it copied (writes wait for its last step), not in the next interval's.
        # Left counted, the first write after a long checkpoint started another one at
        # once, for a WAL of a few frames, and the next real one came a whole interval
        # later: twice the frames aimed at.
        self._writes = 0
        if frames > 0 and writes > 0:
            every = int(CHECKPOINT_FRAMES / 2 / (frames / writes))
            # At most twice the last interval: under load a measurement saw far fewer
            # frames than its writes had made, and the next interval, 4,096 writes of
            # 4 KB, let the WAL pass 7 MB. Small writes still reach the maximum within
            # a few checkpoints.
            every = min(every, 2 * self._every)
            self._every = min(CHECKPOINT_EVERY_MAX, max(CHECKPOINT_EVERY_MIN, every))
