"""Registers the PostgreSQL backend with siglo's plugin registry."""

from __future__ import annotations

from siglo.plugins import BackendRegistry, hookimpl


@hookimpl
def siglo_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend(
        "postgres",
        schemes=("postgresql", "postgresql+psycopg", "postgres"),
        factory="siglo_postgres.connect:connect",
        isolated="siglo_postgres.connect:isolated",
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
        requires=("sqlalchemy", "psycopg", "psycopg_pool"),
        extra="postgres",
        multiprocess=True,
        bounded=True,
        # The store's largest item, as the adapter class declares it (not imported here:
        # a plugin declaration loads no driver).
        max_document_bytes=1_073_741_823,
        blob_store="siglo_postgres.blobs:open_store",
        description="PostgreSQL via a psycopg 3 connection pool",
    )
