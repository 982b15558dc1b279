"""The blind index as a database index on SQLite and PostgreSQL (schema 7).

Triggers keep ``checkpoint_tokens`` in step with every write of a checkpoint row (save,
value changed, delete, expiry clean-up); migration 7 fills it from what a schema-6 store
holds; a filtered listing walks its ``(token, field, id)`` index, which both planners
choose over a scan of the checkpoints (``EXPLAIN QUERY PLAN`` / ``EXPLAIN`` on 6,000
stacks, after ``ANALYZE``). Migration 8 makes the triggers read a document holding a
"\\u0000" escape, which PostgreSQL's JSON refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sql_support import SHARED_KINDS, open_backend

from siglo.blind import INDEX_KEY
from siglo.checkpoint import Checkpoint
from siglo_sql import SCHEMA_VERSION
from siglo_sql.keys import row_id

pytestmark = pytest.mark.parametrize("kind", SHARED_KINDS)


def _cp(stack: str, ns: str, revision: int = 1, **tokens: str) -> Checkpoint:
    metadata: dict[str, Any] = {"n": stack}
    if tokens:
        metadata[INDEX_KEY] = tokens
    return Checkpoint(
        stack_id=stack, namespace=ns, revision=revision, timestamp=1, metadata=metadata
    )


def _table(adapter: Any, name: str) -> str:
    full = f"{adapter.table_prefix}{name}"
    return f"{adapter.schema}.{full}" if adapter.schema else full


async def _token_rows(adapter: Any) -> set[tuple[str, str, str]]:
    """(stack id, field, token) of every row of the index table."""
    rows = await adapter.database.fetch(
        f"SELECT c.stack_id, t.field, t.token FROM {_table(adapter, 'checkpoint_tokens')} t "
        f"LEFT JOIN {_table(adapter, 'checkpoints')} c ON c.id = t.id"
    )
    return {(r[0], r[1], r[2]) for r in rows}


async def _ids(adapter: Any, tokens: dict[str, str], ns: str, **query: Any) -> list[str]:
    out: list[str] = []
    cursor = None
    while True:
        page = await adapter.list_checkpoints_by_index(tokens, namespace=ns, cursor=cursor, **query)
        out.extend(s.stack_id for s in page.items)
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


async def test_the_triggers_keep_the_tokens_in_step(kind: str) -> None:
    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        await a.save_checkpoint(_cp("s1", "t", customer="A", plan="P"))
        await a.save_checkpoint(_cp("s2", "t", customer="A"))
        await a.save_checkpoint(_cp("s3", "t"))  # no tokens: no rows
        assert await _token_rows(a) == {
            ("s1", "customer", "A"),
            ("s1", "plan", "P"),
            ("s2", "customer", "A"),
        }
        assert await _ids(a, {"customer": "A"}, "t") == sorted(["s1", "s2"], key=_order(a, "t"))
        assert await _ids(a, {"customer": "A", "plan": "P"}, "t") == ["s1"]
        # The value changes: the old token goes, in the statement that saves.
        await a.save_checkpoint(_cp("s1", "t", 2, customer="B"))
        assert await _ids(a, {"customer": "A"}, "t") == ["s2"]
        assert await _ids(a, {"customer": "B"}, "t") == ["s1"]
        assert ("s1", "plan", "P") not in await _token_rows(a)
        # Tokens dropped from the metadata, then a delete.
        await a.save_checkpoint(_cp("s1", "t", 3))
        await a.delete_checkpoint("s2", "t")
        assert await _token_rows(a) == set()
        # An expired checkpoint is not listed, and the clean-up takes its tokens.
        now = a.clock.now_ms()
        await a.save_checkpoint(_cp("s4", "t", customer="A").replace(expires_at=now + 50))
        assert await _ids(a, {"customer": "A"}, "t") == ["s4"]
        await asyncio.sleep(0.1)
        assert await _ids(a, {"customer": "A"}, "t") == []
        await a.clean_expired_checkpoints()
        assert await _token_rows(a) == set()


def _order(adapter: Any, ns: str) -> Any:
    return lambda stack: row_id(ns, stack)


async def test_paging_and_filters_follow_the_index(kind: str) -> None:
    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        stacks = [f"s{i:02}" for i in range(25)]
        for i, stack in enumerate(stacks):
            cp = _cp(stack, "t", customer="A" if i % 2 else "B")
            await a.save_checkpoint(cp.replace(status="completed" if i % 3 == 0 else "running"))
            await a.save_checkpoint(_cp(stack, "u", customer="A"))  # another namespace
        want = sorted((s for i, s in enumerate(stacks) if i % 2), key=_order(a, "t"))
        for limit in (1, 4, 12, 100):
            assert await _ids(a, {"customer": "A"}, "t", limit=limit) == want
        running = [s for s in want if int(s[1:]) % 3]
        assert await _ids(a, {"customer": "A"}, "t", limit=3, status="running") == running


async def test_migration_7_indexes_what_a_schema_6_store_holds(kind: str) -> None:
    async with open_backend(kind, auto_migrate=False, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        assert await a.migrate(target=6) == (0, 6)
        insert = a.database.sql(
            f"INSERT INTO {_table(a, 'checkpoints')} (id, namespace, stack_id, revision, "
            "status, gone_at, document, workflow_id, updated_at, expires_at) VALUES "
            "(:id, :ns, :stack, 1, 'running', NULL, :document, NULL, 1, NULL)"
        )
        for stack, metadata in (
            ("old1", {"$siglo": "sealed", INDEX_KEY: {"customer": "A", "plan": "P"}}),
            ("old2", {INDEX_KEY: {"customer": "B"}}),
            ("old3", {"customer": "A"}),  # in clear: no tokens
        ):
            cp = Checkpoint(
                stack_id=stack, namespace="t", revision=1, timestamp=1, metadata=metadata
            )
            document = cp.to_json()
            await a.database.raw_fetch(
                insert, {"id": row_id("t", stack), "ns": "t", "stack": stack, "document": document}
            )
        assert await a.migrate() == (6, SCHEMA_VERSION)
        assert await _token_rows(a) == {
            ("old1", "customer", "A"),
            ("old1", "plan", "P"),
            ("old2", "customer", "B"),
        }
        assert await _ids(a, {"customer": "A"}, "t") == ["old1"]
        found = await a.get_checkpoint("old1", "t", fallback=False)
        assert found is not None and found.metadata[INDEX_KEY] == {"customer": "A", "plan": "P"}
        # It found tokens, so it made the triggers: a save without tokens drops them.
        assert len(await _triggers(a)) == 3
        await a.save_checkpoint(_cp("old2", "t", 2))
        assert await _ids(a, {"customer": "B"}, "t") == []


async def _fill_many(a: Any, count: int) -> None:
    batch: list[Any] = []
    for i in range(count):
        batch.append(a.save_checkpoint(_cp(f"s{i:05}", "big", customer=f"c{i % 500}")))
        if len(batch) == 200:
            await asyncio.gather(*batch)
            batch = []
    await asyncio.gather(*batch)


async def _captured_listing(a: Any, tokens: dict[str, str], **query: Any) -> tuple[str, Any]:
    """The SQL and parameters of a filtered page, as the adapter sent them."""
    seen: list[tuple[str, Any]] = []
    db = a.database
    original = db.fetch

    async def fetch(sql: str, params: Any = ()) -> Any:
        seen.append((sql, params))
        return await original(sql, params)

    db.fetch = fetch
    try:
        page = await a.list_checkpoints_by_index(tokens, namespace="big", **query)
    finally:
        del db.fetch
    assert len(page.items) == 3  # 6,000 stacks, 500 values
    ((sql, params),) = seen
    return sql, params


async def test_explain_a_filtered_listing_uses_the_index(kind: str) -> None:
    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        await _fill_many(a, 6_000)
        db = a.database
        await db.raw_fetch(f"ANALYZE {_table(a, 'checkpoints')}")
        await db.raw_fetch(f"ANALYZE {_table(a, 'checkpoint_tokens')}")
        tokens_index = f"{a.table_prefix}checkpoint_tokens_token"
        for query in ({"limit": 3}, {"limit": 3, "status": "running"}):
            sql, params = await _captured_listing(a, {"customer": "c7"}, **query)
            if kind == "postgres":
                rows = await db.fetch("EXPLAIN " + sql, params)
                plan = "\n".join(r[0] for r in rows)
                assert tokens_index in plan, plan
                assert f"Seq Scan on {a.table_prefix}checkpoints" not in plan, plan
                assert "Sort" not in plan, plan
            else:
                rows = await db.fetch("EXPLAIN QUERY PLAN " + sql, params)
                plan = "\n".join(str(r[-1]) for r in rows)
                assert f"USING COVERING INDEX {tokens_index}" in plan, plan
                # Each token row leads to its checkpoint by a search (its id), never a scan.
                assert "SEARCH c USING" in plan and "id=?" in plan, plan
                assert "SCAN c" not in plan and "TEMP B-TREE" not in plan, plan


async def _triggers(adapter: Any) -> set[str]:
    """The names of the token triggers the checkpoints table has."""
    names = {f"{adapter.table_prefix}checkpoint_tokens_{n}" for n in ("added", "changed", "gone")}
    if adapter.database.dialect_name == "postgresql":
        rows = await adapter.database.fetch(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(%(t)s)",
            {"t": _table(adapter, "checkpoints")},
        )
    else:
        rows = await adapter.database.fetch("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    return {r[0] for r in rows} & names


async def test_a_store_without_tokens_has_no_triggers_until_its_first_token(kind: str) -> None:
    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        await a.save_checkpoint(_cp("s1", "t"))
        await a.save_checkpoint(_cp("s1", "t", 2))
        await a.save_checkpoint_streamed(_cp("s2", "t"), [])
        await a.cancel_workflow("s2", "t")
        await a.delete_checkpoint("s1", "t")
        assert await _triggers(a) == set()
        # The first document with tokens: the triggers, committed before its save, which
        # they index.
        await a.save_checkpoint(_cp("s3", "t", customer="A"))
        assert len(await _triggers(a)) == 3
        assert await _token_rows(a) == {("s3", "customer", "A")}
        # They stay: a save without tokens over the row drops its tokens.
        await a.save_checkpoint(_cp("s3", "t", 2))
        assert await _token_rows(a) == set()
        assert len(await _triggers(a)) == 3


def test_the_marker_search_finds_the_key_anywhere(kind: str) -> None:
    from siglo_sql.migrations import holds_token_marker

    found = _cp("s", "t", customer="A").to_json()
    assert holds_token_marker(found)
    assert holds_token_marker(b'$"$x$' + found)  # after other dollars, one at 0
    assert not holds_token_marker(_cp("s", "t").to_json())
    assert not holds_token_marker(b'{"$siglo":"sealed","$sigloIndexes":1,"$sigloIndex')
    assert not holds_token_marker(b'$sigloIndex"')  # no quote before it
    assert not holds_token_marker(b"")


async def test_every_save_path_creates_the_triggers(kind: str) -> None:
    """Streamed, unlocking and incremental (in parts) saves, ``siglo import``, and a
    migration whose backfill found no tokens, each make the triggers before their first
    token."""
    from siglo.transfer import export_lines, import_lines

    async with open_backend("sqlite-memory", checkpoint_ttl_ms=None) as source:
        await source.adapter.save_checkpoint(_cp("s", "t", customer="A"))
        dump = [line async for line in export_lines(source.adapter)]
    for path in ("streamed", "unlocking", "parts", "import", "migrated"):
        async with open_backend(
            kind, checkpoint_ttl_ms=None, incremental_min_bytes=4_096, auto_migrate=False
        ) as backend:
            a: Any = backend.adapter
            if path == "migrated":
                assert await a.migrate(target=6) == (0, 6)
            await a.migrate()
            cp = _cp("s", "t", customer="A")
            if path == "streamed":
                await a.save_checkpoint_streamed(cp, [])
            elif path == "unlocking":
                await a.save_checkpoint_unlocking(cp)
            elif path == "import":
                assert (await import_lines(a, dump)).imported == 1
            elif path == "parts":
                big = {f"step{i}": {"v": "x" * 2_000} for i in range(4)}
                await a.save_checkpoint(cp.replace(contexts=big))
                assert _parts_row(await _raw_row(a, "s"))
            else:
                assert await _triggers(a) == set()
                await a.save_checkpoint(cp)
            assert len(await _triggers(a)) == 3, path
            assert await _token_rows(a) == {("s", "customer", "A")}, path


async def _raw_row(adapter: Any, stack: str) -> Any:
    rows = await adapter.database.fetch(
        adapter.database.sql(f"SELECT parts FROM {_table(adapter, 'checkpoints')} WHERE id = :id"),
        {"id": row_id("t", stack)},
    )
    return rows[0]


def _parts_row(row: Any) -> bool:
    return row[0] is not None


async def test_another_connection_keeps_the_index_after_the_triggers_came(kind: str) -> None:
    """A second backend on the same database, whose statements ran (prepared) before the
    first made the triggers, fires them from then on: its save without tokens over a
    row with tokens, and its delete, drop them."""
    import siglo

    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        other = siglo.connect(backend.url, checkpoint_ttl_ms=None)
        b: Any = other.adapter
        try:
            for i in range(3):  # prepared and cached on every connection it uses
                await b.save_checkpoint(_cp("s1", "t", i + 1))
                await b.save_checkpoint(_cp(f"x{i}", "t"))
                await b.get_checkpoint("s1", "t")
            await b.delete_checkpoint("x0", "t")
            assert await _triggers(a) == set()
            await a.save_checkpoint(_cp("s1", "t", 4, customer="A"))
            await a.save_checkpoint(_cp("s2", "t", customer="B"))
            assert await _ids(b, {"customer": "A"}, "t") == ["s1"]
            await b.save_checkpoint(_cp("s1", "t", 5))  # no tokens: A's token goes
            await b.delete_checkpoint("s2", "t")
            assert await _token_rows(a) == set()
            await b.save_checkpoint(_cp("x1", "t", 2, customer="C"))
            assert await _ids(a, {"customer": "C"}, "t") == ["x1"]
        finally:
            await other.aclose()


async def test_a_save_costs_what_it_did_at_schema_6_without_tokens(kind: str) -> None:
    """The same upsert on a schema-7 store that never held a token and on a schema-6
    store runs the same SQLite program: counted in virtual machine instructions (a
    progress handler called at each one), not timed. (On PostgreSQL the absence of the
    triggers, above, is what the save's cost depends on.)"""
    import sqlite3

    if kind != "sqlite-file":
        pytest.skip("SQLite's program, counted by its progress handler")

    from siglo_sql.rows import checkpoint_row

    counts: dict[str, list[int]] = {}
    for store in ("v6", "v7", "v7 with triggers"):
        async with open_backend(kind, checkpoint_ttl_ms=None, auto_migrate=False) as backend:
            a: Any = backend.adapter
            # "v7": the current schema (7's tables; 8 changed only what the triggers read).
            await a.migrate(target=6 if store == "v6" else SCHEMA_VERSION)
            if store != "v6":
                await a.save_checkpoint(_cp("other", "t"))
                await a.delete_checkpoint("other", "t")
            if store == "v7 with triggers":  # the counter sees their conditions
                await a.save_checkpoint(_cp("other", "t", customer="A"))
            conn = sqlite3.connect(a.database.path, isolation_level=None)
            steps = [0]

            def step(steps: list[int] = steps) -> int:
                steps[0] += 1
                return 0

            try:
                conn.set_progress_handler(step, 1)
                seen = []
                # The first run of the statement also reads the schema: the others.
                for revision in (1, 2, 3):
                    row = checkpoint_row(_cp("s", "t", revision), None, 1)
                    steps[0] = 0
                    conn.execute(a._s.cp_save_forward, {**row, "expected": None}).fetchall()
                    seen.append(steps[0])
                counts[store] = seen[1:]
            finally:
                conn.close()
    assert counts["v7"] == counts["v6"], counts
    assert counts["v7 with triggers"][0] > counts["v6"][0], counts


async def test_several_connections_make_the_triggers_at_once(kind: str) -> None:
    """Four backends on one database save their first token at the same moment: one
    makes the triggers (under the lock), the others find them; every token is indexed."""
    import siglo

    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        others = [siglo.connect(backend.url, checkpoint_ttl_ms=None) for _ in range(4)]
        try:
            for other in others:
                await other.adapter.open()  # type: ignore[attr-defined]
            await asyncio.gather(
                *(
                    other.adapter.save_checkpoint(_cp(f"s{i}", "t", customer="A"))
                    for i, other in enumerate(others)
                )
            )
            assert len(await _triggers(a)) == 3
            assert await _ids(a, {"customer": "A"}, "t") == sorted(
                [f"s{i}" for i in range(4)], key=_order(a, "t")
            )
        finally:
            for other in others:
                await other.aclose()


async def test_a_role_that_may_not_create_triggers_is_told_and_siglo_migrate_makes_them(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: an application role with the DML privileges and no right to create
    triggers saves its first token: a clear error naming the remedy, nothing saved;
    `siglo migrate` run by the owner with the settings naming blind_index_fields makes
    them, and the role's token saves are indexed."""
    if kind != "postgres":
        pytest.skip("roles and privileges are PostgreSQL's")
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    from click.testing import CliRunner
    from sql_support import base_url

    import siglo
    from siglo.cli import cli
    from siglo.errors import StorageAdapterError

    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        await a.save_checkpoint(_cp("s0", "t"))
        role = "siglo_app_" + uuid.uuid4().hex[:8]
        db = a.database
        await db.fetch(f"CREATE ROLE {role} LOGIN")
        try:
            await db.fetch(f"GRANT USAGE ON SCHEMA {a.schema} TO {role}")
            await db.fetch(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {a.schema} TO {role}"
            )
            parts = urlsplit(base_url(kind))
            app_url = urlunsplit(
                parts._replace(
                    netloc=f"{role}@{parts.hostname}:{parts.port or 5432}",
                    query=f"schema={a.schema}&auto_migrate=false",
                )
            )
            async with siglo.connect(app_url) as app:
                with pytest.raises(StorageAdapterError, match="siglo migrate") as refused:
                    await app.adapter.save_checkpoint(_cp("s1", "t", customer="A"))
                assert "TRIGGER" in str(refused.value) and "nothing was saved" in str(refused.value)
                assert await a.get_checkpoint("s1", "t") is None
                assert await _triggers(a) == set()

                owner_url = urlunsplit(parts._replace(query=f"schema={a.schema}"))
                monkeypatch.setenv("SIGLO_BLIND_INDEX_FIELDS", "customer")
                result = await asyncio.to_thread(CliRunner().invoke, cli, ["migrate", owner_url])
                assert result.exit_code == 0, result.output
                assert "blind-index triggers in place" in result.output
                assert len(await _triggers(a)) == 3

                await app.adapter.save_checkpoint(_cp("s1", "t", customer="A"))
                assert await _ids(app.adapter, {"customer": "A"}, "t") == ["s1"]
                assert ("s1", "customer", "A") in await _token_rows(a)
        finally:
            await db.fetch(f"DROP OWNED BY {role}")
            await db.fetch(f"DROP ROLE {role}")


# A context in clear may hold a NUL in a string ("\u0000" in the stored JSON), and the
# marker's text anywhere (here as a value). PostgreSQL's JSON refuses to turn that escape
# into text, so the token triggers' function, and migration 7's backfill, refused such
# a document with the marker in it: the save failed (a black-box auditor). SQLite's
# json_each (before 3.45) ended a token or field holding a NUL at it.
_NUL_CONTEXT = {
    "s": {
        "note": "a\x00b",
        "label": INDEX_KEY,
        # A backslash and the text "u0000" ("\\u0000" in the JSON) is no NUL escape.
        "path": "C:\\u0000\\x",
    }
}


def _nul_cp(stack: str, revision: int = 1, **tokens: str) -> Checkpoint:
    return _cp(stack, "t", revision, **tokens).replace(contexts=_NUL_CONTEXT)


async def _stored_as_saved(adapter: Any, cp: Checkpoint) -> None:
    """The checkpoint's row holds its document byte for byte, and loads as it."""
    rows = await adapter.database.fetch(
        adapter.database.sql(
            f"SELECT document FROM {_table(adapter, 'checkpoints')} WHERE id = :id"
        ),
        {"id": row_id("t", cp.stack_id)},
    )
    assert bytes(rows[0][0]) == cp.to_json()
    found = await adapter.get_checkpoint(cp.stack_id, "t", fallback=False)
    assert found is not None and found.to_json() == cp.to_json()


async def _saves_with_nul_escapes(a: Any, revision: int = 1) -> None:
    """Saves of documents holding "\\u0000" and the marker, with and without tokens, and
    with a token and a field holding a NUL: stored whole, indexed."""
    plain = _nul_cp("nul", revision)
    assert b"\\u0000" in plain.to_json() and b'"$sigloIndex"' in plain.to_json()
    await a.save_checkpoint(plain)
    await _stored_as_saved(a, plain)
    saved = [
        _nul_cp("nul-a", revision, customer="A"),
        _nul_cp("nul-token", revision, customer="x\x00y", **{"g\x00h": "z"}),
        # A token holding a backslash and the text "u0000" is indexed as it is.
        _nul_cp("backslash", revision, customer="x\\u0000y"),
    ]
    for cp in saved:
        await a.save_checkpoint(cp)
        await _stored_as_saved(a, cp)
    await _nul_tokens_indexed(a)


async def _nul_tokens_indexed(a: Any) -> None:
    rows = await _token_rows(a)
    assert {r for r in rows if r[0] != "s0"} == {
        ("nul-a", "customer", "A"),
        # A NUL of a token or field is indexed as U+FFFD (PostgreSQL's text cannot hold
        # it), and a listing asks for it so.
        ("nul-token", "customer", "x\ufffdy"),
        ("nul-token", "g\ufffdh", "z"),
        ("backslash", "customer", "x\\u0000y"),
    }
    assert await _ids(a, {"customer": "A"}, "t") == sorted(["s0", "nul-a"], key=_order(a, "t"))
    assert await _ids(a, {"customer": "x\x00y"}, "t") == ["nul-token"]
    assert await _ids(a, {"customer": "x\x00y", "g\x00h": "z"}, "t") == ["nul-token"]
    assert await _ids(a, {"customer": "x"}, "t") == []  # not cut at the NUL
    assert await _ids(a, {"g": "z"}, "t") == []
    assert await _ids(a, {"customer": "x\\u0000y"}, "t") == ["backslash"]


async def test_a_document_holding_a_nul_escape_is_saved_with_the_triggers(kind: str) -> None:
    async with open_backend(kind, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        await a.save_checkpoint(_cp("s0", "t", customer="A"))
        assert len(await _triggers(a)) == 3
        await _saves_with_nul_escapes(a)
        # Saved again without the NUL tokens, deleted: their rows go.
        await a.save_checkpoint(_nul_cp("nul-token", 2))
        await a.delete_checkpoint("nul-a", "t")
        assert {r for r in await _token_rows(a) if r[0] != "s0"} == {
            ("backslash", "customer", "x\\u0000y")
        }


async def _insert_raw(a: Any, cp: Checkpoint) -> None:
    """``cp``'s row as a store at an older schema version holds it (the adapter, at
    schema 8, refuses to write there)."""
    await a.database.raw_fetch(
        a.database.sql(
            f"INSERT INTO {_table(a, 'checkpoints')} (id, namespace, stack_id, revision, "
            "status, gone_at, document, workflow_id, updated_at, expires_at) VALUES "
            "(:id, 't', :stack, 1, 'running', NULL, :document, NULL, 1, NULL)"
        ),
        {"id": row_id("t", cp.stack_id), "stack": cp.stack_id, "document": cp.to_json()},
    )


# The token function and triggers as siglo made them before schema 8 (migration 7 and
# the first token save), verbatim: they read the stored document as it is.
_PG_BEFORE_8 = (
    """CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE found json;
BEGIN
  IF TG_OP <> 'INSERT' THEN DELETE FROM {ix} WHERE id = OLD.id; END IF;
  IF TG_OP <> 'DELETE' AND position({marker} in NEW.document) > 0 THEN
    found := convert_from(NEW.document, 'UTF8')::json -> 'metadata' -> '$sigloIndex';
    IF json_typeof(found) = 'object' THEN
      INSERT INTO {ix} (id, field, token) SELECT NEW.id, e.key, e.value #>> '{{}}'
        FROM json_each(found) AS e WHERE json_typeof(e.value) = 'string';
    END IF;
  END IF;
  RETURN NULL;
END $$""",
    "CREATE TRIGGER {p}checkpoint_tokens_added AFTER INSERT ON {cp} FOR EACH ROW "
    "WHEN (position({marker} in NEW.document) > 0) EXECUTE FUNCTION {fn}()",
    "CREATE TRIGGER {p}checkpoint_tokens_changed AFTER UPDATE OF document ON {cp} FOR EACH "
    "ROW WHEN (position({marker} in NEW.document) > 0 OR position({marker} in OLD.document) "
    "> 0) EXECUTE FUNCTION {fn}()",
    "CREATE TRIGGER {p}checkpoint_tokens_gone AFTER DELETE ON {cp} FOR EACH ROW "
    "WHEN (position({marker} in OLD.document) > 0) EXECUTE FUNCTION {fn}()",
)
_SQLITE_INSERT_BEFORE_8 = (
    "INSERT INTO {ix} (id, field, token) SELECT NEW.id, key, value FROM json_each(CASE WHEN "
    "CAST(NEW.document AS TEXT) GLOB '*\"$sigloIndex\"*' THEN CAST(NEW.document AS TEXT) "
    "ELSE '{{}}' END, '$.metadata.\"$sigloIndex\"') WHERE type = 'text' AND key IS NOT NULL"
)
_SQLITE_BEFORE_8 = (
    "CREATE TRIGGER IF NOT EXISTS {p}checkpoint_tokens_added AFTER INSERT ON {cp} FOR EACH "
    "ROW WHEN CAST(NEW.document AS TEXT) GLOB '*\"$sigloIndex\"*' BEGIN "
    + _SQLITE_INSERT_BEFORE_8
    + "; END",
    "CREATE TRIGGER IF NOT EXISTS {p}checkpoint_tokens_changed AFTER UPDATE OF document ON "
    "{cp} FOR EACH ROW WHEN CAST(NEW.document AS TEXT) GLOB '*\"$sigloIndex\"*' OR EXISTS "
    "(SELECT 1 FROM {ix} WHERE id = OLD.id) BEGIN DELETE FROM {ix} WHERE id = OLD.id; "
    + _SQLITE_INSERT_BEFORE_8
    + "; END",
    "CREATE TRIGGER IF NOT EXISTS {p}checkpoint_tokens_gone AFTER DELETE ON {cp} FOR EACH ROW "
    "WHEN EXISTS (SELECT 1 FROM {ix} WHERE id = OLD.id) BEGIN DELETE FROM {ix} "
    "WHERE id = OLD.id; END",
)


async def _made_as_before_schema_8(a: Any) -> None:
    """A schema-7 store that an older siglo gave the token triggers."""
    names = {
        "p": a.table_prefix,
        "cp": _table(a, "checkpoints"),
        "ix": _table(a, "checkpoint_tokens"),
        "fn": _table(a, "checkpoint_tokens_sync"),
        "marker": "'\\x22247369676c6f496e64657822'::bytea",  # '"$sigloIndex"'
    }
    postgres = a.database.dialect_name == "postgresql"
    for statement in _PG_BEFORE_8 if postgres else _SQLITE_BEFORE_8:
        await a.database.raw_fetch(statement.format(**names))


async def test_migration_8_lets_a_schema_7_store_save_a_document_holding_a_nul_escape(
    kind: str,
) -> None:
    from siglo.errors import StorageAdapterError

    async with open_backend(kind, checkpoint_ttl_ms=None, auto_migrate=False) as backend:
        a: Any = backend.adapter
        assert await a.migrate(target=7) == (0, 7)
        await _made_as_before_schema_8(a)
        await _insert_raw(a, _cp("s0", "t", customer="A"))
        token = _nul_cp("nul-token", customer="x\x00y", **{"g\x00h": "z"})
        if kind == "postgres":
            # The store as the auditor met it: the document is refused.
            with pytest.raises(StorageAdapterError, match="Unicode escape"):
                await _insert_raw(a, _nul_cp("nul"))
        else:
            # Stored, its tokens indexed as the SQLite version's json_each made them
            # (3.40: cut at the NUL); migration 8 indexes them again.
            await _insert_raw(a, token)
        assert await a.migrate() == (7, SCHEMA_VERSION)
        assert len(await _triggers(a)) == 3
        if kind != "postgres":
            assert {r for r in await _token_rows(a) if r[0] == "nul-token"} == {
                ("nul-token", "customer", "x\ufffdy"),
                ("nul-token", "g\ufffdh", "z"),
            }
            await _stored_as_saved(a, token)
        await _saves_with_nul_escapes(a, revision=2)


async def test_migration_7_indexes_a_schema_6_store_holding_nul_escapes(kind: str) -> None:
    async with open_backend(kind, auto_migrate=False, checkpoint_ttl_ms=None) as backend:
        a: Any = backend.adapter
        assert await a.migrate(target=6) == (0, 6)
        saved = [
            _cp("s0", "t", customer="A"),
            _nul_cp("nul"),
            _nul_cp("nul-a", customer="A"),
            _nul_cp("nul-token", customer="x\x00y", **{"g\x00h": "z"}),
            _nul_cp("backslash", customer="x\\u0000y"),
        ]
        for cp in saved:
            await _insert_raw(a, cp)
        assert await a.migrate() == (6, SCHEMA_VERSION)
        assert len(await _triggers(a)) == 3
        assert ("s0", "customer", "A") in await _token_rows(a)
        await _nul_tokens_indexed(a)
        for cp in saved:
            await _stored_as_saved(a, cp)
