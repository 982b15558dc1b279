"""The SQL text of every hot statement, built once per installation and dialect.

Each operation of the contract is one statement where it can be: a conditional upsert
(``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING``) or a conditional
``UPDATE … RETURNING``. Both SQLite (3.35+) and PostgreSQL accept the same text; the few
differences are parameters of :func:`build_statements`. ``now`` is always a parameter
(the injected clock), never the database's clock.

Parameters are named (``:now``, ``:id``), so a value used twice is bound once, and the
statements are grouped by table below. :func:`build_statements` converts every statement
to the driver's parameter style once, when a backend is connected
(:meth:`siglo_sql.database.Database.sql`); nothing is converted per call. Two are
templates completed per shape: ``cp_get_many`` (``{ids}``) and ``cp_list`` (``{where}``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Dialect

from siglo_sql.schema import ID_PREFIX, Tables

__all__ = [
    "LIVE",
    "Statements",
    "build_statements",
    "exact_match",
    "gone_digests",
    "many_ids",
    "new_bodies",
    "part_rows",
]

LIVE = "(gone_at IS NULL OR gone_at > :now)"
"""A row that has not expired at ``:now``."""


@dataclass(frozen=True)
class Statements:
    """SQL for one set of tables, in the driver's parameter style."""

    # checkpoints
    cp_insert_if_absent: str
    cp_save_forward: str
    cp_update_expected: str
    cp_current_revision: str
    cp_get: str
    cp_get_many: str
    """A template: ``{ids}`` stands for ``:id0, :id1, …`` (:func:`many_ids`), to be
    completed and converted with :meth:`~siglo_sql.database.Database.sql`."""
    cp_get_fallback: str
    cp_load: str
    """``cp_get`` with the checkpoint's parts: ``(document, parts, digest, body, version)``
    rows, one per part (one row with ``NULL`` digest and body for a document stored
    whole), in one statement, so the row and its parts are one snapshot; ``version`` as
    in ``parts_digests``."""
    cp_get_version: str
    """``cp_get`` with the row's version last: ``(document, parts, version)``, the version
    as in ``parts_digests`` (``NULL`` on SQLite). A load of a row whose bodies this adapter
    keeps reads it alone (siglo_sql.parts)."""
    cp_load_many: str
    """A template like ``cp_get_many``: ``(id, document, parts, digest, body, version)``
    rows."""
    cp_get_for_cancel: str
    cp_set_cancelled: str
    cp_clean_batch: str
    cp_list: str
    """A template: ``{where}`` stands for the walk's conditions (:mod:`siglo_sql.listing`),
    to be completed and converted with :meth:`~siglo_sql.database.Database.sql`."""
    cp_delete: str
    cp_delete_expected: str
    parts_digests: str
    """The digests of a checkpoint's stored parts and the row's version, read after its
    compare-and-set: ``(digest, version)`` rows, one per part (one row with a ``NULL``
    digest when it has none). The version is PostgreSQL's ``xmin`` (the transaction
    that wrote the row, as text; ``cp_update_parts`` compares it), ``NULL`` on SQLite."""
    cp_parts_saves: dict[str, str] | None
    """Where a statement's ``RETURNING`` reads within its write transaction (SQLite):
    ``cp_save_forward``, ``cp_insert_if_absent`` and ``cp_update_expected`` (the keys)
    answering, instead of ``1``, the hex digests of the row's stored parts run together
    (``NULL`` for none): an incremental save's compare-and-set and its read of what it
    replaces in one statement."""
    cp_update_parts: str | None
    """Where the dialect has writable CTEs (PostgreSQL): an incremental save of a row this
    adapter knows, in one statement (siglo_sql.parts): the compare-and-set of the row on
    its revision *and* the version it knows (``:version``), the insert of the new bodies
    (``{bodies}``: :func:`new_bodies`) and the delete of the dropped ones (``:dropped``);
    answers the new version, no row when refused. A template, to be completed and
    converted with :meth:`~siglo_sql.database.Database.sql`."""
    parts_get: str
    parts_some: str
    """A template: the bodies of some of a checkpoint's digests, ``{digests}`` standing
    for ``:gone0, :gone1, …`` (:func:`gone_digests`): ``(digest, body)`` rows."""
    parts_insert: str
    """A template: the new bodies of a save, ``{rows}`` standing for ``(:id, :digest0,
    :body0), …`` (:func:`part_rows`), to be completed and converted with
    :meth:`~siglo_sql.database.Database.sql`: one statement for all of them."""
    parts_delete: str
    """A template: the parts a save no longer names, ``{digests}`` standing for
    ``:gone0, :gone1, …`` (:func:`gone_digests`)."""
    parts_replace: str | None
    """SQLite: one part's row given a new digest and body (``:old`` the digest it
    had): a new body as long as a dropped one written over that row, in place
    (siglo_sql.parts). Without ``RETURNING``, which took an in-place update from 8 to
    16 us: the row is there (the save's compare-and-set read the digests stored in
    the same write transaction)."""
    cp_streamed: dict[str, str] | None
    """Where the dialect has writable CTEs: ``cp_save_forward``, ``cp_insert_if_absent``
    and ``cp_update_expected`` (the keys), each with one context change's ``ctx_set`` in
    front (``WITH ctx AS (…)``, its parameters named ``ctx_…``): a step's stream row and
    its checkpoint in one statement."""
    # wait records
    wait_upsert: str
    wait_latest_upsert: str
    wait_create: str
    wait_save_one: str | None
    """Both upserts in one statement (a data-modifying CTE), where the dialect has them."""
    wait_get: str
    wait_named: str
    """The key and stack of the records ``wait_get`` reads (``1``: by correlation key,
    ``2``: the stack's latest): only to name a document that cannot be read."""
    wait_state: str
    wait_claim: str
    wait_complete: str
    wait_release: str
    wait_cancel: str
    wait_cancel_stack: str
    wait_clean_batch: str
    wait_due: str
    wait_delete_stack: str
    wait_latest_delete_orphan: str
    wait_scan: str
    wait_swap: str
    wait_delete_listed: str
    # step cache
    cache_get: str
    cache_set: str
    cache_clean_batch: str
    cache_scan: str
    cache_swap: str
    cache_delete_listed: str
    # context stream
    ctx_drop_expired: str
    ctx_set: str
    ctx_delete: str
    ctx_touch: str
    ctx_get: str
    ctx_clean_batch: str
    ctx_delete_stack: str
    ctx_scan: str
    ctx_swap: str
    # idempotency
    idem_claim: str
    idem_state: str
    idem_complete: str
    idem_complete_owned: str
    idem_extend: str
    idem_fail: str
    idem_fail_owned: str
    idem_owned: str
    idem_result: str
    idem_clean_batch: str
    idem_scan: str
    idem_swap: str
    # locks
    lock_acquire: str
    lock_release: str
    lock_extend: str
    lock_inspect: str
    lock_clean_batch: str
    # nonces
    nonce_claim: str
    nonce_clean_batch: str


def many_ids(n: int) -> str:
    """The ``{ids}`` of ``cp_get_many`` for ``n`` ids: ``:id0, :id1, …``."""
    return ", ".join(f":id{i}" for i in range(n))


def part_rows(n: int) -> str:
    """The ``{rows}`` of ``parts_insert`` for ``n`` bodies: ``(:id, :digest0, :body0), …``."""
    return ", ".join(f"(:id, :digest{i}, :body{i})" for i in range(n))


def gone_digests(n: int) -> str:
    """The ``{digests}`` of ``parts_delete`` for ``n`` digests: ``:gone0, :gone1, …``."""
    return ", ".join(f":gone{i}" for i in range(n))


def new_bodies(n: int) -> str:
    """The ``{bodies}`` of ``cp_update_parts`` for ``n`` new bodies: ``VALUES (:digest0,
    :body0), …`` (no rows for none). One parameter each: the same bodies passed as two
    ``bytea[]`` arrays through ``unnest`` took 0.3 ms more per 16 KB body."""
    if not n:
        return "SELECT CAST(NULL AS bytea), CAST(NULL AS bytea) WHERE false"
    pairs = ", ".join(f"(CAST(:digest{i} AS bytea), CAST(:body{i} AS bytea))" for i in range(n))
    return f"VALUES {pairs}"


def exact_match(dialect_name: str) -> Callable[[str], str]:
    """How a query compares a whole id beside its indexed prefix ``substr(col, 1, N)``.

    SQLite propagates ``col = ?`` into ``substr(col, 1, N)``, which then no longer
    matches the expression index; ``+col`` (no index use, no propagation) keeps the
    index usable. PostgreSQL needs nothing of the kind.
    """
    return (lambda column: f"+{column}") if dialect_name == "sqlite" else (lambda column: column)


def build_statements(
    tables: Tables,
    dialect: Dialect,
    *,
    for_update: str,
    writable_ctes: bool,
    style: Callable[[str], str],
) -> Statements:
    """Statements for ``tables`` quoted for ``dialect``, in the driver's parameter style.

    ``for_update`` is the row-locking suffix of a read that a write in the same
    transaction depends on (``" FOR UPDATE"`` on PostgreSQL; ``""`` on SQLite, where
    ``BEGIN IMMEDIATE`` already holds the write lock). ``writable_ctes``: whether
    ``WITH … AS (INSERT …) INSERT …`` is allowed (PostgreSQL), which makes saving a wait
    record with its by-stack index one statement instead of a transaction. ``style``
    converts ``:name`` parameters to the driver's (:meth:`Database.sql`); it is applied
    here, once, to every statement but the two templates.
    """
    q = dialect.identifier_preparer
    exact = exact_match(dialect.name)

    def name(table: Table) -> str:
        return q.format_table(table)

    assert tables.context_changes is not None, "statements need the current schema"
    assert tables.checkpoint_parts is not None, "statements need the current schema"
    sections = (
        _checkpoints(name(tables.checkpoints), for_update),
        _checkpoint_parts(
            name(tables.checkpoints), name(tables.checkpoint_parts), writable_ctes=writable_ctes
        ),
        _checkpoint_loads(
            name(tables.checkpoints), name(tables.checkpoint_parts), writable_ctes=writable_ctes
        ),
        _wait_records(
            name(tables.wait_records),
            name(tables.wait_latest),
            name(tables.checkpoints),
            writable_ctes=writable_ctes,
        ),
        _step_cache(name(tables.step_cache)),
        _context_changes(name(tables.context_changes), exact),
        _idempotency(name(tables.idempotency)),
        _locks(name(tables.locks)),
        _nonces(name(tables.nonces)),
    )
    templates = {
        "cp_get_many",
        "cp_load_many",
        "cp_list",
        "cp_update_parts",
        "parts_insert",
        "parts_delete",
        "parts_some",
    }
    statements: dict[str, Any] = {}
    for section in sections:
        for key, text in section.items():
            statements[key] = text if text is None or key in templates else style(text)
    statements["cp_streamed"] = None
    statements["cp_parts_saves"] = None
    if not writable_ctes:
        named = {k: v for section in sections for k, v in section.items()}
        cp, parts = name(tables.checkpoints), name(tables.checkpoint_parts)
        stored = f"(SELECT group_concat(hex(digest), '') FROM {parts} WHERE {parts}.id = {cp}.id)"
        statements["cp_parts_saves"] = {
            key: style((named[key] or "").replace(" RETURNING 1", f" RETURNING {stored}"))
            for key in ("cp_save_forward", "cp_insert_if_absent", "cp_update_expected")
        }
    if writable_ctes:
        named = {k: v for section in sections for k, v in section.items()}
        ctx_set = _NAME.sub(r":ctx_\1", named["ctx_set"] or "")
        statements["cp_streamed"] = {
            key: style(f"WITH ctx AS ({ctx_set}) {named[key]}")
            for key in ("cp_save_forward", "cp_insert_if_absent", "cp_update_expected")
        }
    return Statements(**statements)


_NAME = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
"""A ``:name`` parameter (as :mod:`siglo_sql.database` finds them)."""


def _clean(table: str) -> str:
    # Bounded batches through the gone_at index; RETURNING counts what went. The expiry
    # is asked again of the row deleted: a row written over after the statement's
    # snapshot (a save, a claim, a new wait on the key of an expired one) is re-checked
    # by PostgreSQL against the outer WHERE alone, and the subquery's list still named it:
    # live rows written during a clean were deleted (a black-box auditor).
    return (
        f"DELETE FROM {table} WHERE id IN "
        f"(SELECT id FROM {table} WHERE gone_at <= :now LIMIT :limit) "
        "AND gone_at <= :now RETURNING 1"
    )


# -- checkpoints ---------------------------------------------------------------------------

CHECKPOINT_ROW = (
    ":id, :namespace, :stack_id, :revision, :status, :gone_at, :document, :workflow_id, "
    ":updated_at, :expires_at, :parts"
)
"""The parameters of a whole checkpoint row, in column order."""


def _checkpoints(cp: str, for_update: str) -> dict[str, str | None]:
    cols = (
        "(id, namespace, stack_id, revision, status, gone_at, document, workflow_id, "
        "updated_at, expires_at, parts)"
    )
    update = (
        "revision = excluded.revision, status = excluded.status, "
        "gone_at = excluded.gone_at, document = excluded.document, "
        "workflow_id = excluded.workflow_id, updated_at = excluded.updated_at, "
        "expires_at = excluded.expires_at, parts = excluded.parts"
    )
    # An expired row counts as absent: a save may replace it whatever its revision.
    expired = f"({cp}.gone_at IS NOT NULL AND {cp}.gone_at <= :now)"
    return {
        # expected_revision=0: no live checkpoint, or a live one stored at revision 0.
        "cp_insert_if_absent": (
            f"INSERT INTO {cp} {cols} VALUES ({CHECKPOINT_ROW}) "
            f"ON CONFLICT (id) DO UPDATE SET {update} "
            f"WHERE {expired} OR {cp}.revision = 0 RETURNING 1"
        ),
        "cp_save_forward": (
            f"INSERT INTO {cp} {cols} VALUES ({CHECKPOINT_ROW}) "
            f"ON CONFLICT (id) DO UPDATE SET {update} "
            f"WHERE {expired} OR {cp}.revision < excluded.revision RETURNING 1"
        ),
        "cp_update_expected": (
            f"UPDATE {cp} SET revision = :revision, status = :status, gone_at = :gone_at, "
            "document = :document, workflow_id = :workflow_id, updated_at = :updated_at, "
            "expires_at = :expires_at, parts = :parts "
            f"WHERE id = :id AND revision = :expected AND {LIVE} RETURNING 1"
        ),
        "cp_current_revision": f"SELECT revision FROM {cp} WHERE id = :id AND {LIVE}",
        # parts: NULL for a document stored whole, else its contexts' digests
        # (siglo_sql.parts), read from checkpoint_parts when it is not.
        "cp_get": f"SELECT document, parts FROM {cp} WHERE id = :id AND {LIVE}",
        # Concurrent cp_get lookups in one statement (siglo_sql.batching).
        "cp_get_many": (f"SELECT id, document, parts FROM {cp} WHERE id IN ({{ids}}) AND {LIVE}"),
        # The namespaced checkpoint first, else the un-namespaced one (seed 001 §5).
        "cp_get_fallback": (
            f"SELECT document, parts, id FROM {cp} WHERE id IN (:id, :fallback_id) AND {LIVE} "
            "ORDER BY namespace = '' LIMIT 1"
        ),
        "cp_get_for_cancel": (f"SELECT document FROM {cp} WHERE id = :id AND {LIVE}{for_update}"),
        "cp_set_cancelled": (
            f"UPDATE {cp} SET revision = :revision, status = 'cancelled', "
            "document = :document, updated_at = :updated_at WHERE id = :id"
        ),
        "cp_clean_batch": _clean(cp),
        # Keyset pages in id order: the primary key, or (namespace prefix, id) for one
        # namespace. The {where} conditions are siglo_sql.listing's.
        "cp_list": (
            "SELECT namespace, stack_id, workflow_id, status, revision, updated_at, "
            f"expires_at, id FROM {cp} WHERE {{where}} AND {LIVE} ORDER BY id LIMIT :limit"
        ),
        # RETURNING gone_at: whether the row deleted was live (an expired one goes too).
        "cp_delete": f"DELETE FROM {cp} WHERE id = :id RETURNING gone_at",
        "cp_delete_expected": (
            f"DELETE FROM {cp} WHERE id = :id AND revision = :expected AND {LIVE} RETURNING gone_at"
        ),
    }


def _checkpoint_loads(cp: str, parts: str, *, writable_ctes: bool) -> dict[str, str | None]:
    # The checkpoint row and its parts in one statement: a load of a document saved in
    # parts took a second statement (on PostgreSQL a second round trip) to read them.
    # The row's columns repeat on each part's row; the skeleton is small. Last, the
    # row's version (PostgreSQL's xmin, as parts_digests reads it): a save of what was
    # loaded can then be one statement (cp_update_parts).
    join = f"FROM {cp} c LEFT JOIN {parts} p ON c.parts IS NOT NULL AND p.id = c.id"
    version = "c.xmin::text" if writable_ctes else "NULL"
    return {
        # The row alone with its version: what a load of a row whose bodies are kept
        # reads (a few hundred bytes instead of the bodies).
        "cp_get_version": (
            f"SELECT c.document, c.parts, {version} FROM {cp} c WHERE c.id = :id AND {LIVE}"
        ),
        "cp_load": (
            f"SELECT c.document, c.parts, p.digest, p.body, {version} {join} "
            f"WHERE c.id = :id AND {LIVE}"
        ),
        "cp_load_many": (
            f"SELECT c.id, c.document, c.parts, p.digest, p.body, {version} {join} "
            f"WHERE c.id IN ({{ids}}) AND {LIVE}"
        ),
    }


def _checkpoint_parts(cp: str, parts: str, *, writable_ctes: bool) -> dict[str, str | None]:
    # PostgreSQL's xmin names the version of a row: the transaction that wrote it, which
    # no later write of the row keeps (SQLite has nothing like it, nor needs it: there
    # the save's transaction reads the digests in-process for a few microseconds).
    version = "c.xmin::text" if writable_ctes else "NULL"
    out: dict[str, str | None] = {
        "parts_digests": (
            f"SELECT p.digest, {version} FROM {cp} c LEFT JOIN {parts} p ON p.id = c.id "
            "WHERE c.id = :id"
        ),
        "parts_get": f"SELECT digest, body FROM {parts} WHERE id = :id",
        "parts_some": (
            f"SELECT digest, body FROM {parts} WHERE id = :id AND digest IN ({{digests}})"
        ),
        # A digest names its body: a row already there is the same bytes.
        "parts_insert": (
            f"INSERT INTO {parts} (id, digest, body) VALUES {{rows}} "
            "ON CONFLICT (id, digest) DO NOTHING"
        ),
        "parts_delete": f"DELETE FROM {parts} WHERE id = :id AND digest IN ({{digests}})",
        "cp_update_parts": None,
        "parts_replace": None,
    }
    if not writable_ctes:
        # SQLite writes a row whose new record is as long as its old one over the old
        # one, page by page, and only the pages whose bytes differ: a changed 16 KB
        # context as long as the one it replaces costs its changed pages, where the
        # insert and the delete of two rows also rewrote the table's and the freelist's
        # pages (22 WAL frames a save against 11, issue 34).
        out["parts_replace"] = (
            f"UPDATE {parts} SET digest = :digest, body = :body WHERE id = :id AND digest = :old"
        )
    if writable_ctes:
        # One statement, one round trip, its own transaction. Its parts are those of the
        # version the saver knows: a row whose xmin is :version was written by the
        # transaction that stored them, committed before this statement's snapshot, and
        # nothing has written the row since (a later write would have a later xmin; the
        # compare-and-set re-checks it on the newest version after waiting for a lock).
        # So the snapshot's parts of that id are the ones the saver knows, and the new
        # bodies and dropped digests it sends are exactly what changes.
        out["cp_update_parts"] = (
            f"WITH up AS (UPDATE {cp} SET revision = :revision, status = :status, "
            "gone_at = :gone_at, document = :document, workflow_id = :workflow_id, "
            "updated_at = :updated_at, expires_at = :expires_at, parts = :parts "
            f"WHERE id = :id AND revision = :expected AND {LIVE} "
            "AND xmin = CAST(:version AS xid) RETURNING id, xmin), "
            f"ins AS (INSERT INTO {parts} (id, digest, body) SELECT up.id, n.digest, n.body "
            "FROM up, ({bodies}) AS n(digest, body) ON CONFLICT (id, digest) DO NOTHING), "
            f"del AS (DELETE FROM {parts} p USING up WHERE p.id = up.id "
            "AND p.digest = ANY(CAST(:dropped AS bytea[]))) "
            "SELECT xmin::text FROM up"
        )
    return out


# -- wait records --------------------------------------------------------------------------

STATE_COLUMNS = "status, claimant_id, claimed_at, lease_expires_at, completed_at, event_payload"
"""A wait record's state columns, after its document in every row read back."""


def _wait_records(w: str, wl: str, cp: str, *, writable_ctes: bool) -> dict[str, str | None]:
    wait_cols = f"document, {STATE_COLUMNS}"
    wait_cols_r = "r.document, " + ", ".join("r." + c.strip() for c in STATE_COLUMNS.split(","))
    upsert = (
        f"INSERT INTO {w} (id, correlation_key, stack_id, namespace, stack_ref, status, "
        "deadline, claimant_id, claimed_at, lease_expires_at, completed_at, event_payload, "
        "gone_at, document) VALUES (:id, :correlation_key, :stack_id, :namespace, "
        ":stack_ref, :status, :deadline, :claimant_id, :claimed_at, :lease_expires_at, "
        ":completed_at, :event_payload, :gone_at, :document) "
        "ON CONFLICT (id) DO UPDATE SET stack_id = excluded.stack_id, "
        "namespace = excluded.namespace, stack_ref = excluded.stack_ref, "
        "status = excluded.status, deadline = excluded.deadline, "
        "claimant_id = excluded.claimant_id, claimed_at = excluded.claimed_at, "
        "lease_expires_at = excluded.lease_expires_at, "
        "completed_at = excluded.completed_at, event_payload = excluded.event_payload, "
        "gone_at = excluded.gone_at, document = excluded.document"
    )
    # An import's create: the same row, written only where no live row has the id (an
    # expired one is replaced). RETURNING says whether it was written.
    create = (
        upsert.replace(f"INSERT INTO {w} ", f"INSERT INTO {w} AS t ", 1)
        + " WHERE t.gone_at IS NOT NULL AND t.gone_at <= :now RETURNING 1"
    )
    latest_upsert = (
        f"INSERT INTO {wl} (id, stack_id, wait_id) VALUES (:latest_id, :stack_id, :id) "
        "ON CONFLICT (id) DO UPDATE SET wait_id = excluded.wait_id"
    )
    return {
        "wait_upsert": upsert,
        "wait_latest_upsert": latest_upsert,
        "wait_create": create,
        "wait_save_one": (
            f"WITH saved AS ({upsert} RETURNING 1) {latest_upsert}" if writable_ctes else None
        ),
        # By correlation key, else the record most recently saved for the stack id, else
        # the un-namespaced checkpoint (whose metadata may embed a wait record).
        "wait_get": (
            f"SELECT 1, {wait_cols} FROM {w} WHERE id = :id AND {LIVE} "
            f"UNION ALL SELECT 2, {wait_cols_r} FROM {wl} l JOIN {w} r ON r.id = l.wait_id "
            "WHERE l.id = :id AND (r.gone_at IS NULL OR r.gone_at > :now) "
            f"UNION ALL SELECT 3, document, NULL, NULL, NULL, NULL, NULL, NULL FROM {cp} "
            f"WHERE id = :checkpoint_id AND {LIVE} ORDER BY 1 LIMIT 1"
        ),
        "wait_named": (
            f"SELECT 1, correlation_key, stack_id FROM {w} WHERE id = :id "
            f"UNION ALL SELECT 2, r.correlation_key, r.stack_id FROM {wl} l "
            f"JOIN {w} r ON r.id = l.wait_id WHERE l.id = :id"
        ),
        "wait_state": f"SELECT status, claimant_id FROM {w} WHERE id = :id AND {LIVE}",
        "wait_claim": (
            f"UPDATE {w} SET status = 'claimed', claimant_id = :claimant_id, "
            "claimed_at = :now, lease_expires_at = :lease_expires_at, "
            "event_payload = COALESCE(:event_payload, event_payload) "
            f"WHERE id = :id AND {LIVE} AND (status = 'waiting' OR "
            "(status = 'claimed' AND (claimant_id = :claimant_id OR "
            "(lease_expires_at IS NOT NULL AND lease_expires_at <= :now)))) "
            "AND (:allow_expired OR deadline IS NULL OR deadline > :now) "
            f"RETURNING {wait_cols}"
        ),
        "wait_complete": (
            f"UPDATE {w} SET status = 'completed', completed_at = :now WHERE id = :id "
            f"AND {LIVE} AND status = 'claimed' AND claimant_id = :claimant_id RETURNING 1"
        ),
        "wait_release": (
            f"UPDATE {w} SET status = 'waiting', claimant_id = NULL, claimed_at = NULL, "
            f"lease_expires_at = NULL WHERE id = :id AND {LIVE} AND status = 'claimed' "
            "AND claimant_id = :claimant_id RETURNING 1"
        ),
        "wait_cancel": (
            f"UPDATE {w} SET status = 'cancelled' WHERE id = :id AND {LIVE} "
            "AND status IN ('waiting', 'claimed') RETURNING 1"
        ),
        "wait_cancel_stack": (
            f"UPDATE {w} SET status = 'cancelled' WHERE stack_ref = :stack_ref "
            f"AND {LIVE} AND status IN ('waiting', 'claimed') RETURNING 1"
        ),
        "wait_clean_batch": _clean(w),
        # Through the partial deadline index (its conditions repeated, so the planner
        # sees it applies); a claim whose lease ran out is due again.
        # With the record's key, stack and namespace: a document that cannot be read is
        # named (siglo_sql.rows.due_wait_from_row).
        "wait_due": (
            f"SELECT {wait_cols}, correlation_key, stack_id, namespace FROM {w} "
            "WHERE deadline IS NOT NULL AND deadline <= :now "
            f"AND status IN ('waiting', 'claimed') AND {LIVE} "
            "AND (status = 'waiting' OR (lease_expires_at IS NOT NULL "
            "AND lease_expires_at <= :now)) ORDER BY deadline, correlation_key LIMIT :limit"
        ),
        "wait_delete_stack": f"DELETE FROM {w} WHERE stack_ref = :stack_ref RETURNING id",
        "wait_latest_delete_orphan": (
            f"DELETE FROM {wl} WHERE id = :latest_id AND NOT EXISTS "
            f"(SELECT 1 FROM {w} WHERE {w}.id = {wl}.wait_id)"
        ),
        # siglo rekey: a keyset walk of the live records, and a rewrite of one's payloads
        # only if its document and event payload are still the bytes read (a claim or
        # a completion in between changes the row: the rewrite does nothing).
        "wait_scan": (
            f"SELECT id, document, event_payload FROM {w} WHERE id > :after AND {LIVE} "
            "ORDER BY id LIMIT :limit"
        ),
        "wait_swap": (
            f"UPDATE {w} SET document = :document, event_payload = :event_payload "
            "WHERE id = :id AND document = :old_document AND (event_payload = :old_payload "
            f"OR (event_payload IS NULL AND :old_null = 1)) AND {LIVE} RETURNING 1"
        ),
        # siglo erase: the record removed only if it still holds the bytes listed (the
        # compare of wait_swap), in one statement.
        "wait_delete_listed": (
            f"DELETE FROM {w} WHERE id = :id AND document = :old_document AND (event_payload "
            f"= :old_payload OR (event_payload IS NULL AND :old_null = 1)) AND {LIVE} "
            "RETURNING 1"
        ),
    }


# -- step cache ----------------------------------------------------------------------------


def _step_cache(sc: str) -> dict[str, str | None]:
    return {
        "cache_get": f"SELECT value FROM {sc} WHERE id = :id AND gone_at > :now",
        "cache_set": (
            f"INSERT INTO {sc} (id, key, gone_at, value) VALUES (:id, :key, :gone_at, :value) "
            "ON CONFLICT (id) DO UPDATE SET gone_at = excluded.gone_at, value = excluded.value"
        ),
        "cache_clean_batch": _clean(sc),
        # siglo rekey: a keyset walk of the live entries, and a rewrite of one only if
        # it still holds the value read (the compare-and-set of swap_payload).
        "cache_scan": (
            f"SELECT id, key, value FROM {sc} WHERE id > :after AND gone_at > :now "
            "ORDER BY id LIMIT :limit"
        ),
        "cache_swap": (
            f"UPDATE {sc} SET value = :value WHERE id = :id AND value = :old_value "
            "AND gone_at > :now RETURNING 1"
        ),
        # siglo erase: the entry removed only if it still holds the value listed.
        "cache_delete_listed": (
            f"DELETE FROM {sc} WHERE id = :id AND value = :old_value AND gone_at > :now RETURNING 1"
        ),
    }


# -- context streams -----------------------------------------------------------------------


def _context_changes(cx: str, exact: Callable[[str], str]) -> dict[str, str | None]:
    return {
        "ctx_drop_expired": f"DELETE FROM {cx} WHERE stream = :stream AND gone_at <= :now",
        "ctx_set": (
            f"INSERT INTO {cx} (id, stream, namespace, stack_id, step_id, field, value, "
            "gone_at) VALUES (:id, :stream, :namespace, :stack_id, :step_id, :field, :value, "
            ":gone_at) ON CONFLICT (id) "
            "DO UPDATE SET value = excluded.value, gone_at = excluded.gone_at"
        ),
        "ctx_delete": f"DELETE FROM {cx} WHERE id = :id",
        "ctx_touch": f"UPDATE {cx} SET gone_at = :gone_at WHERE stream = :stream",
        "ctx_get": f"SELECT field, value FROM {cx} WHERE stream = :stream AND {LIVE}",
        "ctx_clean_batch": _clean(cx),
        "ctx_delete_stack": (
            f"DELETE FROM {cx} WHERE substr(stack_id, 1, {ID_PREFIX}) = :stack_id_prefix "
            f"AND {exact('stack_id')} = :stack_id AND namespace = :namespace"
        ),
        # siglo rekey: a keyset walk of the live values, and a rewrite of one only if it
        # still holds the value read (the compare-and-set of swap_payload): a change
        # streamed meanwhile is never overwritten, and the stream's expiry stays.
        "ctx_scan": (
            f"SELECT id, namespace, stack_id, step_id, field, value FROM {cx} "
            f"WHERE id > :after AND {LIVE} ORDER BY id LIMIT :limit"
        ),
        "ctx_swap": (
            f"UPDATE {cx} SET value = :value WHERE id = :id AND value = :old_value "
            f"AND {LIVE} RETURNING 1"
        ),
    }


# -- idempotency keys ----------------------------------------------------------------------


def _idempotency(idem: str) -> dict[str, str | None]:
    # A live key held by an owned claim: token-less complete and fail must not touch it.
    owned = f"{idem}.state = 'in-progress' AND {idem}.owner IS NOT NULL AND {idem}.gone_at > :now"
    return {
        "idem_claim": (
            f"INSERT INTO {idem} (id, key, state, result, gone_at, owner, fingerprint) "
            "VALUES (:id, :key, 'in-progress', NULL, :gone_at, :owner, :fingerprint) "
            "ON CONFLICT (id) DO UPDATE SET state = 'in-progress', result = NULL, "
            "gone_at = excluded.gone_at, owner = excluded.owner, "
            f"fingerprint = excluded.fingerprint WHERE {idem}.gone_at <= :now RETURNING 1"
        ),
        "idem_state": f"SELECT state, fingerprint FROM {idem} WHERE id = :id AND gone_at > :now",
        # Token-less (the seed's complete): upsert unless an owned claim holds the key; a
        # live key's fingerprint stays with the result.
        "idem_complete": (
            f"INSERT INTO {idem} (id, key, state, result, gone_at, owner, fingerprint) "
            "VALUES (:id, :key, 'completed', :result, :gone_at, NULL, NULL) "
            "ON CONFLICT (id) DO UPDATE SET state = 'completed', result = excluded.result, "
            "gone_at = excluded.gone_at, owner = NULL, "
            f"fingerprint = CASE WHEN {idem}.gone_at > :now THEN {idem}.fingerprint END "
            f"WHERE NOT ({owned}) RETURNING 1"
        ),
        "idem_complete_owned": (
            f"UPDATE {idem} SET state = 'completed', result = :result, gone_at = :gone_at, "
            "owner = NULL WHERE id = :id AND state = 'in-progress' AND owner = :owner "
            "AND gone_at > :now RETURNING 1"
        ),
        "idem_extend": (
            f"UPDATE {idem} SET gone_at = :gone_at WHERE id = :id AND state = 'in-progress' "
            "AND owner = :owner AND gone_at > :now RETURNING 1"
        ),
        "idem_fail": (
            f"DELETE FROM {idem} WHERE id = :id AND state = 'in-progress' AND gone_at > :now "
            "AND owner IS NULL RETURNING 1"
        ),
        "idem_fail_owned": (
            f"DELETE FROM {idem} WHERE id = :id AND state = 'in-progress' AND owner = :owner "
            "AND gone_at > :now RETURNING 1"
        ),
        "idem_owned": f"SELECT 1 FROM {idem} WHERE id = :id AND {owned}",
        "idem_result": (
            f"SELECT result FROM {idem} WHERE id = :id AND state = 'completed' AND gone_at > :now"
        ),
        "idem_clean_batch": _clean(idem),
        # siglo rekey: the completed keys, and a rewrite of a result only if the key is
        # still completed with the bytes read (expiry and fingerprint kept).
        "idem_scan": (
            f"SELECT id, key, result FROM {idem} WHERE id > :after AND state = 'completed' "
            "AND gone_at > :now ORDER BY id LIMIT :limit"
        ),
        "idem_swap": (
            f"UPDATE {idem} SET result = :result WHERE id = :id AND state = 'completed' "
            "AND result = :old_result AND gone_at > :now RETURNING 1"
        ),
    }


# -- locks ---------------------------------------------------------------------------------


def _locks(lk: str) -> dict[str, str | None]:
    return {
        # The row outlives its holders so that the fencing counter only goes up.
        "lock_acquire": (
            f"INSERT INTO {lk} (id, scope, key, token, gone_at, fence) "
            "VALUES (:id, :scope, :key, :token, :gone_at, 1) "
            "ON CONFLICT (id) DO UPDATE SET token = excluded.token, "
            f"gone_at = excluded.gone_at, fence = {lk}.fence + 1 "
            f"WHERE {lk}.token IS NULL OR {lk}.gone_at <= :now RETURNING fence"
        ),
        "lock_release": (
            f"UPDATE {lk} SET token = NULL, gone_at = NULL WHERE id = :id "
            "AND token = :token AND gone_at > :now RETURNING 1"
        ),
        "lock_extend": (
            f"UPDATE {lk} SET gone_at = :gone_at WHERE id = :id AND token = :token "
            "AND gone_at > :now RETURNING 1"
        ),
        # Read-only: a lapsed lease (gone_at passed, not yet freed) reads as no holder.
        "lock_inspect": (
            f"SELECT token, gone_at - :now, fence FROM {lk} WHERE id = :id "
            "AND token IS NOT NULL AND gone_at > :now"
        ),
        # Expired leases are freed, never deleted: the fence must survive.
        # Only the public lock's scope: workflow-lock leases run on wall time, not on the
        # injected clock the clean-up compares with.
        "lock_clean_batch": (
            f"UPDATE {lk} SET token = NULL, gone_at = NULL WHERE id IN "
            f"(SELECT id FROM {lk} WHERE gone_at <= :now AND scope = 'lock' LIMIT :limit) "
            # Asked again of the row freed, as _clean does: a lock taken again after
            # the statement's snapshot was freed under its new holder (two holders).
            "AND gone_at <= :now AND scope = 'lock' RETURNING 1"
        ),
    }


# -- nonces --------------------------------------------------------------------------------


def _nonces(nc: str) -> dict[str, str | None]:
    return {
        "nonce_claim": (
            f"INSERT INTO {nc} (id, key, gone_at) VALUES (:id, :key, :gone_at) "
            f"ON CONFLICT (id) DO UPDATE SET gone_at = excluded.gone_at "
            f"WHERE {nc}.gone_at <= :now RETURNING 1"
        ),
        "nonce_clean_batch": _clean(nc),
    }
