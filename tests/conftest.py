"""Shared fixtures and configuration of siglo's own tests."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from mutant_seeds import mutant_base_seed

import siglo
from siglo import ManualClock

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("siglo mutants", "the contract suite's mutation test")
    group.addoption(
        "--mutant-seeds",
        type=int,
        default=int(os.environ.get("SIGLO_MUTANT_SEEDS", "1")),
        help="How many seeds tests/suite/test_contract_mutants.py runs every mutant with "
        "(default: $SIGLO_MUTANT_SEEDS, else 1).",
    )
    group.addoption(
        "--mutant-seed",
        type=int,
        default=None,
        help="The first of those seeds (default: derived from the commit, printed in the header).",
    )
    group.addoption(
        "--mutant-whole",
        action="store_true",
        default=os.environ.get("SIGLO_MUTANT_WHOLE", "") not in ("", "0"),
        help="Run the whole suite against every mutant instead of the trimmed run "
        "(tests/support/mutant_runs.py; default: $SIGLO_MUTANT_WHOLE).",
    )


def pytest_report_header(config: pytest.Config) -> str:
    seeds = config.getoption("mutant_seeds")
    base = mutant_base_seed(config)
    whole = " --mutant-whole" if config.getoption("mutant_whole") else ""
    return (
        f"mutant seeds: {base}..{base + seeds - 1} "
        f"(--mutant-seed {base} --mutant-seeds {seeds}{whole})"
    )


_LONG_GROUPS = ("mutants", "packaging", "bench-smoke")
"""xdist groups that take minutes on one worker (the mutants' own process pool, the fresh
venvs, the benchmark command's two quick runs): collected first, so that they start at
once and the other workers share the rest of the run meanwhile, instead of one of them
starting late and running alone at the end."""


_LONG_TESTS = (
    "test_siglo_check_",
    "test_paging_across_10000_runs",
    "test_shared_storage_in_",
    "test_a_suite_class_runs_every_rule",
    "test_timers_fire_exactly_once_across_an_outage",
)
"""Tests of 15 s and more (``--durations=40`` on a slow day): sent out right after the
long groups, so that no worker starts one of them while the others have run out of
work (the run's tail)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        groups = [m.args[0] for m in item.iter_markers("xdist_group") if m.args]
        grouped = next((i for i, g in enumerate(_LONG_GROUPS) if g in groups), None)
        if grouped is not None:
            return grouped
        return len(_LONG_GROUPS) + (0 if item.name.startswith(_LONG_TESTS) else 1)

    items.sort(key=rank)  # stable: within a rank, the order of collection


_DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rule(*ids): the docs/contract.md rule ids this test checks")
    if not hasattr(config, "workerinput"):  # the controller, before any xdist worker starts
        _compile_the_sources()
        _own_postgres_database(config)
        config._siglo_redis_keys = _test_redis_keys()  # type: ignore[attr-defined]


_TEST_KEYS: Final = "siglo-*"
"""The keys of the shared Redis server the tests' own prefixes make (``siglo-test-…:``,
``siglo-blob-timeouts-…:``, the isolated backends'): each test removes what it stored."""


def _test_redis_keys() -> set[bytes] | None:
    """The shared server's test keys (database 0), or ``None`` when it cannot be read."""
    from _redis_helpers import REDIS_URL

    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
        try:
            return set(client.scan_iter(match=_TEST_KEYS, count=1000))
        finally:
            client.close()
    except Exception:
        return None


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Name the shared Redis server's test keys the run left (a test that stored under a
    prefix of its own and did not remove it): a report, not a failure, since another run
    on the same server may be storing meanwhile."""
    before = getattr(config, "_siglo_redis_keys", None)
    after = _test_redis_keys() if before is not None else None
    if before is None or after is None:
        return
    left = sorted(after - before)
    if left:
        terminalreporter.section("siglo: Redis keys the run left")
        for key in left[:20]:
            terminalreporter.write_line(key.decode(errors="replace"))
        if len(left) > 20:
            terminalreporter.write_line(f"… and {len(left) - 20} more")


_SOURCE_ROOTS = ("siglo", "backends", "contract_tests", "tests", "benchmarks")


def _compile_the_sources() -> None:
    """Write the source tree's bytecode once, before any process of the run imports it.

    The run starts hundreds of Python processes (xdist workers, the mutants' pool, every
    `siglo` command a test runs, the docs' code blocks). Where ``PYTHONDONTWRITEBYTECODE``
    is set (this machine's shell sets it), none of them writes bytecode, so each compiled
    every module of siglo it imported from source: about 0.3 s of CPU a `siglo` command,
    a third of its time. Processes still read bytecode that exists; `compileall` writes
    it whatever that setting, and skips what is up to date.
    """
    import compileall

    root = Path(__file__).resolve().parents[1]
    for name in _SOURCE_ROOTS:
        compileall.compile_dir(root / name, quiet=1)
    # And let the run's processes write what they compile: pytest caches the modules it
    # rewrites (the tests, and the plugins' packages: hypothesis's 76 modules) only when
    # bytecode may be written, so with the setting every worker rewrote and compiled
    # them again at collection (11 s of CPU a worker; 5 s with the cache).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def pytest_unconfigure(config: pytest.Config) -> None:
    run_database = getattr(config, "_siglo_run_database", None)
    if run_database is not None:
        base_url, name = run_database
        import psycopg

        with psycopg.connect(base_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _own_postgres_database(config: pytest.Config) -> None:
    """Give this run a PostgreSQL database of its own, dropped when it ends.

    Tests that open a backend on the URL's default schema would otherwise share it with
    every other run on the server (another checkout's run at a newer schema version then
    fails this one). The URL of ``SIGLO_POSTGRES_URL`` (default
    ``postgresql://postgres@127.0.0.1:5432/test``) is the server; the run's tests and the
    processes they start see ``SIGLO_POSTGRES_URL`` pointing at ``siglo_run_<hex>`` on it.
    When the server cannot be reached, or the role may not create a database, the URL is
    left as it is (the PostgreSQL tests then skip, or use that URL's database).
    """
    base_url = os.environ.get("SIGLO_POSTGRES_URL", _DEFAULT_POSTGRES_URL)
    try:
        import psycopg

        name = f"siglo_run_{secrets.token_hex(4)}"
        with psycopg.connect(base_url, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception:
        return
    scheme_and_server, _, rest = base_url.partition("://")
    server, _, query = rest.partition("?")
    server = server.split("/", 1)[0]
    url = f"{scheme_and_server}://{server}/{name}" + (f"?{query}" if query else "")
    os.environ["SIGLO_POSTGRES_URL"] = url
    config._siglo_run_database = (base_url, name)  # type: ignore[attr-defined]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000_000)


@pytest.fixture
def memory(clock: ManualClock) -> siglo.Backend:
    return siglo.connect("memory://", clock=clock)


@pytest.fixture
def manager(memory: siglo.Backend, clock: ManualClock) -> siglo.StorageManager:
    return siglo.StorageManager(memory, clock=clock, error_mode="strict")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port for this worker's session (the S3 blob
    store's tests; tests/support/s3_support.py), stopped at its end."""
    from s3_support import moto_server

    with moto_server() as endpoint:
        yield endpoint
