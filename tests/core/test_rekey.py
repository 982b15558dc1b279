"""``siglo rekey`` and ``siglo erase`` (docs/encryption.md): rotation re-encrypts under
compare-and-set and loses nothing to concurrent writers; erasure makes every copy —
the store's rows and an earlier export — unreadable. On SQLite, PostgreSQL and Redis,
the commands run as processes of their own, given their keys in ``SIGLO_*`` variables.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from ops_support import DURABLE_KINDS, shared_store
from raw_storage import KINDS, any_backend, raw_bytes

import siglo
import siglo.cli.keys
from siglo.checkpoint import Checkpoint
from siglo.config import CONFIG_ENV, ENVIRONMENT, Settings
from siglo.errors import (
    CapabilityNotSupportedError,
    CheckpointConflictError,
    DecryptionError,
    KeyErasedError,
)
from siglo.keys import KEYRING_NAMESPACE, EnvelopeKeyProvider
from siglo.locking import namespaced_key, split_namespaced_key
from siglo.payloads import StoredPayload
from siglo.pipeline import Pipeline, PipelineAdapter, pipeline_parts
from siglo.records import ContextChangeEvent, WaitRecord
from siglo.rekeying import erase, rekey
from siglo.reserved import keyring_access
from siglo.sealing import SEALED_KEY, Location
from siglo_memory.adapter import MemoryStorageAdapter
from siglo_redis.keys import KeySpace

ROOT = Path(__file__).resolve().parents[2]

NO_SETTLE = ("--settle-ms", "0")
"""``siglo erase`` without the wait for other processes' key caches: nothing else writes
the namespaces these tests erase (the wait itself is tested below)."""
SECRET = "rekey-SECRET-90aa"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def piped(backend: siglo.Backend, settings: Settings) -> PipelineAdapter:
    adapter, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
    assert isinstance(adapter, PipelineAdapter)
    return adapter


def _siglo_env(env: dict[str, str]) -> dict[str, str]:
    """This environment without siglo's settings, the checkout on the path, and ``env``."""
    clean = {k: v for k, v in os.environ.items() if k not in (*ENVIRONMENT, CONFIG_ENV)}
    clean["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "backends"), str(ROOT / "contract_tests")]
    )
    clean.update(env)
    return clean


def run_siglo(
    home: Path, *args: str, env: dict[str, str], stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "siglo", *args],
        cwd=home,
        env=_siglo_env(env),
        input=stdin,
        capture_output=True,
        timeout=120,
    )


def compact(backend: siglo.Backend) -> None:
    """``VACUUM`` and a truncating WAL checkpoint of the SQLite file."""
    path = backend.raw_adapter.database.path  # type: ignore[attr-defined]
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


def key_ids(stored: Checkpoint) -> set[str]:
    return {ctx[SEALED_KEY].split(".")[2] for ctx in stored.contexts.values()}


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_rekey_encrypts_clear_rows_and_moves_old_keys_to_the_current_one(
    kind: str, tmp_path: Path
) -> None:
    old, new = new_key(), new_key()
    async with shared_store(kind) as backend:
        clear = backend.raw_adapter
        await clear.save_checkpoint(
            Checkpoint(
                stack_id="plain",
                namespace="t1",
                revision=1,
                timestamp=5,
                contexts={"pay": {"card": SECRET}},
                metadata={"who": SECRET},
            ),
            expected_revision=0,
        )
        # Stand-alone wait records and cached steps written in clear: one waiting, one
        # claimed with an event payload; a cached step of a tenant's run and one without.
        await clear.save_wait_record(
            WaitRecord(
                correlation_key="w1",
                stack_id="plain",
                namespace="t1",
                metadata={"who": SECRET},
                event_payload={"card": SECRET},
            )
        )
        await clear.save_wait_record(
            WaitRecord(correlation_key="w2", stack_id="w2", namespace="t2")
        )
        await clear.claim_wait_record(
            "w2", "worker", event_payload={"card": SECRET}, namespace="t2"
        )
        await clear.set_cached_step("charge", {"card": SECRET}, 600_000, namespace="t1")
        await clear.set_cached_step("charge", {"card": SECRET}, 600_000)
        assert backend.idempotency is not None
        await backend.idempotency.claim("pay-1")
        await backend.idempotency.complete("pay-1", {"card": SECRET})
        first = piped(backend, Settings(encryption_keys={"k1": old}))
        for n in range(3):
            await first.save_checkpoint(
                Checkpoint(
                    stack_id=f"s{n}",
                    namespace="t2",
                    revision=1,
                    timestamp=5,
                    contexts={"pay": {"card": f"{SECRET}-{n}"}},
                ),
                expected_revision=0,
            )
        env = {"SIGLO_ENCRYPTION_KEYS": f"k1={old},k2={new}", "SIGLO_ENCRYPTION_KEY_ID": "k2"}
        done = run_siglo(tmp_path, "rekey", backend.url, env=env)
        assert done.returncode == 0, done.stderr.decode()
        assert b"rekeyed 4 checkpoint(s); 0 already under the current key" in done.stdout
        # Redis keeps the seed's copy of a wait record at its stack id's key: rekeyed too.
        waits = 3 if kind == "redis" else 2
        assert f"rekeyed {waits} stand-alone wait record(s); 0 already".encode() in done.stdout
        assert b"rekeyed 2 cached step(s); 0 already under the current key" in done.stdout
        assert b"rekeyed 1 idempotency result(s); 0 already under the current key" in done.stdout
        assert b"not rekeyed" not in done.stderr
        if kind == "sqlite":
            # The old row versions stay in SQLite's free pages and WAL until it compacts:
            # what docs/encryption.md tells a user turning encryption on to run.
            compact(backend)
        assert SECRET.encode() not in await raw_bytes(kind, backend)
        for ident, ns in (("plain", "t1"), ("s0", "t2"), ("s2", "t2")):
            stored = await clear.get_checkpoint(ident, ns, fallback=False)
            assert stored is not None and key_ids(stored) == {"k2"}
            assert stored.revision == 2 and stored.timestamp == 5
        # Only the new key is needed now, with plaintext refused.
        strict = piped(backend, Settings(encryption_keys={"k2": new}, require_encryption=True))
        found = await strict.get_checkpoint("plain", "t1", fallback=False)
        assert found is not None and found.metadata == {"who": SECRET}
        wait = await strict.get_wait_record("w1", namespace="t1")
        assert wait is not None and wait.event_payload == {"card": SECRET}
        assert wait.metadata == {"who": SECRET}
        claimed = await strict.get_wait_record("w2", namespace="t2")
        assert claimed is not None and claimed.status == "claimed"
        assert claimed.claimant_id == "worker" and claimed.event_payload == {"card": SECRET}
        for ns in ("t1", None):
            cached = await strict.get_cached_step("charge", namespace=ns)
            assert cached == {"card": SECRET}
        _, results = pipeline_parts(
            backend.raw_adapter,
            backend.idempotency,
            Pipeline(Settings(encryption_keys={"k2": new}, require_encryption=True)),
        )
        assert results is not None and await results.get_result("pay-1") == {"card": SECRET}
        # Resumable: a second run finds everything current.
        again = run_siglo(tmp_path, "rekey", backend.url, env=env)
        assert b"rekeyed 0 checkpoint(s); 4 already under the current key" in again.stdout
        assert f"rekeyed 0 stand-alone wait record(s); {waits} already".encode() in again.stdout
        assert b"rekeyed 0 cached step(s); 2 already under the current key" in again.stdout
        assert b"rekeyed 0 idempotency result(s); 1 already" in again.stdout


async def test_a_stack_sealing_would_make_too_large_is_named_and_the_rest_rekeyed(
    tmp_path: Path,
) -> None:
    """Turning encryption on for a store that held plaintext: a document close to
    ``max_document_bytes`` grows past it when sealed (base64), and its re-save is
    refused. The rekey stopped there, every later stack left in clear — and so at every
    run after. It leaves that one as it was, names it, rekeys the others, and exits 1."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with siglo.connect(url) as backend:
        clear = backend.raw_adapter
        # Listed in id order: the large one comes first, the others after it.
        for stack_id, size in (("a-large", 90_000), ("b-small", 10), ("c-small", 10)):
            text = base64.b64encode(os.urandom(size)).decode()[:size]
            await clear.save_checkpoint(
                Checkpoint(
                    stack_id=stack_id,
                    revision=1,
                    timestamp=5,
                    contexts={"doc": {"text": text, "card": SECRET}},
                )
            )
    env = {"SIGLO_ENCRYPTION_KEYS": f"k1={new_key()}", "SIGLO_MAX_DOCUMENT_BYTES": "100000"}
    done = run_siglo(tmp_path, "rekey", url, env=env)
    assert done.returncode == 1, done.stdout.decode() + done.stderr.decode()
    assert b"rekeyed 2 checkpoint(s); 0 already under the current key" in done.stdout
    err = done.stderr.decode()
    assert "1 checkpoint(s) not rekeyed" in err and "'a-large'" in err, err
    assert "max_document_bytes" in err or "limit" in err, err
    async with siglo.connect(url) as backend:
        large = await backend.raw_adapter.get_checkpoint("a-large")
        assert large is not None and large.revision == 1  # as it was, in clear
        assert large.contexts["doc"]["card"] == SECRET
        for stack_id in ("b-small", "c-small"):
            stored = await backend.raw_adapter.get_checkpoint(stack_id)
            assert stored is not None and key_ids(stored) == {"k1"}
    # Run again: the same one named, the others current.
    again = run_siglo(tmp_path, "rekey", url, env=env)
    assert again.returncode == 1
    assert b"rekeyed 0 checkpoint(s); 2 already under the current key" in again.stdout


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_rotation_under_concurrent_writers_loses_nothing(kind: str) -> None:
    settings = Settings(master_key=f"base64:{new_key()}")
    stacks, writers, rounds = 6, 4, 12
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        setup = piped(backend, settings)
        for n in range(stacks):
            await setup.save_checkpoint(
                Checkpoint(
                    stack_id=f"c{n}",
                    namespace="t",
                    revision=1,
                    timestamp=1,
                    contexts={"count": {"n": 0, "secret": SECRET}},
                ),
                expected_revision=0,
            )
        acknowledged = [0] * stacks

        async def writer(w: int) -> None:
            # A process of its own: its own key provider, re-reading the current key often.
            mine = piped(backend, settings)
            provider = mine.codecs.sealer.keys
            assert isinstance(provider, EnvelopeKeyProvider)
            provider.refresh_s = 0.05
            for r in range(rounds):
                n = (w + r) % stacks
                while True:
                    cp = await mine.get_checkpoint(f"c{n}", "t", fallback=False)
                    assert cp is not None
                    count = dict(cp.contexts["count"])
                    count["n"] += 1
                    contexts = {**cp.contexts, "count": count}
                    try:
                        await mine.save_checkpoint(
                            cp.replace(revision=cp.revision + 1, contexts=contexts),
                            expected_revision=cp.revision,
                        )
                    except CheckpointConflictError:
                        continue
                    acknowledged[n] += 1
                    break
                await asyncio.sleep(0)

        async def rotations() -> list[Any]:
            reports = []
            for _ in range(3):
                rotator = siglo.Backend(name=backend.name, url=backend.url, adapter=setup)
                reports.append(await rekey(rotator, namespace="t", rotate=True))
                await asyncio.sleep(0.02)
            return reports

        results = await asyncio.gather(*(writer(w) for w in range(writers)), rotations())
        reports = results[-1]
        assert len({tuple(r.rotated.values()) for r in reports}) == 3  # three new keys
        # Finish what the writers kept re-encrypting under a key current a moment before.
        rotator = siglo.Backend(name=backend.name, url=backend.url, adapter=setup)
        final = await rekey(rotator, namespace="t")
        assert final.left == 0
        reader = piped(backend, settings)
        for n in range(stacks):
            cp = await reader.get_checkpoint(f"c{n}", "t", fallback=False)
            assert cp is not None
            assert cp.contexts["count"] == {"n": acknowledged[n], "secret": SECRET}
        assert sum(acknowledged) == writers * rounds
        current = reports[-1].rotated["t"]
        for n in range(stacks):
            stored = await backend.raw_adapter.get_checkpoint(f"c{n}", "t", fallback=False)
            assert stored is not None and key_ids(stored) == {current}
        assert SECRET.encode() not in await raw_bytes(kind, backend)


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_erasure_makes_an_earlier_export_unreadable(kind: str, tmp_path: Path) -> None:
    env = {"SIGLO_MASTER_KEY": f"base64:{new_key()}"}
    settings = Settings(master_key=env["SIGLO_MASTER_KEY"])
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        writer = piped(backend, settings)
        for ns in ("gone", "kept"):
            for n in range(3):
                await writer.save_checkpoint(
                    Checkpoint(
                        stack_id=f"s{n}",
                        namespace=ns,
                        revision=1,
                        timestamp=1,
                        contexts={"pay": {"card": f"{SECRET}-{ns}"}},
                    ),
                    expected_revision=0,
                )
        dump = run_siglo(tmp_path, "export", backend.url, "--namespace", "gone", env=env)
        assert dump.returncode == 0, dump.stderr.decode()
        assert SECRET.encode() not in dump.stdout  # a safe backup: as stored, encrypted
        assert dump.stdout.count(b'"kind":"checkpoint"') == 3
        whole = run_siglo(tmp_path, "export", backend.url, env=env)
        assert KEYRING_NAMESPACE.encode() not in whole.stdout  # never the keys
        clear = run_siglo(tmp_path, "export", backend.url, "--decrypt", "-n", "gone", env=env)
        assert f"{SECRET}-gone".encode() in clear.stdout

        erased = run_siglo(
            tmp_path, "erase", backend.url, "--namespace", "gone", "--yes", *NO_SETTLE, env=env
        )
        assert erased.returncode == 0, erased.stderr.decode()
        assert b"destroyed 1 data key(s), deleted 3 checkpoint(s)" in erased.stdout

        restored = run_siglo(tmp_path, "import", backend.url, env=env, stdin=dump.stdout)
        assert restored.returncode == 1
        assert b"was erased" in restored.stderr, restored.stderr.decode()
        # Nothing of it is readable, or even stored again.
        assert await backend.raw_adapter.get_checkpoint("s0", "gone", fallback=False) is None
        fresh = piped(backend, settings)
        with pytest.raises(KeyErasedError):
            await fresh.open_stored_checkpoint(
                Checkpoint.from_json(
                    dump.stdout.splitlines()[1][len(b'{"kind":"checkpoint","document":') : -1]
                )
            )
        kept = await fresh.get_checkpoint("s1", "kept", fallback=False)
        assert kept is not None and kept.contexts["pay"]["card"] == f"{SECRET}-kept"
        # The namespace can be used again, under a new key.
        await fresh.save_checkpoint(
            Checkpoint(
                stack_id="s0",
                namespace="gone",
                revision=1,
                timestamp=2,
                contexts={"pay": {"card": "new"}},
            ),
            expected_revision=0,
        )
        again = await piped(backend, settings).get_checkpoint("s0", "gone", fallback=False)
        assert again is not None and again.contexts["pay"]["card"] == "new"


async def test_erase_needs_envelope_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert run_siglo(tmp_path, "migrate", url, env={}).returncode == 0  # erase reads a store
    done = run_siglo(
        tmp_path,
        "erase",
        url,
        "-n",
        "t",
        "--yes",
        env={"SIGLO_ENCRYPTION_KEYS": f"k1={new_key()}"},
    )
    assert done.returncode == 1
    assert b"needs envelope keys (master_key)" in done.stderr


async def _tenant_t_under_a_master_key(tmp_path: Path) -> tuple[str, Settings]:
    """An SQLite store with envelope keys whose tenant ``t`` has a run (so a keyring),
    and the settings of its master key."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    settings = Settings(master_key=f"base64:{new_key()}")
    async with siglo.connect(url, settings=settings) as backend:
        stack = siglo.StorageManager(backend).create_stack("order-1", namespace="t")
        stack.set("pay", "card", SECRET)
        await stack.save()
    return url, settings


async def test_erase_with_another_stores_master_key_is_refused(tmp_path: Path) -> None:
    """Every command refuses a master key that does not unwrap the store's keyrings (a
    shell holding another store's key); the one irreversible command too: ``siglo
    erase`` fails naming it and destroys nothing — the right key still reads."""
    url, settings = await _tenant_t_under_a_master_key(tmp_path)
    wrong = {"SIGLO_MASTER_KEY": f"base64:{new_key()}"}
    done = run_siglo(tmp_path, "erase", url, "-n", "t", "--yes", env=wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    assert b"does not unwrap with this master key" in done.stderr, done.stderr
    async with siglo.connect(url, settings=settings) as backend:
        stack = await siglo.StorageManager(backend).resume("order-1", namespace="t")
        assert stack is not None and stack.context("pay") == {"card": SECRET}


async def test_erase_of_a_namespace_with_neither_keys_nor_stacks_is_refused(
    tmp_path: Path,
) -> None:
    """``siglo erase -n tenant-typo``: reported as erased (status 0), a typo hid that the
    real tenant was not, and left a keyring for the typo — from a shell holding another
    store's master key too. Refused, writing nothing; a namespace with stacks but no
    keyring (stored before encryption) is erased, and gets no keyring either."""
    url, settings = await _tenant_t_under_a_master_key(tmp_path)
    for env in (
        {"SIGLO_MASTER_KEY": settings.master_key},
        {"SIGLO_MASTER_KEY": f"base64:{new_key()}"},
    ):
        done = run_siglo(tmp_path, "erase", url, "-n", "tenant-typo", "--yes", *NO_SETTLE, env=env)
        assert done.returncode == 1, done.stdout + done.stderr
        assert b"neither keys nor stacks" in done.stderr, done.stderr
    async with siglo.connect(url, settings=Settings()) as plain:
        await plain.adapter.save_checkpoint(
            Checkpoint(stack_id="old", namespace="clear", revision=1, timestamp=1)
        )
    env = {"SIGLO_MASTER_KEY": settings.master_key}
    done = run_siglo(tmp_path, "erase", url, "-n", "clear", "--yes", *NO_SETTLE, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    # A namespace whose runs are gone but whose stand-alone records are not (stored
    # before encryption): those are its data, and erased.
    async with siglo.connect(url, settings=Settings()) as plain:
        await plain.adapter.save_wait_record(
            WaitRecord(
                correlation_key="w",
                stack_id="gone",
                namespace="leftover",
                event_payload={"email": SECRET},  # erase lists records that hold payloads
            )
        )
        await plain.adapter.set_cached_step("k", {"email": SECRET}, namespace="leftover")
    done = run_siglo(tmp_path, "erase", url, "-n", "leftover", "--yes", *NO_SETTLE, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    async with siglo.connect(url, settings=Settings()) as plain:
        assert await plain.adapter.get_wait_record("w", namespace="leftover") is None
        assert await plain.adapter.get_cached_step("k", namespace="leftover") is siglo.MISSING
    async with siglo.connect(url, settings=settings) as backend:
        with keyring_access():
            rings = await backend.raw_adapter.list_checkpoints(namespace=KEYRING_NAMESPACE)
        assert sorted(ring.stack_id for ring in rings.items) == ["t"]
        assert await backend.raw_adapter.get_checkpoint("old", "clear", fallback=False) is None


async def test_a_rotation_with_another_stores_master_key_changes_nothing(tmp_path: Path) -> None:
    """``siglo rekey --rotate`` with a master key that does not unwrap the keyring is
    refused before it adds a key: a data key wrapped by the wrong master key, made
    active, would fail every later save of the namespace under the right one."""
    url, settings = await _tenant_t_under_a_master_key(tmp_path)
    async with siglo.connect(url, settings=settings) as backend:
        with keyring_access():
            ring = await backend.raw_adapter.get_checkpoint("t", KEYRING_NAMESPACE)
        assert ring is not None
    wrong = {"SIGLO_MASTER_KEY": f"base64:{new_key()}"}
    done = run_siglo(tmp_path, "rekey", url, "--rotate", env=wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    assert b"does not unwrap with this master key" in done.stderr, done.stderr
    async with siglo.connect(url, settings=settings) as backend:
        with keyring_access():
            after = await backend.raw_adapter.get_checkpoint("t", KEYRING_NAMESPACE)
        assert after == ring
        manager = siglo.StorageManager(backend)
        later = manager.create_stack("order-2", namespace="t")
        later.set("pay", "card", SECRET)
        await later.save()
        resumed = await manager.resume("order-1", namespace="t")
        assert resumed is not None and resumed.context("pay") == {"card": SECRET}


async def test_another_stores_master_key_makes_no_first_key_either(tmp_path: Path) -> None:
    """A namespace without a keyring yet: its first data key, wrapped by a master key that
    does not unwrap the store's other keyrings, would be one the application's master
    key cannot unwrap — every later save of that namespace refused. ``rekey --rotate -n``
    and a save from such a process are refused, and nothing is written."""
    url, right = await _tenant_t_under_a_master_key(tmp_path)
    wrong = {"SIGLO_MASTER_KEY": f"base64:{new_key()}"}
    done = run_siglo(tmp_path, "rekey", url, "--rotate", "-n", "fresh", env=wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    assert b"does not unwrap with this master key" in done.stderr, done.stderr
    async with siglo.connect(url, settings=Settings(master_key=wrong["SIGLO_MASTER_KEY"])) as b:
        stray = siglo.StorageManager(b).create_stack("order-2", namespace="fresh")
        stray.set("pay", "card", SECRET)
        with pytest.raises(DecryptionError, match="does not unwrap"):
            await stray.save()
        with keyring_access():
            assert await b.raw_adapter.get_checkpoint("fresh", KEYRING_NAMESPACE) is None
    async with siglo.connect(url, settings=right) as backend:
        later = siglo.StorageManager(backend).create_stack("order-3", namespace="fresh")
        later.set("pay", "card", SECRET)
        await later.save()


def sealed_texts(value: Any) -> list[str]:
    """The ciphertexts of a stored payload (the ``$siglo`` strings in it)."""
    if isinstance(value, dict):
        if SEALED_KEY in value:
            return [value[SEALED_KEY]]
        return [t for v in value.values() for t in sealed_texts(v)]
    return []


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_erase_empties_a_tenants_streams_that_no_checkpoint_took(
    kind: str, tmp_path: Path
) -> None:
    """A stack whose changes were streamed in clear (before encryption was on) and that
    was never checkpointed: deleting the tenant's checkpoints left its stream, and
    `siglo erase` reported success with the card number still readable (a black-box
    auditor). Its values are emptied; another tenant's stream of the same stack id
    keeps its values."""
    env = {"SIGLO_MASTER_KEY": f"base64:{new_key()}"}
    settings = Settings(master_key=env["SIGLO_MASTER_KEY"])
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        raw = backend.raw_adapter
        for ns in ("gone", "kept"):
            await raw.on_context_change(
                ContextChangeEvent(
                    stack_id="draft",
                    step_id="pay",
                    key="card",
                    value=SECRET,
                    namespace=ns,
                    timestamp=1,
                )
            )
        writer = piped(backend, settings)
        await writer.save_checkpoint(
            Checkpoint(stack_id="s0", namespace="gone", revision=1, timestamp=1),
            expected_revision=0,
        )
        erased = run_siglo(
            tmp_path, "erase", backend.url, "--namespace", "gone", "--yes", *NO_SETTLE, env=env
        )
        assert erased.returncode == 0, erased.stderr.decode()
        assert b"1 context-change stream value(s) emptied" in erased.stdout, erased.stdout
        gone = await raw.get_context_changes("draft", "pay", namespace="gone")
        assert SECRET not in str(gone), gone
        assert await raw.get_context_changes("draft", "pay", namespace="kept") == {"card": SECRET}
        if kind == "sqlite":
            compact(backend)
        assert SECRET.encode() in await raw_bytes(kind, backend)  # the other tenant's
        left = [i async for i in raw.scan_payloads("context") if i.namespace == "gone"]
        assert left == []


@pytest.mark.rule("payload.delete")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_erase_deletes_a_tenants_stand_alone_waits_and_cached_steps(
    kind: str, tmp_path: Path
) -> None:
    """After ``siglo erase -n T`` the raw storage holds none of T's cached steps and
    stand-alone wait records (Redis's per-stack copy included), and all of U's."""
    env = {"SIGLO_MASTER_KEY": f"base64:{new_key()}"}
    settings = Settings(master_key=env["SIGLO_MASTER_KEY"])
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        writer = piped(backend, settings)
        for ns in ("gone", "kept"):
            card = {"card": f"{SECRET}-{ns}"}
            await writer.save_checkpoint(
                Checkpoint(stack_id="s0", namespace=ns, revision=1, timestamp=1, contexts={}),
                expected_revision=0,
            )
            # A stand-alone wait whose stack id is not its key (Redis copies it under the
            # stack id), one claimed with an event payload, and one of the checkpoint's
            # stack (deleted with the checkpoint).
            await writer.save_wait_record(
                WaitRecord(correlation_key="w1", stack_id="lone", namespace=ns, metadata=card)
            )
            await writer.save_wait_record(
                WaitRecord(correlation_key="w2", stack_id="w2", namespace=ns)
            )
            await writer.claim_wait_record("w2", "worker", event_payload=card, namespace=ns)
            await writer.save_wait_record(
                WaitRecord(correlation_key="w3", stack_id="s0", namespace=ns, metadata=card)
            )
            await writer.set_cached_step("charge", card, 600_000, namespace=ns)
        raw = backend.raw_adapter
        texts: dict[str | None, list[str]] = {"gone": [], "kept": []}
        for what in ("wait", "step"):
            async for item in raw.scan_payloads(what):
                owner = item.namespace
                if what == "step":
                    split = split_namespaced_key(item.key)
                    assert split is not None
                    owner = split[1]
                texts[owner].extend(t for v in item.fields.values() for t in sealed_texts(v))
        assert len(texts["gone"]) == len(texts["kept"]) >= 4

        erased = run_siglo(
            tmp_path, "erase", backend.url, "--namespace", "gone", "--yes", *NO_SETTLE, env=env
        )
        assert erased.returncode == 0, erased.stderr.decode()
        assert (
            b"destroyed 1 data key(s), deleted 1 checkpoint(s), 2 wait record(s), 1 cached step(s)"
            in erased.stdout
        ), erased.stdout.decode()
        assert erased.stderr == b""

        for key in ("w1", "w2", "w3"):
            assert await raw.get_wait_record(key, namespace="gone") is None
            assert await raw.get_wait_record(key, namespace="kept") is not None
        assert await raw.get_cached_step("charge", namespace="gone") is siglo.MISSING
        left = [i async for i in raw.scan_payloads("wait") if i.namespace == "gone"]
        assert left == []
        if kind == "sqlite":
            compact(backend)  # the deleted rows' bytes leave SQLite's free pages
        stored = await raw_bytes(kind, backend)
        assert not [t for t in texts["gone"] if t.encode() in stored]
        assert all(t.encode() in stored for t in texts["kept"])
        if kind == "redis":
            # The stack copy TypeScript reads and the stack's index went with the record.
            redis: Any = raw
            for ns, there in (("gone", 0), ("kept", 2)):
                found = await redis.client.exists(
                    redis.keys.wait("lone", ns), redis.keys.wait_index("lone", ns)
                )
                assert found == there, (ns, found)
        reader = piped(backend, settings)
        kept = await reader.get_wait_record("w2", namespace="kept")
        assert kept is not None and kept.event_payload == {"card": f"{SECRET}-kept"}
        assert await reader.get_cached_step("charge", namespace="kept") == {
            "card": f"{SECRET}-kept"
        }


def test_erase_says_what_a_backend_without_payload_scan_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A third party's backend without payload_scan: erase destroys the keys, deletes the
    checkpoints and says on standard error what it could not delete (exit status 0)."""

    class NoScan(MemoryStorageAdapter):
        capabilities = MemoryStorageAdapter.capabilities - {siglo.Capability.PAYLOAD_SCAN}

    settings = Settings(master_key=f"base64:{new_key()}")
    raw = NoScan()
    adapter, _ = pipeline_parts(raw, None, Pipeline(settings))
    backend = siglo.Backend(name="third-party", url="memory://", adapter=adapter)

    async def seed() -> None:
        await adapter.save_checkpoint(
            Checkpoint(stack_id="s", namespace="gone", revision=1, timestamp=1, contexts={}),
            expected_revision=0,
        )
        await adapter.set_cached_step("k", {"b": SECRET}, 600_000, namespace="gone")

    asyncio.run(seed())

    @contextlib.asynccontextmanager
    async def the_store(url: str, **_: Any) -> AsyncIterator[siglo.Backend]:
        yield backend

    monkeypatch.setattr(siglo.cli.keys, "open_store", the_store)
    result = CliRunner().invoke(siglo.cli.keys.erase_command, ["memory://", "-n", "gone", "--yes"])
    assert result.exit_code == 0, result.output
    assert "destroyed 1 data key(s), deleted 1 checkpoint(s)\n" in result.stdout
    assert (
        "warning: cached step(s) of gone not deleted (the memory backend cannot list "
        "its cached steps): they stay stored, undecryptable, until they expire"
    ) in result.stderr
    assert "stand-alone wait record(s) of gone not deleted" in result.stderr
    assert "context-change stream value(s) of gone not deleted" in result.stderr
    assert asyncio.run(raw.get_checkpoint("s", "gone", fallback=False)) is None


def test_rekey_and_erase_say_nothing_of_records_a_backend_does_not_keep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backend that keeps checkpoints alone (no wait records, cached steps or context
    streams, so nothing to list either): rekey and erase do what they can and warn of
    nothing they could not, where one that keeps records it cannot list is warned of
    (above)."""

    class CheckpointsOnly(MemoryStorageAdapter):
        capabilities = MemoryStorageAdapter.capabilities - {
            siglo.Capability.PAYLOAD_SCAN,
            siglo.Capability.WAIT_RECORDS,
            siglo.Capability.STEP_CACHE,
            siglo.Capability.CONTEXT_STREAM,
        }

    settings = Settings(master_key=f"base64:{new_key()}")
    adapter, _ = pipeline_parts(CheckpointsOnly(), None, Pipeline(settings))
    backend = siglo.Backend(name="third-party", url="memory://", adapter=adapter)
    asyncio.run(
        adapter.save_checkpoint(
            Checkpoint(stack_id="s", namespace="gone", revision=1, timestamp=1, contexts={}),
            expected_revision=0,
        )
    )

    @contextlib.asynccontextmanager
    async def the_store(url: str, **_: Any) -> AsyncIterator[siglo.Backend]:
        yield backend

    monkeypatch.setattr(siglo.cli.keys, "open_store", the_store)
    runner = CliRunner()
    rekeyed = runner.invoke(siglo.cli.keys.rekey_command, ["memory://"])
    assert rekeyed.exit_code == 0, rekeyed.output
    assert rekeyed.stderr == "" and "1 already under the current key" in rekeyed.stdout
    erased = runner.invoke(siglo.cli.keys.erase_command, ["memory://", "-n", "gone", "--yes"])
    assert erased.exit_code == 0, erased.output
    assert erased.stderr == "", erased.stderr
    assert erased.stdout.endswith(": destroyed 1 data key(s), deleted 1 checkpoint(s)\n")


async def test_erase_deletes_on_its_next_pass_what_changed_under_its_first() -> None:
    """A wait record claimed and a cached step set again between erase's listing and its
    delete are not deleted as listed (the compare fails); the next pass lists them as
    they are now and deletes them."""

    raced: set[str] = set()

    class Raced(MemoryStorageAdapter):
        async def _do_delete_payload(self, item: StoredPayload) -> bool:
            if item.kind not in raced:
                raced.add(item.kind)
                if item.kind == "wait":
                    await self.claim_wait_record("w", "worker", namespace="gone")
                else:
                    await self._do_set_cached_step(item.key, {"again": 1}, 600_000)
            return await super()._do_delete_payload(item)

    settings = Settings(master_key=f"base64:{new_key()}")
    raw = Raced()
    adapter, _ = pipeline_parts(raw, None, Pipeline(settings))
    await adapter.save_wait_record(
        WaitRecord(correlation_key="w", stack_id="w", namespace="gone", metadata={"m": SECRET})
    )
    await adapter.set_cached_step("k", {"b": SECRET}, 600_000, namespace="gone")
    report = await erase(
        siglo.Backend(name="memory", url="memory://", adapter=adapter), "gone", settle_s=0
    )
    assert raced == {"wait", "step"}
    assert report.payloads == {"wait": 1, "step": 1} and report.left == {"wait": 0, "step": 0}
    assert await raw.get_wait_record("w", namespace="gone") is None
    assert await raw.get_cached_step("k", namespace="gone") is siglo.MISSING


def test_erase_names_what_kept_changing_and_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record whose every delete finds it changed (here: a backend that never deletes)
    is listed again pass after pass; at the end erase names it and exits with status 3.
    A cached step stored under a digest (namespace and key too long together) does not
    name its namespace: it is left, and the erasure leaves it undecryptable."""

    class NeverDeletes(MemoryStorageAdapter):
        async def _do_delete_payload(self, item: StoredPayload) -> bool:
            return False

    settings = Settings(master_key=f"base64:{new_key()}")
    raw = NeverDeletes()
    adapter, _ = pipeline_parts(raw, None, Pipeline(settings))
    backend = siglo.Backend(name="memory", url="memory://", adapter=adapter)
    long_key = "k" * 4_090  # with "@4:gone:" over 4,096 characters

    async def seed() -> Any:
        await adapter.set_cached_step("k", {"b": SECRET}, 600_000, namespace="gone")
        await adapter.set_cached_step(long_key, {"b": SECRET}, 600_000, namespace="gone")
        return await raw.get_cached_step(long_key, namespace="gone")

    digested = asyncio.run(seed())
    assert split_namespaced_key(namespaced_key(long_key, "gone")) is None

    @contextlib.asynccontextmanager
    async def the_store(url: str, **_: Any) -> AsyncIterator[siglo.Backend]:
        yield backend

    monkeypatch.setattr(siglo.cli.keys, "open_store", the_store)
    result = CliRunner().invoke(
        siglo.cli.keys.erase_command, ["memory://", "-n", "gone", "--yes", *NO_SETTLE]
    )
    assert result.exit_code == 3, result.output
    assert ", 0 wait record(s), 0 cached step(s)\n" in result.stdout
    assert result.stderr == "1 cached step(s) kept changing: run siglo erase again\n"

    async def after() -> None:
        # The digest-keyed entry: still stored, no longer decrypts.
        assert await raw.get_cached_step(long_key, namespace="gone") == digested
        fresh, _ = pipeline_parts(raw, None, Pipeline(settings))
        assert await fresh.get_cached_step(long_key, namespace="gone") is siglo.MISSING

    asyncio.run(after())


@pytest.mark.rule("cache.namespaced")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_erasure_reaches_a_tenants_cached_steps(kind: str, tmp_path: Path) -> None:
    """A flow run in tenant T caches its step under T's key, bound to T: the same step and
    input in tenant U is U's own entry (the step runs again), and once T is erased its
    cached output no longer decrypts — U's still does."""
    env = {"SIGLO_MASTER_KEY": f"base64:{new_key()}"}
    settings = Settings(master_key=env["SIGLO_MASTER_KEY"])
    ran: list[str] = []

    async def charge(order: Any) -> dict[str, Any]:
        ran.append(order["tenant"])
        return {"card": f"{SECRET}-{order['tenant']}"}

    run = siglo.flow(
        siglo.Step.create("charge", charge).cache(ttl_ms=600_000, key=lambda _: "order-1"),
        name="erase-cache",
    )
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        app = siglo.Backend(name=backend.name, url=backend.url, adapter=piped(backend, settings))
        # What a release before namespaced entries cached for one of the runs: the key
        # alone. A namespaced run misses it rather than serve it to any tenant.
        await app.adapter.set_cached_step("order-1", {"card": "stale"}, 600_000)
        manager = siglo.StorageManager(app, settings=settings)
        for tenant in ("gone", "kept"):
            await run.run({"tenant": tenant}, manager=manager, stack_id="r1", namespace=tenant)
        assert ran == ["gone", "kept"]  # one entry per tenant, not one shared
        await run.run({"tenant": "gone"}, manager=manager, stack_id="r2", namespace="gone")
        assert ran == ["gone", "kept"]  # a hit in its own tenant
        raw = backend.raw_adapter
        stored = {ns: await raw.get_cached_step("order-1", namespace=ns) for ns in ("gone", "kept")}
        old = await raw.get_cached_step("order-1")
        assert isinstance(old, dict) and SEALED_KEY in old  # the old entry, kept apart
        assert all(SECRET.encode() not in orjson.dumps(v) for v in stored.values())

        erased = run_siglo(
            tmp_path, "erase", backend.url, "--namespace", "gone", "--yes", *NO_SETTLE, env=env
        )
        assert erased.returncode == 0, erased.stderr.decode()
        # Its entry is deleted; the other tenant's and the un-namespaced one stay.
        assert b", 0 wait record(s), 1 cached step(s)\n" in erased.stdout
        assert await raw.get_cached_step("order-1", namespace="gone") is siglo.MISSING
        assert await raw.get_cached_step("order-1", namespace="kept") == stored["kept"]
        # A copy of it (a replica, a restored backup) does not decrypt.
        await raw.set_cached_step("order-1", stored["gone"], 600_000, namespace="gone")

        fresh = piped(backend, settings)
        sealer = fresh.codecs.sealer
        with pytest.raises(KeyErasedError):
            await sealer.open(stored["gone"], Location("gone", "order-1", "step", "value"))
        # A rekey leaves the erased tenant's copy as it is, counted as unreadable.
        after = run_siglo(tmp_path, "rekey", backend.url, env=env)
        assert after.returncode == 0, after.stderr.decode()
        steps = b"rekeyed 0 cached step(s); 2 already under the current key; 0 kept changing"
        assert steps + b"; 1 unreadable" in after.stdout
        # Whatever of it is still stored does not decrypt either: to the application it is
        # a miss, so the namespace used again runs the step anew; the other tenant's reads.
        assert await fresh.get_cached_step("order-1", namespace="gone") is siglo.MISSING
        again = siglo.Backend(name=backend.name, url=backend.url, adapter=fresh)
        manager = siglo.StorageManager(again, settings=settings)
        await run.run({"tenant": "gone"}, manager=manager, stack_id="r3", namespace="gone")
        assert ran == ["gone", "kept", "gone"]
        kept = await fresh.get_cached_step("order-1", namespace="kept")
        assert kept == {"card": f"{SECRET}-kept"}
        # A ciphertext of one tenant copied under another's entry does not decrypt there.
        with pytest.raises(DecryptionError):
            await sealer.open(stored["kept"], Location("other", "order-1", "step", "value"))
        # The entry written anew is current.
        last = run_siglo(tmp_path, "rekey", backend.url, env=env)
        steps = b"rekeyed 0 cached step(s); 3 already under the current key; 0 kept changing"
        assert steps + b"; 0 unreadable" in last.stdout, last.stdout.decode()
        # Last: reading the SQLite files from this process (and closing them) drops its
        # locks on them, after which another process may take the WAL away from it.
        assert SECRET.encode() not in await raw_bytes(kind, backend)


def test_a_namespaced_cache_key_reads_back_unless_it_is_a_digest() -> None:
    """What siglo rekey reads a cached step's namespace from (docs/encryption.md): the
    stored key splits back into key and namespace, except a pair too long to join."""
    for key, namespace in (("k", None), ("@k", None), ("@1:a:k", None), ("k", "a:b"), ("k", "")):
        assert split_namespaced_key(namespaced_key(key, namespace)) == (key, namespace)
    assert split_namespaced_key(namespaced_key("k" * 3000, "n" * 2000)) is None


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_rekeying_waits_and_cached_steps_under_concurrent_writers_loses_nothing(
    kind: str,
) -> None:
    """Rotations while workers claim and complete stand-alone wait records (with event
    payloads), sets replace cached steps and completions replace idempotency results:
    every rewrite of the rekey is a
    compare-and-set on the bytes it read, so no claim, completion or set is lost."""
    settings = Settings(master_key=f"base64:{new_key()}")
    waits, keys, rounds = 8, 4, 10
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        setup = piped(backend, settings)
        for n in range(waits):
            await setup.save_wait_record(
                WaitRecord(
                    correlation_key=f"w{n}", stack_id=f"s{n}", namespace="t", metadata={"n": n}
                )
            )
        last: dict[str, Any] = {}

        async def claimer(w: int) -> None:
            mine = piped(backend, settings)
            provider = mine.codecs.sealer.keys
            assert isinstance(provider, EnvelopeKeyProvider)
            provider.refresh_s = 0.05
            for n in range(w, waits, 2):
                payload = {"card": f"{SECRET}-{n}"}
                claimed = await mine.claim_wait_record(
                    f"w{n}", f"worker-{w}", event_payload=payload, namespace="t"
                )
                assert claimed is not None and claimed.event_payload == payload
                await asyncio.sleep(0.005)
                await mine.complete_wait_record(f"w{n}", f"worker-{w}", namespace="t")

        async def setter(k: int) -> None:
            mine = piped(backend, settings)
            provider = mine.codecs.sealer.keys
            assert isinstance(provider, EnvelopeKeyProvider)
            provider.refresh_s = 0.05
            for r in range(rounds):
                value = {"round": r, "secret": SECRET}
                await mine.set_cached_step(f"k{k}", value, 600_000, namespace="t")
                last[f"k{k}"] = value
                await asyncio.sleep(0.003)

        results_of: dict[str, Any] = {}
        setup_parts = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
        store = setup_parts[1]
        assert store is not None

        async def completer(k: int) -> None:
            mine = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))[1]
            assert mine is not None
            for r in range(rounds):
                value = {"round": r, "secret": SECRET}
                await mine.complete(f"i{k}", value, 600_000)
                results_of[f"i{k}"] = value
                await asyncio.sleep(0.003)

        async def rotations() -> list[Any]:
            reports = []
            for _ in range(3):
                rotator = siglo.Backend(
                    name=backend.name, url=backend.url, adapter=setup, idempotency=store
                )
                reports.append(await rekey(rotator, rotate=True))
                await asyncio.sleep(0.01)
            return reports

        results = await asyncio.gather(
            *(claimer(w) for w in range(2)),
            *(setter(k) for k in range(keys)),
            *(completer(k) for k in range(keys)),
            rotations(),
        )
        assert len({tuple(r.rotated.values()) for r in results[-1]}) == 3
        rotator = siglo.Backend(
            name=backend.name, url=backend.url, adapter=setup, idempotency=store
        )
        for _ in range(3):  # what changed under a rewrite is finished by a next run
            final = await rekey(rotator)
            if not any(c.left for c in final.payloads.values()):
                break
        assert not any(c.left or c.unreadable for c in final.payloads.values()), final
        assert final.payloads["step"].current + final.payloads["step"].rekeyed == keys
        reader = piped(backend, settings)
        for n in range(waits):
            record = await reader.get_wait_record(f"w{n}", namespace="t")
            assert record is not None and record.status == "completed", record
            assert record.claimant_id == f"worker-{n % 2}"
            assert record.event_payload == {"card": f"{SECRET}-{n}"}
            assert record.metadata == {"n": n}
        for k in range(keys):
            assert await reader.get_cached_step(f"k{k}", namespace="t") == last[f"k{k}"]
        results_reader = pipeline_parts(
            backend.raw_adapter, backend.idempotency, Pipeline(settings)
        )[1]
        assert results_reader is not None
        for k in range(keys):
            assert await results_reader.get_result(f"i{k}") == results_of[f"i{k}"]
        assert SECRET.encode() not in await raw_bytes(kind, backend)


async def test_a_backend_without_payload_scan_is_rekeyed_and_says_what_it_left() -> None:
    """A third party's backend without payload_scan: its checkpoints are re-encrypted,
    and the report names the kinds left under their old key (which siglo rekey prints
    on standard error)."""

    class NoScan(MemoryStorageAdapter):
        capabilities = MemoryStorageAdapter.capabilities - {siglo.Capability.PAYLOAD_SCAN}

    old, new = new_key(), new_key()
    raw = NoScan()
    writer, _ = pipeline_parts(raw, None, Pipeline(Settings(encryption_keys={"k1": old})))
    await writer.save_checkpoint(
        Checkpoint(stack_id="s", revision=1, timestamp=1, contexts={"a": {"b": SECRET}}),
        expected_revision=0,
    )
    await writer.set_cached_step("k", {"b": SECRET}, 600_000)
    settings = Settings(encryption_keys={"k1": old, "k2": new}, encryption_key_id="k2")
    adapter, _ = pipeline_parts(raw, None, Pipeline(settings))
    report = await rekey(siglo.Backend(name="third-party", url="memory://", adapter=adapter))
    assert report.rekeyed == 1 and report.payloads == {}
    assert set(report.skipped) == {"wait", "step", "context"}
    assert "cannot list its cached steps" in report.skipped["step"]
    assert "cannot list its context-change streams" in report.skipped["context"]


def change(
    stack_id: str, step_id: str, key: str, value: Any, namespace: str | None, at: int = 1
) -> ContextChangeEvent:
    return ContextChangeEvent(
        stack_id=stack_id, step_id=step_id, key=key, value=value, namespace=namespace, timestamp=at
    )


STREAMS = (("t1", "plain", "pay"), (None, "s:2", "step.a"), ("t2", "s3", "pay"))
"""Context streams ``(namespace, stack id, step id)`` of the stream tests: ids with the
characters the Redis keys escape or the associated data must keep apart."""


async def stored_streams(backend: siglo.Backend) -> dict[tuple[Any, ...], Any]:
    """Every value of :data:`STREAMS` as stored, by ``(namespace, stack, step, key)``."""
    raw = backend.raw_adapter
    return {
        (ns, stack, step, key): value
        for ns, stack, step in STREAMS
        for key, value in (await raw.get_context_changes(stack, step, ns)).items()
    }


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", KINDS)
async def test_rekey_reseals_context_streams_in_clear_and_under_an_old_key(kind: str) -> None:
    """The per-step change history is re-sealed like every other record: a stream written
    in clear (encryption turned on later) or under a key since rotated reads afterwards
    with the current key alone and with require_encryption, and a second run finds it
    current."""
    old, new = new_key(), new_key()
    async with any_backend(kind) as backend:
        clear = backend.raw_adapter
        await clear.on_context_change(change("plain", "pay", "card", {"n": SECRET}, "t1"))
        await clear.on_context_change(change("plain", "pay", "note", SECRET, "t1"))
        await clear.on_context_change(change("s:2", "step.a", "b.c", [SECRET], None))
        # A value set to null is no payload: nothing to seal, not counted.
        await clear.on_context_change(change("s:2", "step.a", "gone", None, None))
        first = piped(backend, Settings(encryption_keys={"k1": old}))
        await first.on_context_change(change("s3", "pay", "card", {"n": SECRET}, "t2"))
        settings = Settings(encryption_keys={"k1": old, "k2": new}, encryption_key_id="k2")
        rotator = siglo.Backend(
            name=backend.name, url=backend.url, adapter=piped(backend, settings)
        )
        report = await rekey(rotator)
        assert "context" not in report.skipped, report.skipped
        counts = report.payloads["context"]
        assert (counts.rekeyed, counts.current, counts.left, counts.unreadable) == (4, 0, 0, 0)
        stored = await stored_streams(backend)
        assert stored.pop((None, "s:2", "step.a", "gone")) is None
        assert len(stored) == 4
        for value in stored.values():
            assert value[SEALED_KEY].split(".")[2] == "k2", value
        if kind != "sqlite":  # SQLite keeps old row versions until it compacts (the docs)
            assert SECRET.encode() not in await raw_bytes(kind, backend)
        strict = piped(backend, Settings(encryption_keys={"k2": new}, require_encryption=True))
        assert await strict.get_context_changes("plain", "pay", "t1") == {
            "card": {"n": SECRET},
            "note": SECRET,
        }
        assert await strict.get_context_changes("s:2", "step.a") == {"b.c": [SECRET], "gone": None}
        assert await strict.get_context_changes("s3", "pay", "t2") == {"card": {"n": SECRET}}
        again = (await rekey(rotator)).payloads["context"]
        assert (again.rekeyed, again.current) == (0, 4)
        # A rekey of one namespace rewrites that namespace's streams only.
        assert (await rekey(rotator, namespace="t1")).payloads["context"].current == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_value_changed_after_it_was_listed_is_not_rewritten(kind: str) -> None:
    """The compare-and-set under siglo rekey's stream rewrite (docs/encryption.md): a
    value changed or deleted since the walk listed it stays as the writer left it."""
    name = '["step","k"]'
    async with any_backend(kind) as backend:
        raw = backend.raw_adapter
        await raw.on_context_change(change("s", "step", "k", "old", "t"))
        (item,) = [i async for i in raw.scan_payloads("context")]
        assert (item.kind, item.key, item.namespace, item.fields) == (
            "context",
            "s",
            "t",
            {name: "old"},
        )
        await raw.on_context_change(change("s", "step", "k", "new", "t", 2))
        assert not await raw.swap_payload(item, {name: "rekeyed"})
        assert await raw.get_context_changes("s", "step", "t") == {"k": "new"}
        (item,) = [i async for i in raw.scan_payloads("context")]
        assert await raw.swap_payload(item, {name: "rekeyed"})
        assert await raw.get_context_changes("s", "step", "t") == {"k": "rekeyed"}
        await raw.on_context_change(
            ContextChangeEvent(
                stack_id="s", step_id="step", key="k", op="delete", namespace="t", timestamp=3
            )
        )
        assert not await raw.swap_payload(item, {name: "again"})
        assert await raw.get_context_changes("s", "step", "t") == {}
        assert [i async for i in raw.scan_payloads("context")] == []


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", KINDS)
async def test_rekeying_context_streams_under_concurrent_changes_loses_nothing(kind: str) -> None:
    """Rotations while runs stream changes to the same fields: each rewrite of the rekey
    is a compare-and-set on the value it read, so no change streamed meanwhile is lost."""
    settings = Settings(master_key=f"base64:{new_key()}")
    stacks, fields, rounds = 3, 3, 12
    async with any_backend(kind, checkpoint_ttl_ms=None) as backend:
        setup = piped(backend, settings)
        last: dict[tuple[str, str], Any] = {}
        for n in range(stacks):
            for f in range(fields):
                value = {"round": -1, "secret": SECRET}
                await setup.on_context_change(change(f"s{n}", "step", f"k{f}", value, "t"))
                last[(f"s{n}", f"k{f}")] = value

        async def streamer(n: int) -> None:
            mine = piped(backend, settings)
            provider = mine.codecs.sealer.keys
            assert isinstance(provider, EnvelopeKeyProvider)
            provider.refresh_s = 0.05
            for r in range(rounds):
                for f in range(fields):
                    value = {"round": r, "secret": SECRET}
                    await mine.on_context_change(change(f"s{n}", "step", f"k{f}", value, "t", r))
                    last[(f"s{n}", f"k{f}")] = value
                await asyncio.sleep(0.002)

        async def rotations() -> list[Any]:
            reports = []
            for _ in range(3):
                rotator = siglo.Backend(name=backend.name, url=backend.url, adapter=setup)
                reports.append(await rekey(rotator, rotate=True))
                await asyncio.sleep(0.005)
            return reports

        results = await asyncio.gather(*(streamer(n) for n in range(stacks)), rotations())
        assert len({tuple(r.rotated.values()) for r in results[-1]}) == 3
        rotator = siglo.Backend(name=backend.name, url=backend.url, adapter=setup)
        for _ in range(3):  # what changed under a rewrite is finished by a next run
            final = await rekey(rotator)
            if not final.payloads["context"].left:
                break
        counts = final.payloads["context"]
        assert counts.left == 0 and counts.unreadable == 0, counts
        assert counts.rekeyed + counts.current == stacks * fields
        reader = piped(backend, settings)
        for n in range(stacks):
            found = await reader.get_context_changes(f"s{n}", "step", "t")
            assert found == {f"k{f}": last[(f"s{n}", f"k{f}")] for f in range(fields)}
        current = results[-1][-1].rotated["t"]
        for n in range(stacks):
            for value in (
                await backend.raw_adapter.get_context_changes(f"s{n}", "step", "t")
            ).values():
                assert value[SEALED_KEY].split(".")[2] == current


@pytest.mark.rule("manager.redaction.stored")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_rekey_redacts_every_kind_of_record_it_rewrites(kind: str, tmp_path: Path) -> None:
    """With redact_fields set, siglo rekey stores what it rewrites as the pipeline stores
    a new write: the checkpoints it re-saves, and the stand-alone wait records, cached
    steps, context streams and idempotency results it re-seals alike."""
    key = new_key()
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        clear = backend.raw_adapter
        card = {"card": SECRET, "keep": 1}
        await clear.save_checkpoint(
            Checkpoint(
                stack_id="plain", namespace="t1", revision=1, timestamp=5, contexts={"pay": card}
            ),
            expected_revision=0,
        )
        await clear.save_wait_record(
            WaitRecord(
                correlation_key="w1",
                stack_id="plain",
                namespace="t1",
                metadata=card,
                event_payload=card,
            )
        )
        await clear.set_cached_step("charge", card, 600_000, namespace="t1")
        await clear.on_context_change(change("plain", "pay", "card", SECRET, "t1"))
        await clear.on_context_change(change("plain", "pay", "nested", card, "t1"))
        assert backend.idempotency is not None
        await backend.idempotency.claim("pay-1")
        await backend.idempotency.complete("pay-1", card)
        env = {"SIGLO_ENCRYPTION_KEYS": f"k1={key}", "SIGLO_REDACT_FIELDS": "card"}
        done = run_siglo(tmp_path, "rekey", backend.url, env=env)
        assert done.returncode == 0, done.stderr.decode()
        redacted = {"card": "[REDACTED]", "keep": 1}
        # Read back with the key and no redaction of its own: what is stored.
        reader = piped(backend, Settings(encryption_keys={"k1": key}, require_encryption=True))
        found = await reader.get_checkpoint("plain", "t1", fallback=False)
        assert found is not None and found.contexts["pay"] == redacted
        wait = await reader.get_wait_record("w1", namespace="t1")
        assert wait is not None and wait.event_payload == redacted and wait.metadata == redacted
        assert await reader.get_cached_step("charge", namespace="t1") == redacted
        _, results = pipeline_parts(
            backend.raw_adapter,
            backend.idempotency,
            Pipeline(Settings(encryption_keys={"k1": key}, require_encryption=True)),
        )
        assert results is not None and await results.get_result("pay-1") == redacted
        # The stream: a set of a redacted key stores the marker whole, as a new set does.
        assert b"rekeyed 2 context-change stream value(s)" in done.stdout
        assert await reader.get_context_changes("plain", "pay", "t1") == {
            "card": "[REDACTED]",
            "nested": redacted,
        }


async def test_a_backend_that_does_not_list_its_streams_is_never_asked_to() -> None:
    """A third party's backend with payload_scan written before streams were listed: its
    walk is never called for "context" (it would take it for another kind); the rekey
    names the kind it left."""

    class OldScan(MemoryStorageAdapter):
        payload_kinds = frozenset({"wait", "step"})

    raw = OldScan()
    settings = Settings(encryption_keys={"k1": new_key()})
    adapter, _ = pipeline_parts(raw, None, Pipeline(settings))
    await adapter.set_cached_step("k", {"b": SECRET}, 600_000)
    await adapter.on_context_change(change("s", "step", "k", SECRET, None))
    with pytest.raises(CapabilityNotSupportedError, match="context-change streams"):
        raw.scan_payloads("context")
    (item,) = [i async for i in raw.scan_payloads("step")]
    forged = StoredPayload("context", "s", None, {'["step","k"]': 1}, item.token)
    with pytest.raises(CapabilityNotSupportedError):
        await raw.swap_payload(forged, {'["step","k"]': 2})
    report = await rekey(siglo.Backend(name="third-party", url="memory://", adapter=adapter))
    assert "context" not in report.payloads
    assert "does not list its context-change streams" in report.skipped["context"]
    assert report.payloads["step"].current == 1


def test_a_redis_context_key_reads_back_and_no_other_key_passes_for_one() -> None:
    """What siglo rekey reads a Redis context hash's namespace, stack and step from."""
    keys = KeySpace("p:")
    for ns in (None, "t", "a:b", "%x", "context", "wait"):
        for stack in ("s", "a:b", "5%", "context:x"):
            for step in ("pay", "a:b", "context:z"):
                assert keys.context_of(keys.context(stack, step, ns)) == (ns, stack, step)
    for other in (
        keys.checkpoint("context:a:b"),
        keys.wait("context:a:b"),
        keys.checkpoint("context:x", "ns"),
        keys.wait("context:a:b", "t"),
        "q:context:a:b",
    ):
        assert keys.context_of(other) is None, other


async def test_a_save_sealed_under_an_erased_key_meanwhile_is_erased_with_the_rest(
    tmp_path: Path,
) -> None:
    """Another process that read the namespace's key just before ``siglo erase`` keeps
    sealing with it until its key cache expires: what it saves then, under a key that no
    longer exists, would be an acknowledged save nobody can read. The erasure waits out
    that cache before it deletes, so such a save goes with the rest, and the writer's
    next save, past its cache, gets a new key and reads back."""
    url = f"sqlite:///{tmp_path / 'erased.db'}"
    settings = Settings(master_key=f"base64:{new_key()}")
    async with (
        siglo.connect(url, settings=settings) as writer,
        siglo.connect(url, settings=settings) as eraser,
    ):
        manager = siglo.StorageManager(writer)
        first = manager.create_stack("before", namespace="gone")
        first.set("a", "v", 1)
        await first.save()  # the writer's key cache now holds the namespace's key
        erasing = asyncio.create_task(erase(eraser, "gone"))
        await asyncio.sleep(1.0)  # the keys are destroyed by now; the deletes not yet
        assert not erasing.done()
        meanwhile = manager.create_stack("meanwhile", namespace="gone")
        meanwhile.set("a", "v", 2)
        await meanwhile.save()  # acknowledged, sealed under the destroyed key
        report = await erasing
        assert report.deleted == 2, report
        assert (await writer.adapter.list_checkpoints(namespace="gone")).items == []
        after = manager.create_stack("after", namespace="gone")
        after.set("a", "v", 3)
        await after.save()
        resumed = await siglo.StorageManager(writer).resume("after", namespace="gone")
        assert resumed is not None and resumed.context("a") == {"v": 3}


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_run_executing_a_step_is_left_to_it_and_rekeyed_once_it_waits(
    kind: str,
) -> None:
    """A rekey re-saved the checkpoint of a run executing a step (its workflow lock
    held) at the next revision: the run's next checkpoint was refused, the run failed,
    and a worker ran its finished step again (a black-box auditor, ``siglo rekey``
    under a web app's traffic). The rekey now takes each stack's workflow lock: a run
    that holds it is left to it (counted, exit status 3 from the CLI), and a run that
    waits is rekeyed, its delivery then going on from the rekeyed checkpoint."""
    from siglo import Step, WorkflowSuspended, flow, wait_for_event

    old, new = new_key(), new_key()
    app = Settings(encryption_keys={"k1": old})
    rotated = Settings(encryption_keys={"k1": old, "k2": new}, encryption_key_id="k2")
    paying = asyncio.Event()
    paid = asyncio.Event()
    charges: list[Any] = []

    async def pay(order: Any) -> Any:
        charges.append(order)
        paying.set()
        await paid.wait()
        return {"paid": order, "card": SECRET}

    async def approve(state: Any) -> Any:
        return {**state, "by": (await wait_for_event("approve:o1", timeout_ms=60_000))["by"]}

    orders = flow(Step.create("pay", pay), Step.create("approve", approve), name="rekey-orders")
    async with (
        shared_store(kind, checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url, settings=app) as backend,
        siglo.connect(store.url, settings=rotated) as rekeying,
    ):
        manager = siglo.StorageManager(backend, settings=app)
        run = asyncio.create_task(orders.run(7, manager=manager, stack_id="o1", namespace="t"))
        await paying.wait()
        during = await rekey(rekeying)
        assert (during.running, during.rekeyed, during.left) == (1, 0, 0)
        paid.set()
        with pytest.raises(WorkflowSuspended):
            await run  # its checkpoint after "pay" was not refused
        assert charges == [7]
        stored = await backend.raw_adapter.get_checkpoint("o1", "t", fallback=False)
        assert stored is not None and key_ids(stored) == {"k1"}

        waiting = await rekey(rekeying)
        assert (waiting.running, waiting.rekeyed) == (0, 1)
        stored = await backend.raw_adapter.get_checkpoint("o1", "t", fallback=False)
        assert stored is not None and key_ids(stored) == {"k2"}
        resumed = siglo.StorageManager(rekeying, settings=rotated)
        assert await orders.deliver(
            "approve:o1", {"by": "ada"}, manager=resumed, namespace="t"
        ) == {
            "paid": 7,
            "card": SECRET,
            "by": "ada",
        }
        assert charges == [7]


async def test_siglo_rekey_names_the_runs_it_left_and_exits_3(tmp_path: Path) -> None:
    """The command a user runs: the run executing a step is named and the exit status
    says work is left (docs/encryption.md, rotation)."""
    from siglo import Step, flow

    old, new = new_key(), new_key()
    app = Settings(encryption_keys={"k1": old})
    paying, paid = asyncio.Event(), asyncio.Event()

    async def pay(order: Any) -> Any:
        paying.set()
        await paid.wait()
        return {"paid": order}

    paying_flow = flow(Step.create("pay", pay), name="rekey-cli-orders")
    async with (
        shared_store("sqlite", checkpoint_ttl_ms=None) as store,
        siglo.connect(store.url, settings=app) as backend,
    ):
        manager = siglo.StorageManager(backend, settings=app)
        run = asyncio.create_task(paying_flow.run(7, manager=manager, stack_id="o2"))
        await paying.wait()
        env = {"SIGLO_ENCRYPTION_KEYS": f"k1={old},k2={new}", "SIGLO_ENCRYPTION_KEY_ID": "k2"}
        during = await asyncio.to_thread(run_siglo, tmp_path, "rekey", store.url, env=env)
        paid.set()
        assert await run == {"paid": 7}
        after = await asyncio.to_thread(run_siglo, tmp_path, "rekey", store.url, env=env)
    assert during.returncode == 3, during.stderr
    assert b"1 checkpoint(s) left to the runs executing them" in during.stdout
    assert after.returncode == 0, after.stderr
    assert b"rekeyed 1 checkpoint(s)" in after.stdout


async def _keyring_changes(url: str, settings: Settings) -> None:
    """Until tenant ``t``'s keyring is rewritten (or removed) by another process."""
    async with siglo.connect(url, settings=settings) as backend:
        with keyring_access():
            first = await backend.raw_adapter.get_checkpoint("t", KEYRING_NAMESPACE, fallback=False)
            assert first is not None
            for _ in range(1_000):
                ring = await backend.raw_adapter.get_checkpoint(
                    "t", KEYRING_NAMESPACE, fallback=False
                )
                if ring is None or ring.revision != first.revision:
                    return
                await asyncio.sleep(0.02)
    raise AssertionError("the keyring never changed")


def _started(home: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "siglo", *args],
        cwd=home,
        env=_siglo_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_an_interrupted_erase_says_what_it_left_and_how_to_finish(
    tmp_path: Path, stop: signal.Signals
) -> None:
    """Stopped in its settle, after the keys were destroyed and before the data was
    deleted, ``siglo erase`` ended silently (SIGTERM, SIGHUP) or with a bare "Aborted!"
    (Ctrl-C), the tenant's data stored and unreadable (a black-box auditor). It says so
    and how to finish, exits 128 + the signal, and running it again finishes it."""
    url, settings = await _tenant_t_under_a_master_key(tmp_path)
    assert settings.master_key is not None
    env = {"SIGLO_MASTER_KEY": settings.master_key}
    erasing = _started(tmp_path, "erase", url, "-n", "t", "--yes", "--settle-ms", "60000", env=env)
    await _keyring_changes(url, settings)  # the keys' destruction is the first write
    await asyncio.sleep(0.3)
    erasing.send_signal(stop)
    _out, err = erasing.communicate(timeout=60)
    said = err.decode()
    assert erasing.returncode == 128 + stop, (erasing.returncode, said)
    assert f"siglo erase of namespace 't' was interrupted ({stop.name})" in said, said
    assert "run `siglo erase --namespace t` again to finish" in said, said
    again = run_siglo(tmp_path, "erase", url, "-n", "t", "--yes", *NO_SETTLE, env=env)
    assert again.returncode == 0, again.stderr.decode()
    # The keys were destroyed by the first run, not this one (it counted them again).
    assert b"destroyed 0 data key(s), deleted 1 checkpoint(s)" in again.stdout, again.stdout


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
async def test_an_interrupted_rotation_says_to_finish_without_rotate(
    tmp_path: Path, stop: signal.Signals
) -> None:
    """``siglo rekey --rotate`` stopped mid-walk made the new keys current and said
    nothing of it: an operator running the same command again rotated again. It names
    the keys it made and says to finish with ``siglo rekey`` without --rotate."""
    url, settings = await _tenant_t_under_a_master_key(tmp_path)
    assert settings.master_key is not None
    async with siglo.connect(url, settings=settings) as backend:
        manager = siglo.StorageManager(backend)
        for i in range(3000):  # a walk long enough to stop in
            stack = manager.create_stack(f"bulk-{i}", namespace="t")
            stack.set("pay", "card", SECRET)
            await stack.save()
    env = {"SIGLO_MASTER_KEY": settings.master_key}
    rotating = _started(tmp_path, "rekey", url, "--rotate", env=env)
    await _keyring_changes(url, settings)  # the rotation, before the walk
    rotating.send_signal(stop)
    _out, err = rotating.communicate(timeout=60)
    said = err.decode()
    assert rotating.returncode == 128 + stop, (rotating.returncode, said)
    assert f"siglo rekey --rotate was interrupted ({stop.name})" in said, said
    assert "finish with `siglo rekey` without --rotate" in said, said
