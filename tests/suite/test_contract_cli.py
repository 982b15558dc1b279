"""``siglo check`` and :func:`run_contract` against the reference backend."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from mutants import MUTANTS
from siglo_check import run_siglo_check

import siglo
from siglo import Capability, LockNotAcquiredError
from siglo.cli import cli
from siglo.cli.check import DEFAULT_URL
from siglo_contract.runner import run_contract, run_option_profiles
from siglo_memory import connect as memory_connect
from siglo_memory.adapter import MemoryStorageAdapter

T = TypeVar("T")


def test_siglo_check_defaults_to_the_embedded_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default URL is a relative file: its isolated directories go beside it, so
    # here, not in the checkout (where they raced `ruff check .`).
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["check", "--rule", "cache.*", "--examples", "5"])
    assert result.exit_code == 0, result.output
    assert f"siglo check {DEFAULT_URL}" in result.output
    assert DEFAULT_URL.startswith("sqlite:///")
    assert "cache.falsy-hit" in result.output
    assert "checkpoint.roundtrip" not in result.output


def test_siglo_check_unknown_rule_pattern() -> None:
    result = CliRunner().invoke(cli, ["check", "memory://", "--rule", "no.such.rule"])
    assert result.exit_code == 2
    assert "no rule matches" in result.output


def test_siglo_check_refuses_bad_options_before_the_run(tmp_path: Path) -> None:
    """An unwritable --report-file is named as itself (not as the JUnit report), an empty
    or unknown --compare URL and an empty --rule are refused before anything runs."""
    missing = tmp_path / "no-such-dir" / "x.md"
    cases = [
        (["--report", "md", "--report-file", str(missing)], 1, "--report-file"),
        (["--compare", ""], 1, "--compare needs a backend URL"),
        (["--compare", "nosuch://x"], 1, "no backend serves nosuch://"),
        (["--compare", "memory://?x=1"], 1, "'x'"),
        (["--rule", ""], 2, "--rule '' matches no rule"),
    ]
    for options, status, said in cases:
        result = CliRunner().invoke(cli, ["check", "memory://", *options])
        assert result.exit_code == status, (options, result.output)
        assert said in result.output, (options, result.output)
        assert "siglo check memory://" not in result.output, "the run started"
        assert "JUnit" not in result.output


def test_siglo_check_unknown_scheme() -> None:
    result = CliRunner().invoke(cli, ["check", "nosuch://x"])
    assert result.exit_code == 1
    assert "no backend serves nosuch://" in result.output


def test_siglo_check_fails_a_broken_backend(tmp_path: Path) -> None:
    """A registered backend that breaks a rule: exit status 1, the rule and its counter-example."""
    from siglo.plugins import get_registry, hookimpl

    mutant = next(m for m in MUTANTS if m.rule_id == "checkpoint.occ.conflict")

    class Plugin:
        @staticmethod
        @hookimpl
        def siglo_register_backends(registry):  # type: ignore[no-untyped-def]
            registry.add_backend(
                "broken",
                schemes=("broken",),
                factory=lambda url, **options: mutant.factory(**options),
                capabilities=[c.value for c in Capability],
            )

    registry = get_registry()
    registry.register(Plugin(), "broken-test-plugin")
    try:
        junit = tmp_path / "report.xml"
        result = CliRunner().invoke(
            cli,
            [
                "check",
                "broken://",
                "--rule",
                "checkpoint.occ.*",
                "--seed",
                "1",
                "--junit-xml",
                str(junit),
            ],
        )
    finally:
        registry.unregister("broken-test-plugin")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output
    assert "CheckpointMachine()" in result.output
    failed = [c.get("name") for c in ET.parse(junit).getroot() if c.find("failure") is not None]
    assert "checkpoint.occ.conflict" in failed


def test_undeclared_capabilities_are_not_supported() -> None:
    def factory(**options: object) -> object:
        backend = memory_connect("memory://", **options)  # type: ignore[arg-type]
        backend.nonces = None
        backend.lock = None
        return backend

    report = run_contract(
        factory, rules=["nonce", "lock.fencing", "cache.miss"], seed=1, examples=5
    )
    assert report.verdict("nonce.claim.once") == "not supported"
    assert report.verdict("nonce.expiry") == "not supported"
    assert report.verdict("lock.fencing") == "not supported"
    assert report.verdict("cache.miss") == "pass"
    assert report.ok


def test_a_declared_capability_without_its_parts_fails() -> None:
    def factory(**options: object) -> object:
        backend = memory_connect("memory://", **options)  # type: ignore[arg-type]
        backend.nonces = None
        return backend

    report = run_contract(
        factory, capabilities=[*Capability], rules=["capability.declared"], seed=1
    )
    assert report.verdict("capability.declared") == "FAIL"
    assert "nonces" in report.results["capability.declared"].detail


def test_a_backend_with_capabilities_its_registration_leaves_out_fails() -> None:
    """siglo.connect refuses a backend whose adapter has a capability its plugin's
    registration leaves out (PluginError at every connection), and `siglo check` passed
    it, certifying a backend nobody can connect to (a black-box plugin author). It fails
    ``capability.declared`` naming the capability."""
    from siglo.plugins import get_registry, hookimpl

    class Plugin:
        @staticmethod
        @hookimpl
        def siglo_register_backends(registry):  # type: ignore[no-untyped-def]
            registry.add_backend(
                "underdeclared",
                schemes=("underdeclared",),
                factory=lambda url, **options: memory_connect("memory://", **options),
                capabilities=[c.value for c in Capability if c is not Capability.STEP_CACHE],
            )

    registry = get_registry()
    registry.register(Plugin(), "underdeclared-test-plugin")
    try:
        report = run_contract("underdeclared://", rules=["capability.declared"], seed=1)
    finally:
        registry.unregister("underdeclared-test-plugin")
    assert report.verdict("capability.declared") == "FAIL"
    detail = report.results["capability.declared"].detail
    assert "step_cache" in detail and "siglo.connect refuses" in detail, detail


def test_seed_makes_a_run_reproducible() -> None:
    mutant = next(m for m in MUTANTS if m.rule_id == "checkpoint.occ.conflict")
    details = {
        run_contract(mutant.factory, rules=["checkpoint.occ.conflict"], seed=5, keep_going=False)
        .results["checkpoint.occ.conflict"]
        .detail
        for _ in range(2)
    }
    assert len(details) == 1


@pytest.mark.parametrize("profile", ["ci", "thorough"])
def test_profiles_exist(profile: str) -> None:
    from siglo_contract.runner import PROFILES

    assert PROFILES[profile]["max_examples"] > 0


class _GivesUpAfterTwoSeconds(MemoryStorageAdapter):
    """Waiters without a timeout of their own wait for the workflow lock at most 2 s, then
    run their action anyway (one with a shorter ``timeout_ms`` is refused as it should)."""

    async def _do_with_workflow_lock(
        self, stack_id: str, action: Callable[[], Awaitable[T]], *, timeout_ms: int | None = None
    ) -> T:
        lock = self._workflow_locks.setdefault(stack_id, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), min(timeout_ms or 2000, 2000) / 1000)
        except TimeoutError:
            if timeout_ms is not None and timeout_ms < 2000:
                raise LockNotAcquiredError(f"workflow lock {stack_id!r} held") from None
            return await action()  # the bug: an overlap instead of LockNotAcquiredError
        try:
            return await action()
        finally:
            lock.release()


def _gives_up_backend(**options: Any) -> siglo.Backend:
    backend = memory_connect("memory://", **options)
    backend.adapter = _GivesUpAfterTwoSeconds(clock=options.get("clock"))
    return backend


@pytest.mark.rule("lock.workflow.exclusive")
def test_the_profiles_workflow_lock_hold_decides_what_the_check_can_see() -> None:
    """The first action's hold is the profile's ``workflow_lock_hold_ms``: 3 s in
    ``thorough`` shows a lock whose waiters give up after 2 s; 1 s in ``ci`` cannot."""
    from siglo_contract.runner import PROFILES

    assert PROFILES["ci"]["workflow_lock_hold_ms"] == 1000
    assert PROFILES["thorough"]["workflow_lock_hold_ms"] == 3000
    rules = ["lock.workflow.exclusive"]
    thorough = run_contract(_gives_up_backend, rules=rules, seed=1, profile="thorough")
    assert thorough.verdict("lock.workflow.exclusive") == "FAIL"
    ci = run_contract(_gives_up_backend, rules=rules, seed=1, profile="ci")
    assert ci.verdict("lock.workflow.exclusive") == "pass"


# -- option profiles: every rule under the suite's options and a user's defaults ---------------


class _DropsExtraWithoutRetention(MemoryStorageAdapter):
    """Loses a checkpoint's extra fields only when checkpoints are kept forever (no
    retention: a user's default), so the suite's own options never see it."""

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> siglo.Checkpoint | None:
        cp = await super()._do_get_checkpoint(stack_id, namespace, fallback=fallback)
        if cp is None or self.checkpoint_ttl_ms is not None:
            return cp
        return cp.replace(extra={})


def _retention_sensitive(**options: Any) -> siglo.Backend:
    backend = memory_connect("memory://", **options)
    backend.adapter = _DropsExtraWithoutRetention(
        clock=options.get("clock"),
        checkpoint_ttl_ms=options.get("checkpoint_ttl_ms"),
    )
    return backend


def test_every_rule_runs_under_each_option_profile() -> None:
    """A bug only a user's defaults reach passes the suite's profile and fails under
    ``user-defaults``, the merged verdict naming the profile it was seen under."""
    rules = ["checkpoint.roundtrip"]
    suite = run_option_profiles(_retention_sensitive, ("suite",), rules=rules, seed=1)
    assert suite.verdict("checkpoint.roundtrip") == "pass"
    assert suite.option_profiles == ("suite",)
    both = run_option_profiles(_retention_sensitive, rules=rules, seed=1)
    assert both.option_profiles == ("suite", "user-defaults")
    assert both.verdict("checkpoint.roundtrip") == "FAIL"
    assert both.results["checkpoint.roundtrip"].detail.startswith("[option profile user-defaults] ")
    sound = run_option_profiles("memory://", rules=rules, seed=1)
    assert sound.ok and sound.seed == 1
    with pytest.raises(ValueError, match=r"unknown option profile.*nightly.*known: suite"):
        run_option_profiles("memory://", ("nightly",), rules=rules)


def test_the_user_defaults_profile_gives_the_factory_what_siglo_connect_gives() -> None:
    """``user-defaults`` was documented as what a user's siglo.connect gives, yet it
    called the factory with cache_ttl_ms=300000 and claim_lease_ms=60000: a plugin whose
    own defaults were wrong passed ``--options all`` and misbehaved under every user's
    connect (a black-box auditor). It now gives what siglo.connect gives a factory when
    the user names no option (nothing; the clock the suite moves, which a user may
    give), and a wrong default fails the rule it breaks, held to siglo.settings.DEFAULTS."""
    from siglo.settings import DEFAULTS
    from siglo_contract.target import DEFAULT_OPTIONS, OPTION_PROFILES

    given: list[set[str]] = []

    def recording(**options: Any) -> siglo.Backend:
        given.append(set(options))
        return memory_connect("memory://", **options)

    # The focused checks (the state machines take a minute and check no default more).
    rules = ["cache.expiry", "wait.claim.once"]
    kw: dict[str, Any] = {"rules": rules, "seed": 1, "only": lambda chk: chk.machine is None}
    assert run_option_profiles(recording, ("user-defaults",), **kw).ok
    assert given and all(names <= {"clock"} for names in given), given
    assert OPTION_PROFILES == {"suite": DEFAULT_OPTIONS, "user-defaults": {}}

    def own_defaults(**options: Any) -> siglo.Backend:
        # The auditor's plugin: right whenever the options are given.
        options.setdefault("cache_ttl_ms", 10**12)
        options.setdefault("claim_lease_ms", 3_600_000)
        return memory_connect("memory://", **options)

    assert run_option_profiles(own_defaults, ("suite",), **kw).ok
    both = run_option_profiles(own_defaults, **kw)
    for rule_id, default in (
        ("cache.expiry", f"cache_ttl_ms={DEFAULTS.cache_ttl_ms}"),
        ("wait.claim.once", f"lease {DEFAULTS.claim_lease_ms} ms"),
    ):
        res = both.results[rule_id]
        assert res.verdict == "FAIL", rule_id
        assert res.detail.startswith("[option profile user-defaults] "), res.detail
        assert default in res.detail, res.detail


# -- the size guard at a backend's declared limit ---------------------------------------------


def test_the_size_guard_check_stores_a_declared_limit_up_to_its_bound() -> None:
    """A declared max_document_bytes up to DECLARED_LIMIT_CHECKED_UP_TO is written at
    exactly (a backend declaring 400 KB whose store held 200 KB passed every rule: the
    guard was crossed at 4,096 bytes only; a black-box auditor); a larger one, every
    built-in backend's, is not, so their runs stay quick (docs/running-the-contract-suite.md)."""
    from siglo.plugins import get_registry
    from siglo_contract.checks_large_state import DECLARED_LIMIT_CHECKED_UP_TO, GUARD_LIMIT

    sizes: list[int] = []

    class Recording(MemoryStorageAdapter):
        async def _do_save_checkpoint(
            self, checkpoint: siglo.Checkpoint, *, expected_revision: int | None = None
        ) -> None:
            sizes.append(len(checkpoint.to_json()))
            await super()._do_save_checkpoint(checkpoint, expected_revision=expected_revision)

    for declared, largest in (
        (400_000, 400_000),
        (DECLARED_LIMIT_CHECKED_UP_TO, DECLARED_LIMIT_CHECKED_UP_TO),
        (DECLARED_LIMIT_CHECKED_UP_TO + 1, GUARD_LIMIT),
    ):

        def factory(declared: int = declared, **options: Any) -> siglo.Backend:
            backend = memory_connect("memory://", **options)
            adapter = Recording(
                clock=options.get("clock"),
                **{k: v for k, v in options.items() if k.endswith("_ms")},
            )
            adapter.max_document_bytes = declared
            backend.adapter = adapter
            return backend

        sizes.clear()
        report = run_contract(factory, rules=["checkpoint.size.guard"], seed=1)
        assert report.ok, report.results["checkpoint.size.guard"].detail
        assert max(sizes) == largest, (declared, max(sizes))
    for url in ("memory://", "sqlite://", "postgresql://h/db", "redis://h"):
        limit = get_registry().for_url(url).max_document_bytes
        assert limit is None or limit > DECLARED_LIMIT_CHECKED_UP_TO, (url, limit)


def test_siglo_check_options_all(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["check", "memory://", "--rule", "cache.miss", "--seed", "1", "--options", "all"]
    )
    assert result.exit_code == 0, result.output
    assert "options suite + user-defaults; rerun with --seed 1 --options all" in " ".join(
        result.output.split()
    )
    bad = CliRunner().invoke(cli, ["check", "memory://", "--options", "nightly"])
    assert bad.exit_code == 2 and "'nightly' is not one of" in bad.output


def test_siglo_check_does_not_take_the_settings_options(tmp_path: Path) -> None:
    # docs/running-the-contract-suite.md, "Options passed to the backend": the settings'
    # [options] do not reach the suite. A siglo.toml whose [options] name an option the
    # backend does not have (which siglo.connect refuses) and a retention that would
    # break the suite's TTL rules leaves `siglo check` passing.
    (tmp_path / "siglo.toml").write_text(
        "[options]\nno_such_option = 1\ncheckpoint_ttl_ms = 1\n", encoding="utf-8"
    )
    url = "sqlite:///checked.db"
    refused = subprocess.run(
        [sys.executable, "-m", "siglo", "ls", url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert refused.returncode != 0 and "no_such_option" in refused.stderr + refused.stdout
    run_siglo_check(url, tmp_path, "--rule", "checkpoint.r*", "--examples", "5")


def test_siglo_check_without_a_url_checks_the_settings_url(tmp_path: Path) -> None:
    """docs/running-the-contract-suite.md: with no URL, `siglo check` checks the settings'
    URL — here `url` in the siglo.toml of the directory it runs in — before the embedded
    default."""
    (tmp_path / "siglo.toml").write_text('url = "memory://"\n', encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "check", "--rule", "cache.*", "--examples", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "SIGLO_URL"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "siglo check memory://" in done.stdout, done.stdout
    assert not list(tmp_path.glob("siglo-check*"))  # not the SQLite default


def test_debug_adds_the_traceback_behind_an_error_line(tmp_path: Path) -> None:
    """docs/running-the-contract-suite.md: a report path that cannot be written is one
    Error line and a Hint; with --debug, the traceback of the failure behind it too."""
    args = ["check", "memory://", "--junit-xml", str(tmp_path / "no-such-dir" / "r.xml")]
    for debug in (False, True):
        done = subprocess.run(
            [sys.executable, "-m", "siglo", *(["--debug"] if debug else []), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Error: cannot write the JUnit XML report" in done.stderr
        assert ("Traceback" in done.stderr) is debug, done.stderr
        assert ("FileNotFoundError" in done.stderr) is debug, done.stderr


def _shared_store_plugin(name: str) -> object:
    """A plugin whose backend declares storage shared between processes
    (``multiprocess=True``) and registers no isolated factory (in-memory here: what it
    stores goes with the test's process)."""
    from siglo.plugins import hookimpl
    from siglo_memory.connect import connect as siglo_memory_connect

    class Plugin:
        @staticmethod
        @hookimpl
        def siglo_register_backends(registry):  # type: ignore[no-untyped-def]
            registry.add_backend(
                name,
                schemes=(name,),
                factory=lambda url, **options: siglo_memory_connect("memory://", **options),
                capabilities=("checkpoints",),
                multiprocess=True,
            )

    return Plugin()


def test_siglo_check_refuses_a_shared_store_it_cannot_isolate() -> None:
    """Without an isolated factory the suite called the plugin's factory on the URL
    itself: 108 files of test data left in a user's store after one run (a black-box
    auditor). Refused, before anything is written, saying what the plugin needs."""
    from siglo.plugins import get_registry

    registry = get_registry()
    registry.register(_shared_store_plugin("sharedstore"), "sharedstore-test-plugin")
    try:
        result = CliRunner().invoke(cli, ["check", "sharedstore://", "--rule", "checkpoint.*"])
    finally:
        registry.unregister("sharedstore-test-plugin")
    assert result.exit_code == 1, result.output
    assert "registers no isolated factory" in result.output, result.output
    assert "isolated=" in result.output and "checks" not in result.output.split("Error")[0]


def _broken_factory_plugin(name: str, mistake: str) -> object:
    """A plugin whose factory makes one mistake: ``"dict"`` returns a dict instead of a
    siglo.Backend, ``"raises"`` raises a KeyError (a lookup it never guarded), and
    ``"isolated-dict"`` has an isolated factory that yields a dict."""
    from siglo.plugins import hookimpl
    from siglo_memory.connect import connect as siglo_memory_connect

    def factory(url: str, **options: Any) -> Any:
        if mistake == "dict":
            return {}
        if mistake == "raises":
            return {}["no-such-option"]
        return siglo_memory_connect("memory://", **options)

    @contextlib.asynccontextmanager
    async def isolated(url: str, **options: Any) -> AsyncIterator[Any]:
        yield {"not": "a backend"}

    class Plugin:
        @staticmethod
        @hookimpl
        def siglo_register_backends(registry):  # type: ignore[no-untyped-def]
            registry.add_backend(
                name,
                schemes=(name,),
                factory=factory,
                capabilities=("checkpoints",),
                **(
                    {"isolated": isolated, "multiprocess": True}
                    if mistake == "isolated-dict"
                    else {}
                ),
            )

    return Plugin()


@pytest.mark.parametrize("mistake", ["dict", "raises", "isolated-dict"])
def test_siglo_check_names_a_plugins_broken_factory_as_siglo_connect_does(mistake: str) -> None:
    """A plugin factory that returned a dict: siglo.connect said "backend 'x' (plugin
    'x') returned dict from its factory, not a siglo.Backend", `siglo check` said
    "unexpected AttributeError: 'dict' object has no attribute 'raw_adapter'" and asked
    for a bug report to siglo; one that raised KeyError, "unexpected KeyError", naming
    no plugin (a black-box auditor). Both now say what siglo.connect says, naming the
    plugin, with `--compare` too."""
    from siglo.plugins import get_registry

    name = f"broken{mistake.replace('-', '')}"
    plugin = f"{name}-test-plugin"
    registry = get_registry()
    registry.register(_broken_factory_plugin(name, mistake), plugin)
    try:
        result = CliRunner().invoke(
            cli, ["check", f"{name}://", "--rule", "checkpoint.roundtrip", "--seed", "1"]
        )
        compared = CliRunner().invoke(
            cli,
            ["check", "memory://", "--rule", "checkpoint.roundtrip", "--compare", f"{name}://"],
        )
        if mistake == "dict":
            with pytest.raises(siglo.PluginError) as connect_said:
                siglo.connect(f"{name}://")
    finally:
        registry.unregister(plugin)
    for out in (result, compared):
        said = " ".join(out.output.split())
        assert out.exit_code == 1, out.output
        assert "unexpected" not in said and "report it" not in said, said
        assert f"Error: backend {name!r} (plugin {plugin!r})" in said, said
        assert "a mistake of the plugin named above, not of siglo" in said, said
    said = " ".join(result.output.split())
    if mistake == "dict":
        assert f"Error: {connect_said.value}" in said, said
    elif mistake == "raises":
        assert "its factory raised KeyError: 'no-such-option'" in said, said
    else:
        assert "returned dict from its factory, not a siglo.Backend" in said, said


def test_a_report_says_the_races_ran_in_one_process_without_isolated_storage() -> None:
    """The report said ``crossProcess: true`` for a plugin registered
    ``multiprocess=True`` without an isolated factory, where no race ever ran across
    processes (and a CAS all four processes won passed ``checkpoint.occ.atomic``)."""
    from siglo.plugins import get_registry
    from siglo_contract.certificate import report_document, to_markdown
    from siglo_contract.runner import run_contract

    registry = get_registry()
    registry.register(_shared_store_plugin("sharedreport"), "sharedreport-test-plugin")
    try:
        report = run_contract("sharedreport://", rules=["checkpoint.occ.atomic"], seed=1)
    finally:
        registry.unregister("sharedreport-test-plugin")
    doc = report_document(report)
    assert doc["run"]["crossProcess"] is False
    assert "no isolated factory" in doc["run"]["oneProcessBecause"]
    assert "concurrency raced in one process only (no storage other processes" in to_markdown(doc)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_check_stopped_by_a_signal_removes_its_isolated_storage_and_says_so(
    signame: str, tmp_path: Path
) -> None:
    """A SIGTERM (a timeout, `docker stop`, a cancelled CI job) left the run's isolated
    Redis keys behind, a thousand of them, some without an expiry (a black-box auditor);
    Ctrl-C removed them. It ends the run as Ctrl-C does. Ctrl-C itself ended with click's
    bare "Aborted!" and status 1. Redis databases 12 and 13, one a signal, which no other
    test uses: what is left there is this run's."""
    import signal
    import subprocess
    import sys
    import time

    import redis
    from _redis_helpers import require_redis

    require_redis()
    url = f"redis://127.0.0.1:6379/{12 if signame == 'SIGTERM' else 13}"
    client = redis.Redis.from_url(url)
    before = client.dbsize()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "COLUMNS": "200",
    }
    with subprocess.Popen(
        [sys.executable, "-m", "siglo", "check", url, "--seed", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    ) as process:
        assert process.stderr is not None
        began = time.monotonic()
        for line in process.stderr:
            if b"\xe2\x9c\x93" in line:  # a check finished: its storage is written
                break
            assert time.monotonic() - began < 60, "no check finished"
        signum = getattr(signal, signame)
        process.send_signal(signum)
        said = process.stderr.read().decode()
        code = process.wait(timeout=60)
    assert code == 128 + signum, said
    assert f"siglo check was interrupted ({signame})" in said, said
    assert "Aborted!" not in said
    assert client.dbsize() == before
    client.close()


def test_a_call_that_never_returns_fails_its_check_instead_of_hanging_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plugin whose ``get_cached_step`` awaits for ever hung `siglo check` until it was
    killed (a black-box auditor). The check fails at its bound, naming the rule, and the
    run goes on. (The bound, 300 s, made 1 s here.)"""
    import asyncio
    import time

    from siglo_contract import registry
    from siglo_contract.runner import run_contract
    from siglo_memory.adapter import MemoryStorageAdapter
    from siglo_memory.connect import connect as memory_connect

    class Hangs(MemoryStorageAdapter):
        async def _do_get_cached_step(self, key: str) -> Any:
            await asyncio.Event().wait()

    def factory(**options: Any) -> siglo.Backend:
        backend = memory_connect("memory://", **options)
        backend.adapter = Hangs(clock=backend.adapter.clock)
        return backend

    monkeypatch.setattr(registry, "CHECK_TIMEOUT_S", 1.0)
    began = time.monotonic()
    # The focused checks alone (a machine's calls, bounded the same way, would each wait
    # out the bound: the state machine's many calls make the test slow, not different).
    report = run_contract(
        factory, rules=["cache.roundtrip"], seed=1, only=lambda chk: chk.machine is None
    )
    assert time.monotonic() - began < 30
    result = report.results["cache.roundtrip"]
    assert result.verdict == "FAIL"
    assert "did not finish within 1 s: a call of the backend never returned" in result.detail
