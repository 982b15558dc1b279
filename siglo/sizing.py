"""The size guard (SPEC §13): a checkpoint document over the limit is refused before
anything is written.

The size measured is the document as the backend stores it: the compact JSON wire form
(:meth:`~siglo.Checkpoint.to_json`) of the checkpoint that reaches the backend, after the
pipeline's stages (redaction, and any stage that shrinks or moves values). The encoding is
cached on the checkpoint, so the backend that then writes it encodes nothing twice.

The limit is the smaller of two: the backend's declared maximum (what its store can hold
in one item — Redis 512 MiB per string, PostgreSQL 1 GiB per field, SQLite 10⁹ bytes per
value — declared by its plugin, :class:`~siglo.plugins.BackendSpec`) and the settings'
``max_document_bytes`` (:class:`~siglo.config.Settings`). :func:`siglo.connect` puts it on
the adapter (:attr:`siglo.StorageAdapter.max_document_bytes`); every save of the base
class checks it (:func:`check_document_size`) before any hook writes.
"""

from __future__ import annotations

from typing import Final

import orjson

from siglo.checkpoint import Checkpoint
from siglo.errors import DocumentTooLargeError, InvalidArgumentError
from siglo.records import ContextChangeEvent

__all__ = [
    "LARGEST_SHOWN",
    "check_change_size",
    "check_document_size",
    "check_limit",
    "document_size",
    "largest_contexts",
    "smallest_limit",
]

LARGEST_SHOWN: Final = 3
"""How many of the largest contexts a :class:`~siglo.DocumentTooLargeError` names."""


def document_size(checkpoint: Checkpoint) -> int:
    """The length in bytes of ``checkpoint``'s stored document (its compact JSON)."""
    return len(checkpoint.to_json())


def largest_contexts(
    checkpoint: Checkpoint, count: int = LARGEST_SHOWN
) -> tuple[tuple[str, int], ...]:
    """The ``count`` largest contexts of ``checkpoint`` as ``(step_id, bytes)``, largest
    first (each context's compact JSON length)."""
    sizes = [(step, len(orjson.dumps(ctx))) for step, ctx in checkpoint.contexts.items()]
    sizes.sort(key=lambda pair: (-pair[1], pair[0]))
    return tuple(sizes[:count])


def check_document_size(checkpoint: Checkpoint, limit: int | None) -> None:
    """Raise :class:`~siglo.DocumentTooLargeError` if ``checkpoint``'s document is over
    ``limit`` bytes (``None``: no limit, nothing is encoded)."""
    if limit is None:
        return
    size = document_size(checkpoint)
    if size > limit:
        raise DocumentTooLargeError(
            checkpoint.stack_id,
            size,
            limit,
            largest_contexts(checkpoint),
            checkpoint.namespace,
        )


def check_change_size(
    event: ContextChangeEvent, limit: int | None, offloaded_from: int | None = None
) -> None:
    """Raise :class:`~siglo.DocumentTooLargeError` if the value of the context change
    ``event`` alone is over ``limit`` bytes (its compact JSON, as streamed after the
    pipeline): no checkpoint holding it could be stored, and a stream record that large
    would meet the store's own item limit as a driver error instead — unless values of
    its size are offloaded (at least ``offloaded_from`` bytes: a checkpoint holds a
    reference to it, and the change streams)."""
    if limit is None or event.value is None:
        return
    try:
        size = len(orjson.dumps(event.value))
    except orjson.JSONEncodeError:
        return  # not JSON: the backend refuses it, naming the key (InvalidArgumentError)
    if offloaded_from is not None and size >= offloaded_from:
        return
    if size > limit:
        raise DocumentTooLargeError(
            event.stack_id,
            size,
            limit,
            ((event.step_id, size),),
            event.namespace,
            record=f"context change {event.key!r} of step {event.step_id!r}",
        )


def check_limit(name: str, value: object) -> int | None:
    """``value`` as a document limit: a positive integer of bytes, or ``None``."""
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        raise InvalidArgumentError(
            f"{name} must be a positive integer of bytes or none, got {value!r}"
        )
    return value


def smallest_limit(*limits: int | None) -> int | None:
    """The smallest of the limits given, ``None`` standing for no limit."""
    given = [limit for limit in limits if limit is not None]
    return min(given) if given else None
