"""``siglo migrate URL``: bring a SQL backend's schema up to this siglo's version."""

from __future__ import annotations

import asyncio
import sys

import click

from siglo.connect import connect
from siglo.errors import SigloError

__all__ = ["migrate"]


async def _migrate(url: str, target: int | None, status_only: bool) -> str:
    backend = connect(url, auto_migrate=False)
    try:
        adapter = backend.adapter
        run = getattr(adapter, "migrate", None)
        current = getattr(adapter, "schema_version", None)
        if run is None or current is None:
            raise click.ClickException(
                f"backend {backend.name!r} has no versioned schema: nothing to migrate"
            )
        if status_only:
            return f"{backend.name}: schema version {await current()}"
        before, after = await (run() if target is None else run(target=target))
        if before == after:
            return f"{backend.name}: schema already at version {after}"
        return f"{backend.name}: schema migrated from version {before} to {after}"
    finally:
        await backend.aclose()


@click.command()
@click.argument("url")
@click.option("--to", "target", type=int, default=None, help="Stop at this schema version.")
@click.option("--status", "status_only", is_flag=True, help="Only print the schema version.")
def migrate(url: str, target: int | None, status_only: bool) -> None:
    """Apply the schema migrations of a SQL backend (sqlite://, postgresql://).

    Safe to run from several processes at once. A database whose schema is newer than
    this siglo is left alone and reported as an error.
    """
    try:
        message = asyncio.run(_migrate(url, target, status_only))
    except SigloError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(message)
