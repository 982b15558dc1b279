"""Field redaction for everything siglo sends out of the process (seed 000 §4, SPEC §4)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from siglo.errors import InvalidArgumentError

__all__ = [
    "MAX_REDACTION_DEPTH",
    "REDACTED",
    "REDACT_FIELDS_KEY",
    "check_redact_fields",
    "hide",
    "named_redactions",
    "redact",
    "redact_contexts",
    "redacting",
]

REDACTED: Final = "[REDACTED]"

REDACT_FIELDS_KEY: Final = "redactFields"
"""The checkpoint ``metadata`` key naming the keys redacted from it: a process that
restores the stack keeps redacting them, whatever its own settings say."""

MAX_REDACTION_DEPTH: Final = 10_000
"""Containers nested deeper than this are refused (a cycle is infinitely deep).

JSON encoding refuses far less deep documents anyway (orjson stops at 255 levels), so
the limit never refuses a value that could have been stored; it only turns a cycle or a
pathological value into a clear error instead of an endless walk.
"""


_NO_NAMES: Final[frozenset[str]] = frozenset()


def check_redact_fields(fields: Any) -> frozenset[str]:
    """``fields`` as a frozenset of names; a bare string or a non-string name is refused."""
    if type(fields) is tuple and not fields:
        return _NO_NAMES  # the default of every call that names none (each run's stack)
    if isinstance(fields, str | bytes):
        raise InvalidArgumentError("redact_fields must be a collection of names, not a string")
    try:
        names = frozenset(fields)
    except TypeError:
        raise InvalidArgumentError(
            f"redact_fields must be a collection of names, got {type(fields).__name__}"
        ) from None
    for name in names:
        if type(name) is not str:
            raise InvalidArgumentError(f"redact_fields names must be strings, got {name!r}")
    return names


def redact_change(key: str, op: str, value: Any, fields: Collection[str]) -> Any:
    """The value of a context change to ``key`` as it may be stored: a set of a redacted
    key stores ``"[REDACTED]"`` whole, any other value is redacted at any depth (the
    pipeline's rule for a new change, and ``siglo rekey``'s for a stored one)."""
    if op == "set" and key in fields:
        return REDACTED
    return redact(value, fields)


def redact(value: Any, fields: Collection[str]) -> Any:
    """A copy of ``value`` with every dict key in ``fields`` mapped to ``"[REDACTED]"``.

    Applies at any depth: nested objects and objects inside lists and tuples. Values
    that are not containers are returned as they are; ``value`` itself is not changed.
    The walk is iterative, so a deeply nested value cannot exhaust Python's stack; a
    value nested deeper than :data:`MAX_REDACTION_DEPTH` (or holding a cycle) raises
    :class:`~siglo.errors.InvalidArgumentError`.
    """
    if not isinstance(value, Mapping | list | tuple):
        return value
    root = _empty_copy(value)
    # Each entry: a source container, the copy being filled, and its depth.
    todo: list[tuple[Any, Any, int]] = [(value, root, 1)]
    while todo:
        source, copy, depth = todo.pop()
        if depth > MAX_REDACTION_DEPTH:
            raise InvalidArgumentError(
                f"a value to redact is nested deeper than {MAX_REDACTION_DEPTH} levels "
                "(or contains a cycle); it cannot be stored as JSON"
            )
        if isinstance(source, Mapping):
            for key, item in source.items():
                if key in fields:
                    copy[key] = REDACTED
                else:
                    copy[key] = _child(item, depth, todo)
        else:
            copy.extend(_child(item, depth, todo) for item in source)
    return root


def _empty_copy(container: Any) -> Any:
    return {} if isinstance(container, Mapping) else []


def _child(item: Any, depth: int, todo: list[tuple[Any, Any, int]]) -> Any:
    """``item`` itself, or an empty copy queued to be filled (containers)."""
    if isinstance(item, Mapping | list | tuple):
        copy = _empty_copy(item)
        todo.append((item, copy, depth + 1))
        return copy
    return item


def named_redactions(metadata: Mapping[str, Any] | None) -> frozenset[str]:
    """The keys a checkpoint says were redacted from it (``metadata.redactFields``, its
    names that are non-empty strings): every path that writes it keeps redacting them."""
    named = metadata.get(REDACT_FIELDS_KEY) if metadata else None
    if not isinstance(named, list):
        return _NO_NAMES
    return frozenset(name for name in named if isinstance(name, str) and name)


def redact_contexts(
    contexts: Mapping[str, Mapping[str, Any]], fields: Collection[str]
) -> dict[str, dict[str, Any]]:
    """Redact every step's context; step ids themselves are never redacted."""
    return {step: redact(ctx, fields) for step, ctx in contexts.items()}


def redacting(checkpoint: Any, fields: Iterable[str]) -> frozenset[str]:
    """The keys to hide when showing a stored ``checkpoint`` (a
    :class:`~siglo.checkpoint.Checkpoint`, or ``None``): the settings' ``fields`` and those
    its metadata says it was saved without. What prints stored data — ``siglo show``, the
    dashboard — hides them with :func:`hide`, so a value stored before its key was
    redacted is not shown either."""
    named: Iterable[str] = ()
    metadata = getattr(checkpoint, "metadata", None)
    if metadata:
        named = metadata.get(REDACT_FIELDS_KEY) or ()
    return frozenset(fields) | frozenset(str(f) for f in named)


def hide(value: Any, fields: frozenset[str]) -> Any:
    """``value`` with ``fields`` redacted at any depth, for showing it."""
    return redact(value, fields) if fields else value
