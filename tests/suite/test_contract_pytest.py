"""The contract suite under pytest: the plugin collects nothing by itself, a
ContractSuite subclass checks a backend given by URL or factory."""

from __future__ import annotations

from pathlib import Path

import pytest

# Imported here, before any inner run: pytester's in-process runs undo the imports they
# make, so a suite module first imported by one run was imported afresh by the next,
# beside module state the first left (two cache rules of a later run then "not run").
import siglo_contract.pytest_suite  # noqa: F401
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
    # The cache rules pass; the other adapter rules are skipped as not selected.
    cache_rules = [r for r in ADAPTER_RULES if r.id.startswith("cache.")]
    assert len(cache_rules) == 6  # contract 1.5: cache.with-checkpoint
    result.assert_outcomes(passed=6, skipped=len(ADAPTER_RULES) - 6)


def test_the_docs_factory_example_runs_on_the_example_plugin(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """docs/running-the-contract-suite.md's factory class, with the example plugin's
    ``connect`` (which names its options, as docs/writing-a-backend.md asks): it wrote
    ``lambda **options: connect(url, **options)``, and every test failed with a
    ``TypeError`` for an option ``connect`` does not take (a black-box auditor)."""
    pytest.importorskip("siglo_filestore")
    pytester.makepyfile(
        test_contract=f"""
        from functools import partial

        from siglo_contract.pytest_suite import ContractSuite

        from siglo_filestore import connect


        class TestMyStoreFactory(ContractSuite):
            backend_factory = staticmethod(partial(connect, "filestore://{tmp_path}"))
            rules = ("checkpoint.roundtrip", "checkpoint.missing")
            examples = 5
            seed = 1
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, skipped=len(ADAPTER_RULES) - 2)


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


# -- declared deviations: honoured as siglo check honours them, strict-xfail style -------------

_DEVIANT_PLUGIN = """
from siglo import MISSING
from siglo.plugins import get_registry, hookimpl
from siglo_memory import connect
from siglo_memory.adapter import MemoryStorageAdapter


class MissIsNone(MemoryStorageAdapter):
    # cache.miss broken: a key never set reads as None (an expired one is still MISSING).
    async def _do_get_cached_step(self, key):
        got = await super()._do_get_cached_step(key)
        return None if got is MISSING and key not in self._cache else got


def broken(**options):
    backend = connect("memory://", **options)
    backend.adapter = MissIsNone(clock=options.get("clock"))
    return backend


def sound(**options):
    return connect("memory://", **options)


DEVIATION = {"rule": "cache.miss", "reason": "a miss reads as None", "kind": "not-yet"}


class Plugin:
    @hookimpl
    def siglo_register_backends(self, registry):
        for name, factory in (("deviant", broken), ("fixed", sound)):
            registry.add_backend(
                name,
                schemes=(name,),
                factory=lambda url, _f=factory, **options: _f(**options),
                capabilities=("checkpoints", "step_cache", "clock"),
                deviations=[DEVIATION],
            )


get_registry().register(Plugin(), "deviant-pytest-plugin")


def pytest_unconfigure(config):
    # pytester runs in this process: leave the registry as it was found.
    get_registry().unregister("deviant-pytest-plugin")
"""


def test_a_registered_deviation_is_an_expected_failure_until_the_rule_passes(
    pytester: pytest.Pytester,
) -> None:
    """A URL's plugin declares cache.miss: on the backend that breaks it the rule is
    xfailed (with the declaration's reason); on the fixed one it fails the run as
    XPASS(strict), as ``siglo check`` fails a declaration that is no longer true."""
    pytester.makeconftest(_DEVIANT_PLUGIN)
    pytester.makepyfile(
        test_contract="""
        from siglo_contract.pytest_suite import ContractSuite

        class TestDeviant(ContractSuite):
            url = "deviant://"
            rules = ("cache.miss", "cache.falsy-hit")
            seed = 1

        class TestFixed(ContractSuite):
            url = "fixed://"
            rules = ("cache.miss", "cache.falsy-hit")
            seed = 1
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "-rxX")
    # Per class: cache.falsy-hit passes; cache.miss is xfailed (deviant) or an
    # XPASS(strict) failure (fixed); every other rule is skipped as not selected.
    result.assert_outcomes(passed=2, xfailed=1, failed=1, skipped=2 * (len(ADAPTER_RULES) - 2))
    result.stdout.fnmatch_lines(
        [
            "*TestFixed.test_rule?cache.miss?*",
            "[[]XPASS(strict)[]] declared deviation from cache.miss (not-yet: a miss reads "
            "as None); while the rule passes, remove the declaration",
            "XFAIL *TestDeviant::test_rule?cache.miss? - declared deviation from cache.miss "
            "(not-yet: a miss reads as None)*",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # The declaration true (the rule fails), the run passes.
    assert pytester.runpytest("-p", "no:cacheprovider", "-q", "-k", "TestDeviant").ret == 0


def test_a_suite_class_declares_deviations_for_its_factory(pytester: pytest.Pytester) -> None:
    """A factory has no registration: the class's ``deviations`` declare, as Deviation
    objects or mappings; an unknown rule id is an error naming it."""
    pytester.makeconftest(_DEVIANT_PLUGIN.split("\n\nclass Plugin:")[0])
    pytester.makepyfile(
        test_contract="""
        from conftest import DEVIATION, broken, sound
        from siglo.plugins import Deviation
        from siglo_contract.pytest_suite import ContractSuite

        class TestDeclared(ContractSuite):
            backend_factory = broken
            capabilities = ("checkpoints", "step_cache")
            rules = ("cache.miss",)
            seed = 1
            deviations = (DEVIATION,)

        class TestStale(ContractSuite):
            backend_factory = sound
            capabilities = ("checkpoints", "step_cache")
            rules = ("cache.miss",)
            seed = 1
            deviations = (Deviation(**DEVIATION),)

        class TestUnknown(ContractSuite):
            backend_factory = sound
            rules = ("cache.miss",)
            deviations = ({"rule": "no.such", "reason": "r", "kind": "by-design"},)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("xfailed") == 1 and outcomes.get("failed") == 1, outcomes
    # TestUnknown: one error naming the rule, its other tests skipped pointing at it.
    assert outcomes.get("errors") == 1 and "passed" not in outcomes, outcomes
    result.stdout.fnmatch_lines(
        [
            "*TestUnknown: declared deviations from rules that are not "
            "adapter rules of docs/contract.md: no.such*"
        ]
    )


def test_a_suite_class_runs_every_rule_under_each_option_profile(
    pytester: pytest.Pytester,
) -> None:
    """``option_profiles`` (or ``--siglo-options all``): a bug only a user's defaults
    reach fails, its detail naming the profile; under the suite's options alone it passes."""
    pytester.makepyfile(
        test_contract="""
        from siglo_memory import connect
        from siglo_memory.adapter import MemoryStorageAdapter
        from siglo_contract.pytest_suite import ContractSuite

        class DropsExtraWithoutRetention(MemoryStorageAdapter):
            async def _do_get_checkpoint(self, stack_id, namespace=None, *, fallback=True):
                cp = await super()._do_get_checkpoint(stack_id, namespace, fallback=fallback)
                if cp is None or self.checkpoint_ttl_ms is not None:
                    return cp
                return cp.replace(extra={})

        def factory(**options):
            backend = connect("memory://", **options)
            backend.adapter = DropsExtraWithoutRetention(
                clock=options.get("clock"), checkpoint_ttl_ms=options.get("checkpoint_ttl_ms")
            )
            return backend

        class TestSuiteOptions(ContractSuite):
            backend_factory = factory
            rules = ("checkpoint.roundtrip",)
            seed = 1

        class TestBoth(ContractSuite):
            backend_factory = factory
            rules = ("checkpoint.roundtrip",)
            seed = 1
            option_profiles = ("suite", "user-defaults")
        """
    )
    skipped = 2 * (len(ADAPTER_RULES) - 1)
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, failed=1, skipped=skipped)
    result.stdout.fnmatch_lines(["*TestBoth.test_rule?checkpoint.roundtrip?*"])
    result.stdout.fnmatch_lines(["[[]option profile user-defaults[]]*"])
    flagged = pytester.runpytest("-p", "no:cacheprovider", "-q", "--siglo-options", "all")
    flagged.assert_outcomes(failed=2, skipped=skipped)
