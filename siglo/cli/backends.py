"""``siglo backends``: every discovered plugin and what its backends can do."""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from siglo.plugins import get_registry

__all__ = ["backends", "describe_plugins"]


def describe_plugins() -> list[dict[str, Any]]:
    """One entry per discovered plugin, as ``siglo backends --json`` prints it."""
    rows: list[dict[str, Any]] = []
    for info in get_registry().plugins.values():
        rows.append(
            {
                "plugin": info.name,
                "distribution": info.distribution,
                "version": info.version,
                "status": "blocked" if info.blocked else ("error" if info.error else "ok"),
                "error": info.error,
                "backends": [
                    {
                        "name": spec.name,
                        "schemes": list(spec.schemes),
                        "capabilities": sorted(c.value for c in spec.capabilities),
                        "driver_installed": spec.driver_installed,
                        "missing_drivers": spec.missing_drivers(),
                        "extra": spec.extra,
                        "install": spec.install_command() if not spec.driver_installed else None,
                        "description": spec.description,
                    }
                    for spec in info.backends
                ],
            }
        )
    return rows


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def backends(as_json: bool) -> None:
    """List discovered backend plugins: schemes, capabilities, driver status."""
    rows = describe_plugins()
    if as_json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    # One scheme and one capability per line keep names whole in a narrow terminal.
    table = Table(title="siglo backends", show_lines=True)
    table.add_column("backend", overflow="fold")
    table.add_column("plugin", overflow="fold")
    table.add_column("driver", overflow="fold", min_width=9)
    table.add_column("schemes", no_wrap=True)
    table.add_column("capabilities", no_wrap=True)
    broken: list[tuple[str, str]] = []
    installs: list[tuple[str, str]] = []
    for row in rows:
        dist = f"{row['distribution'] or '-'} {row['version'] or ''}".strip()
        if row["status"] != "ok":
            broken.append((row["plugin"], row["error"] or "blocked by SIGLO_DISABLE_PLUGINS"))
            continue
        for b in row["backends"]:
            if b["driver_installed"]:
                driver = "[green]installed[/green]"
            else:
                # escape(): rich would read the [redis] of siglo[redis] as markup.
                missing = escape(", ".join(b["missing_drivers"]))
                driver = f"[red]missing[/red] ({missing})"
                installs.append((b["name"], b["install"]))
            table.add_row(
                escape(b["name"]),
                escape(f"{row['plugin']}\n({dist})"),
                driver,
                escape("\n".join(f"{s}://" for s in b["schemes"])),
                "\n".join(b["capabilities"]),
            )
    console = Console()
    console.print(table)
    # Below the table, each on a line of its own that is never wrapped: a command to
    # copy whole, in a terminal of any width (in a cell, 80 columns cut it in three).
    for name, command in installs:
        console.print(
            f"{escape(name)}: install its driver with {escape(command)}",
            highlight=False,
            soft_wrap=True,
        )
    for name, why in broken:
        console.print(
            f"[yellow]plugin {escape(repr(name))} not loaded:[/yellow] {escape(why)}",
            highlight=False,
        )
