"""After a long outage, PostgreSQL calls succeed again as soon as the server is back.

psycopg_pool replaces a broken connection by attempts 1, 2, 4, 8 … s apart, for as long
as its ``reconnect_timeout`` (5 min by default): after an outage of 20 s its next attempt
could come up to 11 s after the server was back, every call failing meanwhile (a
black-box auditor measured 8–9 s; here, after 9 s, 5 s), and by that schedule up to a
minute after an outage of two minutes. siglo bounds each
round of attempts (``siglo_postgres.database.RECONNECT_ROUND_S``); a caller who finds
the pool empty then starts the next round at once.

The fault is real: a TCP proxy in front of the shared PostgreSQL that closes every
connection and refuses new ones, what a stopped server looks like from the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from _tcp_proxy import TcpProxy, proxied_url
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo_postgres import drop_schema

OUTAGE_S = 9.0
"""Past the pool's attempts at 1, 3 and 7 s: unbounded, the next comes at 15 s."""


@contextlib.asynccontextmanager
async def _through_a_proxy(**options: Any) -> AsyncIterator[tuple[siglo.Backend, TcpProxy]]:
    """A backend on the shared PostgreSQL through a proxy, under a schema of its own
    (dropped afterwards), with checkpoint ``s`` at revision 1."""
    require_postgres()
    schema = "siglo_test_reconnect_" + os.urandom(4).hex()
    with proxied_url(POSTGRES_URL, 5432) as (via_proxy, proxy):
        backend = siglo.connect(via_proxy, schema=schema, connect_timeout_ms=1000, **options)
        try:
            await backend.adapter.save_checkpoint(
                siglo.Checkpoint(stack_id="s", revision=1, timestamp=1)
            )
            yield backend, proxy
        finally:
            await backend.aclose()
            await drop_schema(POSTGRES_URL, schema)


async def test_calls_succeed_within_seconds_of_the_end_of_a_long_outage() -> None:
    async with _through_a_proxy(command_timeout_ms=1000, pool_max_size=4) as (backend, proxy):
        proxy.cut()
        failed = 0
        ends = time.monotonic() + OUTAGE_S
        while time.monotonic() < ends:  # callers keep calling, as a web app's do
            try:
                await backend.adapter.get_checkpoint("s")
            except siglo.StorageAdapterError:
                failed += 1
            await asyncio.sleep(0.2)
        assert failed > 0  # the outage was met
        proxy.restore()
        back = time.monotonic()
        errors: list[str] = []
        while True:
            try:
                loaded = await backend.adapter.get_checkpoint("s")
                break
            except siglo.StorageAdapterError as exc:
                errors.append(str(exc))
            waited = time.monotonic() - back
            assert waited < 2.5, f"still failing {waited:.1f} s after the outage: {errors[-1]}"
            await asyncio.sleep(0.1)
        assert loaded is not None and loaded.revision == 1


async def test_a_call_that_waited_through_the_outage_succeeds_soon_after_it() -> None:
    """A call that began during the outage waits for a connection, within its bound; the
    pool gives up on its round of attempts meanwhile, and opens a connection again only
    for a caller who asks: siglo's waiting caller asks again every second
    (``siglo_postgres.checkout.ASK_AGAIN_S``), so it — and the loads merged into its own
    — succeed about a second after the server is back, not at the end of the bound (a
    black-box auditor: 8 s after a 2 s outage)."""
    options = {"command_timeout_ms": 30_000, "pool_timeout_ms": 30_000}
    async with _through_a_proxy(**options) as (backend, proxy):
        proxy.cut()
        waited = asyncio.ensure_future(backend.adapter.get_checkpoint("s"))
        await asyncio.sleep(3.0)  # past a round of the pool's attempts (2 s)
        assert not waited.done()
        proxy.restore()
        back = time.monotonic()
        later = asyncio.ensure_future(backend.adapter.get_checkpoint("s"))
        done, _ = await asyncio.wait({waited, later}, timeout=2.5)
        assert done == {waited, later}, f"still waiting {time.monotonic() - back:.1f} s after"
        for call in (waited, later):
            loaded = call.result()
            assert loaded is not None and loaded.revision == 1
