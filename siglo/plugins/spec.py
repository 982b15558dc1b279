"""The hook specifications a siglo plugin may implement."""

from __future__ import annotations

from typing import Any

from siglo.plugins.backends import BackendRegistry
from siglo.plugins.markers import hookspec


class SigloHookSpec:
    """Hooks of the ``siglo`` plugin group."""

    @hookspec
    def siglo_register_backends(self, registry: BackendRegistry) -> None:
        """Declare backends with ``registry.add_backend(...)``.

        Declarations are data: the factory is a dotted path imported only when a URL of
        the backend is connected, so listing plugins never imports a driver.
        """

    @hookspec(firstresult=True)
    def siglo_master_key(self, scheme: str, reference: str) -> Any:
        """The master key (a :class:`siglo.keys.MasterKey`) the setting
        ``master_key = "<scheme>:<reference>"`` names, or ``None`` if ``scheme`` is not
        this plugin's: how a KMS supplies the master key of the envelope keys
        (docs/encryption.md)."""
