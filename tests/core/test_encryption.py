"""Encryption at rest (SPEC §12, docs/encryption.md): the codec chain of the pipeline.

Every payload kind round-trips through the chain; the backend holds only sealed values;
a ciphertext copied into another row, field or namespace fails to decrypt; a plaintext
payload is refused under ``require_encryption``; the envelope keys can be erased. The
durable backends are the real servers of this machine (SQLite file, PostgreSQL, Redis).
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo.checkpoint import Checkpoint
from siglo.config import Settings, load_settings
from siglo.errors import (
    DecryptionError,
    EncryptionRequiredError,
    InvalidArgumentError,
    KeyErasedError,
)
from siglo.keys import EnvelopeKeyProvider, LocalMasterKey, SettingsKeyProvider
from siglo.pipeline import Pipeline, pipeline_parts
from siglo.records import ContextChangeEvent, WaitRecord
from siglo.reserved import keyring_access
from siglo.sealing import SEALED_KEY, Location, SealCache, Sealer, is_sealed

SECRET = "sealed-SECRET-51c0"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def keyed(**more: Any) -> Settings:
    return Settings(encryption_keys={"k1": new_key()}, **more)


def piped(backend: siglo.Backend, settings: Settings) -> tuple[Any, Any]:
    """``backend``'s own parts behind the pipeline of ``settings``."""
    return pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))


async def _write_everything(adapter: Any, idempotency: Any, ident: str, ns: str) -> None:
    checkpoint = Checkpoint(
        stack_id=ident,
        namespace=ns,
        revision=1,
        timestamp=1,
        contexts={"pay": {"card": SECRET}, "empty": {}},
        metadata={"who": SECRET, "redactFields": ["cvv"]},
    )
    await adapter.save_checkpoint(checkpoint, expected_revision=0)
    await adapter.save_wait_record(
        WaitRecord(
            correlation_key=f"w:{ident}",
            stack_id=ident,
            namespace=ns,
            event_payload={"p": SECRET},
            metadata={"m": SECRET},
        )
    )
    await adapter.on_context_change(
        ContextChangeEvent(
            stack_id=ident, step_id="pay", key="card", value=SECRET, namespace=ns, timestamp=1
        )
    )
    await adapter.set_cached_step(f"step:{ident}", {"out": SECRET})
    assert await idempotency.claim(f"idem:{ident}") == "claimed"
    await idempotency.complete(f"idem:{ident}", {"receipt": SECRET})


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_every_payload_kind_is_sealed_and_reads_back(kind: str) -> None:
    from raw_storage import raw_bytes

    settings = keyed(compression_min_bytes=64)
    async with shared_store(kind) as backend:
        adapter, idempotency = piped(backend, settings)
        await _write_everything(adapter, idempotency, "s1", "t1")
        stored = await raw_bytes(kind, backend)
        assert SECRET.encode() not in stored
        assert b"$siglo" in stored
        # The routing fields stay in clear: the store can still find, list and expire.
        raw = await backend.raw_adapter.get_checkpoint("s1", "t1", fallback=False)
        assert raw is not None and raw.stack_id == "s1" and raw.revision == 1
        assert raw.metadata is not None and raw.metadata["redactFields"] == ["cvv"]
        assert all(is_sealed(ctx) for ctx in raw.contexts.values())

        back = await adapter.get_checkpoint("s1", "t1", fallback=False)
        assert back is not None
        assert back.contexts == {"pay": {"card": SECRET}, "empty": {}}
        assert back.metadata == {"who": SECRET, "redactFields": ["cvv"]}
        wait = await adapter.get_wait_record("w:s1", namespace="t1")
        assert wait is not None and wait.event_payload == {"p": SECRET}
        assert wait.metadata == {"m": SECRET}
        claimed = await adapter.claim_wait_record(
            "w:s1", "c1", event_payload={"e": SECRET}, namespace="t1"
        )
        assert claimed is not None and claimed.event_payload == {"e": SECRET}
        assert SECRET.encode() not in await raw_bytes(kind, backend)
        assert await adapter.get_context_changes("s1", "pay", "t1") == {"card": SECRET}
        assert await adapter.get_cached_step("step:s1") == {"out": SECRET}
        assert await idempotency.get_result("idem:s1") == {"receipt": SECRET}


async def _copy_context(raw: Any, source: tuple[str, str], target: tuple[str, str]) -> None:
    """Put the stored (sealed) context of ``source`` into the row of ``target``, bytes as
    they are: what someone with write access to the database could do."""
    found = await raw.get_checkpoint(source[0], source[1], fallback=False)
    victim = await raw.get_checkpoint(target[0], target[1], fallback=False)
    assert found is not None and victim is not None
    moved = victim.replace(revision=victim.revision + 1, contexts=dict(found.contexts))
    await raw.save_checkpoint(moved, expected_revision=victim.revision)


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_ciphertext_moved_to_another_row_or_namespace_does_not_decrypt(
    kind: str,
) -> None:
    settings = keyed()
    async with shared_store(kind) as backend:
        adapter, _ = piped(backend, settings)
        for ident, ns in (("a", "t1"), ("b", "t1"), ("a", "t2")):
            stack = Checkpoint(
                stack_id=ident,
                namespace=ns,
                revision=1,
                timestamp=1,
                contexts={"pay": {"card": f"{SECRET}-{ident}-{ns}"}},
            )
            await adapter.save_checkpoint(stack, expected_revision=0)
        raw = backend.raw_adapter
        await _copy_context(raw, ("a", "t1"), ("b", "t1"))  # another row
        with pytest.raises(DecryptionError, match=r"checkpoint 'b'.*'t1'.*contexts\.pay"):
            await adapter.get_checkpoint("b", "t1", fallback=False)
        await _copy_context(raw, ("a", "t1"), ("a", "t2"))  # another tenant
        with pytest.raises(DecryptionError, match="another record, field or namespace"):
            await adapter.get_checkpoint("a", "t2", fallback=False)
        # The source row itself still reads.
        source = await adapter.get_checkpoint("a", "t1", fallback=False)
        assert source is not None and source.contexts["pay"]["card"] == f"{SECRET}-a-t1"
        # Another field of the same row: the metadata's ciphertext as a context.
        await adapter.save_checkpoint(
            Checkpoint(stack_id="c", namespace="t1", revision=1, timestamp=1, metadata={"x": 1}),
            expected_revision=0,
        )
        stored = await raw.get_checkpoint("c", "t1", fallback=False)
        assert stored is not None and stored.metadata is not None
        swapped = stored.replace(
            revision=2, contexts={"pay": {SEALED_KEY: stored.metadata[SEALED_KEY]}}
        )
        await raw.save_checkpoint(swapped, expected_revision=1)
        with pytest.raises(DecryptionError):
            await adapter.get_checkpoint("c", "t1", fallback=False)


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_require_encryption_refuses_plaintext_rows(kind: str) -> None:
    async with shared_store(kind) as backend:
        clear = backend.raw_adapter
        await clear.save_checkpoint(
            Checkpoint(
                stack_id="old",
                namespace="t1",
                revision=1,
                timestamp=1,
                contexts={"pay": {"card": SECRET}},
            ),
            expected_revision=0,
        )
        await clear.set_cached_step("plain-step", {"out": SECRET})
        lenient, _ = piped(backend, keyed())
        found = await lenient.get_checkpoint("old", "t1", fallback=False)
        assert found is not None and found.contexts["pay"]["card"] == SECRET
        strict, _ = piped(backend, keyed(require_encryption=True))
        with pytest.raises(EncryptionRequiredError, match=r"checkpoint 'old'.*in clear"):
            await strict.get_checkpoint("old", "t1", fallback=False)
        with pytest.raises(EncryptionRequiredError, match="step 'plain-step'"):
            await strict.get_cached_step("plain-step")
        # What it writes, it reads.
        await strict.save_checkpoint(
            Checkpoint(
                stack_id="new",
                namespace="t1",
                revision=1,
                timestamp=1,
                contexts={"pay": {"card": SECRET}},
                metadata={"m": 1},
            ),
            expected_revision=0,
        )
        again = await strict.get_checkpoint("new", "t1", fallback=False)
        assert again is not None and again.contexts["pay"]["card"] == SECRET


async def test_a_compressed_only_payload_is_refused_under_require_encryption() -> None:
    async with siglo.connect("memory://", settings=Settings()) as backend:
        squeezed, _ = piped(backend, Settings(compression_min_bytes=0))
        await squeezed.set_cached_step("z", {"big": "x" * 500})
        assert is_sealed(await backend.raw_adapter.get_cached_step("z"))
        assert await squeezed.get_cached_step("z") == {"big": "x" * 500}
        strict, _ = piped(backend, keyed(require_encryption=True))
        with pytest.raises(EncryptionRequiredError, match="without encryption"):
            await strict.get_cached_step("z")


async def test_a_rotated_settings_key_reads_the_old_and_writes_the_new() -> None:
    old, new = new_key(), new_key()
    async with siglo.connect("memory://", settings=Settings()) as backend:
        first, _ = piped(backend, Settings(encryption_keys={"k1": old}))
        await first.set_cached_step("s", 1)
        both, _ = piped(backend, Settings(encryption_keys={"k1": old, "k2": new}))
        assert await both.get_cached_step("s") == 1
        await both.set_cached_step("t", 2)
        stored = await backend.raw_adapter.get_cached_step("t")
        assert stored[SEALED_KEY].split(".")[2] == "k2"
        only_new, _ = piped(backend, Settings(encryption_keys={"k2": new}))
        with pytest.raises(DecryptionError, match="key 'k1', which the settings do not hold"):
            await only_new.get_cached_step("s")


def test_settings_read_keys_from_the_environment_and_never_show_them() -> None:
    key = new_key()
    settings = load_settings(
        environ={
            "SIGLO_ENCRYPTION_KEYS": f"k1={key}, k2={new_key()}",
            "SIGLO_ENCRYPTION_KEY_ID": "k1",
            "SIGLO_REQUIRE_ENCRYPTION": "true",
            "SIGLO_COMPRESSION_MIN_BYTES": "1024",
        }
    )
    assert settings.encryption_key_id == "k1"
    assert settings.require_encryption is True
    assert settings.compression_min_bytes == 1024
    assert key not in repr(settings)
    assert settings.describe()["encryption_keys"] == {"k1": "***", "k2": "***"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"encryption_keys": {"k1": "not base64!"}}, "'k1' of encryption_keys .* not base64"),
        ({"encryption_keys": {"k1": base64.b64encode(b"short").decode()}}, "5 bytes"),
        # A refused id is not quoted (it may be a key in the id's place): its length is.
        (
            {"encryption_keys": {"bad.id": new_key()}},
            r"a key id in encryption_keys .*\(6 characters",
        ),
        ({"encryption_keys": {"k1": new_key()}, "encryption_key_id": "k9"}, "'k9' is not one"),
        ({"master_key": "nocolon"}, "master_key must be"),
        ({"require_encryption": "yes"}, "require_encryption must be true or false"),
        ({"compression_min_bytes": -1}, "compression_min_bytes must be"),
        ({"require_encryption": True}, "require_encryption needs a key to read with"),
    ],
)
def test_bad_encryption_settings_are_refused_naming_the_setting(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Settings(**changes)


# -- envelope keys -------------------------------------------------------------------------


def master() -> Settings:
    return Settings(master_key=f"base64:{new_key()}")


async def _cards_sealed(
    adapter: Any, backend: siglo.Backend, namespaces: tuple[str | None, ...]
) -> list[str]:
    """Stack ``s`` saved with a card in each of ``namespaces`` through ``adapter``; the
    id of the data key each was sealed with, as stored."""
    kids = []
    for ns in namespaces:
        await adapter.save_checkpoint(
            Checkpoint(
                stack_id="s",
                namespace=ns,
                revision=1,
                timestamp=1,
                contexts={"pay": {"card": SECRET}},
            ),
            expected_revision=0,
        )
        stored = await backend.raw_adapter.get_checkpoint("s", ns, fallback=False)
        assert stored is not None
        kids.append(stored.contexts["pay"][SEALED_KEY].split(".")[2])
    return kids


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_envelope_keys_are_per_namespace_and_erasable(kind: str) -> None:
    settings = master()
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        adapter, _ = piped(backend, settings)
        kids = await _cards_sealed(adapter, backend, ("t1", "t2"))
        assert kids[0] != kids[1]  # a data key of each tenant's own
        # A second process (its own provider, same master key) reads what the first wrote.
        other, _ = piped(backend, settings)
        found = await other.get_checkpoint("s", "t1", fallback=False)
        assert found is not None and found.contexts["pay"]["card"] == SECRET

        provider = adapter.codecs.sealer.keys
        assert isinstance(provider, EnvelopeKeyProvider)
        await provider.erase("t1")
        with pytest.raises(KeyErasedError, match="namespace 't1' was erased"):
            await adapter.get_checkpoint("s", "t1", fallback=False)
        other.codecs.sealer.keys.forget()
        with pytest.raises(KeyErasedError):
            await other.get_checkpoint("s", "t1", fallback=False)
        survivor = await other.get_checkpoint("s", "t2", fallback=False)
        assert survivor is not None and survivor.contexts["pay"]["card"] == SECRET


@pytest.mark.parametrize("spelt", ["\x1fnone", "\x1f\x1fnone"])
async def test_a_namespace_spelt_like_none_has_keys_of_its_own(spelt: str) -> None:
    """Ids are any text, so ``"\x1fnone"`` — the name siglo kept the keys of payloads
    without a namespace under — is a legal namespace: it shared their data key and blind
    index, and erasing it destroyed every payload without a namespace (and every
    idempotency result) (a black-box auditor). Each has keys of its own now."""
    async with siglo.connect("memory://", settings=Settings()) as backend:
        settings = master()
        adapter, _ = piped(backend, settings)
        kids = await _cards_sealed(adapter, backend, (None, spelt))
        assert kids[0] != kids[1]
        provider = adapter.codecs.sealer.keys
        assert isinstance(provider, EnvelopeKeyProvider)
        assert await provider.index_key(None) != await provider.index_key(spelt)
        await provider.erase(spelt)
        with pytest.raises(KeyErasedError):
            await adapter.get_checkpoint("s", spelt, fallback=False)
        kept = await adapter.get_checkpoint("s", None, fallback=False)
        assert kept is not None and kept.contexts["pay"]["card"] == SECRET
        # Keys in the settings: derived apart too.
        keyed = SettingsKeyProvider({"k1": bytes(32)}, "k1")
        assert (await keyed.current_key(None))[1] != (await keyed.current_key(spelt))[1]
        assert await keyed.index_key(None) != await keyed.index_key(spelt)


async def test_a_master_key_that_did_not_wrap_the_keyring_is_refused() -> None:
    async with siglo.connect("memory://", settings=Settings()) as backend:
        adapter, _ = piped(backend, master())
        await adapter.set_cached_step("s", 1)
        stranger, _ = piped(backend, master())
        with pytest.raises(DecryptionError, match="does not unwrap with this master key"):
            await stranger.get_cached_step("s")


async def test_a_kms_plugin_supplies_the_master_key() -> None:
    from siglo.plugins import get_registry, hookimpl

    wrapped: list[bytes] = []

    class Kms:
        key_id = "kms"

        def __init__(self) -> None:
            self._local = LocalMasterKey(base64.b64decode(new_key()))

        async def wrap(self, data_key: bytes, context: bytes) -> bytes:
            wrapped.append(context)
            return await self._local.wrap(data_key, context)

        async def unwrap(self, blob: bytes, context: bytes) -> bytes:
            return await self._local.unwrap(blob, context)

    kms = Kms()

    class Plugin:
        @hookimpl
        def siglo_master_key(self, scheme: str, reference: str) -> Any:
            return kms if scheme == "testkms" and reference == "key/1" else None

    registry = get_registry()
    registry.register(Plugin(), "test-kms")
    try:
        async with siglo.connect("memory://", settings=Settings()) as backend:
            adapter, _ = piped(backend, Settings(master_key="testkms:key/1"))
            await adapter.set_cached_step("s", {"v": SECRET})
            assert await adapter.get_cached_step("s") == {"v": SECRET}
            assert wrapped, "the plugin's master key wrapped the data key"
        with pytest.raises(InvalidArgumentError, match="no installed plugin supplies"):
            async with siglo.connect("memory://", settings=Settings()) as backend:
                piped(backend, Settings(master_key="otherkms:x"))
    finally:
        registry.unregister("test-kms")


def test_two_plugins_answering_one_master_key_scheme_are_refused() -> None:
    """pluggy took the last plugin registered that answered ``siglo_master_key`` for a
    scheme, handing it the reference (credentials in it) and sealing under its key,
    without a word (a black-box auditor). Two answers are refused, naming both."""
    from siglo.errors import PluginError
    from siglo.plugins import get_registry, hookimpl

    handed: list[str] = []

    def kms_plugin(name: str) -> object:
        class Plugin:
            @hookimpl
            def siglo_master_key(self, scheme: str, reference: str) -> Any:
                if scheme != "clashkms":
                    return None
                handed.append(name)
                return LocalMasterKey(base64.b64decode(new_key()))

        return Plugin()

    registry = get_registry()
    registry.register(kms_plugin("first"), "clash-kms-first")
    registry.register(kms_plugin("second"), "clash-kms-second")
    try:
        with pytest.raises(
            PluginError,
            match=r"more than one plugin \('clash-kms-\w+', 'clash-kms-\w+'\)",
        ):
            registry.master_key("clashkms", "alias/prod")
        assert registry.master_key("otherkms", "x") is None
    finally:
        registry.unregister("clash-kms-first")
        registry.unregister("clash-kms-second")
    registry.register(kms_plugin("alone"), "clash-kms-alone")
    try:
        assert registry.master_key("clashkms", "alias/prod") is not None
    finally:
        registry.unregister("clash-kms-alone")


async def test_envelope_keys_refuse_a_backend_that_expires_checkpoints() -> None:
    """The keyrings are checkpoints: under a retention they would expire, and every key
    of a namespace with them."""
    async with siglo.connect("memory://", settings=Settings(), checkpoint_ttl_ms=60_000) as b:
        with pytest.raises(InvalidArgumentError, match="checkpoint_ttl_ms=none"):
            piped(b, master())


async def test_a_decryption_failure_is_never_swallowed_by_the_error_mode() -> None:
    """DecryptionError is not an adapter failure: a best-effort manager raises it instead
    of reading "no checkpoint" and starting the run over on top of the stored one."""
    async with siglo.connect("memory://", settings=Settings()) as backend:
        writer, _ = piped(backend, keyed())
        await writer.save_checkpoint(
            Checkpoint(stack_id="s", revision=1, timestamp=1, contexts={"a": {"b": 1}}),
            expected_revision=0,
        )
        reader, _ = piped(backend, keyed())
        manager = siglo.StorageManager(reader, error_mode="best-effort", settings=Settings())
        with pytest.raises(DecryptionError):
            await manager.load_checkpoint("s")


def test_a_file_may_require_encryption_while_the_keys_come_from_the_environment(
    tmp_path: Any,
) -> None:
    """The keys are secrets, kept out of the settings file: the settings that depend on
    them are checked once every source is applied, not layer by layer."""
    (tmp_path / "siglo.toml").write_text('require_encryption = true\nencryption_key_id = "k2"\n')
    key = new_key()
    settings = load_settings(
        start=tmp_path, environ={"SIGLO_ENCRYPTION_KEYS": f"k1={new_key()},k2={key}"}
    )
    assert settings.require_encryption and settings.encryption_key_id == "k2"
    # Without the keys, the combination is refused, naming the file it came from.
    with pytest.raises(InvalidArgumentError, match=r"'k2' is not one of .*siglo\.toml"):
        load_settings(start=tmp_path, environ={})


async def _nothing() -> None:
    """An action for a workflow lock."""


async def test_keyrings_stay_out_of_listings_and_dumps() -> None:
    from siglo.keys import KEYRING_NAMESPACE
    from siglo.transfer import export_lines, import_lines

    async with siglo.connect("memory://", settings=Settings()) as backend:
        adapter, _ = piped(backend, master())
        await adapter.save_checkpoint(
            Checkpoint(stack_id="s", namespace="t", revision=1, timestamp=1, contexts={"a": {}}),
            expected_revision=0,
        )
        # Left out of a listing of every namespace whatever the connection (keyless too);
        # a listing of theirs by name is the key provider's alone.
        raw = await backend.raw_adapter.list_checkpoints()
        assert [s.namespace for s in raw.items] == ["t"]
        with pytest.raises(InvalidArgumentError, match="keyrings"):
            await backend.raw_adapter.list_checkpoints(namespace=KEYRING_NAMESPACE)
        with keyring_access():
            rings = await backend.raw_adapter.list_checkpoints(namespace=KEYRING_NAMESPACE)
        assert [s.stack_id for s in rings.items] == ["t"]
        listed = await adapter.list_checkpoints()
        assert [s.namespace for s in listed.items] == ["t"]
        lines = [line async for line in export_lines(backend.raw_adapter)]
        assert len(lines) == 3 and KEYRING_NAMESPACE.encode() not in b"".join(
            lines
        )  # header, one checkpoint, trailer
        with pytest.raises(InvalidArgumentError, match="keyrings"):
            await backend.raw_adapter.get_checkpoint("t", KEYRING_NAMESPACE)
        with keyring_access():
            ring = await backend.raw_adapter.get_checkpoint("t", KEYRING_NAMESPACE)
        assert ring is not None
        forged = [lines[0], b'{"kind":"checkpoint","document":' + ring.to_json() + b"}"]
        with pytest.raises(InvalidArgumentError, match="line 2 holds a keyring"):
            await import_lines(adapter, forged)


def _siglo(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m siglo ARGS`` in ``cwd`` with none of this process's ``SIGLO_*``
    settings, only ``env``'s."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIGLO_")}
    clean["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-m", "siglo", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        cwd=cwd,
    )


async def _orders(app: siglo.Backend, stack_id: str, amount: int) -> siglo.StorageManager:
    """A run of ``stack_id`` saved in tenants ``a`` and ``b``."""
    manager = siglo.StorageManager(app)
    for tenant in ("a", "b"):
        stack = manager.create_stack(stack_id, namespace=tenant)
        stack.set("pay", "amount", amount)
        await stack.save()
    return manager


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_keyrings_are_written_by_the_key_provider_alone(kind: str, tmp_path: Path) -> None:
    """A keyring holds a tenant's data keys; deleting it is a crypto-erasure without the
    confirmation ``siglo erase`` asks for. An operator pruning stale running runs from a
    shell without the master key (keyrings are "running", never terminal) must not take
    them: a listing of every namespace leaves them out whatever the settings, and a save
    or a delete of the keyrings' namespace from anywhere but the key provider — the API,
    ``siglo rm``, ``siglo prune -n siglo.keyring`` — is refused and changes nothing; so
    is a read of one by name (``siglo show``) and a record of any other kind written in
    that namespace (a wait, a context change, a cached step, a workflow lock)."""
    from siglo.keys import KEYRING_NAMESPACE

    key = f"base64:{base64.b64encode(os.urandom(32)).decode()}"
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        async with siglo.connect(backend.url, settings=Settings(master_key=key)) as app:
            await _orders(app, "order-1", 12)
        raw = backend.raw_adapter
        with keyring_access():
            rings = await raw.list_checkpoints(namespace=KEYRING_NAMESPACE)
        assert sorted(s.stack_id for s in rings.items) == ["a", "b"]

        def siglo_cli(*args: str) -> subprocess.CompletedProcess[str]:
            return _siglo(tmp_path, *args, SIGLO_URL=backend.url)  # no SIGLO_MASTER_KEY

        await asyncio.sleep(0.05)
        pruned = siglo_cli("prune", "--older-than", "1ms", "--status", "running")
        assert pruned.returncode == 0, pruned.stderr
        assert "deleted 2" in pruned.stdout, pruned.stdout  # the two runs, not the keyrings
        refused = siglo_cli("rm", "a", "--namespace", KEYRING_NAMESPACE)
        assert refused.returncode != 0 and "siglo erase" in refused.stderr, refused.stderr
        named = siglo_cli(
            "prune", "--older-than", "1ms", "--status", "running", "-n", KEYRING_NAMESPACE
        )
        assert named.returncode != 0 and "keyrings" in named.stderr, named.stdout + named.stderr
        # Not listed by name either: no "would delete" a prune then refuses, no keyring
        # shown as a running stack.
        for listing in (
            ("ls", "-n", KEYRING_NAMESPACE),
            ("prune", "--older-than", "1ms", "-n", KEYRING_NAMESPACE, "--dry-run"),
        ):
            shown = siglo_cli(*listing)
            assert shown.returncode != 0, shown.stdout
            assert "keyrings" in shown.stderr and "would delete" not in shown.stdout, shown
        forged = Checkpoint(
            stack_id="a", namespace=KEYRING_NAMESPACE, revision=9, timestamp=1, contexts={}
        )
        with pytest.raises(InvalidArgumentError, match="keyrings"):
            await raw.save_checkpoint(forged)
        with pytest.raises(InvalidArgumentError, match="keyrings"):
            await raw.delete_checkpoint("a", KEYRING_NAMESPACE)
        with pytest.raises(InvalidArgumentError, match="keyrings"):
            await raw.cancel_workflow("a", KEYRING_NAMESPACE)  # the dashboard's cancel
        shown = siglo_cli("show", "a", "--namespace", KEYRING_NAMESPACE)
        assert shown.returncode != 0 and "keyrings" in shown.stderr, shown.stdout + shown.stderr
        assert "wrapped" not in shown.stdout and "keys" not in shown.stdout, shown.stdout
        other_kinds = {
            "a wait record": lambda: raw.save_wait_record(
                WaitRecord(correlation_key="k", stack_id="a", namespace=KEYRING_NAMESPACE)
            ),
            "a created wait record": lambda: raw.create_wait_record(
                WaitRecord(correlation_key="k", stack_id="a", namespace=KEYRING_NAMESPACE)
            ),
            "a context change": lambda: raw.on_context_change(
                ContextChangeEvent(
                    stack_id="a",
                    step_id="s",
                    key="k",
                    value=1,
                    timestamp=1,
                    namespace=KEYRING_NAMESPACE,
                )
            ),
            "a cached step": lambda: raw.set_cached_step("k", 1, namespace=KEYRING_NAMESPACE),
            "a workflow lock": lambda: raw.with_workflow_lock(
                "a", _nothing, namespace=KEYRING_NAMESPACE
            ),
        }
        for what, write in other_kinds.items():
            with pytest.raises(InvalidArgumentError, match="keyrings"):
                await write()
            assert await raw.get_wait_record("k", namespace=KEYRING_NAMESPACE) is None, what
        # Through the encrypting connection too: refused before a data key is minted for
        # the keyrings' own namespace (a keyring nothing could remove).
        async with siglo.connect(backend.url, settings=Settings(master_key=key)) as app:
            with pytest.raises(InvalidArgumentError, match="keyrings"):
                await app.adapter.set_cached_step("k", 1, namespace=KEYRING_NAMESPACE)
            with pytest.raises(InvalidArgumentError, match="keyrings"):
                await app.adapter.save_wait_record(
                    WaitRecord(correlation_key="k", stack_id="a", namespace=KEYRING_NAMESPACE)
                )
        with keyring_access():
            rings_after = await raw.list_checkpoints(namespace=KEYRING_NAMESPACE)
        assert rings_after == rings
        # Every tenant's keys are there: a new run of each encrypts and decrypts.
        async with siglo.connect(backend.url, settings=Settings(master_key=key)) as app:
            manager = await _orders(app, "order-2", 7)
            for tenant in ("a", "b"):
                again = await manager.resume("order-2", namespace=tenant)
                assert again is not None and again.context("pay") == {"amount": 7}


@pytest.mark.parametrize(
    ("hidden", "setting"),
    [
        ("cryptography", "master_key='base64:' + 'A' * 43 + '='"),
        ("cryptography", "encryption_keys={'k1': 'A' * 43 + '='}"),
        ("zstandard", "compression_min_bytes=1024"),
    ],
    ids=["master-key", "encryption-keys", "compression"],
)
def test_a_codec_without_its_package_is_refused_at_connect(
    tmp_path: Path, hidden: str, setting: str
) -> None:
    """Without the ``siglo[encryption]`` extra, settings that ask for encryption (either
    kind of key) or compression are refused by ``siglo.connect``, naming the extra — not
    a storage failure at the first save, which a worker would retry as an outage."""
    script = (
        f"import sys; sys.modules[{hidden!r}] = None\n"
        "import asyncio, siglo\n"
        "from siglo.config import Settings\n"
        "async def main():\n"
        f"    async with siglo.connect('sqlite:///{tmp_path / 'a.db'}', "
        f"settings=Settings({setting})):\n"
        "        pass\n"
        "try:\n"
        "    asyncio.run(main())\n"
        "except siglo.InvalidArgumentError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert f"needs the {hidden} package" in done.stdout, done.stdout + done.stderr
    assert "pip install 'siglo[encryption]" in done.stdout
    # A command says so with a hint to match, not "fix the value named above".
    from siglo.cli.errors import hint_for

    refused = siglo.InvalidArgumentError(done.stdout.removeprefix("refused: ").strip())
    assert hint_for(refused).startswith("install the extra named above")


def test_export_under_require_encryption_stops_at_a_record_stored_in_clear(
    tmp_path: Path,
) -> None:
    """A dump written "as stored" under ``require_encryption`` is taken for a protected
    backup: ``siglo export`` reads each record through the codecs first, as ``show``,
    ``export --decrypt`` and the dashboard do, so a row stored in clear (written before
    encryption was on) stops it naming the stack — no trailer, so no import takes it —
    and the plaintext is not in what it wrote. Once ``siglo rekey`` sealed the row, the
    same export succeeds."""
    import asyncio as _asyncio

    card = "4111-1111-1111-1111"
    url = f"sqlite:///{tmp_path / 'app.db'}"

    async def write_in_clear() -> None:
        async with siglo.connect(url, settings=Settings()) as backend:
            stack = siglo.StorageManager(backend).create_stack("order-1", namespace="t1")
            stack.set("pay", "card", card)
            await stack.save()

    _asyncio.run(write_in_clear())
    key = base64.b64encode(os.urandom(32)).decode()
    config = tmp_path / "siglo.toml"
    config.write_text(
        f'url = "{url}"\nrequire_encryption = true\nencryption_keys = {{ k1 = "{key}" }}\n'
    )

    def siglo_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _siglo(tmp_path, "--config", str(config), *args)

    refused = siglo_cli("export")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "order-1" in refused.stderr and "require_encryption" in refused.stderr
    assert card not in refused.stdout
    assert '"siglo":"end"' not in refused.stdout  # no trailer
    assert siglo_cli("rekey").returncode == 0
    done = siglo_cli("export")
    assert done.returncode == 0, done.stderr
    assert card not in done.stdout and "exported 1 checkpoint(s)" in done.stderr
    assert '"siglo":"end"' in done.stdout.splitlines()[-1]


KEYLESS_CARD = "5555-keyless"


async def _keyless_first(value: Any) -> Any:
    return {"card": KEYLESS_CARD}


async def _keyless_second(value: Any) -> Any:
    from siglo import wait_for_event

    return await wait_for_event("keyless:go", timeout_ms=1)  # due at once


_KEYLESS = siglo.flow(
    siglo.Step.create("first", _keyless_first).cache(ttl_ms=600_000, key=lambda _: "k"),
    siglo.Step.create("second", _keyless_second),
    name="keyless",
)


async def test_a_process_that_offloads_without_the_keys_never_takes_ciphertext_for_data(
    tmp_path: Path,
) -> None:
    """Settings with a blob store and no keys (the offloading layer passes sealed values
    through, for a pipeline above to open): every read that hands a value on — an
    idempotency result, a cached step, a context stream, a wait's payload — is
    ``DecryptionError``, as through a connection with no settings at all."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    blobs = {"blob_url": (tmp_path / "blobs").as_uri(), "offload_min_bytes": 4096}
    keys = {"encryption_keys": {"k1": base64.b64encode(os.urandom(32)).decode()}}
    async with siglo.connect(url, settings=Settings(**blobs, **keys)) as app:
        payments = app.require_idempotency()
        assert await payments.claim("paid") == "claimed"
        await payments.complete("paid", {"card": KEYLESS_CARD})
        await app.adapter.set_cached_step("k", {"card": KEYLESS_CARD})
        await app.adapter.on_context_change(
            ContextChangeEvent(
                stack_id="r1", step_id="step", key="card", value=KEYLESS_CARD, timestamp=1
            )
        )
        await app.adapter.save_wait_record(
            WaitRecord(correlation_key="evt", stack_id="r1", event_payload={"c": KEYLESS_CARD})
        )
    offloading = Settings(**blobs)
    async with siglo.connect(url, settings=offloading) as worker:
        with pytest.raises(DecryptionError, match="'paid'"):
            await worker.require_idempotency().get("paid")
        with pytest.raises(DecryptionError, match="'k'"):
            await worker.adapter.get_cached_step("k")
        with pytest.raises(DecryptionError, match="'r1'"):
            await worker.adapter.get_context_changes("r1", "step")
        with pytest.raises(DecryptionError, match="'evt'"):
            await worker.adapter.get_wait_record("evt")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_process_without_the_keys_never_takes_ciphertext_for_data(kind: str) -> None:
    """A store written with keys, read by a process without them (a worker started
    without the application's settings): loading a run, recovering it, resuming it and
    a cache hit are ``DecryptionError`` naming the record — never the sealed value handed
    on as the run's data (a step run on it, a field saved in clear beside it, a
    "flow version changed" that is not)."""
    from siglo.workflow import Worker

    keys = Settings(encryption_keys={"k1": base64.b64encode(os.urandom(32)).decode()})
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        async with siglo.connect(backend.url, settings=keys) as app:
            with pytest.raises(siglo.WorkflowSuspended):
                await _KEYLESS.run(None, manager=siglo.StorageManager(app), stack_id="r1")
            payments = app.require_idempotency()
            assert await payments.claim("paid") == "claimed"
            await payments.complete("paid", {"card": KEYLESS_CARD})
            assert await payments.get("paid") == {"card": KEYLESS_CARD}  # opened with keys
        async with siglo.connect(backend.url, settings=Settings()) as bare:
            manager = siglo.StorageManager(bare, settings=Settings())
            with pytest.raises(DecryptionError, match="'r1'"):
                await manager.resume("r1")
            with pytest.raises(DecryptionError, match="cached step 'k'"):
                await _KEYLESS.run(None, manager=manager, stack_id="r2")
            stored = await bare.adapter.get_checkpoint("r2")
            assert stored is None or stored.status != "completed"
            # An idempotency result the application completed, read here: refused too.
            with pytest.raises(DecryptionError, match="idempotency result 'paid'"):
                await bare.require_idempotency().get("paid")
            await asyncio.sleep(0.05)
            done = await Worker(manager, [_KEYLESS]).run_once()
            assert done.failures, done  # the due timer of r1: it cannot be read here
            assert all("no key" in f and "version" not in f for f in done.failures), done
        assert KEYLESS_CARD.encode() not in await raw_bytes_of(kind, backend)


async def _wait_for_approval(_: Any) -> Any:
    from siglo import wait_for_event

    return await wait_for_event("keyless:approve", timeout_ms=3_600_000)


_APPROVAL = siglo.flow(siglo.Step.create("approve", _wait_for_approval), name="approval")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_delivery_without_the_keys_stores_nothing(kind: str) -> None:
    """An event delivered by a process without the keys (a webhook handler, the
    dashboard started without the application's settings) to a run stored encrypted is
    refused before its claim: the payload, a scalar or a mapping, is never stored in
    clear beside the run's ciphertext, and the wait stays deliverable with the keys."""
    keys = Settings(encryption_keys={"k1": base64.b64encode(os.urandom(32)).decode()})
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        async with siglo.connect(backend.url, settings=keys) as app:
            with pytest.raises(siglo.WorkflowSuspended):
                await _APPROVAL.run(None, manager=siglo.StorageManager(app), stack_id="a1")
        async with siglo.connect(backend.url, settings=Settings()) as bare:
            manager = siglo.StorageManager(bare, settings=Settings())
            for payload in (KEYLESS_CARD, {"card": KEYLESS_CARD}):
                with pytest.raises(DecryptionError, match="'a1'"):
                    await _APPROVAL.deliver("keyless:approve", payload, manager=manager)
                wait = await bare.raw_adapter.get_wait_record("keyless:approve")
                assert wait is not None and wait.status == "waiting", wait
                assert wait.event_payload is None and wait.claimant_id is None, wait
        assert KEYLESS_CARD.encode() not in await raw_bytes_of(kind, backend)
        async with siglo.connect(backend.url, settings=keys) as app:
            manager = siglo.StorageManager(app)
            assert await _APPROVAL.deliver("keyless:approve", "ok", manager=manager) == "ok"


async def raw_bytes_of(kind: str, backend: siglo.Backend) -> bytes:
    from raw_storage import raw_bytes

    return await raw_bytes(kind, backend)


class _OneKey:
    """A key provider whose one key the test replaces: the same id, other bytes (a
    namespace erased and given a new key, an id reused)."""

    def __init__(self) -> None:
        self.secret = os.urandom(32)

    async def current_key(self, namespace: str | None) -> tuple[str, bytes]:
        return "k1", self.secret

    async def key(self, namespace: str | None, key_id: str) -> bytes:
        return self.secret

    async def index_key(self, namespace: str | None) -> bytes:
        return self.secret


@pytest.mark.rule("pipeline.encryption")
async def test_an_unchanged_context_keeps_its_ciphertext_at_its_location_only() -> None:
    """Sealed again, a context whose plaintext did not change is the same envelope (the
    incremental saves and offloading then see it unchanged); a changed one is a new
    encryption; the same plaintext elsewhere (namespace, stack, step, field) never shares
    one; payloads sealed without ``reuse`` (waits, changes, cached steps) stay fresh."""
    keys = SettingsKeyProvider({"k1": os.urandom(32)})
    sealer = Sealer(keys, compress_min_bytes=64)
    at = Location("t", "s", "checkpoint", "contexts.a")
    for value in ({"n": 1}, {"text": "z" * 500}):  # in clear and compressed
        first = await sealer.seal(value, at, reuse=True)
        assert await sealer.seal(dict(value), at, reuse=True) == first
        assert await sealer.open(first, at) == value
        assert await sealer.seal(value, at) != first
    changed = await sealer.seal({"text": "y" * 500}, at, reuse=True)
    assert changed != first and await sealer.open(changed, at) == {"text": "y" * 500}
    assert await sealer.seal({"text": "y" * 500}, at, reuse=True) == changed
    elsewhere = [
        Location("u", "s", "checkpoint", "contexts.a"),
        Location(None, "s", "checkpoint", "contexts.a"),
        Location("t", "s2", "checkpoint", "contexts.a"),
        Location("t", "s", "checkpoint", "contexts.b"),
        Location("t", "s", "wait", "contexts.a"),
    ]
    sealed = [await sealer.seal({"text": "y" * 500}, w, reuse=True) for w in elsewhere]
    nonces = {v[SEALED_KEY].split(".")[3] for v in [changed, *sealed]}
    assert len(nonces) == len(elsewhere) + 1
    # Through the pipeline: two saves of the same contexts store the same bytes, but for
    # the one that changed; two stacks with the same context do not share a ciphertext.
    async with siglo.connect("memory://", settings=Settings()) as backend:
        adapter, _ = piped(backend, keyed())
        contexts = {"a": {"card": SECRET}, "b": {"n": 1}}
        for stack in ("s1", "s2"):
            cp = Checkpoint(
                stack_id=stack, namespace="t", revision=1, timestamp=1, contexts=contexts
            )
            await adapter.save_checkpoint(cp, expected_revision=0)
        before = await backend.raw_adapter.get_checkpoint("s1", "t", fallback=False)
        other = await backend.raw_adapter.get_checkpoint("s2", "t", fallback=False)
        assert before is not None and other is not None
        assert before.contexts["a"] != other.contexts["a"]
        cp = Checkpoint(
            stack_id="s1", namespace="t", revision=2, timestamp=2,
            contexts={"a": {"card": SECRET}, "b": {"n": 2}},
        )  # fmt: skip
        await adapter.save_checkpoint(cp, expected_revision=1)
        after = await backend.raw_adapter.get_checkpoint("s1", "t", fallback=False)
        assert after is not None and after.contexts["a"] == before.contexts["a"]
        assert after.contexts["b"] != before.contexts["b"]
        assert (await adapter.get_checkpoint("s1", "t", fallback=False)) == cp


@pytest.mark.rule("pipeline.encryption")
async def test_a_new_key_never_reuses_a_ciphertext_of_the_old_one() -> None:
    """A rotation (another key id current) or a key replaced under the same id (an erased
    namespace's new key) seals anew; after that, unchanged contexts keep the new key's
    ciphertext. A process that loaded a context keeps its envelope only while that key
    is current."""
    settings = SettingsKeyProvider({"k1": os.urandom(32), "k2": os.urandom(32)}, "k1")
    sealer = Sealer(settings)
    at = Location("t", "s", "checkpoint", "contexts.a")
    old = await sealer.seal({"n": 1}, at, reuse=True)
    settings.active = "k2"
    new = await sealer.seal({"n": 1}, at, reuse=True)
    assert new != old and new[SEALED_KEY].split(".")[2] == "k2"
    assert await sealer.seal({"n": 1}, at, reuse=True) == new
    # Another process loads what was sealed under k1 and saves it: sealed under k2.
    loader = Sealer(settings)
    assert await loader.open(old, at, reuse=True) == {"n": 1}
    resealed = await loader.seal({"n": 1}, at, reuse=True)
    assert resealed[SEALED_KEY].split(".")[2] == "k2" and resealed != old
    # Loaded under the current key: kept as it was.
    fresh = Sealer(settings)
    assert await fresh.open(new, at, reuse=True) == {"n": 1}
    assert await fresh.seal({"n": 1}, at, reuse=True) == new
    # The same key id with other bytes: sealed anew, under the new bytes.
    one = _OneKey()
    replaced = Sealer(one)
    before = await replaced.seal({"n": 1}, at, reuse=True)
    one.secret = os.urandom(32)
    after = await replaced.seal({"n": 1}, at, reuse=True)
    assert after != before and await replaced.open(after, at) == {"n": 1}
    with pytest.raises(DecryptionError):
        await replaced.open(before, at)


def test_the_seal_cache_is_bounded_by_bytes() -> None:
    """The envelopes kept take at most ``max_bytes`` (plaintext, envelope and a fixed
    cost an entry), the least recently used going first; one larger than the bound is
    not kept."""
    cache = SealCache(max_bytes=4_000)
    where = [Location("t", f"s{i}", "checkpoint", "contexts.a") for i in range(10)]
    for w in where:
        cache.put(w, "v1.e.k1", b"k" * 32, b"p" * 500, "e" * 700)
    assert cache.size <= 4_000 and len(cache) == 2
    assert cache.get(where[0], "v1.e.k1", b"k" * 32, b"p" * 500) is None
    assert cache.get(where[9], "v1.e.k1", b"k" * 32, b"p" * 500) == "e" * 700
    assert cache.get(where[9], "v1.e.k2", b"k" * 32, b"p" * 500) is None
    cache.put(where[9], "v1.e.k1", b"k" * 32, b"p" * 5_000, "e" * 10)
    assert cache.get(where[9], "v1.e.k1", b"k" * 32, b"p" * 500) is None and len(cache) == 1
    assert cache.size == 500 + 700 + 256
    assert Sealer(None).reused.max_bytes == 64 * 1024 * 1024


async def test_the_views_of_a_run_without_its_keys_say_so(tmp_path: Path) -> None:
    """``siglo show`` and the dashboard's run page in a process without the keys a run was
    stored with raise ``DecryptionError`` naming what is sealed, as a load does — never
    the ciphertext printed as the run's contexts, a wait's payload or a streamed value
    (an auditor's finding: both printed ``$siglo: "v1.e.k1…"`` as data)."""
    from siglo.ui import data

    url = f"sqlite:///{tmp_path / 'views.db'}"
    keys = Settings(encryption_keys={"k1": base64.b64encode(os.urandom(32)).decode()})
    async with siglo.connect(url, settings=keys) as app:
        manager = siglo.StorageManager(app, settings=keys)
        stack = manager.create_stack("o-1", namespace="tenant-a")
        stack.set("pay", "note", "secret-note")
        await stack.save()
        await app.adapter.save_wait_record(
            WaitRecord(
                correlation_key="evt",
                stack_id="o-1",
                namespace="tenant-a",
                event_payload={"c": "secret-payload"},
            )
        )
    shown = _siglo(tmp_path, "show", url, "o-1", "-n", "tenant-a")
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "is stored encoded and this connection has no key" in shown.stderr
    assert "$siglo" not in shown.stdout and "v1.e." not in shown.stdout
    async with siglo.connect(url, settings=Settings()) as keyless:
        with pytest.raises(DecryptionError, match="'o-1'"):
            await data.run_detail(keyless.adapter, "o-1", "tenant-a", ())
        # With the checkpoint opened but the wait's payload sealed (keys given to the
        # checkpoint alone are not a case a store has: the check is per value).
        from siglo.sealing import refuse_unopened_run

        wait = await keyless.adapter.get_wait_record("evt", namespace="tenant-a")
        assert wait is not None
        plain = Checkpoint(stack_id="p", revision=1, timestamp=1, contexts={"a": {}})
        with pytest.raises(DecryptionError, match="wait 'evt'"):
            refuse_unopened_run(plain, [wait])
