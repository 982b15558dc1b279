"""The namespace siglo keeps for itself: the envelope keys' keyrings (docs/encryption.md).

A keyring is a checkpoint of :data:`KEYRING_NAMESPACE`, one per namespace whose data keys
it holds, wrapped by the master key. It is not the application's: a listing of every
namespace leaves the keyrings out (:func:`siglo.listing.without_keyrings`), whatever the
connection's settings (a shell without the keys included, where ``siglo prune --status
running`` would otherwise take every tenant's keys for stale runs), and only the key
provider reads, lists or writes one (within :func:`keyring_access`): a listing of that
namespace, a read, a save, a delete or a cancel of a checkpoint of it from anywhere else
— the application, ``siglo ls`` or ``show`` or ``rm`` or ``prune``, the dashboard — is an
:class:`~siglo.errors.InvalidArgumentError` and changes nothing, and so is a record of
any other kind written in it (a wait, a context change, a cached step, a workflow lock).
Destroying a namespace's keys is ``siglo erase``. The checks sit in the storage
adapter's public methods, so every path that writes through a backend passes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from siglo.errors import InvalidArgumentError

__all__ = ["KEYRING_NAMESPACE", "check_not_keyring", "check_not_keyring_listing", "keyring_access"]

KEYRING_NAMESPACE: Final = "siglo.keyring"
"""The namespace the envelope provider's keyrings are stored under."""

_ACCESS: ContextVar[bool] = ContextVar("siglo_keyring_access", default=False)


@contextmanager
def keyring_access() -> Iterator[None]:
    """Within the block, checkpoints of :data:`KEYRING_NAMESPACE` may be read, listed and
    written: the key provider's own use of its keyrings."""
    token = _ACCESS.set(True)
    try:
        yield
    finally:
        _ACCESS.reset(token)


def check_not_keyring(namespace: str | None, what: str) -> None:
    """Refuse ``what`` (a read, a save, a delete, a cancel of a checkpoint; a write of a
    record of another kind) in the keyrings' namespace, outside :func:`keyring_access`."""
    if namespace == KEYRING_NAMESPACE and not _ACCESS.get():
        raise InvalidArgumentError(
            f"{what} in namespace {KEYRING_NAMESPACE!r} refused: it holds siglo's keyrings "
            "(each tenant's data keys), which only siglo writes; `siglo erase` destroys a "
            "namespace's keys (docs/encryption.md)"
        )


def check_not_keyring_listing(namespace: object) -> None:
    """Refuse a listing of the keyrings' namespace outside :func:`keyring_access`: a
    listing of every namespace leaves them out, and one filtered to theirs (``siglo ls
    -n siglo.keyring``, the dashboard's filter, ``prune --dry-run``) must not show them
    either — as running stacks a prune could not delete, with their wrapped keys."""
    if namespace == KEYRING_NAMESPACE and not _ACCESS.get():
        raise InvalidArgumentError(
            f"listing namespace {KEYRING_NAMESPACE!r} refused: it holds siglo's keyrings "
            "(each tenant's data keys), not runs; `siglo erase` destroys a namespace's "
            "keys (docs/encryption.md)"
        )
