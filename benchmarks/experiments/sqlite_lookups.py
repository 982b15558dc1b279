"""Measured SQLite's own keyed lookup at 1,000 and 1,000,000 rows, without siglo.

``python -m benchmarks.experiments.sqlite_lookups``: two files in a temporary directory
with siglo's checkpoints table (its columns, its three indexes, 16-byte digest ids in
random order) and small documents, as the scale benchmark fills them; then siglo's load
statement run by plain ``sqlite3`` with siglo's page settings, 2,000 random ids per
sample, on a fresh connection (cold: as the scale benchmark's reader meets a file it has
not read) and again after 20,000 lookups (warm), the two files alternating. Prints the
median µs of each and the large / small ratio: what the scale target's ratio is for the
database alone.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from siglo_sqlite.connections import CACHE_SIZE_KIB, MMAP_SIZE_BYTES

SAMPLES = 2_000
WARMING = 20_000
_DOCUMENT = (
    b'{"stackId":"scale-x","revision":1,"timestamp":1,"contexts":{"step-0":'
    b'{"status":"done","n":1}},"chains":[],"status":"running","metadata":{},'
    b'"storageVersion":2}'
)
_LOAD = "SELECT document FROM cp WHERE id = ? AND (gone_at IS NULL OR gone_at > ?)"


def _id(i: int) -> bytes:
    return hashlib.blake2b(f"scale-{i}".encode(), digest_size=16).digest()


def _build(path: Path, rows: int) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(
        "CREATE TABLE cp (id BLOB PRIMARY KEY, namespace TEXT NOT NULL, stack_id TEXT NOT "
        "NULL, revision INTEGER NOT NULL, status TEXT NOT NULL, gone_at INTEGER, document "
        "BLOB NOT NULL, workflow_id TEXT, updated_at INTEGER, expires_at INTEGER)"
    )
    db.execute("CREATE INDEX cp_gone_at ON cp (gone_at) WHERE gone_at IS NOT NULL")
    db.execute("CREATE INDEX cp_namespace ON cp (substr(namespace, 1, 64), id)")
    db.executemany(
        "INSERT INTO cp VALUES (?, '', ?, 1, 'running', NULL, ?, 'w', 1, NULL)",
        ((_id(i), f"scale-{i}", _DOCUMENT) for i in range(rows)),
    )
    db.commit()
    db.close()


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA mmap_size = {MMAP_SIZE_BYTES}")
    db.execute(f"PRAGMA cache_size = -{CACHE_SIZE_KIB}")
    return db


def _median_us(db: sqlite3.Connection, rows: int, rng: random.Random, n: int) -> float:
    times = []
    for _ in range(n):
        key = _id(rng.randrange(rows))
        t0 = time.perf_counter_ns()
        assert db.execute(_LOAD, (key, 0)).fetchall()
        times.append((time.perf_counter_ns() - t0) / 1000)
    return statistics.median(times)


def main(sizes: tuple[int, int] = (1_000, 1_000_000), rounds: int = 3) -> None:
    """Build the two files (``sizes`` rows), then print ``rounds`` rounds of medians."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {rows: Path(tmp) / f"{rows}.db" for rows in sizes}
        for rows, path in paths.items():
            _build(path, rows)
        for round_ in range(rounds):
            rng = random.Random(round_)
            conns = {rows: _connect(path) for rows, path in paths.items()}
            cold = {rows: _median_us(conns[rows], rows, rng, SAMPLES) for rows in sizes}
            for rows in sizes:
                _median_us(conns[rows], rows, rng, WARMING)
            warm = {rows: _median_us(conns[rows], rows, rng, SAMPLES) for rows in sizes}
            for conn in conns.values():
                conn.close()
            small, large = sizes
            print(
                f"round {round_ + 1}: cold {cold[small]:.1f} / {cold[large]:.1f} us "
                f"(ratio {cold[large] / cold[small]:.2f}); warm {warm[small]:.1f} / "
                f"{warm[large]:.1f} us (ratio {warm[large] / warm[small]:.2f})"
            )


if __name__ == "__main__":
    main()
