"""Registers the SQLite backend with siglo's plugin registry."""

from __future__ import annotations

from siglo.plugins import BackendRegistry, hookimpl


@hookimpl
def siglo_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend(
        "sqlite",
        schemes=("sqlite", "sqlite+aiosqlite"),
        factory="siglo_sqlite.connect:connect",
        isolated="siglo_sqlite.connect:isolated",
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
        requires=("sqlalchemy", "aiosqlite"),
        extra="sqlite",
        # A file is shared by every process that opens it; sqlite:// (memory) is private
        # to one backend: see siglo_sqlite.is_memory_url.
        multiprocess=True,
        bounded=True,
        # The store's largest item, as the adapter class declares it (not imported here:
        # a plugin declaration loads no driver).
        max_document_bytes=1_000_000_000,
        description="SQLite file (WAL) or private in-memory database, via aiosqlite",
    )
