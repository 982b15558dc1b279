"""The live execution stack that checkpoints are snapshots of."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from siglo.checkpoint import STATUSES, TERMINAL_STATUSES, Status
from siglo.errors import InvalidArgumentError, InvalidStateTransitionError
from siglo.records import ContextOp
from siglo.validation import require_id

if TYPE_CHECKING:
    from siglo.checkpoint import Checkpoint

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
    """Where a stack sends its context changes and its saves: the
    :class:`~siglo.StorageManager` that created it (which streams changes to the
    adapter's ``on_context_change`` and stores snapshots)."""

    def stream_context_change(
        self, stack: ExecutionStack, step_id: str, key: str, value: Any, op: ContextOp
    ) -> None:
        """Take one change of ``stack``'s context; must not block or raise on I/O."""
        ...

    async def save(
        self,
        stack: ExecutionStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
        unlock: bool = False,
    ) -> Checkpoint:
        """Snapshot ``stack`` and wait until it is stored."""
        ...

    def checkpoint(
        self,
        stack_id: str | ExecutionStack,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
    ) -> Checkpoint:
        """Snapshot ``stack`` now and store it in the background."""
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
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    """Fields of the stored document siglo does not know (a TypeScript worker's, a newer
    version's), as restored: its snapshots carry them, so a re-save keeps them."""

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

    async def save(
        self,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
        unlock: bool = False,
    ) -> Checkpoint:
        """Snapshot this stack and wait until it is stored (its manager's
        :meth:`~siglo.StorageManager.save`): always this object, never another caller's
        stack of the same id. With ``expected_revision`` the save is a compare-and-set."""
        return await self.manager.save(
            self,
            expected_revision=expected_revision,
            redact_fields=redact_fields,
            ttl_ms=ttl_ms,
            unlock=unlock,
        )

    def checkpoint(
        self,
        *,
        expected_revision: int | None = None,
        redact_fields: Collection[str] = (),
        ttl_ms: int | None = None,
    ) -> Checkpoint:
        """Snapshot this stack now and store it in the background (its manager's
        :meth:`~siglo.StorageManager.checkpoint`); returns the snapshot."""
        return self.manager.checkpoint(
            self, expected_revision=expected_revision, redact_fields=redact_fields, ttl_ms=ttl_ms
        )

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
