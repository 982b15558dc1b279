"""Incremental saves (SPEC §13): a checkpoint stored as a skeleton and its contexts.

A document of at least ``incremental_min_bytes`` is stored in parts: the checkpoint row's
``document`` holds the *skeleton* (the wire document with ``"contexts":{}``), its
``parts`` column the step ids in order with each context's digest, and
``checkpoint_parts`` one row per distinct context body, keyed by ``(id, digest)``. A save
reads the ``parts`` it replaces (the row locked) and, in the same transaction as the
compare-and-set, inserts only the bodies whose digests are new and deletes the ones no
longer named: a step whose context did not change costs nothing.

Rows of ``checkpoint_parts`` never change once written (a digest names its body), so a
reader needs no snapshot: it reads the checkpoint row, then the bodies of its id; when
every digest the row names is there, the document it assembles is exactly the one saved.
A digest missing means a save replaced the row in between: the read starts again.

:func:`assemble` gives back the bytes :meth:`~siglo.Checkpoint.to_json` gave at the save,
byte for byte: orjson writes an object as ``{"key":value,…}`` without spaces, so the
document is the skeleton with ``"step":<context>`` pairs spliced in after
``"contexts":{``. No field before ``contexts`` is an object, and a string cannot hold an
unescaped quote, so the first ``"contexts":{}`` of a skeleton is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b
from typing import Final

import orjson

from siglo.checkpoint import Checkpoint
from siglo.errors import MalformedRecordError

__all__ = ["DEFAULT_INCREMENTAL_MIN_BYTES", "Split", "assemble", "digests", "split"]

DEFAULT_INCREMENTAL_MIN_BYTES: Final = 16_384
"""Documents this long or longer are saved in parts. Below it a save is the one-statement
compare-and-set of a whole row: for a small document, writing it whole costs less than
the transaction that would write its changed parts (docs/large-state.md)."""

_MARK: Final = b'"contexts":{}'


@dataclass(frozen=True, slots=True)
class Split:
    """A checkpoint cut into what the tables hold."""

    skeleton: bytes
    """The wire document with empty ``contexts``: the checkpoint row's ``document``."""
    parts: bytes
    """``[[step_id, digest_hex], …]`` in the contexts' order: the row's ``parts``."""
    bodies: dict[bytes, bytes]
    """Each distinct context's compact JSON by its digest."""


def split(checkpoint: Checkpoint) -> Split:
    """``checkpoint`` as a skeleton, its parts list and its context bodies."""
    skeleton = checkpoint.replace(contexts={}).to_json()
    order: list[tuple[str, str]] = []
    bodies: dict[bytes, bytes] = {}
    for step, context in checkpoint.contexts.items():
        body = orjson.dumps(context)
        digest = blake2b(body, digest_size=16).digest()
        bodies[digest] = body
        order.append((step, digest.hex()))
    return Split(skeleton, orjson.dumps(order), bodies)


def digests(parts: bytes | None) -> set[bytes]:
    """The digests a row's ``parts`` names (none for a document stored whole)."""
    if parts is None:
        return set()
    return {bytes.fromhex(digest) for _, digest in orjson.loads(parts)}


def assemble(skeleton: bytes, parts: bytes, bodies: dict[bytes, bytes]) -> bytes | None:
    """The whole document from its skeleton, parts list and bodies; ``None`` when a body
    it names is missing (a save replaced it since the row was read: read again)."""
    pieces: list[bytes] = []
    for step, digest in orjson.loads(parts):
        body = bodies.get(bytes.fromhex(digest))
        if body is None:
            return None
        pieces.append(orjson.dumps(step) + b":" + body)
    at = skeleton.find(_MARK)
    if at < 0:
        raise MalformedRecordError(
            "checkpoint", "contexts", "is missing from a document stored in parts"
        )
    at += len(_MARK) - 1
    return skeleton[:at] + b",".join(pieces) + skeleton[at:]
