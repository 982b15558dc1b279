"""Row ids: a 16-byte digest of the ids that name a row.

Ids are any non-empty strings without NUL (``siglo.validation.require_id``), so joining
them with NUL is unambiguous; an absent namespace is ``''``. 128 bits of BLAKE2b make a
collision practically impossible. A stack's row id is computed on each of its saves and
loads: the last 256 are kept (a hit costs about a sixth of hashing, timeit; the cache
keeps only the id strings it was called with alive, and their digests).
"""

from __future__ import annotations

from functools import lru_cache
from hashlib import blake2b

__all__ = ["MAX_MS", "at_most", "row_id"]


@lru_cache(maxsize=256)
def row_id(*parts: str) -> bytes:
    """The primary key of the row named by ``parts``."""
    return blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=16).digest()


MAX_MS = 2**63 - 1
"""The latest time a BIGINT column holds (some 292 million years from the epoch)."""


def at_most(ms: int) -> int:
    """An expiry time as a column holds it: times past :data:`MAX_MS` mean "never"
    just as well, and must not overflow the column."""
    return ms if ms <= MAX_MS else MAX_MS
