"""Listing what is stored: checkpoint summaries, pages of them, and the query behind a page.

``StorageAdapter.list_checkpoints`` validates its arguments into a :class:`ListQuery`
and hands it to the backend; the backend answers with a :class:`CheckpointPage`. A walk
is keyset pagination: a page's ``next_cursor`` names the last stack it returned, and the
next page starts after it in the backend's own fixed order. A stack is therefore never
returned twice in one walk, whatever is written meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from siglo.checkpoint import STATUSES, Checkpoint
from siglo.errors import InvalidArgumentError, MalformedRecordError, naming_stack
from siglo.reserved import KEYRING_NAMESPACE
from siglo.sentinel import MISSING, Missing
from siglo.validation import require_id, require_optional_id

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "CheckpointPage",
    "CheckpointSummary",
    "ListQuery",
    "check_list_arguments",
    "decode_cursor",
    "encode_cursor",
    "get_listed",
    "without_keyrings",
]

DEFAULT_PAGE_SIZE: Final = 100
MAX_PAGE_SIZE: Final = 10_000
"""The largest page a backend is asked for (a page is read in one statement or script)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSummary:
    """One stack as a listing shows it: who it is and where it stands, not its contexts."""

    stack_id: str
    namespace: str | None
    workflow_id: str | None
    status: str
    revision: int
    timestamp: int
    expires_at: int | None

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> CheckpointSummary:
        """The summary of a checkpoint."""
        return cls(
            stack_id=checkpoint.stack_id,
            namespace=checkpoint.namespace,
            workflow_id=checkpoint.workflow_id,
            status=checkpoint.status,
            revision=checkpoint.revision,
            timestamp=checkpoint.timestamp,
            expires_at=checkpoint.expires_at,
        )

    def to_wire(self) -> dict[str, Any]:
        """camelCase keys, as in the checkpoint document (``siglo ls --json``)."""
        return {
            "stackId": self.stack_id,
            "namespace": self.namespace,
            "workflowId": self.workflow_id,
            "status": self.status,
            "revision": self.revision,
            "timestamp": self.timestamp,
            "expiresAt": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class CheckpointPage:
    """A page of a walk: its summaries, and the cursor of the next page (``None``: done)."""

    items: Sequence[CheckpointSummary]
    next_cursor: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ListQuery:
    """The validated arguments of ``list_checkpoints``.

    ``namespace`` is :data:`~siglo.MISSING` for every namespace, ``None`` for the
    un-namespaced stacks only, or one namespace. ``statuses`` is ``None`` for any status.
    ``updated_after`` / ``updated_before`` bound the checkpoint's ``timestamp``
    (``after < timestamp < before``). ``cursor`` is the previous page's ``next_cursor``.
    """

    namespace: str | Missing | None = MISSING
    statuses: frozenset[str] | None = None
    workflow_id: str | None = None
    updated_before: int | None = None
    updated_after: int | None = None
    limit: int = DEFAULT_PAGE_SIZE
    cursor: str | None = None

    def matches(self, checkpoint: Checkpoint | CheckpointSummary) -> bool:
        """Whether a live checkpoint passes every filter (the cursor aside)."""
        if self.namespace is not MISSING and checkpoint.namespace != self.namespace:
            return False
        if self.statuses is not None and checkpoint.status not in self.statuses:
            return False
        if self.workflow_id is not None and checkpoint.workflow_id != self.workflow_id:
            return False
        if self.updated_before is not None and not checkpoint.timestamp < self.updated_before:
            return False
        return self.updated_after is None or checkpoint.timestamp > self.updated_after


def _time(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int:
        raise InvalidArgumentError(f"{name} must be integer milliseconds, got {value!r}")
    return value


def check_list_arguments(
    *,
    namespace: Any,
    status: Any,
    workflow_id: Any,
    updated_before: Any,
    updated_after: Any,
    limit: Any,
    cursor: Any,
) -> ListQuery:
    """The :class:`ListQuery` of ``list_checkpoints``' arguments, or
    :class:`~siglo.errors.InvalidArgumentError` naming the one that is wrong."""
    if namespace is not MISSING:
        require_optional_id("namespace", namespace)
    statuses: frozenset[str] | None = None
    if status is not None:
        given: Iterable[Any] = (status,) if isinstance(status, str) else status
        try:
            statuses = frozenset(given)
        except TypeError:
            raise InvalidArgumentError(
                f"status must be a status or a collection of them, got {status!r}"
            ) from None
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown or not statuses:
            raise InvalidArgumentError(
                f"status must be among {', '.join(sorted(STATUSES))}, got {status!r}"
            )
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidArgumentError(
            f"limit must be an integer from 1 to {MAX_PAGE_SIZE}, got {limit!r}"
        )
    if cursor is not None:
        require_id("cursor", cursor)
    return ListQuery(
        namespace=namespace,
        statuses=statuses,
        workflow_id=require_optional_id("workflow_id", workflow_id),
        updated_before=_time("updated_before", updated_before),
        updated_after=_time("updated_after", updated_after),
        limit=limit,
        cursor=cursor,
    )


def encode_cursor(*parts: str) -> str:
    """An opaque, URL-safe cursor holding ``parts`` (the key of the last stack returned)."""
    return base64.urlsafe_b64encode(orjson.dumps(list(parts))).decode().rstrip("=")


def decode_cursor(cursor: str, arity: int) -> list[str]:
    """The parts of a cursor made by :func:`encode_cursor` with ``arity`` parts.

    A cursor from another backend, or edited by hand, raises
    :class:`~siglo.errors.InvalidArgumentError`.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        parts = orjson.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeEncodeError, binascii.Error, orjson.JSONDecodeError):
        parts = None
    if (
        not isinstance(parts, list)
        or len(parts) != arity
        or not all(isinstance(p, str) for p in parts)
    ):
        raise InvalidArgumentError(
            f"cursor {cursor!r} is not a next_cursor of this backend's list_checkpoints"
        )
    return parts


class _Reads(Protocol):
    async def get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None: ...


async def get_listed(adapter: _Reads, summary: CheckpointSummary) -> Checkpoint | None:
    """The stored checkpoint of a stack a listing showed (``None``: gone since).

    A stored document that cannot be read raises its :class:`MalformedRecordError` with
    the stack named (:func:`siglo.errors.naming_stack`): a walk over every stack stops
    there, and says which one to look at (``siglo rm`` removes it)."""
    return await get_named(adapter, summary.stack_id, summary.namespace)


async def get_named(adapter: _Reads, stack_id: str, namespace: str | None) -> Checkpoint | None:
    """The stored checkpoint of ``stack_id`` in ``namespace`` (no fallback), a document
    that cannot be read raised with the stack named, as :func:`get_listed` does."""
    try:
        return await adapter.get_checkpoint(stack_id, namespace, fallback=False)
    except MalformedRecordError as exc:
        raise naming_stack(exc, stack_id, namespace) from exc


def without_keyrings(page: CheckpointPage) -> CheckpointPage:
    """``page`` (of a listing of every namespace) without the keyrings: they are siglo's,
    not the application's (:mod:`siglo.reserved`)."""
    if not any(item.namespace == KEYRING_NAMESPACE for item in page.items):
        return page
    items = [item for item in page.items if item.namespace != KEYRING_NAMESPACE]
    return dataclasses.replace(page, items=items)
