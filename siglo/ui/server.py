"""The ``siglo ui`` web application: Starlette routes rendering Jinja2 templates.

Server-rendered HTML and one stylesheet; no JavaScript. Reads go through
:mod:`siglo.ui.data`, actions through :mod:`siglo.ui.actions`, both on the backend
:func:`siglo.connect` opens with the settings it is given (the one configuration).

Security: every action is a POST from a confirmation page, carrying a CSRF token tied to
a cookie of the browser (double submit, HMAC with a per-process secret) and refused from
another origin; on a loopback bind only loopback ``Host`` names are served (no DNS
rebinding); with a token (required for any other bind) every request must carry it, as
``Authorization: Bearer``, the cookie the first ``?token=`` visit sets, or ``?token=``.
The backend URL is shown with its password masked.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import jinja2
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from siglo import masking
from siglo.backend import Backend
from siglo.checkpoint import STATUSES
from siglo.cli.errors import hint_for
from siglo.clock import system_clock
from siglo.config import Settings
from siglo.connect import connect
from siglo.errors import (
    InvalidArgumentError,
    MalformedRecordError,
    OutcomeUnknownError,
    SigloError,
    StorageAdapterError,
)
from siglo.listing import MAX_PAGE_SIZE
from siglo.manager import StorageManager
from siglo.sentinel import MISSING
from siglo.ui import actions, data
from siglo.unreadable import collecting_unreadable
from siglo.urls import mask_credentials, read_decimal
from siglo.workflow.outcomes import is_sleep

__all__ = ["LOOPBACK_HOSTS", "create_app", "is_loopback"]

_log = masking.logger("siglo.ui")

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
TOKEN_COOKIE: Final = "siglo_ui_token"
CSRF_COOKIE: Final = "siglo_ui_csrf"
"""The cookies' names, each followed by ``_<port>``: a browser sends a host's cookies to
every port of it, so two dashboards on one machine would overwrite each other's."""


def cookie_name(base: str, request: Request) -> str:
    """``base`` for the port ``request`` came to (see :data:`CSRF_COOKIE`)."""
    return f"{base}_{request.url.port or 80}"


PAGE_SIZES: Final = (25, 50, 100, 200)
TEMPLATES: Final = Path(__file__).parent / "templates"
STYLESHEET: Final = (TEMPLATES / "ui.css").read_text()
COUNTS_KEPT_MS: Final = 10_000
"""How long the counts by status of one listing are reused while paging through it."""
ACTIONS: Final = {"cancel": "Cancel run", "delete": "Delete run", "deliver": "Deliver event"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a ``Host`` name) is this machine only: a
    loopback name, or an IP address of the loopback network (127.0.0.0/8, ::1) — never a
    name that only starts like one (``127.attacker.example`` resolves anywhere: a page
    there reaching the dashboard through DNS rebinding)."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def _duration(ms: int | None) -> str:
    """A lease's time left: ``12 s``, ``4 min 05 s``, ``2 h 00 min`` (``–`` for none)."""
    if ms is None:
        return "–"
    seconds = max(0, -(-ms // 1000))  # rounded up: a lease with 300 ms left is "1 s"
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _utc(ms: int | None) -> str:
    if ms is None:
        return "–"
    try:
        return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _parse_time(text: str | None, what: str) -> int | None:
    """``YYYY-MM-DDTHH:MM`` (a datetime-local field, read as UTC) to milliseconds."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
    except ValueError:
        raise InvalidArgumentError(
            f"{what} {text!r} is not a time such as 2026-12-05T09:30 (UTC)"
        ) from None
    return int(moment.timestamp() * 1000)


def _whole_number(text: str | None, what: str, default: int) -> int:
    """A query parameter that must be a whole number (``default`` when absent)."""
    if not text:
        return default
    number = read_decimal(text)  # ASCII digits, as every number siglo reads from text
    if number is None:
        raise InvalidArgumentError(f"{what} must be a whole number, got {text!r}")
    return number


MAX_FORM_FIELD_BYTES: Final = 64 * 1024 * 1024
"""The largest form field an action reads (an event's payload): what a checkpoint may
hold is bounded by the settings' ``max_document_bytes``, which the delivery enforces."""


def _no_constant(name: str) -> Any:
    """``NaN`` and ``Infinity`` are not JSON (the standard library's parser takes them)."""
    raise ValueError(f"{name} is not a JSON value")


def create_app(
    url: str,
    *,
    settings: Settings,
    token: str | None = None,
    loopback_only: bool = True,
    backend: Backend | None = None,
) -> Starlette:
    """The dashboard of the store at ``url``, opened with ``settings`` when it starts
    (or ``backend``, already opened with them, which the caller closes).

    ``token``: required on every request when set. ``loopback_only``: serve only
    requests addressed to a loopback name (what a 127.0.0.1 bind wants).
    """
    if token is not None and not token.strip():
        raise InvalidArgumentError(
            "the dashboard's token is blank: pass a secret (`--token generate` makes one)"
        )
    secret = secrets.token_bytes(32)
    # What the token cookie holds: a keyed hash of the token (this process's key).
    token_cookie = (
        "" if token is None else hmac.new(secret, b"token\0" + token.encode(), "sha256").hexdigest()
    )
    # Autoescaped: every id, key and value shown is stored data, which may hold markup.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
    templates = Jinja2Templates(env=env)
    env.filters["utc"] = _utc
    env.filters["json"] = _json
    env.filters["duration"] = _duration
    env.tests["sleep"] = is_sleep
    env.globals["shown_url"] = mask_credentials(url)
    env.globals["actions"] = ACTIONS
    # What removes a record siglo cannot read, with this store's URL (password masked).
    env.globals["hint"] = lambda exc: hint_for(exc).replace("URL", mask_credentials(url), 1)
    state: dict[str, Any] = {}
    count_cache: dict[tuple[Any, ...], tuple[dict[str, int], bool, int]] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        opened = backend if backend is not None else connect(url, settings=settings)
        state["backend"] = opened
        state["manager"] = StorageManager(opened, settings=settings)
        try:
            yield
        finally:
            if backend is None:
                await opened.aclose()

    def csrf_for(cookie: str) -> str:
        return hmac.new(secret, cookie.encode(), hashlib.sha256).hexdigest()

    def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        cookie = request.cookies.get(cookie_name(CSRF_COOKIE, request)) or secrets.token_urlsafe(24)
        backend_now: Backend | None = state.get("backend")
        response = templates.TemplateResponse(
            request,
            name,
            {
                **context,
                "csrf": csrf_for(cookie),
                "backend_name": None if backend_now is None else backend_now.name,
                "redacting": sorted(settings.redact_fields),
            },
            status_code=status,
        )
        name = cookie_name(CSRF_COOKIE, request)
        if request.cookies.get(name) != cookie:
            response.set_cookie(name, cookie, httponly=True, samesite="strict")
        return response

    def refuse(request: Request, status: int, message: str) -> Response:
        return render(request, "message.html", {"title": "Refused", "message": message}, status)

    password = urlsplit(url).password

    def failed(request: Request, exc: Exception) -> Response:
        """A page for an error of siglo's that a page or an action did not answer itself.

        The store failing (unreachable, timed out, refusing) is a 503 that says so and
        which store; an action whose write may or may not have landed says that too;
        anything else of siglo's is a 500 naming the error. Never a bare "Internal
        Server Error", and never the URL's password (an error that quotes the URL has it
        masked). Logged on ``siglo.ui`` as a warning.
        """
        message = str(exc)
        if password:
            message = message.replace(password, "***")
        _log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, message)
        if isinstance(exc, OutcomeUnknownError):
            title, status = "Outcome unknown", 503
            message = (
                f"the store did not confirm the write ({message}): open the run again to "
                "see whether it was applied before you repeat the action"
            )
        elif isinstance(exc, StorageAdapterError):
            title, status = "Storage unavailable", 503
            then = (
                "open the run again to see its state before you repeat the action"
                if request.method == "POST"
                else "reload the page once it is back"
            )
            message = f"the store at {mask_credentials(url)} failed ({message}): {then}"
        else:
            title, status = "Error", 500
            message = f"{type(exc).__name__}: {message}"
            if isinstance(exc, MalformedRecordError) and getattr(exc, "stack_id", None):
                # A stored record siglo cannot read, its stack named: what removes it.
                message += ". " + hint_for(exc).replace("URL", mask_credentials(url), 1)
        return render(request, "message.html", {"title": title, "message": message}, status)

    class Guard(BaseHTTPMiddleware):
        async def dispatch(
            self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            header = request.headers.get("host") or ""
            host = header.partition("]")[0] + "]" if header.startswith("[") else header
            host = host if host.startswith("[") else host.partition(":")[0]
            if loopback_only and not is_loopback(host):
                return PlainTextResponse(
                    "siglo ui serves loopback names only (it is bound to 127.0.0.1)", 421
                )
            if token is not None:
                given = request.query_params.get("token")
                bearer = request.headers.get("authorization", "")
                cookie = request.cookies.get(cookie_name(TOKEN_COOKIE, request))
                presented = given or (bearer[7:] if bearer.lower().startswith("bearer ") else None)
                if presented is not None:
                    valid = hmac.compare_digest(presented.encode(), token.encode())
                else:
                    # The cookie holds a keyed hash of the token, not the token: every
                    # other server on this host (any port) is sent it too.
                    valid = cookie is not None and hmac.compare_digest(cookie, token_cookie)
                if not valid:
                    return PlainTextResponse(
                        "siglo ui needs its token: open the URL `siglo ui` printed "
                        "(…?token=…), or send Authorization: Bearer <token>",
                        401,
                    )
                if given is not None:
                    # Once: the token moves to a cookie and out of the address bar.
                    rest = {k: v for k, v in request.query_params.items() if k != "token"}
                    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
                    redirect = RedirectResponse(target, 303)
                    redirect.set_cookie(
                        cookie_name(TOKEN_COOKIE, request),
                        token_cookie,
                        httponly=True,
                        samesite="strict",
                    )
                    return redirect
            response = await call_next(request)
            response.headers["X-Frame-Options"] = "DENY"
            # same-origin, not no-referrer: under no-referrer a browser sends its form
            # posts with "Origin: null", which the origin check must refuse.
            response.headers["Referrer-Policy"] = "same-origin"
            response.headers["Content-Security-Policy"] = (
                "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                "frame-ancestors 'none'"
            )
            response.headers["X-Content-Type-Options"] = "nosniff"
            return response

    def adapter() -> Any:
        return state["backend"].adapter

    def filters_of(request: Request) -> data.RunFilter:
        q = request.query_params
        statuses = tuple(s for s in q.getlist("status") if s)
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown:
            raise InvalidArgumentError(
                f"unknown status {unknown[0]!r}: one of {', '.join(sorted(STATUSES))}"
            )
        namespace: Any = MISSING
        if q.get("no_namespace") and q.get("namespace"):
            raise InvalidArgumentError(
                "a listing is of one namespace or of the runs without one, not both: "
                "drop namespace= or no_namespace="
            )
        if q.get("no_namespace"):
            namespace = None
        elif q.get("namespace"):
            namespace = q["namespace"]
        return data.RunFilter(
            namespace=namespace,
            statuses=statuses,
            workflow_id=q.get("workflow") or None,
            updated_after=_parse_time(q.get("after"), "updated after"),
            updated_before=_parse_time(q.get("before"), "updated before"),
        )

    async def counted(filters: data.RunFilter, paging: bool) -> tuple[dict[str, int], bool, int]:
        # Counting pages through every matching run: paging on through one listing
        # reuses the counts of its first page for a few seconds instead of recounting.
        now = system_clock.now_ms()
        key = (
            filters.namespace,
            filters.workflow_id,
            filters.updated_after,
            filters.updated_before,
        )
        kept = count_cache.get(key)
        # Only paging on (a cursor) reuses them: a listing loaded anew counts anew, so
        # runs that expired or were removed since are not counted.
        if paging and kept is not None and now - kept[2] < COUNTS_KEPT_MS:
            return kept
        counts, capped = await data.status_counts(adapter(), filters)
        count_cache.clear()  # one listing at a time is kept: bounded memory
        count_cache[key] = (counts, capped, now)
        return counts, capped, now

    async def runs(request: Request) -> Response:
        q = request.query_params
        try:
            filters = filters_of(request)
            limit = _whole_number(q.get("limit"), "limit", 50)
            if not 1 <= limit <= MAX_PAGE_SIZE:
                raise InvalidArgumentError(f"limit must be 1 to {MAX_PAGE_SIZE}, got {limit}")
            page_number = _whole_number(q.get("page"), "page", 1)
            with collecting_unreadable() as left_out:
                page = await data.runs_page(
                    adapter(), filters, limit=limit, cursor=q.get("cursor") or None
                )
            counts, capped, counted_at = await counted(filters, bool(q.get("cursor")))
        except (InvalidArgumentError, ValueError) as exc:
            return refuse(request, 400, str(exc))
        kept = [(k, v) for k, v in q.multi_items() if k not in {"cursor", "page"}]
        next_url = None
        if page.next_cursor is not None:
            next_url = "/runs?" + urlencode(
                [*kept, ("cursor", page.next_cursor), ("page", str(page_number + 1))]
            )
        first_url = "/runs?" + urlencode(kept) if q.get("cursor") else None
        return render(
            request,
            "runs.html",
            {
                "page": page,
                "left_out": len(left_out),
                "counts": counts,
                "capped": capped,
                "counted_at": counted_at,
                "total": sum(counts.values()),
                "filters": filters,
                "q": q,
                "statuses": data.STATUS_ORDER,
                "page_sizes": PAGE_SIZES,
                "limit": limit,
                "page_number": page_number,
                "next_url": next_url,
                "first_url": first_url,
                "status_url": lambda status: (
                    "/runs?"
                    + urlencode([(k, v) for k, v in kept if k != "status"] + [("status", status)])
                ),
            },
        )

    def run_url(stack_id: str, namespace: str | None) -> str:
        params = [("id", stack_id)] + ([("namespace", namespace)] if namespace is not None else [])
        return "/run?" + urlencode(params)

    env.globals["run_url"] = run_url

    async def run(request: Request) -> Response:
        q = request.query_params
        stack_id = q.get("id")
        if not stack_id:
            return refuse(request, 400, "which run? /run?id=STACK_ID[&namespace=NS]")
        namespace = q.get("namespace")
        try:
            detail = await data.run_detail(adapter(), stack_id, namespace, settings.redact_fields)
        except InvalidArgumentError as exc:
            return refuse(request, 400, str(exc))
        if detail is None:
            where = f" in namespace {namespace!r}" if namespace is not None else ""
            return refuse(request, 404, f"no run {stack_id!r}{where}")
        return render(request, "run.html", {"run": detail, "cp": detail.checkpoint})

    async def attention(request: Request) -> Response:
        found = await data.attention(adapter(), limit=100, now_ms=system_clock.now_ms())
        return render(request, "attention.html", {"a": found})

    async def confirm(request: Request) -> Response:
        q = request.query_params
        action = request.path_params["action"]
        if action not in ACTIONS:
            return refuse(request, 404, f"no action {action!r}: {', '.join(ACTIONS)}")
        # A confirmation shows what is stored, not whatever a link says: a run that is
        # not there, a wait that is not one of it, a revision it is no longer at. Read
        # from the store itself: those fields are stored in clear (no keys needed).
        stack_id = q.get("id") or ""
        namespace = q.get("namespace") or None
        raw = state["backend"].raw_adapter
        try:
            revision = _whole_number(q.get("revision"), "revision", -1)
            stored = await raw.get_checkpoint(stack_id, namespace, fallback=False)
            if stored is None:
                where = f" in namespace {namespace!r}" if namespace is not None else ""
                return refuse(request, 404, f"no run {stack_id!r}{where}")
            if revision != stored.revision:
                return refuse(
                    request,
                    409,
                    f"run {stack_id!r} is at revision {stored.revision}, not {revision}: it "
                    "changed since the page was shown; look again",
                )
            if action == "deliver":
                key = q.get("key") or ""
                wait = await raw.get_wait_record(key, namespace=namespace)
                if wait is None or wait.stack_id != stack_id:
                    return refuse(request, 404, f"run {stack_id!r} has no wait {key!r}")
        except InvalidArgumentError as exc:
            return refuse(request, 400, str(exc))
        except StorageAdapterError as exc:
            return failed(request, exc)
        return render(request, "confirm.html", {"action": action, "q": q})

    def revision_of(form: Any) -> int:
        try:
            return int(str(form.get("revision")))
        except ValueError:
            raise actions.ActionRefused("the form names no revision; nothing changed") from None

    async def act(request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ACTIONS:
            return refuse(request, 404, f"no action {action!r}")
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            return refuse(request, 403, f"an action from another origin ({origin}) is refused")
        try:
            # An event's payload may be as large as a document: Starlette's default
            # bound (1 MiB a field) answered a larger one with its own bare 400.
            form = await request.form(max_part_size=MAX_FORM_FIELD_BYTES)
        except HTTPException as exc:
            return refuse(request, 413, f"the form cannot be read ({exc.detail}); nothing changed")
        cookie = request.cookies.get(cookie_name(CSRF_COOKIE, request))
        sent = str(form.get("csrf") or "")
        if not cookie or not hmac.compare_digest(sent, csrf_for(cookie)):
            return refuse(
                request, 403, "the form's CSRF token is missing or stale: open the page again"
            )
        manager: StorageManager = state["manager"]
        namespace = str(form["namespace"]) if form.get("namespace") is not None else None
        namespace = namespace or None
        stack_id = str(form.get("id") or "")
        try:
            if action == "deliver":
                if not stack_id:
                    raise actions.ActionRefused("the form names no run; nothing was delivered")
                raw = str(form.get("payload") or "null")
                try:
                    # The standard library's parser: an integer beyond 64 bits stays one
                    # (and is refused as not storable), where orjson's made it a float.
                    payload = json.loads(raw, parse_constant=_no_constant)
                except (ValueError, RecursionError) as exc:  # nested past the parser
                    raise actions.ActionRefused(
                        f"the event payload is not JSON ({exc}); nothing was delivered"
                    ) from None
                message = await actions.deliver_event(
                    manager,
                    str(form.get("key") or ""),
                    namespace,
                    payload,
                    run_id=stack_id,
                    expected_revision=revision_of(form),
                )
            else:
                do = actions.cancel_run if action == "cancel" else actions.delete_run
                revision = revision_of(form)
                message = await do(manager, stack_id, namespace, revision)
        except StorageAdapterError as exc:
            return failed(request, exc)
        except SigloError as exc:
            return refuse(request, 409, str(exc))
        count_cache.clear()  # the counts changed
        back = run_url(stack_id, namespace) if stack_id and action != "delete" else "/runs"
        return render(request, "message.html", {"title": "Done", "message": message, "back": back})

    async def home(_: Request) -> Response:
        return RedirectResponse("/runs", 302)

    async def stylesheet(_: Request) -> Response:
        return Response(STYLESHEET, media_type="text/css")

    return Starlette(
        routes=[
            Route("/", home),
            Route("/runs", runs),
            Route("/run", run),
            Route("/attention", attention),
            Route("/confirm/{action}", confirm),
            Route("/actions/{action}", act, methods=["POST"]),
            Route("/ui.css", stylesheet),
        ],
        middleware=[Middleware(Guard)],
        exception_handlers={SigloError: failed},
        lifespan=lifespan,
    )
