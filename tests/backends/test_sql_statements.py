"""SQL statements: named parameters, converted once to each driver's style."""

from __future__ import annotations

import dataclasses
import re

import pytest

from siglo.errors import InvalidArgumentError
from siglo_postgres.database import PostgresDatabase
from siglo_sql.schema import build_tables
from siglo_sql.statements import Statements, build_statements, many_ids
from siglo_sqlite.database import SqliteDatabase

NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
PYFORMAT = re.compile(r"%\((\w+)\)s")


def _statements(db: PostgresDatabase | SqliteDatabase) -> Statements:
    postgres = db.dialect_name == "postgresql"
    return build_statements(
        build_tables("siglo_", None),
        db.sa_dialect,
        for_update=" FOR UPDATE" if postgres else "",
        writable_ctes=postgres,
        style=db.sql,
    )


SQLITE = _statements(SqliteDatabase(None))
POSTGRES = _statements(PostgresDatabase("postgresql://127.0.0.1/none", description="x"))
TEMPLATES = {
    "cp_get_many",
    "cp_load_many",
    "cp_list",
    "cp_update_parts",
    "parts_insert",
    "parts_delete",
    "parts_some",
}


def _texts(statements: Statements) -> dict[str, str]:
    """Every statement by name; a group of statements (``cp_streamed``) as ``group.key``."""
    texts: dict[str, str] = {}
    for f in dataclasses.fields(statements):
        value = getattr(statements, f.name)
        if isinstance(value, dict):
            texts.update({f"{f.name}.{key}": text for key, text in value.items()})
        elif value is not None:
            texts[f.name] = value
    return texts


def test_no_statement_binds_by_position() -> None:
    for statements in (SQLITE, POSTGRES):
        for name, text in _texts(statements).items():
            assert "?" not in text, name
            assert "%s" not in text, name


def test_sqlite_keeps_names_and_postgres_gets_them_in_its_style() -> None:
    for name, text in _texts(POSTGRES).items():
        if name in TEMPLATES:
            assert not PYFORMAT.search(text), name  # completed and converted per shape
            continue
        assert not NAMED.search(text), (name, text)
        sqlite_text = _texts(SQLITE).get(name)
        if sqlite_text is not None:  # wait_save_one exists on PostgreSQL only
            assert PYFORMAT.findall(text) == NAMED.findall(sqlite_text), name


def test_postgres_streamed_saves_bind_the_change_and_the_checkpoint_apart() -> None:
    # SQLite has no writable CTEs: a change and a checkpoint are two statements there.
    assert SQLITE.cp_streamed is None
    assert POSTGRES.cp_streamed is not None
    change = [f"ctx_{name}" for name in PYFORMAT.findall(POSTGRES.ctx_set)]
    for key, text in POSTGRES.cp_streamed.items():
        assert text.startswith("WITH ctx AS (INSERT INTO"), key
        assert PYFORMAT.findall(text) == change + PYFORMAT.findall(getattr(POSTGRES, key)), key


def test_the_wait_claim_binds_now_once_by_name() -> None:
    names = NAMED.findall(SQLITE.wait_claim)
    assert names.count("now") >= 4
    assert set(names) == {
        "claimant_id",
        "now",
        "lease_expires_at",
        "event_payload",
        "id",
        "allow_expired",
    }


@pytest.mark.parametrize(
    ("text", "converted"),
    [
        ("SELECT :a, :b_2 WHERE x = :a", "SELECT %(a)s, %(b_2)s WHERE x = %(a)s"),
        (
            "SELECT x::text, 'y' FROM t WHERE id = :id",
            "SELECT x::text, 'y' FROM t WHERE id = %(id)s",
        ),
        (f"IN ({many_ids(3)})", "IN (%(id0)s, %(id1)s, %(id2)s)"),
    ],
)
def test_conversion_to_pyformat(text: str, converted: str) -> None:
    db = PostgresDatabase("postgresql://127.0.0.1/none", description="x")
    assert db.sql(text) == converted
    assert SqliteDatabase(None).sql(text) == text


def test_tables_are_built_once_per_prefix_schema_and_version() -> None:
    """Every connect and migration asks for the tables; they are built once (a third of
    a connect, first load and close on SQLite) and shared, never across a different
    prefix, schema or version, and a bad name is refused every time it is asked for."""
    tables = build_tables("siglo_once_", "app")
    assert build_tables("siglo_once_", "app") is tables
    assert tables.checkpoints.name == "siglo_once_checkpoints"
    assert tables.checkpoints.schema == "app"
    other_prefix = build_tables("siglo_other_", "app")
    other_schema = build_tables("siglo_once_", "other")
    version_1 = build_tables("siglo_once_", "app", version=1)
    assert other_prefix.checkpoints.name == "siglo_other_checkpoints"
    assert other_schema.checkpoints.schema == "other"
    assert version_1.checkpoint_tokens is None and tables.checkpoint_tokens is not None
    for bad in ("bad prefix;", "bad prefix;", ["siglo_"]):
        with pytest.raises(InvalidArgumentError, match="table prefix"):
            build_tables(bad, None)  # type: ignore[arg-type]
