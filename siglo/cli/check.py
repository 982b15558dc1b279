"""``siglo check [URL]``: run the contract suite against a backend and print a verdict table."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from siglo.cli.common import STOPPED_BY, interrupted, stopped_by_signals
from siglo.cli.errors import CliError, display_url, resolve_url
from siglo.connect import check_port
from siglo.errors import PluginError, SigloError
from siglo.plugins import get_registry
from siglo.plugins.backends import BackendSpec

if TYPE_CHECKING:
    from siglo_contract.registry import Check
    from siglo_contract.runner import Report

__all__ = ["DEFAULT_URL", "check"]

DEFAULT_URL: Final = "sqlite:///siglo-check.db"
"""The backend ``siglo check`` runs against when given no URL and no ``$SIGLO_URL``:
siglo's embedded default, SQLite on a file. The suite works in a temporary directory
beside that file and removes it; the file itself is never created."""

FALLBACK_URL: Final = "memory://"
"""What ``siglo check`` runs against with no URL when SQLite's driver is not installed
(a core-only install): the reference backend, which needs no driver."""

_STYLE: Final = {
    "pass": "green",
    "FAIL": "bold red",
    "not supported": "yellow",
    "not run": "magenta",
    "declared": "cyan",
}


def _default_url() -> str:
    try:
        sqlite = get_registry().for_url(DEFAULT_URL)
    except SigloError:
        sqlite = None
    if sqlite is not None and sqlite.driver_installed:
        return DEFAULT_URL
    install = sqlite.install_command() if sqlite else "pip install 'siglo[sqlite]>=0.1,<1'"
    click.echo(
        f"siglo check: no URL given and SQLite's driver is not installed ({install}); "
        f"checking {FALLBACK_URL} instead",
        err=True,
    )
    return FALLBACK_URL


def _writable_report(path: Path, option: str, what: str) -> None:
    """Fail now, not after the whole run, if a report cannot be written (``option`` the
    option that named it, ``what`` the report)."""
    existed = path.exists()
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise CliError(
            f"cannot write the {what} {str(path)!r}: {exc.strerror or exc}",
            f"pass {option} a path in a directory that exists and that you can write",
        ) from exc
    if not existed:
        path.unlink()


@click.command()
@click.argument("url", required=False, default=None)
@click.option(
    "--examples",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help="Examples per state machine (overrides the profile).",
)
@click.option("--seed", type=int, default=None, help="Seed for a reproducible run.")
@click.option(
    "--profile",
    type=click.Choice(["ci", "thorough"]),
    default="ci",
    show_default=True,
    help="Hypothesis budget: ci (quick) or thorough (long runs).",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    metavar="PATTERN",
    help="Only rules matching PATTERN (glob, or an id prefix such as 'wait'). Repeatable.",
)
@click.option(
    "--junit-xml",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a JUnit XML report (one test case per rule).",
)
@click.option(
    "--contract",
    "pin",
    metavar="VERSION",
    default=None,
    help="Fail at once unless this suite checks contract VERSION (such as 1.3) or the "
    "rule-set hash sha256:...",
)
@click.option(
    "--report",
    "report_format",
    type=click.Choice(["json", "md", "html"]),
    default=None,
    help="Print a conformance report (json: schema on docs/running-the-contract-suite.md; "
    "md: a page with a badge line) on stdout instead of the table (which goes to stderr).",
)
@click.option(
    "--report-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the --report to FILE instead of stdout.",
)
@click.option(
    "--options",
    "option_profile",
    type=click.Choice(["suite", "user-defaults", "all"]),
    default="suite",
    show_default=True,
    help="Options the backend is opened with: the suite's (explicit retention and TTLs), "
    "a user's defaults (what siglo.connect gives: no option, the backend's own "
    "defaults, held to siglo's), or all: every rule under each, one "
    "verdict per rule.",
)
@click.option(
    "--compare",
    "compare_url",
    metavar="URL",
    default=None,
    help="Also run the same programs (same seed) against URL and show where the two "
    "backends' verdicts differ.",
)
def check(
    url: str | None,
    examples: int | None,
    seed: int | None,
    profile: str,
    rules: tuple[str, ...],
    junit_xml: Path | None,
    pin: str | None,
    report_format: str | None,
    report_file: Path | None,
    compare_url: str | None,
    option_profile: str,
) -> None:
    """Run the contract suite against the backend at URL.

    URL defaults to the settings' URL ($SIGLO_URL, else url in the nearest siglo.toml),
    then to SQLite on a file (sqlite:///siglo-check.db), or to memory:// when SQLite's
    driver is not installed.
    The suite runs on isolated storage of that backend (a temporary file beside the
    SQLite file, its own Redis key prefix or PostgreSQL schema) and removes it.
    Prints a table of rule id, verdict (pass / FAIL / not supported / declared) and, for
    a failure, the shrunk counter-example, and the contract version and rule-set hash it
    checked. Exits non-zero if any rule fails.
    """
    from siglo_contract.rules import select_rules
    from siglo_contract.runner import run_option_profiles
    from siglo_contract.target import OPTION_PROFILES, plugin_backend
    from siglo_contract.version import (
        CONTRACT_VERSION,
        ContractMismatchError,
        require_contract,
        rule_set_hash,
    )

    if pin is not None:
        try:
            require_contract(pin)
        except ContractMismatchError as exc:
            raise CliError(str(exc), "see the contract's versions on docs/contract.md") from None
    if report_file is not None and report_format is None:
        raise click.UsageError("--report-file needs --report json, md or html")
    if report_file is not None:
        _writable_report(report_file, "--report-file", f"{report_format} report")
    target = resolve_url(url, default=_default_url)
    shown = display_url(target)
    check_port(target)
    # An unknown scheme or a missing driver is said now, before any progress is drawn; a
    # URL the backend refuses, by the run before it prints its plan.
    spec = get_registry().for_url(target)
    spec.load_factory()
    _refuse_without_isolation(spec, shown)
    other_target = None
    if compare_url is not None:  # refused before the run, as the target is
        if not compare_url.strip():
            raise CliError(
                "--compare needs a backend URL, got an empty one", "e.g. --compare memory://"
            )
        other_target = resolve_url(compare_url, default=_default_url)
        check_port(other_target)
        # Opened (and closed) now: its factory refuses an unknown option or a bad value
        # before the run, not after it. Connections are made when first used.
        other_spec = get_registry().for_url(other_target)
        _refuse_without_isolation(other_spec, display_url(other_target))
        try:
            # Through the suite's call of a plugin's factory: a plugin's mistake is named
            # as siglo.connect names it, not an AttributeError of siglo's.
            probe = plugin_backend(other_spec, other_spec.load_factory(), other_target, {})
        except PluginError as exc:
            raise CliError(str(exc), _PLUGIN_HINT) from exc
        asyncio.run(probe.aclose())
    empty = [pattern for pattern in rules if not pattern.strip()]
    if empty:
        raise click.UsageError(
            "--rule '' matches no rule (an empty pattern would run every rule); rule ids "
            "are listed on docs/contract.md"
        )
    if not select_rules(rules):
        raise click.UsageError(
            f"no rule matches {', '.join(rules)}; rule ids are listed on docs/contract.md "
            "(a pattern is a glob or an id prefix)"
        )
    if junit_xml is not None:
        _writable_report(junit_xml, "--junit-xml", "JUnit XML report")
    console = Console(stderr=True)
    # With a report on stdout, the table goes to stderr.
    out = Console(stderr=report_format is not None and report_file is None)
    # A SIGTERM (a timeout, `docker stop`, a cancelled CI job) removes the run's
    # isolated storage as Ctrl-C does; it left a thousand keys behind.
    restore_signals = stopped_by_signals(as_interrupt=True)
    try:
        with (
            _restoring(restore_signals),
            Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress,
        ):
            task = progress.add_task(f"connecting to {escape(shown)}", total=None)

            def on_plan(checks: list[Check]) -> None:
                progress.update(task, total=len(checks), completed=0)
                console.print(f"siglo check {escape(shown)}: {len(checks)} checks", highlight=False)

            def on_progress(event: str, chk: Check, message: str) -> None:
                ids = escape(", ".join(chk.rules))
                if event == "start":
                    progress.update(task, description=f"{chk.name} [dim]({ids})[/dim]")
                    return
                progress.advance(task)
                mark = "[green]✓[/green]" if event == "pass" else f"[red]✗ {escape(message)}[/red]"
                progress.console.print(f"  {mark} {chk.name} [dim]({ids})[/dim]", highlight=False)

            profiles = tuple(OPTION_PROFILES) if option_profile == "all" else (option_profile,)
            report = run_option_profiles(
                target,
                profiles,
                rules=rules or None,
                examples=examples,
                seed=seed,
                profile=profile,
                progress=on_progress,
                on_plan=on_plan,
            )
            other = None
            if other_target is not None:
                progress.update(
                    task, description=f"comparing with {escape(display_url(other_target))}"
                )
                other = run_option_profiles(
                    other_target,
                    profiles,
                    rules=rules or None,
                    examples=examples,
                    seed=report.seed,
                    profile=profile,
                    progress=on_progress,
                    on_plan=on_plan,
                )
    except KeyboardInterrupt:
        # Ctrl-C, SIGTERM or SIGHUP, through the run's clean-up: said, with the status
        # the signal ends a process with (not click's bare "Aborted!" and status 1).
        raise interrupted("siglo check", _STOPPED_HINT) from None
    except PluginError as exc:
        # A plugin's factory that returned something else than a siglo.Backend, or
        # raised an error that is not siglo's: named by the suite as siglo.connect names
        # it (siglo_contract.target.plugin_backend), the plugin's to fix, not siglo's.
        raise CliError(str(exc), _PLUGIN_HINT) from exc
    if STOPPED_BY:
        # The interrupt was swallowed where it landed (Python ignores an exception raised
        # in a finalizer): the run went on to its end and removed its storage, and the
        # signal still decides the status — never 0 for a stopped run.
        raise interrupted("siglo check", _STOPPED_HINT)

    table = Table(title=f"siglo check {escape(report.target)}", show_lines=not report.ok)
    table.add_column("rule")
    table.add_column("verdict")
    table.add_column("counter-example", overflow="fold")
    primary = report.primary
    for res in report.results.values():
        style = _STYLE[res.verdict]
        # A failure's counter-example; for a rule not run, why (no check of it completed);
        # for a declared deviation, the reason the backend gave.
        detail = escape(res.detail) if res.verdict in ("FAIL", "not run") else ""
        if res.verdict == "declared":
            detail = escape(res.declared_reason)
        verdict = res.verdict if res is not primary else "FAIL (primary)"
        table.add_row(res.rule.id, f"[{style}]{verdict}[/{style}]", detail)
    out.print(table)
    if report.storage is not None:
        out.print(
            f"run on isolated storage {display_url(report.storage)}, since removed",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if primary is not None:
        others = ", ".join(r.rule.id for r in report.consequences)
        out.print(
            f"primary failure: {primary.rule.id}"
            + (f"; likely consequences: {others}" if others else ""),
            highlight=False,
            markup=False,
        )
    counts = {v: sum(r.verdict == v for r in report.results.values()) for v in _STYLE}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    out.print(
        f"{summary} in {report.seconds:.1f}s (seed {report.seed}, profile {report.profile}, "
        f"options {' + '.join(report.option_profiles)}; rerun with --seed {report.seed}"
        + ("" if option_profile == "suite" else f" --options {option_profile}")
        + ")",
        highlight=False,
        markup=False,
    )
    out.print(
        f"contract {CONTRACT_VERSION}, rule set {rule_set_hash()}", highlight=False, markup=False
    )
    if junit_xml is not None:
        junit_xml.write_text(report.to_junit_xml(), encoding="utf-8")
    if report_format is not None:
        from siglo_contract.certificate import render, report_document

        text = render(report_document(report, url=target), report_format)
        if report_file is not None:
            report_file.write_text(text, encoding="utf-8")
        else:
            click.echo(text, nl=False)
    if other is not None:
        _print_comparison(out, report, other)
        if _differences(report, other):
            sys.exit(1)
    if not report.ok:
        sys.exit(1)


_STOPPED_HINT: Final = "no verdict; the run's isolated storage was removed: run it again"

_PLUGIN_HINT: Final = (
    "a mistake of the plugin named above, not of siglo: its authors can fix it "
    "(docs/writing-a-backend.md); `siglo backends` lists the installed plugins"
)

_NOT_SELECTED: Final = "not selected"
"""A rule one run judged and the other did not: outside a ``--rule`` selection, judged
on one side only because a failure of it stopped a selected rule's checks there."""


def _judged(a: Report, b: Report) -> list[str]:
    """The rules either run judged, in the order of ``a``'s then ``b``'s."""
    return [*a.results, *(rule_id for rule_id in b.results if rule_id not in a.results)]


def _verdict(report: Report, rule_id: str) -> str:
    res = report.results.get(rule_id)
    return _NOT_SELECTED if res is None else res.verdict


def _differences(a: Report, b: Report) -> list[tuple[str, str, str]]:
    """(rule, verdict on a, verdict on b) for every rule the two runs judged apart —
    a rule only one of them judged included."""
    return [
        (rule_id, _verdict(a, rule_id), _verdict(b, rule_id))
        for rule_id in _judged(a, b)
        if _verdict(a, rule_id) != _verdict(b, rule_id)
    ]


def _print_comparison(out: Console, a: Report, b: Report) -> None:
    """Where two runs of the same programs (one seed) differ, rule by rule, with the
    counter-example of the side that failed."""
    differ = _differences(a, b)
    judged = len(_judged(a, b))
    if not differ:
        out.print(
            f"{a.target} and {b.target} agree on all {judged} rules (seed {a.seed})",
            highlight=False,
            markup=False,
        )
        return
    table = Table(title=f"where {escape(a.target)} and {escape(b.target)} differ", show_lines=True)
    table.add_column("rule")
    table.add_column(escape(a.target))
    table.add_column(escape(b.target))
    table.add_column("counter-example", overflow="fold")
    for rule_id, mine, theirs in differ:
        failed = a if mine == "FAIL" else b if theirs == "FAIL" else None
        detail = "" if failed is None else failed.results[rule_id].detail
        table.add_row(rule_id, mine, theirs, escape(detail))
    out.print(table)
    out.print(
        f"{len(differ)} of {judged} rules differ (seed {a.seed}, the same programs on both)",
        highlight=False,
        markup=False,
    )


def _refuse_without_isolation(spec: BackendSpec, shown: str) -> None:
    """Refuse a backend that declares storage shared between processes (a real store:
    ``multiprocess=True``) but whose plugin registers no ``isolated`` factory: the suite
    would call the plugin's factory on the URL itself for every example, writing its test
    data into the store the URL names and leaving it there (a black-box auditor: 108
    files in a user's store after one run), and could race no two processes on storage
    of its own. A backend of one process's storage (``memory://``, a factory of
    in-memory stores) is checked on it, in the check's own process."""
    if spec.isolated is not None or not spec.multiprocess:
        return
    raise CliError(
        f"backend {spec.name!r} (plugin {spec.plugin!r}) registers no isolated factory: "
        f"siglo check would write its test data into {shown} itself and leave it there",
        "the plugin's registration needs isolated= (a factory of fresh private storage, "
        "docs/writing-a-backend.md); or run the suite under pytest with a factory of "
        "your own (docs/running-the-contract-suite.md)",
    )


@contextlib.contextmanager
def _restoring(restore: Callable[[], None]) -> Iterator[None]:
    """Call ``restore`` on the way out, however the block ends."""
    try:
        yield
    finally:
        restore()
