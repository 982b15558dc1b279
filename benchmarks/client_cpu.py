"""The benchmark process's own CPU time during a pass, and the part of it collecting.

The hypervisor's stolen time (:mod:`benchmarks.interference`) is one reason a pass is
slow; the other is that the client itself did more work for the same operations: a
garbage collection of the whole heap, memory that had to be faulted in again, caches
that other guests on the host had emptied (which no counter in the guest shows). A pass
records the CPU time the process spent (:func:`time.process_time`, all its threads) and
the wall time its garbage collections took (:data:`gc.callbacks`), so a low round can be
told apart: the client's CPU per operation rose, or it stayed and the client waited.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["ClientClock", "Reading", "gc_seconds"]

_gc = {"total": 0.0, "started": 0.0}


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc["started"] = time.perf_counter()
    else:
        _gc["total"] += time.perf_counter() - _gc["started"]


if _on_gc not in gc.callbacks:
    gc.callbacks.append(_on_gc)


def gc_seconds() -> float:
    """Wall seconds spent in the cyclic garbage collector since this module was imported."""
    return _gc["total"]


@dataclass(frozen=True)
class Reading:
    """What a :class:`ClientClock` measured between its start and its stop."""

    seconds: float
    """Wall time."""
    cpu_s: float
    """CPU time of the process, all threads, user and system."""
    gc_s: float
    """Wall time in the cyclic garbage collector (part of ``cpu_s`` when it ran alone)."""


class ClientClock:
    """Wall time, the process's CPU time and its collections' time, from :meth:`start`."""

    def __init__(self) -> None:
        self._wall = self._cpu = self._gc = 0.0

    def start(self) -> None:
        self._wall, self._cpu, self._gc = time.perf_counter(), time.process_time(), gc_seconds()

    def stop(self) -> Reading:
        return Reading(
            time.perf_counter() - self._wall,
            time.process_time() - self._cpu,
            gc_seconds() - self._gc,
        )
