"""The blind index: equality filters on encrypted metadata without decrypting it.

For each metadata field named in the settings' ``blind_index_fields``, the pipeline
stores, beside the sealed metadata and in clear, a keyed hash of the field's value: an
HMAC-SHA256 under the namespace's index key (:meth:`KeyProvider.index_key`), truncated to
16 bytes, of the JSON of ``[field, value]``. Equal values of one namespace give equal
tokens; the store learns which checkpoints share a value, never the value, and the same
value in two namespaces gives unrelated tokens. Tokens live in the stored metadata under
:data:`INDEX_KEY` (a checkpoint read through the pipeline does not show them).

:func:`list_matching` walks a listing and keeps the checkpoints whose tokens — or, for a
checkpoint stored in clear, whose metadata values — equal the filter's. It reads each
listed checkpoint's stored document: no backend indexes the tokens yet (see
docs/encryption.md), so a filtered walk costs one read per stack it passes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Protocol

import orjson

from siglo.checkpoint import Checkpoint
from siglo.errors import InvalidArgumentError
from siglo.listing import DEFAULT_PAGE_SIZE, CheckpointPage, CheckpointSummary
from siglo.sentinel import MISSING, Missing


class Listing(Protocol):
    """What a filtered walk needs of an adapter (a :class:`siglo.StorageAdapter` has it)."""

    async def list_checkpoints(
        self,
        *,
        namespace: str | Missing | None = MISSING,
        status: str | Iterable[str] | None = None,
        workflow_id: str | None = None,
        updated_before: int | None = None,
        updated_after: int | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        cursor: str | None = None,
    ) -> CheckpointPage: ...

    async def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None: ...


__all__ = ["INDEX_KEY", "check_filter", "list_matching", "token"]

INDEX_KEY: Final = "$sigloIndex"
"""The stored metadata key holding a checkpoint's blind-index tokens (field → token)."""

_SCALARS: Final = (str, int, float, bool, type(None))
_SEALED: Final = "$siglo"
"""siglo.sealing.SEALED_KEY (not imported: the adapter module imports this one)."""

IndexKeyOf = Callable[[str | None], Awaitable[bytes]]


def token(key: bytes, field: str, value: Any) -> str:
    """The blind-index token of ``field == value`` under ``key``."""
    digest = hmac.new(key, orjson.dumps([field, value]), hashlib.sha256).digest()
    return base64.b64encode(digest[:16]).decode("ascii")


def check_filter(metadata: Any) -> dict[str, Any]:
    """A metadata filter: field names to JSON scalars (equality)."""
    if not isinstance(metadata, Mapping) or not metadata:
        raise InvalidArgumentError("metadata must be a non-empty mapping of field names to values")
    for field, value in metadata.items():
        if not isinstance(field, str) or not field:
            raise InvalidArgumentError(
                f"metadata filter field {field!r} must be a non-empty string"
            )
        if not isinstance(value, _SCALARS):
            raise InvalidArgumentError(
                f"metadata filter {field!r} must be a string, number, boolean or null, "
                f"got {type(value).__name__}"
            )
    return dict(metadata)


def indexable(value: Any) -> bool:
    """Whether a metadata value gets a token (JSON scalars do)."""
    return isinstance(value, _SCALARS)


async def _matches(
    stored: Checkpoint,
    wanted: Mapping[str, Any],
    indexed: frozenset[str],
    index_key: IndexKeyOf | None,
    keys: dict[str | None, bytes],
) -> bool:
    metadata = stored.metadata or {}
    tokens = metadata.get(INDEX_KEY)
    sealed = _SEALED in metadata
    for field, value in wanted.items():
        if isinstance(tokens, dict) and field in indexed and field in tokens:
            if index_key is None:
                return False
            ns = stored.namespace
            if ns not in keys:
                keys[ns] = await index_key(ns)
            if tokens[field] != token(keys[ns], field, value):
                return False
        elif not sealed and field in metadata:
            # Stored in clear: the value itself is there to compare.
            if type(metadata[field]) is not type(value) or metadata[field] != value:
                return False
        else:
            return False
    return True


async def list_matching(
    raw: Listing,
    wanted: Mapping[str, Any],
    *,
    indexed: frozenset[str],
    index_key: IndexKeyOf | None,
    namespace: str | Missing | None = MISSING,
    status: str | Iterable[str] | None = None,
    workflow_id: str | None = None,
    updated_before: int | None = None,
    updated_after: int | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
    skip: Callable[[CheckpointSummary], bool] | None = None,
) -> CheckpointPage:
    """A page of the checkpoints that ``raw``'s listing finds and whose metadata matches
    ``wanted`` (see the module). Each backend page asked for is no longer than what is
    still missing, so the page returned ends where the backend's page ended and the
    backend's own cursor continues the walk."""
    wanted = check_filter(wanted)
    found: list[CheckpointSummary] = []
    keys: dict[str | None, bytes] = {}
    while True:
        page = await raw.list_checkpoints(
            namespace=namespace,
            status=status,
            workflow_id=workflow_id,
            updated_before=updated_before,
            updated_after=updated_after,
            limit=limit - len(found),
            cursor=cursor,
        )
        for summary in page.items:
            if skip is not None and skip(summary):
                continue
            stored = await raw.get_checkpoint(summary.stack_id, summary.namespace, fallback=False)
            if stored is not None and await _matches(stored, wanted, indexed, index_key, keys):
                found.append(summary)
        cursor = page.next_cursor
        if cursor is None or len(found) >= limit:
            return CheckpointPage(found, cursor)
