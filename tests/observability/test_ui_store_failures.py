"""The dashboard's actions when the store fails for real (docs/observability.md, "When
the store fails"): a write the database refuses, and a claim whose reply never comes.

An action is the store write: whatever the settings' ``error_mode``, its failure is a
503 and nothing is reported done — under ``best-effort`` a delivery whose save was
refused answered "Done", completed the wait, and the event was lost (a black-box
auditor). And a delivery that fails gives its claim back, the wait open for the next
one — a claim whose reply was lost too, in the background, as a flow's delivery does
(siglo.wait_keys.claim_for_delivery), where it stayed claimed for the whole lease.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest
from _tcp_proxy import proxied_url
from background import background_settled
from ops_support import shared_store
from sql_support import POSTGRES_URL
from ui_support import FIELD, NAMESPACE, SECRET, seed

import siglo
from siglo.ui.server import create_app

KEY = "approve:o-1"


@asynccontextmanager
async def dashboard(url: str, settings: siglo.Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(url, settings=settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as c:
            yield c


async def _form(client: httpx.AsyncClient, action: str, **query: str) -> dict[str, str]:
    """The form of ``action`` on order-1 as its confirmation page serves it (its CSRF
    token in ``csrf``), at the revision the run page shows."""
    run = await client.get("/run", params={"id": "order-1", "namespace": NAMESPACE})
    assert run.status_code == 200, run.text
    revision = re.search(r"<th>revision</th><td>(\d+)</td>", run.text)
    assert revision, run.text
    params = {"id": "order-1", "namespace": NAMESPACE, "revision": revision.group(1), **query}
    confirm = await client.get(f"/confirm/{action}", params=params)
    assert confirm.status_code == 200, confirm.text
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm.text)
    assert token, confirm.text
    return {**params, "csrf": token.group(1)}


def _deliver(form: dict[str, str]) -> dict[str, str]:
    return {**form, "payload": f'{{"by": "ui", "{FIELD}": "{SECRET}"}}'}


async def _refuse(
    backend: siglo.Backend,
    kind: str,
    table: str,
    message: str,
    *,
    events: tuple[str, ...] = ("INSERT", "UPDATE", "DELETE"),
    when: str = "TRUE",
) -> Callable[[], Awaitable[None]]:
    """A trigger in the database that refuses the ``events`` writes of ``table``'s rows
    (``when``: a condition on ``OLD`` and ``NEW``) with ``message``, as a database
    refusing writes does; what drops it again."""
    raw: Any = backend.raw_adapter
    name = f"refuse_{table}"
    table = f"{raw.table_prefix}{table}"
    if kind == "sqlite":
        path = raw.database.path
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            for event in events:
                conn.execute(
                    f"CREATE TRIGGER {name}_{event.lower()} BEFORE {event} ON {table} "
                    f"WHEN {when} BEGIN SELECT RAISE(ABORT, '{message}'); END"
                )

        async def drop() -> None:
            with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
                for event in events:
                    conn.execute(f"DROP TRIGGER {name}_{event.lower()}")

        return drop
    qualified = f'"{raw.schema}".{table}'
    function = f'"{raw.schema}".{name}'
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as pg:
        await pg.execute(
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$"
        )
        await pg.execute(
            f"CREATE TRIGGER {name} BEFORE {' OR '.join(events)} ON {qualified} "
            f"FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION {function}()"
        )

    async def drop_pg() -> None:
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as pg:
            await pg.execute(f"DROP TRIGGER {name} ON {qualified}")

    return drop_pg


@pytest.mark.parametrize("mode", ["best-effort", "warn"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_an_action_whose_write_is_refused_is_a_503_whatever_the_error_mode(
    kind: str, mode: str
) -> None:
    """A trigger refuses every checkpoint write; the dashboard's settings say
    ``best-effort`` (or ``warn``). Deliver, cancel and delete each answer 503 "Storage
    unavailable" and change nothing: the run still waits at its revision, and the wait
    is open again, without the payload (it was given back), so that once the store
    takes writes again the same event is delivered."""
    settings = siglo.Settings(redact_fields=frozenset({FIELD}), error_mode=mode)
    async with shared_store(kind) as backend:
        async with siglo.connect(backend.url, settings=settings) as piped:
            await seed(piped, settings)
        before = await backend.raw_adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
        assert before is not None and before.status == "waiting"
        drop = await _refuse(backend, kind, "checkpoints", "checkpoint write refused")
        async with dashboard(backend.url, settings) as client:
            deliver = _deliver(await _form(client, "deliver", key=KEY))
            for action, form in (
                ("deliver", deliver),
                ("cancel", await _form(client, "cancel")),
                ("delete", await _form(client, "delete")),
            ):
                page = await client.post(f"/actions/{action}", data=form)
                assert page.status_code == 503, (action, page.text)
                assert "Storage unavailable" in page.text, (action, page.text)
                assert "checkpoint write refused" in page.text, (action, page.text)
                assert "Done" not in page.text
                stored = await backend.raw_adapter.get_checkpoint(
                    "order-1", NAMESPACE, fallback=False
                )
                assert stored is not None, action
                assert (stored.revision, stored.status) == (before.revision, "waiting"), action
                assert "event" not in stored.contexts["approve"], action
                wait = await backend.raw_adapter.get_wait_record(KEY, namespace=NAMESPACE)
                assert wait is not None, action
                # Given back as it was: open for the next delivery, without this payload.
                assert (wait.status, wait.claimant_id, wait.event_payload) == (
                    "waiting",
                    None,
                    None,
                ), action
            await drop()
            done = await client.post("/actions/deliver", data=deliver)
            assert done.status_code == 200, done.text
            assert "continues on the next" in done.text
        stored = await backend.raw_adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
        assert stored is not None and stored.status == "running"
        assert stored.contexts["approve"]["event"] == {"by": "ui", FIELD: "[REDACTED]"}
        wait = await backend.raw_adapter.get_wait_record(KEY, namespace=NAMESPACE)
        assert wait is not None and wait.status == "completed"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_give_back_the_store_refuses_is_made_again_in_the_background(kind: str) -> None:
    """The delivery's save is refused, and so, at first, is the release that gives its
    claim back (a trigger on each). The page says why nothing was delivered (the save),
    and the claim is released in the background, with its claimant, once the store takes
    the release: before, the wait stayed claimed for the whole claim lease (60 s)."""
    settings = siglo.Settings(redact_fields=frozenset({FIELD}))
    async with shared_store(kind) as backend:
        async with siglo.connect(backend.url, settings=settings) as piped:
            await seed(piped, settings)
        drop_saves = await _refuse(backend, kind, "checkpoints", "checkpoint write refused")
        drop_releases = await _refuse(
            backend,
            kind,
            "wait_records",
            "release refused",
            events=("UPDATE",),
            when="OLD.status = 'claimed' AND NEW.status = 'waiting'",
        )
        async with dashboard(backend.url, settings) as client:
            form = _deliver(await _form(client, "deliver", key=KEY))
            page = await client.post("/actions/deliver", data=form)
            assert page.status_code == 503, page.text
            assert "checkpoint write refused" in page.text  # why nothing was delivered
            wait = await backend.raw_adapter.get_wait_record(KEY, namespace=NAMESPACE)
            assert wait is not None and wait.status == "claimed"  # the release refused
            await drop_releases()
            await background_settled()  # the give-back's tries: at once, … 3 s later
            wait = await backend.raw_adapter.get_wait_record(KEY, namespace=NAMESPACE)
            assert wait is not None
            assert wait.status == "waiting" and wait.claimant_id is None, wait
            await drop_saves()
            done = await client.post("/actions/deliver", data=form)
            assert done.status_code == 200, done.text


def _load_redis_scripts(port: int) -> None:
    """Every siglo script in the server's cache: the reply dropped is then the claim's
    own, not a ``NOSCRIPT`` (after which the script has not run)."""
    import redis

    from siglo_redis import scripts

    with redis.Redis(host="127.0.0.1", port=port) as client:
        for script in vars(scripts).values():
            if isinstance(script, scripts.Script):
                client.script_load(script.source)


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_a_delivery_whose_claim_reply_is_lost_gives_the_claim_back(kind: str) -> None:
    """The dashboard's claim reaches the store and is stored, and its reply is dropped
    with the connection (a proxy between them): 503 "Outcome unknown", and the claim is
    given back in the background with the claimant made before the call, so the wait is
    open again at once — before, it stayed claimed by ``siglo-ui-…`` for the whole claim
    lease (60 s) and every delivery was refused until then."""
    settings = siglo.Settings(redact_fields=frozenset({FIELD}))
    default_port = 6379 if kind == "redis" else 5432
    async with shared_store(kind) as backend:
        async with siglo.connect(backend.url, settings=settings) as piped:
            await seed(piped, settings)
        with proxied_url(backend.url, default_port) as (url, proxy):
            if kind == "redis":
                _load_redis_scripts(proxy.upstream[1])
            async with dashboard(url, settings) as client:
                form = _deliver(await _form(client, "deliver", key=KEY))
                # The claimant id is in the claim's request alone.
                proxy.lose_reply_to(b"siglo-ui-")
                lost = await client.post("/actions/deliver", data=form)
                assert proxy.replies_lost == 1
                assert lost.status_code == 503, lost.text
                assert "Outcome unknown" in lost.text
                await background_settled()  # the give-back's tries: at once, … 3 s later
                wait = await backend.raw_adapter.get_wait_record(KEY, namespace=NAMESPACE)
                assert wait is not None
                assert wait.status == "waiting" and wait.claimant_id is None, wait
                run = await backend.raw_adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
                assert run is not None and run.status == "waiting"
                # Deliverable again at once, not after the claim's lease.
                again = await client.post("/actions/deliver", data=form)
                assert again.status_code == 200, again.text
        stored = await backend.raw_adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
        assert stored is not None and stored.status == "running"
        assert stored.contexts["approve"]["event"]["by"] == "ui"
