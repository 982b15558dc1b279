"""Argument checks shared by every backend, so each rejects bad input the same way."""

from __future__ import annotations

import math
from typing import Any, Final, overload

from siglo.checkpoint import Checkpoint
from siglo.errors import InvalidArgumentError
from siglo.records import ContextChangeEvent, WaitRecord
from siglo.reserved import KEYRING_NAMESPACE, check_not_keyring

__all__ = [
    "MAX_DURATION_MS",
    "MAX_DURATION_S",
    "MAX_ID_LENGTH",
    "MAX_LEASE_MS",
    "capped_seconds",
    "check_context_change",
    "check_save_arguments",
    "check_wait_record",
    "ms_as_seconds",
    "require_count",
    "require_id",
    "require_lease_ms",
    "require_optional_id",
    "require_seconds",
    "require_ttl_ms",
    "seconds_as_ms",
]


MAX_ID_LENGTH: Final = 4096
"""The longest id (in characters) any backend accepts, so every backend accepts the same."""


def require_id(name: str, value: Any) -> str:
    """``value`` must be a non-empty string of at most :data:`MAX_ID_LENGTH` characters of
    Unicode text without NUL (any other characters: ids are data, never syntax)."""
    if type(value) is not str:
        raise InvalidArgumentError(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError(
            f"{name} must be at most {MAX_ID_LENGTH} characters, got {len(value)}"
        )
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL; refusing it everywhere keeps backends alike.
        raise InvalidArgumentError(f"{name} must not contain a NUL character")
    if not value.isascii():
        _require_encodable(name, value)
    return value


def _require_encodable(name: str, value: str) -> None:
    """A lone surrogate (``"\\ud800"``) has no UTF-8 form: no store can hold it, so every
    backend refuses it here alike instead of failing in its driver."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{name} must be valid Unicode text: it holds a lone surrogate "
            f"{value[exc.start]!r} at position {exc.start}"
        ) from None


def require_optional_id(name: str, value: Any) -> str | None:
    """Like :func:`require_id`, or ``None``."""
    return None if value is None else require_id(name, value)


@overload
def require_ttl_ms(name: str, value: Any) -> int: ...
@overload
def require_ttl_ms(name: str, value: Any, *, optional: bool) -> int | None: ...
def require_ttl_ms(name: str, value: Any, *, optional: bool = False) -> int | None:
    """A TTL in milliseconds must be a positive integer (or ``None`` where allowed). One
    longer than a signed 64-bit time can hold means "never" (clamped where it is stored);
    a claim's lease, which becomes a stored time, is bounded (:data:`MAX_LEASE_MS`)."""
    if value is None:
        if optional:
            return None
        raise InvalidArgumentError(f"{name} is required")
    if type(value) is not int:
        raise InvalidArgumentError(f"{name} must be an integer of milliseconds, got {value!r}")
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be positive, got {value}")
    return value


def require_count(name: str, value: Any, *, minimum: int) -> int:
    """An integer option of at least ``minimum`` (a pool's size, a timeout in
    milliseconds); ``bool`` is not one."""
    if type(value) is not int:
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, got {value}")
    return value


MAX_DURATION_MS: Final = 2**63 - 1
"""The longest duration siglo counts with, in milliseconds: a signed 64-bit count, what
every store holds. A longer one (``10**400``) means "never" and is capped at it where a
deadline, a timer or a window is worked out from it, as a TTL past it is clamped where it
is stored: in seconds it is still a float, so no arithmetic on it overflows."""

MAX_DURATION_S: Final = MAX_DURATION_MS / 1000
""":data:`MAX_DURATION_MS` in seconds (about 292 million years)."""


def ms_as_seconds(ms: int) -> float:
    """``ms`` milliseconds in seconds, for a deadline, a timer or a sleep, capped at
    :data:`MAX_DURATION_MS`: ``ms / 1000`` of an integer too large for a float raises a
    raw ``OverflowError`` wherever the duration is first used."""
    return min(ms, MAX_DURATION_MS) / 1000


def capped_seconds(seconds: float) -> float:
    """``seconds`` capped at :data:`MAX_DURATION_S` (an ``int`` too large for a float
    included), so that adding it to a clock's time or scaling it cannot overflow."""
    return MAX_DURATION_S if seconds >= MAX_DURATION_S else seconds


def require_seconds(name: str, value: Any) -> float:
    """A duration in seconds must be a positive finite number (``bool`` is not one); it is
    returned capped (:func:`capped_seconds`). ``math.isfinite`` is asked of floats only:
    an integer is finite however large, and converting a huge one to a float raises
    ``OverflowError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number of seconds, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be positive and finite, got {value!r}")
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be positive and finite, got {value!r}")
    return capped_seconds(value)


def seconds_as_ms(name: str, value: Any) -> int:
    """A duration in seconds (:func:`require_seconds`) as whole milliseconds,
    ``max(1, floor(value * 1000))``, capped at :data:`MAX_DURATION_MS` (a float of seconds
    past it is infinite once multiplied by 1000)."""
    seconds = require_seconds(name, value)
    if seconds >= MAX_DURATION_S:
        return MAX_DURATION_MS
    return min(MAX_DURATION_MS, max(1, math.floor(seconds * 1000)))


MAX_LEASE_MS: Final = 2**62
"""The longest lease of a wait record's claim: added to now, its ``leaseExpiresAt`` is
still a signed 64-bit integer, which every backend stores."""


@overload
def require_lease_ms(name: str, value: Any) -> int: ...
@overload
def require_lease_ms(name: str, value: Any, *, optional: bool) -> int | None: ...
def require_lease_ms(name: str, value: Any, *, optional: bool = False) -> int | None:
    """A claim's lease in milliseconds: a TTL (:func:`require_ttl_ms`) of at most
    :data:`MAX_LEASE_MS`, whether given to a call or as a backend's ``claim_lease_ms``
    (accepted at connect, a longer one failed every claim, each backend differently)."""
    lease = require_ttl_ms(name, value, optional=optional)
    if lease is not None and lease > MAX_LEASE_MS:
        raise InvalidArgumentError(
            f"{name} must be at most {MAX_LEASE_MS} ms (2**62: the lease's end is a "
            f"stored time), got {lease}"
        )
    return lease


def check_save_arguments(checkpoint: Any, expected_revision: Any) -> None:
    """Reject a malformed save before anything is read or written (shared by backends)."""
    if not isinstance(checkpoint, Checkpoint):
        raise InvalidArgumentError(
            f"checkpoint must be a siglo.Checkpoint, got {type(checkpoint).__name__}"
        )
    require_id("checkpoint.stack_id", checkpoint.stack_id)
    namespace = checkpoint.namespace
    if namespace is not None:  # require_optional_id, without a call more on every save
        require_id("checkpoint.namespace", namespace)
        if namespace == KEYRING_NAMESPACE:
            check_not_keyring(namespace, f"saving stack {checkpoint.stack_id!r}")
    if expected_revision is None:
        return
    if type(expected_revision) is not int or expected_revision < 0:
        raise InvalidArgumentError(
            f"expected_revision must be a non-negative integer, got {expected_revision!r}"
        )
    if checkpoint.revision <= expected_revision:
        raise InvalidArgumentError(
            f"checkpoint revision {checkpoint.revision} must be greater than "
            f"expected_revision {expected_revision}"
        )


def check_wait_record(record: Any) -> WaitRecord:
    """Reject a wait record that is not one, or has an unusable key or stack id."""
    if not isinstance(record, WaitRecord):
        raise InvalidArgumentError(
            f"record must be a siglo.WaitRecord, got {type(record).__name__}"
        )
    require_id("record.correlation_key", record.correlation_key)
    require_id("record.stack_id", record.stack_id)
    require_optional_id("record.namespace", record.namespace)
    require_optional_id("record.claimant_id", record.claimant_id)
    return record


def check_context_change(event: Any) -> ContextChangeEvent:
    """Reject an event that is not one, or whose ids could not be stored as given.

    An empty namespace is refused rather than read as "no namespace": on SQL it would
    write into the un-namespaced stream.
    """
    if not isinstance(event, ContextChangeEvent):
        raise InvalidArgumentError(
            f"event must be a siglo.ContextChangeEvent, got {type(event).__name__}"
        )
    require_id("event.stack_id", event.stack_id)
    require_id("event.step_id", event.step_id)
    require_id("event.key", event.key)
    require_optional_id("event.namespace", event.namespace)
    return event
