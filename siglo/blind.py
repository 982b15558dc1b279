"""The blind index: equality filters on encrypted metadata without decrypting it.

For each metadata field named in the settings' ``blind_index_fields``, the pipeline
stores, beside the sealed metadata and in clear, a keyed hash of the field's value: an
HMAC-SHA256 under the namespace's index key (:meth:`KeyProvider.index_key`), truncated to
16 bytes, of the JSON of ``[field, value]``. Equal values of one namespace give equal
tokens; the store learns which checkpoints share a value, never the value, and the same
value in two namespaces gives unrelated tokens. Tokens live in the stored metadata under
:data:`INDEX_KEY` (a checkpoint read through the pipeline does not show them).

:func:`list_matching` walks a listing and keeps the checkpoints whose tokens — or, for a
checkpoint stored in clear, whose metadata values — equal the filter's, reading each
listed checkpoint's stored document. A filter of one namespace through a connection with
keys does not walk: the pipeline computes the tokens and asks the backend's
``list_checkpoints_by_index``, which the SQL backends answer from an index table and
Redis from a set per token (docs/encryption.md); :func:`scan_tokens` is what a backend
without an index of its own answers it with (the memory reference, a third party's).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Protocol

import orjson

from siglo.checkpoint import Checkpoint
from siglo.errors import DecryptionError, InvalidArgumentError, SigloError, naming_stack
from siglo.listing import (
    DEFAULT_PAGE_SIZE,
    CheckpointPage,
    CheckpointSummary,
    ListQuery,
    get_listed,
)
from siglo.sentinel import MISSING, Missing
from siglo.unreadable import UNREADABLE, report_unreadable


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


__all__ = [
    "INDEX_KEY",
    "check_filter",
    "check_tokens",
    "list_matching",
    "scan_tokens",
    "stored_tokens",
    "token",
]

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


def check_tokens(tokens: Any) -> dict[str, str]:
    """A token filter: field names to blind-index tokens (non-empty strings)."""
    if not isinstance(tokens, Mapping) or not tokens:
        raise InvalidArgumentError("tokens must be a non-empty mapping of field names to tokens")
    for field, value in tokens.items():
        if not isinstance(field, str) or not field:
            raise InvalidArgumentError(f"tokens field {field!r} must be a non-empty string")
        if not isinstance(value, str) or not value:
            raise InvalidArgumentError(
                f"the token of {field!r} must be a non-empty string, got "
                f"{'an empty string' if value == '' else type(value).__name__}"
            )
    return dict(tokens)


def stored_tokens(metadata: Any) -> dict[str, str]:
    """The tokens a stored checkpoint's metadata holds under :data:`INDEX_KEY` (the
    string ones: what an index of them holds)."""
    tokens = metadata.get(INDEX_KEY) if isinstance(metadata, Mapping) else None
    if not isinstance(tokens, Mapping):
        return {}
    return {k: v for k, v in tokens.items() if isinstance(k, str) and isinstance(v, str)}


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
    tokens = stored_tokens(metadata)
    sealed = _SEALED in metadata
    for field, value in wanted.items():
        if field in indexed and index_key is not None:
            # By its token only, as list_checkpoints_by_index answers a filter of one
            # namespace: a walk of every namespace finds the same stacks.
            if field not in tokens:
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
        elif sealed and index_key is None:
            # Not "no match": without keys nothing sealed can be compared, and a listing
            # that quietly found nothing would say no stack matches.
            raise DecryptionError(
                f"the metadata of stack {stored.stack_id!r} is encrypted and this process "
                f"holds no keys: filtering on {field!r} needs the store's keys "
                "(docs/encryption.md)"
            )
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
            try:
                stored = await get_listed(raw, summary)
                if stored is None or not await _matches(stored, wanted, indexed, index_key, keys):
                    continue
            except UNREADABLE as exc:
                _left_out(exc, summary)
                continue
            found.append(summary)
        cursor = page.next_cursor
        if cursor is None or len(found) >= limit:
            return CheckpointPage(found, cursor)


async def scan_tokens(raw: Listing, query: ListQuery, tokens: Mapping[str, str]) -> CheckpointPage:
    """A page of the live checkpoints that ``query`` lists and whose stored tokens
    include every one of ``tokens``, found by reading each listed stack's stored
    document (the reference answer of ``list_checkpoints_by_index``)."""
    found: list[CheckpointSummary] = []
    cursor = query.cursor
    while True:
        page = await raw.list_checkpoints(
            namespace=query.namespace,
            status=query.statuses,
            workflow_id=query.workflow_id,
            updated_before=query.updated_before,
            updated_after=query.updated_after,
            limit=query.limit - len(found),
            cursor=cursor,
        )
        for summary in page.items:
            try:
                stored = await get_listed(raw, summary)
            except UNREADABLE as exc:
                _left_out(exc, summary)
                continue
            if stored is None:
                continue
            have = stored_tokens(stored.metadata)
            if all(have.get(field) == value for field, value in tokens.items()):
                found.append(summary)
        cursor = page.next_cursor
        if cursor is None or len(found) >= query.limit:
            return CheckpointPage(found, cursor)


def _left_out(exc: SigloError, summary: CheckpointSummary) -> None:
    """A listed stack whose document cannot be read (or its metadata decrypted): left
    out of the filtered page, as any listing leaves it (:mod:`siglo.unreadable`)."""
    if getattr(exc, "stack_id", None) is None:
        exc = naming_stack(exc, summary.stack_id, summary.namespace)
    report_unreadable(exc)
