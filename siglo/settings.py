"""siglo's defaults, in one place.

Every backend takes these options by keyword or in its URL; when a caller gives none,
the value here applies. The built-in backends, the contract suite and the example plugin
all read :data:`DEFAULTS`, so one number never drifts apart in two files. A plugin
should use it too, so its defaults mean what the built-in backends' do::

    from siglo.settings import DEFAULTS

    def connect(url, *, cache_ttl_ms=DEFAULTS.cache_ttl_ms, **unused): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULTS", "Defaults"]


@dataclass(frozen=True, slots=True)
class Defaults:
    """The default of every option (times in milliseconds)."""

    checkpoint_ttl_ms: int = 86_400_000
    """How long the Redis backend keeps checkpoints without an earlier ``expires_at``, wait
    records and context streams (seed 001 §5's ``checkpointTtlMs``, 24 h). Memory and SQL
    keep them until removed unless given a ``checkpoint_ttl_ms``; the contract suite runs
    every backend with this value."""
    cache_ttl_ms: int = 300_000
    """How long a cached step is kept when ``set_cached_step`` names no TTL (5 min)."""
    claim_lease_ms: int = 60_000
    """How long a wait-record claim lasts before another claimant may take it over."""
    idempotency_ttl_ms: int = 86_400_000
    """How long a completed idempotency key (its result) is kept (24 h)."""
    idempotency_lease_ms: int = 30_000
    """How long an idempotency claim stays in progress when ``claim`` names no TTL: a
    crashed claimer frees its key this soon, not after the result's retention."""
    lock_ttl_ms: int = 10_000
    """The lease of ``Lock.acquire`` / ``with_lock`` when the caller names none."""
    workflow_lock_ttl_ms: int = 30_000
    """The lease of a workflow lock, renewed while its action runs (frees a crashed holder)."""
    workflow_lock_timeout_ms: int = 30_000
    """How long ``with_workflow_lock`` waits for the lock before ``LockNotAcquiredError``."""
    command_timeout_ms: int = 10_000
    """The bound on every call to Redis, PostgreSQL or SQLite (``None`` in a URL: none)."""
    connect_timeout_ms: int = 10_000
    """How long PostgreSQL may take to accept a connection."""
    busy_timeout_ms: int = 10_000
    """How long SQLite waits for another connection's write lock."""
    pool_min_size: int = 1
    """PostgreSQL connections kept open."""
    pool_max_size: int = 10
    """PostgreSQL connections at most."""
    pool_timeout_ms: int = 10_000
    """How long a call waits for a free PostgreSQL connection."""
    clean_batch_size: int = 1_000
    """Rows an SQL clean-up deletes per statement."""


DEFAULTS: Final = Defaults()
"""The defaults siglo uses."""
