"""Discovering plugins and resolving URL schemes to backends."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from siglo.adapter import Capability
from siglo.errors import BackendNotFoundError, DriverNotInstalledError, PluginError
from siglo.urls import mask_credentials

__all__ = ["BackendRegistry", "BackendSpec", "PluginInfo", "PluginRegistry", "get_registry"]


def _import_dotted(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


@dataclass(frozen=True)
class BackendSpec:
    """A backend as a plugin declares it.

    ``factory`` is ``"module:callable"`` (imported lazily) or a callable taking
    ``(url, **options)`` and returning a :class:`~siglo.Backend`. ``requires`` names the
    driver modules it needs and ``extra`` the siglo extra that installs them, for the
    error shown when they are missing. ``isolated``, if given, is an async context
    manager factory ``(url, **options)`` that yields a backend on private storage (own
    key prefix, schema …) and removes it afterwards: the contract suite uses it.
    """

    name: str
    schemes: tuple[str, ...]
    factory: str | Callable[..., Any]
    capabilities: frozenset[Capability]
    requires: tuple[str, ...] = ()
    extra: str | None = None
    description: str = ""
    isolated: str | Callable[..., Any] | None = None
    multiprocess: bool = False
    """Whether several processes connecting to one URL share the same storage."""
    plugin: str = ""
    install_hint: str | None = None
    """What to install when a driver is missing, for a third-party plugin
    (``"pip install 'siglo-mystore[fast]'"``); the default names ``siglo[extra]``."""

    def install_command(self) -> str:
        """The command that installs this backend's drivers."""
        if self.install_hint:
            return self.install_hint
        if self.extra:
            return f"pip install 'siglo[{self.extra}]'"
        return f"pip install {' '.join(self.requires)}" if self.requires else "nothing"

    def missing_drivers(self) -> list[str]:
        """Driver modules in ``requires`` that cannot be imported here."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    @property
    def driver_installed(self) -> bool:
        """Whether every driver module the backend needs is importable."""
        return not self.missing_drivers()

    def _require_drivers(self) -> None:
        missing = self.missing_drivers()
        if missing:
            raise DriverNotInstalledError(
                f"backend {self.name!r} needs {', '.join(missing)}, which is not installed: "
                f"{self.install_command()}"
            )

    def load_factory(self) -> Callable[..., Any]:
        """The factory callable, importing it (and checking drivers) on first use."""
        self._require_drivers()
        return _import_dotted(self.factory) if isinstance(self.factory, str) else self.factory

    def load_isolated(self) -> Callable[..., Any] | None:
        """The isolation factory, if the backend declares one."""
        if self.isolated is None:
            return None
        self._require_drivers()
        return _import_dotted(self.isolated) if isinstance(self.isolated, str) else self.isolated


class BackendRegistry:
    """Passed to ``siglo_register_backends``; collects the backends a plugin declares."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.backends: list[BackendSpec] = []

    def add_backend(
        self,
        name: str,
        *,
        schemes: Iterable[str],
        factory: str | Callable[..., Any],
        capabilities: Iterable[str | Capability] = (),
        requires: Iterable[str] = (),
        extra: str | None = None,
        description: str = "",
        isolated: str | Callable[..., Any] | None = None,
        multiprocess: bool = False,
        install_hint: str | None = None,
    ) -> None:
        """Declare one backend; invalid declarations raise :class:`PluginError`.

        See :class:`BackendSpec` for the fields.
        """
        schemes = tuple(s.lower() for s in schemes)
        if not name or not schemes:
            raise PluginError(f"plugin {self.plugin!r}: a backend needs a name and a scheme")
        try:
            caps = frozenset(Capability(c) for c in capabilities)
        except ValueError as exc:
            known = ", ".join(c.value for c in Capability)
            raise PluginError(
                f"plugin {self.plugin!r}, backend {name!r}: {exc}; known capabilities: {known}"
            ) from None
        self.backends.append(
            BackendSpec(
                name=name,
                schemes=schemes,
                factory=factory,
                capabilities=caps,
                requires=tuple(requires),
                extra=extra,
                description=description,
                isolated=isolated,
                multiprocess=multiprocess,
                plugin=self.plugin,
                install_hint=install_hint,
            )
        )


@dataclass
class PluginInfo:
    """One discovered plugin: where it comes from, what it declared, or why it failed."""

    name: str
    distribution: str | None = None
    version: str | None = None
    backends: list[BackendSpec] = field(default_factory=list)
    error: str | None = None
    blocked: bool = False


class PluginRegistry:
    """Loads plugins from entry points (and explicit registrations) and resolves schemes."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        from siglo.plugins import GROUP
        from siglo.plugins.spec import SigloHookSpec

        self._pm = pluggy.PluginManager(GROUP)
        self._pm.add_hookspecs(SigloHookSpec)
        self.plugins: dict[str, PluginInfo] = {}
        if load_entry_points:
            self._load_entry_points()

    @staticmethod
    def blocked_names() -> set[str]:
        """Plugin names listed in ``SIGLO_DISABLE_PLUGINS``."""
        from siglo.plugins import DISABLE_ENV

        raw = os.environ.get(DISABLE_ENV, "")
        return {n.strip() for n in raw.split(",") if n.strip()}

    def _load_entry_points(self) -> None:
        from siglo.plugins import GROUP

        blocked = self.blocked_names()
        seen: set[str] = set()
        for ep in importlib.metadata.entry_points(group=GROUP):
            if ep.name in seen:  # the same distribution seen twice on sys.path
                continue
            seen.add(ep.name)
            dist = ep.dist
            info = PluginInfo(
                name=ep.name,
                distribution=dist.metadata["Name"] if dist is not None else None,
                version=dist.version if dist is not None else None,
            )
            self.plugins[ep.name] = info
            if ep.name in blocked:
                info.blocked = True
                continue
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must not stop the others
                info.error = f"failed to import {ep.value}: {type(exc).__name__}: {exc}"
                continue
            self._register(ep.name, module, info)

    def register(self, plugin: ModuleType | object, name: str) -> PluginInfo:
        """Register a plugin object directly (tests, applications); returns its info."""
        info = PluginInfo(name=name, distribution=None, version=None)
        self.plugins[name] = info
        if name in self.blocked_names():
            info.blocked = True
            return info
        self._register(name, plugin, info)
        return info

    def unregister(self, name: str) -> None:
        """Forget a plugin registered under ``name``."""
        self.plugins.pop(name, None)
        if self._pm.get_plugin(name) is not None:
            self._pm.unregister(name=name)

    def _register(self, name: str, plugin: object, info: PluginInfo) -> None:
        try:
            self._pm.register(plugin, name=name)
        except Exception as exc:
            info.error = f"invalid plugin: {type(exc).__name__}: {exc}"
            return
        registry = BackendRegistry(name)
        for impl in self._pm.hook.siglo_register_backends.get_hookimpls():
            if impl.plugin_name != name:
                continue
            try:
                impl.function(registry=registry)
            except Exception as exc:
                info.error = (
                    f"siglo_register_backends raised {type(exc).__name__}: {exc}\n"
                    + "".join(traceback.format_exception_only(exc)).strip()
                )
                return
        info.backends = registry.backends

    # -- lookups -------------------------------------------------------------------

    def backends(self) -> list[BackendSpec]:
        """Every backend of every working plugin, in discovery order."""
        return [b for p in self.plugins.values() if p.error is None for b in p.backends]

    def backend(self, name: str) -> BackendSpec:
        """The backend registered under ``name``."""
        for spec in self.backends():
            if spec.name == name:
                return spec
        raise BackendNotFoundError(f"no backend named {name!r}; known: {self._known()}")

    def for_url(self, url: str) -> BackendSpec:
        """The backend serving ``url``'s scheme (``postgresql+psycopg`` matches as is)."""
        if not isinstance(url, str) or "://" not in url:
            raise BackendNotFoundError(
                f"not a backend URL: {mask_credentials(url)!r} (expected scheme://...)"
            )
        scheme = url.split("://", 1)[0].lower()
        for spec in self.backends():
            if scheme in spec.schemes:
                return spec
        broken = [p.name for p in self.plugins.values() if p.error]
        note = f"; plugins that failed to load: {', '.join(broken)}" if broken else ""
        raise BackendNotFoundError(
            f"no backend serves {scheme}:// URLs; registered schemes: {self._known()}{note}. "
            "Run `siglo backends` to see what is installed."
        )

    def _known(self) -> str:
        schemes = sorted({s for b in self.backends() for s in b.schemes})
        return ", ".join(f"{s}://" for s in schemes) or "(none)"


_lock = threading.Lock()
_registry: PluginRegistry | None = None


def get_registry(*, reload: bool = False) -> PluginRegistry:
    """The process-wide registry, loading entry points on first use."""
    global _registry
    with _lock:
        if _registry is None or reload:
            _registry = PluginRegistry()
        return _registry
