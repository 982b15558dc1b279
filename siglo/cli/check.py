"""``siglo check [URL]``: run the contract suite against a backend and print a verdict table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["DEFAULT_URL", "check"]

DEFAULT_URL: Final = "sqlite:///siglo-check.db"
"""The backend ``siglo check`` runs against when given no URL: siglo's embedded default,
SQLite on a file (the suite works in a temporary file of its own and removes it)."""

_STYLE: Final = {
    "pass": "green",
    "FAIL": "bold red",
    "not supported": "yellow",
    "not run": "magenta",
}


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
def check(
    url: str | None,
    examples: int | None,
    seed: int | None,
    profile: str,
    rules: tuple[str, ...],
    junit_xml: Path | None,
) -> None:
    """Run the contract suite against the backend URL resolves to (default: SQLite on a file).

    Prints a table of rule id, verdict (pass / FAIL / not supported) and, for a failure,
    the shrunk counter-example. Exits non-zero if any rule fails.
    """
    from siglo.errors import SigloError
    from siglo_contract.registry import Check
    from siglo_contract.rules import select_rules
    from siglo_contract.runner import run_contract

    target = url or DEFAULT_URL
    console = Console(stderr=True)
    out = Console()
    if not select_rules(rules):
        raise click.UsageError(f"no rule matches {', '.join(rules)}; see docs/contract.md")
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"checking {target}", total=None)

        def on_progress(event: str, chk: Check, message: str) -> None:
            if event == "start":
                progress.update(task, description=f"{target}: {chk.name}")
                return
            progress.advance(task)
            mark = "[green]✓[/green]" if event == "pass" else f"[red]✗ {message}[/red]"
            progress.console.print(f"  {mark} {chk.name}", highlight=False)

        try:
            report = run_contract(
                target,
                rules=rules or None,
                examples=examples,
                seed=seed,
                profile=profile,
                progress=on_progress,
            )
        except SigloError as exc:
            raise click.ClickException(str(exc)) from exc

    table = Table(title=f"siglo check {target}", show_lines=not report.ok)
    table.add_column("rule")
    table.add_column("verdict")
    table.add_column("counter-example", overflow="fold")
    for res in report.results.values():
        style = _STYLE[res.verdict]
        detail = res.detail if res.verdict == "FAIL" else ""
        table.add_row(res.rule.id, f"[{style}]{res.verdict}[/{style}]", detail)
    out.print(table)
    counts = {v: sum(r.verdict == v for r in report.results.values()) for v in _STYLE}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    out.print(
        f"{summary} in {report.seconds:.1f}s (seed {report.seed}, profile {report.profile}; "
        f"rerun with --seed {report.seed})",
        highlight=False,
    )
    if junit_xml is not None:
        junit_xml.write_text(report.to_junit_xml(), encoding="utf-8")
    if not report.ok:
        sys.exit(1)
