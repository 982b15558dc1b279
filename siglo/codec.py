"""JSON encoding of every document siglo stores.

siglo uses orjson: it encodes to ``bytes`` (what every driver sends anyway) and decodes a
256 KB checkpoint about twice as fast as the standard library, and checkpoint decoding is
on every restore's path. See ``docs/design.md``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any, Final

import orjson

from siglo.errors import (
    DecryptionError,
    InvalidArgumentError,
    MalformedRecordError,
    NotJSONError,
    ReservedFormError,
)

__all__ = [
    "NO_BLOB_STORE",
    "REF_KEY",
    "RESERVED_METADATA_KEYS",
    "SEALED_KEY",
    "dumps",
    "dumps_of",
    "dumps_str",
    "is_reference",
    "is_sealed",
    "loads",
    "references_in",
    "refuse_reserved_forms",
    "refuse_reserved_metadata",
    "refuse_reserved_value",
    "refuse_unopened_value",
    "sealed_without_codecs",
]

SEALED_KEY: Final = "$siglo"
"""The one key of a sealed value (:mod:`siglo.sealing`: encrypted or compressed)."""


def is_sealed(value: Any) -> bool:
    """Whether ``value`` is a sealed value (``{"$siglo": "v1…"}``)."""
    return type(value) is dict and len(value) == 1 and isinstance(value.get(SEALED_KEY), str)


def sealed_without_codecs(what: str) -> DecryptionError:
    """The error for ``what`` (``"cached step 'k'"`` …), read sealed by a connection
    without the keys or codecs it was stored with: its envelope is never handed on as
    the value."""
    return DecryptionError(
        f"{what} is stored encoded and this connection has no key or codec for it: set "
        "encryption_keys or master_key (and compression_min_bytes) as the application "
        "does (docs/encryption.md)"
    )


REF_KEY: Final = "$siglo.blob"
"""The key of a reference: ``{"$siglo.blob": "<sha256>", "bytes": n}`` stands for the
value stored as that blob (:mod:`siglo.offload`)."""


def is_reference(value: object) -> bool:
    """Whether ``value`` is a reference to an offloaded value (:data:`REF_KEY`)."""
    return (
        type(value) is dict
        and len(value) == 2
        and isinstance(value.get(REF_KEY), str)
        and type(value.get("bytes")) is int
    )


NO_BLOB_STORE: Final = (
    "set blob_url and offload_min_bytes as the application that stored it does "
    "(docs/large-state.md)"
)
"""What a connection that meets a reference it cannot resolve lacks."""


def references_in(contexts: Any) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(step, key, reference)`` for each context value of ``contexts`` that is a
    reference to an offloaded value (where the offloading layer puts them: a context's
    top-level values, or the ``$siglo`` value of a context sealed and then offloaded)."""
    for step, context in contexts.items():
        if type(context) is not dict:
            continue
        for key, value in context.items():
            if type(value) is dict and REF_KEY in value and is_reference(value):
                yield step, key, value


def refuse_reserved_forms(contexts: Any, where: str) -> None:
    """Refuse contexts holding a value of a form siglo reserves — a reference to an
    offloaded value (``{"$siglo.blob": "…", "bytes": n}``, a context's value) or a sealed
    value (``{"$siglo": "…"}``, a whole context): stored, every later read would take it
    for one, and refuse it (:func:`refuse_unopened_value`). ``where`` names the stack."""
    for step, context in contexts.items():
        if type(context) is not dict:
            continue
        if is_sealed(context):
            raise ReservedFormError(
                f"{where}: context {step!r} has the form siglo reserves for a sealed value "
                f'({{"{SEALED_KEY}": "…"}}); give it another shape'
            )
    for step, key, _ in references_in(contexts):
        raise ReservedFormError(
            f"{where}: {step}.{key} has the form siglo reserves for a reference to an "
            f'offloaded value ({{"{REF_KEY}": "…", "bytes": n}}); give it another shape'
        )


RESERVED_METADATA_KEYS: Final = frozenset({SEALED_KEY, "$sigloIndex"})
"""Metadata keys siglo writes itself: ``$siglo``, the sealed rest of an encrypted
checkpoint's metadata (a read opens it), and ``$sigloIndex``, its blind-index tokens
(:data:`siglo.blind.INDEX_KEY`, replaced at every save)."""


def refuse_reserved_metadata(metadata: Any, where: str) -> None:
    """Refuse checkpoint metadata holding a key of :data:`RESERVED_METADATA_KEYS`:
    stored, ``$siglo`` would be read as sealed metadata (the stack then unreadable) and
    ``$sigloIndex`` replaced by the blind index. ``where`` names the stack."""
    if type(metadata) is not dict:
        return
    for key in RESERVED_METADATA_KEYS:
        if key in metadata:
            raise ReservedFormError(
                f"{where}: metadata key {key!r} is one siglo reserves for its own values "
                "(sealed metadata, the blind index); give it another name"
            )


def refuse_reserved_value(value: Any, what: str) -> None:
    """:func:`refuse_reserved_forms` for a value stored whole (a cached step's output, an
    idempotency result: ``what`` names it), which reads back refused when it looks like
    a sealed value or a reference."""
    if type(value) is dict and (is_sealed(value) or is_reference(value)):
        raise ReservedFormError(
            f'{what} has a form siglo reserves ({{"{SEALED_KEY}": "…"}} for a sealed '
            f'value, {{"{REF_KEY}": "…", "bytes": n}} for an offloaded one); give it '
            "another shape"
        )


def refuse_unopened_value(value: Any, what: str) -> None:
    """Refuse a value handed on whole (``what``: ``"cached step 'k'"`` …) that this
    connection could not open: a reference to an offloaded value is
    :class:`~siglo.errors.InvalidArgumentError` (no blob store), a sealed one
    :func:`sealed_without_codecs`. Handed on, either would be taken for the data
    (:func:`siglo.sealing.refuse_unopened`, for a checkpoint)."""
    if type(value) is not dict:
        return
    if is_reference(value):
        raise InvalidArgumentError(
            f"{what} is offloaded to blob {value[REF_KEY]}, and this connection has no "
            f"blob store to read it from: {NO_BLOB_STORE}"
        )
    if is_sealed(value):
        raise sealed_without_codecs(what)


JSONDecodeError = orjson.JSONDecodeError

GC_PAUSE_MIN_BYTES: Final = 64 * 1024
"""Documents at least this large are decoded with the cyclic GC paused (see :func:`loads`)."""


def dumps(value: Any, *, what: str = "value") -> bytes:
    """Encode ``value`` as compact UTF-8 JSON.

    Raises :class:`~siglo.errors.NotJSONError` naming ``what`` if the value is not JSON data
    (a set, an object, a non-string dict key, an integer beyond 64 bits …).
    """
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise NotJSONError(f"{what} is not JSON-serialisable: {exc}") from exc


def dumps_of(value: Any, kind: str, name: object) -> bytes:
    """:func:`dumps`, its error naming ``what`` as ``f"{kind} {name!r}"`` — a text built
    only on failure: every save encodes its values, and formatting the name each time
    cost as much as encoding a small value."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise NotJSONError(f"{kind} {name!r} is not JSON-serialisable: {exc}") from exc


def stored_form(value: Any, kind: str, name: object) -> Any:
    """``value`` as a load reads it back: what JSON keeps of it.

    orjson writes a ``datetime``, ``date``, ``UUID``, enum member or dataclass as text or
    an object, a tuple as a list and a NaN as ``null``, and a load reads those back; the
    workflow runtime hands a step's output on in this form, so a step sees the same
    values whether the one before it ran in this process or was read from the store
    (a resume after a wait or a crash). Raises :class:`~siglo.errors.NotJSONError` as
    :func:`dumps_of` does. Text, booleans and ``None`` are returned as they are.
    """
    if value is None or type(value) is str or type(value) is bool:
        return value
    return loads(dumps_of(value, kind, name))


def stored_event(payload: Any, correlation_key: str) -> Any:
    """An event delivered for ``correlation_key`` as a step will see it
    (:func:`stored_form`), refused — before anything is claimed — if it is not JSON or
    has a form siglo reserves (stored whole in the wait record and as the step's context,
    it would read back as a sealed or offloaded value). Every path that delivers an event
    (``Flow.deliver``, the dashboard's deliver) takes it here."""
    payload = stored_form(payload, "the event delivered for", correlation_key)
    refuse_reserved_value(payload, f"the event delivered for {correlation_key!r}")
    return payload


def private_copy(value: Any) -> Any:
    """A copy of ``value`` (JSON data in its stored form) that shares no container with
    it: what a workflow step is handed, so that changing it in place changes neither the
    run's stored values nor another step's."""
    if value is None or type(value) in _IMMUTABLE:
        return value
    return loads(orjson.dumps(value))  # a large one with the collector paused


_IMMUTABLE: Final = frozenset({str, bool, int, float})


def dumps_str(value: Any, *, what: str = "value") -> str:
    """Like :func:`dumps`, as ``str`` (for drivers that want text)."""
    return dumps(value, what=what).decode()


def loads(data: bytes | bytearray | memoryview | str, *, what: str = "document") -> Any:
    """Decode JSON; a malformed document raises :class:`MalformedRecordError`.

    A large document is decoded with the cyclic garbage collector paused: decoding
    allocates thousands of dicts and lists, each allocation can trigger a collection,
    and in a process with a large heap those collections cost more than the decoding
    itself (a 256 KB checkpoint beside a large live heap: ~2.1–5.0 ms with the GC running,
    ~1.4–2.9 ms paused; below 64 KB there is no measurable gain). JSON
    data has no cycles, so nothing is lost by not collecting during the call; the
    collector's state is restored afterwards, and left alone if the application had
    disabled it. msgpack documents the same practice for unpacking large data.
    """
    if len(data) < GC_PAUSE_MIN_BYTES or not gc.isenabled():
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise MalformedRecordError(what, "<document>", f"is not valid JSON: {exc}") from exc
    gc.disable()
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MalformedRecordError(what, "<document>", f"is not valid JSON: {exc}") from exc
    finally:
        gc.enable()
