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

Declared deviations (the plugin registration's, or the class's :attr:`deviations`) are
honoured as ``siglo check`` honours them, in pytest's strict-xfail style: a declared rule
that fails is an expected failure (``xfailed``, the reason in the report), and one that
passes fails the run as ``XPASS(strict)`` until the declaration is removed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest

from siglo.backend import Backend
from siglo.errors import PluginError
from siglo.plugins import Deviation
from siglo_contract.rules import ADAPTER_RULES
from siglo_contract.runner import Report, run_contract, run_option_profiles
from siglo_contract.target import OPTION_PROFILES

__all__ = ["ContractSuite"]

_REPORTS: dict[type, Report] = {}
"""One run per suite class (a function-scoped fixture reads it)."""

_UNCONFIGURED: set[type] = set()
"""Suite classes with no backend: reported once, by their first test."""

_MISCONFIGURED: set[type] = set()
"""Suite classes whose settings the runner refused: reported once, by their first test."""


def _deviations(declared: tuple[Deviation | Mapping[str, str], ...]) -> list[Deviation]:
    """A class's ``deviations`` as :class:`Deviation` objects; a malformed one is a
    ``ValueError`` naming it (reported once for the class)."""
    out: list[Deviation] = []
    for item in declared:
        if isinstance(item, Deviation):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            raise ValueError(f"a deviation is a Deviation or a mapping, not {item!r}")
        fields: dict[str, Any] = dict(item)
        unknown = sorted(set(fields) - {"rule", "reason", "kind"})
        if unknown:
            raise ValueError(f"unknown fields {unknown} in the deviation {item!r}")
        try:
            out.append(Deviation(**fields))
        except (PluginError, TypeError) as exc:
            raise ValueError(f"deviation {item!r}: {exc}") from None
    return out


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
    option_profiles: ClassVar[tuple[str, ...] | None] = None
    """Without :attr:`options`: the option profiles every rule runs under
    (``("suite",)``, ``("user-defaults",)`` or both; default: ``--siglo-options``, else
    the suite's)."""
    deviations: ClassVar[tuple[Deviation | Mapping[str, str], ...] | None] = None
    """Rules the backend declares it does not meet, as :class:`~siglo.plugins.Deviation`
    or ``{"rule", "reason", "kind"}`` mappings (default: what the URL's plugin
    registration declares; a factory declares none)."""

    @pytest.fixture
    def siglo_contract_report(self, request: pytest.FixtureRequest) -> Report:
        """The suite's report for this class's backend (run once per class)."""
        cls = request.cls
        assert cls is not None
        if cls in _UNCONFIGURED:
            pytest.skip(f"{cls.__name__} has no backend: see its first test's error")
        if cls in _MISCONFIGURED:
            pytest.skip(f"{cls.__name__} is misconfigured: see its first test's error")
        if cls not in _REPORTS:
            try:
                _REPORTS[cls] = self._run(request.config, cls)
            except (ValueError, PluginError) as exc:
                # A bad setting (an unknown profile, a deviation from no adapter rule):
                # one error for the class, naming it; its other tests are skipped.
                _MISCONFIGURED.add(cls)
                pytest.fail(f"{cls.__name__}: {exc}", pytrace=False)
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
        common: dict[str, Any] = {}
        if cls.options is None:
            chosen = cls.option_profiles
            if chosen is None:
                flag = config.getoption("siglo_options") or "suite"
                chosen = tuple(OPTION_PROFILES) if flag == "all" else (flag,)
            common["profiles"] = chosen
            run: Callable[..., Report] = run_option_profiles
        else:
            common["options"] = cls.options
            run = run_contract
        return run(
            target,
            **common,
            rules=cls.rules or config.getoption("siglo_rule"),
            examples=cls.examples or config.getoption("siglo_examples"),
            seed=cls.seed if cls.seed is not None else config.getoption("siglo_seed"),
            profile=cls.profile or config.getoption("siglo_profile") or "ci",
            capabilities=cls.capabilities,
            deviations=None if cls.deviations is None else _deviations(cls.deviations),
        )

    @pytest.mark.parametrize("rule_id", [r.id for r in ADAPTER_RULES])
    def test_rule(
        self, siglo_contract_report: Report, rule_id: str, request: pytest.FixtureRequest
    ) -> None:
        """One documented rule of the storage contract."""
        result = siglo_contract_report.results.get(rule_id)
        if result is None:
            pytest.skip("rule not selected")
        if result.verdict == "not supported":
            pytest.skip(f"not supported: {result.detail}")
        deviation = result.deviation
        if deviation is not None:
            # A strict xfail: the declared rule failing is expected; the rule passing (the
            # runner's FAIL on a declared rule) ends the test normally, an XPASS(strict).
            request.node.add_marker(
                pytest.mark.xfail(
                    strict=True,
                    reason=f"declared deviation from {rule_id} ({deviation.kind}: "
                    f"{deviation.reason}); while the rule passes, remove the declaration",
                )
            )
            if result.verdict == "FAIL":
                return
        if result.verdict != "pass":
            pytest.fail(
                f"{rule_id}: {result.verdict}\n{result.detail}\n"
                f"(seed {siglo_contract_report.seed})",
                pytrace=False,
            )
