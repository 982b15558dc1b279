"""``siglo.connect(url)``: one URL, one backend."""

from __future__ import annotations

from typing import Any

from siglo.backend import Backend
from siglo.errors import PluginError
from siglo.plugins import get_registry

__all__ = ["connect"]


def connect(url: str, **options: Any) -> Backend:
    """Connect to the backend that serves ``url``'s scheme.

    ``memory://``, ``sqlite:///path.db``, ``sqlite://``, ``postgresql://…`` and
    ``redis://…`` are built in; plugins add more. ``options`` go to the backend's factory
    (for example ``clock=`` or ``checkpoint_ttl_ms=``). Returns a :class:`Backend` with
    the storage adapter and the idempotency store, lock and nonce store of that backend.
    A missing driver raises :class:`~siglo.errors.DriverNotInstalledError` saying which
    extra to install.
    """
    spec = get_registry().for_url(url)
    backend = spec.load_factory()(url, **options)
    if not isinstance(backend, Backend):
        raise PluginError(
            f"backend {spec.name!r} (plugin {spec.plugin!r}) returned "
            f"{type(backend).__name__} from its factory, not a siglo.Backend"
        )
    return backend
