"""Discovering plugins and resolving URL schemes to backends."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import threading
import traceback
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from siglo.errors import BackendNotFoundError, PluginError
from siglo.plugins.backends import BackendRegistry, BackendSpec
from siglo.plugins.markers import DISABLE_ENV, GROUP
from siglo.plugins.spec import SigloHookSpec
from siglo.urls import mask_credentials, refuse_fragment

__all__ = ["BackendRegistry", "BackendSpec", "PluginInfo", "PluginRegistry", "get_registry"]


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

        self._pm = pluggy.PluginManager(GROUP)
        self._pm.add_hookspecs(SigloHookSpec)
        self.plugins: dict[str, PluginInfo] = {}
        if load_entry_points:
            self._load_entry_points()

    @staticmethod
    def blocked_names() -> set[str]:
        """Plugin names listed in ``SIGLO_DISABLE_PLUGINS``."""

        raw = os.environ.get(DISABLE_ENV, "")
        return {n.strip() for n in raw.split(",") if n.strip()}

    def _load_entry_points(self) -> None:

        blocked = self.blocked_names()
        seen: dict[str, tuple[str | None, str]] = {}
        # siglo's own backends first: a third party's entry point or scheme that clashes
        # with a built-in one is the one refused, whatever the order of sys.path.
        found = sorted(
            importlib.metadata.entry_points(group=GROUP),
            key=lambda ep: _distribution(ep) != "siglo",
        )
        for ep in found:
            distribution = _distribution(ep)
            if ep.name in seen:
                if seen[ep.name] == (distribution, ep.value):
                    continue  # the same distribution seen twice on sys.path
                # Another distribution's entry point of the same name: loading it would
                # replace the first (a built-in backend disappeared), skipping it would
                # hide it. Reported broken, naming both.
                first = seen[ep.name][0] or seen[ep.name][1]
                self.plugins[f"{ep.name} ({distribution or ep.value})"] = PluginInfo(
                    name=ep.name,
                    distribution=distribution,
                    version=ep.dist.version if ep.dist is not None else None,
                    error=(
                        f"its entry point name {ep.name!r} is taken by {first}: not loaded; "
                        "give the plugin's entry point (group 'siglo') a name of its own"
                    ),
                )
                continue
            seen[ep.name] = (distribution, ep.value)
            dist = ep.dist
            info = PluginInfo(
                name=ep.name,
                distribution=distribution,
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
        # A scheme another working plugin serves already: a URL of it would reach
        # whichever was found first (its credentials with it), silently.
        taken = {
            scheme: other.name
            for other in self.plugins.values()
            if other is not info and other.error is None
            for spec in other.backends
            for scheme in spec.schemes
        }
        clashes = sorted({s for spec in registry.backends for s in spec.schemes if s in taken})
        if clashes:
            info.error = (
                f"it serves {', '.join(f'{s}://' for s in clashes)}, which plugin "
                f"{taken[clashes[0]]!r} serves already: not loaded (a URL would reach either)"
            )
            self._pm.unregister(name=name)  # none of its hooks answers either
            return
        info.backends = registry.backends

    # -- lookups -------------------------------------------------------------------

    def master_key(self, scheme: str, reference: str) -> Any:
        """The master key a plugin's ``siglo_master_key`` hook gives for ``scheme``, or
        ``None`` when no working plugin knows the scheme. Two plugins that both answer
        for it are refused, naming both: pluggy would take the last one registered, and
        hand it the reference (credentials and all) and its key (a black-box auditor),
        as a backend scheme served twice was before."""
        given = {"scheme": scheme, "reference": reference}
        answers = []
        for impl in reversed(self._pm.hook.siglo_master_key.get_hookimpls()):
            # Each as pluggy calls it: with the arguments it names (a subset may do).
            key = impl.function(*(given[name] for name in impl.argnames))
            if key is not None:
                answers.append((impl.plugin_name, key))
        if len(answers) > 1:
            raise PluginError(
                f"master_key scheme {scheme!r} is answered by more than one plugin "
                f"({', '.join(repr(name) for name, _ in answers)}): uninstall or disable "
                "one (SIGLO_DISABLE_PLUGINS)"
            )
        return answers[0][1] if answers else None

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
        refuse_fragment(url)
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


def _distribution(ep: importlib.metadata.EntryPoint) -> str | None:
    """The name of the distribution an entry point comes from."""
    return ep.dist.metadata["Name"] if ep.dist is not None else None
