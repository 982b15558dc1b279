"""Plugin discovery through entry points, broken and blocked plugins, lazy drivers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import siglo
from siglo.plugins import BackendRegistry, PluginRegistry, get_registry, hookimpl


@pytest.fixture
def fake_distributions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Real installed-distribution metadata on sys.path: one plugin that cannot be
    imported, one whose hook raises, and one that works."""
    (tmp_path / "siglo_test_raising.py").write_text(
        textwrap.dedent(
            """
            from siglo.plugins import hookimpl

            @hookimpl
            def siglo_register_backends(registry):
                raise RuntimeError("registration exploded")
            """
        )
    )
    (tmp_path / "siglo_test_good.py").write_text(
        textwrap.dedent(
            """
            from siglo.plugins import hookimpl

            @hookimpl
            def siglo_register_backends(registry):
                registry.add_backend(
                    "goodstore",
                    schemes=("good",),
                    factory="siglo_memory.connect:connect",
                    capabilities=("checkpoints",),
                )
            """
        )
    )
    info = tmp_path / "siglo_test_plugins-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: siglo-test-plugins\nVersion: 1.2.3\n"
    )
    (info / "entry_points.txt").write_text(
        "[siglo]\n"
        "missing = siglo_test_no_such_module\n"
        "raising = siglo_test_raising\n"
        "good = siglo_test_good\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.rule("plugins.discovery")
def test_builtin_backends_come_from_entry_points() -> None:
    registry = PluginRegistry()
    memory = registry.plugins["memory"]
    assert memory.distribution == "siglo"
    assert memory.version == siglo.__version__
    spec = registry.for_url("memory://")
    assert spec.name == "memory" and spec.driver_installed
    assert siglo.Capability.CHECKPOINTS in spec.capabilities


@pytest.mark.rule("plugins.broken", "plugins.discovery")
def test_broken_plugins_are_reported_by_name_and_others_load(fake_distributions: Path) -> None:
    registry = PluginRegistry()
    missing, raising, good = (registry.plugins[n] for n in ("missing", "raising", "good"))
    assert missing.error is not None and "siglo_test_no_such_module" in missing.error
    assert raising.error is not None and "registration exploded" in raising.error
    assert good.error is None
    assert good.distribution == "siglo-test-plugins" and good.version == "1.2.3"
    assert registry.for_url("good://x").name == "goodstore"
    assert registry.for_url("memory://").name == "memory"
    with pytest.raises(siglo.BackendNotFoundError, match="failed to load: missing, raising"):
        registry.for_url("nosuch://x")


@pytest.mark.rule("plugins.broken", "plugins.discovery")
def test_a_plugin_clashing_with_another_is_reported_and_the_built_ins_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third party's entry point named ``memory`` made the built-in memory backend
    disappear (or vanished itself, as sys.path had it), and one serving ``redis://``
    was handed the Redis URLs, credentials included, when found first; neither was
    reported (a black-box auditor). Each is reported broken, naming what it clashes
    with, and the built-in backends serve their schemes."""
    (tmp_path / "siglo_test_clashing.py").write_text(
        textwrap.dedent(
            """
            from siglo.plugins import hookimpl

            @hookimpl
            def siglo_register_backends(registry):
                registry.add_backend(
                    "myredis",
                    schemes=("redis", "myredis"),
                    factory="siglo_memory.connect:connect",
                    capabilities=("checkpoints",),
                )
            """
        )
    )
    (tmp_path / "siglo_test_named.py").write_text(
        textwrap.dedent(
            """
            from siglo.plugins import hookimpl

            @hookimpl
            def siglo_register_backends(registry):
                registry.add_backend(
                    "named",
                    schemes=("named",),
                    factory="siglo_memory.connect:connect",
                    capabilities=("checkpoints",),
                )
            """
        )
    )
    info = tmp_path / "siglo_test_clash-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: siglo-test-clash\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[siglo]\nmemory = siglo_test_named\nclashing = siglo_test_clashing\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # found before siglo's own
    registry = PluginRegistry()
    assert registry.for_url("memory://").name == "memory"
    assert registry.plugins["memory"].distribution == "siglo"
    named = registry.plugins["memory (siglo-test-clash)"]
    assert named.error is not None and "entry point name 'memory' is taken by siglo" in named.error
    clashing = registry.plugins["clashing"]
    assert clashing.error is not None
    assert "redis://" in clashing.error and "'redis' serves already" in clashing.error
    assert registry.for_url("redis://127.0.0.1:6379/0").name == "redis"
    with pytest.raises(siglo.BackendNotFoundError):
        registry.for_url("myredis://x")  # nothing of the refused plugin serves


@pytest.mark.rule("plugins.blocked")
def test_blocked_plugins_are_not_loaded(
    fake_distributions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIGLO_DISABLE_PLUGINS", "good, raising")
    registry = PluginRegistry()
    assert registry.plugins["good"].blocked
    assert registry.plugins["raising"].error is None  # never imported
    with pytest.raises(siglo.BackendNotFoundError):
        registry.for_url("good://x")


class _NeedsDriver:
    @hookimpl
    def siglo_register_backends(self, registry: BackendRegistry) -> None:
        registry.add_backend(
            "needsdriver",
            schemes=("needs",),
            factory="siglo_test_driverless:connect",
            requires=("siglo_test_no_such_driver",),
            extra="needs",
        )


@pytest.mark.rule("plugins.driver-missing")
def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = PluginRegistry()
    registry.register(_NeedsDriver(), "needsdriver")
    monkeypatch.setattr("siglo.plugins.registry._registry", registry)
    spec = registry.for_url("needs://x")
    assert not spec.driver_installed
    assert spec.missing_drivers() == ["siglo_test_no_such_driver"]
    with pytest.raises(
        siglo.DriverNotInstalledError, match=r"pip install 'siglo\[needs\]>=0.1,<1'"
    ):
        siglo.connect("needs://x")


def test_invalid_declarations_are_plugin_errors() -> None:
    registry = PluginRegistry(load_entry_points=False)

    class BadCapability:
        @hookimpl
        def siglo_register_backends(self, registry: BackendRegistry) -> None:
            registry.add_backend("bad", schemes=("bad",), factory="x:y", capabilities=("flying",))

    info = registry.register(BadCapability(), "bad")
    assert info.error is not None and "flying" in info.error
    registry.unregister("bad")
    assert "bad" not in registry.plugins


def test_connect_errors() -> None:
    with pytest.raises(siglo.BackendNotFoundError, match="scheme://"):
        siglo.connect("no-scheme-here")
    with pytest.raises(siglo.BackendNotFoundError, match="siglo backends"):
        siglo.connect("nosuchscheme://x")


def test_factory_must_return_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = PluginRegistry(load_entry_points=False)

    class Wrong:
        @hookimpl
        def siglo_register_backends(self, registry: BackendRegistry) -> None:
            registry.add_backend("wrong", schemes=("wrong",), factory=lambda url: object())

    registry.register(Wrong(), "wrong")
    monkeypatch.setattr("siglo.plugins.registry._registry", registry)
    with pytest.raises(siglo.PluginError, match=r"not a siglo\.Backend"):
        siglo.connect("wrong://")


@pytest.mark.rule("plugins.capabilities-agree")
def test_registered_capabilities_must_match_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from siglo_memory.connect import connect as memory_connect

    registry = PluginRegistry(load_entry_points=False)

    class Overclaims:
        @hookimpl
        def siglo_register_backends(self, registry: BackendRegistry) -> None:
            registry.add_backend(
                "overclaims",
                schemes=("overclaims",),
                factory=lambda url, **kw: memory_connect("memory://"),
                capabilities=("checkpoints", "wait_records"),  # memory has more
            )

    registry.register(Overclaims(), "overclaims")
    monkeypatch.setattr("siglo.plugins.registry._registry", registry)
    with pytest.raises(siglo.PluginError, match="only on the backend: cache_events"):
        siglo.connect("overclaims://")


@pytest.mark.rule("plugins.capabilities-agree")
def test_every_installed_backend_registers_what_it_has() -> None:
    # The built-in backends and the example plugin: siglo.connect() checks agreement.
    for url in ("memory://", "sqlite://", "redis://127.0.0.1:6379/0", "filestore:///tmp/fh"):
        backend = siglo.connect(url)
        assert backend.capabilities == get_registry().for_url(url).capabilities


@pytest.mark.rule("plugins.driver-missing")
def test_a_third_party_names_its_own_package(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = PluginRegistry(load_entry_points=False)

    class ThirdParty:
        @hookimpl
        def siglo_register_backends(self, registry: BackendRegistry) -> None:
            registry.add_backend(
                "thirdparty",
                schemes=("thirdparty",),
                factory="siglo_test_driverless:connect",
                requires=("siglo_test_no_such_driver",),
                install_hint="pip install 'siglo-thirdparty[fast]'",
            )

    registry.register(ThirdParty(), "thirdparty")
    monkeypatch.setattr("siglo.plugins.registry._registry", registry)
    with pytest.raises(siglo.DriverNotInstalledError, match=r"siglo-thirdparty\[fast\]"):
        siglo.connect("thirdparty://x")
    from click.testing import CliRunner

    from siglo.cli import cli

    shown = CliRunner().invoke(cli, ["backends"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert "pip install 'siglo-thirdparty[fast]'" in shown.output  # not eaten as markup


async def test_typed_accessors_of_coordination_parts() -> None:
    backend = siglo.connect("memory://")
    assert backend.require_lock() is backend.lock
    assert backend.require_idempotency() is backend.idempotency
    assert backend.require_nonces() is backend.nonces
    bare = siglo.Backend(name="bare", url="bare://", adapter=backend.adapter)
    for require in (bare.require_lock, bare.require_idempotency, bare.require_nonces):
        with pytest.raises(siglo.CapabilityNotSupportedError, match="'bare' has no"):
            require()


_NO_DRIVERS = """
import importlib.abc, sys

class NoDrivers(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"sqlalchemy", "aiosqlite", "psycopg", "psycopg_pool", "redis"}:
            raise ImportError(f"{name} is not installed here")
        return None

sys.meta_path.insert(0, NoDrivers())
import json, siglo
from siglo.plugins import get_registry
rows = {name: info.error for name, info in get_registry().plugins.items()}
print(json.dumps(rows))
"""


@pytest.mark.rule("plugins.driver-missing")
def test_built_in_plugins_load_without_any_driver() -> None:
    # Importing a plugin imports no driver: what a core-only install sees when it loads
    # the plugins (tests/core/test_packaging.py checks a real one, and its messages).
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _NO_DRIVERS], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == {
        name: None for name in ("memory", "redis", "sqlite", "postgres", "filestore")
    }
