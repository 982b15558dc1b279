"""The dump of ``siglo export`` vouches for itself, and ``siglo import`` completes after any
interruption (issue 31, defect 5), on real SQLite, PostgreSQL and Redis stores.

- A dump cut at any line (an export that failed half-way, piped into an import), or
  altered, is refused before anything is written.
- An import interrupted after any line, run again, leaves the store exactly as one whole
  import does: checkpoints, and wait records with their status, claim and payload;
  nothing twice, nothing left out, and a wait delivered meanwhile stays delivered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Checkpoint, WaitRecord
from siglo.cli import cli
from siglo.clock import system_clock
from siglo.config import load_settings
from siglo.errors import InvalidArgumentError
from siglo.transfer import ImportReport, export_lines, import_lines, verify_dump

NS = "tenant:a"


async def invoke(*args: str, input: bytes | None = None) -> Result:
    # In a thread: each command runs its own event loop, as in a shell.
    return await asyncio.to_thread(
        CliRunner().invoke, cli, list(args), input=input, catch_exceptions=False
    )


async def run(
    backend: siglo.Backend, stack_id: str, namespace: str | None, wait: WaitRecord | None
) -> None:
    """A run at revision 3; waiting (or finished) on ``wait`` if given."""
    metadata: dict[str, Any] = {}
    status = "completed"
    if wait is not None:
        await backend.adapter.save_wait_record(wait)
        metadata["waitRecord"] = wait.replace(status="waiting", claimant_id=None,
                                              claimed_at=None, lease_expires_at=None,
                                              event_payload=None).to_wire()  # fmt: skip
        status = {"cancelled": "cancelled"}.get(wait.status, "waiting")
    await backend.adapter.save_checkpoint(
        Checkpoint(
            stack_id=stack_id,
            namespace=namespace,
            workflow_id="orders",
            status=status,  # type: ignore[arg-type]
            revision=3,
            timestamp=system_clock.now_ms(),
            contexts={"approve": {"n": 1}},
            metadata=metadata,
        )
    )


async def fill(backend: siglo.Backend) -> None:
    """Four runs: waiting in a namespace, waiting with its wait claimed (a delivery in
    flight: claimant, lease, payload), finished, and cancelled with its wait."""
    now = system_clock.now_ms()
    await run(
        backend,
        "ns-waiting",
        NS,
        WaitRecord(correlation_key="approve:1", stack_id="ns-waiting", namespace=NS,
                   step_id="approve", created_at=now, expires_at=now + 3_600_000),
    )  # fmt: skip
    await run(
        backend,
        "claimed",
        None,
        WaitRecord(correlation_key="approve:2", stack_id="claimed", step_id="approve",
                   status="claimed", claimant_id="worker-1", claimed_at=now,
                   lease_expires_at=now + 600_000, event_payload={"ok": True, "n": 0}),
    )  # fmt: skip
    await run(backend, "done", NS, None)
    await run(
        backend,
        "cancelled",
        "tenant:b",
        WaitRecord(correlation_key="approve:3", stack_id="cancelled", namespace="tenant:b",
                   step_id="approve", status="cancelled"),
    )  # fmt: skip


async def dump_of(backend: siglo.Backend) -> list[bytes]:
    return [line async for line in export_lines(backend.adapter)]


def documents(lines: list[bytes]) -> list[bytes]:
    """The checkpoint and wait lines (not the header, which carries the export time, nor
    the trailer, whose digest covers the header), sorted."""
    return sorted(line for line in lines if line.startswith(b'{"kind"'))


async def wipe(backend: siglo.Backend) -> None:
    page = await backend.adapter.list_checkpoints(limit=1000)
    for summary in page.items:
        await backend.adapter.delete_checkpoint(summary.stack_id, summary.namespace)


class Interrupted(Exception):
    pass


def interrupt_after(count: int) -> Any:
    """A progress callback that stops the import after ``count`` lines were written."""
    written = 0

    def progress(_: ImportReport) -> None:
        nonlocal written
        written += 1
        if written == count:
            raise Interrupted

    return progress


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_cut_dump_is_refused_before_anything_is_written(kind: str) -> None:
    async with shared_store("sqlite") as src, shared_store(kind) as dst:
        await fill(src)
        dump = await invoke("export", src.url)
        lines = dump.stdout_bytes.splitlines(keepends=True)
        assert len(lines) == 1 + 4 + 3 + 1  # header, 4 checkpoints, 3 waits, trailer
        for cut in range(1, len(lines)):
            with pytest.raises(InvalidArgumentError, match="cut short"):
                await import_lines(dst.adapter, lines[:cut])
        # Through the command, as `siglo export … | siglo import …` with a failed export:
        piped = await invoke("import", dst.url, input=b"".join(lines[:5]))
        assert piped.exit_code == 1
        assert "cut short" in piped.output and "nothing was imported" in piped.output
        # A cut inside a line is refused too (naming the line).
        mid = b"".join(lines)[: len(b"".join(lines[:4])) + 20]
        broken = await invoke("import", dst.url, input=mid)
        assert broken.exit_code == 1 and "line 5" in broken.output
        assert (await dst.adapter.list_checkpoints()).items == []
        assert await dst.adapter.get_wait_record("approve:1", namespace=NS) is None


async def test_an_altered_dump_is_refused() -> None:
    async with shared_store("sqlite") as src, shared_store("sqlite") as dst:
        await fill(src)
        lines = (await invoke("export", src.url)).stdout_bytes.splitlines(keepends=True)
        changed = list(lines)
        changed[1] = changed[1].replace(b'"revision":3', b'"revision":4')
        dropped = lines[:2] + lines[3:]
        doubled = lines[:2] + lines[1:]
        after = lines + lines[1:2]
        for bad, says in [
            (changed, "sha256"),
            (dropped, "the dump does not match its trailer"),
            (doubled, "the dump does not match its trailer"),
            (after, "comes after the trailer"),
        ]:
            refused = await invoke("import", dst.url, input=b"".join(bad))
            assert refused.exit_code == 1 and says in refused.output, refused.output
        assert (await dst.adapter.list_checkpoints()).items == []
        # The trailer is read as JSON: its keys in another order (or spaced) still vouch.
        trailer = orjson.loads(lines[-1])
        reordered = [*lines[:-1], json.dumps(trailer, sort_keys=True, indent=None).encode()]
        assert verify_dump(reordered).verified
        whole = await invoke("import", dst.url, input=b"".join(lines))
        assert whole.exit_code == 0, whole.output
        assert "imported 4 checkpoint(s) and 3 wait record(s)" in whole.output
        again = await invoke("import", dst.url, "--json", input=b"".join(lines))
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout) == {
            "format": 2,
            "verified": True,
            "dump": {"checkpoints": 4, "waits": 3},
            "imported": 0,
            "present": 4,
            "skipped": 0,
            "waits": 0,
            "waitsPresent": 3,
            "waitsTaken": [],
        }


async def test_a_wait_away_from_its_checkpoint_is_refused_naming_its_line() -> None:
    """A dump whose wait line was moved away from its run's checkpoint, its trailer
    recomputed (reordered or assembled by hand): the import would skip that wait and
    leave its run waiting on nothing. It is refused, naming the line, and writes
    nothing."""
    async with shared_store("sqlite") as src, shared_store("sqlite") as dst:
        await fill(src)
        lines = (await invoke("export", src.url)).stdout_bytes.splitlines(keepends=True)
        header, body = lines[0], lines[1:-1]
        waits = [line for line in body if line.startswith(b'{"kind":"wait"')]
        moved = [header, *(line for line in body if line not in waits), *waits]
        sha = hashlib.sha256(b"".join(line.rstrip(b"\n") + b"\n" for line in moved))
        trailer = {"siglo": "end", "checkpoints": len(body) - len(waits),
                   "waits": len(waits), "lines": len(moved), "sha256": sha.hexdigest()}  # fmt: skip
        dump = b"".join(moved) + orjson.dumps(trailer) + b"\n"
        refused = await invoke("import", dst.url, input=dump)
        assert refused.exit_code == 1, refused.output
        assert f"line {len(moved) - len(waits) + 1} is a wait record" in refused.output
        assert "does not follow its run's checkpoint" in refused.output
        assert (await dst.adapter.list_checkpoints()).items == []


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_an_interrupted_import_completes_at_any_cut(kind: str) -> None:
    async with shared_store("sqlite") as src, shared_store(kind) as dst:
        await fill(src)
        lines = await dump_of(src)
        written = len(documents(lines))
        for cut in range(1, written):
            await wipe(dst)
            with pytest.raises(Interrupted):
                await import_lines(dst.adapter, lines, progress=interrupt_after(cut))
            report = await import_lines(dst.adapter, lines)
            # The store holds what a whole import gives: every document, byte for byte
            # (the claimed wait with its claimant, lease and payload; the cancelled one).
            assert documents(await dump_of(dst)) == documents(lines), cut
            assert report.imported + report.present == 4 and report.skipped == 0, (cut, report)
            assert report.waits + report.waits_present == 3, (cut, report)
            again = await import_lines(dst.adapter, lines)
            assert (again.imported, again.present, again.waits) == (0, 4, 0), cut
        # The moved runs are deliverable in the new store.
        claimed = await dst.adapter.claim_wait_record("approve:1", "me", namespace=NS)
        assert claimed is not None and claimed.stack_id == "ns-waiting"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_wait_delivered_after_an_interrupted_import_stays_delivered(kind: str) -> None:
    async with shared_store("sqlite") as src, shared_store(kind) as dst:
        await fill(src)
        lines = await dump_of(src)
        # Cut right after the namespaced run's wait was written.
        written = [line for line in lines if line.startswith(b'{"kind"')]
        cut = 1 + next(i for i, line in enumerate(written) if b'"approve:1"' in line
                       and line.startswith(b'{"kind":"wait"'))  # fmt: skip
        with pytest.raises(Interrupted):
            await import_lines(dst.adapter, lines, progress=interrupt_after(cut))
        # Meanwhile the new store delivers the namespaced run's event.
        assert await dst.adapter.claim_wait_record("approve:1", "app", namespace=NS)
        await dst.adapter.complete_wait_record("approve:1", "app", namespace=NS)
        await import_lines(dst.adapter, lines)
        after = await dst.adapter.get_wait_record("approve:1", namespace=NS)
        assert after is not None and after.status == "completed"
        assert documents(await dump_of(dst)) != documents(lines)  # that one moved on


async def test_a_format_1_dump_still_imports_with_a_warning() -> None:
    async with shared_store("sqlite") as src, shared_store("sqlite") as dst:
        await fill(src)
        lines = await dump_of(src)
        header = orjson.loads(lines[0])
        old = [orjson.dumps({**header, "format": 1}), *lines[1:-1]]
        imported = await asyncio.to_thread(
            CliRunner().invoke, cli, ["import", dst.url], input=b"\n".join(old) + b"\n"
        )
        assert imported.exit_code == 0, imported.output
        assert "imported 4 checkpoint(s) and 3 wait record(s)" in imported.stdout
        assert "has no trailer" in imported.stderr
        future = [orjson.dumps({**header, "format": 3}), *lines[1:]]
        refused = await invoke("import", dst.url, input=b"\n".join(future))
        assert refused.exit_code == 1 and "format 1 or 2" in refused.output


async def many(backend: siglo.Backend, count: int) -> None:
    """``count`` runs, every third waiting on a wait of its namespace."""
    now = system_clock.now_ms()
    for i in range(count):
        wait = None
        if i % 3 == 0:
            wait = WaitRecord(correlation_key=f"k{i}", stack_id=f"s{i}", namespace=NS,
                              step_id="approve", expires_at=now + 3_600_000)  # fmt: skip
        await run(backend, f"s{i}", NS, wait)


# `siglo import`, run as ``python -m siglo`` does, SIGKILLing itself as it is about to
# write checkpoint number ``argv[1]``: a real process and a real kill, at a point in the
# dump that does not depend on how fast this machine is (a kill sent from outside once
# the first checkpoint shows raced a fast import to its end).
_KILLED_IMPORT = """
import os, signal, sys
import siglo.transfer
from siglo.cli import main

stop_at, written = int(sys.argv[1]), 0
through = siglo.transfer._import_checkpoint

async def counted(*args, **kwargs):
    global written
    written += 1
    if written == stop_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return await through(*args, **kwargs)

siglo.transfer._import_checkpoint = counted
sys.argv = ["siglo", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_killed_import_process_is_completed_by_running_it_again(kind: str) -> None:
    """`siglo import` SIGKILLed mid-way (a real process, a real kill), then run again."""
    count, killed_at = 900, 301
    async with shared_store("sqlite") as src, shared_store(kind) as dst:
        await many(src, count)
        dump = (await invoke("export", src.url)).stdout_bytes
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _KILLED_IMPORT, str(killed_at), "import", dst.url,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await process.communicate(dump)
        assert process.returncode == -9, stderr.decode()
        stored = await dst.adapter.list_checkpoints(limit=1000)
        assert len(stored.items) == killed_at - 1
        again = await invoke("import", dst.url, input=dump)
        assert again.exit_code == 0, again.output
        assert documents(await dump_of(dst)) == documents(dump.splitlines())


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_an_import_over_the_size_guard_writes_nothing(
    kind: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dump with one checkpoint over the target's ``max_document_bytes`` is refused
    whole, naming that stack, with nothing written — not the checkpoints before it in the
    dump. The size is the document as the target would store it: one large only in a field
    the target redacts fits, and is imported once the too-large one is gone."""
    from siglo.config import CONFIG_ENV, reset_settings

    async with shared_store("sqlite") as src, shared_store(kind) as dst:
        for stack_id, contexts in (
            ("small-1", {"a": {"n": 1}}),
            ("redacted-large", {"a": {"card": "x" * 20_000}}),
            ("too-large", {"a": {"text": "x" * 20_000}}),
            ("small-2", {"a": {"n": 2}}),
        ):
            await src.adapter.save_checkpoint(
                Checkpoint(stack_id=stack_id, namespace=NS, revision=1,
                           timestamp=system_clock.now_ms(), contexts=contexts)
            )  # fmt: skip
        lines = await dump_of(src)
        config = tmp_path / "siglo.toml"
        config.write_text(
            f'url = "{dst.url}"\nmax_document_bytes = 4000\nredact_fields = ["card"]\n'
        )
        monkeypatch.setenv(CONFIG_ENV, str(config))
        reset_settings()
        try:
            refused = await invoke("import", input=b"\n".join(lines) + b"\n")
            assert refused.exit_code == 1, refused.output
            assert "'too-large'" in refused.output, refused.output
            assert "nothing was imported" in refused.output, refused.output
            assert (await dst.adapter.list_checkpoints(limit=100)).items == []
            smaller = [line for line in lines if b'"too-large"' not in line]
            digest = hashlib.sha256()
            for line in smaller[:-1]:
                digest.update(line + b"\n")
            trailer = json.loads(smaller[-1])
            trailer.update(checkpoints=3, lines=len(smaller) - 1, sha256=digest.hexdigest())
            smaller[-1] = json.dumps(trailer).encode()
            done = await invoke("import", input=b"\n".join(smaller) + b"\n")
            assert done.exit_code == 0, done.output
        finally:
            reset_settings()
        page = await dst.adapter.list_checkpoints(limit=100)
        assert sorted(s.stack_id for s in page.items) == ["redacted-large", "small-1", "small-2"]


async def test_an_import_over_the_size_guard_without_a_pipeline_writes_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target's settings set only ``max_document_bytes`` (nothing for a pipeline to
    do): the dump is still checked whole first, the refusal names the line and the
    stack, and the checkpoint before it in the dump is not written."""
    from siglo.config import CONFIG_ENV, reset_settings

    async with shared_store("sqlite") as src, shared_store("sqlite") as dst:
        for stack_id, contexts in (
            ("small-1", {"a": {"n": 1}}),
            ("too-large", {"a": {"text": "x" * 20_000}}),
        ):
            await src.adapter.save_checkpoint(
                Checkpoint(stack_id=stack_id, revision=1, timestamp=system_clock.now_ms(),
                           contexts=contexts)
            )  # fmt: skip
        lines = await dump_of(src)
        number = next(i for i, line in enumerate(lines, 1) if b'"too-large"' in line)
        config = tmp_path / "siglo.toml"
        config.write_text(f'url = "{dst.url}"\nmax_document_bytes = 4000\n')
        monkeypatch.setenv(CONFIG_ENV, str(config))
        reset_settings()
        try:
            refused = await invoke("import", input=b"\n".join(lines) + b"\n")
        finally:
            reset_settings()
        assert refused.exit_code == 1, refused.output
        assert f"line {number} of the dump" in refused.output, refused.output
        assert "'too-large'" in refused.output and "nothing was imported" in refused.output
        assert "max_document_bytes" in refused.output.split("Hint:", 1)[1]
        assert (await dst.adapter.list_checkpoints(limit=100)).items == []


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_the_import_size_check_sees_the_target_offload_and_encryption(
    kind: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target encrypts and offloads large values to its blob store: a document large
    in its contexts fits once they are references, one large in its metadata (sealed,
    grown by its envelope, never offloaded) does not — and its refusal leaves nothing
    written, in the backend or in the blob store."""
    from siglo.config import CONFIG_ENV, reset_settings

    async with shared_store("sqlite") as src, shared_store(kind) as dst:
        # Incompressible (the target's codecs compress before they encrypt).
        notes = {f"k{i}": hashlib.sha256(b"%d" % i).hexdigest() for i in range(50)}
        for stack_id, contexts, metadata in (
            ("one-large", {"a": {"text": "x" * 20_000}}, {}),
            ("large-metadata", {"a": {"n": 1}}, notes),
        ):
            await src.adapter.save_checkpoint(
                Checkpoint(stack_id=stack_id, namespace=NS, revision=1, metadata=metadata,
                           timestamp=system_clock.now_ms(), contexts=contexts)
            )  # fmt: skip
        lines = await dump_of(src)
        blobs = tmp_path / "blobs"
        key = base64.b64encode(bytes(range(32))).decode()
        config = tmp_path / "siglo.toml"
        config.write_text(
            f'url = "{dst.url}"\nmax_document_bytes = 4000\n'
            f'blob_url = "{blobs.as_uri()}"\noffload_min_bytes = 1024\n'
            f'encryption_keys = {{ k1 = "{key}" }}\nrequire_encryption = true\n'
        )
        monkeypatch.setenv(CONFIG_ENV, str(config))
        reset_settings()
        try:
            refused = await invoke("import", input=b"\n".join(lines) + b"\n")
            assert refused.exit_code == 1, refused.output
            assert "'large-metadata'" in refused.output, refused.output
            assert (await dst.adapter.list_checkpoints(limit=100)).items == []
            assert not list(blobs.glob("??/*")), "a refused import put a blob"
            smaller = [line for line in lines if b'"large-metadata"' not in line]
            digest = hashlib.sha256()
            for line in smaller[:-1]:
                digest.update(line + b"\n")
            trailer = json.loads(smaller[-1])
            trailer.update(checkpoints=1, lines=len(smaller) - 1, sha256=digest.hexdigest())
            smaller[-1] = json.dumps(trailer).encode()
            done = await invoke("import", input=b"\n".join(smaller) + b"\n")
            assert done.exit_code == 0, done.output
        finally:
            reset_settings()
        page = await dst.adapter.list_checkpoints(limit=100)
        assert [s.stack_id for s in page.items] == ["one-large"]
        assert len(list(blobs.glob("??/*"))) == 1


def test_a_failed_export_leaves_the_file_it_would_have_replaced(tmp_path: Any) -> None:
    """``siglo export -o backup.jsonl`` writes beside the file and renames at the end: an
    export that fails — a server that does not answer, a record stored in clear under
    ``require_encryption``, found half-way — leaves last night's backup as it was, and
    says nothing was exported. Before, the file was emptied at its first write."""
    import socket

    async def fill() -> None:
        async with siglo.connect(f"sqlite:///{tmp_path / 'a.db'}") as backend:
            for i in range(3):
                await backend.adapter.save_checkpoint(
                    Checkpoint(stack_id=f"s{i}", revision=1, timestamp=1, contexts={"a": {"n": i}})
                )

    asyncio.run(fill())
    backup = tmp_path / "backup.jsonl"
    done = CliRunner().invoke(cli, ["export", f"sqlite:///{tmp_path / 'a.db'}", "-o", str(backup)])
    assert done.exit_code == 0, done.output
    good = backup.read_bytes()
    assert good.count(b'"kind":"checkpoint"') == 3
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]  # nothing listens once closed
    failures = [
        ({}, f"redis://127.0.0.1:{port}/0"),
        (
            {"SIGLO_REQUIRE_ENCRYPTION": "true", "SIGLO_ENCRYPTION_KEYS": "k1=" + "A" * 43 + "="},
            f"sqlite:///{tmp_path / 'a.db'}",
        ),
    ]
    for env, url in failures:
        failed = CliRunner().invoke(cli, ["export", url, "-o", str(backup)], env=env)
        assert failed.exit_code == 1, failed.output
        assert "exported" not in failed.output, failed.output
        assert backup.read_bytes() == good
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def _retrailered(lines: list[bytes]) -> bytes:
    """``lines`` (the header and the body) with a trailer that vouches for them."""
    body = lines[1:]
    sha = hashlib.sha256(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
    waits = sum(line.startswith(b'{"kind":"wait"') for line in body)
    trailer = {"siglo": "end", "checkpoints": len(body) - waits, "waits": waits,
               "lines": len(lines), "sha256": sha.hexdigest()}  # fmt: skip
    return b"".join(line.rstrip(b"\n") + b"\n" for line in lines) + orjson.dumps(trailer) + b"\n"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_line_the_save_would_refuse_is_refused_before_anything_is_written(
    kind: str,
) -> None:
    """operating.md: the import reads the whole dump before it writes anything. A line
    whose save the store would refuse — an empty or NUL-holding id, a revision past a
    signed 64-bit integer (which SQLite and PostgreSQL cannot store, and Redis took), an
    empty correlation key, a reference to an offloaded blob the dump does not carry — is
    refused naming its line, with nothing written; before, the lines ahead of it were
    stored, and a bad wait left its run's checkpoint waiting without its wait."""
    async with shared_store("sqlite") as src, shared_store(kind) as dst:
        await fill(src)
        lines = (await invoke("export", src.url)).stdout_bytes.splitlines(keepends=True)[:-1]
        kinds = [line[: line.find(b",")] for line in lines]
        last_checkpoint = max(i for i, kind in enumerate(kinds) if kind == b'{"kind":"checkpoint"')
        last_wait = max(i for i, kind in enumerate(kinds) if kind == b'{"kind":"wait"')

        def forged(index: int, old: bytes, new: bytes) -> bytes:
            changed = list(lines)
            assert old in changed[index], (old, changed[index])
            changed[index] = changed[index].replace(old, new, 1)
            return _retrailered(changed)

        checkpoint_id = orjson.loads(lines[last_checkpoint])["document"]["stackId"]
        wait_key = orjson.loads(lines[last_wait])["record"]["correlationKey"]
        cases = [
            (forged(last_checkpoint, f'"stackId":"{checkpoint_id}"'.encode(), b'"stackId":""'),
             "stack_id"),
            (forged(last_checkpoint, f'"stackId":"{checkpoint_id}"'.encode(),
                    b'"stackId":"a\\u0000b"'), "stack_id"),
            (forged(last_checkpoint, b'"revision":3', b'"revision":9223372036854775808'),
             "revision"),
            (forged(last_wait, f'"correlationKey":"{wait_key}"'.encode(),
                    b'"correlationKey":""'), "correlation_key"),
            (forged(last_wait, f'"correlationKey":"{wait_key}"'.encode(),
                    f'"correlationKey":"{wait_key}","completedAt":9223372036854775808'.encode()),
             "completedAt"),
            (forged(last_checkpoint, b'"contexts":{"approve":{"n":1}}',
                    b'"contexts":{"approve":{"n":{"$siglo.blob":"' + b"0" * 64
                    + b'","bytes":10}}}'), "offloaded blob"),
        ]  # fmt: skip
        for dump, says in cases:
            refused = await invoke("import", dst.url, input=dump)
            assert refused.exit_code == 1, refused.output
            assert "line " in refused.output and says in refused.output, refused.output
            # The dump is whole: the hint is about the line, not "import a whole dump"
            # (a black-box auditor).
            assert "correct the record where it was exported from" in refused.output
            assert "import a whole dump" not in refused.output, refused.output
            assert (await dst.adapter.list_checkpoints()).items == []
        whole = await invoke("import", dst.url, input=_retrailered(lines))
        assert whole.exit_code == 0, whole.output


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres", "redis"])
async def test_a_revision_past_64_bits_is_refused_on_every_backend(kind: str) -> None:
    """One revision range on every backend, so that any store's dump imports into any
    other: a revision past 2**63 - 1 is refused as malformed before any backend sees it
    (SQLite raised OverflowError, PostgreSQL a driver error, Redis stored it)."""
    from raw_storage import any_backend

    from siglo.checkpoint import MAX_REVISION
    from siglo.errors import MalformedRecordError
    from siglo.validation import MAX_LEASE_MS

    async with any_backend(kind) as backend:
        with pytest.raises(MalformedRecordError, match="signed 64-bit"):
            Checkpoint(stack_id="big", revision=MAX_REVISION + 1, timestamp=1)
        top = Checkpoint(stack_id="big", revision=MAX_REVISION, timestamp=1)
        await backend.adapter.save_checkpoint(top)
        assert (await backend.adapter.get_checkpoint("big")) == top
        # The times of a wait record too, and a lease that would take one past them.
        # A deadline past it means "never", clamped where it is stored; one past what
        # JSON carries is refused naming its field.
        far = Checkpoint(stack_id="far", revision=1, timestamp=1, expires_at=2**63 + 5)
        await backend.adapter.save_checkpoint(far)
        with pytest.raises(MalformedRecordError, match="expiresAt"):
            Checkpoint(stack_id="far", revision=2, timestamp=1, expires_at=2**64)
        for name in ("claimed_at", "lease_expires_at", "completed_at"):
            with pytest.raises(MalformedRecordError, match="signed 64-bit"):
                WaitRecord(correlation_key="w", stack_id="big", **{name: MAX_REVISION + 1})
        await backend.adapter.save_wait_record(WaitRecord(correlation_key="w", stack_id="big"))
        with pytest.raises(InvalidArgumentError, match="lease_ms must be at most"):
            await backend.adapter.claim_wait_record("w", "me", lease_ms=MAX_LEASE_MS + 1)
        record = await backend.adapter.get_wait_record("w")
        assert record is not None and record.status == "waiting"


def test_export_to_a_link_or_an_existing_file_keeps_what_it_was(tmp_path: Any) -> None:
    """``-o`` through a symlink writes the file it names (the link stays a link); the file
    replaced keeps its mode (a new one gets the umask's); SIGTERM mid-export, as a
    supervisor stops it, leaves no temporary file beside the backup, and says so."""
    import os
    import signal
    import stat
    import subprocess
    import time

    async def fill(count: int, prefix: str) -> None:
        async with siglo.connect(f"sqlite:///{tmp_path / 'a.db'}") as backend:
            for i in range(count):
                await backend.adapter.save_checkpoint(
                    Checkpoint(
                        stack_id=f"{prefix}{i}", revision=1, timestamp=1, contexts={"a": {"n": i}}
                    )
                )

    asyncio.run(fill(3, "s"))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    target = tmp_path / "target.jsonl"
    target.write_text("old\n")
    target.chmod(0o640)
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    done = CliRunner().invoke(cli, ["export", url, "-o", str(link)])
    assert done.exit_code == 0, done.output
    assert link.is_symlink() and target.read_bytes().count(b'"kind":"checkpoint"') == 3
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.jsonl"
    assert CliRunner().invoke(cli, ["export", url, "-o", str(fresh)]).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask

    asyncio.run(fill(20_000, "more-"))  # long enough to be stopped half-way
    backup = tmp_path / "backup.jsonl"
    backup.write_text("last night\n")
    export = subprocess.Popen(
        [sys.executable, "-m", "siglo", "export", url, "-o", str(backup)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".part") for p in tmp_path.iterdir()):
        assert export.poll() is None and time.monotonic() < deadline, "it never began"
        time.sleep(0.01)
    export.send_signal(signal.SIGTERM)
    # Said, with the status SIGTERM gives (it ended silently: a black-box auditor).
    assert export.wait(timeout=60) == 128 + signal.SIGTERM
    said = export.stderr.read().decode() if export.stderr else ""
    assert "siglo export was interrupted (SIGTERM)" in said, said
    assert "the file is as it was before" in said, said
    assert backup.read_text() == "last night\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


@pytest.mark.parametrize("moment", ["made", "moded"])
def test_a_stop_the_moment_the_temporary_file_is_made_removes_it(
    tmp_path: Path, moment: str
) -> None:
    """SIGTERM delivered right after the temporary file exists (``made``: as ``mkstemp``
    returns; ``moded``: as it is given the old file's mode), before a byte is written,
    still leaves only the backup as it was (the handlers are in place before the file
    exists, and the signal is held while it is made). The stop is a real SIGTERM the
    process sends itself at that moment, in a child process."""
    import subprocess

    backup = tmp_path / "backup.jsonl"
    backup.write_text("last night\n")
    script = f"""
import os, signal, tempfile
from pathlib import Path
import siglo.cli.transfer as transfer

def stop_now():
    os.kill(os.getpid(), signal.SIGTERM)

if {moment!r} == "made":
    made = tempfile.mkstemp
    def mkstemp(*args, **kwargs):
        got = made(*args, **kwargs)
        stop_now()
        return got
    transfer.tempfile.mkstemp = mkstemp
else:
    like = transfer._like
    def moded(fd, path):
        stop_now()
        like(fd, path)
    transfer._like = moded

def write(file):
    raise AssertionError("written after the stop")

transfer._replacing(Path({str(backup)!r}), write)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 128 + 15, done.stderr
    assert "written after the stop" not in done.stderr
    assert backup.read_text() == "last night\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.jsonl"]


def test_export_through_a_descriptor_writes_it_as_opened(tmp_path: Any) -> None:
    """``-o /dev/stdout`` with stdout appended to a file writes through the descriptor
    (the file's earlier lines stay, its inode too); a regular file under /dev (tmpfs) is
    replaced as any file is — a failed export leaves it as it was."""
    import os
    import subprocess

    async def fill() -> None:
        async with siglo.connect(f"sqlite:///{tmp_path / 'a.db'}") as backend:
            await backend.adapter.save_checkpoint(
                Checkpoint(stack_id="s", revision=1, timestamp=1, contexts={"a": {"n": 1}})
            )

    asyncio.run(fill())
    url = f"sqlite:///{tmp_path / 'a.db'}"
    log = tmp_path / "log.txt"
    log.write_text("# begin\n")
    inode = log.stat().st_ino
    with log.open("ab") as appended:
        done = subprocess.run(
            [sys.executable, "-m", "siglo", "export", url, "-o", "/dev/stdout"],
            stdout=appended,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "# begin" and len(lines) == 4 and log.stat().st_ino == inode
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        kept = Path("/dev/shm") / f"siglo-test-{os.getpid()}.jsonl"
        kept.write_text("last night\n")
        try:
            env = {**os.environ, "SIGLO_REQUIRE_ENCRYPTION": "true",
                   "SIGLO_ENCRYPTION_KEYS": "k1=" + "A" * 43 + "="}  # fmt: skip
            failed = subprocess.run(
                [sys.executable, "-m", "siglo", "export", url, "-o", str(kept)],
                env=env,
                capture_output=True,
                timeout=120,
            )
            assert failed.returncode == 1, failed.stderr
            assert kept.read_text() == "last night\n"
        finally:
            kept.unlink()


def test_an_import_into_another_url_keeps_its_values_out_of_the_settings_blob_store(
    tmp_path: Any,
) -> None:
    """The settings name a SQLite file and a blob store; ``siglo import`` into another
    URL put its values in that blob store, which the settings' own ``collect-blobs``
    walks with the settings' backend alone: once the first store's run was removed, the
    collector took the other store's blobs for orphans and the imported store could not
    be read (a black-box auditor). The blob store goes with the settings' URL, as their
    ``[options]`` do: the import stores its values inline, says so, and the imported
    store reads after any collection; and ``collect-blobs`` given another URL is
    refused."""
    (tmp_path / "siglo.toml").write_text(
        f'url = "sqlite:///{tmp_path}/a.db"\noffload_min_bytes = 1024\n'
        f'blob_url = "file://{tmp_path}/blobs"\n'
    )
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SIGLO_")}
    env["SIGLO_CONFIG"] = str(tmp_path / "siglo.toml")

    def siglo_cli(*args: str, stdin: bytes | None = None) -> Result:
        # The settings file only: CliRunner sets the environment for the command.
        return CliRunner().invoke(cli, list(args), input=stdin, env=env)

    async def save() -> None:
        settings = load_settings(environ={"SIGLO_CONFIG": str(tmp_path / "siglo.toml")})
        async with siglo.connect(settings=settings) as backend:
            stack = siglo.StorageManager(backend, settings=settings).create_stack("doc-1")
            stack.set("doc", "text", "z" * 5000)
            await stack.save()

    asyncio.run(save())
    assert len(list((tmp_path / "blobs").rglob("*"))) > 0  # offloaded in the settings' store
    dump = siglo_cli("export")
    assert dump.exit_code == 0, dump.output
    other = f"sqlite:///{tmp_path}/b.db"
    imported = siglo_cli("import", other, stdin=dump.stdout_bytes)
    assert imported.exit_code == 0, imported.output
    assert "blob store" in imported.stderr and "inline" in imported.stderr
    # Collected against the other backend, every blob of the store would be an orphan.
    crossed = siglo_cli("collect-blobs", other, "--grace-ms", "0")
    assert crossed.exit_code == 1 and "goes with the settings' store" in crossed.output
    assert len([p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]) >= 1
    assert siglo_cli("rm", "doc-1").exit_code == 0
    collected = siglo_cli("collect-blobs", "--grace-ms", "0", "--json")
    assert collected.exit_code == 0, collected.output
    assert json.loads(collected.stdout)["removed"] >= 1
    shown = siglo_cli("show", other, "doc-1", "--json")
    assert shown.exit_code == 0, shown.output
    assert "z" * 5000 in shown.stdout


def test_the_blob_store_goes_with_its_store_however_its_url_is_spelt(tmp_path: Any) -> None:
    """The settings' blob store went with their URL's text: the same SQLite file spelt
    ``sqlite:///./app.db`` or with a query option was "another URL", whose offloaded
    values could not be read; and settings that name no url gave the blob store to any
    URL, so `collect-blobs` on one backend removed another's values (a black-box
    auditor). The store a URL names decides; and the collector refuses settings that
    name no url."""
    import contextlib

    settings_file = tmp_path / "siglo.toml"
    settings_file.write_text(
        f'url = "sqlite:///{tmp_path}/app.db"\noffload_min_bytes = 1024\n'
        f'blob_url = "file://{tmp_path}/blobs"\n'
    )

    async def save_and_read() -> Any:
        settings = load_settings(environ={"SIGLO_CONFIG": str(settings_file)})
        async with siglo.connect(settings=settings) as backend:
            stack = siglo.StorageManager(backend, settings=settings).create_stack("doc-1")
            stack.set("doc", "text", "z" * 5000)
            await stack.save()
        spelt = f"sqlite:///{tmp_path}/./app.db?busy_timeout_ms=5000"
        async with siglo.connect(spelt, settings=settings) as backend:
            return await backend.adapter.get_checkpoint("doc-1")

    loaded = asyncio.run(save_and_read())
    assert loaded is not None and loaded.contexts["doc"]["text"] == "z" * 5000
    with contextlib.chdir(tmp_path):
        done = CliRunner().invoke(
            cli,
            ["collect-blobs", "sqlite:///./app.db", "--json"],
            env={"SIGLO_CONFIG": str(settings_file)},
        )
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["referenced"] == 1
    settings_file.write_text(f'offload_min_bytes = 1024\nblob_url = "file://{tmp_path}/blobs"\n')
    refused = CliRunner().invoke(
        cli,
        ["collect-blobs", f"sqlite:///{tmp_path}/app.db"],
        env={"SIGLO_CONFIG": str(settings_file)},
    )
    assert refused.exit_code == 1 and "name a blob store but no url" in refused.output
    assert len([p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]) == 1


def test_the_blob_store_goes_with_the_store_its_settings_options_pick(tmp_path: Any) -> None:
    """The settings' ``[options]`` pick a store on their URL's file (``table_prefix``):
    the same file spelt another way, connected without them, is another store's tables.
    It was taken for the settings' store, because the check compared URLs alone: its
    values went to the settings' blob store, and ``collect-blobs`` given that spelling
    walked the other tables and removed the application's blob (a black-box auditor:
    data lost on SQLite and PostgreSQL). The store decides, options included: another
    store keeps its values inline, the collector refuses it, and the settings' store
    spelt another way with its options is still theirs."""
    settings_file = tmp_path / "siglo.toml"
    settings_file.write_text(
        'url = "sqlite:///app.db"\noffload_min_bytes = 1024\n'
        f'blob_url = "file://{tmp_path}/blobs"\n[options]\ntable_prefix = "app_"\n'
    )
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SIGLO_")}
    env["SIGLO_CONFIG"] = str(settings_file)

    def blobs() -> list[Path]:
        return [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]

    def siglo_cli(*args: str) -> Result:
        with contextlib.chdir(tmp_path):
            return CliRunner().invoke(cli, list(args), env=env)

    async def save(url: str | None, stack_id: str, **options: Any) -> None:
        settings = load_settings(environ={"SIGLO_CONFIG": str(settings_file)})
        async with siglo.connect(url, settings=settings, **options) as backend:
            stack = siglo.StorageManager(backend, settings=settings).create_stack(stack_id)
            stack.set("doc", "text", stack_id[0] * 6000)
            await stack.save()

    async def load(url: str | None, stack_id: str, **options: Any) -> str:
        settings = load_settings(environ={"SIGLO_CONFIG": str(settings_file)})
        async with siglo.connect(url, settings=settings, **options) as backend:
            stored = await backend.raw_adapter.get_checkpoint(stack_id)
            assert stored is not None
            loaded = await backend.adapter.get_checkpoint(stack_id)
            assert loaded is not None
            text: str = loaded.contexts["doc"]["text"]
            assert text == stack_id[0] * 6000
            return json.dumps(stored.contexts["doc"])

    with contextlib.chdir(tmp_path):
        asyncio.run(save(None, "app-doc"))  # the settings' store: offloaded
        assert len(blobs()) == 1
        assert siglo_cli("migrate", "sqlite:///./app.db").exit_code == 0
        # The same file without the settings' table_prefix: another store, inline.
        asyncio.run(save("sqlite:///./app.db", "other-doc"))
        assert "o" * 6000 in asyncio.run(load("sqlite:///./app.db", "other-doc"))
        # The settings' own URL with a table_prefix of its own: another store, inline.
        asyncio.run(save("sqlite:///app.db", "mine-doc", table_prefix="mine_"))
        assert "m" * 6000 in asyncio.run(load("sqlite:///app.db", "mine-doc", table_prefix="mine_"))
        assert len(blobs()) == 1
    # Collecting the settings' blob store against the other tables is refused.
    refused = siglo_cli("collect-blobs", "sqlite:///./app.db", "--grace-ms", "0")
    assert refused.exit_code == 1, refused.output
    assert "opens another store" in refused.output and "table_prefix" in refused.output
    refused = siglo_cli("collect-blobs", "sqlite:///app.db?busy_timeout_ms=5000", "--grace-ms", "0")
    assert refused.exit_code == 1, refused.output
    assert len(blobs()) == 1
    # The settings' store spelt another way, with its options in the query: theirs.
    theirs = "sqlite:///./app.db?table_prefix=app_"
    done = siglo_cli("collect-blobs", theirs, "--grace-ms", "0", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"referenced": 1, "removed": 0, "kept": 0}
    with contextlib.chdir(tmp_path):
        assert "$siglo.blob" in asyncio.run(load(theirs, "app-doc"))
        asyncio.run(save(theirs, "third-doc"))
        assert len(blobs()) == 2
        assert asyncio.run(load(None, "app-doc")).count("$siglo.blob") == 1


def test_a_redis_key_prefix_picks_the_store_its_blob_store_goes_with(tmp_path: Any) -> None:
    """Redis's ``key_prefix`` is its ``prefix``: settings picking their store with it had
    their blob store handed to a connection with another prefix (its values offloaded
    where the settings' collector never looks), and ``siglo collect-blobs`` on their URL
    spelt another way walked the default prefix and removed the settings' blob (a
    black-box auditor: the value lost). Now another prefix keeps its values inline and
    the collector refuses it."""
    from _redis_helpers import REDIS_URL, require_redis

    require_redis()
    prefix = f"siglo-test-{os.urandom(4).hex()}"
    settings_file = tmp_path / "siglo.toml"
    settings_file.write_text(
        f'url = "{REDIS_URL}"\noffload_min_bytes = 1024\n'
        f'blob_url = "file://{tmp_path}/blobs"\n[options]\nkey_prefix = "{prefix}-app:"\n'
    )
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SIGLO_")}
    env["SIGLO_CONFIG"] = str(settings_file)
    settings = load_settings(environ={"SIGLO_CONFIG": str(settings_file)})

    def blobs() -> list[Path]:
        return [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]

    async def save(stack_id: str, **options: Any) -> str:
        async with siglo.connect(settings.url, settings=settings, **options) as backend:
            stack = siglo.StorageManager(backend, settings=settings).create_stack(stack_id)
            stack.set("doc", "text", stack_id[0] * 6000)
            await stack.save()
            stored = await backend.raw_adapter.get_checkpoint(stack_id)
            assert stored is not None
            return json.dumps(stored.contexts["doc"])

    async def remove_keys() -> None:
        import redis.asyncio as redis

        client = redis.Redis.from_url(REDIS_URL)
        try:
            async for key in client.scan_iter(match=f"{prefix}*"):
                await client.delete(key)
        finally:
            await client.aclose()

    async def prefix_of(url: str, **options: Any) -> str:
        async with siglo.connect(url, **options) as backend:
            return str(backend.raw_adapter.keys.prefix)  # type: ignore[attr-defined]

    try:
        # A keyword wins over the query, key_prefix as prefix does: the store compared.
        given = asyncio.run(prefix_of(f"{REDIS_URL}?prefix={prefix}-a:", key_prefix=f"{prefix}-b:"))
        assert given == f"{prefix}-b:"
        assert "$siglo.blob" in asyncio.run(save("app-doc"))  # the settings' store
        assert "o" * 6000 in asyncio.run(save("other-doc", key_prefix=f"{prefix}-other:"))
        assert len(blobs()) == 1
        elsewhere = f"{REDIS_URL}?command_timeout_ms=5000"
        refused = CliRunner().invoke(cli, ["collect-blobs", elsewhere, "--grace-ms", "0"], env=env)
        assert refused.exit_code == 1 and "opens another store" in refused.output, refused.output
        assert len(blobs()) == 1
        theirs = f"{REDIS_URL}?prefix={prefix}-app:"
        done = CliRunner().invoke(
            cli, ["collect-blobs", theirs, "--grace-ms", "0", "--json"], env=env
        )
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout) == {"referenced": 1, "removed": 0, "kept": 0}
    finally:
        asyncio.run(remove_keys())


async def _start(order: Any) -> dict[str, Any]:
    return {"order": order}


async def _first(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "a": await siglo.wait_for_event(f"a:{state['order']}", timeout_ms=1)}


async def _second(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "b": await siglo.wait_for_event(f"b:{state['order']}", timeout_ms=600_000)}


TWO_WAITS = siglo.flow(
    siglo.Step.create("start", _start),
    siglo.Step.create("first", _first),
    siglo.Step.create("second", _second),
    name="two-waits",
)


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_newer_dump_over_an_older_import_cancels_the_wait_it_moved_past(
    kind: str,
) -> None:
    """A run waited on ``a:1`` (dump 1), was delivered it and waits on ``b:1`` (dump 2);
    dump 1 then dump 2 imported into another store moved the run forward but left
    ``a:1`` waiting there (a dump holds only the wait its run waits on): past its
    deadline, every worker pass claimed it for a step that no longer waits and reported
    the run failed (a black-box auditor). The import cancels the wait its stack moved
    past; the run waits on ``b:1`` alone, and a worker finds nothing to do."""
    async with shared_store(kind) as src, shared_store(kind) as dst:
        manager = siglo.StorageManager(src)
        with pytest.raises(siglo.WorkflowSuspended):
            await TWO_WAITS.run(1, manager=manager, stack_id="o1")
        first = await dump_of(src)
        with pytest.raises(siglo.WorkflowSuspended):
            await TWO_WAITS.deliver("a:1", "A", manager=manager, allow_expired=True)
        second = await dump_of(src)
        await import_lines(dst.adapter, first)
        before = await dst.adapter.get_wait_record("a:1")
        assert before is not None and before.status == "waiting"
        report = await import_lines(dst.adapter, second)
        assert report.imported == 1 and report.waits == 1
        passed = await dst.adapter.get_wait_record("a:1")
        assert passed is not None and passed.status == "cancelled"
        waiting = await dst.adapter.get_wait_record("b:1")
        assert waiting is not None and waiting.status == "waiting"
        stored = await dst.adapter.get_checkpoint("o1")
        assert stored is not None and stored.status == "waiting"
        done = await siglo.workflow.Worker(siglo.StorageManager(dst), [TWO_WAITS]).run_once()
        assert done.timers_fired == 0 and not done.failures
        # Importing the newer dump again changes nothing.
        again = await import_lines(dst.adapter, second)
        assert again.imported == 0
        assert (await dst.adapter.get_wait_record("b:1")) == waiting


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_wait_key_waited_on_again_by_another_run_exports_and_imports(
    kind: str,
) -> None:
    """Run A waited on a key, got its event and completed; run B then waits on the same
    key (docs/workflows.md: a key whose wait ended may be waited on again). The export
    wrote B's record after A's checkpoint too, and the import refused the whole dump
    ("does not follow its run's checkpoint"; a black-box auditor), and `siglo show` of A
    showed B's wait as A's. Each run's record now goes with its own checkpoint alone,
    and the dump imports."""
    from siglo import Step, WorkflowSuspended, flow, wait_for_event

    async def approve(_: Any) -> Any:
        return await wait_for_event("approval")

    approvals = flow(Step.create("approve", approve), name="approvals-reused")
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as source,
        shared_store(kind, checkpoint_ttl_ms=None) as target,
    ):
        manager = siglo.StorageManager(source)
        with pytest.raises(WorkflowSuspended):
            await approvals.run(None, manager=manager, stack_id="run-A")
        assert await approvals.deliver("approval", "ok", manager=manager) == "ok"
        with pytest.raises(WorkflowSuspended):
            await approvals.run(None, manager=manager, stack_id="run-B")
        # `siglo show` read the key's current record too: A's page showed B's wait.
        shown_a = await invoke("show", source.url, "run-A", "--json")
        shown_b = await invoke("show", source.url, "run-B", "--json")
        assert [w["stackId"] for w in orjson.loads(shown_a.stdout_bytes)["waitRecords"]] == []
        assert [w["stackId"] for w in orjson.loads(shown_b.stdout_bytes)["waitRecords"]] == [
            "run-B"
        ]
        dump = await invoke("export", source.url)
        assert dump.exit_code == 0, dump.output
        waits = [
            orjson.loads(line)["record"]["stackId"]
            for line in dump.stdout_bytes.splitlines()
            if orjson.loads(line).get("kind") == "wait"
        ]
        assert waits == ["run-B"]
        imported = await invoke("import", target.url, input=dump.stdout_bytes)
        assert imported.exit_code == 0, imported.output
        moved = siglo.StorageManager(target)
        assert await approvals.deliver("approval", "yes", manager=moved) == "yes"
        assert await approvals.run(None, manager=moved, stack_id="run-A") == "ok"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_an_import_never_takes_another_runs_open_wait(kind: str) -> None:
    """The dump's run waits on a key that a run of the target store waits on: the
    import saved its record over the other's, which never resumed (a black-box auditor,
    `siglo import` into a live store). The other's wait stays, the import says which
    wait it could not bring and exits 1."""
    from siglo import Step, WorkflowSuspended, flow, wait_for_event

    async def approve(_: Any) -> Any:
        return await wait_for_event("approve:1")

    approvals = flow(Step.create("approve", approve), name="approvals-taken")
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as source,
        shared_store(kind, checkpoint_ttl_ms=None) as target,
    ):
        with pytest.raises(WorkflowSuspended):
            await approvals.run(None, manager=siglo.StorageManager(source), stack_id="old")
        live = siglo.StorageManager(target)
        with pytest.raises(WorkflowSuspended):
            await approvals.run(None, manager=live, stack_id="live")
        dump = await invoke("export", source.url)
        assert dump.exit_code == 0, dump.output
        imported = await invoke("import", target.url, input=dump.stdout_bytes)
        assert imported.exit_code == 1, imported.output
        assert "the wait of run 'old' for 'approve:1' was not imported" in imported.output
        record = await target.adapter.get_wait_record("approve:1")
        assert record is not None and record.stack_id == "live"
        assert await approvals.deliver("approve:1", "ok", manager=live) == "ok"
        stored = await live.load_checkpoint("live")
        assert stored is not None and stored.status == "completed"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_an_export_never_pairs_a_waiting_run_with_its_delivered_wait(kind: str) -> None:
    """The export read a run waiting, then its wait record after a delivery had completed
    it: the dump paired the two, and the imported run waited for ever, every delivery
    refused as already delivered (a black-box auditor, the delivery made to land between
    the two reads, as here). The run is read again: the dump holds what it became."""
    from siglo import Step, WorkflowSuspended, flow, wait_for_event

    async def approve(_: Any) -> Any:
        return await wait_for_event("approve:torn")

    approvals = flow(Step.create("approve", approve), name="approvals-torn")
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as source,
        shared_store(kind, checkpoint_ttl_ms=None) as target,
        siglo.connect(source.url) as other,
    ):
        with pytest.raises(WorkflowSuspended):
            await approvals.run(None, manager=siglo.StorageManager(source), stack_id="torn")
        adapter: Any = source.adapter
        reading = adapter.get_wait_record
        delivered: list[Any] = []

        async def after_a_delivery(*args: Any, **kwargs: Any) -> Any:
            if not delivered:  # another process's delivery, between the two reads
                delivered.append(
                    await approvals.deliver(
                        "approve:torn", "ok", manager=siglo.StorageManager(other)
                    )
                )
            return await reading(*args, **kwargs)

        adapter.get_wait_record = after_a_delivery
        try:
            lines = [line async for line in export_lines(source.adapter)]
        finally:
            adapter.get_wait_record = reading
        assert delivered == ["ok"]
        report = await import_lines(target.adapter, lines)
        assert report.imported == 1
        moved = await target.adapter.get_checkpoint("torn")
        assert moved is not None and moved.status == "completed"


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_an_interrupted_import_says_so_and_how_to_finish(tmp_path: Path, stop: str) -> None:
    """Ctrl-C gave a bare "Aborted!" and status 1, SIGTERM killed the import without a
    word (a black-box auditor): it says it was interrupted and that running it again
    finishes it, and exits 128 + the signal. The import waits on a Redis server behind a
    frozen proxy when the signal comes; run again, it completes."""
    import signal

    from _redis_helpers import REDIS_URL, require_redis
    from _tcp_proxy import proxied_url
    from stopped_commands import stopped_while_waiting

    from siglo_redis import isolated

    require_redis()
    dump = tmp_path / "dump.jsonl"

    async def a_dump() -> None:
        async with siglo.connect(f"sqlite:///{tmp_path / 'a.db'}") as backend:
            for i in range(3):
                await backend.adapter.save_checkpoint(
                    Checkpoint(stack_id=f"s{i}", revision=1, timestamp=1, contexts={"a": {"n": i}})
                )
            dump.write_bytes(
                b"".join([line + b"\n" async for line in export_lines(backend.adapter)])
            )

    asyncio.run(a_dump())
    signum = signal.Signals[stop]

    async def interrupted_then_finished() -> None:
        async with isolated(REDIS_URL) as target:
            with proxied_url(target.url, 6379) as (url, proxy):
                args = ["import", url, "-i", str(dump)]
                status, said = await stopped_while_waiting(args, proxy, tmp_path, signum)
            assert status == 128 + signum, (status, said)
            assert f"siglo import was interrupted ({stop})" in said, said
            assert "run it again to finish" in said, said
            again = await invoke("import", target.url, "-i", str(dump))
            assert again.exit_code == 0, again.output
            assert await target.adapter.get_checkpoint("s2") is not None

    asyncio.run(interrupted_then_finished())
