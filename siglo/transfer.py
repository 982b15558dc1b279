"""Export a store to JSON Lines and import it into any backend (SPEC §9).

The dump is one JSON document per line:

- a header ``{"siglo": "export", "format": 1, "exportedAt": <ms>, "namespace": …}``;
- per live checkpoint, ``{"kind": "checkpoint", "document": <the stored JSON>}`` — the
  document exactly as the backend holds it, byte for byte, so an export imported
  anywhere and exported again gives the same documents;
- after a checkpoint whose run waits (its ``metadata.waitRecord``), that wait's current
  record: ``{"kind": "wait", "record": <wait record JSON>}``, so the run stays
  resumable by its event (or its timer) in the new store.

The dump holds the documents as the backend stores them: with encryption on, sealed
(a safe backup: nothing in it reads without the keys); ``siglo export --decrypt`` writes
them decrypted instead. Keyrings (the envelope keys' checkpoints) are never exported.
Import decodes each document through the importing store's codec chain — so a sealed
document whose key was erased raises :class:`~siglo.errors.KeyErasedError`, and nothing
of it is stored — and saves it through the pipeline, which encrypts it under the
store's current key.

Importing saves each checkpoint *without* ``expected_revision``: the store's
compare-and-set takes it only if it moves the stack's revision forward, so an import
never overwrites newer data and a second run of the same import (after an interruption)
skips what is already there. Context-change streams (telemetry) and the step cache are
not exported.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from siglo.adapter import Capability, StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.clock import system_clock
from siglo.errors import CheckpointConflictError, InvalidArgumentError
from siglo.keys import KEYRING_NAMESPACE
from siglo.pipeline import PipelineAdapter
from siglo.records import WaitRecord, embedded_wait_record
from siglo.sentinel import MISSING, Missing

__all__ = ["FORMAT", "ImportReport", "export_lines", "import_lines"]

FORMAT: Final = 1
_PAGE: Final = 500


async def export_lines(
    adapter: StorageAdapter, *, namespace: str | Missing | None = MISSING
) -> AsyncIterator[bytes]:
    """The dump of every live checkpoint (of ``namespace``, if given), line by line
    (each without its newline)."""
    if not adapter.supports(Capability.LISTING):
        raise InvalidArgumentError(f"backend {adapter.name!r} cannot list its checkpoints")
    header: dict[str, Any] = {"siglo": "export", "format": FORMAT}
    header["exportedAt"] = system_clock.now_ms()
    if namespace is not MISSING:
        header["namespace"] = namespace
    yield orjson.dumps(header)
    waits = adapter.supports(Capability.WAIT_RECORDS)
    cursor = None
    while True:
        page = await adapter.list_checkpoints(namespace=namespace, limit=_PAGE, cursor=cursor)
        for summary in page.items:
            if summary.namespace == KEYRING_NAMESPACE:
                continue  # a dump never carries the keys it depends on
            checkpoint = await adapter.get_checkpoint(
                summary.stack_id, summary.namespace, fallback=False
            )
            if checkpoint is None:
                continue  # deleted or expired since the page was read
            yield b'{"kind":"checkpoint","document":' + checkpoint.to_json() + b"}"
            embedded = embedded_wait_record(checkpoint.metadata) if waits else None
            if embedded is not None:
                record = await adapter.get_wait_record(embedded.correlation_key)
                if record is not None and record.correlation_key == embedded.correlation_key:
                    yield b'{"kind":"wait","record":' + record.to_json() + b"}"
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@dataclass
class ImportReport:
    """What an import did."""

    imported: int = 0
    """Checkpoints saved."""
    skipped: int = 0
    """Checkpoints not saved: the store already had that revision or a newer one."""
    waits: int = 0
    """Wait records saved."""
    namespaces: set[str | None] = field(default_factory=set)


def _document(line: bytes, number: int) -> dict[str, Any]:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"line {number} of the dump is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"line {number} of the dump is not a JSON object")
    return value


def _embedded_json(line: bytes, key: str) -> bytes:
    """The raw JSON of ``{"kind":…,"<key>":<json>}`` as written by :func:`export_lines`,
    byte for byte (re-encoding a parsed document could change its bytes)."""
    marker = b'"' + key.encode() + b'":'
    start = line.find(marker)
    end = line.rstrip().rfind(b"}")
    return line[start + len(marker) : end].strip()


async def import_lines(
    adapter: StorageAdapter,
    lines: Iterable[bytes],
    *,
    progress: Any = None,
) -> ImportReport:
    """Import a dump made by :func:`export_lines` into ``adapter``.

    ``progress(report)``, if given, is called after every line. Raises
    :class:`~siglo.errors.InvalidArgumentError` naming the line for a malformed dump.
    """
    report = ImportReport()
    header_seen = False
    # A wait is saved only after its checkpoint went in: a skipped (older) checkpoint's
    # wait must not replace the newer store's.
    last_saved: Checkpoint | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        doc = _document(line, number)
        if not header_seen:
            if doc.get("siglo") != "export" or doc.get("format") != FORMAT:
                raise InvalidArgumentError(
                    f"line {number} is not a siglo export header (format {FORMAT})"
                )
            header_seen = True
            continue
        kind = doc.get("kind")
        if kind == "checkpoint":
            checkpoint = Checkpoint.from_json(_embedded_json(line, "document"))
            if checkpoint.namespace == KEYRING_NAMESPACE:
                raise InvalidArgumentError(
                    f"line {number} holds a keyring ({KEYRING_NAMESPACE!r}): keys are never "
                    "imported"
                )
            if isinstance(adapter, PipelineAdapter):
                # Sealed documents are opened here (and sealed again by the save): a
                # document of an erased key fails before anything of it is stored.
                opened = await adapter.open_stored_checkpoint(checkpoint)
                assert opened is not None
                checkpoint = opened
            try:
                await adapter.save_checkpoint(checkpoint)
            except CheckpointConflictError:
                report.skipped += 1
                last_saved = None
            else:
                report.imported += 1
                report.namespaces.add(checkpoint.namespace)
                last_saved = checkpoint
        elif kind == "wait":
            record = WaitRecord.from_json(_embedded_json(line, "record"))
            if isinstance(adapter, PipelineAdapter):
                opened_record = await adapter.open_stored_wait(record)
                assert opened_record is not None
                record = opened_record
            if last_saved is not None and record.stack_id == last_saved.stack_id:
                await adapter.save_wait_record(record)
                report.waits += 1
        else:
            raise InvalidArgumentError(f"line {number} has an unknown kind {kind!r}")
        if progress is not None:
            progress(report)
    if not header_seen:
        raise InvalidArgumentError("the dump is empty: no siglo export header")
    return report
