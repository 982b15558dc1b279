"""The statements the raw SQL baselines run (Postgres and SQLite share them).

Each is the one statement a careful hand-written store would use for the contract's
operation: compare-and-set saves are one ``INSERT … ON CONFLICT … DO UPDATE … WHERE`` (or
one ``UPDATE … WHERE revision = expected``), a wait claim one ``UPDATE … RETURNING``.
``{p}`` is the placeholder style (``%s`` for psycopg, ``?`` for sqlite3) and ``{doc}``
the document column's type.
"""

from __future__ import annotations

SCHEMA = (
    """CREATE TABLE checkpoints (
        namespace TEXT NOT NULL DEFAULT '', stack_id TEXT NOT NULL, revision BIGINT NOT NULL,
        doc {doc} NOT NULL, expires_at BIGINT, PRIMARY KEY (namespace, stack_id))""",
    "CREATE INDEX checkpoints_expiry ON checkpoints (expires_at) WHERE expires_at IS NOT NULL",
    """CREATE TABLE waits (
        key TEXT PRIMARY KEY, stack_id TEXT NOT NULL, status TEXT NOT NULL, claimant TEXT,
        lease_expires_at BIGINT, deadline BIGINT, payload {doc}, doc {doc} NOT NULL)""",
    """CREATE TABLE idempotency (
        key TEXT PRIMARY KEY, state TEXT NOT NULL, result {doc}, expires_at BIGINT NOT NULL)""",
    """CREATE TABLE locks (
        key TEXT PRIMARY KEY, token TEXT NOT NULL, fence BIGINT NOT NULL,
        expires_at BIGINT NOT NULL)""",
    """CREATE TABLE cache (
        key TEXT PRIMARY KEY, value {doc} NOT NULL, expires_at BIGINT NOT NULL)""",
)

# The document columns (table, column), for PostgreSQL's column compression.
DOCUMENT_COLUMNS = (
    ("checkpoints", "doc"),
    ("waits", "payload"),
    ("waits", "doc"),
    ("idempotency", "result"),
    ("cache", "value"),
)

# params: stack_id, revision, doc, expires_at, now
SAVE_PLAIN = """INSERT INTO checkpoints AS c (stack_id, revision, doc, expires_at)
VALUES ({p}, {p}, {p}, {p})
ON CONFLICT (namespace, stack_id) DO UPDATE
SET revision = excluded.revision, doc = excluded.doc, expires_at = excluded.expires_at
WHERE c.revision < excluded.revision OR c.expires_at <= {p}
RETURNING 1"""

# params: revision, doc, expires_at, stack_id, expected, now
SAVE_EXPECTED = """UPDATE checkpoints SET revision = {p}, doc = {p}, expires_at = {p}
WHERE namespace = '' AND stack_id = {p} AND revision = {p}
AND (expires_at IS NULL OR expires_at > {p})
RETURNING 1"""

# expected revision 0: insert, or replace an expired row. params as SAVE_PLAIN.
SAVE_EXPECTED_ZERO = """INSERT INTO checkpoints AS c (stack_id, revision, doc, expires_at)
VALUES ({p}, {p}, {p}, {p})
ON CONFLICT (namespace, stack_id) DO UPDATE
SET revision = excluded.revision, doc = excluded.doc, expires_at = excluded.expires_at
WHERE c.expires_at <= {p}
RETURNING 1"""

# params: stack_id, now
LOAD = """SELECT doc FROM checkpoints
WHERE namespace = '' AND stack_id = {p} AND (expires_at IS NULL OR expires_at > {p})"""

# params: now
CLEAN = "DELETE FROM checkpoints WHERE expires_at <= {p}"

# params: key, stack_id, doc
PUT_WAIT = "INSERT INTO waits (key, stack_id, status, doc) VALUES ({p}, {p}, 'waiting', {p})"

# params: claimant, lease_expires_at, payload, key, now, now
CLAIM_WAIT = """UPDATE waits SET status = 'claimed', claimant = {p}, lease_expires_at = {p},
payload = {p}
WHERE key = {p} AND (status = 'waiting' OR (status = 'claimed' AND lease_expires_at <= {p}))
AND (deadline IS NULL OR deadline > {p})
RETURNING doc"""

# params: key, expires_at, now
IDEM_CLAIM = """INSERT INTO idempotency AS i (key, state, expires_at)
VALUES ({p}, 'in-progress', {p})
ON CONFLICT (key) DO UPDATE SET state = 'in-progress', result = NULL,
expires_at = excluded.expires_at
WHERE i.expires_at <= {p}
RETURNING state"""

# params: result, expires_at, key
IDEM_COMPLETE = """UPDATE idempotency SET state = 'completed', result = {p}, expires_at = {p}
WHERE key = {p}"""

# params: key, token, expires_at, now
LOCK_ACQUIRE = """INSERT INTO locks AS l (key, token, fence, expires_at) VALUES ({p}, {p}, 1, {p})
ON CONFLICT (key) DO UPDATE SET token = excluded.token, fence = l.fence + 1,
expires_at = excluded.expires_at
WHERE l.expires_at <= {p}
RETURNING fence"""

# params: now, key, token, now
LOCK_RELEASE = """UPDATE locks SET expires_at = {p}
WHERE key = {p} AND token = {p} AND expires_at > {p}
RETURNING 1"""

# params: key, value, expires_at
CACHE_SET = """INSERT INTO cache (key, value, expires_at) VALUES ({p}, {p}, {p})
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"""

# params: key, now
CACHE_GET = "SELECT value FROM cache WHERE key = {p} AND expires_at > {p}"


def render(sql: str, *, p: str, doc: str = "") -> str:
    """``sql`` with the driver's placeholder and the document column type filled in."""
    return sql.replace("{p}", p).replace("{doc}", doc)
