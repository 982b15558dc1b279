"""siglo's SQL tables, as SQLAlchemy Core metadata, for every schema version.

SQLAlchemy describes the tables once and compiles their DDL for each dialect (SQLite,
PostgreSQL); the hot statements that read and write them are plain SQL text in
:mod:`siglo_sql.statements`.

Conventions, chosen for the queries that use them:

- Every table's primary key ``id`` is a 16-byte BLAKE2b digest of the row's ids
  (:func:`siglo_sql.keys.row_id`), computed in Python: ids of any length and
  characters fit one small index entry, and lookups are one equality on it. The ids
  themselves are kept in text columns, as data.
- An absent namespace is stored (and digested) as ``''``: ids are never empty, so ``''``
  cannot be a real namespace, and an un-namespaced row never matches a namespaced one.
- ``gone_at`` is the millisecond time a row stops existing (``NULL``: kept until removed),
  compared with the injected clock's ``now`` passed as a parameter, never the database's
  clock. Every table with a ``gone_at`` has an index on it for the expiry sweeps; where
  ``gone_at`` may be ``NULL`` the index is partial (``WHERE gone_at IS NOT NULL``, from
  version 3), so a row that never expires costs no index entry on its writes.
- Documents are stored as the exact JSON bytes siglo encoded (``BLOB`` / ``bytea``): the
  wire document of SPEC §2 comes back byte for byte, and decoding reuses it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Final

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.sql.schema import SchemaItem

from siglo.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_PREFIX",
    "ID_PREFIX",
    "SCHEMA_VERSION",
    "Tables",
    "build_tables",
    "check_identifier",
]

SCHEMA_VERSION: Final = 8
"""The schema version this code reads and writes."""

DEFAULT_PREFIX: Final = "siglo_"
ID_PREFIX: Final = 200
"""How many characters of an id an index holds (4 bytes each at most: within
PostgreSQL's limit of an index row)."""


def check_identifier(what: str, value: str) -> str:
    """Table prefixes and schema names become SQL identifiers: keep them plain."""
    if not isinstance(value, str) or not all(
        c.isascii() and (c.isalnum() or c == "_") for c in value
    ):
        raise InvalidArgumentError(
            f"{what} must contain only ASCII letters, digits and '_', got {value!r}"
        )
    if len(value) > 40:
        raise InvalidArgumentError(f"{what} must be at most 40 characters, got {value!r}")
    return value


@dataclass(frozen=True)
class Tables:
    """The tables of one siglo installation (one prefix, one schema) at one version."""

    metadata: MetaData
    version: int
    schema_version: Table
    checkpoints: Table
    wait_records: Table
    wait_latest: Table
    step_cache: Table
    idempotency: Table
    locks: Table
    nonces: Table
    context_changes: Table | None
    checkpoint_parts: Table | None = None
    """Version 6: the contexts of checkpoints saved incrementally (siglo_sql.parts)."""
    checkpoint_tokens: Table | None = None
    """Version 7: the blind-index tokens of each checkpoint (siglo_sql.listing)."""


def _id() -> Column[bytes]:
    # The primary key is a 16-byte digest of the row's ids (siglo_sql.keys):
    # ids may be 1,000 characters of 4-byte unicode, past PostgreSQL's btree limit of
    # 2,704 bytes per index row, and a fixed-size key keeps every index small.
    return Column("id", LargeBinary, primary_key=True)


def build_tables(
    prefix: str = DEFAULT_PREFIX, schema: str | None = None, *, version: int = SCHEMA_VERSION
) -> Tables:
    """The tables as they are at schema ``version`` (1 to 8).

    Version 1: checkpoints, wait records, step cache, idempotency keys, locks (lease rows
    with an owner token), nonces. Version 2 adds the locks' fencing counter (``fence``)
    and the ``context_changes`` table behind the context stream. Version 3 makes the
    expiry index of every table whose ``gone_at`` may be ``NULL`` (checkpoints, wait
    records, locks, context changes) partial: it holds only the rows that can expire.
    Version 4 (SPEC §9, listing and timers) adds the checkpoints' ``workflow_id``,
    ``updated_at`` (the checkpoint's ``timestamp``) and ``expires_at`` columns, an index
    on ``(namespace, id)`` that a namespace's walk follows (an unfiltered walk follows the
    primary key), and a partial index on the wait records' ``deadline`` for due waits.
    Version 5 adds the idempotency keys' ``owner`` (the owner token of an owned claim) and
    ``fingerprint`` (the digest of the claim's payload fingerprint), both nullable.
    Version 6 (SPEC §13, incremental saves) adds the checkpoints' ``parts`` (the step ids
    and content digests of a document saved in parts; ``NULL`` for one stored whole) and
    the ``checkpoint_parts`` table: one row per distinct context of such a checkpoint,
    keyed by the checkpoint's id and the context's digest (:mod:`siglo_sql.parts`).
    Version 7 (SPEC §12, the blind index) adds ``checkpoint_tokens``: one row per
    blind-index token of a checkpoint's metadata (``$sigloIndex``: field and token),
    keyed by the checkpoint's id and the field, with an index on ``(token, field, id)``
    that a filtered listing follows; triggers on the checkpoints, created with the
    store's first token, keep it in step (:func:`siglo_sql.migrations.token_triggers`).
    Version 8 changes no table: it makes the token triggers read a document holding a
    ``\\u0000`` escape (PostgreSQL: the function they call), so its tables are
    version 7's.
    """
    check_identifier("table prefix", prefix) if prefix else None
    if schema is not None:
        check_identifier("schema", schema)
    if version not in (1, 2, 3, 4, 5, 6, 7, 8):
        raise ValueError(f"no schema version {version}")
    return _built(prefix, schema, version)


# Built once per prefix, schema and version, and shared: building them took ~5 ms (the
# SQLAlchemy objects of seven tables), and every connect built them twice (the
# statements and the schema check), a migration once per version: a connect, first load
# and close on SQLite took 37 ms, 5 ms with them built once (SQLAlchemy's compiled
# statements are kept per table too). Nothing changes them once built (Tables is frozen;
# statements and DDL are compiled from them). Cached after build_tables checked the
# names, so a bad one is refused by name, never as unhashable.
@functools.lru_cache(maxsize=64)
def _built(prefix: str, schema: str | None, version: int) -> Tables:
    md = MetaData(schema=schema)
    p = prefix

    def expiry_index(table: str) -> Index:
        # For a gone_at that may be NULL (kept until removed). The sweeps' ``gone_at <= ?``
        # implies ``gone_at IS NOT NULL``, so both planners still use the partial index.
        if version < 3:
            return Index(f"{table}_gone_at", "gone_at")
        partial = text("gone_at IS NOT NULL")
        return Index(f"{table}_gone_at", "gone_at", sqlite_where=partial, postgresql_where=partial)

    def deadline_index(table: str) -> Index:
        # Due waits: only waits that can still fire are in it (waits without a deadline,
        # and finished ones, cost no entry), so looking up due waits never wades through
        # the history. The due-wait query repeats both conditions, so both planners can
        # tell the index applies.
        partial = text("deadline IS NOT NULL AND status IN ('waiting', 'claimed')")
        return Index(
            f"{table}_deadline", "deadline", sqlite_where=partial, postgresql_where=partial
        )

    schema_version = Table(
        f"{p}schema_version",
        md,
        Column("version", Integer, primary_key=True, autoincrement=False),
        Column("applied_at", BigInteger, nullable=False),
        Column("description", Text, nullable=False),
    )
    checkpoint_items: list[SchemaItem] = [
        _id(),
        Column("namespace", Text, nullable=False),
        Column("stack_id", Text, nullable=False),
        Column("revision", BigInteger, nullable=False),
        Column("status", Text, nullable=False),
        Column("gone_at", BigInteger, nullable=True),
        Column("document", LargeBinary, nullable=False),
        expiry_index(f"{p}checkpoints"),
    ]
    if version >= 4:
        checkpoint_items += [
            Column("workflow_id", Text, nullable=True),
            Column("updated_at", BigInteger, nullable=True),
            Column("expires_at", BigInteger, nullable=True),
        ]
    if version >= 6:
        checkpoint_items.append(Column("parts", LargeBinary, nullable=True))
    checkpoints = Table(f"{p}checkpoints", md, *checkpoint_items)
    if version >= 4:
        # Keyset walks of one namespace: equality on the namespace, then id order. On
        # its first ID_PREFIX characters: a whole id may pass PostgreSQL's 2,704-byte
        # limit of an index row (the query also compares the whole namespace).
        Index(
            f"{p}checkpoints_namespace",
            func.substr(checkpoints.c.namespace, 1, ID_PREFIX),
            checkpoints.c.id,
        )
    wait_records = Table(
        f"{p}wait_records",
        md,
        _id(),
        Column("correlation_key", Text, nullable=False),
        Column("stack_id", Text, nullable=False),
        Column("namespace", Text, nullable=False),
        # digest(namespace, stack_id): cancel_workflow finds a stack's records by it
        Column("stack_ref", LargeBinary, nullable=False),
        Column("status", Text, nullable=False),
        Column("deadline", BigInteger, nullable=True),
        Column("claimant_id", Text, nullable=True),
        Column("claimed_at", BigInteger, nullable=True),
        Column("lease_expires_at", BigInteger, nullable=True),
        Column("completed_at", BigInteger, nullable=True),
        Column("event_payload", LargeBinary, nullable=True),
        Column("gone_at", BigInteger, nullable=True),
        Column("document", LargeBinary, nullable=False),
        Index(f"{p}wait_records_stack", "stack_ref"),
        expiry_index(f"{p}wait_records"),
        *([deadline_index(f"{p}wait_records")] if version >= 4 else []),
    )
    # The wait record most recently saved for each stack id (get_wait_record by stack
    # id returns it): id is digest(stack_id), wait_id the record's id.
    wait_latest = Table(
        f"{p}wait_latest",
        md,
        _id(),
        Column("stack_id", Text, nullable=False),
        Column("wait_id", LargeBinary, nullable=False),
    )
    step_cache = Table(
        f"{p}step_cache",
        md,
        _id(),
        Column("key", Text, nullable=False),
        Column("gone_at", BigInteger, nullable=False),
        Column("value", LargeBinary, nullable=False),
        Index(f"{p}step_cache_gone_at", "gone_at"),
    )
    idempotency_columns: list[SchemaItem] = [
        _id(),
        Column("key", Text, nullable=False),
        Column("state", Text, nullable=False),
        Column("result", LargeBinary, nullable=True),
        Column("gone_at", BigInteger, nullable=False),
    ]
    if version >= 5:
        idempotency_columns += [
            Column("owner", Text, nullable=True),
            Column("fingerprint", Text, nullable=True),
        ]
    idempotency = Table(
        f"{p}idempotency_keys",
        md,
        *idempotency_columns,
        Index(f"{p}idempotency_keys_gone_at", "gone_at"),
    )
    lock_columns: list[SchemaItem] = [
        _id(),
        Column("scope", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("token", Text, nullable=True),
        Column("gone_at", BigInteger, nullable=True),
    ]
    if version >= 2:
        lock_columns.append(Column("fence", BigInteger, nullable=False, server_default="0"))
    locks = Table(
        f"{p}locks",
        md,
        *lock_columns,
        expiry_index(f"{p}locks"),
    )
    nonces = Table(
        f"{p}nonces",
        md,
        _id(),
        Column("key", Text, nullable=False),
        Column("gone_at", BigInteger, nullable=False),
        Index(f"{p}nonces_gone_at", "gone_at"),
    )
    context_changes = None
    if version >= 2:
        context_changes = Table(
            f"{p}context_changes",
            md,
            _id(),
            # digest(namespace, stack_id, step_id): one stream's fields share it
            Column("stream", LargeBinary, nullable=False),
            Column("namespace", Text, nullable=False),
            Column("stack_id", Text, nullable=False),
            Column("step_id", Text, nullable=False),
            Column("field", Text, nullable=False),
            Column("value", LargeBinary, nullable=False),
            Column("gone_at", BigInteger, nullable=True),
            Index(f"{p}context_changes_stream", "stream"),
            expiry_index(f"{p}context_changes"),
        )
        if version >= 4:
            # delete_checkpoint removes a stack's streams of every step.
            Index(
                f"{p}context_changes_stack",
                func.substr(context_changes.c.stack_id, 1, ID_PREFIX),
            )
    checkpoint_parts = None
    if version >= 6:
        # A context's body under its digest, always the body the digest names. A save adds
        # the digests it introduces and deletes those it no longer names (on SQLite it
        # may write a new body over a dropped one's row, digest and all), so a reader
        # that finds every digest its checkpoint row names has read one consistent
        # document.
        checkpoint_parts = Table(
            f"{p}checkpoint_parts",
            md,
            Column("id", LargeBinary, primary_key=True),
            Column("digest", LargeBinary, primary_key=True),
            Column("body", LargeBinary, nullable=False),
        )
    checkpoint_tokens = None
    if version >= 7:
        # Written only by the token triggers (made with a store's first token, or by
        # migration 7 when it found tokens), in the statement that writes the
        # checkpoint row. The primary key (id, field) is what they delete by; the index
        # (token, field, id) is what a filtered listing walks, in id order: keyset pages
        # are a range of it, and each row leads to its checkpoint by primary key.
        checkpoint_tokens = Table(
            f"{p}checkpoint_tokens",
            md,
            Column("id", LargeBinary, primary_key=True),
            Column("field", Text, primary_key=True),
            Column("token", Text, nullable=False),
            Index(f"{p}checkpoint_tokens_token", "token", "field", "id"),
        )
    return Tables(
        metadata=md,
        version=version,
        schema_version=schema_version,
        checkpoints=checkpoints,
        wait_records=wait_records,
        wait_latest=wait_latest,
        step_cache=step_cache,
        idempotency=idempotency,
        locks=locks,
        nonces=nonces,
        context_changes=context_changes,
        checkpoint_parts=checkpoint_parts,
        checkpoint_tokens=checkpoint_tokens,
    )
