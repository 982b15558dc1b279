"""Field redaction for checkpoint snapshots (seed 000 §4, SPEC §4)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

__all__ = ["REDACTED", "redact", "redact_contexts"]

REDACTED: Final = "[REDACTED]"


def redact(value: Any, fields: Collection[str]) -> Any:
    """A copy of ``value`` with every dict key in ``fields`` mapped to ``"[REDACTED]"``.

    Applies at any depth: nested objects and objects inside lists and tuples. Values
    that are not containers are returned as they are; ``value`` itself is not changed.
    """
    if isinstance(value, Mapping):
        return {k: REDACTED if k in fields else redact(v, fields) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, fields) for v in value]
    return value


def redact_contexts(
    contexts: Mapping[str, Mapping[str, Any]], fields: Collection[str]
) -> dict[str, dict[str, Any]]:
    """Redact every step's context; step ids themselves are never redacted."""
    return {step: redact(ctx, fields) for step, ctx in contexts.items()}
