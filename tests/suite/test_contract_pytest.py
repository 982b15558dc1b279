"""The contract suite under pytest: the plugin collects nothing by itself, a
ContractSuite subclass checks a backend given by URL or factory."""

from __future__ import annotations

import pytest

from siglo_contract.rules import ADAPTER_RULES

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _quiet_asyncio_plugin(pytester: pytest.Pytester) -> None:
    # The inner runs do not read this project's configuration.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def test_plugin_adds_no_tests_to_a_users_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_user="""
        from siglo_contract.pytest_suite import ContractSuite  # imported, not subclassed

        def test_mine():
            assert True
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_plugin_registers_the_rule_marker(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*rule(*ids)*docs/contract.md*"])
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--siglo-url*"])


def test_contract_suite_by_url(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_contract="""
        from siglo_contract.pytest_suite import ContractSuite

        class TestMemoryContract(ContractSuite):
            url = "memory://"
            rules = ("cache.*",)
            examples = 5
            seed = 1
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    # 4 cache rules pass; the other adapter rules are skipped as not selected.
    result.assert_outcomes(passed=4, skipped=len(ADAPTER_RULES) - 4)


def test_contract_suite_by_option_and_factory_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_contract="""
        from siglo import MISSING
        from siglo_memory import connect
        from siglo_memory.adapter import MemoryStorageAdapter
        from siglo_contract.pytest_suite import ContractSuite

        class DropsNone(MemoryStorageAdapter):
            async def get_cached_step(self, key):
                value = await super().get_cached_step(key)
                return MISSING if value is None else value

        def broken(**options):
            backend = connect("memory://", **options)
            backend.adapter = DropsNone(clock=options.get("clock"))
            return backend

        class TestByOption(ContractSuite):
            pass

        class TestBroken(ContractSuite):
            backend_factory = broken
        """
    )
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "-q",
        "--siglo-url",
        "memory://",
        "--siglo-rule",
        "cache.falsy-hit",
        "--siglo-seed",
        "1",
    )
    # Two classes: one rule each is selected (one passes, one fails), the rest skipped.
    result.assert_outcomes(passed=1, failed=1, skipped=2 * (len(ADAPTER_RULES) - 1))
    result.stdout.fnmatch_lines(["*TestBroken::test_rule?cache.falsy-hit?*"])


def test_a_suite_without_a_backend_is_one_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_contract="""
        from siglo_contract.pytest_suite import ContractSuite

        class TestNothing(ContractSuite):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    # One error (the fixture's), every other rule skipped pointing at it.
    assert outcomes.get("errors") == 1, outcomes
    assert "failed" not in outcomes and "passed" not in outcomes
    result.stdout.fnmatch_lines(["*TestNothing: set url or backend_factory*"])
