"""The ``siglo`` command line: a click group; each command lives in its own module."""

from __future__ import annotations

import click

from siglo import __version__
from siglo.cli.backends import backends
from siglo.cli.check import check
from siglo.cli.migrate import migrate

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="siglo")
def cli() -> None:
    """siglo: storage for durable workflows."""


cli.add_command(backends)
cli.add_command(check)
cli.add_command(migrate)


def main() -> None:
    """Entry point of the ``siglo`` script and ``python -m siglo``."""
    cli(prog_name="siglo")
