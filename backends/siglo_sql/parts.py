"""Incremental saves on SQL (SPEC §13): a checkpoint stored as a skeleton and its contexts.

A document of at least ``incremental_min_bytes`` is stored in parts (cut and assembled by
:mod:`siglo.parts`): the checkpoint row's ``document`` holds the *skeleton* (the wire
document with ``"contexts":{}``), its ``parts`` column the step ids in order with each
context's digest, and ``checkpoint_parts`` one row per distinct context body, keyed by
``(id, digest)``. A save reads the ``parts`` it replaces (the row locked) and, in the
same transaction as the compare-and-set, inserts only the bodies whose digests are new
and deletes the ones no longer named: a step whose context did not change costs nothing.
On SQLite a new body as long as the one its step had, when this save drops that one,
is written over its row instead, digest and body in one statement (SQLite rewrites only
the pages whose bytes changed: ``parts_replace`` in :mod:`siglo_sql.statements`).

A row of ``checkpoint_parts`` holds the body its digest names, whatever writes it (an
insert, or a row written over, which is the delete of one digest and the insert of
another in one statement), so a reader needs no snapshot: it reads the checkpoint row,
then the bodies of its id; when every digest the row names is there, the document it
assembles is exactly the one saved. A digest missing means a save replaced the row in
between: the read starts again.
"""

from __future__ import annotations

from typing import Final

from siglo.parts import DIGEST_BYTES, BodyCache, Split, assemble, body_digest, split

__all__ = [
    "DEFAULT_INCREMENTAL_MIN_BYTES",
    "DIGEST_BYTES",
    "BodyCache",
    "Split",
    "assemble",
    "body_digest",
    "split",
]

DEFAULT_INCREMENTAL_MIN_BYTES: Final = 65_536
"""Documents this long or longer are saved in parts. Below it a save is the one-statement
compare-and-set of a whole row: up to some tens of kilobytes, writing the row whole costs
less than the transaction that writes its changed parts (a 16 KB save in parts took 3.5
times a whole one on SQLite, twice on PostgreSQL), and a run whose state grows to 1 MB
still writes less than twice the bytes that changed (1.47 times; at 16 KiB, 1.27):
docs/benchmarks-large-state.md, "The threshold"."""
