"""What a benchmark subject is: one implementation of the operations the workloads time.

A subject is siglo on some backend, the raw driver of that backend doing the equivalent
work, or an optional third-party saver. An operation a subject cannot do raises
:class:`NotImplementedError`, and the workload is reported as skipped for it.
"""

from __future__ import annotations

from typing import Any


class Conflict(Exception):
    """A compare-and-set lost; the caller reloads and retries."""


class Subject:
    """Base class: every operation is optional.

    ``kind`` is ``"siglo"``, ``"raw"`` or ``"langgraph"``; ``backend`` the storage it
    talks to (``"redis"``, ``"postgres"``, ``"sqlite"``, ``"memory"``).
    """

    kind: str = "?"
    backend: str = "?"
    detail: str = ""
    """A short description of how this subject does its work (shown in the report)."""

    async def open(self) -> None:
        """Connect and create private storage (own key prefix, schema or file)."""

    async def close(self) -> None:
        """Remove the private storage and disconnect."""

    async def server_version(self) -> str | None:
        """The server's version, for the report (``None``: no server)."""
        return None

    # -- checkpoints --------------------------------------------------------------------

    async def save(
        self,
        stack_id: str,
        revision: int,
        contexts: dict[str, Any],
        *,
        expected_revision: int | None = None,
        expires_at: int | None = None,
    ) -> None:
        """Encode and store a checkpoint; a lost compare-and-set raises :class:`Conflict`.

        Without ``expected_revision`` the store must still refuse a revision that is not
        greater than the stored one (the contract's plain save), atomically.
        """
        raise NotImplementedError

    async def load(self, stack_id: str) -> int | None:
        """Fetch and decode the live checkpoint; return its revision (``None``: absent)."""
        raise NotImplementedError

    async def clean_expired(self) -> int:
        """Delete expired checkpoints; return how many."""
        raise NotImplementedError

    # -- wait records, idempotency, locks, step cache --------------------------------------

    async def put_wait(self, key: str, stack_id: str) -> None:
        """Store a ``waiting`` wait record (setup, not timed)."""
        raise NotImplementedError

    async def claim_wait(self, key: str, claimant: str) -> bool:
        """Claim a waiting record with an event payload; ``True`` if this call won."""
        raise NotImplementedError

    async def idempotency_claim_complete(self, key: str, result: Any) -> None:
        """Claim a fresh idempotency key, then complete it with ``result``."""
        raise NotImplementedError

    async def lock_pair(self, key: str) -> None:
        """Acquire a free lock and release it with its token."""
        raise NotImplementedError

    async def cache_set_get(self, key: str, value: Any) -> None:
        """Set a step-cache entry, then read it back (decoded)."""
        raise NotImplementedError
