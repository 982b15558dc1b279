"""Medians and spread of repeated measurements."""

from __future__ import annotations

import statistics
from typing import Any


def summarize(runs: list[float]) -> dict[str, Any]:
    """``median``, ``min``, ``max`` and ``spread`` ((max - min) / median) of ``runs``."""
    if not runs:
        return {"median": None, "min": None, "max": None, "spread": None}
    med = statistics.median(runs)
    return {
        "median": med,
        "min": min(runs),
        "max": max(runs),
        "spread": (max(runs) - min(runs)) / med if med else None,
    }
