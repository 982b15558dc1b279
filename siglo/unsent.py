"""Cut-offs known to have stored nothing.

A storage call cut off by its caller (``asyncio.wait_for``, a request's deadline) has an
unknown outcome in general: its command may have been written, and run. Two marks on the
:class:`asyncio.CancelledError` say more, where a backend knows:

- :func:`mark_unwritten`: the one command cut off never left the process (siglo's Redis
  auto-pipeline: still queued for the next write of its connection,
  :mod:`siglo_redis.pipelining`). Said of a command, it says nothing of the operation it
  belongs to: an earlier command of it may have stored something.
- :func:`mark_unsent`: the *save* cut off stored nothing. Its adapter says so, knowing
  that every command of its save comes before the one that stores the checkpoint, or is
  it (the Redis adapter's save scripts). The storage manager then puts the stack back
  at the revision it had (:meth:`siglo.StorageManager.save_checkpoint`), as after a
  refused save, and a delivery cut off there gives its claim on the wait back at once
  instead of keeping it for the lease (:mod:`siglo.workflow.flow`).
"""

from __future__ import annotations

from typing import Final

__all__ = ["mark_unsent", "mark_unwritten", "unsent", "unwritten"]

_UNWRITTEN: Final = "_siglo_unwritten"
_UNSENT: Final = "_siglo_unsent"


def mark_unwritten(exc: BaseException) -> None:
    """Say of ``exc`` (a cancellation) that the command it cut off was never written."""
    setattr(exc, _UNWRITTEN, True)


def unwritten(exc: BaseException) -> bool:
    """Whether ``exc`` cut off a command that was never written (:func:`mark_unwritten`)."""
    return getattr(exc, _UNWRITTEN, False) is True


def mark_unsent(exc: BaseException) -> None:
    """Say of ``exc`` (a cancellation) that the save it cut off stored nothing."""
    setattr(exc, _UNSENT, True)


def unsent(exc: BaseException) -> bool:
    """Whether ``exc`` cut off a save that stored nothing (:func:`mark_unsent`)."""
    return getattr(exc, _UNSENT, False) is True
