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
the pages whose bytes changed: ``parts_replace`` in :mod:`siglo_sql.statements`); and a
row whose saves keep its length is saved whole, which SQLite writes over the old row
the same way, in one statement (:class:`SameLengthRows`).

A row of ``checkpoint_parts`` holds the body its digest names, whatever writes it (an
insert, or a row written over, which is the delete of one digest and the insert of
another in one statement), so a reader needs no snapshot: it reads the checkpoint row,
then the bodies of its id; when every digest the row names is there, the document it
assembles is exactly the one saved. A digest missing means a save replaced the row in
between: the read starts again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, NamedTuple

from siglo.parts import DIGEST_BYTES, BodyCache, Split, assemble, body_digest, split

__all__ = [
    "DEFAULT_INCREMENTAL_MIN_BYTES",
    "DIGEST_BYTES",
    "IN_PLACE_MAX_BYTES",
    "BodyCache",
    "SameLengthRows",
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


IN_PLACE_MAX_BYTES: Final = 384 * 1024
"""SQLite: the longest document :class:`SameLengthRows` may have saved whole. Above it
the pages SQLite compares cost about what the transaction of a save in parts does (a
1 MB document) or more (10 MB: three times as long, issue 34)."""

WINDOW: Final = 8
"""The saves of a row :class:`SameLengthRows` looks back on."""

MOST_CHANGES: Final = 2
"""Saves of the :data:`WINDOW` (the one being made among them) that may change the
document's length for it to be saved whole. At 256 KB a whole save of an unchanged
length took 0.20-0.25 ms, of a changed one 0.7, and a save in parts 0.35-0.45 (issue
34): whole costs less while at most about a third of the saves change the length."""


class _Seen(NamedTuple):
    length: int
    """The length of the document saved last."""
    changes: int
    """A bit per save, the last one lowest: whether it changed the document's length."""
    saves: int
    """How many saves the bits cover (at most :data:`WINDOW`)."""


class SameLengthRows:
    """SQLite: which documents long enough to be saved in parts are saved whole instead.

    SQLite writes a row whose new record is as long as the old one over it, page by
    page, and rewrites only the pages whose bytes differ; a row whose length changes is
    written again whole. So a whole save of a document whose length did not change
    writes the pages of the contexts that changed, as a save in parts does, in one
    statement instead of a transaction and with no context to recognise and hash (a
    256 KB document of 16 contexts, two replaced by ones as long: 0.2-0.25 against
    0.35-0.45 ms). A row whose recent saves (the last :data:`WINDOW`, this one among
    them) changed its length at most :data:`MOST_CHANGES` times is saved whole, if it
    is no longer than :data:`IN_PLACE_MAX_BYTES` and this adapter saw at least three of
    its saves; any other is saved in parts, so a document that grows is never written
    whole again. What it remembers is this process's saves (at most ``max_rows`` rows,
    the least recently saved forgotten first): a hint about what costs less, never a
    fact about what is stored, since either layout holds the same document.
    """

    def __init__(self, max_rows: int = 100_000) -> None:
        self.max_rows = max_rows
        self._seen: OrderedDict[bytes, _Seen] = OrderedDict()

    def whole(self, key: bytes, length: int) -> bool:
        """Whether the document of row ``key``, ``length`` bytes long, is saved whole."""
        seen = self._seen.get(key)
        if seen is None or seen.saves < 2 or length > IN_PLACE_MAX_BYTES:
            return False
        return _window(seen, length).bit_count() <= MOST_CHANGES

    def saved(self, key: bytes, length: int) -> None:
        """Note a save of row ``key`` whose document is ``length`` bytes long."""
        seen = self._seen.pop(key, None)
        if seen is None:
            self._seen[key] = _Seen(length, 0, 0)
        else:
            saves = min(seen.saves + 1, WINDOW)
            self._seen[key] = _Seen(length, _window(seen, length), saves)
        if len(self._seen) > self.max_rows:
            self._seen.popitem(last=False)


def _window(seen: _Seen, length: int) -> int:
    """``seen``'s bits with one more save, of a document ``length`` bytes long."""
    return ((seen.changes << 1) | (length != seen.length)) & ((1 << WINDOW) - 1)
