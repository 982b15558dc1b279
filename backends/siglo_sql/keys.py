"""Row ids: a 16-byte digest of the ids that name a row.

Ids are any non-empty strings without NUL (``siglo.validation.require_id``), so joining
them with NUL is unambiguous; an absent namespace is ``''``. 128 bits of BLAKE2b make a
collision practically impossible.
"""

from __future__ import annotations

from hashlib import blake2b

__all__ = ["MAX_MS", "at_most", "row_id"]


def row_id(*parts: str) -> bytes:
    """The primary key of the row named by ``parts``."""
    return blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=16).digest()


MAX_MS = 2**63 - 1
"""The latest time a BIGINT column holds (some 292 million years from the epoch)."""


def at_most(ms: int) -> int:
    """An expiry time as a column holds it: times past :data:`MAX_MS` mean "never"
    just as well, and must not overflow the column."""
    return ms if ms <= MAX_MS else MAX_MS
