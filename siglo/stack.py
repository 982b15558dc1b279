"""The live execution stack that checkpoints are snapshots of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from siglo.checkpoint import STATUSES, TERMINAL_STATUSES, Status
from siglo.errors import InvalidArgumentError, InvalidStateTransitionError
from siglo.records import ContextOp
from siglo.validation import require_id

__all__ = ["ALLOWED_TRANSITIONS", "ContextStream", "ExecutionStack"]

ALLOWED_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "running": frozenset({"waiting", "completed", "failed", "cancelled"}),
    "waiting": frozenset({"running", "completed", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
"""Status transitions the lifecycle allows; terminal statuses allow none."""


class ContextStream(Protocol):
    """Where a stack sends its context changes: the :class:`~siglo.StorageManager` that
    created it (which streams them to the adapter's ``on_context_change``)."""

    def stream_context_change(
        self, stack: ExecutionStack, step_id: str, key: str, value: Any, op: ContextOp
    ) -> None:
        """Take one change of ``stack``'s context; must not block or raise on I/O."""
        ...


@dataclass(eq=False)
class ExecutionStack:
    """The live, mutable state of one workflow execution.

    Change it through its methods, so context mutations are streamed to the storage
    adapter's ``on_context_change``; snapshot it with
    :meth:`StorageManager.checkpoint`. ``revision`` is the revision of the latest
    snapshot taken (or restored).
    """

    stack_id: str
    manager: ContextStream = field(repr=False)
    """The manager that created the stack; it streams the stack's context changes."""
    workflow_id: str | None = None
    namespace: str | None = None
    type: str = "execution"
    status: Status = "running"
    revision: int = 0
    chains: list[str] = field(default_factory=list)
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    redact_fields: frozenset[str] = frozenset()
    """Keys redacted from this stack's snapshots and stream, beside the manager's."""

    def context(self, step_id: str) -> dict[str, Any]:
        """A step's context (created empty on first use). Mutate it with :meth:`set`."""
        return self.contexts.setdefault(require_id("step_id", step_id), {})

    def set(self, step_id: str, key: str, value: Any) -> None:
        """Set ``key`` in a step's context and stream the change."""
        require_id("key", key)
        self.context(step_id)[key] = value
        self.manager.stream_context_change(self, step_id, key, value, "set")

    def delete(self, step_id: str, key: str) -> None:
        """Remove ``key`` from a step's context (if present) and stream the change."""
        require_id("key", key)
        self.context(step_id).pop(key, None)
        self.manager.stream_context_change(self, step_id, key, None, "delete")

    def push_chain(self, chain: str) -> None:
        """Append an entry (a step or chain id) to the stack's chain list."""
        self.chains.append(require_id("chain", chain))

    def transition(self, status: str) -> None:
        """Move to ``status``; raises :class:`InvalidStateTransitionError` if not allowed."""
        if status not in STATUSES:
            raise InvalidArgumentError(
                f"status must be one of {', '.join(sorted(STATUSES))}, got {status!r}"
            )
        if status == self.status:
            return
        if status not in ALLOWED_TRANSITIONS[self.status]:
            raise InvalidStateTransitionError(
                f"stack {self.stack_id!r} cannot go from {self.status!r} to {status!r}"
            )
        self.status = status  # type: ignore[assignment]  # checked against STATUSES above

    @property
    def is_terminal(self) -> bool:
        """Whether the stack reached completed, failed or cancelled."""
        return self.status in TERMINAL_STATUSES
