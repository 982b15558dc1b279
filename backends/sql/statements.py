"""The SQL text of every hot statement, built once per installation and dialect.

Each operation of the contract is one statement where it can be: a conditional upsert
(``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING``) or a conditional
``UPDATE … RETURNING``. Both SQLite (3.35+) and PostgreSQL accept the same text; the few
differences are parameters of :func:`build_statements`. ``now`` is always a parameter
(the injected clock), never the database's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Table
from sqlalchemy.engine import Dialect

from siglo.backends.sql.schema import Tables

__all__ = ["Statements", "build_statements"]

LIVE = "(gone_at IS NULL OR gone_at > ?)"


@dataclass(frozen=True)
class Statements:
    """SQL for one set of tables, with ``?`` placeholders."""

    # checkpoints
    cp_insert_if_absent: str
    cp_save_forward: str
    cp_update_expected: str
    cp_current_revision: str
    cp_get: str
    cp_get_fallback: str
    cp_get_for_cancel: str
    cp_set_cancelled: str
    cp_clean_batch: str
    # wait records
    wait_upsert: str
    wait_latest_upsert: str
    wait_get: str
    wait_state: str
    wait_claim: str
    wait_complete: str
    wait_cancel: str
    wait_cancel_stack: str
    wait_clean_batch: str
    # step cache
    cache_get: str
    cache_set: str
    cache_clean_batch: str
    # context stream
    ctx_drop_expired: str
    ctx_set: str
    ctx_delete: str
    ctx_touch: str
    ctx_get: str
    ctx_clean_batch: str
    # idempotency
    idem_claim: str
    idem_state: str
    idem_complete: str
    idem_fail: str
    idem_result: str
    idem_clean_batch: str
    # locks
    lock_acquire: str
    lock_release: str
    lock_extend: str
    lock_clean_batch: str
    # nonces
    nonce_claim: str
    nonce_clean_batch: str


def build_statements(tables: Tables, dialect: Dialect, *, for_update: str) -> Statements:
    """Statements for ``tables`` quoted for ``dialect``.

    ``for_update`` is the row-locking suffix of a read that a write in the same
    transaction depends on (``" FOR UPDATE"`` on PostgreSQL; ``""`` on SQLite, where
    ``BEGIN IMMEDIATE`` already holds the write lock).
    """
    q = dialect.identifier_preparer

    def name(table: Table) -> str:
        return q.format_table(table)

    cp = name(tables.checkpoints)
    w = name(tables.wait_records)
    wl = name(tables.wait_latest)
    sc = name(tables.step_cache)
    idem = name(tables.idempotency)
    lk = name(tables.locks)
    nc = name(tables.nonces)
    assert tables.context_changes is not None, "statements need the current schema"
    cx = name(tables.context_changes)

    cp_cols = "(namespace, stack_id, revision, status, gone_at, document)"
    cp_set = (
        "revision = excluded.revision, status = excluded.status, "
        "gone_at = excluded.gone_at, document = excluded.document"
    )
    # An expired row counts as absent: a save may replace it whatever its revision.
    cp_expired = f"({cp}.gone_at IS NOT NULL AND {cp}.gone_at <= ?)"
    wait_cols = (
        "document, status, claimant_id, claimed_at, lease_expires_at, completed_at, event_payload"
    )

    def clean(table: str, key: str) -> str:
        # Bounded batches through the gone_at index; RETURNING counts what went.
        return (
            f"DELETE FROM {table} WHERE ({key}) IN "
            f"(SELECT {key} FROM {table} WHERE gone_at <= ? LIMIT ?) RETURNING 1"
        )

    return Statements(
        cp_insert_if_absent=(
            f"INSERT INTO {cp} {cp_cols} VALUES (?, ?, ?, ?, ?, ?) "
            f"ON CONFLICT (namespace, stack_id) DO UPDATE SET {cp_set} "
            f"WHERE {cp_expired} RETURNING 1"
        ),
        cp_save_forward=(
            f"INSERT INTO {cp} {cp_cols} VALUES (?, ?, ?, ?, ?, ?) "
            f"ON CONFLICT (namespace, stack_id) DO UPDATE SET {cp_set} "
            f"WHERE {cp_expired} OR {cp}.revision < excluded.revision RETURNING 1"
        ),
        cp_update_expected=(
            f"UPDATE {cp} SET revision = ?, status = ?, gone_at = ?, document = ? "
            f"WHERE namespace = ? AND stack_id = ? AND revision = ? AND {LIVE} RETURNING 1"
        ),
        cp_current_revision=(
            f"SELECT revision FROM {cp} WHERE namespace = ? AND stack_id = ? AND {LIVE}"
        ),
        cp_get=(f"SELECT document FROM {cp} WHERE namespace = ? AND stack_id = ? AND {LIVE}"),
        # The namespaced checkpoint first, else the un-namespaced one (seed 001 §5).
        cp_get_fallback=(
            f"SELECT document FROM {cp} WHERE namespace IN (?, '') AND stack_id = ? "
            f"AND {LIVE} ORDER BY namespace = '' LIMIT 1"
        ),
        cp_get_for_cancel=(
            f"SELECT document FROM {cp} WHERE namespace = ? AND stack_id = ? AND {LIVE}{for_update}"
        ),
        cp_set_cancelled=(
            f"UPDATE {cp} SET revision = ?, status = 'cancelled', document = ? "
            f"WHERE namespace = ? AND stack_id = ?"
        ),
        cp_clean_batch=clean(cp, "namespace, stack_id"),
        wait_upsert=(
            f"INSERT INTO {w} (correlation_key, stack_id, namespace, status, deadline, "
            "claimant_id, claimed_at, lease_expires_at, completed_at, event_payload, gone_at, "
            "document) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (correlation_key) DO UPDATE SET stack_id = excluded.stack_id, "
            "namespace = excluded.namespace, status = excluded.status, "
            "deadline = excluded.deadline, claimant_id = excluded.claimant_id, "
            "claimed_at = excluded.claimed_at, lease_expires_at = excluded.lease_expires_at, "
            "completed_at = excluded.completed_at, event_payload = excluded.event_payload, "
            "gone_at = excluded.gone_at, document = excluded.document"
        ),
        wait_latest_upsert=(
            f"INSERT INTO {wl} (stack_id, correlation_key) VALUES (?, ?) "
            "ON CONFLICT (stack_id) DO UPDATE SET correlation_key = excluded.correlation_key"
        ),
        # By correlation key, else the record most recently saved for the stack id, else
        # the un-namespaced checkpoint (whose metadata may embed a wait record).
        wait_get=(
            f"SELECT 1, {wait_cols} FROM {w} WHERE correlation_key = ? AND {LIVE} "
            f"UNION ALL SELECT 2, {', '.join('r.' + c.strip() for c in wait_cols.split(','))} "
            f"FROM {wl} l JOIN {w} r ON r.correlation_key = l.correlation_key "
            "WHERE l.stack_id = ? AND (r.gone_at IS NULL OR r.gone_at > ?) "
            f"UNION ALL SELECT 3, document, NULL, NULL, NULL, NULL, NULL, NULL FROM {cp} "
            f"WHERE namespace = '' AND stack_id = ? AND {LIVE} ORDER BY 1 LIMIT 1"
        ),
        wait_state=(f"SELECT status, claimant_id FROM {w} WHERE correlation_key = ? AND {LIVE}"),
        wait_claim=(
            f"UPDATE {w} SET status = 'claimed', claimant_id = ?, claimed_at = ?, "
            "lease_expires_at = ?, event_payload = COALESCE(?, event_payload) "
            f"WHERE correlation_key = ? AND {LIVE} AND (status = 'waiting' OR "
            "(status = 'claimed' AND (claimant_id = ? OR "
            "(lease_expires_at IS NOT NULL AND lease_expires_at <= ?)))) "
            "AND (? OR deadline IS NULL OR deadline > ?) "
            f"RETURNING {wait_cols}"
        ),
        wait_complete=(
            f"UPDATE {w} SET status = 'completed', completed_at = ? "
            f"WHERE correlation_key = ? AND {LIVE} AND status = 'claimed' AND claimant_id = ? "
            "RETURNING 1"
        ),
        wait_cancel=(
            f"UPDATE {w} SET status = 'cancelled' WHERE correlation_key = ? AND {LIVE} "
            "AND status IN ('waiting', 'claimed') RETURNING 1"
        ),
        wait_cancel_stack=(
            f"UPDATE {w} SET status = 'cancelled' WHERE stack_id = ? AND namespace = ? "
            f"AND {LIVE} AND status IN ('waiting', 'claimed') RETURNING 1"
        ),
        wait_clean_batch=clean(w, "correlation_key"),
        cache_get=f"SELECT value FROM {sc} WHERE key = ? AND gone_at > ?",
        cache_set=(
            f"INSERT INTO {sc} (key, gone_at, value) VALUES (?, ?, ?) ON CONFLICT (key) "
            "DO UPDATE SET gone_at = excluded.gone_at, value = excluded.value"
        ),
        cache_clean_batch=clean(sc, "key"),
        ctx_drop_expired=(
            f"DELETE FROM {cx} WHERE namespace = ? AND stack_id = ? AND step_id = ? "
            "AND gone_at <= ?"
        ),
        ctx_set=(
            f"INSERT INTO {cx} (namespace, stack_id, step_id, field, value, gone_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, stack_id, step_id, field) "
            "DO UPDATE SET value = excluded.value, gone_at = excluded.gone_at"
        ),
        ctx_delete=(
            f"DELETE FROM {cx} WHERE namespace = ? AND stack_id = ? AND step_id = ? AND field = ?"
        ),
        ctx_touch=(
            f"UPDATE {cx} SET gone_at = ? WHERE namespace = ? AND stack_id = ? AND step_id = ?"
        ),
        ctx_get=(
            f"SELECT field, value FROM {cx} WHERE namespace = ? AND stack_id = ? "
            f"AND step_id = ? AND {LIVE}"
        ),
        ctx_clean_batch=clean(cx, "namespace, stack_id, step_id, field"),
        idem_claim=(
            f"INSERT INTO {idem} (key, state, result, gone_at) VALUES (?, 'in-progress', NULL, ?) "
            "ON CONFLICT (key) DO UPDATE SET state = 'in-progress', result = NULL, "
            f"gone_at = excluded.gone_at WHERE {idem}.gone_at <= ? RETURNING 1"
        ),
        idem_state=f"SELECT state FROM {idem} WHERE key = ? AND gone_at > ?",
        idem_complete=(
            f"INSERT INTO {idem} (key, state, result, gone_at) VALUES (?, 'completed', ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET state = 'completed', result = excluded.result, "
            "gone_at = excluded.gone_at"
        ),
        idem_fail=(
            f"DELETE FROM {idem} WHERE key = ? AND state = 'in-progress' AND gone_at > ? "
            "RETURNING 1"
        ),
        idem_result=(
            f"SELECT result FROM {idem} WHERE key = ? AND state = 'completed' AND gone_at > ?"
        ),
        idem_clean_batch=clean(idem, "key"),
        # The row outlives its holders so that the fencing counter only goes up.
        lock_acquire=(
            f"INSERT INTO {lk} (scope, key, token, gone_at, fence) VALUES (?, ?, ?, ?, 1) "
            "ON CONFLICT (scope, key) DO UPDATE SET token = excluded.token, "
            f"gone_at = excluded.gone_at, fence = {lk}.fence + 1 "
            f"WHERE {lk}.token IS NULL OR {lk}.gone_at <= ? RETURNING fence"
        ),
        lock_release=(
            f"UPDATE {lk} SET token = NULL, gone_at = NULL WHERE scope = ? AND key = ? "
            "AND token = ? AND gone_at > ? RETURNING 1"
        ),
        lock_extend=(
            f"UPDATE {lk} SET gone_at = ? WHERE scope = ? AND key = ? AND token = ? "
            "AND gone_at > ? RETURNING 1"
        ),
        # Expired leases are freed, never deleted: the fence must survive.
        lock_clean_batch=(
            f"UPDATE {lk} SET token = NULL, gone_at = NULL WHERE (scope, key) IN "
            f"(SELECT scope, key FROM {lk} WHERE gone_at <= ? LIMIT ?) RETURNING 1"
        ),
        nonce_claim=(
            f"INSERT INTO {nc} (key, gone_at) VALUES (?, ?) ON CONFLICT (key) "
            f"DO UPDATE SET gone_at = excluded.gone_at WHERE {nc}.gone_at <= ? RETURNING 1"
        ),
        nonce_clean_batch=clean(nc, "key"),
    )
