"""Failures of background saves and streams, kept for the stack's next call (SPEC §4)."""

from __future__ import annotations

from typing import Final

from siglo import masking

__all__ = ["MAX_DEFERRED_STACKS", "DeferredFailures", "StackKey", "describe"]

logger = masking.logger("siglo")

MAX_DEFERRED_STACKS: Final = 10_000
"""How many stacks' background failures strict mode keeps for their next call."""

StackKey = tuple[str | None, str]
"""A stored stack: its namespace and its id. Two tenants' stacks of one id are two
stacks, and one's background failure is never raised to the other."""


def describe(stack: StackKey) -> str:
    """``'order-1'``, or ``'order-1' (namespace 'tenant-a')``."""
    namespace, stack_id = stack
    return repr(stack_id) if namespace is None else f"{stack_id!r} (namespace {namespace!r})"


class DeferredFailures:
    """One background failure per stack, raised once.

    A stack's first failure waits for that stack's next awaited call (:meth:`raise_for`)
    or a flush (:meth:`raise_all`); later ones are counted on it, so what is kept is
    bounded by the stacks that failed, and by :data:`MAX_DEFERRED_STACKS` of them.
    """

    def __init__(self) -> None:
        self._first: dict[StackKey, BaseException] = {}
        self._more: dict[StackKey, int] = {}

    def defer(self, stack_id: StackKey, exc: BaseException) -> None:
        """Keep ``exc`` for ``stack_id`` (or count it, if the stack already failed)."""
        if stack_id not in self._first and len(self._first) >= MAX_DEFERRED_STACKS:
            # Bounded even when a whole fleet of stacks fails during an outage: past the
            # cap a failure is logged, not kept (a failure is never silent in strict mode).
            logger.error("siglo: background failure of stack %s: %s", describe(stack_id), exc)
            return
        if stack_id in self._first:
            # The first failure is the one to report; the rest are counted, not kept.
            self._more[stack_id] = self._more.get(stack_id, 0) + 1
        else:
            self._first[stack_id] = exc

    def raise_for(self, stack_id: StackKey) -> None:
        """Raise (and forget) the failure kept for ``stack_id``, if any."""
        exc = self._first.pop(stack_id, None)
        if exc is not None:
            _note_more(exc, self._more.pop(stack_id, 0))
            raise exc

    def raise_all(self) -> None:
        """Raise the first stack's failure, with a note naming the other stacks that
        failed; every kept failure is then forgotten (each is raised once)."""
        if not self._first:
            return
        failures, self._first = self._first, {}
        more, self._more = self._more, {}
        (first_stack, exc), *others = failures.items()
        _note_more(exc, more.get(first_stack, 0))
        if others:
            names = ", ".join(
                describe(stack_id) + (f" (+{more[stack_id]} later)" if more.get(stack_id) else "")
                for stack_id, _ in others[:10]
            )
            if len(others) > 10:
                names += f" and {len(others) - 10} more"
            exc.add_note(f"background failures of other stacks were also cleared: {names}")
        raise exc


def _note_more(exc: BaseException, more: int) -> None:
    if more:
        exc.add_note(f"{more} later background failure(s) of this stack were dropped")
