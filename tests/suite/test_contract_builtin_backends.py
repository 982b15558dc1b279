"""`siglo check URL` passes every rule for every built-in backend (issue 3's must-show),
under both option profiles (the suite's options and a user's defaults: `--options all`
for the in-memory backend, one run a profile for the servers; SQLite's two URLs share
their SQL, so the file one runs under the suite's options and the in-memory one under a
user's defaults).

Each runs the real command line in a subprocess, as CI and users run it. Servers that are
unreachable skip their backend with a plain message, except under CI=true.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _redis_helpers import REDIS_URL, require_redis
from siglo_check import run_siglo_check
from sql_support import POSTGRES_URL, require_postgres


@pytest.mark.rule("capability.declared")
@pytest.mark.parametrize(
    "url",
    ["memory://", "sqlite://", "sqlite:///siglo-contract.db"],
    ids=["memory", "sqlite-memory", "sqlite-file"],
)
def test_siglo_check_embedded_backends(url: str, tmp_path: Path) -> None:
    profile = {"memory://": "all", "sqlite://": "user-defaults"}.get(url, "suite")
    out, xml = run_siglo_check(url, tmp_path, "--options", profile)
    if url == "memory://":
        # The reference model passes every rule under both profiles (the one test of it
        # through the command line), each a test case of the JUnit report.
        from xml.etree import ElementTree

        from siglo_contract.rules import ADAPTER_RULES

        assert "checkpoint.occ.conflict" in out
        assert f"{len(ADAPTER_RULES)} pass" in out, out[-3000:]
        assert ElementTree.fromstring(xml).get("tests") == str(len(ADAPTER_RULES))


# The servers' runs are the longest of the default test run: one profile a test, so that
# pytest-xdist spreads them over its workers (the in-memory one above runs `--options all`
# itself, which merges the two profiles' verdicts).
PROFILES = ["suite", "user-defaults"]


@pytest.mark.rule("capability.declared")
@pytest.mark.parametrize("profile", PROFILES)
def test_siglo_check_postgres(tmp_path: Path, profile: str) -> None:
    require_postgres()
    run_siglo_check(POSTGRES_URL, tmp_path, "--options", profile)


@pytest.mark.rule("capability.declared")
@pytest.mark.parametrize("profile", PROFILES)
def test_siglo_check_redis(tmp_path: Path, profile: str) -> None:
    require_redis()
    run_siglo_check(REDIS_URL, tmp_path, "--options", profile)
