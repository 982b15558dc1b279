"""The conformance certificate: the versioned contract, JSON / Markdown / HTML reports
(checked against their schema, never holding credentials), declared deviations (strict),
the suite's recorded power, ``--compare``, and the example plugin's published reports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result
from sql_support import require_postgres

from siglo import MISSING
from siglo.adapter import Capability
from siglo.cli import cli as main
from siglo.errors import PluginError, StorageAdapterError
from siglo.plugins import BackendRegistry, Deviation, get_registry, hookimpl
from siglo_contract.certificate import (
    REPORT_SCHEMA,
    load_power,
    render,
    report_document,
)
from siglo_contract.rules import ADAPTER_RULES, RULES
from siglo_contract.runner import run_contract
from siglo_contract.target import Target
from siglo_contract.version import (
    CONTRACT_HISTORY,
    CONTRACT_VERSION,
    PAGE_DIGEST,
    ContractMismatchError,
    page_digest,
    require_contract,
    rule_set_hash,
)
from siglo_memory import connect as memory_connect
from siglo_memory.adapter import MemoryStorageAdapter

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
REPORTS = ROOT / "docs" / "reports"

# -- the versioned contract ------------------------------------------------------------------


def test_the_page_digest_is_the_pages() -> None:
    """A rule's text on docs/contract.md changes only together with PAGE_DIGEST (and, when
    it asks more of a backend, the contract version and the rule's 'changed')."""
    assert page_digest(PAGE) == PAGE_DIGEST, (
        "docs/contract.md's rule rows changed: set siglo_contract.version.PAGE_DIGEST to "
        f"{page_digest(PAGE)!r}, and bump the version / mark the rule changed if it now asks more"
    )


def test_the_page_shows_each_rules_versions() -> None:
    rows = dict(re.findall(r"^\| `([^`]+)` \| ([^|]+) \| .+ \|$", PAGE, re.MULTILINE))
    for rule in RULES:
        want = rule.since + (f", changed {rule.changed}" if rule.changed else "")
        assert rows[rule.id].strip() == want, rule.id
        assert rule.since in CONTRACT_HISTORY and (rule.changed in (None, *CONTRACT_HISTORY))
    assert max(CONTRACT_HISTORY, key=lambda v: tuple(map(int, v.split(".")))) == CONTRACT_VERSION


def test_the_versions_are_on_the_page_and_in_the_changelog() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for version in CONTRACT_HISTORY:
        assert re.search(rf"^\| {re.escape(version)} \| ", PAGE, re.MULTILINE), version
        assert f"### Contract {version}" in changelog, version
    assert f"version, **{CONTRACT_VERSION}**" in PAGE


def test_the_rule_set_hash_covers_the_rules() -> None:
    first = rule_set_hash()
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", first)
    assert rule_set_hash() == first


def test_a_pin_of_this_contract_passes_and_any_other_fails_clearly() -> None:
    require_contract(CONTRACT_VERSION)
    require_contract(rule_set_hash())
    with pytest.raises(
        ContractMismatchError, match=rf"checks contract {re.escape(CONTRACT_VERSION)}, not 1\.1"
    ):
        require_contract("1.1")
    with pytest.raises(ContractMismatchError, match=r"not 9\.0 \(known versions"):
        require_contract("9.0")
    with pytest.raises(ContractMismatchError, match="not a contract version"):
        require_contract("latest")
    with pytest.raises(ContractMismatchError, match="rules changed since the pin"):
        require_contract("sha256:0000000000000000")


def test_siglo_check_prints_the_contract_and_refuses_another_pin() -> None:
    runner = CliRunner()
    ok = runner.invoke(
        main,
        [
            "check",
            "memory://",
            "--rule",
            "cache.miss",
            "--seed",
            "1",
            "--contract",
            CONTRACT_VERSION,
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert f"contract {CONTRACT_VERSION}, rule set {rule_set_hash()}" in ok.output
    bad = runner.invoke(main, ["check", "memory://", "--contract", "1.1"])
    assert bad.exit_code != 0
    assert f"this suite checks contract {CONTRACT_VERSION}, not 1.1" in bad.output
    assert "pass" not in bad.output  # refused before any check ran


# -- reports -----------------------------------------------------------------------------------


def _validate(doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(REPORT_SCHEMA)
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(doc)


def test_a_json_report_follows_its_schema_and_says_everything() -> None:
    report = run_contract("memory://", rules=["cache", "lock.token"], seed=3)
    doc = report_document(report)
    _validate(doc)
    assert doc["contract"] == {"version": CONTRACT_VERSION, "ruleSetHash": rule_set_hash()}
    assert doc["run"]["seed"] == 3 and doc["run"]["profile"] == "ci"
    assert doc["target"]["distribution"] == "siglo" and doc["target"]["backend"] == "memory"
    assert "checkpoints" in doc["capabilities"]
    ran = [r["id"] for r in doc["rules"] if r["verdict"] != "not run"]
    assert ran == [
        "cache.roundtrip",
        "cache.falsy-hit",
        "cache.miss",
        "cache.expiry",
        "cache.namespaced",
        "cache.with-checkpoint",
        "lock.token",
    ]
    assert all(r["verdict"] == "pass" and r["seconds"] >= 0 for r in doc["rules"] if r["id"] in ran)
    # A selection: every other rule is listed as not run, and the badge says so.
    left = doc["summary"]["notRun"]
    assert left == len(doc["rules"]) - 7 - doc["summary"]["notSupported"] > 0
    assert doc["run"]["rules"] == ["cache", "lock.token"]
    assert (
        doc["badge"] == f"siglo contract {CONTRACT_VERSION} — 7/{7 + left} rules ({left} not run)"
    )
    assert doc["power"] == load_power()


class _MissIsNone(MemoryStorageAdapter):
    """A key never set reads as None (cache.miss broken; expiry still MISSING)."""

    async def _do_get_cached_step(self, key: str) -> Any:
        got = await super()._do_get_cached_step(key)
        return None if got is MISSING and key not in self.model.cache else got


def _broken(**options: Any) -> Any:
    backend = memory_connect("memory://", **options)
    backend.adapter = _MissIsNone(clock=options.get("clock"))
    return backend


def test_a_failure_is_reported_with_its_counter_example_and_primary_flag() -> None:
    report = run_contract(_broken, rules=["cache"], seed=1)
    doc = report_document(report)
    _validate(doc)
    miss = next(r for r in doc["rules"] if r["id"] == "cache.miss")
    assert miss["verdict"] == "FAIL" and miss["primaryFailure"] is True
    assert "cache.miss" in miss["counterExample"]
    assert doc["summary"]["failed"] >= 1
    assert "failed" in doc["badge"]
    md = render(doc, "md")
    assert "### `cache.miss` (FAIL)" in md and "(primary failure)" in md
    assert "<td class='FAIL'>FAIL (primary failure)" in render(doc, "html")


def test_reports_never_hold_credentials() -> None:
    """A password in the URL (PostgreSQL trusts the loopback, so any password connects)
    appears in no report format, nor does a secret query parameter."""
    require_postgres()
    base = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    url = base.replace("postgres@", "postgres:s3cr3t-pw@", 1)
    assert "s3cr3t-pw" in url
    runner = CliRunner()
    for fmt in ("json", "md", "html"):
        result = runner.invoke(
            main, ["check", url, "--rule", "cache.miss", "--seed", "1", "--report", fmt]
        )
        assert result.exit_code == 0, result.output
        assert "s3cr3t-pw" not in result.output
        assert "postgres:***@" in result.output
    doc = report_document(run_contract(url, rules=["cache.miss"], seed=1), url=url)
    _validate(doc)
    assert "s3cr3t-pw" not in json.dumps(doc)


def test_report_file_and_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "report.md"
    result = runner.invoke(
        main,
        ["check", "memory://", "--rule", "cache.miss", "--report", "md", "--report-file", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").startswith("# siglo contract report")
    alone = runner.invoke(main, ["check", "memory://", "--report-file", str(out)])
    assert alone.exit_code != 0 and "--report-file needs --report" in alone.output


# -- declared deviations -----------------------------------------------------------------------


def _plugin(
    factory: Any, deviations: list[Any], *, name: str = "deviant", gets_url: bool = False
) -> object:
    """A plugin registering ``factory`` as backend ``name`` (its scheme too), with the
    capabilities of a checkpoint store with a step cache and ``deviations``; the factory
    is given the URL with ``gets_url``."""

    class Plugin:
        @hookimpl
        def siglo_register_backends(self, registry: BackendRegistry) -> None:
            registry.add_backend(
                name,
                schemes=(name,),
                factory=factory if gets_url else lambda url, **options: factory(**options),
                capabilities=("checkpoints", "step_cache", "clock"),
                deviations=deviations,
            )

    return Plugin()


def _check_deviant(factory: Any, deviations: list[Any]) -> Any:
    registry = get_registry()
    registry.register(_plugin(factory, deviations), "deviant-test-plugin")
    try:
        # The declared rule and one the deviant meets (a miss read as None breaks other
        # cache rules too, as consequences).
        return run_contract(
            Target.from_url("deviant://"), rules=["cache.miss", "cache.falsy-hit"], seed=1
        )
    finally:
        registry.unregister("deviant-test-plugin")


DEVIATION = {"rule": "cache.miss", "reason": "a miss reads as None", "kind": "not-yet"}


def test_a_declared_deviation_is_reported_as_declared_not_passed() -> None:
    report = _check_deviant(_broken, [DEVIATION])
    assert report.verdict("cache.miss") == "declared"
    assert report.ok  # declared, so not a failure
    doc = report_document(report)
    _validate(doc)
    assert doc["deviations"] == [DEVIATION]
    assert doc["summary"]["declared"] == 1 and doc["summary"]["passed"] == 1
    left = doc["summary"]["notRun"]  # the rules not selected
    assert doc["badge"] == (
        f"siglo contract {CONTRACT_VERSION} — 1/{2 + left} rules "
        f"(1 declared deviation, {left} not run)"
    )
    assert "## Declared deviations" in render(doc, "md")


def test_a_declared_deviation_that_passes_fails_until_the_declaration_goes() -> None:
    """The backend fixed, the declaration left: the check fails and says to remove it."""
    fixed = _check_deviant(lambda **o: memory_connect("memory://", **o), [DEVIATION])
    assert fixed.verdict("cache.miss") == "FAIL"
    assert not fixed.ok
    assert "but the rule passes: remove the declaration" in fixed.results["cache.miss"].detail
    clean = _check_deviant(lambda **o: memory_connect("memory://", **o), [])
    assert clean.verdict("cache.miss") == "pass" and clean.ok


def test_a_deviation_must_name_a_rule_reason_and_kind() -> None:
    with pytest.raises(PluginError, match="needs a reason"):
        Deviation("cache.miss", " ")
    with pytest.raises(PluginError, match="kinds: not-yet, by-design"):
        Deviation("cache.miss", "why", "someday")  # type: ignore[arg-type]
    registry = BackendRegistry("p")
    with pytest.raises(PluginError, match="declared twice"):
        registry.add_backend(
            "x",
            schemes=("x",),
            factory="m:f",
            deviations=[DEVIATION, Deviation(**DEVIATION)],  # type: ignore[arg-type]
        )
    with pytest.raises(PluginError, match=r"not adapter rules of docs/contract\.md: no\.such"):
        run_contract(
            "memory://", rules=["cache"], deviations=[Deviation("no.such", "r", "by-design")]
        )


class _SavesUnnamespaced(MemoryStorageAdapter):
    """Saves every checkpoint outside its namespace: a more basic rule fails first in
    each check of the manager's redaction and restore rules."""

    async def _do_save_checkpoint(
        self, checkpoint: Any, *, expected_revision: int | None = None
    ) -> None:
        await super()._do_save_checkpoint(
            checkpoint.replace(namespace=None), expected_revision=expected_revision
        )


def _unnamespaced(**options: Any) -> Any:
    backend = memory_connect("memory://", **options)
    backend.adapter = _SavesUnnamespaced(clock=options.get("clock"))
    return backend


def test_a_whole_run_says_why_a_rule_was_not_run() -> None:
    """docs/running-the-contract-suite.md: in a whole run, a rule none of whose checks
    completed (each stopped by a more basic rule's failure) is not run, and the table
    says so in its row (an auditor read two such rows as unexplained)."""
    registry = get_registry()
    registry.register(_plugin(_unnamespaced, []), "deviant-test-plugin")
    try:
        done = CliRunner().invoke(
            main,
            ["check", "deviant://", "--seed", "1"],
            env={"COLUMNS": "250"},
        )
    finally:
        registry.unregister("deviant-test-plugin")
    assert done.exit_code != 0, done.output
    rows = [
        line
        for line in done.output.splitlines()
        if line.lstrip("│ ").startswith("manager.redaction.stored ")
    ]
    assert rows and "not run" in rows[0], done.output
    assert "no check of this rule completed" in rows[0], done.output
    assert "each stopped at a failure of" in done.output, done.output


def test_a_selection_reports_the_failure_that_stopped_its_rules() -> None:
    """A run limited to the manager's rules over a backend that loses namespaces: their
    checks stop at checkpoint.roundtrip, which is reported (FAIL, the run fails) though
    not selected; before, the run passed with the two rules "not run"."""
    registry = get_registry()
    registry.register(_plugin(_unnamespaced, []), "deviant-test-plugin")
    try:
        report = run_contract(Target.from_url("deviant://"), rules=["manager.*"], seed=1)
    finally:
        registry.unregister("deviant-test-plugin")
    assert not report.ok
    assert report.verdict("checkpoint.roundtrip") == "FAIL"
    assert report.primary is not None and report.primary.rule.id == "checkpoint.roundtrip"
    assert report.verdict("manager.redaction.stored") == "not run"
    doc = report_document(report)
    _validate(doc)
    assert doc["summary"]["failed"] == 1


def test_compare_lists_the_failure_that_stopped_a_selected_rule() -> None:
    """``--rule R --compare URL``: the failure that stopped R's checks on one side is a
    difference too (an auditor's finding: the table listed R alone, "1 of 5 rules
    differ")."""
    registry = get_registry()
    registry.register(_plugin(_unnamespaced, []), "deviant-test-plugin")
    try:
        done = CliRunner().invoke(
            main,
            ["check", "deviant://", "--seed", "1", "--rule", "manager.*", "--compare", "memory://"],
            env={"COLUMNS": "250"},
        )
    finally:
        registry.unregister("deviant-test-plugin")
    assert done.exit_code != 0, done.output
    comparison = done.output.split("where deviant:// and memory:// differ", 1)[1]
    rows = [line for line in comparison.splitlines() if "checkpoint.roundtrip" in line]
    assert rows and "FAIL" in rows[0] and "not selected" in rows[0], done.output
    assert "3 of 5 rules differ" in comparison, comparison


# -- the suite's power ---------------------------------------------------------------------------


def test_the_recorded_power_matches_the_reference_mutants() -> None:
    """power.json (python tests/support/mutation_score.py --write-power) covers exactly the
    mutants over the reference backend there are now."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from mutation_score import POWER_FILE, reference_mutants

    recorded = json.loads(POWER_FILE.read_text(encoding="utf-8"))
    assert sorted(recorded["byMutant"]) == sorted(reference_mutants()), (
        "the mutant set changed: rerun python tests/support/mutation_score.py --write-power"
    )
    assert recorded["mutants"] == len(reference_mutants())
    assert recorded["killedWithTheRightRule"] == sum(
        m["killed"] for m in recorded["byMutant"].values()
    ) * len(recorded["seeds"])
    assert recorded["contractVersion"] == CONTRACT_VERSION
    power = load_power()
    assert power is not None and power["mutants"] == recorded["mutants"]


# -- compare -------------------------------------------------------------------------------------


def test_compare_shows_where_two_backends_differ() -> None:
    registry = get_registry()
    registry.register(_plugin(_broken, []), "deviant-test-plugin")
    try:
        runner = CliRunner()
        result = runner.invoke(
            main,
            [
                "check",
                "deviant://",
                *("--rule", "cache.miss", "--rule", "cache.falsy-hit"),
                *("--seed", "1", "--compare", "memory://"),
            ],
        )
        same = runner.invoke(
            main, ["check", "memory://", "--rule", "cache", "--seed", "1", "--compare", "sqlite://"]
        )
    finally:
        registry.unregister("deviant-test-plugin")
    assert result.exit_code == 1
    assert "where deviant:// and memory:// differ" in result.output
    assert re.search(r"cache\.miss\s+│\s+FAIL\s+│\s+pass", result.output), result.output
    assert "1 of 2 rules differ (seed 1" in result.output
    assert same.exit_code == 0, same.output
    assert "memory:// and sqlite:// agree on all 6 rules (seed 1)" in same.output


# -- the example plugin's published reports ------------------------------------------------------


def _volatile(doc: Any) -> Any:
    """``doc`` without what changes from run to run (durations)."""
    if isinstance(doc, dict):
        return {k: _volatile(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_volatile(v) for v in doc]
    return doc


def test_the_example_plugins_published_reports_are_current(tmp_path: Path) -> None:
    """docs/reports/siglo-filestore.{json,md} are what ``siglo check filestore://…
    --seed 1 --report json|md`` writes now (SIGLO_UPDATE_REPORTS=1 rewrites them)."""
    pytest.importorskip("siglo_filestore")
    url = "filestore:///tmp/siglo-filestore-report"
    report = run_contract(url, seed=1)
    doc = report_document(report, url=url)
    _validate(doc)
    assert doc["target"]["distribution"] == "siglo-filestore"
    assert doc["summary"]["failed"] == 0
    files = {"json": REPORTS / "siglo-filestore.json", "md": REPORTS / "siglo-filestore.md"}
    if os.environ.get("SIGLO_UPDATE_REPORTS") == "1":
        REPORTS.mkdir(exist_ok=True)
        for fmt, path in files.items():
            path.write_text(render(doc, fmt), encoding="utf-8")
    committed = json.loads(files["json"].read_text(encoding="utf-8"))
    _validate(committed)
    stale = "stale: rerun SIGLO_UPDATE_REPORTS=1 pytest -k published_reports"
    assert _volatile(committed) == _volatile(doc), stale
    assert files["md"].read_text(encoding="utf-8") == render(doc, "md"), stale


@pytest.mark.parametrize("limit", [65_536, 131_072, 4_096])
def test_a_backend_that_declares_a_document_limit_can_pass_every_large_state_rule(
    limit: int,
) -> None:
    """A store that holds one item up to some size declares it (``max_document_bytes``),
    as writing-a-backend.md invites; the incremental-saves rule then runs its program
    with documents that fit, instead of failing on the size guard's rightful refusal."""

    def limited(**options: Any) -> Any:
        backend = memory_connect("memory://", **options)
        backend.adapter.max_document_bytes = limit
        return backend

    report = run_contract(
        limited, rules=["checkpoint.incremental", "checkpoint.size.guard"], seed=1
    )
    assert report.verdict("checkpoint.incremental") == "pass", report.results
    assert report.verdict("checkpoint.size.guard") == "pass", report.results


class _HoldsAtMost(MemoryStorageAdapter):
    """A store that holds documents of up to 8,192 bytes, and fails (as a real store's
    driver would) on a larger one, whatever the adapter's own guard says."""

    async def _do_save_checkpoint(self, checkpoint: Any, **kw: Any) -> None:
        if len(checkpoint.to_json()) > 8_192:
            raise StorageAdapterError("the store's item limit was exceeded")
        await super()._do_save_checkpoint(checkpoint, **kw)


def test_a_limit_declared_only_in_the_registration_is_the_suites() -> None:
    """writing-a-backend.md: a plugin declares its limit in its registration
    (``add_backend(max_document_bytes=…)``), which ``siglo.connect`` puts on the adapter;
    ``siglo check`` opens backends through the plugin's factories, not ``connect``, and
    must keep to that limit too — the incremental-saves rule then sends documents that
    fit, and the size guard is checked under it."""

    def factory(url: str, **options: Any) -> Any:
        backend = memory_connect("memory://", **options)
        backend.adapter = _HoldsAtMost(clock=options.get("clock"))
        return backend

    class Plugin:
        @hookimpl
        def siglo_register_backends(self, registry: BackendRegistry) -> None:
            registry.add_backend(
                "holds",
                schemes=("holds",),
                factory=factory,
                capabilities=("checkpoints", "clock"),
                max_document_bytes=8_192,
            )

    registry = get_registry()
    registry.register(Plugin(), "holds-test-plugin")
    try:
        report = run_contract(
            Target.from_url("holds://"),
            rules=["checkpoint.incremental", "checkpoint.size.guard"],
            seed=1,
        )
    finally:
        registry.unregister("holds-test-plugin")
    assert report.verdict("checkpoint.incremental") == "pass", report.results
    assert report.verdict("checkpoint.size.guard") == "pass", report.results


def test_a_rule_whose_checks_need_an_undeclared_part_is_not_supported() -> None:
    """``payload.results`` is about the idempotency store "where it has one": a backend
    with ``payload_scan`` and no idempotency store cannot run its check, and the report
    says "not supported" (not counted) — not "not run", which reads as a limited run and
    kept a complete run's badge from ever being clean."""
    caps = frozenset(Capability) - {Capability.IDEMPOTENCY}
    target = Target.from_factory(
        lambda **o: memory_connect("memory://", **o), capabilities=caps, label="no-idem"
    )
    report = run_contract(target, rules=["payload.results", "payload.scan"], seed=1)
    assert report.verdict("payload.results") == "not supported", report.results
    assert "'idempotency'" in report.results["payload.results"].detail
    assert report.verdict("payload.scan") == "pass"


def test_a_report_of_some_rules_never_reads_as_a_full_pass() -> None:
    """``--rule`` limits a run; its report lists every other rule as not run (or not
    supported), says which rules were selected and how many examples were given, and
    its badge counts the rules left out, so a backend that fails a full run cannot
    publish a subset as its certificate."""
    report = run_contract("memory://", rules=["checkpoint.roundtrip"], seed=1, examples=2)
    doc = report_document(report)
    _validate(doc)
    assert doc["run"]["rules"] == ["checkpoint.roundtrip"] and doc["run"]["examples"] == 2
    verdicts = {r["id"]: r["verdict"] for r in doc["rules"]}
    assert verdicts["checkpoint.roundtrip"] == "pass"
    assert verdicts["checkpoint.occ.conflict"] == "not run"
    assert len(doc["rules"]) == len(ADAPTER_RULES)  # every rule listed
    applying = sum(v != "not supported" for v in verdicts.values())
    assert doc["summary"]["applicable"] == applying > 1
    assert doc["summary"]["notRun"] == applying - 1
    assert f"({doc['summary']['notRun']} not run)" in doc["badge"]
    assert "only the rules checkpoint.roundtrip" in render(doc, "md")
    # A full run's document carries neither.
    full = report_document(run_contract("memory://", rules=None, seed=1, only=lambda _: False))
    assert "rules" not in full["run"] and "examples" not in full["run"]


class _QuotesItsUrl(MemoryStorageAdapter):
    """A cache that fails naming the URL it was opened with, password and all, as a
    driver's error may."""

    url = ""

    async def _do_get_cached_step(self, key: str) -> Any:
        # As written, and quoted with !r (escaped again by the counter-example's repr).
        raise RuntimeError(f"cannot read {self.url} ({self.url!r})")


def _plugin_quoting_its_url(deviations: list[Any]) -> object:
    def factory(url: str, **options: Any) -> Any:
        backend = memory_connect("memory://", **options)
        adapter = _QuotesItsUrl(clock=options.get("clock"))
        adapter.url = url
        backend.adapter = adapter
        return backend

    return _plugin(factory, deviations, name="quoting", gets_url=True)


@contextlib.contextmanager
def _quoting_backend(deviations: list[Any]) -> Iterator[None]:
    registry = get_registry()
    registry.register(_plugin_quoting_its_url(deviations), "quoting-test-plugin")
    try:
        yield
    finally:
        registry.unregister("quoting-test-plugin")


def _check_cache_miss(url: str, junit: Path, *more: str) -> Result:
    """``siglo check URL --rule cache.miss --seed 1 --junit-xml JUNIT …``, in process."""
    args = ["check", url, "--rule", "cache.miss", "--seed", "1", "--junit-xml", str(junit)]
    return CliRunner().invoke(main, [*args, *more])


def test_no_output_of_siglo_check_holds_a_password_a_backend_quoted(tmp_path: Path) -> None:
    """A counter-example quotes what the backend raised; a backend quoting its URL put
    the password in the JUnit XML and the table, where the JSON report had it scrubbed (a
    black-box auditor). Every result's text is scrubbed when the report is built."""
    # A backslash and quotes, which a repr escapes (a second auditor's leak).
    url = "quoting://alice:Super\\Secret'Pw\"123@somewhere/x"
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    with _quoting_backend([]):
        done = _check_cache_miss(url, junit, "--report", "json", "--report-file", str(report))
    assert done.exit_code == 1, done.output
    assert "cannot read quoting://alice:***@somewhere/x" in junit.read_text()
    for text in (done.output, junit.read_text(), report.read_text()):
        assert "Secret" not in text and "Pw" not in text, text


def test_a_declared_deviation_shows_its_reason_in_every_output(tmp_path: Path) -> None:
    """``siglo check`` reports a declared rule with the reason the backend gave: in its
    table and its JUnit XML (a skipped case), not only in the JSON and Markdown."""
    deviation = {"rule": "cache.miss", "reason": "reads fail by design here", "kind": "by-design"}
    junit = tmp_path / "junit.xml"
    with _quoting_backend([deviation]):
        done = _check_cache_miss("quoting://x", junit)
    assert done.exit_code == 0, done.output
    flat = " ".join(done.output.split())
    assert "by-design: reads fail by design here" in flat, done.output
    assert 'message="declared (by-design: reads fail by design here)"' in junit.read_text()
