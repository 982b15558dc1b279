"""How a round interleaves its subjects: in slices, each pass in the other direction.

A machine shared with other virtual machines changes speed from one second to the next
(on this one, a single thread decoding the same document ran 20 % faster or slower from
one half second to the next). A round that times each subject once, back to back, then
compares moments a second or more apart. Here a round is ``slices`` passes over the
subjects, each timing a part of the round's operations, every other pass in the reverse
order (A B C, C B A, A B C …), and a subject's figure for the round is its operations
over its time summed across the passes: its time is spread through the whole round, as
every other subject's is, so a change of the machine's speed within the round meets
them alike.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["MIN_OPS_PER_WORKER", "round_order", "slice_size"]

MIN_OPS_PER_WORKER: Final = 4
"""A pass gives each concurrent worker at least this many operations, so that starting
and stopping the workers stays a small part of its time."""


def round_order(subjects: int, round_no: int, slices: int) -> list[list[int]]:
    """The subject indices each pass of round ``round_no`` times, in order: the round's
    order turns with the round (no subject always first), every other pass reversed."""
    shift = round_no % subjects if subjects else 0
    order = [*range(shift, subjects), *range(shift)]
    return [order if p % 2 == 0 else order[::-1] for p in range(max(1, slices))]


def slice_size(ops: int, slices: int, concurrency: int) -> int:
    """The operations one pass times, for ``ops`` in a round of ``slices`` passes."""
    return max(concurrency * MIN_OPS_PER_WORKER, math.ceil(ops / max(1, slices)))
