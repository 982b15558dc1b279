"""``siglo migrate URL``: bring a SQL backend's schema up to this siglo's version."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from siglo.backend import Backend
from siglo.cli.common import interruptible
from siglo.cli.errors import CliError, cli_settings, resolve_url
from siglo.connect import connect

__all__ = ["migrate"]


def _versioned(backend: Backend) -> tuple[Any, Any]:
    adapter = backend.adapter
    run = getattr(adapter, "migrate", None)
    current = getattr(adapter, "schema_version", None)
    if run is None or current is None:
        raise CliError(
            f"backend {backend.name!r} has no versioned schema: there is nothing to migrate",
            "`siglo migrate` is for the SQL backends (sqlite:///path.db, postgresql://…)",
        )
    return run, current


async def _migrate(url: str, target: int | None, status_only: bool) -> str:
    # Built without options first, to ask whether the backend has a schema at all: a
    # backend that has none (memory://, redis://) would refuse `auto_migrate`. Building
    # a backend opens nothing; the first call does.
    probe = connect(url, settings=cli_settings())
    try:
        _versioned(probe)
    finally:
        await probe.aclose()
    settings = cli_settings()
    backend = connect(url, settings=settings, auto_migrate=False)
    try:
        run, current = _versioned(backend)
        if status_only:
            return f"{backend.name}: schema version {await current()}"
        before, after = await (run() if target is None else run(target=target))
        if before == after:
            message = f"{backend.name}: schema already at version {after}"
        else:
            message = f"{backend.name}: schema migrated from version {before} to {after}"
        # The blind index's triggers come with a store's first token; made here, by the
        # role that migrates (the owner), when the settings say tokens will be saved,
        # so an application role that may not create triggers can save them.
        make_triggers = getattr(backend.adapter, "create_token_triggers", None)
        if settings.blind_index_fields and make_triggers is not None and after >= 7:
            await make_triggers()
            message += "; blind-index triggers in place"
        return message
    finally:
        await backend.aclose()


@click.command()
@click.argument("url", required=False, default=None)
@click.option(
    "--to",
    "target",
    type=click.IntRange(min=1),
    default=None,
    help="Stop at this schema version (default: this siglo's).",
)
@click.option(
    "--status", "status_only", is_flag=True, help="Only print the schema version (changes nothing)."
)
@interruptible("siglo migrate", "run it again to finish")
def migrate(url: str | None, target: int | None, status_only: bool) -> None:
    """Apply the schema migrations of a SQL backend (sqlite:///path.db, postgresql://…).

    URL defaults to $SIGLO_URL. Safe to run from several processes at once. A database
    whose schema is newer than this siglo is left alone and reported as an error. When
    the settings name blind_index_fields, it also creates the blind index's triggers,
    which a role that may not create triggers needs made ahead.
    """
    message = asyncio.run(_migrate(resolve_url(url), target, status_only))
    click.echo(message)
