"""JSON encoding of every document siglo stores.

siglo uses orjson: it encodes to ``bytes`` (what every driver sends anyway) and decodes a
256 KB checkpoint about twice as fast as the standard library, and checkpoint decoding is
on every restore's path. See ``docs/design.md``.
"""

from __future__ import annotations

from typing import Any

import orjson

from siglo.errors import InvalidArgumentError, MalformedRecordError

__all__ = ["dumps", "dumps_str", "loads"]

JSONDecodeError = orjson.JSONDecodeError


def dumps(value: Any, *, what: str = "value") -> bytes:
    """Encode ``value`` as compact UTF-8 JSON.

    Raises :class:`InvalidArgumentError` naming ``what`` if the value is not JSON data
    (a set, an object, a non-string dict key, an integer beyond 64 bits …).
    """
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise InvalidArgumentError(f"{what} is not JSON-serialisable: {exc}") from exc


def dumps_str(value: Any, *, what: str = "value") -> str:
    """Like :func:`dumps`, as ``str`` (for drivers that want text)."""
    return dumps(value, what=what).decode()


def loads(data: bytes | bytearray | memoryview | str, *, what: str = "document") -> Any:
    """Decode JSON; a malformed document raises :class:`MalformedRecordError`."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MalformedRecordError(what, "<document>", f"is not valid JSON: {exc}") from exc
