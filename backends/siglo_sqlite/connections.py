"""Opening an SQLite file: the settings each connection to it takes, and the plain
``sqlite3`` connections used beside aiosqlite's.

A file-backed backend has four connections: aiosqlite's (every statement on its own
thread; ``SqliteDatabase``), a read-only one and a writer used on the event loop's thread
(``SqliteDatabase.read`` and ``SqliteDatabase.write``), and one that checkpoints the WAL
on the backend's worker thread (:mod:`siglo_sqlite.wal_checkpoints`). The three plain
ones are opened here, on that worker thread.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Final

import aiosqlite

__all__ = [
    "CACHE_SIZE_KIB",
    "INLINE_WRITE_MODES",
    "MMAP_SIZE_BYTES",
    "SYNCHRONOUS_MODES",
    "daemonic",
    "file_pragmas",
    "is_busy",
    "open_checkpointer",
    "open_reader",
    "open_syncing_writer",
    "open_writer",
]

SYNCHRONOUS_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
MMAP_SIZE_BYTES: Final = 1 << 30
"""``PRAGMA mmap_size``: reads of a file up to 1 GiB go through the OS page cache mapped
into the process instead of a ``read()`` per page (address space, not memory)."""
CACHE_SIZE_KIB: Final = 65_536
"""``PRAGMA cache_size`` (64 MiB, SQLite's default is 2 MiB): with the default, a keyed
lookup in a million-checkpoint file was twice as slow as in a thousand-checkpoint one."""
INLINE_WRITE_MODES: Final = frozenset({"OFF", "NORMAL"})
"""The ``synchronous`` modes whose commits ``SqliteDatabase.write`` may run on the
event loop's thread: in WAL mode neither syncs a commit."""


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (or busy)."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def file_pragmas(synchronous: str) -> tuple[str, ...]:
    """The settings of the aiosqlite connection to a file."""
    return (
        # WAL: readers never block the writer, and a commit is one append.
        "journal_mode = WAL",
        f"synchronous = {synchronous}",
        # Keeps keyed lookups flat as the file grows (docs/benchmarks.md, scale).
        f"mmap_size = {MMAP_SIZE_BYTES}",
        f"cache_size = -{CACHE_SIZE_KIB}",
    )


def _open_inline(path: str, wait_ms: int, *pragmas: str) -> sqlite3.Connection:
    """A connection used on the event loop's thread: autocommit (each statement its own
    transaction and snapshot), never waiting for a lock once open, the main connection's
    page settings, and ``pragmas``.

    Setting it up reads the schema, and that read may meet a lock: another process
    opening the file (its first connection briefly locks the WAL index) or holding it.
    Until it is set up it waits for a lock up to ``wait_ms``, as the main connection
    does; it is set up off the event loop's thread, so that wait never holds the loop.
    """
    # check_same_thread off: set up on a worker thread, then only ever used from the
    # loop's thread.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        for pragma in (
            f"busy_timeout = {max(0, wait_ms)}",
            *pragmas,
            f"mmap_size = {MMAP_SIZE_BYTES}",
            f"cache_size = -{CACHE_SIZE_KIB}",
            "busy_timeout = 0",
        ):
            conn.execute(f"PRAGMA {pragma}")
    except BaseException:
        conn.close()
        raise
    return conn


def open_reader(path: str, wait_ms: int) -> sqlite3.Connection:
    """The connection ``SqliteDatabase.read`` uses: read-only."""
    return _open_inline(path, wait_ms, "query_only = ON")


def open_writer(path: str, wait_ms: int, synchronous: str) -> sqlite3.Connection:
    """The connection ``SqliteDatabase.write`` uses: the main connection's durability,
    never checkpointing the WAL (the checkpointer's thread does)."""
    return _open_inline(path, wait_ms, f"synchronous = {synchronous}", "wal_autocheckpoint = 0")


def open_syncing_writer(path: str, wait_ms: int, synchronous: str) -> sqlite3.Connection:
    """At a ``synchronous`` whose commits sync, the connection that commits the batches
    of keyed writes on the backend's own thread (``SqliteDatabase``): off the loop, so it
    checkpoints the WAL itself as SQLite does by default."""
    return _open_inline(path, wait_ms, f"synchronous = {synchronous}")


def open_checkpointer(path: str, wait_ms: int, synchronous: str) -> sqlite3.Connection:
    """The connection that checkpoints the WAL of the writer's commits, on a thread of its
    own (:mod:`siglo_sqlite.wal_checkpoints`); it syncs as the main connection does."""
    return _open_inline(path, wait_ms, f"synchronous = {synchronous}")


def daemonic(conn: aiosqlite.Connection) -> aiosqlite.Connection:
    """``conn`` (not yet awaited) with its worker thread made a daemon.

    aiosqlite's thread is not a daemon, and it holds its last job, and through it the
    connection, until the next one comes: a backend that is never closed kept the
    process from exiting, forever (aiosqlite issue 299). A daemon thread lets the process
    exit as it does with an open plain ``sqlite3`` connection; SQLite's journal makes
    that safe (a transaction not committed is rolled back when the file is next opened,
    one committed is kept). Before 0.22 the connection was itself the thread; since, the
    thread is its ``_thread``. tests/backends/test_sqlite_backend.py fails if an unclosed backend
    stops the process exiting.
    """
    thread = conn if isinstance(conn, threading.Thread) else getattr(conn, "_thread", None)
    if isinstance(thread, threading.Thread) and not thread.is_alive():
        thread.daemon = True
    return conn
