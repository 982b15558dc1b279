"""Credentials in a backend URL are masked wherever siglo prints or reprs it (defect 8).

Before: a password in the URL appeared in ``siglo check`` output, its JUnit XML and
``repr(backend)``. Against real servers: PostgreSQL (trust auth ignores the password)
and a private redis-server started with ``--requirepass``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _redis_helpers import RedisServer, require_redis
from ports import free_port
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo import InvalidArgumentError

PASSWORD = "pw-Sekr3t-91c4"


def _with_password(url: str, user: str = "") -> str:
    scheme, rest = url.split("://", 1)
    rest = rest.split("@", 1)[-1]
    return f"{scheme}://{user}:{PASSWORD}@{rest}"


def _siglo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "siglo", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture
def redis_with_password() -> RedisServer:
    require_redis()
    server = RedisServer(free_port(30200, 30300), "--requirepass", PASSWORD).start()
    yield server  # type: ignore[misc]
    server.stop()


async def test_repr_of_a_backend_masks_the_password(redis_with_password: RedisServer) -> None:
    require_postgres()
    url = _with_password(redis_with_password.url)
    async with siglo.connect(url) as backend:
        await backend.adapter.set_cached_step("k", 1)  # the password really works
        assert PASSWORD not in repr(backend)
        assert "***" in repr(backend)
        assert backend.url == url  # the URL itself is kept, to reconnect
    pg = _with_password(POSTGRES_URL, "postgres")
    async with siglo.connect(pg) as backend:
        assert await backend.adapter.get_checkpoint("nothing") is None
        assert PASSWORD not in repr(backend)


def test_siglo_check_output_and_junit_xml_mask_the_password(tmp_path: Path) -> None:
    require_postgres()
    xml = tmp_path / "report.xml"
    url = _with_password(POSTGRES_URL, "postgres")
    done = _siglo("check", url, "--rule", "checkpoint.occ", "--junit-xml", str(xml))
    assert done.returncode == 0, done.stdout + done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    report = xml.read_text()
    assert "checkpoint.occ" in report
    assert PASSWORD not in report


def test_siglo_check_failure_masks_the_password(redis_with_password: RedisServer) -> None:
    wrong = redis_with_password.url.replace("redis://", "redis://:Wrong-" + PASSWORD + "@")
    done = _siglo("check", wrong, "--rule", "checkpoint.occ")
    assert done.returncode != 0
    assert PASSWORD not in done.stdout + done.stderr, done.stdout + done.stderr


def test_error_messages_about_a_url_mask_the_password() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        siglo.connect(f"redis://:{PASSWORD}@127.0.0.1:6379/not-a-number")
    assert PASSWORD not in str(info.value)
    with pytest.raises(siglo.SigloError) as unknown:
        siglo.connect(f"nosuchscheme://user:{PASSWORD}@host/db")
    assert PASSWORD not in str(unknown.value)


def _blob_urls(redis: RedisServer) -> list[str]:
    """Blob stores on real servers whose connection fails with the password in the URL: a
    Redis that refuses it (another password than its own) and a PostgreSQL database that
    does not exist."""
    require_postgres()
    wrong = redis.url.replace("redis://", "redis://:Wrong-" + PASSWORD + "@")
    pg = _with_password(POSTGRES_URL, "postgres").rsplit("/", 1)[0] + "/siglo_no_such_db"
    return [f"{wrong}?prefix=masked-blobs:", pg]


async def test_blob_store_errors_mask_the_password(redis_with_password: RedisServer) -> None:
    """A blob store's own failure (and its bounded wrapper's) names its URL without the
    password: the store records its URL masked, whichever plugin opened it."""
    from siglo.blobs import blob_digest, bounded, open_blob_store

    for url in _blob_urls(redis_with_password):
        for store in (open_blob_store(url), bounded(open_blob_store(url), 5_000)):
            try:
                assert PASSWORD not in store.url and "***" in store.url, store.url
                with pytest.raises(siglo.StorageAdapterError) as failed:
                    await store.put(blob_digest(b"x"), b"x")
                assert PASSWORD not in str(failed.value), failed.value
            finally:
                await store.aclose()


def test_siglo_collect_blobs_masks_the_blob_store_password(
    redis_with_password: RedisServer, tmp_path: Path
) -> None:
    # The store is there (collect-blobs refuses a database that is not): the blob store fails.
    assert _siglo("migrate", f"sqlite:///{tmp_path / 'siglo.db'}").returncode == 0
    for url in _blob_urls(redis_with_password):
        config = tmp_path / "siglo.toml"
        config.write_text(
            f'url = "sqlite:///{tmp_path / "siglo.db"}"\nblob_url = "{url}"\n'
            "offload_min_bytes = 100\n"
        )
        done = _siglo("--config", str(config), "collect-blobs")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "blob store" in done.stderr, done.stderr
        assert PASSWORD not in done.stdout + done.stderr, done.stdout + done.stderr


SENTINEL_SECRET = "sentinel-Sekr3t-77ab"


def test_a_drivers_error_text_never_carries_a_urls_secret(tmp_path: Path) -> None:
    """redis-py's "no master found" names its Sentinel clients with their
    ``password=…``; siglo puts the driver's text in its errors. The secret is masked in
    the command's ``Error:`` line, in the ``--debug`` traceback (the driver's exception
    is its cause), in the exception ``siglo.connect`` users get, and in a log record of
    a siglo logger that carries the driver's exception (best-effort mode), and in the
    traceback an application's own logger prints of siglo's error (the driver's
    exception chained below it)."""
    require_redis()
    port = free_port(30400, 30500)  # no Sentinel answers here
    url = (
        f"redis+sentinel://127.0.0.1:{port}/mymaster?sentinel_password={SENTINEL_SECRET}"
        "&sentinel_username=watcher&command_timeout_ms=10000"  # the refusal, not a timeout
    )
    for args in (("ls", url), ("--debug", "ls", url)):
        done = _siglo(*args)
        assert done.returncode == 1, done.stdout + done.stderr
        assert SENTINEL_SECRET not in done.stdout + done.stderr, done.stderr
        assert "***" in done.stderr  # the text that held it is there, masked
    script = f"""
import asyncio, io, logging, siglo
stream = io.StringIO()
logging.getLogger("siglo").addHandler(logging.StreamHandler(stream))
async def main():
    try:
        async with siglo.connect({url!r}) as backend:
            await backend.adapter.get_checkpoint("s")
    except siglo.SigloError as exc:
        # The application's own logger, before anything else reads the error: its
        # traceback prints the driver's exception chained below siglo's.
        app = io.StringIO()
        logging.getLogger("app").addHandler(logging.StreamHandler(app))
        logging.getLogger("app").exception("a save failed")
        print("app:", app.getvalue())
        print("error:", exc)
    # The driver's own exception, as error modes log it, with its traceback.
    from siglo.error_modes import logger
    try:
        raise ConnectionError("password={SENTINEL_SECRET} in a driver's text")
    except ConnectionError as exc:
        logger.warning("siglo: %s failed: %s", "a call", exc, exc_info=exc)
    print("log:", stream.getvalue())
asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
        cwd=tmp_path,
    )
    assert "error:" in done.stdout and "log:" in done.stdout, done.stdout + done.stderr
    assert "MasterNotFoundError" in done.stdout, done.stdout  # the chain was printed
    assert SENTINEL_SECRET not in done.stdout + done.stderr, done.stdout
    assert done.stdout.count("***") >= 2


def test_every_siglo_logger_scrubs_its_records() -> None:
    """A logger made with ``logging.getLogger`` would log a driver's text unscrubbed:
    every logger in siglo and its backends is made by ``siglo.masking.logger``."""
    root = Path(__file__).resolve().parents[2]
    found = [
        f"{path.relative_to(root)}"
        for base in ("siglo", "backends")
        for path in (root / base).rglob("*.py")
        if 'logging.getLogger("siglo' in path.read_text()
    ]
    assert found == []


def test_a_short_password_is_masked_where_a_text_sets_it_not_everywhere() -> None:
    """A short password is often a word the error holds for another reason (the user
    ``app`` with the password ``app``, ``postgres``, a port): masked where the text sets
    it, the error still says what went wrong; a long secret is masked wherever it is."""
    from siglo import masking

    for secret in ("app", "postgres", "6399", "a-long-Secret-1234"):
        masking.remember(secret)
    assert masking.scrub('role "app" does not exist') == 'role "app" does not exist'
    assert masking.scrub("postgresql://127.0.0.1:6399") == "postgresql://127.0.0.1:6399"
    assert masking.scrub("Connection(username=app,password=app,db=0)") == (
        "Connection(username=app,password=***,db=0)"
    )
    assert masking.scrub("sentinel_password: postgres") == "sentinel_password: ***"
    assert masking.scrub("redis://app:app@host") == "redis://app:***@host"
    assert masking.scrub("said a-long-Secret-1234 once") == "said *** once"


async def test_a_fingerprint_that_is_not_a_string_is_named_by_its_type_alone() -> None:
    """docs/safety.md fingerprints "the request body": passed as the body's bytes by
    mistake, it is refused by its type — the body (a card number here) is in no error
    message, so in no span status or log either."""
    body = b'{"order": 17, "card": "4242 4242 4242 4242"}'
    async with siglo.connect("memory://") as backend:
        payments = backend.require_idempotency()
        for call in (
            payments.claim("charge-17", fingerprint=body),  # type: ignore[arg-type]
            payments.claim_owned("charge-18", fingerprint=body),  # type: ignore[arg-type]
        ):
            with pytest.raises(siglo.InvalidArgumentError, match="got bytes") as refused:
                await call
            assert "4242" not in str(refused.value)
            assert "4242" not in repr(refused.value.args)
