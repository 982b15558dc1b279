"""The in-memory backend: siglo's reference model of the storage contract.

Every other backend is checked against it by the contract suite, so it is written to be
obviously right rather than fast: plain dicts, and no ``await`` between a read and the
write that depends on it, which makes every operation atomic under asyncio. Values are
kept as their JSON encoding, so what comes back is exactly what a serialising backend
would return. It is for one process; ``memory://name`` shares a store within it.
"""

from siglo_memory.adapter import MemoryStorageAdapter
from siglo_memory.connect import connect
from siglo_memory.coordination import (
    MemoryIdempotencyStore,
    MemoryLock,
    MemoryNonceStore,
)

__all__ = [
    "MemoryIdempotencyStore",
    "MemoryLock",
    "MemoryNonceStore",
    "MemoryStorageAdapter",
    "connect",
]
