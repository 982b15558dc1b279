"""``siglo export URL > dump.jsonl`` and ``siglo import URL < dump.jsonl`` (see
:mod:`siglo.transfer`): move a store to any other backend, revisions preserved."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import IO

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from siglo.adapter import Capability
from siglo.cli.common import open_store, require
from siglo.cli.errors import resolve_url
from siglo.sentinel import MISSING
from siglo.transfer import ImportReport, export_lines, import_lines

__all__ = ["export", "import_"]


def _progress() -> Progress:
    # On stderr, and only on a terminal: stdout carries the dump.
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),
    )


@click.command()
@click.argument("url", required=False, default=None)
@click.option("--namespace", "-n", default=None, help="Only this namespace (default: all).")
@click.option(
    "--output",
    "-o",
    type=click.File("wb"),
    default="-",
    help="Write here instead of stdout.",
)
def export(url: str | None, namespace: str | None, output: IO[bytes]) -> None:
    """Write every live checkpoint (and the waits of waiting runs) as JSON Lines."""

    async def run() -> int:
        count = 0
        with _progress() as progress:
            task = progress.add_task("exporting", total=None)
            async with open_store(resolve_url(url), existing=True) as backend:
                require(backend, Capability.LISTING)
                lines = export_lines(
                    backend.adapter, namespace=MISSING if namespace is None else namespace
                )
                async for line in lines:
                    output.write(line + b"\n")
                    if line.startswith(b'{"kind":"checkpoint"'):
                        count += 1
                        progress.update(task, description=f"exported {count} checkpoints")
        output.flush()
        return count

    count = asyncio.run(run())
    click.echo(f"exported {count} checkpoint(s)", err=True)


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    yield from source


@click.command(name="import")
@click.argument("url", required=False, default=None)
@click.option(
    "--input",
    "-i",
    "source",
    type=click.File("rb"),
    default="-",
    help="Read here instead of stdin.",
)
def import_(url: str | None, source: IO[bytes]) -> None:
    """Import a dump of `siglo export`: revisions preserved, never over newer data;
    rerun after an interruption to finish (what is there is skipped)."""

    async def run() -> ImportReport:
        with _progress() as progress:
            task = progress.add_task("importing", total=None)

            def advance(report: ImportReport) -> None:
                progress.update(
                    task,
                    description=f"imported {report.imported}, skipped {report.skipped}",
                )

            async with open_store(resolve_url(url)) as backend:
                require(backend, Capability.CHECKPOINTS)
                return await import_lines(backend.adapter, _lines(source), progress=advance)

    report = asyncio.run(run())
    click.echo(
        f"imported {report.imported} checkpoint(s) and {report.waits} wait record(s); "
        f"skipped {report.skipped} already there at that revision or newer"
    )
