"""A local S3 emulator for the S3 blob store's tests: moto's server on a free loopback
port (``moto[server]``, in the dev extra), one bucket per test."""

from __future__ import annotations

import secrets
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

# moto's server accepts any credentials; these only show where a URL carries them.
ACCESS_KEY_ID = "siglo-test-key"
SECRET_ACCESS_KEY = "siglo-test-SECRET-do-not-show"
REGION = "us-east-1"


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port), stopped after; yields its endpoint."""
    import logging

    from moto.server import ThreadedMotoServer

    # Its HTTP server logs every request; a failing test shows siglo's messages instead.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


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
