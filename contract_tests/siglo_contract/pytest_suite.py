"""The contract suite under pytest, for a third party's own CI.

Subclass :class:`ContractSuite` in a test module, under a name pytest collects::

    from siglo_contract.pytest_suite import ContractSuite

    class TestMyStoreContract(ContractSuite):
        url = "mystore:///tmp/contract"          # or: backend_factory = my_factory

Each adapter rule of ``docs/contract.md`` becomes one test,
``test_rule[checkpoint.occ.conflict]`` …: it passes, fails with the shrunk
counter-example, or is skipped as not supported. The suite runs once per class. The
class itself is not collected (its name does not start with ``Test``), so importing it
adds no tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from siglo.backend import Backend
from siglo_contract.rules import ADAPTER_RULES
from siglo_contract.runner import Report, run_contract

__all__ = ["ContractSuite"]

_REPORTS: dict[type, Report] = {}
"""One run per suite class (a function-scoped fixture reads it)."""

_UNCONFIGURED: set[type] = set()
"""Suite classes with no backend: reported once, by their first test."""


class ContractSuite:
    """Base class: set :attr:`url` or :attr:`backend_factory` (or pass ``--siglo-url``)."""

    url: ClassVar[str | None] = None
    """A backend URL, resolved through the plugin registry (your plugin must be installed)."""
    backend_factory: ClassVar[Callable[..., Backend] | None] = None
    """Or a factory ``(**options) -> siglo.Backend``, called once per example."""
    capabilities: ClassVar[tuple[str, ...] | None] = None
    """With a factory: the capabilities to check (default: what the backend declares)."""
    rules: ClassVar[tuple[str, ...] | None] = None
    """Rule patterns to run (default: all, or ``--siglo-rule``)."""
    examples: ClassVar[int | None] = None
    seed: ClassVar[int | None] = None
    profile: ClassVar[str | None] = None
    options: ClassVar[dict[str, Any] | None] = None
    """Factory options (default: the suite's explicit TTLs, so the reference agrees)."""

    @pytest.fixture
    def siglo_contract_report(self, request: pytest.FixtureRequest) -> Report:
        """The suite's report for this class's backend (run once per class)."""
        cls = request.cls
        assert cls is not None
        if cls in _UNCONFIGURED:
            pytest.skip(f"{cls.__name__} has no backend: see its first test's error")
        if cls not in _REPORTS:
            _REPORTS[cls] = self._run(request.config, cls)
        return _REPORTS[cls]

    @staticmethod
    def _run(config: pytest.Config, cls: type[ContractSuite]) -> Report:
        target: Any = (
            cls.backend_factory
            if cls.backend_factory is not None
            else (cls.url or config.getoption("siglo_url"))
        )
        if target is None:
            # One error for the class, not one per rule: its other tests are skipped.
            _UNCONFIGURED.add(cls)
            pytest.fail(
                f"{cls.__name__}: set url or backend_factory, or pass --siglo-url", pytrace=False
            )
        return run_contract(
            target,
            rules=cls.rules or config.getoption("siglo_rule"),
            examples=cls.examples or config.getoption("siglo_examples"),
            seed=cls.seed if cls.seed is not None else config.getoption("siglo_seed"),
            profile=cls.profile or config.getoption("siglo_profile") or "ci",
            capabilities=cls.capabilities,
            options=cls.options,
        )

    @pytest.mark.parametrize("rule_id", [r.id for r in ADAPTER_RULES])
    def test_rule(self, siglo_contract_report: Report, rule_id: str) -> None:
        """One documented rule of the storage contract."""
        result = siglo_contract_report.results.get(rule_id)
        if result is None:
            pytest.skip("rule not selected")
        if result.verdict == "not supported":
            pytest.skip(f"not supported: {result.detail}")
        if result.verdict != "pass":
            pytest.fail(
                f"{rule_id}: {result.verdict}\n{result.detail}\n"
                f"(seed {siglo_contract_report.seed})",
                pytrace=False,
            )
