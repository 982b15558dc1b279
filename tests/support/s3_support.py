"""A local S3 emulator for the S3 blob store's tests: moto's server on a free loopback
port (``moto[server]``, in the dev extra), one bucket per test.

moto's own server (``ThreadedMotoServer``) answers requests in concurrent threads and
checks a conditional put's ``If-Match`` before it writes, without a lock: two puts
conditional on the same ETag can both be accepted (seen in 4 of 300 rounds of six such
puts with a short thread switch interval), which S3 never does and which the S3 blob
store's protocol rests on. So the emulator here answers one request at a time, as one
linearizable store does."""

from __future__ import annotations

import secrets
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

# moto's server accepts any credentials; these only show where a URL carries them.
ACCESS_KEY_ID = "siglo-test-key"
SECRET_ACCESS_KEY = "siglo-test-SECRET-do-not-show"
REGION = "us-east-1"


class _OneAtATime:
    """A WSGI app answering one request at a time: each request's effect (its condition
    checked and its write) is then atomic, as on S3."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            # The whole response inside the lock: moto may produce it lazily.
            return list(self._app(environ, start_response))


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port), one request at a time, stopped after;
    yields its endpoint."""
    import logging

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    # Its HTTP server logs every request; a failing test shows siglo's messages instead.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = _OneAtATime(DomainDispatcherApplication(create_backend_app))
    # Threaded, so that a client's connections are all accepted; the app serializes them.
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        thread.join()


def new_bucket(endpoint: str) -> str:
    """A fresh, empty bucket on the emulator at ``endpoint`` (its name)."""
    name = f"siglo-{secrets.token_hex(6)}"
    # CreateBucket is a bare PUT of the bucket's path: the emulator checks no signature.
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{name}", method="PUT")):
        pass
    return name


def s3_url(endpoint: str, bucket: str, prefix: str = "blobs", *, credentials: bool = True) -> str:
    """The blob_url of ``bucket``/``prefix`` on the emulator, credentials in the URL or not."""
    url = f"s3://{bucket}/{prefix}?endpoint={endpoint}&region={REGION}"
    if credentials:
        url += f"&access_key_id={ACCESS_KEY_ID}&secret_access_key={SECRET_ACCESS_KEY}"
    return url
