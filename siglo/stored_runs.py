"""A run read as the store held it: its checkpoint and its wait records, as one pair.

A run's checkpoint and its wait records are separate records, read one after the other.
A delivery (or a timer) stores the run's checkpoint first and completes the wait after
it, so a read that takes the checkpoint just before a delivery and the records just
after pairs a run still ``waiting`` with its wait ``completed``: a pair the store never
held, which ``siglo show`` and the dashboard then called "delivered" — a timeout
included (a black-box auditor) — and which an export imported as a run waiting for ever
(another). Every path that reads a run to print or carry it — :mod:`siglo.transfer`'s
export, ``siglo show`` (:mod:`siglo.cli.store`), the dashboard's run page
(:mod:`siglo.ui.data`) — reads it here: until the two agree (the checkpoint moved on),
at most :data:`PAIR_ATTEMPTS` times.
"""

from __future__ import annotations

from typing import Final

from siglo.adapter import Capability, StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.listing import get_named
from siglo.records import WaitRecord, embedded_wait_record

__all__ = ["PAIR_ATTEMPTS", "read_run", "waits_of"]

PAIR_ATTEMPTS: Final = 8
"""Reads of a run and its waits while deliveries keep moving the run."""


async def waits_of(
    adapter: StorageAdapter, checkpoint: Checkpoint, *, latest: bool = True
) -> list[WaitRecord]:
    """The run's wait records: the one its metadata names and (``latest``) the latest of
    its id, each only while it is this run's (a key whose wait ended may be waited on
    again by another run: its record goes with that run alone). Read in the run's
    namespace."""
    if not adapter.supports(Capability.WAIT_RECORDS):
        return []
    stack_id, namespace = checkpoint.stack_id, checkpoint.namespace
    embedded = embedded_wait_record(checkpoint.metadata)
    keys = [] if embedded is None else [embedded.correlation_key]
    if latest:
        last = await adapter.get_wait_record(stack_id, namespace=namespace)
        if last is not None and last.stack_id == stack_id:
            keys.append(last.correlation_key)
    found = []
    for key in dict.fromkeys(keys):
        record = await adapter.get_wait_record(key, namespace=namespace)
        if record is not None and record.stack_id == stack_id and record.namespace == namespace:
            found.append(record)
    return found


def _read_across_an_answer(checkpoint: Checkpoint, waits: list[WaitRecord]) -> bool:
    """Whether the run says it waits while the wait it names has ended: the checkpoint
    read before a delivery or timer moved the run on, the record after it ended."""
    if checkpoint.status != "waiting":
        return False
    embedded = embedded_wait_record(checkpoint.metadata)
    if embedded is None:
        return False
    return any(
        w.correlation_key == embedded.correlation_key and w.status not in ("waiting", "claimed")
        for w in waits
    )


async def read_run(
    adapter: StorageAdapter,
    stack_id: str,
    namespace: str | None,
    *,
    waits: bool = True,
    latest: bool = True,
) -> tuple[Checkpoint, list[WaitRecord]] | None:
    """The run ``stack_id`` of ``namespace`` (no fallback) and its wait records
    (:func:`waits_of`; none with ``waits=False``), read as a pair the store held;
    ``None`` if no checkpoint is stored. A stored document that cannot be read raises
    its :class:`~siglo.errors.MalformedRecordError` naming the stack (``siglo rm``
    removes it). A run answered and waiting again at every read is given as last read."""
    pair: tuple[Checkpoint, list[WaitRecord]] | None = None
    for _ in range(PAIR_ATTEMPTS):
        checkpoint = await get_named(adapter, stack_id, namespace)
        if checkpoint is None:
            return None
        records = await waits_of(adapter, checkpoint, latest=latest) if waits else []
        pair = (checkpoint, records)
        if not _read_across_an_answer(*pair):
            return pair
    return pair
