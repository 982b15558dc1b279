"""``siglo ui [URL]``: the local dashboard of a store (``siglo[ui]``: Starlette, Jinja2,
uvicorn), on the one configuration like every command."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
import socket
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

import click

from siglo.cli.common import require_storage
from siglo.cli.errors import CliError, cli_settings, display_url, resolve_url
from siglo.connect import connect

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from siglo.config import Settings

__all__ = ["TOKEN_ENV", "build_app", "ui"]

TOKEN_ENV: Final = "SIGLO_UI_TOKEN"


def build_app(url: str | None, host: str, token: str | None) -> tuple[Starlette, str, str | None]:
    """The dashboard ``siglo ui`` serves: the URL and settings every command takes
    (:func:`~siglo.cli.errors.resolve_url`, :func:`~siglo.cli.errors.cli_settings`), and
    the token (``--token``, else ``$SIGLO_UI_TOKEN``; ``generate`` makes one), which any
    bind beyond loopback requires. Returns the app, the URL and the token."""
    from siglo.ui.server import create_app, is_loopback

    source = "--token"
    if token is None:
        source, token = TOKEN_ENV, os.environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        raise CliError(
            f"the token ({source}) is blank: it would let anyone in",
            "pass a secret, or --token generate to make one",
        )
    if token == "generate":
        token = secrets.token_urlsafe(24)
    loopback = is_loopback(host)
    if not loopback and not token:
        raise CliError(
            f"binding {host} exposes the store beyond this machine: a token is required",
            f"pass --token SECRET (or --token generate, or set {TOKEN_ENV}), or bind 127.0.0.1",
        )
    target = resolve_url(url)
    settings = cli_settings()
    # A dashboard of what is stored creates nothing: a mistyped SQLite path is an error,
    # as for every command that reads, not an empty store shown as if it were the one.
    _run(_probe(target, settings))
    app = create_app(target, settings=settings, token=token, loopback_only=loopback)
    return app, target, token


async def _probe(url: str, settings: Settings) -> None:
    backend = connect(url, settings=settings)
    try:
        await require_storage(backend)
    finally:
        await backend.aclose()


def _run(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` from synchronous code, also when an event loop is running here (an
    application building the dashboard's app): then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(work)
        return
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, work).result()


@click.command()
@click.argument("url", required=False, default=None)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option(
    "--token",
    default=None,
    help=f"Require this token on every request (or set {TOKEN_ENV}); required to bind "
    "anything but a loopback address. `--token generate` makes one.",
)
def ui(url: str | None, host: str, port: int, token: str | None) -> None:
    """A local web dashboard of what the store holds: runs, one run's history, what
    needs attention, and confirmed actions (cancel, deliver an event, delete)."""
    try:
        import uvicorn

        import siglo.ui.server  # noqa: F401  (its extra's packages: starlette, jinja2)
    except ImportError as exc:
        raise CliError(
            f"siglo ui needs its extra ({exc.name} is not installed)",
            "pip install 'siglo[ui]>=0.1,<1'",
        ) from exc
    app, target, token = build_app(url, host, token)
    # Bound here, before the link is printed: the link is the address it listens on (a
    # port taken by another process is one Error line, not a link to someone else's
    # server; --port 0 prints the port it got).
    sock = _listening(host, port)
    port = sock.getsockname()[1]
    # The address it binds: another loopback address (127.0.0.2) is not 127.0.0.1.
    where = "127.0.0.1" if host == "localhost" else f"[{host}]" if ":" in host else host
    shown = f"http://{where}:{port}/"
    click.echo(f"siglo ui on {display_url(target)} at {shown}", err=True)
    if token:
        click.echo(f"open {shown}?{urlencode({'token': token})}", err=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def _listening(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` for the dashboard, or :class:`CliError`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # Listening before the link is printed: a connection made at once queues until
        # the server accepts it, where a bound socket not yet listening refuses it.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CliError(
            f"siglo ui cannot listen on {host}:{port}: {exc.strerror or exc}",
            "choose another --port (--port 0 takes a free one), or stop what listens there",
        ) from exc
    return sock
