"""The blind index (docs/encryption.md, siglo.blind): equality filters on encrypted
metadata without the store seeing the values, on SQLite, PostgreSQL and Redis; the same
filter on metadata stored in clear; ``siglo ls --where``."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from ops_support import DURABLE_KINDS, shared_store
from raw_storage import raw_bytes

import siglo
from siglo.blind import INDEX_KEY
from siglo.checkpoint import Checkpoint
from siglo.config import CONFIG_ENV, ENVIRONMENT, Settings
from siglo.errors import InvalidArgumentError
from siglo.pipeline import Pipeline, PipelineAdapter, pipeline_parts

ROOT = Path(__file__).resolve().parents[2]


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def piped(backend: siglo.Backend, settings: Settings) -> PipelineAdapter:
    adapter, _ = pipeline_parts(backend.raw_adapter, backend.idempotency, Pipeline(settings))
    assert isinstance(adapter, PipelineAdapter)
    return adapter


ROWS = [
    ("c1", "t1", "running", {"customer": "acme-SECRET", "n": 1}),
    ("c2", "t1", "running", {"customer": "globex-SECRET", "n": 2}),
    ("c3", "t2", "running", {"customer": "acme-SECRET", "n": 3}),
    ("c4", "t1", "completed", {"customer": "acme-SECRET", "n": 4}),
    ("c5", "t1", "running", {"n": 5}),
]


async def _fill(adapter: Any) -> None:
    for ident, ns, status, metadata in ROWS:
        await adapter.save_checkpoint(
            Checkpoint(
                stack_id=ident,
                namespace=ns,
                status=status,
                revision=1,
                timestamp=1,
                contexts={"s": {"x": 1}},
                metadata=metadata,
            ),
            expected_revision=0,
        )


async def _ids(adapter: Any, **query: Any) -> list[str]:
    out: list[str] = []
    cursor = None
    while True:
        page = await adapter.list_checkpoints(cursor=cursor, **query)
        out.extend(s.stack_id for s in page.items)
        if page.next_cursor is None:
            return sorted(out)
        cursor = page.next_cursor


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_encrypted_metadata_is_filtered_by_its_blind_index(kind: str) -> None:
    first = new_key()
    settings = Settings(encryption_keys={"k1": first}, blind_index_fields=["customer"])
    async with shared_store(kind) as backend:
        adapter = piped(backend, settings)
        await _fill(adapter)
        assert b"acme-SECRET" not in await raw_bytes(kind, backend)
        acme = {"customer": "acme-SECRET"}
        assert await _ids(adapter, metadata=acme) == ["c1", "c3", "c4"]
        assert await _ids(adapter, metadata=acme, namespace="t1") == ["c1", "c4"]
        assert await _ids(adapter, metadata=acme, status="running") == ["c1", "c3"]
        assert await _ids(adapter, metadata=acme, limit=1) == ["c1", "c3", "c4"]
        assert await _ids(adapter, metadata={"customer": "initech"}) == []
        # The store sees which stacks share a value, per namespace only.
        raw = backend.raw_adapter
        one = await raw.get_checkpoint("c1", "t1", fallback=False)
        four = await raw.get_checkpoint("c4", "t1", fallback=False)
        three = await raw.get_checkpoint("c3", "t2", fallback=False)
        assert one is not None and four is not None and three is not None
        assert one.metadata[INDEX_KEY] == four.metadata[INDEX_KEY]  # type: ignore[index]
        assert one.metadata[INDEX_KEY] != three.metadata[INDEX_KEY]  # type: ignore[index]
        # The application's metadata reads back as it was saved.
        found = await adapter.get_checkpoint("c1", "t1", fallback=False)
        assert found is not None and found.metadata == {"customer": "acme-SECRET", "n": 1}
        # Only indexed fields can be filtered on without decrypting.
        with pytest.raises(InvalidArgumentError, match="'n' are encrypted and not in blind"):
            await adapter.list_checkpoints(metadata={"n": 1})
        # A new current key keeps the tokens (the index is keyed by the first key).
        rotated = piped(
            backend,
            settings.replace(encryption_keys={"k1": first, "k2": new_key()}),
        )
        await rotated.save_checkpoint(
            Checkpoint(stack_id="c6", namespace="t1", revision=1, timestamp=1, metadata=acme),
            expected_revision=0,
        )
        assert await _ids(rotated, metadata=acme, namespace="t1") == ["c1", "c4", "c6"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_the_same_filter_works_on_metadata_in_clear(kind: str) -> None:
    async with (
        shared_store("sqlite")
        if kind == "sqlite"
        else siglo.connect("memory://", settings=Settings()) as backend
    ):
        adapter = piped(backend, Settings(redact_fields=["cvv"]))
        await _fill(adapter)
        assert await _ids(adapter, metadata={"customer": "acme-SECRET"}) == ["c1", "c3", "c4"]
        # Equality is JSON equality: 1 is not "1", true is not 1.
        assert await _ids(adapter, metadata={"n": 2}) == ["c2"]
        assert await _ids(adapter, metadata={"n": "2"}) == []
        # A backend without a pipeline (no settings) filters the same way.
        assert await _ids(backend.raw_adapter, metadata={"customer": "acme-SECRET"}) == [
            "c1",
            "c3",
            "c4",
        ]
        with pytest.raises(InvalidArgumentError, match="number, boolean or null"):
            await backend.raw_adapter.list_checkpoints(metadata={"customer": ["x"]})
        # A field the settings redact is not filtered on: stored "[REDACTED]", or its
        # value where stored before it was redacted, a filter would answer guesses about
        # what every printing path hides (a black-box auditor, `siglo ls --where`).
        with pytest.raises(InvalidArgumentError, match="'cvv' are redacted by the settings"):
            await adapter.list_checkpoints(metadata={"cvv": "123", "n": 2})


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_envelope_keys_index_per_namespace(kind: str) -> None:
    settings = Settings(master_key=f"base64:{new_key()}", blind_index_fields=["customer"])
    async with shared_store(kind, checkpoint_ttl_ms=None) as backend:
        adapter = piped(backend, settings)
        await _fill(adapter)
        other = piped(backend, settings)  # another process
        assert await _ids(other, metadata={"customer": "acme-SECRET"}) == ["c1", "c3", "c4"]


def test_siglo_ls_where(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ls.db'}"
    env = {k: v for k, v in os.environ.items() if k not in (*ENVIRONMENT, CONFIG_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "backends"), str(ROOT / "contract_tests")]
    )
    env["SIGLO_ENCRYPTION_KEYS"] = f"k1={new_key()}"
    env["SIGLO_BLIND_INDEX_FIELDS"] = "customer"
    settings = Settings(
        encryption_keys={"k1": env["SIGLO_ENCRYPTION_KEYS"][3:]}, blind_index_fields=["customer"]
    )

    async def fill() -> None:
        async with siglo.connect(url, settings=settings) as backend:
            await _fill(backend.adapter)

    import asyncio

    asyncio.run(fill())
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "ls", url, "--where", "customer=acme-SECRET", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    items = orjson.loads(done.stdout)["items"]
    assert sorted(i["stackId"] for i in items) == ["c1", "c3", "c4"]
    bad = subprocess.run(
        [sys.executable, "-m", "siglo", "ls", url, "--where", "nofield"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert bad.returncode != 0 and b"is not FIELD=VALUE" in bad.stderr
    # A shell without the keys cannot compare sealed metadata: each stack is named as
    # left out, exit status 1 — not an empty listing that says no stack matches.
    keyless = {k: v for k, v in env.items() if k != "SIGLO_ENCRYPTION_KEYS"}
    blind = subprocess.run(
        [sys.executable, "-m", "siglo", "ls", url, "--where", "customer=acme-SECRET"],
        cwd=tmp_path,
        env=keyless,
        capture_output=True,
        timeout=120,
    )
    assert blind.returncode == 1, blind.stdout + blind.stderr
    assert blind.stderr.count(b"Left out: DecryptionError") == 5, blind.stderr
    assert b"holds no keys" in blind.stderr and b"0 stack(s)" in blind.stdout


async def test_rekey_adds_the_tokens_of_a_field_indexed_later() -> None:
    from siglo.rekeying import rekey

    key = new_key()
    async with siglo.connect("memory://", settings=Settings()) as backend:
        await _fill(piped(backend, Settings(encryption_keys={"k1": key})))
        later = Settings(encryption_keys={"k1": key}, blind_index_fields=["customer"])
        adapter = piped(backend, later)
        assert await _ids(adapter, metadata={"customer": "acme-SECRET"}) == []
        report = await rekey(siglo.Backend(name="memory", url="memory://", adapter=adapter))
        assert (report.rekeyed, report.current) == (4, 1)  # c5 has no customer
        assert await _ids(adapter, metadata={"customer": "acme-SECRET"}) == ["c1", "c3", "c4"]


async def test_through_keys_an_indexed_field_matches_by_its_token_only() -> None:
    """A checkpoint stored in clear before encryption was turned on is not found by its
    indexed field's value until it is saved again (siglo rekey)."""
    from siglo.rekeying import rekey

    async with siglo.connect("memory://", settings=Settings()) as backend:
        await _fill(backend.raw_adapter)  # in clear
        keyed = Settings(encryption_keys={"k1": new_key()}, blind_index_fields=["customer"])
        adapter = piped(backend, keyed)
        acme = {"customer": "acme-SECRET"}
        assert await _ids(adapter, metadata=acme) == []
        assert await _ids(adapter, metadata=acme, namespace="t1") == []
        await rekey(siglo.Backend(name="memory", url="memory://", adapter=adapter))
        assert await _ids(adapter, metadata=acme) == ["c1", "c3", "c4"]
        assert await _ids(adapter, metadata=acme, namespace="t1") == ["c1", "c4"]
