"""The SQL storage adapter, written once for SQLite and PostgreSQL.

Every operation is one statement where the contract needs atomicity (see
:mod:`siglo_sql.statements`); the two that need several (saving a wait record
with its by-stack index, cancelling a workflow) run in one transaction. Semantics are
those of the memory backend, rule by rule of ``docs/contract.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any, ClassVar

from siglo import codec
from siglo.adapter import CacheEntry, Capability, StorageAdapter
from siglo.checkpoint import TERMINAL_STATUSES, Checkpoint
from siglo.clock import Clock, clock_or_system, system_clock
from siglo.errors import (
    CheckpointConflictError,
    InvalidArgumentError,
    MalformedRecordError,
    StorageAdapterError,
    WaitRecordClaimError,
    naming_wait,
)
from siglo.listing import CheckpointPage, ListQuery
from siglo.locking import Hold, held, namespaced_key, workflow_lock_key
from siglo.payloads import (
    CONTEXT_KIND,
    PAYLOAD_KINDS,
    PayloadKind,
    StoredPayload,
    context_field,
    wait_fields,
    with_wait_fields,
)
from siglo.records import CacheEvent, ContextChangeEvent, WaitRecord, embedded_wait_record
from siglo.sentinel import MISSING, Missing
from siglo.settings import DEFAULTS
from siglo.sizing import check_document_size
from siglo.unreadable import UNREADABLE, report_unreadable
from siglo.validation import (
    check_context_change,
    check_save_arguments,
    require_lease_ms,
    require_ttl_ms,
)
from siglo_sql.batching import KeyedReads
from siglo_sql.coordination import SqlLock
from siglo_sql.database import Database, Params, Plan, Row
from siglo_sql.keys import at_most, row_id
from siglo_sql.listing import cursor_of, indexed_list, page_conditions, summary_of
from siglo_sql.migrations import (
    check_target,
    ensure_token_triggers,
    holds_token_marker,
    indexed_text,
    migrate,
    read_version,
)
from siglo_sql.parts import (
    DEFAULT_INCREMENTAL_MIN_BYTES,
    DIGEST_BYTES,
    BodyCache,
    SameLengthRows,
    Split,
    assemble,
    split,
)
from siglo_sql.rows import (
    checkpoint_row,
    due_wait_from_row,
    stored_bytes,
    wait_from_row,
    wait_id,
    wait_row,
)
from siglo_sql.schema import DEFAULT_PREFIX, ID_PREFIX, SCHEMA_VERSION, build_tables
from siglo_sql.statements import (
    LIVE,
    Statements,
    gone_digests,
    many_ids,
    new_bodies,
    part_rows,
)

__all__ = ["SqlStorageAdapter"]

_WRITES = frozenset(
    {"save_checkpoint", "on_context_change", "_do_save_checkpoint", "_do_on_context_change"}
)


class SqlStorageAdapter(StorageAdapter):
    """The storage contract on SQL tables; every expiry uses the injected clock.

    Options as the memory backend's: ``checkpoint_ttl_ms`` (default: none) bounds how
    long checkpoints without their own ``expires_at``, wait records and context streams
    are kept; ``cache_ttl_ms`` is the step cache's default TTL; ``claim_lease_ms`` how
    long a wait-record claim lasts. ``workflow_lock_timeout_ms`` is how long
    :meth:`with_workflow_lock` waits; ``workflow_lock_ttl_ms`` the lease of its lock row
    (renewed while the action runs, so a crashed holder frees it after that long).
    ``incremental_min_bytes``: a checkpoint document at least this long is saved
    incrementally, only its changed contexts written (:mod:`siglo_sql.parts`); ``None``
    stores every document whole.
    """

    name: ClassVar[str] = "sql"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.CHECKPOINTS,
            Capability.WAIT_RECORDS,
            Capability.WORKFLOW_LOCK,
            Capability.STEP_CACHE,
            Capability.CONTEXT_STREAM,
            Capability.CACHE_EVENTS,
            Capability.CLOCK,
            Capability.LISTING,
            Capability.DELETION,
            Capability.DUE_WAITS,
            Capability.PAYLOAD_SCAN,
        }
    )
    payload_kinds: ClassVar[frozenset[PayloadKind]] = frozenset((*PAYLOAD_KINDS, CONTEXT_KIND))
    workflow_lock: SqlLock

    def __init__(
        self,
        database: Database,
        statements: Statements,
        *,
        clock: Clock | None = None,
        checkpoint_ttl_ms: int | None = None,
        cache_ttl_ms: int = DEFAULTS.cache_ttl_ms,
        claim_lease_ms: int = DEFAULTS.claim_lease_ms,
        workflow_lock_timeout_ms: int = DEFAULTS.workflow_lock_timeout_ms,
        workflow_lock_ttl_ms: int = DEFAULTS.workflow_lock_ttl_ms,
        clean_batch_size: int = DEFAULTS.clean_batch_size,
        incremental_min_bytes: int | None = DEFAULT_INCREMENTAL_MIN_BYTES,
        table_prefix: str = DEFAULT_PREFIX,
        schema: str | None = None,
    ) -> None:
        self.database = database
        self.table_prefix = table_prefix
        self.schema = schema
        self.clock: Clock = clock_or_system(clock)
        self.checkpoint_ttl_ms = require_ttl_ms(
            "checkpoint_ttl_ms", checkpoint_ttl_ms, optional=True
        )
        self.cache_ttl_ms = require_ttl_ms("cache_ttl_ms", cache_ttl_ms)
        self.claim_lease_ms = require_lease_ms("claim_lease_ms", claim_lease_ms)
        self.workflow_lock_timeout_ms = require_ttl_ms(
            "workflow_lock_timeout_ms", workflow_lock_timeout_ms
        )
        self.workflow_lock_ttl_ms = require_ttl_ms("workflow_lock_ttl_ms", workflow_lock_ttl_ms)
        self.clean_batch_size = require_ttl_ms("clean_batch_size", clean_batch_size)
        if incremental_min_bytes is not None and (
            type(incremental_min_bytes) is not int or incremental_min_bytes < 0
        ):
            raise InvalidArgumentError(
                "incremental_min_bytes must be a non-negative integer of bytes or none, "
                f"got {incremental_min_bytes!r}"
            )
        self.incremental_min_bytes = incremental_min_bytes
        self._bodies = BodyCache()
        """The context bodies this adapter saved last, so unchanged ones are not hashed."""
        self._same_length: SameLengthRows | None = None
        """SQLite, saving in parts: the lengths of the large documents this adapter
        saved, by row, which decide whether a row that keeps its length is saved whole
        (:meth:`_in_parts`); ``None`` elsewhere."""
        if statements.parts_replace is not None and incremental_min_bytes is not None:
            self._same_length = SameLengthRows()
        self._versions: dict[bytes, tuple[str, frozenset[bytes]]] = {}
        """By checkpoint row id, the version of the row this adapter saved or loaded last
        (stored in parts, on PostgreSQL: its ``xmin``) and the digests of its parts,
        oldest first: what lets the next save of the row be one statement
        (``cp_update_parts``). At most :data:`_VERSION_DIGESTS` digests in all."""
        self._versions_size = 0
        """How many digests :attr:`_versions` holds (each row counting one more)."""
        self._templates: dict[tuple[str, int], str] = {}
        """Templates completed and converted, by name and number of rows
        (:meth:`_template`)."""
        # Statements already in the driver's parameter style (converted at connect).
        self._s = statements
        self._cp_reads: KeyedReads | None = None
        if database.coalesce_reads:
            many = statements.cp_load_many
            self._cp_reads = KeyedReads(
                database,
                statements.cp_load,
                lambda n: database.sql(many.format(ids=many_ids(n))),
                lambda: self.clock.now_ms(),
                fold=_with_bodies,
            )
        self._cp_list: dict[str, str] = {}
        """``cp_list`` completed and converted, by the shape of its conditions."""
        self._cp_list_indexed: dict[str, str] = {}
        """Filtered listings (:func:`siglo_sql.listing.indexed_list`), by shape."""
        # The workflow lock is a lease row like any lock, in its own scope. Its lease
        # runs on wall time: it only frees the lock of a crashed holder (the memory
        # model's lock never expires), so a test moving a ManualClock must not free it.
        self.workflow_lock = SqlLock(database, statements, clock=system_clock, scope="workflow")
        self._token_triggers = False
        """Whether this adapter made sure the blind index's triggers exist (they are
        created with the first document that holds tokens, and never dropped)."""
        self.cache_events: list[CacheEvent] = []
        """Cache events received, newest last (telemetry only; bounded to 1,000)."""

    def _retention(self, now: int) -> int | None:
        return None if self.checkpoint_ttl_ms is None else at_most(now + self.checkpoint_ttl_ms)

    async def open(self) -> None:
        """Connect and check the schema now, instead of on the first call.

        Raises :class:`~siglo.errors.SchemaVersionError` when the database's schema is
        older (and ``auto_migrate`` is off) or newer than this siglo, and
        :class:`~siglo.errors.StorageAdapterError` when the database cannot be reached.
        """
        await self.database.open()

    async def aclose(self) -> None:
        """Close the connections this adapter's backend opened."""
        try:
            await self.database.aclose()
        finally:
            await super().aclose()

    def storage_exists(self) -> bool:
        """Whether the database is there already, without creating it (an SQLite file
        may not be; a server's database is). The CLI's reading commands refuse to run
        on one that is not, instead of creating an empty file at a mistyped path."""
        return self.database.exists()

    async def schema_version(self) -> int:
        """The schema version of the database (0: no siglo tables yet, or no database
        file: asking never creates one)."""
        if not self.database.exists():
            return 0
        await self.database.connect_unchecked()
        return await read_version(self.database, build_tables(self.table_prefix, self.schema))

    async def migrate(self, *, target: int = SCHEMA_VERSION) -> tuple[int, int]:
        """Apply the migrations up to ``target``; ``(version before, version after)``.

        What ``siglo migrate URL`` runs. Safe to run from several processes at once.
        """
        check_target(target)  # before connecting: a bad target creates no file
        await self.database.connect_unchecked()
        return await migrate(self.database, self.table_prefix, self.schema, target=target)

    # -- checkpoints -------------------------------------------------------------------

    async def _do_save_checkpoint(
        self,
        checkpoint: Checkpoint,
        *,
        expected_revision: int | None = None,
        release: Hold | None = None,
    ) -> None:
        if self._in_parts(checkpoint):
            row, key = await self._row(
                checkpoint, expected_revision, self.clock.now_ms(), tokens=False
            )
            self._note_length(row)
            await self._save_in_parts(checkpoint, row, key, release)
            return
        await self._save_together(checkpoint, (), expected_revision, release, None)

    async def _row(
        self,
        checkpoint: Checkpoint,
        expected_revision: int | None,
        now: int,
        *,
        tokens: bool = True,
    ) -> tuple[dict[str, Any], str]:
        """A save's row and the name of its compare-and-set's statement; ``tokens``:
        whether to make sure of the token triggers if the document holds tokens (a save
        in parts looks in the skeleton it stores instead, :meth:`_save_in_parts`)."""
        row = checkpoint_row(checkpoint, self._retention(now), now)
        row["expected"] = expected_revision
        if tokens and not self._token_triggers and holds_token_marker(row["document"]):
            await self._need_token_triggers()
        if expected_revision is None:
            return row, "cp_save_forward"
        if expected_revision == 0:
            return row, "cp_insert_if_absent"
        return row, "cp_update_expected"

    async def _save_together(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        expected_revision: int | None,
        release: Hold | None,
        entry: CacheEntry | None,
    ) -> None:
        """A whole checkpoint's compare-and-set, with the context ``changes``, a cache
        ``entry`` and the ``release`` of the action's workflow lock, in one transaction:
        one statement alone; several, one round trip on PostgreSQL (pipeline mode), one
        ``BEGIN IMMEDIATE … COMMIT`` on SQLite's writer (no hop to a thread). The
        transaction commits whatever the compare-and-set decides: the changes and the
        entry are stored either way (contract rules ``context.streamed-save``,
        ``cache.with-checkpoint``), a refused one is raised after it. A failure of any
        statement writes none of them; the lock is then released as usual, when the
        action ends."""
        now = self.clock.now_ms()
        s = self._s
        row, key = await self._row(checkpoint, expected_revision, now)
        self._note_length(row)
        # The checkpoint's row first, then the context rows, the cache entry's and the
        # lock's: the order PostgreSQL takes them in for WITH ctx AS (…) UPDATE (the
        # main statement's row, then the CTE's), so that two concurrent saves of a stack
        # never wait for each other's rows in opposite orders (a deadlock).
        if s.cp_streamed is not None and len(changes) == 1 and self._streams_in_one(changes[0]):
            # PostgreSQL: WITH ctx AS (INSERT … change) INSERT/UPDATE … checkpoint.
            params = self._context_row(check_context_change(changes[0]), now)
            prefixed = {f"ctx_{name}": value for name, value in params.items()}
            writes: list[tuple[str, Params]] = [(s.cp_streamed[key], {**row, **prefixed})]
        else:
            writes = [(getattr(s, key), row)]
            for change in changes:
                writes.extend(self._context_writes(check_context_change(change), now))
        if entry is not None:
            writes.append(self._cache_write(namespaced_key(entry.key, entry.namespace), entry))
        if release is not None:
            lease = release.lease
            writes.append(self.workflow_lock.release_statement(lease.key, lease.token))
        if len(writes) == 1:
            rows = await self.database.write(*writes[0])
        else:
            rows = (await self._write_all(writes))[0]
            if release is not None:
                release.released = True
        if not rows:
            found = await self.database.read(s.cp_current_revision, row)
            raise CheckpointConflictError(
                checkpoint.stack_id,
                found[0][0] if found else None,
                expected_revision,
                checkpoint.revision,
            )

    def _streams_in_one(self, change: ContextChangeEvent) -> bool:
        """Whether ``change`` goes in the checkpoint's statement (``cp_streamed``): a set,
        without a retention (whose stream writes are three statements)."""
        return change.op == "set" and self.checkpoint_ttl_ms is None

    async def _write_all(self, writes: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """``writes`` in order, in one transaction that commits unless one fails; the rows
        of each. Sent together where the database can (PostgreSQL), else as a plan
        (SQLite: run at once on the writer, on the loop's thread)."""
        if self.database.sends_together:
            return await self.database.fetch_all(writes)
        results: list[list[Row]] = []

        def plan() -> Plan:
            for write in writes:
                results.append((yield write))

        await self.database.run_plan(plan())
        return results

    async def _need_token_triggers(self) -> None:
        """Make sure the triggers that keep ``checkpoint_tokens`` in step exist, before
        the first save of this adapter whose document holds blind-index tokens.

        Every save path (plain, streamed, unlocking, in parts, ``siglo import``) comes
        through :meth:`_do_save_checkpoint`, which asks when the bytes it stores in the
        document column hold the marker (the document, or a save in parts' skeleton: a
        search of bytes it has anyway, :func:`holds_token_marker`). A
        store that never held a token has no triggers, so its writes cost what they did
        before schema 7. Cancel rewrites a stored document with the same metadata: if
        it holds tokens, they were saved by one of these paths or by migration 7,
        which made the triggers.

        A role that may not create triggers on the checkpoints table (PostgreSQL: not
        its owner, no ``TRIGGER`` privilege) gets :class:`StorageAdapterError` naming
        the remedy, and the save is not made: ``siglo migrate`` with the settings that
        name ``blind_index_fields``, run as the owner, creates them ahead
        (:meth:`create_token_triggers`)."""
        try:
            await ensure_token_triggers(self.database, self.table_prefix, self.schema)
        except StorageAdapterError as error:
            if not _refused_privilege(error):
                raise
            table = f"{self.schema + '.' if self.schema else ''}{self.table_prefix}checkpoints"
            raise StorageAdapterError(
                f"this save is the store's first with blind-index tokens, which needs the "
                f"triggers that keep its token index on {table}, and this role may not "
                f"create them ({error}): run `siglo migrate URL` with the settings that "
                "name blind_index_fields as a role that may (the table's owner), or grant "
                "this role TRIGGER on the table; nothing was saved"
            ) from error
        self._token_triggers = True

    async def create_token_triggers(self) -> None:
        """Create the triggers that keep the blind-index token table in step, if they
        are not there (``siglo migrate`` does, when the settings name
        ``blind_index_fields``), so that a role that may not create triggers can save
        tokens. Safe to run from several processes at once."""
        await self.database.connect_unchecked()
        await ensure_token_triggers(self.database, self.table_prefix, self.schema)
        self._token_triggers = True

    def _in_parts(self, checkpoint: Checkpoint) -> bool:
        """Whether ``checkpoint`` is saved incrementally: its document is large enough,
        and on SQLite its row does not keep its length (:class:`SameLengthRows`)."""
        least = self.incremental_min_bytes
        length = len(checkpoint.to_json())
        if least is None or length < least:
            return False
        rows = self._same_length
        return rows is None or not rows.whole(
            row_id(checkpoint.namespace or "", checkpoint.stack_id), length
        )

    def _note_length(self, row: dict[str, Any]) -> None:
        """SQLite: note the save of ``row`` for :class:`SameLengthRows` (a document long
        enough to be saved in parts; a shorter one is always whole)."""
        rows, least = self._same_length, self.incremental_min_bytes
        if rows is not None and least is not None and len(row["document"]) >= least:
            rows.saved(row["id"], len(row["document"]))

    async def _save_in_parts(
        self, checkpoint: Checkpoint, row: dict[str, Any], save: str, release: Hold | None
    ) -> None:
        """The compare-and-set of the row (its skeleton and parts list; ``save`` names its
        statement) and the writes of the contexts that changed, in one transaction
        (siglo_sql.parts).

        Where the dialect allows it (PostgreSQL) and this adapter wrote the version of the
        row the save replaces (:attr:`_versions`), that is one statement
        (``cp_update_parts``): one round trip instead of a transaction of five or more.
        Refused (another writer, an unknown version, a conflict), the save is made as
        before, reading what is stored."""
        cut = split(checkpoint, row["id"], self._bodies)
        # The token triggers read the document column, here the skeleton, which holds
        # the metadata: the contexts' bytes (most of a large document) need no scan.
        if not self._token_triggers and holds_token_marker(cut.skeleton):
            await self._need_token_triggers()
        row["document"] = cut.skeleton
        row["parts"] = cut.parts
        key = row["id"]
        s = self._s
        known = None
        if s.cp_update_parts is not None and save == "cp_update_expected":
            known = self._forget(key)
        if known is not None and release is None:
            rows = await self.database.write(*self._known_save(row, cut, *known))
            if rows:
                self._remember(key, rows[0][0], frozenset(cut.bodies))
                return
            known = None  # refused: the save made the long way says why
        try:
            await self.database.run_plan(
                self._parts_plan(checkpoint, row, save, cut, release, known)
            )
        except CheckpointConflictError:
            self._forget(key)
            raise
        if release is not None:
            release.released = True

    def _known_save(
        self, row: dict[str, Any], cut: Split, version: str, stored: frozenset[bytes]
    ) -> tuple[str, dict[str, Any]]:
        """``cp_update_parts`` and its parameters: ``row``, the version it replaces, the
        bodies of the digests ``stored`` lacks and the digests ``cut`` no longer names."""
        new = [d for d in cut.bodies if d not in stored]
        sql = self._template("cp_update_parts", len(new))
        params = {**row, "version": version, "dropped": [d for d in stored if d not in cut.bodies]}
        for i, digest in enumerate(new):
            params[f"digest{i}"] = digest
            params[f"body{i}"] = cut.bodies[digest]
        return sql, params

    def _template(self, name: str, n: int) -> str:
        """The statement template ``name`` completed for ``n`` rows and converted (once
        per ``name`` and ``n``)."""
        sql = self._templates.get((name, n))
        if sql is None:
            text: str | None = getattr(self._s, name)
            assert text is not None
            if name == "cp_update_parts":
                text = text.format(bodies=new_bodies(n))
            elif name == "parts_insert":
                text = text.format(rows=part_rows(n))
            else:
                text = text.format(digests=gone_digests(n))
            sql = self._templates[(name, n)] = self.database.sql(text)
        return sql

    def _remember(self, key: bytes, version: str | None, digests: frozenset[bytes]) -> None:
        """Note that the row ``key`` at ``version`` stores the parts named ``digests``."""
        if version is None:  # SQLite: no versions, nothing to remember
            return
        self._forget(key)  # the newest last
        self._versions[key] = (version, digests)
        self._versions_size += len(digests) + 1
        while self._versions_size > _VERSION_DIGESTS:
            self._forget(next(iter(self._versions)))

    def _forget(self, key: bytes) -> tuple[str, frozenset[bytes]] | None:
        """Drop what :attr:`_versions` knows of row ``key``; what it knew."""
        known = self._versions.pop(key, None)
        if known is not None:
            self._versions_size -= len(known[1]) + 1
        return known

    def _parts_plan(
        self,
        checkpoint: Checkpoint,
        row: dict[str, Any],
        save: str,
        cut: Split,
        release: Hold | None,
        known: tuple[str, frozenset[bytes]] | None = None,
    ) -> Plan:
        key = row["id"]
        s = self._s
        saved = False
        if known is not None and s.cp_update_parts is not None:
            # The one statement first, in this transaction (with the lock's release after
            # it); refused, it changed nothing and the save continues as below.
            found = yield self._known_save(row, cut, *known)
            if found:
                saved = True
                self._remember(key, found[0][0], frozenset(cut.bodies))
        if not saved:
            version = None
            if s.cp_parts_saves is not None:
                # SQLite: the compare-and-set answers the digests stored (its RETURNING
                # reads them in the write transaction, which no other writer can enter).
                # The short BLOBs as bytearray: sqlite3 binds one as the BLOB it binds
                # for bytes, but looks for an adapter of bytes first, a failed attribute
                # lookup that formats an AttributeError (0.5 us a parameter).
                short = {"id": key, "document": cut.skeleton, "parts": cut.parts}
                found = yield (
                    s.cp_parts_saves[save],
                    {**row, **{k: bytearray(v) for k, v in short.items()}},
                )
                stored_hex = found[0][0] if found else None
            else:
                found = yield getattr(s, save), row
            if not found:
                found = yield s.cp_current_revision, row
                raise CheckpointConflictError(
                    checkpoint.stack_id,
                    found[0][0] if found else None,
                    row["expected"],
                    checkpoint.revision,
                )
            if s.cp_parts_saves is not None:
                packed = bytes.fromhex(stored_hex or "")
                stored = {
                    packed[at : at + DIGEST_BYTES] for at in range(0, len(packed), DIGEST_BYTES)
                }
            else:
                # Read after the compare-and-set, which holds the row: what is stored now
                # is what this save replaces, whoever wrote it (in a statement of its
                # own: PostgreSQL's RETURNING would read the statement's snapshot, older
                # than a save it waited for).
                read = yield s.parts_digests, {"id": key}
                stored = {bytes(r[0]) for r in read if r[0] is not None}
                version = read[0][1] if read else None
            new = [d for d in cut.bodies if d not in stored]
            gone = [d for d in stored if d not in cut.bodies]
            if s.parts_replace is not None and cut.replaces and gone:
                new, gone = yield from self._replace_parts(key, cut, new, gone)
            # One statement for the new bodies and one for the dropped ones (each a few
            # hundred at most): a statement each cost SQLite 5-7 us, PostgreSQL a round
            # trip.
            for at in range(0, len(new), _PER_STATEMENT):
                chunk = new[at : at + _PER_STATEMENT]
                params: dict[str, Any] = {"id": key}
                for i, digest in enumerate(chunk):
                    params[f"digest{i}"] = digest
                    params[f"body{i}"] = cut.bodies[digest]
                yield self._template("parts_insert", len(chunk)), params
            for at in range(0, len(gone), _PER_STATEMENT):
                chunk = gone[at : at + _PER_STATEMENT]
                params = {"id": key, **{f"gone{i}": d for i, d in enumerate(chunk)}}
                yield self._template("parts_delete", len(chunk)), params
            if version is not None:  # PostgreSQL (SQLite has no versions to remember)
                self._remember(key, version, frozenset(cut.bodies))
        if release is not None:
            lease = release.lease
            yield self.workflow_lock.release_statement(lease.key, lease.token)

    def _replace_parts(
        self, key: bytes, cut: Split, new: list[bytes], gone: list[bytes]
    ) -> Generator[tuple[str, Params], list[Row], tuple[list[bytes], list[bytes]]]:
        """SQLite: each new body of at least :data:`_REPLACE_MIN_BYTES` that is as long
        as the body its step had (:attr:`Split.replaces`), written over that body's row
        when this save drops it (``parts_replace``: SQLite then rewrites only the pages
        whose bytes changed); the digests still to insert and to delete. ``gone`` are
        digests stored, read in this write transaction, so each row written over is
        there, once: a digest written over leaves ``dropped``."""
        sql = self._s.parts_replace
        assert sql is not None
        dropped = set(gone)
        left: list[bytes] = []
        row = bytearray(key)
        for digest in new:
            old = cut.replaces.get(digest)
            body = cut.bodies[digest]
            if old is not None and old in dropped and len(body) >= _REPLACE_MIN_BYTES:
                # The short BLOBs as bytearray, as in _parts_plan.
                params: dict[str, Any] = {"id": row, "body": body}
                params.update(old=bytearray(old), digest=bytearray(digest))
                yield sql, params
                dropped.discard(old)
                continue
            left.append(digest)
        return left, [d for d in gone if d in dropped]

    async def _whole(self, key: bytes, document: bytes, parts: bytes | None) -> Checkpoint | None:
        """The checkpoint of a row read as ``(document, parts)``: assembled from its parts
        when it was saved in parts, the row read again if a save replaced them meanwhile."""
        for _ in range(_PART_READS):
            if parts is None:
                return Checkpoint.from_json(document)
            rows = await self.database.read(self._s.parts_get, {"id": key})
            data = assemble(document, parts, {bytes(d): bytes(b) for d, b in rows})
            if data is not None:
                return Checkpoint.from_json(data)
            found = await self.database.read(
                self._s.cp_get, {"id": key, "now": self.clock.now_ms()}
            )
            if not found:
                return None
            read = _document(found[0])
            if read == (document, parts):
                # Not a save meanwhile (it would have changed the row): a part the row
                # lists is not stored (deleted by hand, a partial restore).
                raise MalformedRecordError("checkpoint", "parts", "lists a part that is not stored")
            document, parts = read
        raise StorageAdapterError(
            f"the checkpoint changed under {_PART_READS} reads of its parts; try again"
        )

    async def save_checkpoint_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        *,
        expected_revision: int | None = None,
    ) -> None:
        """The context changes and the checkpoint in one transaction (PostgreSQL: one
        set in the checkpoint's statement, ``WITH ctx AS (INSERT …) INSERT/UPDATE …``;
        more in one pipeline call; SQLite: one ``BEGIN IMMEDIATE … COMMIT``): they land
        together or not at all, and the changes land even when the checkpoint's
        compare-and-set is refused, as when the two are sent apart. A checkpoint saved
        in parts, or a subclass with its own writes, gets the two calls in order.
        """
        await self._save_streamed(checkpoint, changes, expected_revision, None)

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        """:meth:`save_checkpoint_streamed`, with the release of the stack's workflow
        lock this task holds in the same transaction: one commit (on PostgreSQL one
        round trip)."""
        await self._save_streamed(checkpoint, changes, expected_revision, self._hold(checkpoint))

    async def save_checkpoint_caching(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        entry: CacheEntry,
        *,
        expected_revision: int | None = None,
        unlock: bool = False,
    ) -> None:
        """The context changes, the cache entry, the checkpoint's compare-and-set and
        (``unlock``) the workflow lock's release in one transaction (PostgreSQL: one
        round trip; SQLite: one ``BEGIN IMMEDIATE … COMMIT`` on the loop's thread),
        committed whatever the compare-and-set decides. A checkpoint saved in parts, or a
        subclass with its own writes, gets the writes apart
        (:meth:`StorageAdapter.save_checkpoint_caching`)."""
        hold = self._hold(checkpoint) if unlock else None
        await self._save_step(checkpoint, changes, expected_revision, hold, entry)

    def _hold(self, checkpoint: Checkpoint) -> Hold | None:
        """This task's hold of the stack's workflow lock, if it is not released yet."""
        return held(
            self.workflow_lock, workflow_lock_key(checkpoint.stack_id, checkpoint.namespace)
        )

    async def _save_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        expected_revision: int | None,
        release: Hold | None,
    ) -> None:
        await self._save_step(checkpoint, changes, expected_revision, release, None)

    async def _save_step(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        expected_revision: int | None,
        release: Hold | None,
        entry: CacheEntry | None,
    ) -> None:
        together = self._own_writes() and (entry is None or self._own_cache())
        if together and (changes or entry is not None) and self._in_parts(checkpoint):
            # Saved in parts: a transaction of its own, after the change and the entry
            # (as the base class sends them). The size guard runs first there too.
            together = False
        if not together:
            if entry is None:
                await super().save_checkpoint_streamed(
                    checkpoint, changes, expected_revision=expected_revision
                )
            else:
                await super().save_checkpoint_caching(
                    checkpoint, changes, entry, expected_revision=expected_revision
                )
            return
        check_save_arguments(checkpoint, expected_revision)
        if entry is not None:
            entry.checked()
        check_document_size(checkpoint, self.max_document_bytes)
        self._require_open()
        if not changes and entry is None:
            # In parts, its own plan (with the release); else the statement alone.
            await self._do_save_checkpoint(
                checkpoint, expected_revision=expected_revision, release=release
            )
            return
        await self._save_together(checkpoint, changes, expected_revision, release, entry)

    def writes_with_checkpoint(self, changes: Sequence[ContextChangeEvent]) -> bool:
        """Any changes, by this class's own writes (one transaction with the checkpoint;
        in parts, the changes first, then the save)."""
        return self._own_writes()

    def _own_cache(self) -> bool:
        """Whether caching is this class's own (else the entry is written apart)."""
        cls = type(self)
        return (
            cls._do_set_cached_step is SqlStorageAdapter._do_set_cached_step
            and cls.set_cached_step is StorageAdapter.set_cached_step
            and "set_cached_step" not in vars(self)
            and "_do_set_cached_step" not in vars(self)
        )

    def _own_writes(self) -> bool:
        """Whether saving and streaming are this class's own: a subclass or an instance
        that replaces either (a wrapper, a test's recorder) gets the two calls."""
        cls = type(self)
        return (
            cls._do_save_checkpoint is SqlStorageAdapter._do_save_checkpoint
            and cls._do_on_context_change is SqlStorageAdapter._do_on_context_change
            and cls.save_checkpoint is StorageAdapter.save_checkpoint
            and cls.on_context_change is StorageAdapter.on_context_change
            and not _WRITES & vars(self).keys()
        )

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        if namespace is not None and fallback:
            own = row_id(namespace, stack_id)
            for _ in range(_PART_READS):
                rows = await self.database.read(
                    self._s.cp_get_fallback,
                    {"id": own, "fallback_id": row_id("", stack_id), "now": self.clock.now_ms()},
                )
                if not rows:
                    return None
                found = rows[0]
                if found[1] is None:  # stored whole: no further read
                    return Checkpoint.from_json(bytes(found[0]))
                # Stored in parts: the row found is read as a load of it reads it, with
                # its parts in one snapshot. Its parts read after it in a statement of
                # their own met saves and deletions between the two: a row deleted
                # meanwhile answered "no checkpoint" though the un-namespaced one was
                # there throughout, and one deleted and saved again as it was, "a part
                # is not stored" (two black-box auditors).
                whole = await self._do_get_checkpoint(
                    stack_id, namespace if bytes(found[2]) == own else None, fallback=False
                )
                if whole is not None:
                    return whole
                # Deleted meanwhile: the fallback decides again, and finds the
                # un-namespaced row if it is the one left.
            raise StorageAdapterError(
                f"the checkpoint of {stack_id!r} changed under {_PART_READS} reads; try again"
            )
        key = row_id(namespace or "", stack_id)
        if self._bodies.holds(key):
            # A row this adapter saved or loaded in parts: its bodies are likely the ones
            # kept from then, so the row alone is read (its skeleton, parts list and
            # version: a few hundred bytes) and the document assembled from the bodies
            # kept whose digests it names. A digest names its body, so a body another
            # writer replaced is never served: the row names another digest, and the
            # bodies are read. Reading 16 bodies of 16 KB took longer than parsing the
            # document they make (issue 34).
            rows = await self.database.read(
                self._s.cp_get_version, {"id": key, "now": self.clock.now_ms()}
            )
            if not rows:
                return None
            document, parts = _document(rows[0])
            if parts is None:  # stored whole
                return Checkpoint.from_json(document)
            version = rows[0][2]
            if version is None:  # SQLite: no version to remember
                data = self._bodies.document(key, document, parts)
                if data is not None:
                    return Checkpoint.from_json(data)
            kept, missing = self._bodies.partial(key, parts)
            if missing and len(missing) <= _PER_STATEMENT:
                # Another writer changed some contexts since: their bodies alone are
                # read (a row of checkpoint_parts holds the body its digest names; one a
                # later save dropped is missing, and the row and its bodies are read
                # together below).
                params: dict[str, Any] = {"id": key}
                params.update((f"gone{i}", d) for i, d in enumerate(missing))
                read = await self.database.read(self._template("parts_some", len(missing)), params)
                got_some = {bytes(d): bytes(b) for d, b in read}
                self._bodies.keep(key, parts, got_some)
                kept.update(got_some)
            data = assemble(document, parts, kept)
            if data is not None:
                # PostgreSQL: the version read and the digests its row names are what
                # a save of it replaces (a save stores exactly the bodies its row
                # names), so that save can be one statement.
                if version is not None:
                    self._remember(key, version, frozenset(kept))
                return Checkpoint.from_json(data)
            # A body dropped since: the row and its bodies are read together.
        if self._cp_reads is not None:
            got = await self._cp_reads.get_row(key)
        else:
            rows = await self.database.read(
                self._s.cp_load, {"id": key, "now": self.clock.now_ms()}
            )
            got = _with_bodies([tuple(r) for r in rows]) if rows else None
        if got is None:
            return None
        if got[1] is None:  # stored whole: no further read
            return Checkpoint.from_json(stored_bytes(got[0]))
        # The row and its parts came in one statement: one snapshot, so every part the
        # row names is there (else the read starts again, as a two-statement read would).
        parts = stored_bytes(got[1], "parts")
        # Its bodies kept as the document is assembled: a save of the loaded checkpoint
        # with one context changed hashes that one alone (16 contexts of 16 KB: 16
        # SHA-256 of 9 us each otherwise), and the next load here reads the row alone.
        data = self._bodies.assemble(key, stored_bytes(got[0]), parts, got[2])
        if data is not None:
            # Every part the row names came with it, and no others (one snapshot): the
            # version read and these digests are what a save of it replaces.
            if got[3] is not None:  # SQLite has no versions to remember
                self._remember(key, got[3], frozenset(got[2]))
            return Checkpoint.from_json(data)
        return await self._whole(key, *_document(got))

    async def _clean(self, sql: str) -> int:
        params = {"now": self.clock.now_ms(), "limit": self.clean_batch_size}
        total = 0
        while True:
            rows = await self.database.fetch(sql, params)
            total += len(rows)
            if len(rows) < self.clean_batch_size:
                return total

    async def _do_clean_expired_checkpoints(self) -> int:
        """Delete expired checkpoints in batches of ``clean_batch_size``; how many went."""
        return await self._clean(self._s.cp_clean_batch)

    async def clean_expired(self) -> dict[str, int]:
        """Delete expired rows of every table (checkpoints, wait records, step cache,
        context streams, idempotency keys, nonces; expired locks are freed, their rows
        kept for the fencing counter). Returns the count per table."""
        self._require_open()
        s = self._s
        return {
            "checkpoints": await self._clean(s.cp_clean_batch),
            "wait_records": await self._clean(s.wait_clean_batch),
            "step_cache": await self._clean(s.cache_clean_batch),
            "context_changes": await self._clean(s.ctx_clean_batch),
            "idempotency_keys": await self._clean(s.idem_clean_batch),
            "locks": await self._clean(s.lock_clean_batch),
            "nonces": await self._clean(s.nonce_clean_batch),
        }

    # -- operating what is stored -----------------------------------------------------

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        db = self.database
        where, params = page_conditions(query, db.dialect_name)
        sql = self._cp_list.get(where)
        if sql is None:  # a shape of conditions not seen yet: converted once
            sql = self._cp_list[where] = db.sql(self._s.cp_list.format(where=where))
        # One row more than the page tells whether another page follows.
        params.update(now=self.clock.now_ms(), limit=query.limit + 1)
        rows = await db.fetch(sql, params)
        page = rows[: query.limit]
        more = len(rows) > query.limit
        return CheckpointPage([summary_of(r) for r in page], cursor_of(page[-1]) if more else None)

    async def _do_list_by_index(self, query: ListQuery, tokens: dict[str, str]) -> CheckpointPage:
        db = self.database
        where, params = page_conditions(query, db.dialect_name, table="c", keyset="t0.id")
        shape = f"{len(tokens)}:{where}"
        sql = self._cp_list_indexed.get(shape)
        if sql is None:  # a shape not seen yet: completed and converted once
            tables = build_tables(self.table_prefix, self.schema)
            assert tables.checkpoint_tokens is not None
            name = db.sa_dialect.identifier_preparer.format_table
            text = indexed_list(
                name(tables.checkpoints),
                name(tables.checkpoint_tokens),
                len(tokens),
                where,
                LIVE.replace("gone_at", "c.gone_at"),
            )
            sql = self._cp_list_indexed[shape] = db.sql(text)
        for i, (field, token) in enumerate(sorted(tokens.items())):
            # A NUL as the triggers index it (U+FFFD): found, where PostgreSQL would
            # refuse the parameter and SQLite match nothing.
            params[f"field{i}"] = indexed_text(field)
            params[f"token{i}"] = indexed_text(token)
        params.update(now=self.clock.now_ms(), limit=query.limit + 1)
        rows = await db.fetch(sql, params)
        page = rows[: query.limit]
        more = len(rows) > query.limit
        return CheckpointPage([summary_of(r) for r in page], cursor_of(page[-1]) if more else None)

    async def _do_delete_checkpoint(
        self, stack_id: str, namespace: str | None, expected_revision: int | None
    ) -> bool:
        db = self.database
        s = self._s
        ns = namespace or ""
        key = row_id(ns, stack_id)
        now = self.clock.now_ms()
        # One transaction: the checkpoint, its wait records and its context streams go
        # together, or (a refused compare-and-set) nothing does.
        rest: list[tuple[str, Params]] = [
            (s.wait_delete_stack, {"stack_ref": key}),
            (s.wait_latest_delete_orphan, {"latest_id": wait_id(namespace, stack_id)}),
            (
                s.ctx_delete_stack,
                {"stack_id_prefix": stack_id[:ID_PREFIX], "stack_id": stack_id, "namespace": ns},
            ),
        ]
        if expected_revision is None:
            # Nothing to decide: sent together (one round trip on PostgreSQL).
            rows = (await db.fetch_all([(s.cp_delete, {"id": key}), *rest]))[0]
            return any(gone_at is None or gone_at > now for (gone_at,) in rows)
        async with db.transaction() as tx:
            expected = {"id": key, "expected": expected_revision, "now": now}
            rows = await tx.fetch(s.cp_delete_expected, expected)
            if not rows:
                found = await tx.fetch(s.cp_current_revision, {"id": key, "now": now})
                raise CheckpointConflictError(
                    stack_id, found[0][0] if found else None, expected_revision
                )
            for sql, params in rest:
                await tx.fetch(sql, params)
        return any(gone_at is None or gone_at > now for (gone_at,) in rows)

    async def _do_list_due_waits(self, limit: int) -> list[WaitRecord]:
        now = self.clock.now_ms()
        ask = limit
        while True:
            rows = await self.database.fetch(self._s.wait_due, {"now": now, "limit": ask})
            due: list[WaitRecord] = []
            unreadable: list[Exception] = []
            for row in rows:
                try:
                    due.append(due_wait_from_row(row))
                except UNREADABLE as exc:
                    unreadable.append(exc)
            # A record that cannot be read is left out (siglo.unreadable); it comes first
            # again at the next pass, so the page asks for as many more, not to fall
            # short of ``limit`` while other waits are due.
            if len(due) >= limit or len(rows) < ask:
                break
            ask = limit + len(unreadable)
        for error in unreadable:
            report_unreadable(error)
        return due[:limit]

    # -- wait records --------------------------------------------------------------------

    async def _do_save_wait_record(self, record: WaitRecord, *, ttl_ms: int | None = None) -> None:
        now = self.clock.now_ms()
        gone_at = at_most(now + ttl_ms) if ttl_ms is not None else self._retention(now)
        db = self.database
        params = wait_row(record, gone_at)
        s = self._s
        if s.wait_save_one is not None:
            await db.fetch(s.wait_save_one, params)
            return
        await db.fetch_all([(s.wait_upsert, params), (s.wait_latest_upsert, params)])

    async def _do_create_wait_record(self, record: WaitRecord, *, ttl_ms: int | None) -> bool:
        now = self.clock.now_ms()
        gone_at = at_most(now + ttl_ms) if ttl_ms is not None else self._retention(now)
        params = {**wait_row(record, gone_at), "now": now}
        s = self._s
        # One transaction: the by-stack index names the record only if it was written.
        async with self.database.transaction() as tx:
            if not await tx.fetch(s.wait_create, params):
                return False
            await tx.fetch(s.wait_latest_upsert, params)
        return True

    async def _do_get_wait_record(
        self, correlation_key_or_stack_id: str, namespace: str | None = None
    ) -> WaitRecord | None:
        key = correlation_key_or_stack_id
        now = self.clock.now_ms()
        rows = await self.database.read(
            self._s.wait_get,
            {
                "id": wait_id(namespace, key),
                "checkpoint_id": row_id(namespace or "", key),
                "now": now,
            },
        )
        if not rows:
            return None
        row = rows[0]
        if row[0] != 3:
            try:
                return wait_from_row(row[1:])
            except MalformedRecordError as exc:
                raise await self._wait_named(exc, row[0], key, namespace) from exc
        # Seed 001 §5: last, a wait record kept in the checkpoint's metadata.
        checkpoint = Checkpoint.from_json(stored_bytes(row[1]))
        return embedded_wait_record(checkpoint.metadata)

    async def _wait_named(
        self, exc: MalformedRecordError, kind: int, key: str, namespace: str | None
    ) -> MalformedRecordError:
        """``exc`` naming the record ``wait_get`` read as ``kind`` (its correlation key
        and stack, read beside the document that could not be): which one to look at."""
        named = await self.database.read(self._s.wait_named, {"id": wait_id(namespace, key)})
        for found_kind, correlation_key, stack_id in named:
            if found_kind == kind:
                return naming_wait(exc, correlation_key, namespace, stack_id)
        return naming_wait(exc, key, namespace)

    async def _do_claim_wait_record(
        self,
        correlation_key: str,
        claimant_id: str,
        *,
        allow_expired: bool = False,
        event_payload: Any = MISSING,
        lease_ms: int | None = None,
        namespace: str | None = None,
    ) -> WaitRecord | None:
        payload = (
            None if event_payload is MISSING else codec.dumps(event_payload, what="event_payload")
        )
        now = self.clock.now_ms()
        lease = now + (lease_ms or self.claim_lease_ms)
        rows = await self.database.write(
            self._s.wait_claim,
            {
                "id": wait_id(namespace, correlation_key),
                "claimant_id": claimant_id,
                "lease_expires_at": lease,
                "event_payload": payload,
                "allow_expired": bool(allow_expired),
                "now": now,
            },
        )
        return wait_from_row(rows[0]) if rows else None

    async def _do_complete_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> None:
        db = self.database
        now = self.clock.now_ms()
        key = wait_id(namespace, correlation_key)
        rows = await db.write(
            self._s.wait_complete, {"id": key, "claimant_id": claimant_id, "now": now}
        )
        if rows:
            return
        state = await db.read(self._s.wait_state, {"id": key, "now": now})
        if not state:
            raise WaitRecordClaimError(f"no wait record with correlation key {correlation_key!r}")
        if state[0][0] != "claimed":
            raise WaitRecordClaimError(
                f"wait record {correlation_key!r} is {state[0][0]}, not claimed"
            )
        raise WaitRecordClaimError(
            f"wait record {correlation_key!r} is claimed by another claimant"
        )

    async def _do_release_wait_record(
        self, correlation_key: str, claimant_id: str, namespace: str | None = None
    ) -> bool:
        db = self.database
        rows = await db.write(
            self._s.wait_release,
            {
                "id": wait_id(namespace, correlation_key),
                "claimant_id": claimant_id,
                "now": self.clock.now_ms(),
            },
        )
        return bool(rows)

    async def _do_cancel_wait_record(
        self, correlation_key: str, namespace: str | None = None
    ) -> bool:
        db = self.database
        rows = await db.write(
            self._s.wait_cancel,
            {"id": wait_id(namespace, correlation_key), "now": self.clock.now_ms()},
        )
        return bool(rows)

    async def _do_cancel_workflow(self, stack_id: str, namespace: str | None = None) -> None:
        db = self.database
        ns = namespace or ""
        now = self.clock.now_ms()
        key = row_id(ns, stack_id)
        async with db.transaction() as tx:
            # The checkpoint's row first, then its waits': the order a deletion of the
            # stack locks them in (the other order deadlocked with a deletion on
            # PostgreSQL, a black-box auditor's cancel and delete from two tabs).
            rows = await tx.fetch(self._s.cp_get_for_cancel, {"id": key, "now": now})
            await tx.fetch(self._s.wait_cancel_stack, {"stack_ref": key, "now": now})
            if not rows:
                return
            checkpoint = Checkpoint.from_json(stored_bytes(rows[0][0]))
            if checkpoint.status in TERMINAL_STATUSES:
                return
            cancelled = checkpoint.replace(
                status="cancelled", revision=checkpoint.revision + 1, timestamp=now
            )
            await tx.fetch(
                self._s.cp_set_cancelled,
                {
                    "id": key,
                    "revision": cancelled.revision,
                    "document": cancelled.to_json(),
                    "updated_at": now,
                },
            )

    # -- step cache ------------------------------------------------------------------------

    async def _do_get_cached_step(self, key: str) -> Any | Missing:
        rows = await self.database.read(
            self._s.cache_get, {"id": row_id(key), "now": self.clock.now_ms()}
        )
        if not rows:
            return MISSING
        return codec.loads(rows[0][0], what="cached step")

    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        await self.database.write(*self._cache_write(key, CacheEntry(key, value, ttl_ms)))

    def _cache_write(self, key: str, entry: CacheEntry) -> tuple[str, Params]:
        """The statement that stores ``entry`` under ``key`` (namespaced already)."""
        data = codec.dumps_of(entry.value, "cached value of", key)
        gone_at = at_most(self.clock.now_ms() + (entry.ttl_ms or self.cache_ttl_ms))
        return self._s.cache_set, {"id": row_id(key), "key": key, "gone_at": gone_at, "value": data}

    # -- stored payloads -----------------------------------------------------------------------

    _SCAN_PAGE = 500

    async def _do_scan_payloads(self, kind: PayloadKind) -> AsyncIterator[StoredPayload]:
        s = self._s
        after = b""
        scan = {"wait": s.wait_scan, CONTEXT_KIND: s.ctx_scan}.get(kind, s.cache_scan)
        while True:
            params = {"after": after, "now": self.clock.now_ms(), "limit": self._SCAN_PAGE}
            rows = await self.database.fetch(scan, params)
            for row in rows:
                if kind == CONTEXT_KIND:
                    _, namespace, stack_id, step_id, name, data = row
                    data = bytes(data)
                    value = codec.loads(data, what="context value")
                    if value is None:  # not a payload: nothing to seal (as a wait's None)
                        continue
                    yield StoredPayload(
                        CONTEXT_KIND,
                        stack_id,
                        namespace or None,  # stored "" for none (a namespace is never "")
                        {context_field(step_id, name): value},
                        (bytes(row[0]), data),
                    )
                elif kind == "wait":
                    document = bytes(row[1])
                    payload = None if row[2] is None else bytes(row[2])
                    record = WaitRecord.from_json(document)
                    if payload is not None:
                        record = record.replace(
                            event_payload=codec.loads(payload, what="event payload")
                        )
                    fields = wait_fields(record)
                    if fields:
                        token = (bytes(row[0]), document, payload)
                        yield StoredPayload(
                            "wait", record.correlation_key, record.namespace, fields, token
                        )
                else:
                    value = bytes(row[2])
                    yield StoredPayload(
                        "step",
                        row[1],
                        None,
                        {"value": codec.loads(value, what="cached step")},
                        (bytes(row[0]), value),
                    )
            if len(rows) < self._SCAN_PAGE:
                return
            after = bytes(rows[-1][0])

    async def _do_swap_payload(self, item: StoredPayload, fields: dict[str, Any]) -> bool:
        now = self.clock.now_ms()
        if item.kind == "wait":
            row, document, payload = item.token
            record = with_wait_fields(WaitRecord.from_json(document), fields)
            params: dict[str, Any] = {
                "id": row,
                "document": record.to_json(),
                "event_payload": codec.dumps(record.event_payload, what="event_payload"),
                "old_document": document,
                "old_payload": payload,
                "old_null": 1 if payload is None else 0,
                "now": now,
            }
            return bool(await self.database.write(self._s.wait_swap, params))
        if item.kind == CONTEXT_KIND:
            row, data = item.token
            (value,) = fields.values()
            params = {
                "id": row,
                "value": codec.dumps(value, what="context value"),
                "old_value": data,
                "now": now,
            }
            return bool(await self.database.write(self._s.ctx_swap, params))
        row, value = item.token
        params = {
            "id": row,
            "value": codec.dumps(fields["value"], what=f"cached value of {item.key!r}"),
            "old_value": value,
            "now": now,
        }
        return bool(await self.database.write(self._s.cache_swap, params))

    async def _do_delete_payload(self, item: StoredPayload) -> bool:
        now = self.clock.now_ms()
        if item.kind == "wait":
            row, document, payload = item.token
            params: dict[str, Any] = {
                "id": row,
                "old_document": document,
                "old_payload": payload,
                "old_null": 1 if payload is None else 0,
                "now": now,
            }
            if not await self.database.write(self._s.wait_delete_listed, params):
                return False
            # The stack's pointer to its latest record, if that was this one: it holds
            # no payload, but the tenant's stack id goes with its records.
            record = WaitRecord.from_json(document)
            latest = {"latest_id": wait_id(record.namespace, record.stack_id)}
            await self.database.write(self._s.wait_latest_delete_orphan, latest)
            return True
        row, value = item.token
        params = {"id": row, "old_value": value, "now": now}
        return bool(await self.database.write(self._s.cache_delete_listed, params))

    # -- context stream and telemetry ---------------------------------------------------------

    def _context_row(self, event: ContextChangeEvent, now: int) -> dict[str, Any]:
        """The parameters of a context change's statement (``ctx_set`` or ``ctx_delete``)."""
        names = (event.namespace or "", event.stack_id, event.step_id)
        params: dict[str, Any] = {
            "id": row_id(*names, event.key),
            "stream": row_id(*names),
            "gone_at": self._retention(now),
            "now": now,
        }
        if event.op != "delete":
            params.update(
                namespace=names[0],
                stack_id=event.stack_id,
                step_id=event.step_id,
                field=event.key,
                value=codec.dumps_of(event.value, "context value", event.key),
            )
        return params

    def _context_writes(self, event: ContextChangeEvent, now: int) -> list[tuple[str, Params]]:
        """The statements that record a context change."""
        s = self._s
        params = self._context_row(event, now)
        change = s.ctx_delete if event.op == "delete" else s.ctx_set
        if self.checkpoint_ttl_ms is None:
            return [(change, params)]
        # A stream lives as long as its latest event keeps it: an expired stream starts
        # empty, and every event renews the retention of all its fields.
        return [(s.ctx_drop_expired, params), (change, params), (s.ctx_touch, params)]

    async def _do_on_context_change(self, event: ContextChangeEvent) -> None:
        writes = self._context_writes(event, self.clock.now_ms())
        if len(writes) == 1:
            await self.database.fetch(*writes[0])
            return
        # One transaction, sent together (one round trip on PostgreSQL).
        await self.database.fetch_all(writes)

    async def _do_get_context_changes(
        self, stack_id: str, step_id: str, namespace: str | None = None
    ) -> dict[str, Any]:
        db = self.database
        stream = row_id(namespace or "", stack_id, step_id)
        rows = await db.read(self._s.ctx_get, {"stream": stream, "now": self.clock.now_ms()})
        return {name: codec.loads(data, what="context value") for name, data in rows}

    async def _do_on_cache_event(self, event: CacheEvent) -> None:
        self.cache_events.append(event)
        del self.cache_events[:-1000]


_REPLACE_MIN_BYTES = 2048
"""The shortest new body written over a dropped one's row (SQLite, ``parts_replace``):
one statement each, worth it where the body spills onto pages of its own (half a page
and more), which an in-place write leaves alone where their bytes did not change. Shorter
bodies go in the one insert of a save."""

_PER_STATEMENT = 500
"""Parts inserted or deleted by one statement at most (three parameters a row: within
SQLite's 32,766 and PostgreSQL's 65,535)."""

_VERSION_DIGESTS = 100_000
"""Digests :attr:`SqlStorageAdapter._versions` keeps at most, each row counting one more
(about 100 bytes each: 10 MB at most): the rows least recently saved or loaded are
forgotten first, and their next save reads what is stored."""


_PART_READS = 10
"""Reads of a checkpoint saved in parts before giving up: each retry means another save
replaced it between reading its row and its parts."""


def _with_bodies(rows: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """``(document, parts, {digest: body}, version)`` of a checkpoint read with
    ``cp_load``: ``(document, parts, digest, body, version)`` rows, one per part."""
    first = rows[0]
    bodies = {bytes(r[2]): bytes(r[3]) for r in rows if r[2] is not None}
    return (first[0], first[1], bodies, first[4])


def _document(row: Sequence[Any]) -> tuple[bytes, bytes | None]:
    """``(document, parts)`` of a checkpoint row read as ``document, parts, …``."""
    return stored_bytes(row[0]), None if row[1] is None else stored_bytes(row[1], "parts")


def _refused_privilege(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is the database refusing a privilege:
    SQLSTATE 42501 on PostgreSQL."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "sqlstate", None) == "42501":
            return True
        seen = seen.__cause__ or seen.__context__
    return False
