"""The wheel: built from this tree, installed into a fresh virtualenv, it works.

This is what `pip install siglo` gives a user: the core, the in-memory backend and the
contract suite. Every module's name is its path below a source root (SPEC §1): `siglo/`,
one `siglo_*` package per built-in backend, and `siglo_contract`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("siglo-*.whl")
    return found


@pytest.mark.rule("plugins.discovery")
def test_wheel_holds_only_siglo_named_packages(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    packages = {
        "siglo",
        "siglo_memory",
        "siglo_redis",
        "siglo_sql",
        "siglo_sqlite",
        "siglo_postgres",
        "siglo_contract",
    }
    assert top == packages | {f"{wheel.name.split('-py3')[0]}.dist-info"}
    for package in packages:
        assert f"{package}/py.typed" in names
    assert "siglo_memory/adapter.py" in names
    assert "siglo_contract/__init__.py" in names
    entry_points = (
        zipfile.ZipFile(wheel)
        .read(f"{wheel.name.split('-py3')[0]}.dist-info/entry_points.txt")
        .decode()
    )
    assert "memory = siglo_memory.plugin" in entry_points


@pytest.mark.timeout(600)
@pytest.mark.rule("plugins.discovery")
def test_fresh_venv_install_lists_memory_and_connects(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
    )
    if install.returncode != 0 and "No matching distribution" in install.stderr:
        pytest.skip(f"the package index is unreachable: {install.stderr[-300:]}")
    assert install.returncode == 0, install.stderr
    listing = subprocess.run(
        [str(bin_dir / "siglo"), "backends", "--json"], capture_output=True, text=True, check=True
    )
    rows = {row["plugin"]: row for row in json.loads(listing.stdout)}
    assert rows["memory"]["backends"][0]["capabilities"]
    smoke = (
        "import asyncio, siglo\n"
        "b = siglo.connect('memory://')\n"
        "m = siglo.StorageManager(b, error_mode='strict')\n"
        "m.create_stack('s').set('a', 'k', 1)\n"
        "async def main():\n"
        "    await m.save_checkpoint('s')\n"
        "    print((await m.load_checkpoint('s')).revision)\n"
        "asyncio.run(main())\n"
    )
    ran = subprocess.run(
        [str(python), "-c", smoke], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert ran.stdout.strip() == "1"
