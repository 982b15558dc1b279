"""siglo's plugin system: pluggy hooks under the entry-point group ``siglo``.

A plugin is a module listed in a distribution's ``[project.entry-points.siglo]`` table
that implements :func:`~siglo.plugins.spec.SigloHookSpec.siglo_register_backends`::

    from siglo.plugins import BackendRegistry, hookimpl

    @hookimpl
    def siglo_register_backends(registry: BackendRegistry) -> None:
        registry.add_backend("mystore", schemes=("mystore",), factory="my_pkg:connect",
                             capabilities=("checkpoints",))
"""

from __future__ import annotations

from siglo.plugins.backends import Deviation
from siglo.plugins.markers import DISABLE_ENV, GROUP, hookimpl, hookspec
from siglo.plugins.registry import (
    BackendRegistry,
    BackendSpec,
    PluginInfo,
    PluginRegistry,
    get_registry,
)

__all__ = [
    "DISABLE_ENV",
    "GROUP",
    "BackendRegistry",
    "BackendSpec",
    "Deviation",
    "PluginInfo",
    "PluginRegistry",
    "get_registry",
    "hookimpl",
    "hookspec",
]
