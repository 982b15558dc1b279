"""siglo.urls: URL query options read one way by every backend, and masked credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

import siglo
from siglo import urls
from siglo.config import Settings
from siglo.connect import is_settings_store, options_for
from siglo.errors import InvalidArgumentError
from siglo.plugins import get_registry

OPTIONS = {
    "ttl_ms": urls.integer,
    "retention_ms": urls.optional_integer,
    "on": urls.boolean,
    "prefix": urls.text,
}


def test_split_options_types_ours_and_keeps_the_rest() -> None:
    base, ours = urls.split_options(
        "redis://h:6379/0?ttl_ms=5&db=2&on=YES&retention_ms=none&prefix=a:b", OPTIONS
    )
    assert base == "redis://h:6379/0?db=2"
    assert ours == {"ttl_ms": 5, "on": True, "retention_ms": None, "prefix": "a:b"}


def test_split_options_keeps_a_url_without_host_as_written() -> None:
    assert urls.split_options("sqlite://", OPTIONS) == ("sqlite://", {})
    assert urls.split_options("sqlite://?on=0", OPTIONS) == ("sqlite://", {"on": False})


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("ttl_ms=soon", "URL option ttl_ms must be an integer, got 'soon'"),
        ("retention_ms=1.5", "URL option retention_ms must be an integer, got '1.5'"),
        ("on=maybe", "URL option on must be true or false, got 'maybe'"),
    ],
)
def test_a_bad_value_names_its_option(query: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        urls.split_options(f"redis://h/0?{query}", OPTIONS)
    assert str(caught.value) == message


def test_with_options_round_trips_through_split_options() -> None:
    values = {"ttl_ms": 7, "retention_ms": None, "on": False, "prefix": "x y&z"}
    url = urls.with_options("sqlite:///a.db?keep=1&ttl_ms=1", values)
    assert url.startswith("sqlite:///a.db?keep=1&")
    assert urls.split_options(url, OPTIONS) == ("sqlite:///a.db?keep=1", values)
    assert urls.with_options("sqlite://", {}) == "sqlite://"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:secret@h/0?db=1", "redis://user:***@h/0?db=1"),
        ("redis://u:p/w@rd@h/0", "redis://u:***@h/0"),
        (
            "postgresql://app:p%40ss@db/x?sslmode=require&password=pw&sslpassword=k",
            "postgresql://app:***@db/x?sslmode=require&password=***&sslpassword=***",
        ),
        ("postgresql://u:p@[::1]:5432/d", "postgresql://u:***@[::1]:5432/d"),
        ("unix:///tmp/r.sock?password=s&db=1", "unix:///tmp/r.sock?password=***&db=1"),
        ("redis://user@h/0", "redis://user@h/0"),
        (
            "redis+sentinel://:m@h1:26379,h2/svc/0?sentinel_password=s",
            "redis+sentinel://:***@h1:26379,h2/svc/0?sentinel_password=***",
        ),
        ("sqlite://", "sqlite://"),
        ("sqlite:///tmp/a@b.db", "sqlite:///tmp/a@b.db"),
    ],
)
def test_mask_credentials(url: str, masked: str) -> None:
    assert urls.mask_credentials(url) == masked


def test_backends_read_url_options_with_the_shared_parser() -> None:
    with pytest.raises(InvalidArgumentError, match="URL option cache_ttl_ms must be an integer"):
        siglo.connect("sqlite://?cache_ttl_ms=abc")
    with pytest.raises(InvalidArgumentError, match="URL option cluster must be true or false"):
        siglo.connect("redis://127.0.0.1:6379/0?cluster=perhaps")
    with pytest.raises(InvalidArgumentError, match="URL option prepare_threshold must be an"):
        siglo.connect("postgresql://127.0.0.1/test?prepare_threshold=x")


async def test_backend_urls_carry_their_options_back() -> None:
    backend = siglo.connect("sqlite://?table_prefix=app_&cache_ttl_ms=5")
    try:
        # Every option rides back, not only those that pick the tables: a worker
        # connected with backend.url runs as this process does.
        assert backend.url == "sqlite://?table_prefix=app_&cache_ttl_ms=5"
    finally:
        await backend.aclose()
    backend = siglo.connect("redis://127.0.0.1:6379/0?db=0", checkpoint_ttl_ms=None)
    try:
        assert backend.url == "redis://127.0.0.1:6379/0?db=0&checkpoint_ttl_ms=none"
    finally:
        await backend.aclose()


PG = "postgresql://127.0.0.1/app"
RD = "redis://127.0.0.1:6379"


@pytest.mark.parametrize(
    ("settings_url", "settings_options", "url", "options", "theirs"),
    [
        # The settings' PostgreSQL store is their URL's database with their [options]'
        # schema: the same URL spelt with another query option opens `public`.
        (PG, {"schema": "appa"}, PG, {}, True),
        (
            PG,
            {"schema": "appa"},
            PG + "?connect_timeout=10",
            {},
            False,
        ),
        (
            PG,
            {"schema": "appa"},
            PG + "?connect_timeout=10&schema=appa",
            {},
            True,
        ),
        (
            PG,
            {"schema": "appa"},
            PG,
            {"schema": "appb"},
            False,
        ),
        (PG, {}, PG, {"schema": "appb"}, False),
        (RD + "/0", {"prefix": "app:"}, RD, {}, False),
        (
            RD + "/0",
            {"prefix": "app:"},
            RD + "?prefix=app:",
            {},
            True,
        ),
        (
            RD + "/0",
            {"prefix": "app:"},
            RD + "/0",
            {"prefix": None},
            False,
        ),
        ("sqlite:///app.db", {"table_prefix": "app_"}, "sqlite:///./app.db", {}, False),
        (
            "sqlite:///app.db",
            {"table_prefix": "app_"},
            "sqlite:///./app.db?table_prefix=app_",
            {},
            True,
        ),
        # Redis's key_prefix is its prefix (a black-box auditor: the settings' key_prefix
        # was not compared, and collect-blobs on the default prefix removed their blobs).
        (RD + "/15", {"key_prefix": "app:"}, RD + "/15?command_timeout_ms=5000", {}, False),
        (RD + "/15", {}, RD + "/15", {"key_prefix": "app:"}, False),
        (RD + "/15", {"key_prefix": "app:"}, RD + "/15?prefix=app:", {}, True),
        (RD + "/15", {"prefix": "app:"}, RD + "/15", {"key_prefix": "app:"}, True),
        # libpq's options (a search_path), service and role pick the schema or server:
        # any option not known to say only how to reach the store may pick another.
        (PG, {}, PG + "?options=-csearch_path%3Dother", {}, False),
        (PG, {}, PG + "?service=other", {}, False),
        (PG, {}, "postgresql://other@127.0.0.1/app", {}, False),
        (PG, {}, PG + "?sslmode=prefer&application_name=x&password=p", {}, True),
        ("sqlite:///app.db", {}, "sqlite:///app.db", {"some_plugin_option": "x"}, False),
        (RD + "/0", {}, RD + "/0", {"client": object()}, False),
        (RD + "/0", {}, RD + "/0?socket_timeout=5&auto_pipeline=false", {}, True),
        # A blank value is a value (libpq's `?dbname=`: the role's database; SQLite's
        # `?table_prefix=`: no prefix), and so is a keyword None (a second auditor).
        ("postgresql://app@127.0.0.1/db", {}, "postgresql://app@127.0.0.1/db?dbname=", {}, False),
        ("postgresql://app@127.0.0.1/db", {}, "postgresql://app@127.0.0.1/db?user=", {}, False),
        ("sqlite:///app.db", {}, "sqlite:///app.db?table_prefix=", {}, False),
        ("sqlite:///app.db", {}, "sqlite:///app.db", {"table_prefix": None}, False),
        # Redis: a keyword key_prefix wins over the query's prefix, as connect takes it.
        (RD + "/0?prefix=b:", {}, RD + "/0?prefix=a:", {"key_prefix": "b:"}, True),
        (RD + "/0?prefix=a:", {}, RD + "/0?prefix=a:", {"key_prefix": "b:"}, False),
        (RD + "/0", {}, RD + "/0", {"prefix": "a:", "key_prefix": "b:"}, False),
        (RD + "/0?prefix=a:", {}, RD + "/0", {"prefix": "a:", "key_prefix": "b:"}, True),
    ],
)
def test_the_settings_store_is_their_url_with_their_options(
    settings_url: str,
    settings_options: dict[str, str],
    url: str,
    options: dict[str, str | None],
    theirs: bool,
) -> None:
    """Whether a connection opens the settings' store (the one their blob store goes
    with) is decided on the store, the options that pick it included, however its URL
    is spelt: a URL naming their database without their schema is another store."""
    settings = Settings(url=settings_url, options=settings_options)
    effective, _ = options_for(url, settings, options)
    assert is_settings_store(url, effective, settings) is theirs


def test_a_sqlite_path_through_a_link_is_the_file_the_system_opens(tmp_path: Path) -> None:
    """``link/../app.db`` with ``link`` a symbolic link is the ``app.db`` beside the
    link's target, not the one beside the link (a second auditor: the collector walked
    another file's checkpoints)."""
    (tmp_path / "sub" / "d").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "sub" / "d")
    settings = Settings(url=f"sqlite:///{tmp_path}/app.db")
    for url, theirs in (
        (f"sqlite:///{tmp_path}/link/../app.db", False),
        (f"sqlite:///{tmp_path}/link/../../app.db", True),
        (f"sqlite:///{tmp_path}/sub/../app.db", True),
    ):
        assert is_settings_store(url, {}, settings) is theirs, url


def test_every_built_in_backend_option_is_said_to_pick_a_store_or_not() -> None:
    """Each option of the built-in backends is either known to say only how to reach a
    store (``REACH_OPTIONS``) or listed here as picking one: an option added later is
    classified here first (unlisted, it counts as picking one — the safe side)."""
    from siglo.urls import REACH_OPTIONS, picks_store
    from siglo_memory.connect import KEYWORD_OPTIONS as MEMORY
    from siglo_postgres.connect import POSTGRES_OPTIONS
    from siglo_redis.client import OPTIONS as REDIS
    from siglo_sqlite.connect import SQLITE_OPTIONS

    picking = {"prefix", "key_prefix", "lock_key_prefix", "schema", "table_prefix", "client"}
    options = {*MEMORY, *POSTGRES_OPTIONS, *REDIS, *SQLITE_OPTIONS, *picking}
    assert options - REACH_OPTIONS == picking
    assert all(picks_store(name) for name in picking)
    assert not any(picks_store(name) for name in options - picking)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///app.db#x",
        "postgresql://u:pa#ss@127.0.0.1:5432/app",
        "redis://:se#cret@127.0.0.1:6379/0",
        "memory://#",
    ],
)
def test_a_backend_url_with_a_hash_is_refused_without_showing_it(url: str) -> None:
    """``urlsplit`` reads what follows a ``#`` as a fragment, silently: ``sqlite:///a.db#x``
    opened ``a.db`` (a black-box auditor), and a ``#`` in a password left the host behind
    and put the password's start, read as a port, into the error. Refused by every way
    in (``siglo.connect``, the registry a command or ``siglo check`` resolves a URL with),
    naming the scheme alone."""
    for refuse in (siglo.connect, lambda u: get_registry().for_url(u)):
        with pytest.raises(InvalidArgumentError, match="has a `#`") as refused:
            refuse(url)
        # Nothing of the URL but its scheme.
        assert str(refused.value) == (
            f"a {url.split('://')[0]}:// backend URL has a `#` (not shown: it may be in a "
            "password): a backend URL takes no fragment, and a `#` in a password or a "
            "path is written %23"
        )
    # Written %23, it is a password (or a path) like any other.
    assert get_registry().for_url("postgresql://u:pa%23ss@127.0.0.1:5432/app").name == "postgres"
