"""Registers the Redis backend with siglo's plugin registry."""

from __future__ import annotations

from siglo.plugins import BackendRegistry, hookimpl


@hookimpl
def siglo_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend(
        "redis",
        schemes=("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel"),
        factory="siglo_redis.connect:connect",
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
            "listing",
            "deletion",
            "due_waits",
            "payload_scan",
        ),
        requires=("redis",),
        extra="redis",
        description="Redis / Redis Cluster / Redis Sentinel / Valkey, in seed 001's key topology",
        multiprocess=True,
        bounded=True,
        # The store's largest item, as the adapter class declares it (not imported here:
        # a plugin declaration loads no driver).
        max_document_bytes=512 * 1024 * 1024,
        blob_store="siglo_redis.blobs:open_store",
        isolated="siglo_redis.connect:isolated",
    )
