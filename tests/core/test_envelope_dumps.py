"""A dump of a store with envelope keys holds no keyring (docs/encryption.md, "Export and
import"): it imports back into the store it was taken from, and into no other — not even
a new store under the same master key, where `siglo import` refuses it, naming the
namespace without a keyring, and writes nothing."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

import siglo
from siglo.config import CONFIG_ENV, ENVIRONMENT, Settings

ROOT = Path(__file__).resolve().parents[2]


def _siglo(home: Path, *args: str, env: dict[str, str], stdin: bytes | None = None) -> bytes:
    """``python -m siglo ARGS`` with only ``env``'s settings; its output, or the failure
    (a ``CalledProcessError`` carrying stderr)."""
    clean = {k: v for k, v in os.environ.items() if k not in (*ENVIRONMENT, CONFIG_ENV)}
    clean["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-m", "siglo", *args],
        cwd=home,
        env={**clean, **env},
        input=stdin,
        capture_output=True,
        timeout=120,
        check=True,
    )
    return done.stdout


async def test_an_envelope_dump_imports_into_its_own_store_only(tmp_path: Path) -> None:
    master = {"SIGLO_MASTER_KEY": "base64:" + base64.b64encode(os.urandom(32)).decode()}
    source = f"sqlite:///{tmp_path / 'source.db'}"
    other = f"sqlite:///{tmp_path / 'other.db'}"
    settings = Settings(master_key=master["SIGLO_MASTER_KEY"])
    async with siglo.connect(source, settings=settings) as backend:
        stack = siglo.StorageManager(backend).create_stack("order-1", namespace="tenant-a")
        stack.set("pay", "amount", 12)
        await stack.save()
    dump = _siglo(tmp_path, "export", source, env=master)
    _siglo(tmp_path, "migrate", other, env=master)
    with pytest.raises(subprocess.CalledProcessError) as refused:
        _siglo(tmp_path, "import", other, env=master, stdin=dump)
    assert refused.value.returncode == 1
    assert b"'tenant-a' has no keyring in this store" in refused.value.stderr
    async with siglo.connect(other, settings=settings) as backend:
        assert (await backend.adapter.list_checkpoints()).items == []
    # Back into its own store (the run deleted first): imported, and it reads.
    _siglo(tmp_path, "rm", source, "order-1", "-n", "tenant-a", env=master)
    _siglo(tmp_path, "import", source, env=master, stdin=dump)
    async with siglo.connect(source, settings=settings) as backend:
        resumed = await siglo.StorageManager(backend).resume("order-1", namespace="tenant-a")
        assert resumed is not None and resumed.context("pay") == {"amount": 12}
