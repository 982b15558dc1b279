"""A run's ``meta`` for tests that render the benchmark report (benchmarks/report.py)."""

from __future__ import annotations

from typing import Any


def report_meta(**extra: Any) -> dict[str, Any]:
    """The fields :func:`benchmarks.report.markdown` reads of a run, with ``extra``."""
    return {
        "started": "2026-12-02T00:00:00Z",
        "finished": "2026-12-02T00:01:00Z",
        "repeat": 3,
        "slices": 3,
        "quick": False,
        "machine": {
            "cpu": "x",
            "cores": 2,
            "memory_gb": 1,
            "os": "y",
            "python": "3",
            "sqlite": "3",
            "siglo_commit": "abc",
        },
        "load": {},
        **extra,
    }
