"""What a wait (and a waiting run) is, told apart for people: an event delivered, a
timeout that fired, a cancellation, a durable sleep — never the internal key of a sleep,
never "delivered" for a wait that timed out.

A wait record's ``status`` says only ``completed`` for both a delivered event and a fired
timer; the run's checkpoint tells them apart: :meth:`~siglo.workflow.Flow.fire_timeout`
marks the waiting step's context ``timedOut``, a delivery marks it ``event``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from siglo.checkpoint import Checkpoint
from siglo.moments import describe_ms
from siglo.records import WaitRecord, embedded_wait_record

__all__ = [
    "EVENT",
    "SLEEP_PREFIX",
    "TIMED_OUT",
    "WAITING_FOR",
    "answer_of",
    "is_sleep",
    "wait_outcome",
    "waiting_for",
]

EVENT: Final = "event"
"""The context key of a waiting step that holds the delivered event's payload."""
WAITING_FOR: Final = "waitingFor"
"""The context key of a waiting step that holds the key it waits for."""
TIMED_OUT: Final = "timedOut"
"""The context key set on a waiting step whose timeout fired."""
SLEEP_PREFIX: Final = "siglo-sleep\x1f"
"""How the correlation key of a durable sleep starts (:func:`siglo.workflow.sleep`)."""


def answer_of(context: Mapping[str, Any]) -> str | None:
    """The answer a waiting step's context already holds: :data:`TIMED_OUT` (its timeout
    fired), :data:`EVENT` (an event was delivered to it), or ``None`` (none yet). A step
    waits at most once, so one there answers its wait."""
    if context.get(TIMED_OUT) is True:
        return TIMED_OUT
    return EVENT if EVENT in context else None


def is_sleep(correlation_key: str) -> bool:
    """Whether ``correlation_key`` is a durable sleep's, not an event's."""
    return correlation_key.startswith(SLEEP_PREFIX)


def wait_outcome(record: WaitRecord, checkpoint: Checkpoint | None, now_ms: int) -> str:
    """What the wait is, in words: ``waiting``, ``sleeping``, ``due`` (its deadline
    passed; a worker fires it), ``claimed`` (a delivery is under way), ``claim lapsed``,
    ``delivered``, ``timed out``, ``slept`` (a sleep that ended) or ``cancelled``.

    ``checkpoint`` is the run's (``None`` if gone): it tells a timeout from a delivery.
    """
    sleep = is_sleep(record.correlation_key)
    if record.status == "cancelled":
        return "cancelled"
    if record.status == "completed":
        if sleep:
            return "slept"
        step = record.step_id
        context = checkpoint.contexts.get(step) if checkpoint is not None and step else None
        return "timed out" if context and context.get(TIMED_OUT) is True else "delivered"
    if record.status == "claimed":
        return "claim lapsed" if record.lease_expired(now_ms) else "claimed"
    if record.is_expired(now_ms):
        return "due"
    return "sleeping" if sleep else "waiting"


def waiting_for(checkpoint: Checkpoint, now_ms: int) -> str | None:
    """What a waiting run waits for: ``event 'approve:3'`` (``, deadline <time>``) or
    ``sleeping until <time>``; ``None`` if the checkpoint waits for nothing."""
    embedded = embedded_wait_record(checkpoint.metadata)
    key: str | None = None if embedded is None else embedded.correlation_key
    if key is None:
        for context in checkpoint.contexts.values():
            if isinstance(context.get(WAITING_FOR), str) and "output" not in context:
                key = context[WAITING_FOR]
    if key is None or checkpoint.status != "waiting":
        return None
    deadline = None if embedded is None else describe_ms(embedded.expires_at, now_ms)
    if is_sleep(key):
        return f"sleeping until {deadline}" if deadline else "sleeping"
    return f"event {key!r}" + (f", deadline {deadline}" if deadline else "")
