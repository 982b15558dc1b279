"""Plugin discovery through entry points, broken and blocked plugins, lazy drivers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import siglo
from siglo.plugins import BackendRegistry, PluginRegistry, hookimpl


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
    with pytest.raises(siglo.DriverNotInstalledError, match=r"pip install 'siglo\[needs\]'"):
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
