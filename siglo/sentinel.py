"""``MISSING``: the answer "nothing stored here", distinct from a stored ``None``."""

from __future__ import annotations

import enum
from typing import Final, Literal

__all__ = ["MISSING", "Missing"]


class Missing(enum.Enum):
    """The type of :data:`MISSING`."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "siglo.MISSING"

    def __bool__(self) -> Literal[False]:
        return False


MISSING: Final = Missing.MISSING
"""Returned where nothing is stored: a step-cache miss, an idempotency key with no result."""
