"""A walk over every stored stack that must carry each one (an export, a re-key, a blob
collection) and meets a stack whose stored checkpoint siglo cannot read stops there and
names it, and `siglo rm` removes it (docs/operating.md); a listing filtered by metadata
leaves it out and names it (siglo.unreadable, tests/core/test_unreadable_listings.py).
Every such walk reads through `siglo.listing.get_listed`."""

from __future__ import annotations

import ast
import asyncio
import pickle
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import siglo
from siglo.cli import cli
from siglo.errors import CheckpointVersionError, MalformedRecordError, naming_stack
from siglo.listing import CheckpointSummary, get_listed

ROOT = Path(__file__).resolve().parents[2]


async def _store_with_a_broken_stack(path: Path) -> str:
    url = f"sqlite:///{path}"
    async with siglo.connect(url) as backend:
        manager = siglo.StorageManager(backend)
        for stack_id, namespace in (("a", None), ("broken", "t1"), ("c", None)):
            await manager.save(manager.create_stack(stack_id=stack_id, namespace=namespace))
    raw = sqlite3.connect(path)
    with raw:
        raw.execute(
            "UPDATE siglo_checkpoints SET document = ? WHERE stack_id = 'broken'", (b"{not",)
        )
    raw.close()
    return url


def test_export_and_show_name_the_stack_they_cannot_read_and_rm_removes_it(tmp_path: Path) -> None:
    url = asyncio.run(_store_with_a_broken_stack(tmp_path / "x.db"))
    runner = CliRunner()
    failed = runner.invoke(cli, ["export", url], catch_exceptions=False)
    assert failed.exit_code != 0
    assert "in the stored checkpoint of stack 'broken' (namespace 't1')" in failed.stderr
    assert "`siglo rm URL broken --namespace t1`" in failed.stderr
    shown = runner.invoke(cli, ["show", url, "broken", "--namespace", "t1"])
    assert shown.exit_code != 0
    assert "in the stored checkpoint of stack 'broken' (namespace 't1')" in shown.stderr
    assert "`siglo rm URL broken --namespace t1`" in shown.stderr
    assert runner.invoke(cli, ["rm", url, "broken", "--namespace", "t1"]).exit_code == 0
    done = runner.invoke(cli, ["export", url], catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    assert done.stdout.count('"kind":"checkpoint"') == 2


def _summary(stack_id: str, namespace: str | None) -> CheckpointSummary:
    return CheckpointSummary(
        stack_id=stack_id,
        namespace=namespace,
        workflow_id=None,
        status="running",
        revision=0,
        timestamp=0,
        expires_at=None,
    )


async def test_get_listed_names_the_stack(tmp_path: Path) -> None:
    url = await _store_with_a_broken_stack(tmp_path / "x.db")
    async with siglo.connect(url) as backend:
        listed = _summary("broken", "t1")
        with pytest.raises(MalformedRecordError) as raised:
            await get_listed(backend.adapter, listed)
        assert raised.value.stack_id == "broken"  # type: ignore[attr-defined]
        assert raised.value.namespace == "t1"  # type: ignore[attr-defined]
        assert raised.value.field == "<document>"
        found = await get_listed(backend.adapter, _summary("a", None))
        assert found is not None and found.stack_id == "a"


def test_naming_keeps_the_error_type_and_its_fields() -> None:
    named = naming_stack(CheckpointVersionError(9), "s", None)
    assert type(named) is CheckpointVersionError
    assert named.version == 9 and named.field == "version"
    assert str(named).endswith("in the stored checkpoint of stack 's'")
    back = pickle.loads(pickle.dumps(named))
    assert str(back) == str(named) and back.stack_id == "s"  # type: ignore[attr-defined]


def test_every_walk_over_listed_stacks_reads_through_get_listed() -> None:
    """No module of siglo reads a listed stack's checkpoint by hand: a call
    ``get_checkpoint(summary.stack_id, …)`` would miss the naming."""
    by_hand = []
    for path in (ROOT / "siglo").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        reader = [  # the lines of the one reader itself
            range(node.lineno, (node.end_lineno or node.lineno) + 1)
            for node in ast.walk(tree)
            if isinstance(node, ast.AsyncFunctionDef) and node.name == "get_listed"
        ]
        for node in ast.walk(tree):
            if any(getattr(node, "lineno", 0) in lines for lines in reader):
                continue
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get_checkpoint"
                and node.args
                and ast.unparse(node.args[0]).endswith("summary.stack_id")
            ):
                by_hand.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert by_hand == [], by_hand


# The walks that read listed stacks: those that stop at one they cannot read (what they
# write must hold every stack), and those that leave it out (listings); and the readers of
# the one run asked for (`siglo show`, the dashboard's run page), whose error names it.
_STOPPING = {"siglo/transfer.py", "siglo/rekeying.py", "siglo/offload.py"}
_LEAVING_OUT = {"siglo/blind.py"}
_ONE_RUN = {"siglo/cli/store.py", "siglo/ui/data.py"}
_READERS = {"get_listed", "read_run"}
"""`read_run` (siglo.stored_runs): a run and its waits as the store held them."""


def test_every_reader_of_listed_stacks_stops_or_leaves_out() -> None:
    """Each call of `get_listed` or `read_run` is in a walk that must stop (named above),
    in a listing's ``try`` whose handler catches `siglo.unreadable.UNREADABLE`, or reads
    the one run asked for: a new one is placed in one list or another here, on
    purpose."""
    found: dict[str, list[bool]] = {}
    for path in (ROOT / "siglo").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.Try)
            and any(
                h.type is not None and ast.unparse(h.type) == "UNREADABLE" for h in node.handlers
            )
            for statement in node.body
            for inner in ast.walk(statement)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in _READERS
            ):
                name = str(path.relative_to(ROOT))
                found.setdefault(name, []).append(id(node) in guarded)
    assert set(found) == _STOPPING | _LEAVING_OUT | _ONE_RUN, found
    for name, calls in found.items():
        assert all(calls) if name in _LEAVING_OUT else not any(calls), (name, calls)


async def test_a_wait_record_siglo_cannot_read_is_named_by_show_and_get(tmp_path: Path) -> None:
    """SQL: `get_wait_record` — by correlation key, or by stack id (the stack's latest) —
    and `siglo show` of its stack name the record and its stack when its document cannot
    be read, and hint the `siglo rm` that removes the stack."""
    from siglo import Checkpoint, WaitRecord

    path = tmp_path / "w.db"
    url = f"sqlite:///{path}"
    async with siglo.connect(url) as backend:
        await backend.adapter.save_checkpoint(
            Checkpoint(stack_id="broken", namespace="t1", revision=1, timestamp=1)
        )
        await backend.adapter.save_wait_record(
            WaitRecord(correlation_key="approve-1", stack_id="broken", namespace="t1")
        )
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("UPDATE siglo_wait_records SET document = ?", (b"{not",))
    raw.close()
    named = "in the stored wait record 'approve-1' of stack 'broken' (namespace 't1')"
    async with siglo.connect(url) as backend:
        for lookup in ("approve-1", "broken"):
            with pytest.raises(MalformedRecordError) as raised:
                await backend.adapter.get_wait_record(lookup, namespace="t1")
            assert str(raised.value).endswith(named), lookup
            assert raised.value.stack_id == "broken"  # type: ignore[attr-defined]
    shown = await asyncio.to_thread(
        CliRunner().invoke, cli, ["show", url, "broken", "--namespace", "t1"]
    )
    assert shown.exit_code == 1
    assert named in shown.stderr
    assert "siglo cannot read that wait record as stored" in shown.stderr
    assert "`siglo rm URL broken --namespace t1`" in shown.stderr
