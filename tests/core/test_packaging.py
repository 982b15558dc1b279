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

# One xdist worker runs this module: each worker running its tests would build the wheel
# in the same source tree at once (setuptools' build/ and egg-info directories), and the
# builds then fail each other.
pytestmark = pytest.mark.xdist_group("packaging")

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """The environment for a fresh venv's processes: no PYTHONPATH (a source tree on it,
    with its build's egg-info, would make pip think siglo is installed already), and
    bytecode written as a default Python writes it: the venvs are installed without
    compiling (``--no-compile``), so with ``PYTHONDONTWRITEBYTECODE`` set every `siglo`
    command there compiled SQLAlchemy, the drivers and siglo from source again."""
    drop = {"PYTHONPATH", "SIGLO_URL", "PYTHONDONTWRITEBYTECODE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


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


def test_wheel_holds_the_dashboards_templates(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for page in ("base", "runs", "run", "attention", "confirm", "message", "tree"):
        assert f"siglo/ui/templates/{page}.html" in names
    assert "siglo/ui/templates/ui.css" in names


@pytest.mark.timeout(900)
@pytest.mark.rule("plugins.discovery")
def test_fresh_venv_install_lists_memory_and_connects(
    installs: dict[str, Path], tmp_path: Path
) -> None:
    bin_dir = installs["core"]  # `pip install siglo`: the wheel alone, in a fresh venv
    python = bin_dir / "python"
    listing = subprocess.run(
        [str(bin_dir / "siglo"), "backends", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    )
    rows = {row["plugin"]: row for row in json.loads(listing.stdout)}
    assert set(rows) == {"memory", "redis", "sqlite", "postgres"}
    assert rows["memory"]["backends"][0]["capabilities"]
    # The whole suite, every rule, against the backend a core install has.
    check = subprocess.run(
        [str(bin_dir / "siglo"), "check", "memory://", "--seed", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "FAIL" not in check.stdout
    # No URL and no SQLite driver: memory://, said (docs/running-the-contract-suite.md).
    default = subprocess.run(
        [str(bin_dir / "siglo"), "check", "--rule", "cache.*", "--examples", "5"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    assert default.returncode == 0, default.stdout + default.stderr
    assert "SQLite's driver is not installed" in default.stderr, default.stderr
    assert "siglo check memory://" in default.stdout, default.stdout
    assert not list(tmp_path.glob("siglo-check*"))  # no SQLite file made
    smoke = (
        "import siglo_contract\n"
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
        [str(python), "-c", smoke],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    assert ran.stdout.strip() == "1"


# -- partial installs: the built wheel in a fresh venv per extra (issue 13) -----------------

EXTRAS: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "redis": frozenset({"redis"}),
    "sqlite": frozenset({"sqlite"}),
    "postgres": frozenset({"postgres"}),
    "all": frozenset({"redis", "sqlite", "postgres"}),
    # The S3 blob store's driver (obstore), no backend's.
    "s3": frozenset(),
}
"""Each install and the backends whose drivers it brings."""

REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")
BACKEND_URLS = {"redis": REDIS_URL, "sqlite": "sqlite:///contract.db", "postgres": POSTGRES_URL}
QUICK = ("--rule", "cache.*", "-n", "3")


def _install(wheel: Path, root: Path, extra: str) -> Path:
    env_dir = root / extra
    # Without pip of its own: this pip installs into it (--python), which saves an
    # ensurepip per venv.
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    requirement = str(wheel) if extra == "core" else f"{wheel}[{extra}]"
    pip = [sys.executable, "-m", "pip", "--python", str(bin_dir / "python")]
    install = subprocess.run(
        [*pip, "install", "--quiet", "--no-compile", requirement],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    if install.returncode != 0 and "No matching distribution" in install.stderr:
        pytest.skip(f"the package index is unreachable: {install.stderr[-300:]}")
    assert install.returncode == 0, install.stderr
    return bin_dir


@pytest.fixture(scope="module")
def installs(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One fresh venv per extra, installed from the one built wheel, in parallel (pip's
    cache makes the dependencies cheap after the first)."""
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path_factory.mktemp("venvs")
    with ThreadPoolExecutor(max_workers=len(EXTRAS)) as pool:
        futures = {extra: pool.submit(_install, wheel, root, extra) for extra in EXTRAS}
        return {extra: future.result() for extra, future in futures.items()}


def _siglo(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["COLUMNS"] = "80"  # the install hints are whole in a narrow terminal too
    return subprocess.run(
        [str(bin_dir / "siglo"), *args], capture_output=True, text=True, cwd=cwd, env=env
    )


@pytest.mark.timeout(900)
@pytest.mark.rule("plugins.driver-missing")
@pytest.mark.parametrize("extra", list(EXTRAS))
def test_each_extra_in_a_fresh_venv(extra: str, installs: dict[str, Path], tmp_path: Path) -> None:
    bin_dir = installs[extra]
    present = EXTRAS[extra]
    # Every built-in plugin loads, whatever is installed; drivers are reported as they are.
    listing = _siglo(bin_dir, "backends", "--json", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = {row["plugin"]: row for row in json.loads(listing.stdout)}
    assert set(rows) == {"memory", "redis", "sqlite", "postgres"}
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["error"])
        installed = row["backends"][0]["driver_installed"]
        assert installed is (name == "memory" or name in present), (name, installed)
    table = _siglo(bin_dir, "backends", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    for name in {"redis", "sqlite", "postgres"} - present:
        assert f"pip install 'siglo[{name}]>=0.1,<1'" in table.stdout, table.stdout
    # A backend whose driver is missing: one error line naming the extra.
    for name in sorted({"redis", "sqlite", "postgres"} - present)[:1]:
        refused = _siglo(bin_dir, "check", BACKEND_URLS[name], *QUICK, cwd=tmp_path)
        assert refused.returncode == 1
        assert refused.stderr.startswith("Error: "), refused.stderr
        assert f"pip install 'siglo[{name}]>=0.1,<1'" in refused.stderr
        assert "Traceback" not in refused.stderr
    # `siglo check` with no URL works on every install (SQLite, or memory:// without it).
    default = _siglo(bin_dir, "check", *QUICK, cwd=tmp_path)
    assert default.returncode == 0, default.stdout + default.stderr
    expected = "sqlite:///siglo-check.db" if "sqlite" in present else "memory://"
    assert f"siglo check {expected}" in default.stdout
    # And against every other backend whose driver is there (SQLite's was the default).
    for name in sorted(present - {"sqlite"}):
        done = _siglo(bin_dir, "check", BACKEND_URLS[name], *QUICK, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "FAIL" not in done.stdout
    # `siglo ui` without its extra: one error line naming it.
    ui = _siglo(bin_dir, "ui", "memory://", cwd=tmp_path)
    assert ui.returncode == 1, ui.stderr
    assert "pip install 'siglo[ui]>=0.1,<1'" in ui.stderr and "Traceback" not in ui.stderr
    # An s3:// blob store: it opens with the s3 extra; without it, the error names the extra.
    s3 = "s3://bucket/p?region=us-east-1&access_key_id=a&secret_access_key=b"
    opened = subprocess.run(
        [str(bin_dir / "python"), "-c", f"import siglo.blobs as b; b.open_blob_store({s3!r})"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    if extra == "s3":
        assert opened.returncode == 0, opened.stderr
    else:
        assert "pip install 'siglo[s3]>=0.1,<1'" in opened.stderr, opened.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left behind in the cwd
