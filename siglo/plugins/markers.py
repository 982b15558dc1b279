"""The entry-point group and pluggy's markers, apart so that the hook specs, the registry
and the package's ``__init__`` all import them without importing one another."""

from __future__ import annotations

from typing import Final

import pluggy

__all__ = ["DISABLE_ENV", "GROUP", "hookimpl", "hookspec"]

GROUP: Final = "siglo"
"""The entry-point group (and pluggy project name) of siglo plugins."""

DISABLE_ENV: Final = "SIGLO_DISABLE_PLUGINS"
"""Comma-separated plugin names to skip, like tox's ``TOX_DISABLED_EXTERNAL_PLUGINS``."""

hookimpl: Final = pluggy.HookimplMarker(GROUP)
hookspec: Final = pluggy.HookspecMarker(GROUP)
