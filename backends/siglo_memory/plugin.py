"""Registers the memory backend with siglo's plugin registry."""

from __future__ import annotations

from siglo.plugins import BackendRegistry, hookimpl


@hookimpl
def siglo_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend(
        "memory",
        schemes=("memory",),
        factory="siglo_memory.connect:connect",
        capabilities=(
            "checkpoints",
            "wait_records",
            "workflow_lock",
            "step_cache",
            "context_stream",
            "cache_events",
            "idempotency",
            "locks",
            "nonces",
            "clock",
            "listing",
            "deletion",
            "due_waits",
            "payload_scan",
        ),
        description="In-process reference backend (the contract suite's model)",
    )
