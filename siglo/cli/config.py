"""``siglo config``: the settings every command (and the application) takes, and where
each was read from."""

from __future__ import annotations

import click

from siglo.cli.common import print_json, print_table
from siglo.cli.errors import cli_settings
from siglo.config import ENVIRONMENT

__all__ = ["config"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def config(as_json: bool) -> None:
    """Show the settings in effect: the settings file (siglo.toml, or [tool.siglo] in
    pyproject.toml, found from here upwards, or --config), then SIGLO_* variables.

    Every command, `siglo worker` included, works with exactly these.
    """
    settings = cli_settings()
    described = settings.describe()
    if as_json:
        print_json(described)
        return
    rows = [(name, _shown(value)) for name, value in described.items() if name != "source"]
    print_table(f"siglo settings (from {settings.source})", ("setting", "value"), rows)
    variables = ", ".join(sorted(ENVIRONMENT))
    click.echo(f"environment variables read: {variables}")


def _shown(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "(none)"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    return "(none)" if value is None else str(value)
