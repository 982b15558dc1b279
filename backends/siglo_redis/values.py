"""How step-cache and context values are written to Redis (seed 001 §5).

The seed stores a cached object as its JSON and wraps anything else as ``{"value": x}``.
siglo follows that and makes every round trip exact with one more rule:

- a JSON object is stored as is — unless its only key is ``"value"``, in which case it
  is wrapped too (``{"value": {"value": 1}}``), so it cannot be mistaken for a wrapper;
- a JSON array is stored as is (in JavaScript an array is an object);
- ``None``, booleans, numbers and strings are wrapped: ``{"value": x}``.

Reading unwraps an object whose only key is ``"value"`` and returns anything else as
parsed; a value that is not JSON at all (written by another tool) is returned as the raw
string, as the seed's ``getCachedStep`` does.
"""

from __future__ import annotations

from typing import Any

import orjson

from siglo import codec

__all__ = ["decode_cached", "decode_context_value", "encode_cached"]


def _is_wrapper(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "value" in value


def encode_cached(value: Any, *, what: str) -> bytes:
    """The stored form of a cached value (see the module docstring)."""
    if isinstance(value, list) or (isinstance(value, dict) and not _is_wrapper(value)):
        return codec.dumps(value, what=what)
    return codec.dumps({"value": value}, what=what)


def decode_cached(data: bytes) -> Any:
    """A cached value from its stored form."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")
    return parsed["value"] if _is_wrapper(parsed) else parsed


def decode_context_value(data: bytes) -> Any:
    """A context field's value: its JSON, or the raw string if it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")
