"""The ``pytest11`` plugin siglo installs: a marker and options, and nothing collected.

It registers the ``rule`` marker (``@pytest.mark.rule("checkpoint.occ.conflict")``: the
contract rules a test checks) and the ``--siglo-url`` family of options that
:class:`~siglo_contract.pytest_suite.ContractSuite` reads. It defines no tests and
no autouse fixtures, so a user's test run is unchanged unless they subclass the suite.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("siglo", "siglo contract suite")
    group.addoption(
        "--siglo-url",
        default=None,
        help="Backend URL a ContractSuite subclass without its own url runs against.",
    )
    group.addoption(
        "--siglo-examples",
        type=int,
        default=None,
        help="Examples per contract state machine (overrides the profile).",
    )
    group.addoption("--siglo-seed", type=int, default=None, help="Seed of the contract suite.")
    group.addoption(
        "--siglo-profile",
        default=None,
        choices=("ci", "thorough"),
        help="Hypothesis budget of the contract suite (default: ci).",
    )
    group.addoption(
        "--siglo-options",
        default=None,
        choices=("suite", "user-defaults", "all"),
        help="Option profiles the backend is opened with (default: suite; all: every rule "
        "under the suite's options and a user's defaults).",
    )
    group.addoption(
        "--siglo-rule",
        action="append",
        default=None,
        metavar="PATTERN",
        help="Only contract rules matching PATTERN (repeatable).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rule(*ids): the docs/contract.md rule ids this test checks")
