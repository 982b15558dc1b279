"""Export a store to JSON Lines and import it into any backend (SPEC §9).

The dump (format 2) is one JSON document per line:

- a header ``{"siglo": "export", "format": 2, "exportedAt": <ms>, "namespace": …}``
  (``namespace`` only for an export of one namespace);
- per live checkpoint, ``{"kind": "checkpoint", "document": <the stored JSON>}`` — the
  document exactly as the backend holds it, byte for byte, so an export imported
  anywhere and exported again gives the same documents;
- after a checkpoint whose run waits (its ``metadata.waitRecord``), that wait's current
  record, read in the stack's namespace: ``{"kind": "wait", "record": <wait record
  JSON>}`` with its status, claim and event payload, so the run stays resumable by its
  event (or its timer) in the new store;
- last, a trailer ``{"siglo": "end", "checkpoints": N, "waits": M, "lines": L,
  "sha256": <hex>}``: how many checkpoint and wait lines came before it, how many lines
  in all (the header included), and the SHA-256 of those lines, each followed by one
  ``\\n``. An export that failed half-way has no trailer.

Import reads the whole dump first (spooled to a temporary file beyond a few MiB) and
refuses one that is cut (no trailer, or lines after it), altered (counts or digest do
not match) or malformed, naming the line, **before anything is written**. Then it saves
each checkpoint *without* ``expected_revision``: the store's compare-and-set takes it only
if it moves the stack's revision forward, so an import never overwrites newer data. A
wait goes in after its checkpoint: replacing the store's record when the import moved the
checkpoint forward (and the wait the stored revision waited on, if the moved checkpoint
no longer waits on it and it is still waiting, is cancelled), and with
:meth:`~siglo.StorageAdapter.create_wait_record` — only
where the store has none, atomically — when the store already held that very revision
(an earlier run of the same import, interrupted after the checkpoint). So an interrupted
import is completed by running it again, at whatever point it stopped: nothing is
written twice, nothing is left out, and a wait delivered in the new store meanwhile is
not put back. Dumps of format 1 (no trailer) are still read, without the check.

Context-change streams (telemetry) and the step cache are not exported.

The dump holds the documents as the backend stores them: with encryption on, sealed
(a safe backup: nothing in it reads without the keys); ``siglo export --decrypt`` writes
them decrypted instead. Keyrings (the envelope keys' checkpoints) are never exported.
Import decodes each document through the importing store's codec chain — so a sealed
document whose key was erased raises :class:`~siglo.errors.KeyErasedError`, and nothing
of it is stored — and saves it through the pipeline, which encrypts it under the
store's current key.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, Literal

import orjson

from siglo.adapter import Capability, StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.clock import system_clock
from siglo.errors import (
    CapabilityNotSupportedError,
    CheckpointConflictError,
    DocumentTooLargeError,
    InvalidArgumentError,
    ReservedFormError,
    SigloError,
)
from siglo.keys import KEYRING_NAMESPACE
from siglo.offload import references
from siglo.pipeline import Codecs, PipelineAdapter, redact_wait, redacted_parts, shown_run
from siglo.records import WaitRecord, embedded_wait_record
from siglo.redaction import named_redactions
from siglo.sentinel import MISSING, Missing
from siglo.sizing import check_document_size
from siglo.stored_runs import read_run
from siglo.unreadable import stopping_at_unreadable
from siglo.validation import check_save_arguments, check_wait_record, require_optional_id
from siglo.wait_keys import cancel_own_wait, place_wait

__all__ = [
    "FORMAT",
    "DumpError",
    "READABLE_FORMATS",
    "DumpSummary",
    "ImportReport",
    "export_lines",
    "import_lines",
    "verify_dump",
]

FORMAT: Final = 2
"""The format :func:`export_lines` writes."""
READABLE_FORMATS: Final = (1, 2)
"""The formats :func:`import_lines` reads (1: no trailer, so a cut dump goes unnoticed)."""

_PAGE: Final = 500


WHOLE_DUMP_HINT: Final = (
    "import a whole dump, as `siglo export URL > dump.jsonl` writes it (its last line is "
    "the trailer)"
)
RECORD_HINT: Final = (
    "the line holds a record siglo refuses to store (written or changed past siglo): "
    "nothing was imported; correct the record where it was exported from and export "
    "again (a dump edited by hand is refused unless its trailer's counts and sha256 "
    "match its lines, and a checkpoint removed takes the wait records after it along)"
)


class DumpError(InvalidArgumentError):
    """A dump that is not one whole, unaltered export: cut short, changed, malformed, or
    of a format this siglo does not read; or a line of it holding a record the store
    would refuse. Raised before anything is imported. ``hint`` says what to do."""

    def __init__(self, message: str, hint: str = WHOLE_DUMP_HINT) -> None:
        super().__init__(message)
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.hint))


_SPOOL_BYTES: Final = 8 * 1024 * 1024


class _Digest:
    """Counts and SHA-256 of the lines before the trailer, as the trailer states them."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.lines = 0
        self.checkpoints = 0
        self.waits = 0

    def add(self, line: bytes) -> None:
        self.sha.update(line)
        self.sha.update(b"\n")
        self.lines += 1

    def trailer(self) -> dict[str, Any]:
        return {
            "siglo": "end",
            "checkpoints": self.checkpoints,
            "waits": self.waits,
            "lines": self.lines,
            "sha256": self.sha.hexdigest(),
        }


async def export_lines(
    adapter: StorageAdapter,
    *,
    namespace: str | Missing | None = MISSING,
    codecs: Codecs | None = None,
    redact_fields: Iterable[str] | None = None,
) -> AsyncIterator[bytes]:
    """The dump of every live checkpoint (of ``namespace``, if given), line by line
    (each without its newline), its trailer last. With ``codecs`` (the settings' codec
    chain, under ``require_encryption``), every checkpoint and wait record is read
    through them before it is written, as any other path reads it: one stored in clear
    stops the export naming it (:class:`~siglo.errors.EncryptionRequiredError`), and the
    dump, without its trailer, is refused by ``siglo import``. A key of
    ``redact_fields`` (by default the settings' of ``adapter``'s pipeline, if it has
    one), or one a checkpoint says it was saved without, is written ``[REDACTED]``
    wherever it stands in a value written in clear, even one stored before the key was
    redacted, as ``siglo show`` shows it
    (:func:`~siglo.pipeline.shown_run`)."""
    if namespace is not MISSING:
        require_optional_id("namespace", namespace)  # before the header is written
    if redact_fields is None:
        redact_fields = (
            adapter.pipeline.redact_fields if isinstance(adapter, PipelineAdapter) else ()
        )
    if not adapter.supports(Capability.LISTING):
        raise CapabilityNotSupportedError(
            f"backend {adapter.name!r} cannot list its checkpoints (capability listing)"
        )
    digest = _Digest()
    header: dict[str, Any] = {"siglo": "export", "format": FORMAT}
    header["exportedAt"] = system_clock.now_ms()
    if namespace is not MISSING:
        header["namespace"] = namespace
    line = orjson.dumps(header)
    digest.add(line)
    yield line
    waits = adapter.supports(Capability.WAIT_RECORDS)
    cursor = None
    while True:
        with stopping_at_unreadable():  # a dump holds every stack, or fails naming one
            page = await adapter.list_checkpoints(namespace=namespace, limit=_PAGE, cursor=cursor)
        for summary in page.items:
            if summary.namespace == KEYRING_NAMESPACE:
                continue  # a dump never carries the keys it depends on
            # The run and the wait it names as the store held them (siglo.stored_runs):
            # read across a delivery, it was imported waiting for ever.
            run = await read_run(
                adapter, summary.stack_id, summary.namespace, waits=waits, latest=False
            )
            if run is None:
                continue  # deleted or expired since the page was read
            checkpoint, named = run
            record = named[0] if named else None
            # A dump carries values: a reference left here means the adapter has no
            # blob store to resolve it (settings without blob_url), and the target
            # may not share that store. Failing leaves the dump without its trailer.
            unresolved = next(references(checkpoint), None)
            if unresolved is not None:
                raise InvalidArgumentError(
                    f"stack {checkpoint.stack_id!r} (namespace {checkpoint.namespace!r}) "
                    f"references offloaded blob {unresolved}, which this connection cannot "
                    "read (no blob store): set blob_url and offload_min_bytes as the "
                    "application does, so that the dump carries the value"
                )
            if codecs is not None:
                await codecs.checkpoint_in(checkpoint)
                if record is not None:
                    await codecs.wait_in(record)
            # What leaves the store in clear leaves it as every printing path gives it.
            checkpoint, shown, _hidden = shown_run(
                checkpoint, () if record is None else (record,), redact_fields
            )
            record = shown[0] if shown else None
            line = b'{"kind":"checkpoint","document":' + checkpoint.to_json() + b"}"
            digest.add(line)
            digest.checkpoints += 1
            yield line
            if record is not None:
                line = b'{"kind":"wait","record":' + record.to_json() + b"}"
                digest.add(line)
                digest.waits += 1
                yield line
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    yield orjson.dumps(digest.trailer())


@dataclass
class DumpSummary:
    """What a verified dump holds (:func:`verify_dump`)."""

    format: int
    checkpoints: int = 0
    waits: int = 0
    namespace: str | Missing | None = MISSING
    """The namespace the export was limited to (``MISSING``: every namespace)."""
    verified: bool = False
    """Whether a trailer vouched for the dump's counts and digest (format 2)."""


@dataclass
class ImportReport:
    """What an import did."""

    imported: int = 0
    """Checkpoints saved."""
    skipped: int = 0
    """Checkpoints not saved: the store already had a newer revision (or, at that
    revision, another document)."""
    present: int = 0
    """Checkpoints already there at exactly that revision: an earlier run of this import
    saved them (their waits are completed now if that run stopped before them)."""
    waits: int = 0
    """Wait records saved."""
    waits_present: int = 0
    """Wait records the store already had (from an earlier run, or changed there since),
    left as they are."""
    waits_taken: list[WaitRecord] = field(default_factory=list)
    """Wait records of the dump not stored because another run of the store waits on
    their correlation key (a key names one open wait): stored, that run would never
    resume. Their runs were imported waiting, and wait for a key another run holds."""
    namespaces: set[str | None] = field(default_factory=set)
    summary: DumpSummary | None = None
    """The dump's header and trailer, as verified before anything was written."""


def _document(line: bytes, number: int) -> dict[str, Any]:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DumpError(f"line {number} of the dump is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise DumpError(f"line {number} of the dump is not a JSON object")
    return value


def _embedded_json(line: bytes, key: str) -> bytes:
    """The raw JSON of ``{"kind":…,"<key>":<json>}`` as written by :func:`export_lines`,
    byte for byte (re-encoding a parsed document could change its bytes)."""
    marker = b'"' + key.encode() + b'":'
    start = line.find(marker)
    end = line.rstrip().rfind(b"}")
    if start < 0 or end <= start:
        raise DumpError(f"no {key!r} in the line")
    return line[start + len(marker) : end].strip()


Entry = tuple[Literal["checkpoint"], Checkpoint] | tuple[Literal["wait"], WaitRecord]


def _entry(line: bytes, number: int, doc: dict[str, Any]) -> Entry:
    """The checkpoint or wait record of a dump line (``doc``, parsed), validated."""
    kind = doc.get("kind")
    try:
        if kind == "checkpoint":
            checkpoint = Checkpoint.from_json(_embedded_json(line, "document"))
            if checkpoint.namespace == KEYRING_NAMESPACE:
                raise DumpError(
                    f"line {number} holds a keyring ({KEYRING_NAMESPACE!r}): keys are never "
                    "imported",
                    RECORD_HINT,
                )
            # What the save would refuse (an empty or too long id), refused here, before
            # anything of the dump is written.
            check_save_arguments(checkpoint, None)
            offloaded = next(references(checkpoint), None)
            if offloaded is not None:
                # siglo export writes offloaded values inline: a reference is to a blob
                # store this dump does not carry, and would dangle in the target.
                raise DumpError(
                    f"line {number} holds a reference to offloaded blob {offloaded} in stack "
                    f"{checkpoint.stack_id!r}: a dump carries values, never references "
                    "(siglo export writes them inline)",
                    RECORD_HINT,
                )
            return "checkpoint", checkpoint
        if kind == "wait":
            return "wait", check_wait_record(WaitRecord.from_json(_embedded_json(line, "record")))
    except DumpError:
        raise
    except SigloError as exc:
        raise DumpError(f"line {number} of the dump: {exc}", RECORD_HINT) from None
    if doc.get("siglo") == "end":
        raise DumpError(f"line {number}: a second trailer")
    raise DumpError(f"line {number} has an unknown kind {kind!r}")


def _numbered(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines without their line ending, with their line numbers."""
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip(b"\r\n")
        if line.strip():
            yield number, line


def _header(line: bytes, number: int) -> DumpSummary:
    doc = _document(line, number)
    if doc.get("siglo") != "export" or doc.get("format") not in READABLE_FORMATS:
        formats = " or ".join(map(str, READABLE_FORMATS))
        found = doc.get("format") if doc.get("siglo") == "export" else None
        detail = f" (it says format {found!r})" if found is not None else ""
        raise DumpError(f"line {number} is not a siglo export header (format {formats}){detail}")
    summary = DumpSummary(format=int(doc["format"]))
    if "namespace" in doc:
        summary.namespace = doc["namespace"]
    return summary


def _check_trailer(doc: dict[str, Any], number: int, digest: _Digest) -> None:
    stated = {k: doc.get(k) for k in ("checkpoints", "waits", "lines", "sha256")}
    found = {k: v for k, v in digest.trailer().items() if k != "siglo"}
    wrong = [
        f"{k} {stated[k]!r} (the dump has {found[k]!r})" for k in found if stated[k] != found[k]
    ]
    if wrong:
        raise DumpError(
            f"the dump does not match its trailer (line {number}): {'; '.join(wrong)}; "
            "it was altered or assembled from parts: export again"
        )


def verify_dump(lines: Iterable[bytes]) -> DumpSummary:
    """Read a whole dump and check it without writing anything: its header, every line,
    and (format 2) that its trailer is there, last, and matches the counts and SHA-256.

    Raises :class:`DumpError` naming what is wrong: a dump cut
    short (no trailer — the export failed or was interrupted), lines after the trailer,
    counts or digest that do not match (altered), a malformed line.
    """
    summary: DumpSummary | None = None
    digest = _Digest()
    ended_at: int | None = None
    owner: tuple[str, str | None] | None = None
    """The run of the checkpoint just read, while its wait may follow."""
    for number, line in _numbered(lines):
        if summary is None:
            summary = _header(line, number)
            digest.add(line)
            continue
        if ended_at is not None:
            raise DumpError(
                f"line {number} comes after the trailer (line {ended_at}): "
                "the dump is not one export"
            )
        doc = _document(line, number)
        if summary.format >= 2 and doc.get("siglo") == "end":
            _check_trailer(doc, number, digest)
            ended_at = number
            continue
        kind, value = _entry(line, number, doc)
        digest.add(line)
        if kind == "checkpoint":
            digest.checkpoints += 1
            owner = (value.stack_id, value.namespace)
        else:
            digest.waits += 1
            # A wait goes in with its run's checkpoint, the line before it (the import
            # reads it there): one anywhere else would be dropped, its run left waiting
            # on a wait the store does not have.
            if owner != (value.stack_id, value.namespace):
                raise DumpError(
                    f"line {number} is a wait record of stack {value.stack_id!r} that does "
                    "not follow its run's checkpoint: the dump was reordered or assembled "
                    "from parts: export again"
                )
            owner = None
    if summary is None:
        raise DumpError("the dump is empty: no siglo export header")
    if summary.format >= 2 and ended_at is None:
        raise DumpError(
            f"the dump is cut short: no trailer after its {digest.lines} line(s) "
            f"({digest.checkpoints} checkpoint(s), {digest.waits} wait record(s)); the "
            "export failed or was interrupted: nothing was imported, export again"
        )
    summary.checkpoints, summary.waits = digest.checkpoints, digest.waits
    summary.verified = ended_at is not None
    return summary


class _Spool:
    """The dump's lines kept for a second pass: in memory, on disk beyond a few MiB."""

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115

    def keep(self, lines: Iterable[bytes]) -> Iterator[bytes]:
        for line in lines:
            self.file.write(line if line.endswith(b"\n") else line + b"\n")
            yield line

    def replay(self) -> Iterator[bytes]:
        self.file.seek(0)
        # A loop, not ``yield from``: a pass that stops early (at the trailer) would close
        # the delegated iterator — the file itself — under the next pass.
        for line in self.file:  # noqa: UP028
            yield line

    def close(self) -> None:
        self.file.close()


async def import_lines(
    adapter: StorageAdapter,
    lines: Iterable[bytes],
    *,
    progress: Callable[[ImportReport], Any] | None = None,
) -> ImportReport:
    """Import a dump made by :func:`export_lines` into ``adapter``.

    The whole dump is verified first (:func:`verify_dump`); a cut, altered or malformed
    dump raises :class:`DumpError` naming what is wrong, and
    nothing is written. Running an interrupted import again completes it.
    ``progress(report)``, if given, is called after every line written.
    """
    spool = _Spool()
    try:
        summary = verify_dump(spool.keep(lines))
        if summary.waits and not adapter.supports(Capability.WAIT_RECORDS):
            raise CapabilityNotSupportedError(
                f"the dump holds {summary.waits} wait record(s) and backend "
                f"{adapter.name!r} has no wait records: nothing was imported"
            )
        await _check_sizes(adapter, spool.replay())
        report = ImportReport(summary=summary)
        await _write(adapter, spool.replay(), report, progress)
        return report
    finally:
        spool.close()


async def _check_sizes(adapter: StorageAdapter, lines: Iterable[bytes]) -> None:
    # The size guard refuses one document at a time, as it is saved: checked here for
    # the whole dump first, on each checkpoint as the target would store it (opened, then
    # through the target's redaction, codecs and offloading, nothing put), so a document
    # over the target's limit leaves nothing of the dump written.
    if not isinstance(adapter, PipelineAdapter) and adapter.max_document_bytes is None:
        return  # no stages and no limit: nothing to refuse
    header_seen = False
    for number, line in _numbered(lines):
        if not header_seen:
            header_seen = True
            continue
        doc = _document(line, number)
        if doc.get("siglo") == "end":
            return
        kind, value = _entry(line, number, doc)
        if kind != "checkpoint":
            continue
        assert isinstance(value, Checkpoint)
        try:
            if isinstance(adapter, PipelineAdapter):
                opened = await _opened_checkpoint(adapter, value)
                stored, limit = await adapter.stored_form(opened)
            else:  # stored as it is in the dump, but for its own redacted keys
                stored, limit = _redacted_by_its_keys(value), adapter.max_document_bytes
            check_document_size(stored, limit)
        except (DocumentTooLargeError, ReservedFormError) as exc:
            exc.args = (f"line {number} of the dump: {exc}; nothing was imported",)
            raise


WaitMode = Literal["save", "create"] | None


async def _write(
    adapter: StorageAdapter,
    lines: Iterable[bytes],
    report: ImportReport,
    progress: Callable[[ImportReport], Any] | None,
) -> None:
    # How the wait after a checkpoint goes in: "save" (the import moved the checkpoint
    # forward: the dumped wait is the truth for it), "create" (the store already held
    # that revision: add the wait only where it has none), None (skip: the store's run
    # is elsewhere, and a wait of an older revision must not replace its waits).
    mode: WaitMode = None
    owner: Checkpoint | None = None
    header_seen = False
    for number, line in _numbered(lines):
        if not header_seen:
            header_seen = True
            continue
        doc = _document(line, number)
        if doc.get("siglo") == "end":
            break  # the trailer, verified already: the last line
        kind, value = _entry(line, number, doc)
        if kind == "checkpoint":
            assert isinstance(value, Checkpoint)
            owner = await _opened_checkpoint(adapter, value)
            mode = await _import_checkpoint(adapter, owner, report)
        else:
            assert isinstance(value, WaitRecord)
            if (
                mode is not None
                and owner is not None
                and (value.stack_id, value.namespace) == (owner.stack_id, owner.namespace)
            ):
                opened = await _opened_wait(adapter, value, named_redactions(owner.metadata))
                await _import_wait(adapter, opened, mode, report)
        if progress is not None:
            progress(report)


async def _opened_checkpoint(adapter: StorageAdapter, checkpoint: Checkpoint) -> Checkpoint:
    if isinstance(adapter, PipelineAdapter):
        # Sealed documents are opened here (and sealed again by the save): a document of
        # an erased key fails before anything of it is stored.
        opened = await adapter.open_stored_checkpoint(checkpoint)
        assert opened is not None
        checkpoint = opened
    return _redacted_by_its_keys(checkpoint)


def _redacted_by_its_keys(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` with the keys it names redacted (``metadata.redactFields``) out of
    its contexts, metadata and unknown fields, whatever the importing process's settings
    say: a value stored in clear around the pipeline before its key was named is not
    carried into another store (the pipeline, where there is one, does the same)."""
    named = named_redactions(checkpoint.metadata)
    if not named:
        return checkpoint
    contexts, metadata, extra = redacted_parts(checkpoint, named)
    if (contexts, metadata, extra) == (checkpoint.contexts, checkpoint.metadata, checkpoint.extra):
        return checkpoint
    return checkpoint.replace(contexts=contexts, metadata=metadata, extra=extra)


async def _opened_wait(
    adapter: StorageAdapter, record: WaitRecord, named: frozenset[str]
) -> WaitRecord:
    """``record`` opened, and redacted by its run's keys (``named``): its event payload
    becomes the run's context, as a delivery's does."""
    if isinstance(adapter, PipelineAdapter):
        opened = await adapter.open_stored_wait(record)
        assert opened is not None
        record = opened
    return redact_wait(record, named)


async def _import_checkpoint(
    adapter: StorageAdapter, checkpoint: Checkpoint, report: ImportReport
) -> WaitMode:
    waits = adapter.supports(Capability.WAIT_RECORDS)
    replaced = None
    if waits:
        # What the store held, for the wait it waited on (_cancel_passed_wait). One it
        # cannot read (its key erased, say) is replaced all the same, as before.
        with contextlib.suppress(SigloError):
            replaced = await adapter.get_checkpoint(
                checkpoint.stack_id, checkpoint.namespace, fallback=False
            )
    try:
        await adapter.save_checkpoint(checkpoint)
    except CheckpointConflictError:
        stored = await adapter.get_checkpoint(
            checkpoint.stack_id, checkpoint.namespace, fallback=False
        )
        if (
            stored is not None
            and stored.revision == checkpoint.revision
            and stored.timestamp == checkpoint.timestamp
        ):
            # This very revision (same revision, same save time): an earlier run of
            # this import wrote it and may have stopped before its wait.
            report.present += 1
            report.namespaces.add(checkpoint.namespace)
            return "create"
        report.skipped += 1
        return None
    report.imported += 1
    report.namespaces.add(checkpoint.namespace)
    if replaced is not None:
        await _cancel_passed_wait(adapter, replaced, checkpoint)
    return "save"


async def _cancel_passed_wait(
    adapter: StorageAdapter, replaced: Checkpoint, checkpoint: Checkpoint
) -> None:
    """The import moved a stack forward past the wait its replaced revision waited on (an
    earlier import of an older dump): the run no longer waits there, as in the store the
    dump came from, where that wait was delivered or timed out — and a dump holds only
    the wait its run waits on now. Left open, it would be claimed at every worker pass
    for a step that no longer waits, or take a late delivery: cancelled, as a run's
    cancellation does. Only while it is still waiting and the stack's."""
    passed = embedded_wait_record(replaced.metadata)
    if passed is None:
        return
    current = embedded_wait_record(checkpoint.metadata)
    if current is not None and current.correlation_key == passed.correlation_key:
        return  # the same wait: the dump's record replaces it after this checkpoint
    stored = await adapter.get_wait_record(passed.correlation_key, namespace=checkpoint.namespace)
    if stored is not None and stored.status == "waiting" and stored.stack_id == checkpoint.stack_id:
        # Under the key's lock, only if still that record (another run may take the key).
        await cancel_own_wait(adapter, stored, statuses=("waiting",))


async def _import_wait(
    adapter: StorageAdapter, record: WaitRecord, mode: WaitMode, report: ImportReport
) -> None:
    # Never over another run's open wait of the key (an unconditional save took it: that
    # run never resumed, a black-box auditor); "create": the store's own record of this
    # run stays.
    placed, _there = await place_wait(adapter, record, replace_own=mode == "save")
    if placed == "stored":
        report.waits += 1
    elif placed == "present":
        report.waits_present += 1
    else:
        report.waits_taken.append(record)
