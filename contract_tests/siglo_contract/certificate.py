"""The conformance certificate: a run of the contract suite as a JSON document, a Markdown
page and an HTML page a plugin can publish (``siglo check --report json|md|html``).

The JSON document follows :data:`REPORT_SCHEMA` (a JSON Schema, documented on
docs/running-the-contract-suite.md); the Markdown and HTML pages are rendered from it, so
all three say the same. A report names the suite and contract version, the rule-set hash,
the seed and profile, the plugin's distribution and version, the backend's capabilities,
the suite's measured power, and per rule its verdict, duration, counter-example and
whether it is the primary failure. It never holds credentials: URLs are masked, and
every text taken from the run (counter-examples too) has the target URL's password
replaced.
"""

from __future__ import annotations

import html
import json
from importlib import metadata
from importlib.resources import files
from typing import Any, Final

from siglo.plugins import BackendSpec, get_registry
from siglo.urls import mask_credentials
from siglo_contract.rules import ADAPTER_RULES
from siglo_contract.runner import Report, RuleResult
from siglo_contract.scrubbing import scrubber
from siglo_contract.target import Target
from siglo_contract.version import CONTRACT_VERSION, rule_set_hash

__all__ = [
    "REPORT_FORMATS",
    "REPORT_SCHEMA",
    "SCHEMA_ID",
    "badge",
    "load_power",
    "render",
    "report_document",
    "to_html",
    "to_json",
    "to_markdown",
]

SCHEMA_ID: Final = "https://siglo.dev/schemas/contract-report-1.json"
"""The ``$schema`` of every JSON report (version 1 of the report format)."""

REPORT_FORMATS: Final = ("json", "md", "html")

_VERDICTS: Final = ["pass", "FAIL", "not supported", "not run", "declared"]

REPORT_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "siglo contract report",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "$schema",
        "suite",
        "contract",
        "run",
        "target",
        "capabilities",
        "deviations",
        "power",
        "summary",
        "badge",
        "rules",
    ],
    "properties": {
        "$schema": {"const": SCHEMA_ID},
        "suite": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "version"],
            "properties": {"name": {"const": "siglo-contract"}, "version": {"type": "string"}},
        },
        "contract": {
            "type": "object",
            "additionalProperties": False,
            "required": ["version", "ruleSetHash"],
            "properties": {
                "version": {"type": "string", "pattern": r"^\d+\.\d+$"},
                "ruleSetHash": {"type": "string", "pattern": "^sha256:[0-9a-f]{16}$"},
            },
        },
        "run": {
            "type": "object",
            "additionalProperties": False,
            "required": ["seed", "profile", "optionProfiles", "seconds"],
            "properties": {
                "seed": {"type": "integer"},
                "profile": {"type": "string"},
                "optionProfiles": {"type": "array", "items": {"type": "string"}},
                "seconds": {"type": "number", "minimum": 0},
                # A run limited to some rules (--rule) or examples (--examples) says so.
                "rules": {"type": "array", "items": {"type": "string"}},
                "examples": {"type": "integer", "minimum": 1},
                # Whether the concurrency rules raced callers in several processes (the
                # registration's multiprocess=True, and isolated storage other processes
                # reach), or within one process only, and then why.
                "crossProcess": {"type": "boolean"},
                "oneProcessBecause": {"type": "string"},
            },
        },
        "target": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url", "backend", "plugin", "distribution", "version"],
            "properties": {
                "url": {"type": "string"},
                "backend": {"type": ["string", "null"]},
                "plugin": {"type": ["string", "null"]},
                "distribution": {"type": ["string", "null"]},
                "version": {"type": ["string", "null"]},
            },
        },
        "capabilities": {"type": "array", "items": {"type": "string"}},
        "deviations": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["rule", "reason", "kind"],
                "properties": {
                    "rule": {"type": "string"},
                    "reason": {"type": "string"},
                    "kind": {"enum": ["not-yet", "by-design"]},
                },
            },
        },
        "power": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": [
                        "contractVersion",
                        "backend",
                        "mutants",
                        "runs",
                        "killedWithTheRightRule",
                        "seeds",
                        "measured",
                    ],
                    "properties": {
                        "contractVersion": {"type": "string"},
                        "backend": {"type": "string"},
                        "mutants": {"type": "integer", "minimum": 0},
                        "runs": {"type": "integer", "minimum": 0},
                        "killedWithTheRightRule": {"type": "integer", "minimum": 0},
                        "seeds": {"type": "array", "items": {"type": "integer"}},
                        "measured": {"type": "string"},
                    },
                },
            ]
        },
        "summary": {
            "type": "object",
            "additionalProperties": False,
            "required": ["applicable", "passed", "failed", "declared", "notSupported", "notRun"],
            "properties": {
                name: {"type": "integer", "minimum": 0}
                for name in ("applicable", "passed", "failed", "declared", "notSupported", "notRun")
            },
        },
        "badge": {"type": "string"},
        "rules": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": [
                    "id",
                    "since",
                    "changed",
                    "capability",
                    "verdict",
                    "seconds",
                    "counterExample",
                    "primaryFailure",
                    "deviation",
                ],
                "properties": {
                    "id": {"type": "string"},
                    "since": {"type": "string"},
                    "changed": {"type": ["string", "null"]},
                    "capability": {"type": ["string", "null"]},
                    "verdict": {"enum": _VERDICTS},
                    "seconds": {"type": "number", "minimum": 0},
                    "counterExample": {"type": ["string", "null"]},
                    "primaryFailure": {"type": "boolean"},
                    "deviation": {
                        "oneOf": [
                            {"type": "null"},
                            {"$ref": "#/properties/deviations/items"},
                        ]
                    },
                },
            },
        },
    },
}
"""JSON Schema (draft 2020-12) of a ``--report json`` document."""


def load_power() -> dict[str, Any] | None:
    """The suite's measured power (``power.json``, written by
    ``python tests/support/mutation_score.py --write-power``), without its per-mutant
    list; ``None`` if it was never measured."""
    try:
        text = files("siglo_contract").joinpath("power.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    doc = json.loads(text)
    keys = REPORT_SCHEMA["properties"]["power"]["oneOf"][1]["required"]
    return {key: doc[key] for key in keys}


def _suite_version() -> str:
    try:
        return metadata.version("siglo")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return "unknown"


def _plugin(spec: BackendSpec | None) -> tuple[str | None, str | None, str | None]:
    """(plugin name, distribution, version) of the plugin that registered ``spec``."""
    if spec is None:
        return None, None, None
    info = get_registry().plugins.get(spec.plugin)
    if info is None:
        return spec.plugin or None, None, None
    return info.name, info.distribution, info.version


def report_document(report: Report, *, url: str | None = None) -> dict[str, Any]:
    """The JSON report of ``report`` (see :data:`REPORT_SCHEMA`). ``url`` is the URL the
    run was given (masked in the report; its password is removed from every text)."""
    target: Target | None = report.target_object
    spec = None if target is None else target.spec
    scrub = scrubber(url if url is not None else (None if target is None else target.url))
    plugin, distribution, version = _plugin(spec)
    primary = report.primary
    rules = []
    results = dict(report.results)
    if report.selection:
        # A run of some rules: every other rule is listed, not run (or not supported),
        # so the counts and the badge never read as a full pass.
        held = frozenset() if target is None else target.capabilities
        for rule in ADAPTER_RULES:
            if rule.id not in results:
                supported = rule.capability is None or rule.capability in held
                results[rule.id] = RuleResult(
                    rule, "not run" if supported else "not supported", "not selected"
                )
        results = {r.id: results[r.id] for r in ADAPTER_RULES if r.id in results}
    for res in results.values():
        rules.append(
            {
                "id": res.rule.id,
                "since": res.rule.since,
                "changed": res.rule.changed,
                "capability": None if res.rule.capability is None else res.rule.capability.value,
                "verdict": res.verdict,
                "seconds": round(res.seconds, 3),
                "counterExample": scrub(res.detail)
                if res.verdict in ("FAIL", "declared")
                else None,
                "primaryFailure": res is primary,
                "deviation": None if res.deviation is None else res.deviation.to_wire(),
            }
        )
    count = {v: sum(r["verdict"] == v for r in rules) for v in _VERDICTS}
    summary = {
        "applicable": len(rules) - count["not supported"],
        "passed": count["pass"],
        "failed": count["FAIL"],
        "declared": count["declared"],
        "notSupported": count["not supported"],
        "notRun": count["not run"],
    }
    deviations = [] if target is None else [d.to_wire() for d in target.deviations]
    doc: dict[str, Any] = {
        "$schema": SCHEMA_ID,
        "suite": {"name": "siglo-contract", "version": _suite_version()},
        "contract": {"version": CONTRACT_VERSION, "ruleSetHash": rule_set_hash()},
        "run": {
            "seed": report.seed,
            "profile": report.profile,
            "optionProfiles": list(report.option_profiles),
            "seconds": round(report.seconds, 1),
            **({"rules": list(report.selection)} if report.selection else {}),
            **({"examples": report.examples} if report.examples is not None else {}),
            # Whether the races ran across processes: the registration must say
            # multiprocess=True and the run must have storage other processes reach (the
            # plugin's isolated factory). Without it they raced in one process, whatever
            # the registration says, and the report says so.
            "crossProcess": target is not None
            and target.multiprocess
            and report.storage is not None,
            **(
                {"oneProcessBecause": _one_process_because(target, report)}
                if target is not None and not (target.multiprocess and report.storage)
                else {}
            ),
        },
        "target": {
            "url": scrub(mask_credentials(report.target)),
            "backend": None if spec is None else spec.name,
            "plugin": plugin,
            "distribution": distribution,
            "version": version,
        },
        "capabilities": sorted(c.value for c in (() if target is None else target.capabilities)),
        "deviations": deviations,
        "power": load_power(),
        "summary": summary,
        "badge": "",
        "rules": rules,
    }
    doc["badge"] = badge(doc)
    return doc


def badge(doc: dict[str, Any]) -> str:
    """The one line a README shows: ``siglo contract 1.4 — 73/73 rules`` (passed of the
    rules that apply to the backend's capabilities, with declared deviations and
    failures said when there are any)."""
    s = doc["summary"]
    line = f"siglo contract {doc['contract']['version']} — {s['passed']}/{s['applicable']} rules"
    extras = []
    if s["declared"]:
        extras.append(f"{s['declared']} declared deviation{'s' if s['declared'] > 1 else ''}")
    if s["failed"]:
        extras.append(f"{s['failed']} failed")
    if s["notRun"]:
        extras.append(f"{s['notRun']} not run")
    return line + (f" ({', '.join(extras)})" if extras else "")


def to_json(doc: dict[str, Any]) -> str:
    """The JSON report, indented, with a final newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: dict[str, Any]) -> str:
    """The report as a Markdown page (what a plugin's README links to)."""
    t, c, r, s = doc["target"], doc["contract"], doc["run"], doc["summary"]
    who = t["distribution"] or t["plugin"] or t["url"]
    lines = [
        f"# siglo contract report: {who}{' ' + t['version'] if t['version'] else ''}",
        "",
        f"**{doc['badge']}**",
        "",
        "| | |",
        "|---|---|",
        f"| backend | `{t['backend'] or '-'}` (`{_cell(t['url'])}`) |",
        f"| plugin | {t['plugin'] or '-'}"
        f" ({t['distribution'] or '-'} {t['version'] or ''}) |".replace(" )", ")"),
        f"| contract | {c['version']} (rule set `{c['ruleSetHash']}`) |",
        f"| suite | siglo-contract {doc['suite']['version']} |",
        f"| run | seed {r['seed']}, profile {r['profile']}"
        + (f" with {r['examples']} examples" if "examples" in r else "")
        + f", option profiles {', '.join(r['optionProfiles'])}"
        + (f"; only the rules {_cell(', '.join(r['rules']))}" if "rules" in r else "")
        + (
            f"; concurrency raced in one process only ({r.get('oneProcessBecause', '')})"
            if r.get("crossProcess") is False
            else ""
        )
        + " |",
        f"| capabilities | {', '.join(doc['capabilities']) or '-'} |",
        f"| rules | {s['passed']} pass, {s['failed']} fail, {s['declared']} declared, "
        f"{s['notSupported']} not supported, {s['notRun']} not run |",
    ]
    power = doc["power"]
    if power is not None:
        lines.append(
            f"| suite's power | {power['killedWithTheRightRule']} of {power['runs']} runs of "
            f"{power['mutants']} deliberately broken backends (`{power['backend']}`, seeds "
            f"{', '.join(map(str, power['seeds']))}, contract {power['contractVersion']}, "
            f"{power['measured']}) failed with the rule they break named |"
        )
    else:
        lines.append("| suite's power | not measured |")
    if doc["deviations"]:
        lines += ["", "## Declared deviations", "", "| rule | kind | reason |", "|---|---|---|"]
        lines += [
            f"| `{d['rule']}` | {d['kind']} | {_cell(d['reason'])} |" for d in doc["deviations"]
        ]
    lines += ["", "## Rules", "", "| rule | since | verdict |", "|---|---|---|"]
    for rule in doc["rules"]:
        since = rule["since"] + (f", changed {rule['changed']}" if rule["changed"] else "")
        verdict = rule["verdict"] + (" (primary failure)" if rule["primaryFailure"] else "")
        lines.append(f"| `{rule['id']}` | {since} | {verdict} |")
    failed = [x for x in doc["rules"] if x["counterExample"]]
    if failed:
        lines += ["", "## Counter-examples"]
        for rule in failed:
            lines += ["", f"### `{rule['id']}` ({rule['verdict']})", "", "```text"]
            lines += [rule["counterExample"].rstrip(), "```"]
    lines += [
        "",
        "Rules are defined on siglo's docs/contract.md; `siglo check --report md` wrote this page.",
        "",
    ]
    return "\n".join(lines)


def to_html(doc: dict[str, Any]) -> str:
    """The report as a self-contained HTML page."""
    e = html.escape
    t, s = doc["target"], doc["summary"]
    rows = "\n".join(
        f"<tr><td><code>{e(x['id'])}</code></td><td>{e(x['since'])}</td>"
        f"<td class='{e(x['verdict'].replace(' ', '-'))}'>{e(x['verdict'])}"
        f"{' (primary failure)' if x['primaryFailure'] else ''}</td>"
        f"<td><pre>{e(x['counterExample'] or '')}</pre></td></tr>"
        for x in doc["rules"]
    )
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{e(doc['badge'])}</title></head><body>\n"
        f"<h1>{e(doc['badge'])}</h1>\n"
        f"<p>{e(t['distribution'] or t['url'])} {e(t['version'] or '')}: backend "
        f"<code>{e(t['backend'] or '-')}</code>, contract {e(doc['contract']['version'])} "
        f"(<code>{e(doc['contract']['ruleSetHash'])}</code>), seed {doc['run']['seed']}, "
        f"{s['passed']} pass, {s['failed']} fail, {s['declared']} declared, "
        f"{s['notSupported']} not supported, {s['notRun']} not run"
        + (
            f" (only the rules {e(', '.join(doc['run']['rules']))})"
            if "rules" in doc["run"]
            else ""
        )
        + ".</p>\n"
        "<table><tr><th>rule</th><th>since</th><th>verdict</th><th>counter-example</th></tr>\n"
        f"{rows}\n</table>\n</body></html>\n"
    )


def render(doc: dict[str, Any], fmt: str) -> str:
    """The report in format ``fmt`` (one of :data:`REPORT_FORMATS`)."""
    if fmt == "json":
        return to_json(doc)
    if fmt == "md":
        return to_markdown(doc)
    if fmt == "html":
        return to_html(doc)
    raise ValueError(f"unknown report format {fmt!r}; formats: {', '.join(REPORT_FORMATS)}")


def _one_process_because(target: Any, report: Any) -> str:
    """Why a run raced its concurrency checks in one process only."""
    if not target.multiprocess:
        return "the registration says multiprocess=False"
    if target.isolated is not None:
        return (
            "its isolated storage is not reached by another process's connection (the "
            "backend says url_shares_storage=False), whatever its multiprocess=True"
        )
    return (
        "no storage other processes reach: the plugin registers no isolated factory, "
        "whatever its registration's multiprocess=True"
    )
