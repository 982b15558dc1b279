"""Registers ``filestore://`` with siglo (the module the ``siglo`` entry point names)."""

from __future__ import annotations

from siglo.plugins import BackendRegistry, hookimpl


@hookimpl
def siglo_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend(
        "filestore",
        schemes=("filestore",),
        factory="siglo_filestore.store:connect",
        isolated="siglo_filestore.store:isolated",
        capabilities=("checkpoints", "step_cache", "clock"),
        multiprocess=True,
        description="Example plugin: one JSON file per checkpoint in a directory",
    )
