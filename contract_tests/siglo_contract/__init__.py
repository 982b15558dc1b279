"""siglo's contract suite (shipped in the wheel as ``siglo_contract``).

Run it with ``siglo check URL``, from Python with :func:`run_contract`, or under pytest
by subclassing :class:`siglo_contract.pytest_suite.ContractSuite`. The rules it
checks are on ``docs/contract.md`` and in :mod:`siglo_contract.rules`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from siglo_contract.runner import Report, RuleResult, run_contract

__all__ = ["Report", "RuleResult", "run_contract"]


def __getattr__(name: str) -> Any:
    # Imported lazily: the pytest plugin imports this package in every user's test run.
    if name in __all__:
        from siglo_contract import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'siglo_contract' has no attribute {name!r}")
