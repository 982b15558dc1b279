"""Options in a backend URL's query string, and URLs safe to print.

A backend's options can ride in its URL (``redis://host/0?prefix=app:&cache_ttl_ms=1000``)
so that ``siglo.connect(backend.url)`` in another process reaches the same storage with
the same settings. Every built-in backend, and any plugin, reads them the same way:

.. code-block:: python

    from siglo import urls

    OPTIONS = {"cache_ttl_ms": urls.integer, "compress": urls.boolean}
    base, options = urls.split_options(url, OPTIONS)  # typed; other parameters stay
    url = urls.with_options(base, options)  # and back

A value that does not convert raises :class:`~siglo.errors.InvalidArgumentError` naming
the option, and so does an option no one reads (:func:`refuse_unknown`, with the closest
known name: ``prefx — did you mean prefix?``): a typo never falls through to a driver
that would hang on it or be silently ignored. :func:`mask_credentials` hides the
password of a URL (in its user info or its query) before the URL is logged or shown.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit

from siglo.errors import InvalidArgumentError
from siglo.masking import MASK, remember

__all__ = [
    "MASK",
    "OBJECT_OPTIONS",
    "Converter",
    "boolean",
    "integer",
    "is_secret_parameter",
    "mask_credentials",
    "optional_integer",
    "picks_store",
    "query_names",
    "refuse_fragment",
    "refuse_unknown",
    "REACH_OPTIONS",
    "same_store",
    "unknown_option_error",
    "split_options",
    "text",
    "typed_keywords",
    "url_value",
    "with_options",
]

Converter = Callable[[str, str], Any]
"""Turns one query value into its typed value: ``(option name, text) -> value``."""


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_NONE: Final = frozenset({"", "none", "null"})
_SECRET_PARAMETERS: Final = frozenset(
    {
        "password",
        "passwd",
        "pass",
        "sslpassword",
        "sentinel_password",
        "secret",
        "token",
        "api_key",
        "apikey",
        # An S3 blob store's (siglo.s3), as obstore and the AWS variables name them.
        "secret_access_key",
        "session_token",
        "aws_secret_access_key",
        "aws_session_token",
    }
)


_DECIMAL: Final = re.compile(r"[+-]?[0-9]+")


def read_decimal(value: str) -> int | None:
    """``value`` read as an integer written in ASCII digits (a sign, and spaces around it,
    allowed), or ``None``. ``int()`` also reads ``"1_000"`` and digits of other scripts
    (``"١٢٣"``, fullwidth ``"５"``): a timeout or a byte count written so is a typo or a
    paste, not a number anybody meant, and every place siglo reads a number from text
    (a URL's query, a settings file's text, a ``SIGLO_*`` variable) refuses it alike."""
    stripped = value.strip()
    return int(stripped) if _DECIMAL.fullmatch(stripped) else None


def integer(name: str, value: str) -> int:
    """An integer (``"10000"``), in ASCII digits (:func:`read_decimal`)."""
    read = read_decimal(value)
    if read is None:
        raise InvalidArgumentError(f"URL option {name} must be an integer, got {value!r}")
    return read


def optional_integer(name: str, value: str) -> int | None:
    """An integer, or ``None`` for ``none``, ``null`` or an empty value."""
    return None if value.lower() in _NONE else integer(name, value)


def boolean(name: str, value: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``)."""
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidArgumentError(f"URL option {name} must be true or false, got {value!r}")


def text(name: str, value: str) -> str:
    """The value as given."""
    return value


def _split(url: str) -> tuple[str, list[tuple[str, str]]]:
    # Not urlsplit/urlunsplit: they turn "sqlite://" into "sqlite:".
    base, _, query = url.partition("?")
    return base, parse_qsl(query, keep_blank_values=True)


def _join(base: str, query: list[tuple[str, str]]) -> str:
    return f"{base}?{urlencode(query)}" if query else base


def split_options(url: str, options: Mapping[str, Converter]) -> tuple[str, dict[str, Any]]:
    """``url`` without the query parameters named in ``options``, and those converted.

    Every other query parameter stays in the returned URL (for the driver). Raises
    :class:`~siglo.errors.InvalidArgumentError` naming the option whose value does not
    convert.
    """
    base, query = _split(url)
    ours: dict[str, Any] = {}
    theirs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in query:
        if name in seen:
            # The last would win silently (prefix=a&prefix=b: another store than meant).
            raise InvalidArgumentError(
                f"URL option {name!r} is given twice in {mask_credentials(url)!r}"
            )
        seen.add(name)
        convert = options.get(name)
        if convert is None:
            theirs.append((name, value))
        else:
            ours[name] = convert(name, value)
    return _join(base, theirs), ours


def typed_keywords(
    options: Mapping[str, Any], converters: Mapping[str, Converter]
) -> dict[str, Any]:
    """``options`` given as keyword arguments, each text value of an option the backend
    reads from a URL's query read as the query's would be (``"none"``, ``"16384"``,
    ``"false"``): a settings file's ``[options]`` (TOML has no null) and a keyword say
    what the URL's query says. Values of other types pass as they are, for the backend
    to check."""
    typed: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, str) and name in converters:
            try:
                value = converters[name](name, value)
            except InvalidArgumentError as exc:
                # The converters speak of the query; this one was a keyword.
                raise InvalidArgumentError(str(exc).replace("URL option ", "option ", 1)) from None
        typed[name] = value
    return typed


def refuse_fragment(url: str) -> None:
    """Refuse a backend URL with a ``#``, naming its scheme alone.

    ``urlsplit`` takes everything after a ``#`` for a fragment, silently: a ``#`` in a
    password (``postgresql://u:pa#ss@db/app``) would leave the host and the database
    behind (and the password's start be read as a port, into an error's text), and
    ``sqlite:///a.db#x`` would open ``a.db``. What follows the ``#`` may be the rest of
    a password, and so may what precedes it (``u:pa`` is no user and password to
    mask without its ``@``): only the scheme is shown."""
    if "#" in url:
        kind = f"a {url.split('://', 1)[0]}:// backend URL" if "://" in url else "a backend URL"
        raise InvalidArgumentError(
            f"{kind} has a `#` (not shown: it may be in a password): a "
            "backend URL takes no fragment, and a `#` in a password or a path is "
            "written %23"
        )


def query_names(url: str) -> frozenset[str]:
    """The names of ``url``'s query parameters."""
    return frozenset(name for name, _ in _split(url)[1])


def unknown_option_error(
    backend: str,
    unknown: Iterable[str],
    known: Iterable[str],
    *,
    where: str = "URL",
    also: str = "",
    suggest: Iterable[str] = (),
) -> InvalidArgumentError:
    """The error for options ``backend`` does not know: each one named, with the closest
    name of ``known`` or ``suggest`` when there is one, then the ``known`` names (and
    ``also``, a sentence on what else is accepted, such as a driver's own parameters)."""
    known_names = sorted(set(known))
    candidates = sorted(set(known_names) | set(suggest))
    parts = []
    for name in sorted(set(unknown)):
        # Another name of a known option (Redis's key_prefix for prefix) is that option,
        # however close another name is spelt (lock_key_prefix).
        alias = _OPTION_ALIASES.get(name)
        close = (
            [alias]
            if alias in candidates
            else difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
        )
        parts.append(f"{name!r} — did you mean {close[0]}?" if close else repr(name))
    plural = "s" if len(parts) > 1 else ""
    if known_names:
        known_text = f"known: {', '.join(known_names)}{'; ' + also if also else ''}"
    else:
        known_text = f"a {backend} {where} takes no options{': ' + also if also else ''}"
    return InvalidArgumentError(
        f"unknown {backend} {where} option{plural} {'; '.join(parts)} ({known_text})"
    )


def refuse_unknown(
    url: str,
    known: Iterable[str],
    *,
    backend: str,
    driver: Iterable[str] | None = (),
    also: str = "",
) -> None:
    """Raise :func:`unknown_option_error` for a query parameter of ``url`` that is neither
    in ``known`` (the backend's options) nor in ``driver`` (parameters the URL passes on
    to a driver; ``None``: the driver is not installed, any name passes on)."""
    if driver is None:
        return
    known_set = frozenset(known)
    driver_set = frozenset(driver)
    unknown = [n for n in query_names(url) if n not in known_set and n not in driver_set]
    if unknown:
        raise unknown_option_error(backend, unknown, known_set, also=also, suggest=driver_set)


def url_value(value: Any) -> str:
    """How :func:`with_options` writes a value: ``true``/``false``, ``none``, or ``str``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


def with_options(url: str, options: Mapping[str, Any]) -> str:
    """``url`` with ``options`` set as query parameters, replacing any of the same name.

    Values are written by :func:`url_value`, so the converters above read them back.
    """
    if not options:
        return url
    base, query = _split(url)
    query = [(k, v) for k, v in query if k not in options]
    query += [(k, url_value(v)) for k, v in options.items()]
    return _join(base, query)


def mask_credentials(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for logs and messages.

    The password of the user info (``redis://user:secret@host``) and the values of query
    parameters that carry secrets (``password``, ``sslpassword``, ``token`` …) are masked;
    the rest of the URL, user name included, is kept as written, so the URL still says
    where it goes.
    """
    base, sep, query = url.partition("?")
    scheme_end = base.find("://")
    if scheme_end >= 0:
        start = scheme_end + 3
        # The last "@" ends the user info even when an unescaped "/" or "@" is in the
        # password: masking too much is safe, showing a password is not.
        at = base.rfind("@", start)
        userinfo = base[start:at] if at >= 0 else ""
        if ":" in userinfo:
            user, _, password = userinfo.partition(":")
            _remember_both(password)
            base = f"{base[:start]}{user}:{MASK}{base[at:]}"
    if query:
        pieces = query.split("&")
        for i, piece in enumerate(pieces):
            name, equals, value = piece.partition("=")
            if equals and unquote_plus(name).lower() in _SECRET_PARAMETERS:
                _remember_both(value)
                pieces[i] = f"{name}={MASK}"
        query = "&".join(pieces)
    return base + sep + query


def _remember_both(value: str) -> None:
    """A secret as written in a URL and as a driver is given it (percent-decoded): kept
    out of siglo's error texts (:mod:`siglo.masking`)."""
    remember(value)
    remember(unquote_plus(value))


def is_secret_parameter(name: str) -> bool:
    """Whether a URL parameter or backend option named ``name`` holds a secret whose
    value siglo masks where it prints the URL and keeps out of its errors."""
    return name.lower() in _SECRET_PARAMETERS


def remember_secret_options(options: Mapping[str, Any]) -> None:
    """The values of the secret options in ``options`` (a backend's ``password=`` …),
    kept out of siglo's error texts (:mod:`siglo.masking`)."""
    for name, value in options.items():
        if name.lower() in _SECRET_PARAMETERS and isinstance(value, str):
            remember(value)


REACH_OPTIONS: Final = frozenset(
    {
        # siglo's options of every built-in backend: bounds, pools, lifetimes, behaviour.
        "auto_migrate",
        "busy_timeout_ms",
        "cache_ttl_ms",
        "checkpoint_ttl_ms",
        "claim_lease_ms",
        "clean_batch_size",
        "clock",
        "command_timeout_ms",
        "connect_timeout_ms",
        "idempotency_lease_ms",
        "idempotency_ttl_ms",
        "incremental_min_bytes",
        "pool_max_size",
        "pool_min_size",
        "pool_timeout_ms",
        "prepare_threshold",
        "record_context_changes",
        "synchronous",
        "workflow_lock_timeout_ms",
        "workflow_lock_ttl_ms",
        # Redis: the client's, and redis-py's connection parameters.
        "auto_pipeline",
        "cluster",
        "reinitialize_steps",
        "sentinel_password",
        "sentinel_username",
        "strict_atomicity",
        "wait_replicas",
        "wait_timeout_ms",
        "client_name",
        "health_check_interval",
        "max_connections",
        "retry_on_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_timeout",
        # PostgreSQL: through PgBouncer (its address is the URL's), and libpq's
        # parameters of how to connect and authenticate, not what to open.
        "pgbouncer",
        "application_name",
        "connect_timeout",
        "keepalives",
        "keepalives_count",
        "keepalives_idle",
        "keepalives_interval",
        "password",
        "sslcert",
        "sslkey",
        "sslmode",
        "sslpassword",
        "sslrootcert",
    }
)
"""Options and query parameters that say how to reach a store or how to behave in it,
never which store it is. Every other one — in the query or as a keyword option: a
``prefix``, ``schema``, ``table_prefix`` or database, libpq's ``options`` (a
``search_path``) or ``service``, a client given whole, any plugin's own — may pick
another store, so :func:`same_store` takes two connections for one store only when
they agree on all of those."""

OBJECT_OPTIONS: Final[Mapping[str, str]] = {"clock": "a siglo.Clock", "client": "a Redis client"}
"""Options of the built-in backends whose value is an object, by what it is: given as
keywords to ``siglo.connect`` in code. No URL carries one, and a settings file's
``[options]`` holds none (:class:`siglo.config.Settings` refuses them by name)."""

_OPTION_ALIASES: Final = {"key_prefix": "prefix"}
"""Option names a backend takes for another (Redis's ``key_prefix`` is ``prefix``)."""


def option_name(name: str) -> str:
    """The name a backend knows option ``name`` by in a URL's query (Redis's
    ``key_prefix`` is ``prefix``)."""
    return _OPTION_ALIASES.get(name, name)


def picks_store(name: str) -> bool:
    """Whether an option or query parameter named ``name`` may pick which store a
    connection opens (it is not in :data:`REACH_OPTIONS`)."""
    return _OPTION_ALIASES.get(name, name) not in REACH_OPTIONS


def _store_identity(url: str, options: Mapping[str, Any]) -> tuple[Any, ...]:
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    path = parts.path
    if scheme == "sqlite":
        # sqlite:///app.db, sqlite:///./app.db and the absolute path are one file.
        file = path[1:] if path.startswith("/") else path
        # realpath: `link/../app.db` is the file the system opens, through the link.
        path = os.path.realpath(file) if file and file != ":memory:" else file
    elif scheme.startswith("redis"):
        path = path.strip("/") or "0"
    try:
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        host, port = parts.netloc.lower(), None
    # On PostgreSQL the role picks the schema too (the default search_path starts with
    # "$user"); elsewhere a user sees the same store.
    role = unquote_plus(parts.username or "") if scheme.startswith("postgres") else ""
    server = (host, port, role)
    picked: dict[str, Any] = {}
    # A blank value is a value: libpq reads `?dbname=` as "the default database" (the
    # role's), SQLite `?table_prefix=` as no prefix — each another store.
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        name = _OPTION_ALIASES.get(name, name)
        if picks_store(name):
            picked[name] = value
    # A keyword option wins over the URL's query, as the backends' factories take them;
    # an alias (`key_prefix`) loses to its name (`prefix`) given too. `None` is a value
    # of its own: what it means is the backend's (no SQL table prefix, say), so it is
    # the same store only as another `None`.
    ordered = sorted(options.items(), key=lambda item: item[0] not in _OPTION_ALIASES)
    for name, value in ordered:
        name = _OPTION_ALIASES.get(name, name)
        if not picks_store(name):
            continue
        if value is None:
            picked[name] = ("none",)
        elif isinstance(value, str | int | float | bool):
            picked[name] = str(value)
        else:  # an object (a client): one store only with that very object
            picked[name] = ("object", id(value))
    return scheme, server, path, tuple(sorted(picked.items(), key=lambda item: item[0]))


def same_store(
    first: str,
    second: str,
    first_options: Mapping[str, Any] | None = None,
    second_options: Mapping[str, Any] | None = None,
) -> bool:
    """Whether two backend URLs, each connected with its keyword options, name the same
    store, however each spells it: the same scheme, server, database (a SQLite file by
    its absolute path; a PostgreSQL database with its role), and the same value of every
    option that may pick a store on it (``prefix``, ``schema``, ``table_prefix``, libpq's
    ``options`` … — any but :data:`REACH_OPTIONS`, from the query or the keyword options,
    which win), whatever they say of how to reach it (timeouts, pool sizes, passwords).
    When unsure it answers no: another store keeps its values inline, and
    ``siglo collect-blobs`` refuses it, where a wrong yes would let the collector remove
    blobs the settings' store still references."""
    return _store_identity(first, first_options or {}) == _store_identity(
        second, second_options or {}
    )
