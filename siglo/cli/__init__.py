"""The ``siglo`` command line: a click group; each command lives in its own module.

Failures are reported by :mod:`siglo.cli.errors` (one ``Error:`` line and a hint, exit
status 1, a traceback only with ``--debug``); commands added to :data:`cli` get that for
free.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from siglo import __version__
from siglo.cli.backends import backends
from siglo.cli.blobs import collect_blobs_command
from siglo.cli.check import check
from siglo.cli.config import config
from siglo.cli.drill import drill
from siglo.cli.errors import DEBUG_ENV, SigloGroup
from siglo.cli.keys import erase_command, rekey_command
from siglo.cli.migrate import migrate
from siglo.cli.store import clean, ls, prune, rm, show
from siglo.cli.transfer import export, import_
from siglo.cli.ui import ui
from siglo.cli.worker import worker
from siglo.config import CONFIG_ENV, reset_settings
from siglo.masking import scrub

__all__ = ["cli", "main"]


@click.group(cls=SigloGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="siglo", message="%(prog)s %(version)s")
@click.option(
    "--debug",
    is_flag=True,
    help=f"Show the full traceback of a failure (or set {DEBUG_ENV}=1).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help=f"The settings file to read (or set {CONFIG_ENV}); default: the nearest "
    "siglo.toml, or pyproject.toml with [tool.siglo].",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, config_file: str | None) -> None:
    """siglo: storage for durable workflows.

    Every command takes its settings (redacted fields, error mode, timeouts, the backend
    URL when none is given) from the settings file and SIGLO_* variables: `siglo config`
    shows them.
    """
    ctx.meta["siglo.debug"] = debug
    if config_file is not None:
        # For this process: every settings load from here on reads this file.
        os.environ[CONFIG_ENV] = config_file
        reset_settings()


cli.add_command(backends)
cli.add_command(check)
cli.add_command(config)
cli.add_command(drill)
cli.add_command(migrate)
cli.add_command(ls)
cli.add_command(show)
cli.add_command(rm)
cli.add_command(prune)
cli.add_command(export)
cli.add_command(import_)
cli.add_command(clean)
cli.add_command(rekey_command)
cli.add_command(erase_command)
cli.add_command(collect_blobs_command)
cli.add_command(worker)
cli.add_command(ui)


def main() -> None:
    """Entry point of the ``siglo`` script and ``python -m siglo``."""
    try:
        cli(prog_name="siglo")
    except Exception as exc:  # only with --debug: every other failure is one line
        # The traceback as Python prints it, with the secrets of URLs and options masked:
        # a driver's exception (the cause) may carry one in its text (siglo.masking).
        sys.stderr.write(scrub("".join(traceback.format_exception(exc))))
        sys.exit(1)
