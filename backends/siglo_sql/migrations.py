"""Versioned schema migrations.

The database records every applied migration in ``<prefix>schema_version`` (one row per
version). :func:`migrate` brings a database up to :data:`SCHEMA_VERSION` in one
transaction, holding a migration lock (PostgreSQL: a transaction-level advisory lock,
which also works behind PgBouncer; SQLite: ``BEGIN IMMEDIATE``), so several processes may
migrate at once: one does the work, the others find it done. DDL is compiled by
SQLAlchemy for the dialect; both databases run DDL inside a transaction, so a failed
migration leaves the schema as it was.

:func:`ensure_schema` is what a backend runs when it first connects: nothing when the
schema is current, the migration when it is older and ``auto_migrate`` is on, and a
:class:`~siglo.errors.SchemaVersionError` otherwise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from sqlalchemy import BigInteger, LargeBinary, Table
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable, DropIndex, Index

from siglo.clock import system_clock
from siglo.errors import InvalidArgumentError, SchemaVersionError, StorageAdapterError
from siglo_sql.database import Database, Executor
from siglo_sql.keys import MAX_MS
from siglo_sql.schema import SCHEMA_VERSION, Tables, build_tables

__all__ = [
    "MIGRATIONS",
    "TOKEN_MARKER",
    "Migration",
    "ensure_schema",
    "ensure_token_triggers",
    "holds_token_marker",
    "indexed_text",
    "migrate",
    "read_version",
    "token_triggers",
]


@dataclass(frozen=True)
class Migration:
    """One step: from ``version - 1`` to ``version``."""

    version: int
    description: str
    ddl: Callable[[str, str | None, Dialect], list[str]]
    """``(prefix, schema, dialect)`` → the statements to run."""
    then: Callable[[Executor, str, str | None, Dialect], Awaitable[None]] | None = None
    """What runs after them, in the same transaction, when it depends on what the
    database holds: ``(transaction, prefix, schema, dialect)``."""


def _create(tables: list[object], dialect: Dialect) -> list[str]:
    out: list[str] = []
    for table in tables:
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip())  # type: ignore[arg-type]
        for index in sorted(table.indexes, key=lambda i: i.name or ""):  # type: ignore[attr-defined]
            out.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return out


def _v1(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    t = build_tables(prefix, schema, version=1)
    return _create(
        [t.checkpoints, t.wait_records, t.wait_latest, t.step_cache, t.idempotency, t.locks,
         t.nonces],
        dialect,
    )  # fmt: skip


def _v2(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    t = build_tables(prefix, schema, version=2)
    assert t.context_changes is not None
    locks = dialect.identifier_preparer.format_table(t.locks)
    bigint = dialect.type_compiler_instance.process(BigInteger())
    return [
        f"ALTER TABLE {locks} ADD COLUMN fence {bigint} NOT NULL DEFAULT 0",
        *_create([t.context_changes], dialect),
    ]


def _v3(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    before = build_tables(prefix, schema, version=2)
    after = build_tables(prefix, schema, version=3)
    out: list[str] = []
    for name in ("checkpoints", "wait_records", "locks", "context_changes"):
        old = _expiry_index(getattr(before, name))
        new = _expiry_index(getattr(after, name))
        # Same name, now partial. Inside the migration's transaction, so a failure leaves
        # the old index; PostgreSQL locks the table while the index is built.
        out.append(str(DropIndex(old).compile(dialect=dialect)).strip())
        out.append(str(CreateIndex(new).compile(dialect=dialect)).strip())
    if dialect.name == "postgresql":
        out.append(_lz4_documents(after, dialect))
    return out


def _v4(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    after = build_tables(prefix, schema, version=4)
    q = dialect.identifier_preparer
    cp = q.format_table(after.checkpoints)
    bigint = dialect.type_compiler_instance.process(BigInteger())
    text_type = "TEXT"
    if dialect.name == "postgresql":
        # Only the listing's fields are taken from the copy _json_of makes (a "\u0000"
        # in a context made U+FFFD there; the stored document is not changed).
        doc = _json_of("document", dialect)
        field = {
            "workflow_id": f"{doc} ->> 'workflowId'",
            "updated_at": f"LEAST(({doc} ->> 'timestamp')::numeric, {MAX_MS})::bigint",
            "expires_at": f"LEAST(({doc} ->> 'expiresAt')::numeric, {MAX_MS})::bigint",
        }
    else:
        doc = "CAST(document AS TEXT)"
        field = {
            "workflow_id": f"json_extract({doc}, '$.workflowId')",
            "updated_at": f"json_extract({doc}, '$.timestamp')",
            "expires_at": f"json_extract({doc}, '$.expiresAt')",
        }
    assert after.context_changes is not None
    new_indexes = [
        i
        for i in (
            *after.checkpoints.indexes,
            *after.wait_records.indexes,
            *after.context_changes.indexes,
        )
        if str(i.name).endswith(("_namespace", "_deadline", "_stack"))
        and not str(i.name).endswith("wait_records_stack")
    ]
    return [
        f"ALTER TABLE {cp} ADD COLUMN workflow_id {text_type}",
        f"ALTER TABLE {cp} ADD COLUMN updated_at {bigint}",
        f"ALTER TABLE {cp} ADD COLUMN expires_at {bigint}",
        # Rows written before: the listing columns from their documents.
        f"UPDATE {cp} SET workflow_id = {field['workflow_id']}, "
        f"updated_at = {field['updated_at']}, expires_at = {field['expires_at']}",
        *(
            str(CreateIndex(i).compile(dialect=dialect)).strip()
            for i in sorted(new_indexes, key=lambda i: str(i.name))
        ),
    ]


def _json_of(column: str, dialect: Dialect) -> str:
    """The JSON of the document in ``column`` (bytes) as a migration or a token trigger
    reads it: PostgreSQL json, SQLite text for its json functions.

    A context in clear (or the in-clear ``redactFields`` of a sealed one) may hold
    "\\u0000" in a string. PostgreSQL's JSON refuses to turn that escape into text, json
    and jsonb alike, once any value of the document is read: what reads the document
    would fail, and with it the save or the migration. SQLite's json functions end the
    string at it (3.40; 3.45 and later keep the NUL), so what is indexed would depend on
    the SQLite version. So each "\\u0000" is made "\\ufffd" (U+FFFD) in the copy read here;
    the stored document is not changed, and a document without it reads as before.
    Every escaped backslash is made "\\u005c" first, so that each "\\u0000" left is an
    escape, not an escaped backslash followed by the text "u0000". (Neither database
    reads a backslash as an escape in these literals: PostgreSQL's
    ``standard_conforming_strings``, on since 9.1, and SQLite's strings.)"""
    text = (
        f"convert_from({column}, 'UTF8')"
        if dialect.name == "postgresql"
        else f"CAST({column} AS TEXT)"
    )
    safe = rf"replace(replace({text}, '\\', '\u005c'), '\u0000', '\ufffd')"
    return f"{safe}::json" if dialect.name == "postgresql" else safe


def indexed_text(value: str) -> str:
    """A token or field as the token index holds it: a NUL made U+FFFD, as
    :func:`_json_of` makes it in the documents the triggers read (PostgreSQL's text
    cannot hold a NUL at all). A filtered listing asks for its tokens this way, so a
    token holding a NUL finds its checkpoint; it also finds one whose token holds
    U+FFFD in that place (tokens siglo makes are base64, and hold neither)."""
    return value.replace("\x00", "\ufffd")


def _v5(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    t = build_tables(prefix, schema, version=5)
    idem = dialect.identifier_preparer.format_table(t.idempotency)
    # Rows written before have no owner and no fingerprint: seed-compatible claims.
    return [
        f"ALTER TABLE {idem} ADD COLUMN owner TEXT",
        f"ALTER TABLE {idem} ADD COLUMN fingerprint TEXT",
    ]


def _v6(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    t = build_tables(prefix, schema, version=6)
    assert t.checkpoint_parts is not None
    q = dialect.identifier_preparer
    cp = q.format_table(t.checkpoints)
    parts = q.format_table(t.checkpoint_parts)
    # Rows written before stay whole (parts NULL) and read as before; a stack's next save
    # over incremental_min_bytes moves it to parts. The triggers drop a checkpoint's
    # parts in the statement that deletes it or stores it whole again, so no path that
    # deletes a checkpoint row (delete, clean-up, an expired row replaced) can orphan them.
    out = [
        f"ALTER TABLE {cp} ADD COLUMN parts {_blob(dialect)}",
        *_create([t.checkpoint_parts], dialect),
    ]
    gone = q.quote(f"{prefix}checkpoint_parts_gone")
    dropped = q.quote(f"{prefix}checkpoint_parts_dropped")
    if dialect.name == "postgresql":
        function = (q.quote_schema(schema) + "." if schema else "") + gone
        out += [
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"DELETE FROM {parts} WHERE id = OLD.id; RETURN NULL; END $$",
            f"CREATE TRIGGER {gone} AFTER DELETE ON {cp} FOR EACH ROW "
            f"WHEN (OLD.parts IS NOT NULL) EXECUTE FUNCTION {function}()",
            f"CREATE TRIGGER {dropped} AFTER UPDATE OF parts ON {cp} FOR EACH ROW "
            f"WHEN (OLD.parts IS NOT NULL AND NEW.parts IS NULL) EXECUTE FUNCTION {function}()",
        ]
    else:
        out += [
            f"CREATE TRIGGER {gone} AFTER DELETE ON {cp} FOR EACH ROW "
            f"WHEN OLD.parts IS NOT NULL BEGIN DELETE FROM {parts} WHERE id = OLD.id; END",
            f"CREATE TRIGGER {dropped} AFTER UPDATE OF parts ON {cp} FOR EACH ROW "
            f"WHEN OLD.parts IS NOT NULL AND NEW.parts IS NULL "
            f"BEGIN DELETE FROM {parts} WHERE id = OLD.id; END",
        ]
    if dialect.name == "postgresql":
        out.append(
            "DO $$ BEGIN\n"
            "  IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'"
            " AND 'lz4' = ANY (enumvals)) THEN\n"
            f"    ALTER TABLE {parts} ALTER COLUMN body SET COMPRESSION lz4;\n"
            "  END IF;\n"
            "END $$"
        )
    return out


TOKEN_MARKER: Final = b'"$sigloIndex"'
"""The metadata key of the tokens as it appears in a stored document's JSON: a document
without it has no tokens, so the triggers skip parsing it, and a store that never wrote
it never gets the triggers (:func:`ensure_token_triggers`)."""


def holds_token_marker(document: bytes) -> bool:
    """Whether ``document`` holds :data:`TOKEN_MARKER` (then its save needs the token
    triggers): a ``memchr`` for each ``$`` and a comparison there. ``marker in document``
    is CPython's general search, which moves one byte at a time wherever the document's
    bytes are among the marker's letters: 2.5 µs for a 1 KB document of ``x``, against
    0.1 µs this way (one ``$`` is rare in a document without tokens)."""
    at = document.find(b"$")
    while at >= 0:
        if at > 0 and document.startswith(TOKEN_MARKER, at - 1):
            return True
        at = document.find(b"$", at + 1)
    return False


def _token_names(prefix: str, dialect: Dialect) -> tuple[str, str, str]:
    q = dialect.identifier_preparer
    return (
        q.quote(f"{prefix}checkpoint_tokens_added"),
        q.quote(f"{prefix}checkpoint_tokens_changed"),
        q.quote(f"{prefix}checkpoint_tokens_gone"),
    )


def _token_function(prefix: str, schema: str | None, dialect: Dialect) -> str:
    q = dialect.identifier_preparer
    return (q.quote_schema(schema) + "." if schema else "") + q.quote(
        f"{prefix}checkpoint_tokens_sync"
    )


def _holds_marker(row: str) -> str:
    """SQLite: whether ``row``'s document holds :data:`TOKEN_MARKER`. ``GLOB`` on the
    document as text walks it to each ``"`` and compares there; ``instr`` on the blob
    compares at every byte: 5k against 19k instructions for a 1 KB document (callgrind,
    2,000 upserts). The document is JSON, which holds no NUL byte (where ``GLOB`` would
    stop): a NUL in a string is written ``\\u0000``."""
    pattern = "'*" + TOKEN_MARKER.decode() + "*'"
    return f"CAST({row}.document AS TEXT) GLOB {pattern}"


def _tokens_insert(ix: str, row: str, dialect: Dialect) -> str:
    """SQLite: the tokens of ``row``'s document into ``ix``."""
    path = """'$.metadata."$sigloIndex"'"""
    # A token or field holding a NUL is indexed with U+FFFD there (_json_of), as on
    # PostgreSQL: SQLite's json_each would end it at the NUL, and index "a" for "a\0b".
    return (
        f"INSERT INTO {ix} (id, field, token) SELECT {row}.id, key, value "
        f"FROM json_each(CASE WHEN {_holds_marker(row)} "
        f"THEN {_json_of(row + '.document', dialect)} ELSE '{{}}' END, {path}) "
        "WHERE type = 'text' AND key IS NOT NULL"
    )


def token_triggers(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    """The three triggers that keep ``checkpoint_tokens`` in step with every write of a
    checkpoint row (save, cancel, delete, clean-up, erase, import), in the statement that
    writes it.

    They are not part of migration 7: a trigger's conditions run on every write of a
    checkpoint row, and most stores never hold a token. They are created when a store
    first needs them (:func:`ensure_token_triggers`), and stay."""
    t = build_tables(prefix, schema, version=7)
    assert t.checkpoint_tokens is not None
    q = dialect.identifier_preparer
    cp = q.format_table(t.checkpoints)
    ix = q.format_table(t.checkpoint_tokens)
    added, changed, gone = _token_names(prefix, dialect)
    if dialect.name == "postgresql":
        marker = "'\\x" + TOKEN_MARKER.hex() + "'::bytea"
        fn = _token_function(prefix, schema, dialect)
        return [
            f"CREATE TRIGGER {added} AFTER INSERT ON {cp} FOR EACH ROW "
            f"WHEN (position({marker} in NEW.document) > 0) EXECUTE FUNCTION {fn}()",
            # A row whose old and new documents have no tokens has no index rows (every
            # write goes through these triggers), so the function is not even called.
            f"CREATE TRIGGER {changed} AFTER UPDATE OF document ON {cp} FOR EACH ROW "
            f"WHEN (position({marker} in NEW.document) > 0 "
            f"OR position({marker} in OLD.document) > 0) EXECUTE FUNCTION {fn}()",
            f"CREATE TRIGGER {gone} AFTER DELETE ON {cp} FOR EACH ROW "
            f"WHEN (position({marker} in OLD.document) > 0) EXECUTE FUNCTION {fn}()",
        ]
    # SQLite runs a trigger's body only when its WHEN holds: a checkpoint that has and
    # had no tokens costs the conditions, not two statements. The old row's tokens are
    # found by one probe of the tokens table's primary key. Measured (callgrind, 2,000
    # upserts of a 1 KB document without tokens, per upsert): no triggers 25.3k; GLOB on
    # the new document or the probe 35.6k; GLOB on both documents 36.7k; instr on the new
    # document or the probe 47.9k; no WHEN (the body each time) 51.2k.
    had = f"EXISTS (SELECT 1 FROM {ix} WHERE id = OLD.id)"
    return [
        f"CREATE TRIGGER IF NOT EXISTS {added} AFTER INSERT ON {cp} FOR EACH ROW "
        f"WHEN {_holds_marker('NEW')} BEGIN {_tokens_insert(ix, 'NEW', dialect)}; END",
        f"CREATE TRIGGER IF NOT EXISTS {changed} AFTER UPDATE OF document ON {cp} "
        f"FOR EACH ROW WHEN {_holds_marker('NEW')} OR {had} "
        f"BEGIN DELETE FROM {ix} WHERE id = OLD.id; {_tokens_insert(ix, 'NEW', dialect)}; END",
        f"CREATE TRIGGER IF NOT EXISTS {gone} AFTER DELETE ON {cp} FOR EACH ROW WHEN {had} "
        f"BEGIN DELETE FROM {ix} WHERE id = OLD.id; END",
    ]


async def has_token_triggers(
    tx: Executor, prefix: str, schema: str | None, dialect: Dialect
) -> bool:
    """Whether the checkpoints table has the token triggers (all three are created
    together, in one transaction)."""
    name = f"{prefix}checkpoint_tokens_added"
    if dialect.name == "postgresql":
        t = build_tables(prefix, schema, version=7)
        table = dialect.identifier_preparer.format_table(t.checkpoints)
        rows = await tx.fetch(
            "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(%(table)s) AND tgname = %(name)s",
            {"table": table, "name": name},
        )
    else:
        rows = await tx.fetch(
            "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = :name",
            {"name": name},
        )
    return bool(rows)


async def ensure_token_triggers(db: Database, prefix: str, schema: str | None) -> None:
    """Create the token triggers unless they are there, in a transaction of their own
    (committed before the write that needs them), under a lock, so several processes
    may ask at once: one creates them, the others find them."""
    dialect = db.sa_dialect
    async with db.transaction() as tx:
        await db.migration_lock(tx, f"siglo-token-triggers:{schema or ''}:{prefix}")
        await _create_token_triggers(tx, prefix, schema, dialect)


async def _create_token_triggers(
    tx: Executor, prefix: str, schema: str | None, dialect: Dialect
) -> None:
    # Checked after the lock, in a statement of its own: under READ COMMITTED it sees
    # what another process committed while this one waited.
    if await has_token_triggers(tx, prefix, schema, dialect):
        return
    for statement in token_triggers(prefix, schema, dialect):
        await tx.fetch(statement)


async def _v7_then(tx: Executor, prefix: str, schema: str | None, dialect: Dialect) -> None:
    """After migration 7's backfill: the triggers, only when it found tokens."""
    t = build_tables(prefix, schema, version=7)
    assert t.checkpoint_tokens is not None
    ix = dialect.identifier_preparer.format_table(t.checkpoint_tokens)
    if await tx.fetch(f"SELECT 1 FROM {ix} LIMIT 1"):
        await _create_token_triggers(tx, prefix, schema, dialect)


def _token_function_ddl(
    prefix: str, schema: str | None, dialect: Dialect, *, replace: bool = False
) -> str:
    """PostgreSQL: the function the token triggers call. Migration 7 creates it;
    migration 8 replaces the one an older migration 7 made, which read the document
    without :func:`_json_of` and so refused every save (and every backfill) of a
    document holding both the marker and a "\\u0000" escape."""
    t = build_tables(prefix, schema, version=7)
    assert t.checkpoint_tokens is not None
    ix = dialect.identifier_preparer.format_table(t.checkpoint_tokens)
    marker = "'\\x" + TOKEN_MARKER.hex() + "'::bytea"
    fn = _token_function(prefix, schema, dialect)
    # json, not jsonb, as the function migration 7 first made read it: the same
    # tokens from the same document. A token or field holding a NUL comes out with
    # U+FFFD in its place, as a listing asks for it (indexed_text).
    tokens = f"{_json_of('NEW.document', dialect)} -> 'metadata' -> '$sigloIndex'"
    return (
        f"CREATE {'OR REPLACE ' if replace else ''}FUNCTION {fn}() RETURNS trigger "
        "LANGUAGE plpgsql AS $$\n"
        "DECLARE found json;\n"
        "BEGIN\n"
        f"  IF TG_OP <> 'INSERT' THEN DELETE FROM {ix} WHERE id = OLD.id; END IF;\n"
        f"  IF TG_OP <> 'DELETE' AND position({marker} in NEW.document) > 0 THEN\n"
        f"    found := {tokens};\n"
        "    IF json_typeof(found) = 'object' THEN\n"
        f"      INSERT INTO {ix} (id, field, token) SELECT NEW.id, e.key, e.value #>> '{{}}'\n"
        "        FROM json_each(found) AS e WHERE json_typeof(e.value) = 'string';\n"
        "    END IF;\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END $$"
    )


def _v7(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    t = build_tables(prefix, schema, version=7)
    assert t.checkpoint_tokens is not None
    q = dialect.identifier_preparer
    cp = q.format_table(t.checkpoints)
    ix = q.format_table(t.checkpoint_tokens)
    out = _create([t.checkpoint_tokens], dialect)
    # The table, the function the PostgreSQL triggers call, and the tokens a schema-6
    # store holds; the triggers themselves come with the first token (token_triggers).
    if dialect.name == "postgresql":
        marker = "'\\x" + TOKEN_MARKER.hex() + "'::bytea"
        tokens = f"{_json_of('c.document', dialect)} -> 'metadata' -> '$sigloIndex'"
        out += [
            _token_function_ddl(prefix, schema, dialect),
            # Stores migrated with checkpoints: their tokens from the stored metadata.
            f"INSERT INTO {ix} (id, field, token) SELECT c.id, e.key, e.value #>> '{{}}' "
            f"FROM (SELECT id, document FROM {cp} WHERE position({marker} in document) > 0) "
            f"AS c, json_each(CASE WHEN json_typeof({tokens}) = 'object' THEN "
            f"{tokens} ELSE '{{}}'::json END) AS e "
            "WHERE json_typeof(e.value) = 'string'",
        ]
    else:
        out.append(
            _tokens_insert(ix, "c", dialect).replace(
                "FROM json_each(", f"FROM {cp} AS c, json_each(", 1
            )
        )
    return out


def _v8(prefix: str, schema: str | None, dialect: Dialect) -> list[str]:
    # PostgreSQL: the triggers call the function by its oid, which CREATE OR REPLACE
    # keeps, so they run the new body from the next row they fire on (each session's
    # PL/pgSQL recompiles a function whose definition changed). Nothing to re-index:
    # the old function refused every document it could not read, so no such row was
    # stored while the triggers existed, and migration 7 could not complete over one.
    if dialect.name == "postgresql":
        return [_token_function_ddl(prefix, schema, dialect, replace=True)]
    return []


async def _v8_then(tx: Executor, prefix: str, schema: str | None, dialect: Dialect) -> None:
    """SQLite: the token triggers hold their statements, so a store that has them gets
    them again, reading documents through :func:`_json_of`; and the checkpoints whose
    documents hold a "\\u0000" escape and tokens are indexed again, since the old
    triggers (and migration 7) indexed a token or field holding a NUL cut at it on
    SQLite before 3.45. A store without the triggers has no tokens to redo: it gets
    the new ones with its first token."""
    if dialect.name == "postgresql" or not await has_token_triggers(tx, prefix, schema, dialect):
        return
    for name in _token_names(prefix, dialect):
        await tx.fetch(f"DROP TRIGGER IF EXISTS {name}")
    for statement in token_triggers(prefix, schema, dialect):
        await tx.fetch(statement)
    t = build_tables(prefix, schema, version=8)
    assert t.checkpoint_tokens is not None
    q = dialect.identifier_preparer
    cp = q.format_table(t.checkpoints)
    ix = q.format_table(t.checkpoint_tokens)
    # One scan of the documents (GLOB to each quote, as the triggers' condition does),
    # in the migration's transaction; an escaped backslash before "u0000" also matches,
    # and is indexed again as it was.
    nul = f"{_holds_marker('c')} AND instr(CAST(c.document AS TEXT), '\\u0000') > 0"
    await tx.fetch(f"DELETE FROM {ix} WHERE id IN (SELECT c.id FROM {cp} AS c WHERE {nul})")
    await tx.fetch(
        _tokens_insert(ix, "c", dialect).replace(
            "FROM json_each(", f"FROM {cp} AS c, json_each(", 1
        )
        + f" AND {nul}"
    )


def _blob(dialect: Dialect) -> str:
    return dialect.type_compiler_instance.process(LargeBinary())


# (table attribute of Tables, column): the columns holding documents and JSON values.
_DOCUMENT_COLUMNS = (
    ("checkpoints", "document"),
    ("wait_records", "document"),
    ("wait_records", "event_payload"),
    ("step_cache", "value"),
    ("idempotency", "result"),
    ("context_changes", "value"),
)


def _lz4_documents(tables: Tables, dialect: Dialect) -> str:
    """PostgreSQL: compress documents with lz4 where the server has it (14+, built with
    lz4) instead of the default pglz: a 256 KB checkpoint's update took 2.5 ms with pglz
    and 1.0 ms with lz4 (docs/backends/postgres.md). Values written before keep their
    compression and stay readable. One ``DO`` block, so the check and the changes are
    one statement of the migration's transaction."""
    alters = "\n    ".join(
        f"ALTER TABLE {dialect.identifier_preparer.format_table(getattr(tables, table))} "
        f"ALTER COLUMN {column} SET COMPRESSION lz4;"
        for table, column in _DOCUMENT_COLUMNS
    )
    return (
        "DO $$ BEGIN\n"
        "  IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'"
        " AND 'lz4' = ANY (enumvals)) THEN\n"
        f"    {alters}\n"
        "  END IF;\n"
        "END $$"
    )


def _expiry_index(table: Table | None) -> Index:
    assert table is not None
    (index,) = (i for i in table.indexes if str(i.name).endswith("_gone_at"))
    return index


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "checkpoints, wait records, step cache, idempotency, locks, nonces", _v1),
    Migration(2, "lock fencing counters; context change streams", _v2),
    Migration(3, "partial expiry indexes; PostgreSQL: lz4-compressed documents", _v3),
    Migration(4, "checkpoint listing columns and index; wait deadline index", _v4),
    Migration(5, "idempotency owner tokens and payload fingerprints", _v5),
    Migration(6, "incremental checkpoint saves: checkpoint parts", _v6),
    Migration(7, "blind-index tokens of checkpoints, kept by triggers", _v7, _v7_then),
    Migration(8, "token triggers read documents holding a NUL escape", _v8, _v8_then),
)
assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


def _version_table(tables: Tables, dialect: Dialect) -> str:
    return dialect.identifier_preparer.format_table(tables.schema_version)


async def read_version(db: Database, tables: Tables, executor: Executor | None = None) -> int:
    """The schema version the database is at (0: siglo's tables are not there)."""
    fetch = executor.fetch if executor is not None else db.raw_fetch
    name = _version_table(tables, db.sa_dialect)
    if db.dialect_name == "postgresql":
        rows = await fetch(db.sql("SELECT to_regclass(:name) IS NOT NULL"), {"name": name})
        exists = bool(rows[0][0])
    else:
        rows = await fetch(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name",
            {"name": tables.schema_version.name},
        )
        exists = bool(rows)
    if not exists:
        return 0
    rows = await fetch(f"SELECT MAX(version) FROM {name}")
    return int(rows[0][0] or 0)


def _too_new(version: int, where: str) -> SchemaVersionError:
    exc = SchemaVersionError(
        f"the siglo schema of {where} is at version {version}, newer than this siglo "
        f"(schema version {SCHEMA_VERSION}); upgrade siglo to use this database"
    )
    exc.newer = True
    return exc


def check_target(target: int) -> None:
    """Refuse a migration target this siglo does not know."""
    if type(target) is not int or not 1 <= target <= SCHEMA_VERSION:
        raise InvalidArgumentError(
            f"no schema version {target!r}: this siglo knows versions 1 to {SCHEMA_VERSION}"
        )


_CREATED_MEANWHILE: Final = frozenset({"23505", "42P06", "42P07", "42710"})
"""SQLSTATEs of a ``CREATE … IF NOT EXISTS`` that met what another migrator had just
created: unique violation, duplicate schema, table, object."""
_ATTEMPTS: Final = 3


async def migrate(
    db: Database, prefix: str, schema: str | None, *, target: int = SCHEMA_VERSION
) -> tuple[int, int]:
    """Bring the database up to ``target``; returns ``(version before, version after)``.

    Safe to run from several processes at once. A database newer than ``target`` raises
    :class:`~siglo.errors.SchemaVersionError` and is left alone.
    """
    check_target(target)
    for attempt in range(_ATTEMPTS):
        try:
            return await _migrate_once(db, prefix, schema, target)
        except StorageAdapterError as exc:
            # PostgreSQL checks IF NOT EXISTS against the server connection's catalog
            # cache, which takes in other sessions' changes at a transaction's start
            # (and on table locks), not on an advisory lock: a connection that looked
            # the schema up as missing just before another migrator created it still
            # misses it after taking the migration lock (seen behind PgBouncer, which
            # hands server connections around). A new transaction sees it.
            state = getattr(exc.__cause__, "sqlstate", None)
            if state not in _CREATED_MEANWHILE or attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


async def _migrate_once(
    db: Database, prefix: str, schema: str | None, target: int
) -> tuple[int, int]:
    tables = build_tables(prefix, schema)
    dialect = db.sa_dialect
    name = _version_table(tables, dialect)
    async with db.raw_transaction() as tx:
        await db.migration_lock(tx, f"siglo-migrate:{schema or ''}:{prefix}")
        if schema is not None:
            await tx.fetch(
                f"CREATE SCHEMA IF NOT EXISTS {dialect.identifier_preparer.quote_schema(schema)}"
            )
        ddl = CreateTable(tables.schema_version, if_not_exists=True)
        await tx.fetch(str(ddl.compile(dialect=dialect)).strip())
        rows = await tx.fetch(f"SELECT MAX(version) FROM {name}")
        before = int(rows[0][0] or 0)
        if before > SCHEMA_VERSION:
            raise _too_new(before, db.description)
        if before > target:
            raise SchemaVersionError(
                f"the siglo schema of {db.description} is already at version {before}, past "
                f"the target version {target}; migrations only go forward"
            )
        for migration in MIGRATIONS[before:target]:
            for statement in migration.ddl(prefix, schema, dialect):
                await tx.fetch(statement)
            if migration.then is not None:
                await migration.then(tx, prefix, schema, dialect)
            await tx.fetch(
                db.sql(
                    f"INSERT INTO {name} (version, applied_at, description) "
                    "VALUES (:version, :applied_at, :description)"
                ),
                {
                    "version": migration.version,
                    "applied_at": system_clock.now_ms(),
                    "description": migration.description,
                },
            )
    return before, max(before, target)


async def ensure_schema(
    db: Database, prefix: str, schema: str | None, *, auto_migrate: bool
) -> None:
    """The start-up check: the schema must be this code's, or be migrated to it."""
    version = await read_version(db, build_tables(prefix, schema))
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise _too_new(version, db.description)
    if not auto_migrate:
        state = "has no siglo tables" if version == 0 else f"is at schema version {version}"
        raise SchemaVersionError(
            f"{db.description} {state}; this siglo needs schema version {SCHEMA_VERSION}. "
            "Run `siglo migrate URL`, or connect with auto_migrate=True"
        )
    await migrate(db, prefix, schema)
