"""``siglo ui``: its pages and actions over HTTP, on the three real backends, through the
one configuration (redacted fields stay redacted, a URL's password is never shown,
actions are confirmed, CSRF-protected, compare-and-set) — docs/observability.md."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
import pytest
from _tcp_proxy import tcp_proxy
from ops_support import DURABLE_KINDS, shared_store, with_option
from raw_storage import raw_bytes
from ui_support import FIELD, NAMESPACE, ORDERS, SECRET, seed

import siglo
from siglo.coordination import LockBase, LockState, holder_label
from siglo.errors import CapabilityNotSupportedError
from siglo.locking import Lease, current_lease
from siglo.sentinel import MISSING
from siglo.ui import data
from siglo.ui.server import create_app
from siglo.workflow import Worker
from siglo.workflow.flow import STEP_CACHE_KEY

SETTINGS = siglo.Settings(redact_fields=frozenset({FIELD}))


@asynccontextmanager
async def dashboard(
    url: str,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    settings: siglo.Settings = SETTINGS,
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(url, settings=settings, token=token, loopback_only=host == "127.0.0.1")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}:8765") as c:
            yield c


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found.group(1)


@pytest.fixture(params=DURABLE_KINDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[siglo.Backend]:
    async with shared_store(request.param) as backend:
        async with siglo.connect(backend.url, settings=SETTINGS) as piped:
            await seed(piped, SETTINGS, bulk=60)
        yield backend


async def test_runs_page_lists_counts_filters_and_pages(store: siglo.Backend) -> None:
    async with dashboard(store.url) as client:
        page = (await client.get("/runs")).text
        # 60 bulk runs (12 of each status) and 3 orders (2 waiting, 1 completed).
        counts = dict(re.findall(r'id="count-(\w+)">\w+ <b>(\d+)</b>', page))
        assert counts == {
            "running": "12",
            "waiting": "14",
            "completed": "13",
            "failed": "12",
            "cancelled": "12",
        }
        waiting = (await client.get("/runs", params={"status": "waiting"})).text
        assert "order-1" in waiting and "bulk-00000" not in waiting
        shop = (await client.get("/runs", params={"namespace": NAMESPACE})).text
        assert re.findall(r">(order-\d)</a>", shop) and "bulk-" not in shop
        nightly = (await client.get("/runs", params={"workflow": "nightly", "limit": 25})).text
        assert nightly.count(">nightly<") == 25 and ">hourly<" not in nightly
        seen: list[str] = []
        url: str | None = "/runs?workflow=nightly&limit=25"
        while url is not None:
            text = (await client.get(url.replace("&amp;", "&"))).text
            seen += re.findall(r">(bulk-\d+)</a>", text)
            found = re.search(r'href="([^"]+)" id="next"', text)
            url = found.group(1) if found else None
        assert len(seen) == len(set(seen)) == 30
        bad = await client.get("/runs", params={"status": "sleeping"})
        assert bad.status_code == 400 and "unknown status &#39;sleeping&#39;" in bad.text


async def test_run_page_keeps_redacted_fields_redacted(store: siglo.Backend) -> None:
    async with dashboard(store.url) as client:
        page = await client.get("/run", params={"id": "order-1", "namespace": NAMESPACE})
        assert page.status_code == 200
        text = page.text
        assert SECRET not in text
        assert "[REDACTED]" in text
        assert "approve:o-1" in text and 'id="deliver"' in text
        assert "step <b>take</b> finished" in text
        missing = await client.get("/run", params={"id": "order-1"})
        assert missing.status_code == 404


async def _deliver_form(client: httpx.AsyncClient) -> dict[str, str]:
    """The deliver form of order-1's wait, with the card in its payload, as the
    confirmation page the run page links to serves it (its CSRF token in ``csrf``, the
    revision the run page showed in ``revision``)."""
    run = await client.get("/run", params={"id": "order-1", "namespace": NAMESPACE})
    link = re.search(r'id="deliver" href="(/confirm/deliver\?[^"]+)"', run.text)
    assert link, run.text
    confirm = await client.get(link.group(1).replace("&amp;", "&"))
    assert confirm.status_code == 200, confirm.text
    revision = re.search(r'name="revision" value="(\d+)"', confirm.text)
    assert revision, confirm.text
    return {
        "id": "order-1",
        "namespace": NAMESPACE,
        "key": "approve:o-1",
        "revision": revision.group(1),
        "payload": f'{{"by": "ui", "{FIELD}": "{SECRET}"}}',
        "csrf": csrf(confirm.text),
    }


async def test_deliver_cancel_and_delete_are_confirmed_csrf_checked_and_stored(
    store: siglo.Backend,
) -> None:
    async with dashboard(store.url) as client:
        form = await _deliver_form(client)
        token = form.pop("csrf")
        # No token, a stale token, another origin: refused, nothing delivered.
        assert (await client.post("/actions/deliver", data=form)).status_code == 403
        stale = {**form, "csrf": "0" * 64}
        assert (await client.post("/actions/deliver", data=stale)).status_code == 403
        other = await client.post(
            "/actions/deliver",
            data={**form, "csrf": token},
            headers={"origin": "http://evil.example"},
        )
        assert other.status_code == 403
        bad_json = await client.post(
            "/actions/deliver", data={**form, "payload": "{", "csrf": token}
        )
        assert bad_json.status_code == 409 and "not JSON" in bad_json.text
        done = await client.post("/actions/deliver", data={**form, "csrf": token})
        assert done.status_code == 200, done.text
        assert "continues on the next" in done.text
        again = await client.post("/actions/deliver", data={**form, "csrf": token})
        assert again.status_code == 409 and "not open" in again.text

        # Stale revision: refused; the right one: cancelled.
        run = (await client.get("/run", params={"id": "order-2", "namespace": NAMESPACE})).text
        revision = re.search(r"<th>revision</th><td>(\d+)</td>", run)
        assert revision
        rev = int(revision.group(1))
        link = re.search(r'href="(/confirm/cancel\?[^"]+)"', run)
        assert link
        page = (await client.get(link.group(1).replace("&amp;", "&"))).text
        assert f'name="revision" value="{rev}"' in page
        cancel = {"id": "order-2", "namespace": NAMESPACE, "csrf": csrf(page)}
        stale_cancel = await client.post("/actions/cancel", data={**cancel, "revision": rev - 1})
        assert stale_cancel.status_code == 409 and "changed since" in stale_cancel.text
        ok = await client.post("/actions/cancel", data={**cancel, "revision": str(rev)})
        assert ok.status_code == 200 and "cancelled order-2" in ok.text
        deleted = await client.post(
            "/actions/delete",
            data={"id": "bulk-00001", "namespace": "", "csrf": csrf(page), "revision": "1"},
        )
        assert deleted.status_code == 200 and "deleted bulk-00001" in deleted.text
        gone = await client.get("/run", params={"id": "bulk-00001"})
        assert gone.status_code == 404

    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        # The event is stored redacted, and a worker with the flow finishes the run.
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        stored = await backend.raw_adapter.get_checkpoint("order-1", NAMESPACE)
        assert stored is not None and stored.status == "running"
        assert SECRET not in repr(stored.contexts)
        await Worker(manager, [ORDERS]).run_once()
        finished = await backend.adapter.get_checkpoint("order-1", NAMESPACE)
        assert finished is not None and finished.status == "completed"
        assert finished.contexts["approve"]["output"]["approved"]["by"] == "ui"
        cancelled = await backend.adapter.get_checkpoint("order-2", NAMESPACE)
        assert cancelled is not None and cancelled.status == "cancelled"


async def test_the_token_and_the_loopback_names(store: siglo.Backend) -> None:
    async with dashboard(store.url, token="t0ken") as client:
        assert (await client.get("/runs")).status_code == 401
        first = await client.get("/runs", params={"token": "t0ken"})
        assert first.status_code == 303 and "token" not in first.headers["location"]
        assert (await client.get("/runs")).status_code == 200  # the cookie
        client.cookies.clear()
        bearer = await client.get("/runs", headers={"authorization": "Bearer t0ken"})
        assert bearer.status_code == 200
        assert (await client.get("/runs", params={"token": "wrong"})).status_code == 401
    async with dashboard(store.url) as client:
        rebound = await client.get("/runs", headers={"host": "attacker.example:8765"})
        assert rebound.status_code == 421
        # A name that only starts like a loopback address resolves anywhere.
        lookalike = await client.get("/runs", headers={"host": "127.attacker.example:8765"})
        assert lookalike.status_code == 421
        for loopback in ("127.0.0.2:8765", "localhost:8765", "[::1]:8765"):
            assert (await client.get("/runs", headers={"host": loopback})).status_code == 200


async def test_deliver_from_a_dashboard_without_the_settings_keeps_the_runs_redaction(
    store: siglo.Backend,
) -> None:
    """An operator's dashboard started without the application's ``redact_fields``
    delivers an event to a run the application saved with them: the wait record stores
    the payload redacted by the run's own keys, as ``Flow.deliver`` does."""
    async with dashboard(store.url, settings=siglo.Settings()) as client:
        done = await client.post("/actions/deliver", data=await _deliver_form(client))
        assert done.status_code == 200, done.text
    record = await store.adapter.get_wait_record("approve:o-1", namespace=NAMESPACE)
    assert record is not None and record.event_payload == {"by": "ui", FIELD: "[REDACTED]"}
    assert SECRET.encode() not in await raw_bytes(store.name, store)


async def test_a_delivery_to_a_run_that_moved_on_stores_nothing(store: siglo.Backend) -> None:
    """The documented crash window: the wait is open but the run's checkpoint is not
    ``waiting`` (its process died before saving it). The dashboard refuses — "nothing was
    delivered" — and indeed stores nothing: no payload left in the wait record, which
    stays open for the run's own delivery."""
    stored = await store.adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
    assert stored is not None and stored.status == "waiting"
    await store.adapter.save_checkpoint(
        stored.replace(status="running", revision=stored.revision + 1)
    )
    async with dashboard(store.url) as client:
        done = await client.post("/actions/deliver", data=await _deliver_form(client))
        assert "nothing was delivered" in done.text, done.text
    record = await store.adapter.get_wait_record("approve:o-1", namespace=NAMESPACE)
    assert record is not None and record.status == "waiting", record
    assert record.event_payload is None and record.claimant_id is None, record


@pytest.mark.parametrize("says", ["no creation time", "no wait record"])
async def test_a_run_that_does_not_say_which_record_it_waits_on_is_delivered_to(
    store: siglo.Backend, says: str
) -> None:
    """A run whose checkpoint does not say when its wait record was created (a TypeScript
    worker's, an older siglo's), or keeps none, is taken to wait on the open record of
    its key, as a flow's delivery takes it (records.another_record_of_its_key): the
    dashboard refused it, "gone, or waits on another wait"."""
    stored = await store.adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
    assert stored is not None and stored.status == "waiting"
    metadata = dict(stored.metadata or {})
    if says == "no creation time":
        metadata["waitRecord"] = {
            k: v for k, v in metadata["waitRecord"].items() if k != "createdAt"
        }
    else:
        del metadata["waitRecord"]
    await store.adapter.save_checkpoint(
        stored.replace(metadata=metadata, revision=stored.revision + 1)
    )
    async with dashboard(store.url) as client:
        done = await client.post("/actions/deliver", data=await _deliver_form(client))
        assert done.status_code == 200 and "continues on the next" in done.text, done.text
    record = await store.adapter.get_wait_record("approve:o-1", namespace=NAMESPACE)
    assert record is not None and record.status == "completed", record
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        await Worker(manager, [ORDERS]).run_once()
        finished = await backend.adapter.get_checkpoint("order-1", NAMESPACE)
        assert finished is not None and finished.status == "completed"


async def test_a_delivery_the_size_guard_refuses_leaves_the_wait_as_it_was(
    store: siglo.Backend,
) -> None:
    """An event that makes the run's checkpoint too large is refused
    (``DocumentTooLargeError``), and the wait is given back as it was: the claim had
    stored the payload in the record, and the release kept it — an event never
    delivered, over the size bound, on a wait still open (a black-box auditor)."""
    from siglo.errors import DocumentTooLargeError
    from siglo.ui.actions import deliver_event

    bounded = siglo.Settings(redact_fields=SETTINGS.redact_fields, max_document_bytes=20_000)
    async with siglo.connect(store.url, settings=bounded) as backend:
        manager = siglo.StorageManager(backend)
        before = await backend.adapter.get_wait_record("approve:o-1", namespace=NAMESPACE)
        assert before is not None and before.status == "waiting"
        with pytest.raises(DocumentTooLargeError):
            await deliver_event(
                manager, "approve:o-1", NAMESPACE, {"doc": "x" * 30_000}, run_id="order-1"
            )
        after = await backend.adapter.get_wait_record("approve:o-1", namespace=NAMESPACE)
        assert after is not None and after.status == "waiting", after
        assert after.event_payload == before.event_payload and after.claimant_id is None
        stored = await backend.adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
        assert stored is not None and stored.status == "waiting"


async def test_a_delivery_names_the_run_and_a_wait_of_another_run_is_refused(
    store: siglo.Backend,
) -> None:
    """The confirmation says "deliver to the wait K of run R": a form naming run
    ``order-1`` with the wait of ``order-2`` (an edited form, a stale tab) is refused and
    stores nothing — the wait of the other run stays open, without a payload — and a
    form naming no run is refused."""
    async with dashboard(store.url) as client:
        form = await _deliver_form(client)
        crossed = await client.post("/actions/deliver", data={**form, "key": "approve:o-2"})
        assert crossed.status_code == 409, crossed.text
        assert "a wait of run &#39;order-2&#39;, not of run &#39;order-1&#39;" in crossed.text
        assert "nothing was delivered" in crossed.text
        nameless = await client.post("/actions/deliver", data={**form, "id": ""})
        assert nameless.status_code == 409 and "names no run" in nameless.text
    for key, run in (("approve:o-1", "order-1"), ("approve:o-2", "order-2")):
        record = await store.adapter.get_wait_record(key, namespace=NAMESPACE)
        assert record is not None and record.status == "waiting", record
        assert record.event_payload is None and record.claimant_id is None, record
        stored = await store.adapter.get_checkpoint(run, NAMESPACE, fallback=False)
        assert stored is not None and stored.status == "waiting", stored


async def _twice_waiting(url: str) -> Any:
    """A run ``twice-1`` of a flow that waits on the same key in two steps, waiting in
    the first; returns the flow."""
    from siglo import Step, WorkflowSuspended, flow, wait_for_event

    async def first(_: Any) -> Any:
        return {"first": await wait_for_event("again:t1")}

    async def second(value: Any) -> Any:
        return {"second": await wait_for_event("again:t1"), **value}

    twice = flow(Step.create("first", first), Step.create("second", second), name="twice")
    async with siglo.connect(url, settings=SETTINGS) as backend:
        with pytest.raises(WorkflowSuspended):
            await twice.run(None, manager=siglo.StorageManager(backend), stack_id="twice-1")
    return twice


async def test_a_stale_deliver_page_does_not_deliver_to_the_runs_next_wait(
    store: siglo.Backend,
) -> None:
    """The confirmation was shown for the run's first wait; the run was delivered
    elsewhere and now waits again on the same key. Posting that page delivered into the
    new wait (a black-box auditor): the form now carries the revision the page showed,
    and the run moved past it, so it is refused and nothing is stored."""
    from siglo import WorkflowSuspended

    twice = await _twice_waiting(store.url)
    async with dashboard(store.url) as client:
        run = await client.get("/run", params={"id": "twice-1"})
        link = re.search(r'id="deliver" href="(/confirm/deliver\?[^"]+)"', run.text)
        assert link, run.text
        confirm = await client.get(link.group(1).replace("&amp;", "&"))
        assert confirm.status_code == 200, confirm.text
        revision = re.search(r'name="revision" value="(\d+)"', confirm.text)
        assert revision
        async with siglo.connect(store.url, settings=SETTINGS) as backend:
            with pytest.raises(WorkflowSuspended):  # delivered elsewhere: waits again
                await twice.deliver(
                    "again:t1", {"by": "api"}, manager=siglo.StorageManager(backend)
                )
        form = {
            "id": "twice-1",
            "namespace": "",
            "key": "again:t1",
            "revision": revision.group(1),
            "payload": '{"by": "stale page"}',
            "csrf": csrf(confirm.text),
        }
        stale = await client.post("/actions/deliver", data=form)
        assert stale.status_code == 409, stale.text
        assert "changed since the page was shown" in stale.text
    record = await store.adapter.get_wait_record("again:t1")
    assert record is not None and record.status == "waiting", record
    assert record.event_payload is None and record.claimant_id is None, record
    stored = await store.adapter.get_checkpoint("twice-1", fallback=False)
    assert stored is not None and stored.status == "waiting"
    assert "stale page" not in repr(stored.contexts)


async def test_a_confirmation_shows_only_what_is_stored(store: siglo.Backend) -> None:
    """A confirmation page is rendered from a link's parameters: for a run that is not
    there, at a revision it is not at, or a wait that is not one of it, it was a real
    confirmation all the same (a black-box auditor). It reads the run: 404 or 409."""
    async with dashboard(store.url) as client:
        run = (await client.get("/run", params={"id": "order-1", "namespace": NAMESPACE})).text
        revision = re.search(r"<th>revision</th><td>(\d+)</td>", run)
        assert revision
        rev = int(revision.group(1))
        base = {"id": "order-1", "namespace": NAMESPACE, "revision": str(rev)}
        ok = await client.get("/confirm/cancel", params=base)
        assert ok.status_code == 200 and f'name="revision" value="{rev}"' in ok.text
        refused = {
            "/confirm/delete": ({**base, "id": "no-such-run"}, 404, "no run &#39;no-such-run&#39;"),
            "/confirm/cancel": ({**base, "revision": str(rev + 7)}, 409, "changed since"),
            "/confirm/deliver": ({**base, "key": "approve:o-2"}, 404, "has no wait"),
        }
        for path, (params, status, said) in refused.items():
            page = await client.get(path, params=params)
            assert page.status_code == status and said in page.text, (path, page.text)
            assert 'id="confirm-button"' not in page.text
        bad = await client.get("/confirm/cancel", params={**base, "revision": "x"})
        assert bad.status_code == 400 and "revision must be a whole number" in bad.text


async def test_bad_listing_parameters_and_a_gone_run_say_what_is_wrong(
    store: siglo.Backend,
) -> None:
    async with dashboard(store.url) as client:
        for params, said in (
            ({"limit": "abc"}, "limit must be a whole number, got &#39;abc&#39;"),
            ({"page": "abc"}, "page must be a whole number"),
            # int() reads these: a number siglo reads from text takes ASCII digits.
            ({"limit": "1_0"}, "limit must be a whole number"),
            ({"page": "٢"}, "page must be a whole number"),
            ({"namespace": NAMESPACE, "no_namespace": "1"}, "not both"),
        ):
            page = await client.get("/runs", params=params)
            assert page.status_code == 400 and said in page.text, (params, page.text)
        run = (await client.get("/run", params={"id": "order-2", "namespace": NAMESPACE})).text
        link = re.search(r'href="(/confirm/delete\?[^"]+)"', run)
        assert link
        page = (await client.get(link.group(1).replace("&amp;", "&"))).text
        revision = re.search(r'name="revision" value="(\d+)"', page)
        assert revision
        form = {
            "id": "order-2",
            "namespace": NAMESPACE,
            "revision": revision.group(1),
            "csrf": csrf(page),
        }
        assert (await client.post("/actions/delete", data=form)).status_code == 200
        again = await client.post("/actions/delete", data=form)
        assert again.status_code == 409 and "it is gone" in again.text, again.text


async def test_a_listing_loaded_anew_counts_anew(store: siglo.Backend) -> None:
    """The runs page's counts are reused for ten seconds while paging on through one
    listing; a fresh load of its first page reused them too, counting runs removed (or
    expired) since (a black-box auditor). A load without a cursor counts again; paging
    on still reuses the first page's counts."""
    async with dashboard(store.url) as client:

        def counted(page: str) -> dict[str, str]:
            return dict(re.findall(r'id="count-(\w+)">\w+ <b>(\d+)</b>', page))

        first = (await client.get("/runs", params={"limit": "25"})).text
        assert counted(first)["completed"] == "13"
        next_link = re.search(r'href="(/runs\?[^"]*cursor=[^"]+)"', first)
        assert next_link
        assert await store.adapter.delete_checkpoint("order-3", NAMESPACE)  # completed
        paged = (await client.get(next_link.group(1).replace("&amp;", "&"))).text
        assert counted(paged) == counted(first)  # paging on: the listing's counts
        again = (await client.get("/runs", params={"limit": "25"})).text
        assert counted(again)["completed"] == "12", counted(again)


async def test_a_url_password_is_never_shown() -> None:
    from sql_support import POSTGRES_URL, require_postgres

    require_postgres()
    async with shared_store("postgres") as backend:
        url = backend.url.replace("postgresql://", "postgresql://postgres:hunter2-pw@", 1)
        if "@" in backend.url:
            url = re.sub(r"//([^:@/]+)(:[^@/]*)?@", r"//\1:hunter2-pw@", backend.url, count=1)
        assert POSTGRES_URL
        async with dashboard(url) as client:
            for path in ("/runs", "/attention"):
                page = (await client.get(path)).text
                assert "hunter2-pw" not in page
                assert "***" in page


async def test_a_value_stored_before_its_field_was_redacted_is_not_shown(
    store: siglo.Backend,
) -> None:
    unredacted = siglo.Settings()
    async with siglo.connect(store.url, settings=unredacted) as backend:
        manager = siglo.StorageManager(backend, settings=unredacted)
        stack = manager.create_stack("legacy-1", metadata={"note": {FIELD: SECRET}})
        stack.set("pay", FIELD, SECRET)
        await manager.save(stack, expected_revision=0)
        stored = await backend.raw_adapter.get_checkpoint("legacy-1")
        assert stored is not None and stored.contexts["pay"][FIELD] == SECRET
    async with dashboard(store.url) as client:
        page = await client.get("/run", params={"id": "legacy-1"})
        assert page.status_code == 200
        assert SECRET not in page.text
        assert page.text.count("[REDACTED]") >= 2  # the context, the metadata (the stream)
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_any_bind_beyond_loopback_needs_a_token_and_generate_makes_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from siglo.cli.errors import CliError
    from siglo.cli.ui import TOKEN_ENV, build_app

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(CliError, match="a token is required"):
        build_app("memory://", "0.0.0.0", None)
    _, url, token = build_app("memory://", "0.0.0.0", "generate")
    assert url == "memory://" and token is not None and len(token) >= 32
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")
    assert build_app("memory://", "192.0.2.7", None)[2] == "from-the-environment"
    assert build_app("memory://", "127.0.0.1", None)[2] == "from-the-environment"


async def test_stored_markup_is_shown_as_text(store: siglo.Backend) -> None:
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        stack = manager.create_stack("<script>alert(1)</script>", workflow_id="<i>w</i>")
        stack.set("<b>step</b>", "note", "<img src=x onerror=alert(2)>")
        await manager.save(stack, expected_revision=0)
    async with dashboard(store.url) as client:
        listing = (await client.get("/runs", params={"workflow": "<i>w</i>"})).text
        page = (await client.get("/run", params={"id": "<script>alert(1)</script>"})).text
    for html in (listing, page):
        assert "<script>alert(1)" not in html and "<i>w</i>" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in page and "<b>step" not in page


async def test_the_run_and_attention_pages_show_the_lock_holder_and_lease(
    store: siglo.Backend,
) -> None:
    """A process holds a running run's workflow lock: the run page names the holder (a
    label, never the token that releases the lock) and when its lease expires, and the
    attention page lists it under held locks with the same; another running run's lock
    reads free, and the run is listed as crashed."""
    async with siglo.connect(store.url, settings=SETTINGS) as holder:
        running = await holder.adapter.list_checkpoints(status="running", limit=2)
        held_id, free_id = (s.stack_id for s in running.items[:2])
        holding, release = asyncio.Event(), asyncio.Event()
        leases: list[Lease] = []

        async def hold() -> None:
            lease = current_lease()
            assert lease is not None
            leases.append(lease)
            holding.set()
            await release.wait()

        task = asyncio.create_task(holder.adapter.with_workflow_lock(held_id, hold))
        await holding.wait()
        try:
            (lease,) = leases
            label = holder_label(lease.token)
            async with dashboard(store.url) as client:
                run = (await client.get("/run", params={"id": held_id})).text
                attention = (await client.get("/attention")).text
                free = (await client.get("/run", params={"id": free_id})).text
        finally:
            release.set()
            await task
    lock_cell = re.search(r'<td id="lock">(.*?)</td></tr>', run, re.S)
    assert lock_cell, run
    assert f'held by <code id="lock-holder">{label}</code>' in lock_cell.group(1)
    assert lease.token not in run and lease.token not in attention
    ttl_s = holder.adapter.workflow_lock_ttl_ms // 1000
    left = re.search(r'<span id="lock-lease">expires in (\d+) s</span>', lock_cell.group(1))
    assert left and 0 < int(left.group(1)) <= ttl_s, lock_cell.group(1)
    if not store.url.startswith("redis"):  # Redis keeps no per-key fence to show
        assert f"fencing token {lease.fencing_token}" in lock_cell.group(1)
    held_table = attention.split('<table id="held">')[1].split("</table>")[0]
    row = next(r for r in held_table.split("<tr>") if f">{held_id}</a>" in r)
    assert f"<code>{label}</code>" in row
    assert re.search(r"expires in \d+ s", row)
    crashed = attention.split('<table id="crashed">')[1].split("</table>")[0]
    assert f">{free_id}</a>" in crashed and f">{held_id}</a>" not in crashed
    assert "free: no process runs it" in free


async def test_a_lock_without_inspect_is_told_held_or_free_by_taking_it(
    store: siglo.Backend,
) -> None:
    """A backend whose lock class predates ``inspect`` (contract 1.4): the pages still tell
    a held lock from a free one, by taking it for an instant, without a holder or lease;
    a run that is not running is not probed (taking its lock could block its resume)."""
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        lock = backend.adapter.workflow_lock
        assert isinstance(lock, LockBase)
        original = type(lock)
        lock.__class__ = type("PreInspectLock", (original,), {"_do_inspect": _no_inspect})
        with pytest.raises(CapabilityNotSupportedError):
            await lock.inspect("any")
        running = await backend.adapter.list_checkpoints(status="running", limit=1)
        stack_id, namespace = running.items[0].stack_id, running.items[0].namespace
        holding, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            holding.set()
            await release.wait()

        async with siglo.connect(store.url, settings=SETTINGS) as other:
            task = asyncio.create_task(
                other.adapter.with_workflow_lock(stack_id, hold, namespace=namespace)
            )
            await holding.wait()
            try:
                held = await data.lock_state(backend.adapter, stack_id, namespace)
            finally:
                release.set()
                await task
        free = await data.lock_state(backend.adapter, stack_id, namespace)
        unprobed = await data.lock_state(backend.adapter, stack_id, namespace, probe=False)
        lock.__class__ = original
    assert held == data.LockView(held=True)  # no holder, no lease: not readable
    assert free == data.LockView(held=False)
    assert unprobed is None


async def _no_inspect(self: LockBase, lock_key: str) -> LockState | None:
    return await LockBase._do_inspect(self, lock_key)  # the base class: unsupported


async def _price(order: Any) -> dict[str, Any]:
    return {"sku": "A-1", "price": 42, FIELD: SECRET}


async def _label(priced: Any) -> str:
    return f"{priced['sku']} at {priced['price']}"


PRICING = siglo.flow(
    siglo.Step.create("price", _price).cache(ttl_ms=600_000, key=lambda _: "price:A-1"),
    siglo.Step.create("label", _label),
    name="pricing",
)


async def test_the_run_page_shows_step_cache_hits_and_misses(store: siglo.Backend) -> None:
    """Two runs of a flow whose first step is cached under one key: the first computed it
    (a miss, the entry it wrote and when that expires), the second took it from the
    cache (a hit); both read from what the runs' checkpoints recorded, with the entry
    looked up now. A run without cached steps says so. The cached output's redacted card
    number is nowhere."""
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        await PRICING.run("a", manager=manager, stack_id="price-1")
        await PRICING.run("b", manager=manager, stack_id="price-2")
        first = await backend.adapter.get_checkpoint("price-1")
    assert first is not None and first.metadata is not None
    recorded = first.metadata[STEP_CACHE_KEY]
    assert set(recorded) == {"price"}  # the uncached step records nothing
    expires = recorded["price"]["at"] + 600_000
    async with dashboard(store.url) as client:
        miss = (await client.get("/run", params={"id": "price-1"})).text
        hit = (await client.get("/run", params={"id": "price-2"})).text
        none = (await client.get("/run", params={"id": "order-1", "namespace": NAMESPACE})).text

    def rows(page: str) -> list[list[str]]:
        table = page.split('<table id="step-cache">')[1].split("</table>")[0]
        body = table.split("<tbody>")[1]
        return [
            [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", r)]
            for r in body.split("<tr>")[1:]
        ]

    (price_miss,) = rows(miss)
    assert price_miss[:3] == ["price", "miss: computed, then cached", "price:A-1"]
    assert price_miss[4] == dt.datetime.fromtimestamp(expires / 1000, tz=dt.UTC).strftime(
        "%Y-%m-%d %H:%M:%S"
    )
    assert price_miss[5] == "yes"
    (price_hit,) = rows(hit)
    assert price_hit[:3] == ["price", "hit: from the cache", "price:A-1"]
    assert price_hit[4:] == ["written by an earlier run: not recorded", "yes"]
    assert rows(none) == [["no cached step"]]
    assert SECRET not in miss and SECRET not in hit


async def test_a_tenants_run_page_looks_up_the_tenants_cache_entry(
    store: siglo.Backend,
) -> None:
    """A run in a namespace caches its steps in that namespace; its page looked the
    entry up without it, so it said "no" while the tenant's entry was there and "yes"
    once a run without a namespace cached the same key (a black-box auditor). It looks
    up the run's own entry, as the flow does (``run_cache_namespace``)."""

    def cached_now(page: str) -> str:
        table = page.split('<table id="step-cache">')[1].split("</table>")[0]
        row = table.split("<tbody>")[1].split("<tr>")[1]
        return re.sub(r"<[^>]+>", "", re.findall(r"<td[^>]*>(.*?)</td>", row)[-1]).strip()

    params = {"id": "tenant-price", "namespace": "tenant-a"}
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        await PRICING.run("a", manager=manager, stack_id="tenant-price", namespace="tenant-a")
        assert await backend.adapter.get_cached_step("price:A-1") is MISSING
        async with dashboard(store.url) as client:
            assert cached_now((await client.get("/run", params=params)).text) == "yes"
            # The tenant's entry gone (a TTL of 1 ms), the same key cached without one.
            await backend.adapter.set_cached_step("price:A-1", {}, 1, namespace="tenant-a")
            await asyncio.sleep(0.05)
            await PRICING.run("b", manager=manager, stack_id="plain-price")
            assert await backend.adapter.get_cached_step("price:A-1") is not MISSING
            page = (await client.get("/run", params=params)).text
            assert cached_now(page) == "no (expired or removed)"


async def test_a_store_that_fails_is_a_page_that_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """The store cut off (a real PostgreSQL behind a proxy that closes every connection):
    every page and an action answer 503 with a page naming the store and the error, the
    URL's password masked, and the failure logged; once the store is back the pages
    are served again (docs/observability.md)."""
    from sql_support import require_postgres

    require_postgres()
    async with shared_store("postgres") as backend:
        async with siglo.connect(backend.url, settings=SETTINGS) as piped:
            await seed(piped, SETTINGS)
        parts = urlsplit(backend.url)
        with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
            # Trust authentication: the password is sent and ignored, and must never show.
            netloc = f"{parts.username or 'postgres'}:hunter2-pw@{proxy.url_host}"
            url = urlunsplit(parts._replace(netloc=netloc))
            url = with_option(url, "command_timeout_ms", 1000)
            url = with_option(url, "connect_timeout_ms", 1000)
            async with dashboard(url) as client:
                assert (await client.get("/runs")).status_code == 200
                run = await client.get("/run", params={"id": "order-1", "namespace": NAMESPACE})
                link = re.search(r'id="cancel" href="(/confirm/cancel\?[^"]+)"', run.text)
                assert link, run.text
                confirm_url = link.group(1).replace("&amp;", "&")
                token = csrf((await client.get(confirm_url)).text)
                proxy.cut()
                caplog.set_level(logging.WARNING, logger="siglo.ui")
                pages = [
                    await client.get("/runs"),
                    await client.get(f"/run?id=order-1&namespace={NAMESPACE}"),
                    await client.get("/attention"),
                    await client.get(confirm_url),  # a confirmation reads the run
                    await client.post(
                        "/actions/cancel",
                        data={
                            "csrf": token,
                            "id": "order-1",
                            "namespace": NAMESPACE,
                            "revision": "1",
                        },
                    ),
                ]
                for page in pages:
                    assert page.status_code == 503, (page.request.url, page.text)
                    assert "Storage unavailable" in page.text or "Outcome unknown" in page.text
                    assert "hunter2-pw" not in page.text
                    assert "Internal Server Error" not in page.text
                assert "Storage unavailable" in pages[0].text
                assert f"127.0.0.1:{proxy.port}" in pages[0].text  # which store
                assert "reload the page" in pages[0].text
                assert "open the run again" in pages[4].text
                logged = [r.getMessage() for r in caplog.records if r.name == "siglo.ui"]
                assert len(logged) == 5 and all("hunter2-pw" not in m for m in logged)
                proxy.restore()
                for _ in range(150):  # the pool reconnects (a loaded machine: seconds)
                    if (await client.get("/runs")).status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                assert (await client.get("/runs")).status_code == 200


async def test_a_run_that_cannot_be_read_is_a_page_naming_the_error() -> None:
    """A stored row that is not a checkpoint (written past siglo, here by plain
    sqlite3): its run page is a 500 naming the error, the stack and the `siglo rm` that
    removes it; the other pages are served."""
    import sqlite3

    async with shared_store("sqlite") as backend:
        async with siglo.connect(backend.url, settings=SETTINGS) as piped:
            await seed(piped, SETTINGS)
        raw = sqlite3.connect(urlsplit(backend.url).path)
        with raw:
            changed = raw.execute(
                "UPDATE siglo_checkpoints SET document = ? WHERE stack_id = 'order-1'", (b"{not",)
            ).rowcount
        raw.close()
        assert changed == 1
        async with dashboard(backend.url) as client:
            page = await client.get("/run", params={"id": "order-1", "namespace": NAMESPACE})
            assert page.status_code == 500
            shown = unescape(page.text)
            assert "MalformedRecordError" in shown and "not valid JSON" in shown
            assert f"in the stored checkpoint of stack 'order-1' (namespace '{NAMESPACE}')" in shown
            assert f"`siglo rm {backend.url} order-1 --namespace {NAMESPACE}`" in shown
            assert (await client.get("/runs")).status_code == 200
            assert (await client.get("/attention")).status_code == 200


async def test_records_siglo_cannot_read_are_left_out_and_named_on_attention() -> None:
    """On Redis, whose listings read each document, a checkpoint and a due wait record
    written past siglo: the runs page lists the other runs and says how many it left out;
    the attention page names each record (the stack, the wait's key) with what removes
    it, and still lists the other crashed runs and overdue waits."""
    from siglo import WaitRecord
    from siglo.clock import system_clock

    async with shared_store("redis") as backend:
        async with siglo.connect(backend.url, settings=SETTINGS) as piped:
            await seed(piped, SETTINGS)
            now = system_clock.now_ms()
            for key in ("late-readable", "late-broken"):
                await piped.adapter.save_wait_record(
                    WaitRecord(correlation_key=key, stack_id="order-2", namespace=NAMESPACE,
                               step_id="approve", expires_at=now - 1_000)
                )  # fmt: skip
        import redis.asyncio as redis

        client = redis.from_url(backend.url.split("?", 1)[0])
        keys = backend.adapter.keys
        try:
            checkpoint = keys.checkpoint("order-1", NAMESPACE)
            assert await client.set(checkpoint, b'{"status":"running", not JSON', xx=True)
            assert await client.set(keys.wait("late-broken", NAMESPACE), b"{not", xx=True)
        finally:
            await client.aclose()
        async with dashboard(backend.url) as ui:
            runs = unescape((await ui.get("/runs")).text)
            assert "1 stored run(s) of this page cannot be read and are left out" in runs
            attention = await ui.get("/attention")
            assert attention.status_code == 200
            shown = unescape(attention.text)
            assert 'id="n-unreadable">2<' in shown
            assert f"in the stored checkpoint of stack 'order-1' (namespace '{NAMESPACE}')" in shown
            assert f"`siglo rm {backend.url} order-1 --namespace {NAMESPACE}`" in shown
            assert "in the stored wait record 'late-broken'" in shown
            assert "<code>late-readable</code>" in shown


async def test_overdue_waits_of_two_tenants_are_told_apart_by_namespace() -> None:
    """The attention page's overdue waits name their namespace: two tenants' waits of
    the same key and run id are two rows that say whose (an auditor could not tell
    them apart)."""
    from siglo import WaitRecord
    from siglo.clock import system_clock

    async with shared_store("sqlite") as backend:
        async with siglo.connect(backend.url, settings=SETTINGS) as piped:
            now = system_clock.now_ms()
            for tenant in ("tenant-a", "tenant-b"):
                await piped.adapter.save_wait_record(
                    WaitRecord(correlation_key="approve:o-due", stack_id="o-due",
                               namespace=tenant, step_id="approve", expires_at=now - 1_000)
                )  # fmt: skip
        async with dashboard(backend.url) as ui:
            shown = unescape((await ui.get("/attention")).text)
            table = shown.split('<table id="overdue">', 1)[1].split("</table>", 1)[0]
            rows = [r for r in table.split("<tr>") if "approve:o-due" in r]
            assert len(rows) == 2, table
            assert any("<td>tenant-a</td>" in r for r in rows), rows
            assert any("<td>tenant-b</td>" in r for r in rows), rows


async def test_the_run_page_says_each_waits_outcome_as_siglo_show_does() -> None:
    """A wait past its deadline is ``due``, not ``waiting``; a claim whose lease ran out
    ``claim lapsed``, not ``claimed`` (an auditor saw the two views disagree)."""
    from siglo import Checkpoint, WaitRecord
    from siglo.clock import system_clock

    async with shared_store("sqlite") as backend:
        async with siglo.connect(backend.url, settings=SETTINGS) as piped:
            now = system_clock.now_ms()
            for stack in ("o-due", "o-lapsed"):
                await piped.adapter.save_checkpoint(
                    Checkpoint(stack_id=stack, namespace="t", revision=1, timestamp=now,
                               status="waiting", contexts={"a": {}})
                )  # fmt: skip
            await piped.adapter.save_wait_record(
                WaitRecord(correlation_key="k-due", stack_id="o-due", namespace="t",
                           step_id="a", expires_at=now - 1_000)
            )  # fmt: skip
            await piped.adapter.save_wait_record(
                WaitRecord(correlation_key="k-lapsed", stack_id="o-lapsed", namespace="t",
                           step_id="a", status="claimed", claimant_id="gone",
                           claimed_at=now - 5_000, lease_expires_at=now - 1_000)
            )  # fmt: skip
        outcomes = {}
        async with dashboard(backend.url) as ui:
            for stack, key in (("o-due", "k-due"), ("o-lapsed", "k-lapsed")):
                page = unescape((await ui.get("/run", params={"id": stack, "namespace": "t"})).text)
                table = page.split('<table id="waits">', 1)[1].split("</table>", 1)[0]
                row = next(r for r in table.split("<tr>") if f"<code>{key}</code>" in r)
                outcomes[key] = row.split('class="outcome">', 1)[1].split("<", 1)[0]
                # A due wait is the worker's to fire: no "Deliver event…" that would be
                # refused as timed out (a black-box auditor), but what happens next.
                if key == "k-due":
                    assert 'id="deliver"' not in row and 'id="due"' in row, row
        assert outcomes == {"k-due": "due", "k-lapsed": "claim lapsed"}, outcomes


def test_the_dashboard_of_a_database_that_is_not_there_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped SQLite path: every command that reads refuses it, creating nothing; the
    dashboard too, instead of showing an empty store it made."""
    from siglo.cli.errors import CliError
    from siglo.cli.ui import TOKEN_ENV, build_app

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    typo = tmp_path / "typo.db"
    with pytest.raises(CliError, match="there is no database"):
        build_app(f"sqlite:///{typo}", "127.0.0.1", None)
    assert list(tmp_path.iterdir()) == []


def test_siglo_ui_prints_the_address_it_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound to another loopback address, the link ``siglo ui`` prints (with its token)
    is that address: 127.0.0.1 would not reach it."""
    import uvicorn
    from click.testing import CliRunner

    from siglo.cli import cli

    bound: list[tuple[str, int]] = []

    def serve(self: Any, sockets: list[Any]) -> None:
        bound.extend(sock.getsockname()[:2] for sock in sockets)
        for sock in sockets:
            sock.close()

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    done = CliRunner().invoke(
        cli, ["ui", "memory://", "--host", "127.0.0.2", "--port", "0", "--token", "T0K"]
    )
    assert done.exit_code == 0, done.output
    ((host, port),) = bound
    assert host == "127.0.0.2" and port > 0  # --port 0: the port it got, printed
    assert f"open http://127.0.0.2:{port}/?token=T0K" in done.output, done.output


def test_the_link_is_printed_listening_encoded_and_a_blank_token_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The printed link reaches the dashboard at once (the socket listens before it is
    printed: a connection made then queued, where it was refused for ~40 ms), its token
    percent-encoded (``ab&c d#e`` was printed raw, a link that answered 401); a blank
    token, which let ``--host 0.0.0.0`` start, is refused (black-box auditors)."""
    import socket

    import uvicorn
    from click.testing import CliRunner

    from siglo.cli import cli

    reached: list[bool] = []

    def serve(self: Any, sockets: list[Any]) -> None:
        for sock in sockets:
            probe = socket.create_connection(sock.getsockname()[:2], timeout=2)
            reached.append(True)  # not refused: the socket listens
            probe.close()
            sock.close()

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    monkeypatch.delenv("SIGLO_UI_TOKEN", raising=False)
    done = CliRunner().invoke(cli, ["ui", "memory://", "--port", "0", "--token", "ab&c d#e"])
    assert done.exit_code == 0, done.output
    assert reached == [True]
    assert "?token=ab%26c+d%23e" in done.output, done.output
    # The error names where the blank token came from (it named the other one).
    for args, env, source in (
        (["--token", " "], {}, "(--token)"),
        (["--token", ""], {}, "(--token)"),
        ([], {"SIGLO_UI_TOKEN": "  "}, "(SIGLO_UI_TOKEN)"),
    ):
        refused = CliRunner().invoke(
            cli, ["ui", "memory://", "--host", "0.0.0.0", "--port", "0", *args], env=env
        )
        assert refused.exit_code == 1 and "is blank" in refused.output, refused.output
        assert f"the token {source} is blank" in refused.output, refused.output
    with pytest.raises(siglo.errors.InvalidArgumentError, match="blank"):
        create_app("memory://", settings=SETTINGS, token="")


async def test_the_token_cookie_is_per_port_and_not_the_token(store: siglo.Backend) -> None:
    """A browser sends a host's cookies to every port of it: the token cookie was the
    token itself, named alike for every dashboard, so another local server got the
    token and a second dashboard's link logged the first out (a black-box auditor).
    Each dashboard's cookies are named for its port and hold a keyed hash."""
    app_a = create_app(store.url, settings=SETTINGS, token="token-of-A")
    app_b = create_app(store.url, settings=SETTINGS, token="token-of-B")
    async with app_a.router.lifespan_context(app_a), app_b.router.lifespan_context(app_b):
        jar = httpx.Cookies()  # one browser
        a = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app_a), base_url="http://127.0.0.1:8001", cookies=jar
        )
        b = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app_b), base_url="http://127.0.0.1:8002", cookies=jar
        )
        async with a, b:
            assert (await a.get("/runs", params={"token": "token-of-A"})).status_code == 303
            jar.update(a.cookies)
            b.cookies.update(jar)
            assert (await b.get("/runs", params={"token": "token-of-B"})).status_code == 303
            jar.update(b.cookies)
            a.cookies.update(jar)
            assert (await a.get("/runs")).status_code == 200  # still logged in
            assert (await b.get("/runs")).status_code == 200
            names = {cookie.name: cookie.value for cookie in jar.jar}
            assert "siglo_ui_token_8001" in names and "siglo_ui_token_8002" in names
            assert not any("token-of" in value for value in names.values()), names


def test_a_port_taken_is_one_error_line_and_no_link(tmp_path: Path) -> None:
    """docs/observability.md: "the link it prints is the address it binds". The port is
    bound before the link is printed: one taken by another process is an Error line
    (exit status 1), never a link to that other server."""
    import socket
    import subprocess
    import sys

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "siglo", "ui", "memory://", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    finally:
        taken.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "http://" not in done.stdout + done.stderr


async def test_a_cancel_is_a_compare_and_set_on_the_revision_the_page_showed(
    store: siglo.Backend,
) -> None:
    """Cancel read the run, then cancelled whatever was stored by then: a delivery from
    another tab right after the read was cancelled anyway, and a run deleted meanwhile
    was said to be cancelled (a black-box auditor, interleaving another tab's action
    right after the cancel's read)."""
    from siglo.ui.actions import ActionRefused, cancel_run

    async with (
        siglo.connect(store.url, settings=SETTINGS) as backend,
        siglo.connect(store.url, settings=SETTINGS) as other,
    ):
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        adapter: Any = backend.adapter
        reading = adapter.get_checkpoint

        def meddling(action: Any) -> Any:
            async def read(*args: Any, **kwargs: Any) -> Any:
                found = await reading(*args, **kwargs)
                await action()  # another tab's action, right after the read
                return found

            return read

        shown = await backend.adapter.get_checkpoint("order-2", NAMESPACE, fallback=False)
        assert shown is not None and shown.status == "waiting"

        async def deliver() -> None:
            await ORDERS.deliver(
                "approve:o-2",
                {"by": "tab"},
                manager=siglo.StorageManager(other, settings=SETTINGS),
                namespace=NAMESPACE,
            )

        adapter.get_checkpoint = meddling(deliver)
        try:
            with pytest.raises(ActionRefused, match="changed since the page was shown"):
                await cancel_run(manager, "order-2", NAMESPACE, shown.revision)
        finally:
            adapter.get_checkpoint = reading
        moved = await backend.adapter.get_checkpoint("order-2", NAMESPACE, fallback=False)
        assert moved is not None and moved.status == "completed"

        for n in range(10):  # a bulk run that has not ended
            bulk = await backend.adapter.get_checkpoint(f"bulk-{n:05}", None, fallback=False)
            assert bulk is not None
            if bulk.status == "running":
                break
        assert bulk.status == "running"

        async def delete() -> None:
            await other.adapter.delete_checkpoint(bulk.stack_id, None)

        adapter.get_checkpoint = meddling(delete)
        try:
            with pytest.raises(ActionRefused, match=f"no run '{bulk.stack_id}' to cancel"):
                await cancel_run(manager, bulk.stack_id, None, bulk.revision)
        finally:
            adapter.get_checkpoint = reading
        assert await backend.adapter.get_checkpoint(bulk.stack_id, None, fallback=False) is None


async def test_the_deliver_action_refuses_what_a_delivery_would(store: siglo.Backend) -> None:
    """From a black-box audit of the dashboard: an integer beyond 64 bits was delivered
    as a float (orjson parsed it so), where the API refuses it; a payload over 1 MiB got
    Starlette's bare 400; and every one of these leaves the wait open."""
    async with dashboard(store.url) as client:
        form = await _deliver_form(client)
        big = await client.post(
            "/actions/deliver",
            data={**form, "payload": '{"order": 123456789012345678901234567890}'},
        )
        assert big.status_code == 409 and "not JSON-serialisable" in big.text, big.text
        nan = await client.post("/actions/deliver", data={**form, "payload": '{"x": NaN}'})
        assert nan.status_code == 409 and "not JSON" in nan.text, nan.text
        # Nested past the parser's recursion limit: a bare 500 before.
        deep = await client.post("/actions/deliver", data={**form, "payload": "[" * 100_000})
        assert deep.status_code == 409 and "not JSON" in deep.text, deep.text[:300]
        large = {"by": "ui", "note": "n" * 1_500_000}
        done = await client.post(
            "/actions/deliver", data={**form, "payload": orjson.dumps(large).decode()}
        )
        assert done.status_code == 200, done.text[:500]
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        stored = await backend.adapter.get_checkpoint("order-1", NAMESPACE, fallback=False)
        assert stored is not None
        assert stored.contexts["approve"]["event"]["note"] == large["note"]


async def test_a_durable_sleep_has_no_deliver_button_and_refuses_an_event(
    store: siglo.Backend,
) -> None:
    """The run page offered "Deliver event…" on a durable sleep (its internal key shown),
    and a delivery ended an hour's sleep at once (a black-box auditor); Flow.deliver did
    the same to a sleep's key."""
    from siglo import Step, WorkflowSuspended, flow
    from siglo.workflow import sleep

    async def nap(_: Any) -> Any:
        await sleep(3_600_000)
        return "rested"

    napping = flow(Step.create("nap", nap), name="ui-nap")
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        manager = siglo.StorageManager(backend, settings=SETTINGS)
        with pytest.raises(WorkflowSuspended) as suspended:
            await napping.run(None, manager=manager, stack_id="napper")
        key = suspended.value.correlation_key
        with pytest.raises(siglo.errors.InvalidArgumentError, match="durable sleep"):
            await napping.deliver(key, {}, manager=manager)
    async with dashboard(store.url) as client:
        page = (await client.get("/run", params={"id": "napper"})).text
        assert 'id="deliver"' not in page and 'id="sleeping"' in page
        assert "\x1f" not in page and "a durable sleep" in page
        # A form edited to name the sleep's key (any confirmation page's CSRF token).
        forged = {
            "id": "napper",
            "namespace": "",
            "key": key,
            "revision": "2",
            "payload": "{}",
            "csrf": (await _deliver_form(client))["csrf"],
        }
        refused = await client.post("/actions/deliver", data=forged)
        assert refused.status_code == 409 and "durable sleep" in refused.text, refused.text
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        stored = await backend.adapter.get_checkpoint("napper", None, fallback=False)
        assert stored is not None and stored.status == "waiting"


async def test_a_deeply_nested_value_renders(store: siglo.Backend) -> None:
    """A value nested 240 levels deep (storable) made the run page a bare "Internal
    Server Error": the tree's macro went past the interpreter's recursion limit."""
    deep: Any = "bottom"
    for _ in range(240):
        deep = {"d": deep}
    async with siglo.connect(store.url, settings=SETTINGS) as backend:
        await backend.adapter.save_checkpoint(
            siglo.Checkpoint(stack_id="deep", revision=1, timestamp=1, contexts={"s": {"v": deep}})
        )
    async with dashboard(store.url) as client:
        page = await client.get("/run", params={"id": "deep"})
        assert page.status_code == 200, page.text[:300]
        assert "bottom" in page.text and 'href="/confirm/delete?' in page.text
