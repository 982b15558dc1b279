"""Error modes: what an adapter failure does to the caller (seed 000 §5, SPEC §4)."""

from __future__ import annotations

import warnings
from typing import Final, Literal, get_args

from siglo import masking
from siglo.adapter import StorageAdapter
from siglo.errors import (
    InvalidArgumentError,
    OutcomeUnknownError,
    SigloError,
    StorageAdapterError,
)

__all__ = [
    "ERROR_MODES",
    "ErrorMode",
    "StorageWarning",
    "check_error_mode",
    "default_error_mode",
    "surfaced_failure",
]

logger = masking.logger("siglo")

ErrorMode = Literal["best-effort", "warn", "strict"]
ERROR_MODES: Final = frozenset(get_args(ErrorMode))


class StorageWarning(UserWarning):
    """Issued for an adapter failure in ``warn`` error mode."""


def default_error_mode(adapter: StorageAdapter | None) -> ErrorMode:
    """The error mode a manager gets when none is given (SPEC §4 "Safe default").

    ``"strict"`` over a durable adapter (:attr:`StorageAdapter.durable`: every built-in
    backend but ``memory://``), ``"best-effort"`` over ``memory://`` or no adapter, where
    nothing outlives the process anyway.
    """
    return "strict" if adapter is not None and adapter.durable else "best-effort"


def check_error_mode(mode: object) -> ErrorMode:
    """``mode`` if it is an error mode; raises :class:`InvalidArgumentError` otherwise."""
    # Text first: `in` a set hashes the value, and a list raised a raw TypeError.
    if not isinstance(mode, str) or mode not in ERROR_MODES:
        raise InvalidArgumentError(
            f"error mode must be one of {', '.join(sorted(ERROR_MODES))}, got {mode!r}"
        )
    return mode  # type: ignore[return-value]


def _is_adapter_failure(exc: BaseException) -> bool:
    """Error modes govern adapter failures only; contract outcomes (a conflict, a
    namespace mismatch) and the caller's own bad input always propagate."""
    return isinstance(exc, StorageAdapterError) or not isinstance(exc, SigloError)


def surfaced_failure(exc: Exception, doing: str, mode: ErrorMode) -> Exception | None:
    """The exception the caller gets for ``exc`` raised while ``doing``, or ``None``.

    A contract outcome or bad input comes back as it is, in every mode. An adapter
    failure comes back as a :class:`~siglo.errors.StorageAdapterError` (wrapping any
    other exception) in ``"strict"`` mode; in ``"warn"`` mode it is logged to the
    ``siglo`` logger and issued as a :class:`StorageWarning`; in ``"best-effort"`` mode
    it is swallowed.

    An :class:`~siglo.errors.OutcomeUnknownError` is raised in every mode (``"warn"``
    logs it too): the write may or may not be stored, and a caller that carried on as
    if it had succeeded would act on a guess (SPEC §4).
    """
    if not _is_adapter_failure(exc):
        return exc
    if isinstance(exc, OutcomeUnknownError):
        if mode == "warn":
            logger.warning("siglo: %s: %s", doing, exc, exc_info=exc)
        return exc
    if not isinstance(exc, StorageAdapterError):
        wrapped = StorageAdapterError(f"storage adapter failed {doing}: {exc}")
        wrapped.__cause__ = exc
        exc = wrapped
    if mode == "strict":
        return exc
    if mode == "warn":
        logger.warning("siglo: %s failed: %s", doing, exc, exc_info=exc)
        # stacklevel 3: the manager method whose failure handler called this.
        warnings.warn(f"siglo: {doing} failed: {exc}", StorageWarning, stacklevel=3)
    return None
