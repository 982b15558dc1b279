"""``siglo collect-blobs``: remove the offloaded values no live checkpoint references."""

from __future__ import annotations

import asyncio

import click

from siglo.adapter import Capability
from siglo.blobs import bounded, open_blob_store
from siglo.cli.common import interruptible, open_store, print_json, print_table, require
from siglo.cli.errors import (
    CliError,
    cli_settings,
    resolve_url,
    settings_store,
    store_options_named,
)
from siglo.connect import command_timeout_ms
from siglo.offload import DEFAULT_GRACE_MS, Collected, collect_blobs
from siglo.urls import mask_credentials, query_names


@click.command("collect-blobs")
@click.argument("url", required=False, default=None)
@click.option(
    "--grace-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Keep an unreferenced blob this long past its last put (or its cache entry's end); "
    f"default: the settings' blob_grace_ms ({DEFAULT_GRACE_MS} unless set).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@interruptible("siglo collect-blobs", "what was collected stays collected: run it again to finish")
def collect_blobs_command(url: str | None, grace_ms: int | None, as_json: bool) -> None:
    """Remove blobs of the settings' blob_url that no live checkpoint references."""
    settings = cli_settings()
    if settings.blob_url is None:
        raise CliError(
            "no blob store: the settings name no blob_url",
            "set blob_url (and offload_min_bytes) in siglo.toml or $SIGLO_BLOB_URL",
        )
    blob_url = settings.blob_url
    grace = settings.blob_grace_ms if grace_ms is None else grace_ms

    if settings.url is None:
        # Settings that name no url give their blob store to whatever URL is connected:
        # the collector cannot know it walks every backend whose values are there.
        raise CliError(
            f"the settings ({settings.source}) name a blob store but no url: the blob store "
            "goes with whatever URL is connected, so its collector cannot know which "
            "backends' values it holds, and would take another's for orphans",
            "name the backend whose blob store it is in the settings (url = …), and give "
            "each backend a blob store of its own",
        )
    resolved = resolve_url(url)
    if not settings_store(resolved, settings):
        # The store's blobs are the settings' backend's: walked against another
        # backend's checkpoints, every one of them would look like an orphan.
        raise CliError(
            f"the blob store {mask_credentials(blob_url)} goes with the settings' store "
            f"(url {mask_credentials(settings.url)}{store_options_named(settings)}), not with "
            f"{mask_credentials(resolved)}, which opens another store: collecting it "
            "against another store would remove the blobs its own checkpoints reference",
            "run it without a URL, or with the settings of the backend whose blob store it is",
        )

    async def run() -> Collected:
        # The collector's calls are bounded as the backend's are: the URL's bound, else
        # the settings'.
        bound = settings.command_timeout_ms
        if "command_timeout_ms" in query_names(resolved):
            bound = command_timeout_ms(resolved, {})
        # existing: on a mistyped SQLite path an empty store made here would reference
        # no blob, and every blob past its grace would be taken for an orphan.
        async with open_store(resolved, existing=True) as backend:
            require(backend, Capability.LISTING)
            store = bounded(open_blob_store(blob_url), bound)
            try:
                return await collect_blobs(backend.adapter, store, grace_ms=grace)
            finally:
                await store.aclose()

    done = asyncio.run(run())
    counts = {"referenced": done.referenced, "removed": done.removed, "kept": done.kept}
    if as_json:
        print_json(counts)
        return
    print_table(f"blobs of {mask_credentials(blob_url)}", ("blobs", "count"), list(counts.items()))
