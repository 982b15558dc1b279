"""Checkpoint payloads of a given encoded size, shared by every subject.

Every subject saves the same wire document (seed 000 §1, camelCase), so siglo and the
raw drivers move the same bytes. The contexts are built once per size, outside timing.
"""

from __future__ import annotations

import time
from typing import Any, Final

import orjson

SIZES: Final = {"1k": 1024, "16k": 16 * 1024, "256k": 256 * 1024}


def make_contexts(size_bytes: int) -> dict[str, dict[str, Any]]:
    """Step contexts whose checkpoint encodes to roughly ``size_bytes``.

    A mix of strings, numbers, booleans, nested lists and objects, like a real workflow's
    step outputs, so that JSON decoding cost is representative (not one long string).
    """
    contexts: dict[str, dict[str, Any]] = {}
    overhead = 200  # the fixed wire fields around the contexts
    step = 0
    while len(orjson.dumps(contexts)) < size_bytes - overhead:
        contexts[f"step-{step}"] = {
            "status": "done",
            "attempt": step % 3,
            "ok": True,
            "score": step * 0.25,
            "items": [{"id": step * 10 + i, "name": f"item {i} of step {step}"} for i in range(3)],
            "note": "lorem ipsum dolor sit amet " * 2,
        }
        step += 1
    return contexts


def wire_document(
    stack_id: str, revision: int, contexts: dict[str, dict[str, Any]], *, expires_at: int | None
) -> dict[str, Any]:
    """The wire document siglo stores for such a checkpoint (same keys, same order)."""
    doc: dict[str, Any] = {
        "version": 2,
        "schemaVersion": "2.0.0",
        "stackId": stack_id,
        "type": "execution",
        "status": "running",
        "revision": revision,
        "chains": [],
        "contexts": contexts,
        "timestamp": now_ms(),
    }
    if expires_at is not None:
        doc["expiresAt"] = expires_at
    return doc


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000
