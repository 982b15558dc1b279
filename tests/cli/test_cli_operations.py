"""``siglo ls / show / rm / prune / clean / export / import`` against real SQLite,
PostgreSQL and Redis stores (SPEC §9)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Checkpoint, WaitRecord
from siglo.cli import cli
from siglo.cli.store import parse_duration
from siglo.clock import system_clock
from siglo.redaction import REDACTED
from siglo.transfer import ImportReport, import_lines


async def invoke(*args: str, input: bytes | None = None) -> Result:
    # In a thread: each command runs its own event loop, as in a shell.
    return await asyncio.to_thread(
        CliRunner().invoke, cli, list(args), input=input, catch_exceptions=False
    )


async def fill(backend: siglo.Backend, *, old_ms: int = 30 * 86_400_000) -> None:
    """Six stacks: two namespaces, finished and not, old and new; a waiting run's wait."""
    a = backend.adapter
    now = system_clock.now_ms()
    rows: list[tuple[str, str | None, str, int]] = [
        ("done-old", "shop", "completed", now - old_ms),
        ("failed-old", "shop", "failed", now - old_ms),
        ("done-new", "shop", "completed", now),
        ("running-old", "shop", "running", now - old_ms),
        ("other-old", "billing", "completed", now - old_ms),
        ("plain", None, "waiting", now),
    ]
    for stack_id, namespace, status, timestamp in rows:
        metadata: dict[str, Any] = {"input": {"card": REDACTED}}
        if status == "waiting":
            wait = WaitRecord(correlation_key="approve:plain", stack_id=stack_id, step_id="s")
            await a.save_wait_record(wait)
            metadata["waitRecord"] = wait.to_wire()
        await a.save_checkpoint(
            Checkpoint(
                stack_id=stack_id,
                namespace=namespace,
                workflow_id="orders",
                status=status,  # type: ignore[arg-type]
                revision=3,
                timestamp=timestamp,
                contexts={"s": {"card": REDACTED, "n": 1}},
                metadata=metadata,
            )
        )


@pytest.mark.parametrize("kind", DURABLE_KINDS)
@pytest.mark.rule("list.walk", "list.filters", "delete.stack")
async def test_ls_show_rm_prune_clean(kind: str) -> None:
    async with shared_store(kind) as backend:
        await fill(backend)
        url = backend.url
        listed = await invoke("ls", url, "--json")
        assert listed.exit_code == 0, listed.output
        ids = {item["stackId"] for item in json.loads(listed.output)["items"]}
        assert ids == {"done-old", "failed-old", "done-new", "running-old", "other-old", "plain"}
        page = json.loads((await invoke("ls", url, "--json", "--limit", "4")).output)
        rest = await invoke("ls", url, "--json", "--cursor", page["nextCursor"])
        assert len(page["items"]) == 4 and len(json.loads(rest.output)["items"]) == 2
        shop = json.loads(
            (await invoke("ls", url, "-n", "shop", "--status", "completed", "--json")).output
        )
        assert {i["stackId"] for i in shop["items"]} == {"done-old", "done-new"}
        table = await invoke("ls", url, "--no-namespace")
        assert "plain" in table.output and "done-old" not in table.output

        shown = await invoke("show", url, "plain", "--json")
        doc = json.loads(shown.output)
        assert doc["checkpoint"]["contexts"]["s"]["card"] == REDACTED
        assert [w["correlationKey"] for w in doc["waitRecords"]] == ["approve:plain"]
        text = (await invoke("show", url, "plain")).output
        assert REDACTED in text and "approve:plain" in text
        missing = await invoke("show", url, "nope")
        assert missing.exit_code == 1 and "no stack 'nope'" in missing.output

        dry = await invoke("prune", url, "--older-than", "7d", "--dry-run", "--json")
        would = {s["stackId"] for s in json.loads(dry.output)["stacks"]}
        assert would == {"done-old", "failed-old", "other-old"}
        assert len(json.loads((await invoke("ls", url, "--json")).output)["items"]) == 6
        pruned = await invoke("prune", url, "--older-than", "7d", "-n", "shop")
        assert pruned.exit_code == 0 and "deleted 2 stack(s)" in pruned.output
        left = {
            i["stackId"] for i in json.loads((await invoke("ls", url, "--json")).output)["items"]
        }
        assert left == {"done-new", "running-old", "other-old", "plain"}

        wrong = await invoke("rm", url, "plain", "--revision", "2")
        assert wrong.exit_code == 1 and "revision 3" in wrong.output
        assert (await invoke("rm", url, "plain")).exit_code == 0
        assert await backend.adapter.get_checkpoint("plain") is None
        assert await backend.adapter.get_wait_record("approve:plain") is None
        again = await invoke("rm", url, "plain")
        assert again.exit_code == 1
        # A revision to compare with a stack that is not there: no stack, not "revision None".
        gone = await invoke("rm", url, "plain", "--revision", "3")
        assert gone.exit_code == 1 and "no stack 'plain' to delete" in gone.output, gone.output
        assert "None" not in gone.output

        cleaned = await invoke("clean", url, "--json")
        assert cleaned.exit_code == 0
        assert "checkpoints" in json.loads(cleaned.output)


def test_durations() -> None:
    assert parse_duration("7d") == 7 * 86_400_000
    assert parse_duration("1d12h") == 36 * 3_600_000
    assert parse_duration("500ms") == 500
    import click

    for bad in ("", "7", "7 days", "d7", "7x"):
        with pytest.raises(click.BadParameter):
            parse_duration(bad)


def _documents(dump: bytes) -> list[bytes]:
    """The dump's checkpoint and wait lines, sorted (not the header, which carries the
    export time, nor the trailer, whose digest covers the header)."""
    return sorted(line for line in dump.splitlines() if line.startswith(b'{"kind"'))


@pytest.mark.parametrize(
    ("source", "target"),
    [("sqlite", "postgres"), ("postgres", "redis"), ("redis", "sqlite")],
)
async def test_export_import_export_gives_identical_documents(source: str, target: str) -> None:
    async with shared_store(source) as src, shared_store(target) as dst:
        await fill(src)
        # Hostile ids and unicode survive the trip too.
        await src.adapter.save_checkpoint(
            Checkpoint(stack_id='x:{y}*"ñ"', namespace="ns:%", revision=9, timestamp=1)
        )
        first = await invoke("export", src.url)
        assert first.exit_code == 0
        dump = first.stdout_bytes
        assert len(_documents(dump)) == 7 + 1  # seven checkpoints, one wait record
        imported = await invoke("import", dst.url, input=dump)
        assert imported.exit_code == 0, imported.output
        assert "imported 7 checkpoint(s) and 1 wait record(s)" in imported.output
        second = await invoke("export", dst.url)
        assert _documents(second.stdout_bytes) == _documents(dump)
        # The waiting run's wait went along, deliverable in the new store.
        wait = await dst.adapter.get_wait_record("approve:plain")
        assert wait is not None and wait.status == "waiting"


async def test_import_never_overwrites_newer_data_and_resumes() -> None:
    async with shared_store("sqlite") as src, shared_store("sqlite") as dst:
        await fill(src)
        dump = (await invoke("export", src.url)).stdout_bytes
        lines = dump.splitlines(keepends=True)
        # A dump cut after three checkpoints is refused, and nothing is written ...
        partial = await invoke("import", dst.url, input=b"".join(lines[:4]))
        assert partial.exit_code == 1 and "cut short" in partial.output
        assert (await dst.adapter.list_checkpoints()).items == []
        # ... an import stopped after three checkpoints ...
        written = 0

        def stop_after_three(report: ImportReport) -> None:
            nonlocal written
            written += 1
            if written == 3:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            await import_lines(dst.adapter, lines, progress=stop_after_three)
        # ... a newer revision written meanwhile in the target ...
        newer = Checkpoint(stack_id="done-new", namespace="shop", revision=4, timestamp=1)
        await dst.adapter.save_checkpoint(newer)
        # ... and the import run again: what is there, or newer, is skipped.
        rerun = await invoke("import", dst.url, input=dump)
        assert rerun.exit_code == 0
        assert "skipped 1 newer in the store" in rerun.output
        kept = await dst.adapter.get_checkpoint("done-new", "shop")
        assert kept is not None and kept.revision == 4
        page = await dst.adapter.list_checkpoints(limit=100)
        assert len(page.items) == 6


async def test_import_refuses_what_is_not_a_dump() -> None:
    async with shared_store("sqlite") as dst:
        bad = await invoke("import", dst.url, input=b'{"hello": 1}\n')
        assert bad.exit_code == 1 and "not a siglo export header" in bad.output
        assert "import a whole dump" in bad.output
        broken = await invoke("import", dst.url, input=b'{"siglo":"export","format":1}\nnot json\n')
        assert broken.exit_code == 1 and "line 2" in broken.output


async def test_clean_on_redis_drops_what_its_indexes_still_name() -> None:
    async with shared_store("redis") as backend:
        a = backend.adapter
        now = system_clock.now_ms()
        await a.save_checkpoint(Checkpoint(stack_id="brief", revision=1, timestamp=now,
                                           expires_at=now + 50))  # fmt: skip
        await a.save_checkpoint(Checkpoint(stack_id="kept", revision=1, timestamp=now))
        wait = WaitRecord(correlation_key="w", stack_id="kept", expires_at=now + 3_600_000)
        await a.save_wait_record(wait)
        await a.claim_wait_record("w", "me")
        await a.complete_wait_record("w", "me")
        await asyncio.sleep(0.2)  # Redis expires "brief"
        cleaned = json.loads((await invoke("clean", backend.url, "--json")).output)
        assert cleaned == {
            "checkpoints": 0,
            "checkpoint_index": 1,
            "wait_deadlines": 1,
            "checkpoint_parts": 0,
        }
        again = json.loads((await invoke("clean", backend.url, "--json")).output)
        assert again == {
            "checkpoints": 0,
            "checkpoint_index": 0,
            "wait_deadlines": 0,
            "checkpoint_parts": 0,
        }
        page = await a.list_checkpoints()
        assert [s.stack_id for s in page.items] == ["kept"]


@pytest.mark.parametrize("encrypting", [False, True], ids=["plain", "encrypting"])
async def test_every_path_that_prints_a_run_hides_a_key_redacted_after_it_was_stored(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, encrypting: bool
) -> None:
    """An application adopts ``redact_fields`` (and, in one case, encryption) after a
    card was stored in clear: every command that prints a stored run — ``siglo show``
    (table and ``--json``), ``siglo export`` as stored and ``--decrypt`` — gives
    ``[REDACTED]`` for that key in the contexts, the metadata, the fields siglo does not
    know and a wait record's payload, as the dashboard does: never the card (export
    ``--decrypt`` printed it, a black-box auditor)."""
    from siglo.config import reset_settings

    card = "4111-1111-1111-1111"
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with siglo.connect(url) as backend:
        wait = WaitRecord(
            correlation_key="approve:o1",
            stack_id="o1",
            step_id="s",
            event_payload={"card": card},
        )
        await backend.adapter.save_wait_record(wait)
        await backend.adapter.save_checkpoint(
            Checkpoint(
                stack_id="o1",
                revision=1,
                timestamp=1,
                status="waiting",
                contexts={"pay": {"card": card, "nested": [{"card": card}], "n": 1}},
                metadata={"input": {"card": card}, "waitRecord": wait.to_wire()},
                extra={"tsField": {"card": card}},
            )
        )
    settings = 'redact_fields = ["card"]\n'
    if encrypting:
        key = base64.b64encode(bytes(range(32))).decode()
        settings += f'encryption_keys = {{ k1 = "{key}" }}\n'
    (tmp_path / "siglo.toml").write_text(settings)
    monkeypatch.chdir(tmp_path)
    reset_settings()
    try:
        table = await invoke("show", url, "o1")
        assert table.exit_code == 0, table.output
        assert card not in table.output and REDACTED in table.output, table.output
        shown = await invoke("show", url, "o1", "--json")
        assert shown.exit_code == 0 and card not in shown.output, shown.output
        doc = json.loads(shown.output)
        pay = doc["checkpoint"]["contexts"]["pay"]
        assert pay == {"card": REDACTED, "nested": [{"card": REDACTED}], "n": 1}
        assert doc["checkpoint"]["metadata"]["input"] == {"card": REDACTED}
        assert doc["checkpoint"]["tsField"] == {"card": REDACTED}
        assert [w["eventPayload"] for w in doc["waitRecords"]] == [{"card": REDACTED}]
        for how in (["--decrypt"] if encrypting else []) + [None]:
            dump = await invoke("export", url, *([how] if how else []))
            assert dump.exit_code == 0, dump.output
            assert card not in dump.output, (how, dump.output)
            # (The CLI runner mixes stderr's "exported 1 checkpoint(s)" in.)
            lines = [json.loads(line) for line in dump.output.splitlines() if line[:1] == "{"]
            (run,) = [line["document"] for line in lines if line.get("kind") == "checkpoint"]
            (record,) = [line["record"] for line in lines if line.get("kind") == "wait"]
            assert run["contexts"]["pay"] == pay
            assert run["metadata"]["input"] == {"card": REDACTED}
            assert run["metadata"]["waitRecord"]["eventPayload"] == {"card": REDACTED}
            assert run["tsField"] == {"card": REDACTED}
            assert record["eventPayload"] == {"card": REDACTED}
    finally:
        reset_settings()


async def test_prune_tells_a_stack_gone_meanwhile_from_one_written_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stacks that expired or another process removed between prune's listing and its
    delete were reported "kept … written meanwhile" (`changed`), though nothing wrote
    them and nothing kept them (a black-box auditor). They are counted apart (`gone`);
    one really written meanwhile is still kept and counted as changed."""
    from siglo_sql.adapter import SqlStorageAdapter

    async with shared_store("sqlite") as store:
        old = system_clock.now_ms() - 3_600_000
        for name in ("gone-1", "gone-2", "kept-1", "done-1"):
            await store.adapter.save_checkpoint(
                Checkpoint(stack_id=name, revision=1, timestamp=old, status="completed")
            )
        listing = SqlStorageAdapter.list_checkpoints

        async def listed_then_raced(self: Any, **kwargs: Any) -> Any:
            page = await listing(self, **kwargs)
            if not kwargs.get("cursor"):
                # Another process, between the listing and the deletes.
                async with siglo.connect(store.url) as other:
                    for name in ("gone-1", "gone-2"):
                        await other.adapter.delete_checkpoint(name)
                    await other.adapter.save_checkpoint(
                        Checkpoint(stack_id="kept-1", revision=2, timestamp=old + 1,
                                   status="completed"),
                        expected_revision=1,
                    )  # fmt: skip
            return page

        monkeypatch.setattr(SqlStorageAdapter, "list_checkpoints", listed_then_raced)
        done = await invoke("prune", store.url, "--older-than", "1m", "--json")
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout)
        assert [s["stackId"] for s in report["stacks"]] == ["done-1"]
        assert report["changed"] == 1 and report["gone"] == 2, report


async def test_ids_and_values_are_printed_as_stored_never_as_markup_or_terminal_codes(
    tmp_path: Any,
) -> None:
    """The tables of ``ls``, ``show`` and ``prune --dry-run`` read what they print as
    rich's markup: an id ``[bold]evil[/bold]`` was listed as ``evil`` (beside a real
    ``evil``, which ``siglo rm evil`` would then remove), and one holding ``[/]`` failed
    every listing of the store; an id's escape codes reached the terminal (a window
    title set, text hidden). A black-box auditor's ids: printed as stored now, their
    control characters written out."""
    url = f"sqlite:///{tmp_path / 'ids.db'}"
    marked, closing, coded = "[bold]evil[/bold]", "job[/]1", "job\x1b]0;owned\x07\x1b[8mhidden"
    async with siglo.connect(url) as backend:
        for stack_id in (marked, "evil", closing, coded):
            cp = Checkpoint(
                stack_id=stack_id,
                revision=1,
                timestamp=1,
                status="completed",
                contexts={"s": {"note": "[red]not red[/red]\x1b[2J"}},
            )
            await backend.adapter.save_checkpoint(cp)

    async def wide(*args: str) -> Result:  # no id folded over two lines
        run = CliRunner().invoke
        return await asyncio.to_thread(run, cli, list(args), env={"COLUMNS": "400"})

    listed = await wide("ls", url)
    assert listed.exit_code == 0, listed.output
    assert marked in listed.output and closing in listed.output
    assert "\x1b" not in listed.output and "job\\x1b]0;owned\\x07\\x1b[8mhidden" in listed.output
    shown = await wide("show", url, closing)
    assert shown.exit_code == 0, shown.output
    assert "[red]not red[/red]\\u001b[2J" in shown.output and "\x1b" not in shown.output
    pruned = await wide("prune", url, "--older-than", "1s", "--dry-run")
    assert pruned.exit_code == 0, pruned.output
    assert "would delete 4 stack(s)" in pruned.output
