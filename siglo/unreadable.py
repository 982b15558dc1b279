"""Records a listing cannot read: skipped, and reported to whoever listed.

A record written past siglo (not JSON, of a newer schema), sealed under a key this
process does not hold, or in clear where encryption is required cannot become a
:class:`~siglo.Checkpoint` or :class:`~siglo.WaitRecord`. A listing that meets one —
``list_checkpoints``, ``list_due_waits``, Redis's clean-up of its indexes — leaves it
out, as stored, and goes on with the others: one such record must not hide every other
run from a worker or an operator. What it left out it reports here, the error naming
the record: to the caller's :func:`collecting_unreadable` block if there is one (the
worker, ``siglo ls``, ``siglo clean`` say each one), else as a warning on the ``siglo``
logger.

Walks that must carry every record — ``siglo export``, ``siglo rekey``, a blob
collection (which would otherwise take the blobs of a stack it skipped for orphans) —
list within :func:`stopping_at_unreadable`: there the listing raises the record's error
instead, and the walk stops naming it. ``siglo erase`` collects them and deletes them
with the rest of the namespace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from siglo import masking
from siglo.errors import DecryptionError, EncryptionRequiredError, MalformedRecordError

__all__ = ["UNREADABLE", "collecting_unreadable", "report_unreadable", "stopping_at_unreadable"]

UNREADABLE: Final = (MalformedRecordError, DecryptionError, EncryptionRequiredError)
"""What a stored record that cannot be read raises — not a record, not decryptable here,
in clear where encryption is required: a listing skips those alone (a storage failure
still fails the listing)."""

log = masking.logger("siglo")

_STOP: Final = "stop"
"""The collector's value within :func:`stopping_at_unreadable`."""

_collector: ContextVar[list[Exception] | str | None] = ContextVar("siglo_unreadable", default=None)


@contextmanager
def collecting_unreadable() -> Iterator[list[Exception]]:
    """Within the block, the records the listings called here skip are appended to the
    list yielded (each an :data:`UNREADABLE` error naming its record) instead of logged.

    Tasks started within the block report to it too (they copy the context)."""
    found: list[Exception] = []
    token = _collector.set(found)
    try:
        yield found
    finally:
        _collector.reset(token)


@contextmanager
def stopping_at_unreadable() -> Iterator[None]:
    """Within the block, a listing that meets a record it cannot read raises that
    record's error (naming it) instead of leaving it out: for a walk whose output must
    hold every record."""
    token = _collector.set(_STOP)
    try:
        yield
    finally:
        _collector.reset(token)


def report_unreadable(exc: Exception) -> None:
    """A listing left out the record ``exc`` names: to the collector, else logged;
    raised within :func:`stopping_at_unreadable`."""
    found = _collector.get()
    if found == _STOP:
        raise exc
    if isinstance(found, list):
        found.append(exc)
        return
    log.warning("a stored record cannot be read and was left out of a listing: %s", exc)
