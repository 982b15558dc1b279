"""One settings object: every backend, the contract suite and the example plugin default
to siglo.settings.DEFAULTS."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from siglo_filestore.store import FileStorageAdapter

import siglo
from siglo.coordination import DEFAULT_LOCK_TTL_MS
from siglo.locking import run_with_lock
from siglo.settings import DEFAULTS, Defaults
from siglo_contract.target import DEFAULT_OPTIONS
from siglo_memory.adapter import MemoryStorageAdapter
from siglo_memory.coordination import MemoryIdempotencyStore
from siglo_postgres.database import PostgresDatabase
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.coordination import RedisIdempotencyStore, RedisLock
from siglo_sql.adapter import SqlStorageAdapter
from siglo_sql.coordination import SqlIdempotencyStore
from siglo_sqlite.database import SqliteDatabase

# (callable, its parameter, the DEFAULTS field it must default to)
DEFAULTED: list[tuple[Callable[..., Any], str, str]] = [
    (MemoryStorageAdapter, "cache_ttl_ms", "cache_ttl_ms"),
    (MemoryStorageAdapter, "claim_lease_ms", "claim_lease_ms"),
    (MemoryStorageAdapter, "workflow_lock_timeout_ms", "workflow_lock_timeout_ms"),
    (MemoryIdempotencyStore, "default_ttl_ms", "idempotency_ttl_ms"),
    (MemoryIdempotencyStore, "default_lease_ms", "idempotency_lease_ms"),
    (RedisStorageAdapter, "checkpoint_ttl_ms", "checkpoint_ttl_ms"),
    (RedisStorageAdapter, "cache_ttl_ms", "cache_ttl_ms"),
    (RedisStorageAdapter, "claim_lease_ms", "claim_lease_ms"),
    (RedisStorageAdapter, "workflow_lock_ttl_ms", "workflow_lock_ttl_ms"),
    (RedisStorageAdapter, "workflow_lock_timeout_ms", "workflow_lock_timeout_ms"),
    (RedisStorageAdapter, "command_timeout_ms", "command_timeout_ms"),
    (RedisIdempotencyStore, "default_ttl_ms", "idempotency_ttl_ms"),
    (RedisIdempotencyStore, "default_lease_ms", "idempotency_lease_ms"),
    (RedisLock, "command_timeout_ms", "command_timeout_ms"),
    (SqlStorageAdapter, "cache_ttl_ms", "cache_ttl_ms"),
    (SqlStorageAdapter, "claim_lease_ms", "claim_lease_ms"),
    (SqlStorageAdapter, "workflow_lock_ttl_ms", "workflow_lock_ttl_ms"),
    (SqlStorageAdapter, "workflow_lock_timeout_ms", "workflow_lock_timeout_ms"),
    (SqlStorageAdapter, "clean_batch_size", "clean_batch_size"),
    (SqlIdempotencyStore, "default_ttl_ms", "idempotency_ttl_ms"),
    (SqlIdempotencyStore, "default_lease_ms", "idempotency_lease_ms"),
    (SqliteDatabase, "busy_timeout_ms", "busy_timeout_ms"),
    (SqliteDatabase, "command_timeout_ms", "command_timeout_ms"),
    (PostgresDatabase, "pool_min_size", "pool_min_size"),
    (PostgresDatabase, "pool_max_size", "pool_max_size"),
    (PostgresDatabase, "pool_timeout_ms", "pool_timeout_ms"),
    (PostgresDatabase, "command_timeout_ms", "command_timeout_ms"),
    (FileStorageAdapter, "cache_ttl_ms", "cache_ttl_ms"),
    (run_with_lock, "ttl_ms", "workflow_lock_ttl_ms"),
    (run_with_lock, "timeout_ms", "workflow_lock_timeout_ms"),
]


@pytest.mark.parametrize(
    ("fn", "parameter", "field"), DEFAULTED, ids=[f"{f.__name__}.{p}" for f, p, _ in DEFAULTED]
)
def test_defaults_come_from_the_settings_object(
    fn: Callable[..., Any], parameter: str, field: str
) -> None:
    assert inspect.signature(fn).parameters[parameter].default == getattr(DEFAULTS, field)


def test_the_suite_runs_every_backend_with_the_defaults() -> None:
    assert {
        "checkpoint_ttl_ms": DEFAULTS.checkpoint_ttl_ms,
        "cache_ttl_ms": DEFAULTS.cache_ttl_ms,
        "claim_lease_ms": DEFAULTS.claim_lease_ms,
    } == DEFAULT_OPTIONS
    assert DEFAULT_LOCK_TTL_MS == DEFAULTS.lock_ttl_ms == 10_000


def test_the_settings_object_is_frozen_and_holds_the_seed_values() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.cache_ttl_ms = 1  # type: ignore[misc]
    assert Defaults() == DEFAULTS
    assert (DEFAULTS.cache_ttl_ms, DEFAULTS.claim_lease_ms) == (300_000, 60_000)
    assert DEFAULTS.checkpoint_ttl_ms == DEFAULTS.idempotency_ttl_ms == 86_400_000


async def test_connected_backends_use_the_defaults() -> None:
    backend = siglo.connect("memory://")
    adapter = backend.adapter
    assert isinstance(adapter, MemoryStorageAdapter)
    assert (adapter.cache_ttl_ms, adapter.claim_lease_ms) == (
        DEFAULTS.cache_ttl_ms,
        DEFAULTS.claim_lease_ms,
    )
    await backend.aclose()
    backend = siglo.connect("sqlite://")
    adapter = backend.adapter
    assert isinstance(adapter, SqlStorageAdapter)
    assert adapter.clean_batch_size == DEFAULTS.clean_batch_size
    await backend.aclose()
