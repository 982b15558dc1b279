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

from typing import Final

import pluggy

GROUP: Final = "siglo"
"""The entry-point group (and pluggy project name) of siglo plugins."""

DISABLE_ENV: Final = "SIGLO_DISABLE_PLUGINS"
"""Comma-separated plugin names to skip, like tox's ``TOX_DISABLED_EXTERNAL_PLUGINS``."""

hookimpl: Final = pluggy.HookimplMarker(GROUP)
hookspec: Final = pluggy.HookspecMarker(GROUP)

from siglo.plugins.registry import (  # noqa: E402  (the markers must exist first)
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
    "PluginInfo",
    "PluginRegistry",
    "get_registry",
    "hookimpl",
    "hookspec",
]
