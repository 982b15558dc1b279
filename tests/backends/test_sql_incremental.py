"""Incremental saves on the SQL backends (SPEC §13, issue 34): a document of at least
``incremental_min_bytes`` is stored as a skeleton and its contexts, a save writes only the
contexts that changed in the same transaction as its compare-and-set, and a load returns
the saved bytes. Rows of the version-1 fixture, migrated, read as before and move to parts
on their next large save."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from sql_support import POSTGRES_URL, SHARED_KINDS, open_backend
from test_sql_migrations import check_v1_data, v1_database

import siglo
import siglo.parts
from siglo import Checkpoint, CheckpointConflictError
from siglo.config import Settings
from siglo.locking import run_with_lock, workflow_lock_key
from siglo.pipeline import Pipeline, pipeline_adapter
from siglo.sealing import SEALED_KEY
from siglo_sql.adapter import SqlStorageAdapter
from siglo_sql.parts import (
    DEFAULT_INCREMENTAL_MIN_BYTES,
    IN_PLACE_MAX_BYTES,
    MOST_CHANGES,
    WINDOW,
    SameLengthRows,
    assemble,
    split,
)

pytestmark = pytest.mark.rule("checkpoint.incremental")
KINDS = pytest.mark.parametrize("kind", SHARED_KINDS)


def _doc(
    revision: int, steps: int, *, stack: str = "run", changed: int = -1, longer: int = 0
) -> Checkpoint:
    """``steps`` contexts of 12 KB; ``changed`` another content, ``longer`` bytes longer."""
    contexts = {
        f"step-{i}": {"output": "o" * 12_000 if i != changed else "c" * (12_000 + longer), "i": i}
        for i in range(steps)
    }
    return Checkpoint(stack_id=stack, revision=revision, timestamp=revision, contexts=contexts)


async def _rows(backend: siglo.Backend, sql: str) -> list[Any]:
    a: Any = backend.raw_adapter
    return await a.database.fetch(sql.format(p=_tables(backend)))


def _tables(backend: siglo.Backend) -> str:
    a: Any = backend.raw_adapter
    return f'"{a.schema}".{a.table_prefix}' if a.schema else a.table_prefix


async def _digests(backend: siglo.Backend) -> set[bytes]:
    return {bytes(r[0]) for r in await _rows(backend, "SELECT digest FROM {p}checkpoint_parts")}


@KINDS
async def test_a_save_writes_only_the_contexts_that_changed(kind: str) -> None:
    async with open_backend(kind) as backend:
        a = backend.adapter
        first = _doc(1, 10)
        assert len(first.to_json()) >= DEFAULT_INCREMENTAL_MIN_BYTES
        await a.save_checkpoint(first)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == first.to_json()
        before = await _digests(backend)
        assert len(before) == 10
        skeleton = await _rows(backend, "SELECT document, parts FROM {p}checkpoints")
        assert b'"contexts":{}' in bytes(skeleton[0][0]) and skeleton[0][1] is not None
        # One context changed, one added: two bodies written, one deleted, eight untouched.
        second = _doc(2, 11, changed=3)
        await a.save_checkpoint(second, expected_revision=1)
        after = await _digests(backend)
        assert len(after - before) == 2 and len(before - after) == 1 and len(after) == 11
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == second.to_json()
        # A refused save writes nothing.
        with pytest.raises(CheckpointConflictError):
            await a.save_checkpoint(_doc(3, 12, changed=5), expected_revision=1)
        assert await _digests(backend) == after


@KINDS
async def test_unchanged_rows_are_not_rewritten_on_postgres(kind: str) -> None:
    if kind != "postgres":
        pytest.skip("xmin is PostgreSQL's")
    async with open_backend(kind) as backend:
        await backend.adapter.save_checkpoint(_doc(1, 8))
        sql = "SELECT digest, xmin::text FROM {p}checkpoint_parts"
        before = {bytes(d): x for d, x in await _rows(backend, sql)}
        await backend.adapter.save_checkpoint(_doc(2, 8, changed=2), expected_revision=1)
        after = {bytes(d): x for d, x in await _rows(backend, sql)}
        kept = before.keys() & after.keys()
        assert len(kept) == 7 and all(before[d] == after[d] for d in kept)


def _count_calls(backend: siglo.Backend) -> dict[str, int]:
    """How many writes and transactions (``run_plan``) ``backend``'s database runs."""
    adapter: Any = backend.raw_adapter
    db = adapter.database
    calls = {"write": 0, "run_plan": 0}
    for name in calls:
        method = getattr(db, name)

        def counted(*args: Any, _method: Any = method, _name: str = name) -> Any:
            calls[_name] += 1
            return _method(*args)

        setattr(db, name, counted)
    return calls


async def test_a_save_of_the_version_it_wrote_is_one_statement_on_postgres() -> None:
    # The save replaces the row version this adapter wrote: one statement, one round
    # trip (cp_update_parts), its parts exactly those of the previous test.
    async with open_backend("postgres") as backend:
        a = backend.adapter
        await a.save_checkpoint(_doc(1, 8))
        await a.save_checkpoint(_doc(2, 8, changed=2), expected_revision=1)
        calls = _count_calls(backend)
        before = await _digests(backend)
        await a.save_checkpoint(_doc(3, 9, changed=5), expected_revision=2)
        assert calls == {"write": 1, "run_plan": 0}
        after = await _digests(backend)
        assert after == set(split(_doc(3, 9, changed=5)).bodies)
        # step-2 back to its first body, step-5 changed, step-8 added; two bodies dropped.
        assert len(after - before) == 3 and len(before - after) == 2
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == _doc(3, 9, changed=5).to_json()
        # Refused by the revision: a conflict, nothing written.
        with pytest.raises(CheckpointConflictError):
            await a.save_checkpoint(_doc(4, 10, changed=1), expected_revision=2)
        assert await _digests(backend) == after


async def test_a_row_rewritten_by_another_writer_is_read_before_its_save_on_postgres() -> None:
    # Another writer deletes the checkpoint and saves it again up to the same revision
    # with other parts: the revision matches what this adapter wrote, the row's version
    # does not, so the save reads what is stored (a save trusting its own memory would
    # leave the other's parts behind and name bodies that are gone).
    async with open_backend("postgres") as backend:
        a: Any = backend.raw_adapter
        schema = a.schema
        await a.save_checkpoint(_doc(1, 6))
        await a.save_checkpoint(_doc(2, 6, changed=1), expected_revision=1)
        async with siglo.connect(POSTGRES_URL, schema=schema) as other:
            assert await other.adapter.delete_checkpoint("run") is True
            for revision in (1, 2):
                other_doc = _doc(revision, 7, changed=revision + 2)
                await other.adapter.save_checkpoint(other_doc, expected_revision=revision - 1)
        calls = _count_calls(backend)
        mine = _doc(3, 6, changed=4)
        await a.save_checkpoint(mine, expected_revision=2)
        assert await _digests(backend) == set(split(mine).bodies)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()
        assert calls == {"write": 1, "run_plan": 1}  # refused, then the long way
        # That save's version is known again: the next is one statement.
        await a.save_checkpoint(_doc(4, 6, changed=5), expected_revision=3)
        assert calls == {"write": 2, "run_plan": 1}
        assert await _digests(backend) == set(split(_doc(4, 6, changed=5)).bodies)


async def test_a_save_of_the_version_it_loaded_is_one_statement_on_postgres() -> None:
    # Another writer saved; this adapter loads that version, then saves over it: the
    # load read the row's version with its parts, so the save is one statement.
    async with open_backend("postgres") as backend:
        a: Any = backend.raw_adapter
        async with siglo.connect(POSTGRES_URL, schema=a.schema) as other:
            await other.adapter.save_checkpoint(_doc(1, 6))
            await other.adapter.save_checkpoint(_doc(2, 6, changed=1), expected_revision=1)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == _doc(2, 6, changed=1).to_json()
        calls = _count_calls(backend)
        mine = _doc(3, 7, changed=2)
        await a.save_checkpoint(mine, expected_revision=2)
        assert await _digests(backend) == set(split(mine).bodies)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()
        assert calls == {"write": 1, "run_plan": 0}


def _parts_only(a: Any) -> None:
    """``a`` saves every large document in parts, whatever its length does: its
    :class:`SameLengthRows` remembers no save (SQLite would otherwise save a row that
    keeps its length whole from its fourth save, and these tests are of the parts)."""
    a._same_length = SameLengthRows(max_rows=0)


def _record_plans(a: Any) -> list[str]:
    """The first word of each statement of ``a``'s transactions, as they run."""
    sent: list[str] = []
    plan = a.database.run_plan

    async def recorded(steps: Any) -> None:
        def each() -> Any:
            step = next(steps)
            try:
                while True:
                    sent.append(step[0].split(" ")[0])
                    step = steps.send((yield step))
            except StopIteration:
                return

        await plan(each())

    a.database.run_plan = recorded
    return sent


async def _loads_everywhere(backend: siglo.Backend, mine: Checkpoint) -> None:
    """``mine`` loads byte for byte from this adapter and from a fresh one (another
    process's: its bodies read from the table)."""
    a: Any = backend.raw_adapter
    got = await a.get_checkpoint("run")
    assert got is not None and got.to_json() == mine.to_json()
    other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
    got = await other.get_checkpoint("run")
    assert got is not None and got.to_json() == mine.to_json()


async def test_a_save_in_parts_is_three_statements_on_sqlite() -> None:
    # The compare-and-set answers the digests stored (RETURNING), then one INSERT of the
    # new bodies and one DELETE of the dropped ones, whatever their number.
    async with open_backend("sqlite-file") as backend:
        a: Any = backend.raw_adapter
        _parts_only(a)
        await a.save_checkpoint(_doc(1, 8))
        sent = _record_plans(a)
        # step-3 changed to a body of another length, step-8 and step-9 added
        mine = _doc(2, 10, changed=3, longer=1)
        await a.save_checkpoint(mine, expected_revision=1)
        assert sent == ["UPDATE", "INSERT", "DELETE"]
        assert await _digests(backend) == set(split(mine).bodies)
        await _loads_everywhere(backend, mine)


async def test_a_context_changed_to_one_as_long_is_written_over_its_row_on_sqlite() -> None:
    # A changed context as long as the one its step had (the body kept from the last
    # save) is written over the row of the one it drops: one UPDATE each, no DELETE.
    async with open_backend("sqlite-file") as backend:
        a: Any = backend.raw_adapter
        _parts_only(a)
        await a.save_checkpoint(_doc(1, 8))
        sent = _record_plans(a)
        mine = _doc(2, 9, changed=3)  # step-3 changed (as long), step-8 added
        await a.save_checkpoint(mine, expected_revision=1)
        assert sent == ["UPDATE", "UPDATE", "INSERT"]
        assert await _digests(backend) == set(split(mine).bodies)
        await _loads_everywhere(backend, mine)
        # And back: step-3's first body written over the row of the second.
        sent.clear()
        back = _doc(3, 9)
        await a.save_checkpoint(back, expected_revision=2)
        assert sent == ["UPDATE", "UPDATE"]
        assert await _digests(backend) == set(split(back).bodies)
        await _loads_everywhere(backend, back)


async def test_a_body_two_steps_shared_is_written_over_once_on_sqlite() -> None:
    # step-1 and step-2 share one row. A body another step still names is never written
    # over; once both change to bodies as long, one is written over the shared row and
    # the other inserted.
    async with open_backend("sqlite-file") as backend:
        a: Any = backend.raw_adapter
        same = {"output": "s" * 12_000}
        first = _doc(1, 6)
        first = first.replace(contexts={**first.contexts, "step-1": same, "step-2": same})
        _parts_only(a)
        await a.save_checkpoint(first)
        sent = _record_plans(a)
        saves = [
            # step-1 alone: the shared body stays (step-2 names it), the new one inserted
            ({"step-1": {"output": "t" * 12_000}}, ["UPDATE", "INSERT"]),
            # step-1 back to the shared body, step-2 away from it: the body step-2 had is
            # still step-1's, so step-2's new one is inserted; step-1's last one dropped
            (
                {"step-1": same, "step-2": {"output": "u" * 12_000}},
                ["UPDATE", "INSERT", "DELETE"],
            ),
            # both as long and new, both dropping a body: each written over a row
            (
                {"step-1": {"output": "v" * 12_000}, "step-2": {"output": "w" * 12_000}},
                ["UPDATE", "UPDATE", "UPDATE"],
            ),
            # both the same new body: written over one of the rows, the other dropped
            (
                {"step-1": {"output": "x" * 12_000}, "step-2": {"output": "x" * 12_000}},
                ["UPDATE", "UPDATE", "DELETE"],
            ),
            # step-4 takes step-5's body: step-4's old one dropped, the new one stored
            ({"step-4": first.contexts["step-5"]}, ["UPDATE", "DELETE"]),
        ]
        mine = first
        for revision, (changes, statements) in enumerate(saves, start=2):
            mine = mine.replace(revision=revision, contexts={**mine.contexts, **changes})
            sent.clear()
            await a.save_checkpoint(mine, expected_revision=revision - 1)
            assert sent == statements, changes
            assert await _digests(backend) == set(split(mine).bodies)
            await _loads_everywhere(backend, mine)


async def _layout(backend: siglo.Backend, mine: Checkpoint) -> str:
    """How the row of ``mine`` is stored: ``"whole"`` (no parts list, no parts rows) or
    ``"parts"`` (exactly the bodies of its contexts)."""
    rows = await _rows(backend, "SELECT parts FROM {p}checkpoints")
    if rows[0][0] is None:
        assert await _digests(backend) == set()
        return "whole"
    assert await _digests(backend) == set(split(mine).bodies)
    return "parts"


@KINDS
async def test_a_row_that_keeps_its_length_is_saved_whole_on_sqlite(kind: str) -> None:
    # SQLite writes a row of unchanged length over the old one, rewriting only the pages
    # whose bytes differ: a row whose saves keep its length is saved whole from its
    # fourth save, and goes back to parts once its length changes more often than
    # MOST_CHANGES in WINDOW saves. PostgreSQL rewrites a row whole whatever its length:
    # parts throughout.
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        sqlite = a._s.parts_replace is not None
        await a.save_checkpoint(_doc(1, 8))
        layouts = []
        for revision in range(2, 8):  # one context replaced by one as long
            mine = _doc(revision, 8, changed=revision)
            await a.save_checkpoint(mine, expected_revision=revision - 1)
            layouts.append(await _layout(backend, mine))
            await _loads_everywhere(backend, mine)
        assert layouts == (["parts"] * 2 + ["whole"] * 4 if sqlite else ["parts"] * 6)
        # Another process (its own memory) loads the row and saves it as long: in parts.
        other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        loaded = await other.get_checkpoint("run")
        assert loaded is not None and loaded.to_json() == mine.to_json()
        theirs = _doc(8, 8, changed=3)
        await other.save_checkpoint(theirs, expected_revision=7)
        assert await _layout(backend, theirs) == "parts"
        await _loads_everywhere(backend, theirs)
        # This one saves it whole again: its saves kept the length.
        mine = _doc(9, 8, changed=4)
        await a.save_checkpoint(mine, expected_revision=8)
        assert await _layout(backend, mine) == ("whole" if sqlite else "parts")
        await _loads_everywhere(backend, mine)
        layouts.clear()
        for revision in range(10, 13):  # step-1 grows each save
            mine = _doc(revision, 8, changed=1, longer=revision)
            await a.save_checkpoint(mine, expected_revision=revision - 1)
            layouts.append(await _layout(backend, mine))
            await _loads_everywhere(backend, mine)
        assert layouts == (["whole"] * MOST_CHANGES + ["parts"] if sqlite else ["parts"] * 3)


async def test_a_row_longer_than_in_place_max_bytes_stays_in_parts_on_sqlite() -> None:
    async with open_backend("sqlite-file") as backend:
        a: Any = backend.raw_adapter
        steps = IN_PLACE_MAX_BYTES // 12_000 + 1
        await a.save_checkpoint(_doc(1, steps))
        for revision in range(2, 8):
            mine = _doc(revision, steps, changed=revision)
            assert len(mine.to_json()) > IN_PLACE_MAX_BYTES
            await a.save_checkpoint(mine, expected_revision=revision - 1)
            assert await _layout(backend, mine) == "parts"
        await _loads_everywhere(backend, mine)


def test_same_length_rows_decides_by_the_last_window_of_saves() -> None:
    rows = SameLengthRows()
    key, n = b"k", 100_000
    decided = []
    for _ in range(6):
        decided.append(rows.whole(key, n))
        rows.saved(key, n)
    assert decided == [False, False, False, True, True, True]
    # Length changes: whole while the window holds at most MOST_CHANGES of them (the
    # save being decided among them).
    decided.clear()
    for i in range(1, MOST_CHANGES + 2):
        decided.append(rows.whole(key, n + i))
        rows.saved(key, n + i)
    assert decided == [True] * MOST_CHANGES + [False]
    # Back to n: four changes in the window (n+1, n+2, n+3, n), whole again once two
    # of them have left it (WINDOW 8, MOST_CHANGES 2).
    assert (WINDOW, MOST_CHANGES) == (8, 2)
    decided.clear()
    for _ in range(WINDOW):
        decided.append(rows.whole(key, n))
        rows.saved(key, n)
    assert decided == [False] * 6 + [True] * 2
    # Never above IN_PLACE_MAX_BYTES; never for a row it has not seen.
    long = IN_PLACE_MAX_BYTES + 1
    for _ in range(4):
        rows.saved(b"long", long)
    assert rows.whole(b"long", long) is False
    assert rows.whole(b"unseen", n) is False


def test_same_length_rows_forgets_the_least_recently_saved() -> None:
    rows = SameLengthRows(max_rows=2)
    for _ in range(3):
        for key in (b"a", b"b"):
            rows.saved(key, 100_000)
    assert rows.whole(b"a", 100_000) and rows.whole(b"b", 100_000)
    rows.saved(b"c", 100_000)  # a, saved least recently, is forgotten
    assert not rows.whole(b"a", 100_000) and rows.whole(b"b", 100_000)
    nothing = SameLengthRows(max_rows=0)
    for _ in range(5):
        nothing.saved(b"a", 100_000)
    assert not nothing.whole(b"a", 100_000)


@KINDS
async def test_a_load_of_a_row_it_saved_reads_the_row_alone(kind: str) -> None:
    # The bodies kept from its save are the ones the row names: the load reads the row
    # (skeleton, parts list and version) and assembles the document from them, byte for
    # byte.
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        mine = _doc(1, 10)
        await a.save_checkpoint(mine)
        sent: list[str] = []
        read = a.database.read

        async def recorded(sql: str, params: Any = ()) -> Any:
            sent.append(sql)
            return await read(sql, params)

        a.database.read = recorded
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()
        assert sent == [a._s.cp_get_version]
        if kind == "postgres":
            # The version it read is the one its next save replaces: one statement.
            calls = _count_calls(backend)
            await a.save_checkpoint(_doc(2, 10, changed=4), expected_revision=1)
            assert calls == {"write": 1, "run_plan": 0}
            sent.clear()
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == _doc(2, 10, changed=4).to_json()
            assert sent == [a._s.cp_get_version]
            mine = _doc(2, 10, changed=4)
        # A row it saved whole since is read whole, by the same one statement.
        small = _doc(mine.revision + 1, 1)
        assert len(small.to_json()) < DEFAULT_INCREMENTAL_MIN_BYTES
        await a.save_checkpoint(small, expected_revision=mine.revision)
        sent.clear()
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == small.to_json()
        assert sent == [a._s.cp_get_version]


@KINDS
async def test_a_save_after_a_load_hashes_only_the_contexts_that_changed(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that loads a row another saved keeps its bodies: its save of the loaded
    # checkpoint with one context changed hashes that one, and (SQLite) its next load
    # reads the row alone.
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        await a.save_checkpoint(_doc(1, 8))
        loaded = await other.get_checkpoint("run")
        assert loaded is not None
        hashed: list[bytes] = []
        digest = siglo.parts.body_digest

        def counted(body: bytes) -> bytes:
            hashed.append(body)
            return digest(body)

        monkeypatch.setattr(siglo.parts, "body_digest", counted)
        mine = _doc(2, 8, changed=5)
        await other.save_checkpoint(mine, expected_revision=1)
        assert len(hashed) == 1 and b'"c' in hashed[0]
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()
        sent: list[str] = []
        read = a.database.read

        async def recorded(sql: str, params: Any = ()) -> Any:
            sent.append(sql)
            return await read(sql, params)

        a.database.read = recorded
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()
        assert sent == [a._s.cp_get_version]


@KINDS
async def test_a_load_after_another_writers_save_reads_its_bodies(kind: str) -> None:
    # Another writer (an adapter with its own memory, as another process) changed a
    # context: the digest the row names is not the one kept, so the bodies are read.
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        await a.save_checkpoint(_doc(1, 8))
        theirs = _doc(2, 8, changed=3)
        await other.save_checkpoint(theirs, expected_revision=1)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == theirs.to_json()
        # The same bodies as its own save again, written by the other: read from memory.
        again = _doc(3, 8)
        await other.save_checkpoint(again, expected_revision=2)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == again.to_json()
        small = _doc(4, 1)  # stored whole
        await other.save_checkpoint(small, expected_revision=3)
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == small.to_json()
        await other.delete_checkpoint("run")
        assert await a.get_checkpoint("run") is None


async def test_a_load_from_kept_bodies_of_another_writers_row_on_postgres() -> None:
    # Another connection (its own memory, as another process) saves the row with the
    # bodies this adapter keeps: the load reads the row alone and serves the kept
    # bodies (the digests match), learns the row's version, and its save over the
    # other's is one statement that leaves exactly its own parts. When the other then
    # replaces a body, the digest differs and the stored bodies are read.
    async with open_backend("postgres") as backend:
        a: Any = backend.raw_adapter
        await a.save_checkpoint(_doc(1, 8))
        async with siglo.connect(POSTGRES_URL, schema=a.schema) as other:
            await other.adapter.save_checkpoint(_doc(2, 8), expected_revision=1)
            sent: list[str] = []
            read = a.database.read

            async def recorded(sql: str, params: Any = ()) -> Any:
                sent.append(sql)
                return await read(sql, params)

            a.database.read = recorded
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == _doc(2, 8).to_json()
            assert sent == [a._s.cp_get_version]
            calls = _count_calls(backend)
            mine = _doc(3, 9, changed=6)
            await a.save_checkpoint(mine, expected_revision=2)
            assert calls == {"write": 1, "run_plan": 0}
            assert await _digests(backend) == set(split(mine).bodies)
            theirs = _doc(4, 9, changed=2)
            await other.adapter.save_checkpoint(theirs, expected_revision=3)
            sent.clear()
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == theirs.to_json()
            # The bodies that differ from those kept (step-2 changed, step-6 back to its
            # first body) alone are read, after the row; its own save next: the row alone.
            assert sent == [a._s.cp_get_version, a._template("parts_some", 2)]
            mine = _doc(5, 9, changed=7)
            await a.save_checkpoint(mine, expected_revision=4)
            sent.clear()
            got = await a.get_checkpoint("run")
            assert got is not None and got.to_json() == mine.to_json()
            assert sent == [a._s.cp_get_version]


async def test_versions_kept_are_bounded_on_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    # The versions remembered are bounded by their digests: past the bound the rows saved
    # least recently are forgotten, and their next save reads what is stored.
    import siglo_sql.adapter

    monkeypatch.setattr(siglo_sql.adapter, "_VERSION_DIGESTS", 20)
    async with open_backend("postgres") as backend:
        a: Any = backend.raw_adapter
        for stack in ("one", "two", "three"):  # 6 digests and the row: 7 each
            await a.save_checkpoint(_doc(1, 6, stack=stack))
        assert a._versions_size <= 20 and len(a._versions) == 2
        calls = _count_calls(backend)
        await a.save_checkpoint(_doc(2, 6, stack="one", changed=1), expected_revision=1)
        assert calls == {"write": 0, "run_plan": 1}  # forgotten: the long way
        await a.save_checkpoint(_doc(2, 6, stack="three", changed=1), expected_revision=1)
        assert calls == {"write": 1, "run_plan": 1}  # remembered: one statement
        got = await a.get_checkpoint("one")
        assert got is not None and got.to_json() == _doc(2, 6, stack="one", changed=1).to_json()


async def test_an_unlocking_save_of_a_known_version_releases_the_lock_on_postgres() -> None:
    # The action's last save with the lock's release: the one statement and the release
    # in one transaction; the lock is free afterwards and the parts are the new ones.
    async with open_backend("postgres") as backend:
        a: Any = backend.raw_adapter
        await a.save_checkpoint(_doc(1, 6))
        lock = a.workflow_lock
        key = workflow_lock_key("run", None)
        calls = _count_calls(backend)
        sent: list[str] = []
        plan = a.database.run_plan

        async def recorded(steps: Any) -> None:
            def each() -> Any:
                step = next(steps)
                try:
                    while True:
                        sent.append(step[0])
                        step = steps.send((yield step))
                except StopIteration:
                    return

            await plan(each())

        a.database.run_plan = recorded
        mine = _doc(2, 6, changed=3)

        async def action() -> None:
            await a.save_checkpoint_unlocking(mine, expected_revision=1)

        await run_with_lock(lock, key, action)
        assert calls["run_plan"] == 1 and len(sent) == 2  # the statement, the release
        assert sent[0].startswith("WITH up AS (UPDATE")
        assert (await lock.acquire(key, 1_000)).acquired  # released
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()
        assert await _digests(backend) == set(split(mine).bodies)


@KINDS
async def test_shrinking_deleting_and_expiring_leave_no_parts(kind: str) -> None:
    clock = siglo.ManualClock(1_000)
    async with open_backend(kind, clock=clock) as backend:
        a = backend.adapter
        await a.save_checkpoint(_doc(1, 6))
        small = Checkpoint(stack_id="run", revision=2, timestamp=2, contexts={"s": {"a": 1}})
        await a.save_checkpoint(small, expected_revision=1)
        assert await _digests(backend) == set()  # stored whole again: its parts dropped
        assert await a.get_checkpoint("run") == small
        await a.save_checkpoint(_doc(3, 6), expected_revision=2)
        assert await a.delete_checkpoint("run") is True
        assert await _digests(backend) == set()
        await a.save_checkpoint(_doc(1, 6).replace(expires_at=2_000))
        clock.advance(5_000)
        assert await a.get_checkpoint("run") is None
        assert await a.clean_expired_checkpoints() == 1
        assert await _digests(backend) == set()


@KINDS
async def test_concurrent_saves_leave_one_document_and_no_stray_parts(kind: str) -> None:
    async with open_backend(kind) as backend:
        a = backend.adapter
        await a.save_checkpoint(_doc(1, 6))
        tries = [a.save_checkpoint(_doc(2, 6, changed=i), expected_revision=1) for i in range(5)]
        results = await asyncio.gather(*tries, return_exceptions=True)
        won = [i for i, r in enumerate(results) if r is None]
        assert len(won) == 1
        assert all(isinstance(r, CheckpointConflictError) for r in results if r is not None)
        got = await a.get_checkpoint("run")
        want = _doc(2, 6, changed=won[0])
        assert got is not None and got.to_json() == want.to_json()
        assert await _digests(backend) == set(split(want).bodies)


@KINDS
async def test_a_read_that_meets_a_newer_save_reads_again(kind: str) -> None:
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        await a.save_checkpoint(_doc(1, 6))
        rows = await _rows(backend, "SELECT id, document, parts FROM {p}checkpoints")
        key, skeleton, parts = (bytes(v) for v in rows[0])
        # The row read before a save that replaced two of its parts.
        await a.save_checkpoint(_doc(2, 6, changed=1), expected_revision=1)
        got = await a._whole(key, skeleton, parts)
        assert got.to_json() == _doc(2, 6, changed=1).to_json()


@KINDS
async def test_a_body_dropped_between_the_row_and_its_read_reads_again(kind: str) -> None:
    # The load reads the row (another writer changed step-3), then that writer's next
    # save drops the body before the load reads it: the row and its bodies are read
    # together, and the document is the one stored now.
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        await a.save_checkpoint(_doc(1, 8))
        await other.save_checkpoint(_doc(2, 8, changed=3), expected_revision=1)
        newest = _doc(3, 8, changed=4)
        sent: list[str] = []
        read = a.database.read

        async def racing(sql: str, params: Any = ()) -> Any:
            sent.append(sql)
            rows = await read(sql, params)
            if sql == a._s.cp_get_version and len(sent) == 1:
                await other.save_checkpoint(newest, expected_revision=2)
            return rows

        a.database.read = racing
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == newest.to_json()
        assert sent == [a._s.cp_get_version, a._template("parts_some", 1), a._s.cp_load]


@KINDS
async def test_a_fallback_read_whose_namespaced_row_goes_reads_the_other(kind: str) -> None:
    """A namespaced read with the fallback finds the namespace's row, saved in parts, and
    another writer deletes that row before its parts are read: the read answered "no
    checkpoint" while the un-namespaced one was there throughout (a black-box auditor:
    701 of 55,831 such reads). The fallback decides again and reads the un-namespaced
    checkpoint."""
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        plain = _doc(1, 2)
        await a.save_checkpoint(plain)
        await a.save_checkpoint(_doc(1, 8, changed=2).replace(namespace="t"))
        read = a.database.read
        sent: list[str] = []

        async def racing(sql: str, params: Any = ()) -> Any:
            sent.append(sql)
            rows = await read(sql, params)
            if sql == a._s.cp_get_fallback and len(sent) == 1:
                assert await other.delete_checkpoint("run", "t")
            return rows

        a.database.read = racing
        got = await a.get_checkpoint("run", "t", fallback=True)
        assert got is not None and got.to_json() == plain.to_json()
        assert sent[0] == a._s.cp_get_fallback and sent[-1] == a._s.cp_get_fallback


@KINDS
async def test_a_fallback_read_whose_row_is_saved_again_as_it_was_is_no_error(kind: str) -> None:
    """The namespace's row, saved in parts, is deleted after the fallback read found it
    and saved again as it was (``siglo rm``, then an import of a dump) before the read
    looked at the row a second time: the same row, and parts missing when read apart,
    were taken for a malformed record ("a part the row lists is not stored"; a black-box
    auditor, PostgreSQL). The row found is read with its parts, in one snapshot."""
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        other = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        plain = _doc(1, 2)
        namespaced = _doc(1, 8, changed=2).replace(namespace="t")
        await a.save_checkpoint(plain)
        await a.save_checkpoint(namespaced)
        read = a.database.read
        calls: list[str] = []

        async def racing(sql: str, params: Any = ()) -> Any:
            calls.append(sql)
            rows = await read(sql, params)
            if len(calls) == 1:
                assert await other.delete_checkpoint("run", "t")
            elif len(calls) == 2:
                await other.save_checkpoint(namespaced)
            return rows

        a.database.read = racing
        got = await a.get_checkpoint("run", "t", fallback=True)
        # What was stored at one moment or another: the namespace's, or while it had
        # none, the un-namespaced one.
        assert got is not None and got.to_json() in (namespaced.to_json(), plain.to_json())
        assert len(calls) >= 2


@KINDS
async def test_a_part_missing_from_the_store_is_a_malformed_record(kind: str) -> None:
    """A part the row lists that is not stored (deleted by hand, a partial restore):
    the load read it ten times as if a save kept changing it, and said "try again" —
    a store that cannot be reached, by its error's kind (a black-box auditor, through
    ``siglo collect-blobs``). It is a malformed record, as a garbled document is."""
    async with open_backend(kind) as backend:
        a: Any = backend.raw_adapter
        await a.save_checkpoint(_doc(1, 6))
        tables = _tables(backend)
        rows = await a.database.fetch(f"SELECT digest FROM {tables}checkpoint_parts")
        await a.database.fetch(
            f"DELETE FROM {tables}checkpoint_parts WHERE digest = %(d)s"
            if kind == "postgres"
            else f"DELETE FROM {tables}checkpoint_parts WHERE digest = :d",
            {"d": bytes(rows[0][0])},
        )
        cold = SqlStorageAdapter(a.database, a._s, table_prefix=a.table_prefix, schema=a.schema)
        with pytest.raises(siglo.MalformedRecordError, match="lists a part that is not stored"):
            await cold.get_checkpoint("run")


@KINDS
async def test_cancel_workflow_keeps_the_parts(kind: str) -> None:
    async with open_backend(kind) as backend:
        a = backend.adapter
        await a.save_checkpoint(_doc(1, 6))
        await a.cancel_workflow("run")
        got = await a.get_checkpoint("run")
        assert got is not None and got.status == "cancelled" and got.revision == 2
        assert got.contexts == _doc(1, 6).contexts


@KINDS
async def test_incremental_min_bytes_none_stores_whole(kind: str) -> None:
    async with open_backend(kind, incremental_min_bytes=None) as backend:
        await backend.adapter.save_checkpoint(_doc(1, 10))
        assert await _digests(backend) == set()
        rows = await _rows(backend, "SELECT parts FROM {p}checkpoints")
        assert rows[0][0] is None


@KINDS
async def test_a_migrated_store_reads_as_before_and_moves_to_parts(kind: str) -> None:
    async with v1_database(kind) as url, siglo.connect(url) as backend:
        await check_v1_data(backend)
        a = backend.adapter
        old = await a.get_checkpoint("stack-1")
        assert old is not None
        grown = old.replace(
            revision=old.revision + 1,
            contexts={**old.contexts, "big": {"text": "b" * 70_000}},
        )
        await a.save_checkpoint(grown, expected_revision=old.revision)
        got = await a.get_checkpoint("stack-1")
        assert got is not None and got.to_json() == grown.to_json()
        assert len(await _digests(backend)) == len(grown.contexts)


_KEY = base64.b64encode(bytes(range(32))).decode()


def _encrypting(raw: Any) -> Any:
    """``raw`` behind a pipeline that encrypts (a process of its own: its own codecs)."""
    return pipeline_adapter(raw, Pipeline(Settings(encryption_keys={"k1": _KEY})))


@KINDS
async def test_with_encryption_an_unchanged_context_is_not_written_again(kind: str) -> None:
    # Every save sealed every context with a fresh nonce, so each was new bytes and
    # every save wrote every part again (21 saves of 8 contexts, one changing: 188 part
    # rows on PostgreSQL instead of 28). Sealed, an unchanged context keeps its bytes.
    async with open_backend(kind) as backend:
        raw: Any = backend.raw_adapter
        _parts_only(raw)
        a = _encrypting(raw)
        await a.save_checkpoint(_doc(1, 8))
        first = await _digests(backend)
        assert len(first) == 8
        stored = await raw.get_checkpoint("run")
        assert stored is not None and SEALED_KEY in stored.contexts["step-0"]
        # step-2 changes: its part alone is written, under a new ciphertext.
        await a.save_checkpoint(_doc(2, 8, changed=2), expected_revision=1)
        second = await _digests(backend)
        assert len(second - first) == 1 and len(first - second) == 1
        again = await raw.get_checkpoint("run")
        assert again is not None
        assert again.contexts["step-2"] != stored.contexts["step-2"]
        assert all(
            again.contexts[s] == stored.contexts[s] for s in stored.contexts if s != "step-2"
        )
        # Saved again as they are: nothing written.
        for revision in (3, 4):
            await a.save_checkpoint(_doc(revision, 8, changed=2), expected_revision=revision - 1)
            assert await _digests(backend) == second
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == _doc(4, 8, changed=2).to_json()
        # Another process (its own codecs and bodies) loads it and saves it with step-6
        # changed: the contexts it loaded keep their ciphertexts, step-6 alone is written.
        other = _encrypting(
            SqlStorageAdapter(
                raw.database, raw._s, table_prefix=raw.table_prefix, schema=raw.schema
            )
        )
        loaded = await other.get_checkpoint("run")
        assert loaded is not None and loaded.to_json() == got.to_json()
        contexts = dict(loaded.contexts)
        contexts["step-6"] = {"output": "n" * 12_000, "i": 6}
        mine = loaded.replace(revision=5, timestamp=5, contexts=contexts)
        await other.save_checkpoint(mine, expected_revision=4)
        third = await _digests(backend)
        assert len(third - second) == 1 and len(second - third) == 1
        got = await a.get_checkpoint("run")
        assert got is not None and got.to_json() == mine.to_json()


def test_assemble_gives_back_the_saved_bytes() -> None:
    cp = Checkpoint(
        stack_id='s"contexts":{}',
        revision=1,
        timestamp=1,
        contexts={"ü名": {"a": [1, None]}, "b": {}, "c": {"a": [1, None]}, "": {"x": "y"}},
        metadata={"contexts": {}},
        extra={"future": {"contexts": {}}},
    )
    cut = split(cp)
    assert len(cut.bodies) == 3  # two steps share one body
    assert assemble(cut.skeleton, cut.parts, cut.bodies) == cp.to_json()
    assert assemble(cut.skeleton, cut.parts, {}) is None
    empty = cp.replace(contexts={})
    cut = split(empty)
    assert assemble(cut.skeleton, cut.parts, cut.bodies) == empty.to_json()


def test_incremental_min_bytes_in_the_url(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'u.db'}"
    assert (
        siglo.connect(f"{url}?incremental_min_bytes=none").raw_adapter.incremental_min_bytes is None
    )  # type: ignore[attr-defined]
    assert siglo.connect(f"{url}?incremental_min_bytes=0").raw_adapter.incremental_min_bytes == 0  # type: ignore[attr-defined]
    with pytest.raises(siglo.InvalidArgumentError, match="incremental_min_bytes"):
        siglo.connect(f"{url}?incremental_min_bytes=-1")
