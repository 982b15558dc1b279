"""The one configuration: what an application decides once, for every path (SPEC §4).

An application decides a few things about its stored state once: which context keys never
leave the process (``redact_fields``), what an adapter failure does (``error_mode``),
whether a namespaced read may fall back to the stack without a namespace, how long a call
to the server may take, and the backend's URL and options. :class:`Settings` holds those
decisions, and every path that writes, reads or prints stored data takes them from here:
:func:`siglo.connect`, :class:`siglo.StorageManager`, the synchronous facade, flows,
``siglo worker`` and every other ``siglo`` command, export and import.

The settings in effect are read, in this order, each later source winning:

1. the defaults below;
2. a file: ``$SIGLO_CONFIG`` if set, else the nearest ``siglo.toml``, or
   ``pyproject.toml`` with a ``[tool.siglo]`` table, found from the current directory
   upwards (as ruff and pytest find theirs);
3. ``SIGLO_*`` environment variables (:data:`ENVIRONMENT`);
4. explicit arguments: :func:`configure` in the application's code, or ``settings=`` /
   keyword arguments where a single call takes them.

``redact_fields`` is the exception: the keys of every source are redacted (a later source
adds keys, never removes one), so no layer can expose a field another one protects.
"""

from __future__ import annotations

import difflib
import os
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from siglo.errors import InvalidArgumentError
from siglo.keys import check_key_id, decode_key, is_local_scheme, shown_key_id
from siglo.redaction import check_redact_fields
from siglo.settings import DEFAULTS
from siglo.urls import OBJECT_OPTIONS, is_secret_parameter, mask_credentials, read_decimal

__all__ = [
    "CONFIG_ENV",
    "ENVIRONMENT",
    "FILE_NAMES",
    "Settings",
    "configure",
    "current_settings",
    "effective_settings",
    "find_config_file",
    "load_settings",
    "reset_settings",
    "settings_generation",
]

CONFIG_ENV: Final = "SIGLO_CONFIG"
"""The environment variable naming the settings file to read (instead of searching)."""

FILE_NAMES: Final = ("siglo.toml", "pyproject.toml")
"""The files searched for, in each directory from the current one upwards: ``siglo.toml``
(settings at its top level), then ``pyproject.toml`` (settings under ``[tool.siglo]``;
a ``pyproject.toml`` without that table does not count)."""

DEFAULT_BLOB_GRACE_MS: Final = 3_600_000
"""The default of :attr:`Settings.blob_grace_ms` (1 h)."""

_ERROR_MODES: Final = frozenset({"best-effort", "warn", "strict"})
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class Settings:
    """What an application decides once about its stored state (immutable).

    Build one with :func:`load_settings` (file, environment, then arguments), change one
    with :meth:`replace`, and make one the process's with :func:`configure`.
    """

    url: str | None = None
    """The backend URL :func:`siglo.connect` and every ``siglo`` command use when given
    none (``$SIGLO_URL``)."""
    redact_fields: frozenset[str] = frozenset()
    """Context keys whose values never leave the process: ``"[REDACTED]"`` at any depth in
    everything stored — checkpoints (contexts and metadata), the context-change stream,
    wait-record payloads, cached step outputs, idempotency results."""
    error_mode: str | None = None
    """``"best-effort"``, ``"warn"`` or ``"strict"``; ``None``: strict over a durable
    backend, best-effort over ``memory://`` (see :class:`siglo.StorageManager`)."""
    namespace_fallback: bool = True
    """Whether a namespaced read falls back to the stack saved without a namespace (the
    seed's behaviour); ``False`` keeps every tenant's reads inside its namespace."""
    command_timeout_ms: int | None = DEFAULTS.command_timeout_ms
    """The bound on every call to the server, for every backend that has one (``None``:
    unbounded)."""
    max_document_bytes: int | None = None
    """The largest checkpoint document a save may store, in bytes of its JSON as stored
    (after redaction and offloading; ``None``: only the backend's declared maximum). A
    save over it, or over the backend's maximum, raises
    :class:`~siglo.errors.DocumentTooLargeError` before anything is written
    (docs/large-state.md)."""
    offload_min_bytes: int | None = None
    """Context values and cached step outputs whose JSON is at least this long are stored
    in the blob store at :attr:`blob_url` and referenced (``None``: nothing is
    offloaded; docs/large-state.md)."""
    blob_url: str | None = None
    """Where offloaded values go: ``file:///path/to/dir`` or ``memory://``."""
    blob_grace_ms: int = DEFAULT_BLOB_GRACE_MS
    """How long past its keep-until an unreferenced blob is kept by the collector
    (``siglo collect-blobs``), and what an S3 blob store opened for a backend derives
    its ``refresh_ms`` from (a quarter of it; docs/large-state.md)."""
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Further options of the backend at :attr:`url` (a Redis ``prefix``, a PostgreSQL
    ``schema``, pool sizes …), passed to its factory when the URL is this one."""
    encryption_keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Key ids to base64 32-byte keys: payloads are encrypted (AES-256-GCM) with a key
    derived per namespace from the active one (docs/encryption.md). For development and
    simple deployments; ``master_key`` gives per-namespace keys that can be erased."""
    encryption_key_id: str | None = None
    """The id of ``encryption_keys`` new payloads use (``None``: the last one listed)."""
    master_key: str | None = None
    """The master key of per-namespace data keys stored in the backend: ``base64:<32
    bytes>``, or ``<scheme>:<reference>`` that a KMS plugin resolves."""
    require_encryption: bool = False
    """Refuse to read a payload stored in clear (:class:`~siglo.errors.EncryptionRequiredError`)."""
    blind_index_fields: frozenset[str] = frozenset()
    """Metadata fields that get a keyed hash (a blind index) beside the encrypted metadata,
    so ``list_checkpoints(metadata={...})`` and ``siglo ls --where`` can filter on them."""
    compression_min_bytes: int | None = None
    """Payloads whose JSON is at least this many bytes are compressed with zstd before
    they are (maybe) encrypted (``None``: never)."""
    source: str = "defaults"
    """Where these settings were read from (for messages; not a setting)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Settings:
        # The dataclass's __init__ refuses an unknown keyword with a bare TypeError;
        # configure() and replace() refuse it naming the known settings, and so does
        # Settings(...) here (``source`` is no setting, but the constructor takes it).
        _check_names({k: v for k, v in kwargs.items() if k != "source"}, "Settings()")
        return object.__new__(cls)

    def __post_init__(self) -> None:
        # Checked once, here: every way of building settings — Settings(...), replace(),
        # configure(), the file and the environment — comes through this, so each
        # setting's kind is checked before it is used, and a wrong one is refused naming
        # the setting and its source. A value of the wrong type must never reach a set
        # or a len() first: the bare TypeError named neither (a black-box auditor).
        # tests/core/test_settings_values.py gives every setting values of every kind.
        object.__setattr__(
            self, "redact_fields", _checked_redact_fields(self.redact_fields, self.source)
        )
        mode = self.error_mode
        if mode is not None and (not isinstance(mode, str) or mode not in _ERROR_MODES):
            raise InvalidArgumentError(
                f"error_mode must be one of {', '.join(sorted(_ERROR_MODES))}, "
                f"got {_shown(mode)} ({self.source})"
            )
        if self.url is not None and (not isinstance(self.url, str) or not self.url.strip()):
            raise InvalidArgumentError(
                f"url must be a non-empty string, got {_kind(self.url)} ({self.source})"
            )
        if self.url is not None and self.url != self.url.strip():
            # Spaces around it (a secret file's trailing newline) are not part of a URL:
            # kept, the application opened `e2.db ` and the commands, which strip what
            # they are given, `e2.db` — or another Redis prefix (a black-box auditor).
            object.__setattr__(self, "url", self.url.strip())
        if type(self.namespace_fallback) is not bool:
            raise InvalidArgumentError(
                f"namespace_fallback must be true or false, got {self.namespace_fallback!r} "
                f"({self.source})"
            )
        timeout = self.command_timeout_ms
        if timeout is not None and (type(timeout) is not int or timeout <= 0):
            raise InvalidArgumentError(
                f"command_timeout_ms must be a positive integer of milliseconds or none, "
                f"got {timeout!r} ({self.source})"
            )
        limit = self.max_document_bytes
        if limit is not None and (type(limit) is not int or limit <= 0):
            raise InvalidArgumentError(
                f"max_document_bytes must be a positive integer of bytes or none, "
                f"got {limit!r} ({self.source})"
            )
        least = self.offload_min_bytes
        if least is not None and (type(least) is not int or least <= 0):
            raise InvalidArgumentError(
                f"offload_min_bytes must be a positive integer of bytes or none, "
                f"got {least!r} ({self.source})"
            )
        if self.blob_url is not None and (not isinstance(self.blob_url, str) or not self.blob_url):
            raise InvalidArgumentError(
                f"blob_url must be a non-empty string, got {_kind(self.blob_url)} ({self.source})"
            )
        grace = self.blob_grace_ms
        if type(grace) is not int or grace < 0:
            raise InvalidArgumentError(
                f"blob_grace_ms must be an integer of milliseconds >= 0, got {grace!r} "
                f"({self.source})"
            )
        if not isinstance(self.options, Mapping) or not all(
            isinstance(k, str) for k in self.options
        ):
            raise InvalidArgumentError(
                f"options must be a table of option names to values, got "
                f"{type(self.options).__name__} ({self.source})"
            )
        for name, value in self.options.items():
            _check_option(name, value, self.source)
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        self._check_sealing()

    def _check_sealing(self) -> None:
        keys = self.encryption_keys
        if not isinstance(keys, Mapping):
            raise InvalidArgumentError(
                f"encryption_keys must be a table of key ids to base64 keys, got "
                f"{_kind(keys)} ({self.source})"
            )
        for key_id, text in keys.items():
            check_key_id(key_id, f"encryption_keys ({self.source})")
            decode_key(text, f"{shown_key_id(key_id)} of encryption_keys ({self.source})")
        object.__setattr__(self, "encryption_keys", MappingProxyType(dict(keys)))
        active = self.encryption_key_id
        if active is not None and not isinstance(active, str):
            # Only its kind is checked here: whether it is one of encryption_keys waits
            # for every source (the keys may come from the environment, the id from the
            # file: _check_combination). A non-text id is never quoted whole: a list may
            # hold a key written in the id's place.
            raise InvalidArgumentError(
                f"encryption_key_id must be text (the id of one of encryption_keys) or "
                f"none, got {_kind(active)} ({self.source})"
            )
        master = self.master_key
        if master is not None:
            if not isinstance(master, str) or ":" not in master:
                # Text without its scheme may be a key itself: only another kind is shown.
                got = "" if isinstance(master, str) else f", got {_kind(master)}"
                raise InvalidArgumentError(
                    "master_key must be 'base64:<32 bytes>' or '<scheme>:<reference>' of a "
                    f"KMS plugin{got} ({self.source})"
                )
            scheme, _, rest = master.partition(":")
            if is_local_scheme(scheme):
                decode_key(rest, f"of master_key ({self.source})")
        if type(self.require_encryption) is not bool:
            raise InvalidArgumentError(
                f"require_encryption must be true or false, got {self.require_encryption!r} "
                f"({self.source})"
            )
        object.__setattr__(
            self, "blind_index_fields", _checked_field_names(self.blind_index_fields, self.source)
        )
        limit = self.compression_min_bytes
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgumentError(
                f"compression_min_bytes must be a number of bytes (0 or more) or none, got "
                f"{limit!r} ({self.source})"
            )
        if not getattr(_layering, "on", False):
            self._check_combination()

    def _check_combination(self) -> None:
        # Settings that depend on each other are checked once every source is applied:
        # a file may name the key id or require encryption while the keys themselves come
        # from the environment.
        if self.offload_min_bytes is not None and self.blob_url is None:
            raise InvalidArgumentError(
                f"offload_min_bytes is set but blob_url is not: name the blob store the "
                f"offloaded values go to, such as file:///var/lib/app/blobs ({self.source})"
            )
        keys = self.encryption_keys
        master = self.master_key
        if self.encryption_key_id is not None and self.encryption_key_id not in keys:
            raise InvalidArgumentError(
                f"encryption_key_id {shown_key_id(self.encryption_key_id)} is not one of "
                f"encryption_keys ({', '.join(map(shown_key_id, keys)) or 'none given'}) "
                f"({self.source})"
            )
        if master is not None and keys:
            raise InvalidArgumentError(
                f"set encryption_keys or master_key, not both ({self.source})"
            )
        if self.require_encryption and not keys and master is None:
            # Such a reader could read nothing: refuse the settings, not every read.
            raise InvalidArgumentError(
                "require_encryption needs a key to read with: set encryption_keys or "
                f"master_key too ({self.source})"
            )

    @property
    def encrypts(self) -> bool:
        """Whether payloads are encrypted (``encryption_keys`` or ``master_key`` set)."""
        return bool(self.encryption_keys) or self.master_key is not None

    def replace(self, **changes: Any) -> Settings:
        """These settings with ``changes`` applied (``redact_fields`` added to, not
        replaced: see the module). Unknown names raise
        :class:`~siglo.errors.InvalidArgumentError`."""
        _check_names(changes, "replace()")
        if "redact_fields" in changes:
            changes["redact_fields"] = self.redact_fields | _checked_redact_fields(
                changes["redact_fields"], self.source
            )
        return replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """The settings as plain values, the URL's credentials masked (``siglo config``)."""
        return {
            "url": None if self.url is None else mask_credentials(self.url),
            "redact_fields": sorted(self.redact_fields),
            "error_mode": self.error_mode,
            "namespace_fallback": self.namespace_fallback,
            "command_timeout_ms": self.command_timeout_ms,
            "max_document_bytes": self.max_document_bytes,
            "offload_min_bytes": self.offload_min_bytes,
            "blob_url": None if self.blob_url is None else mask_credentials(self.blob_url),
            "blob_grace_ms": self.blob_grace_ms,
            "options": {
                k: ("***" if _secret_option(k) else v) for k, v in sorted(self.options.items())
            },
            # Key material is never shown: the ids say which keys are in effect.
            "encryption_keys": {k: "***" for k in self.encryption_keys},
            "encryption_key_id": self.encryption_key_id,
            "master_key": None if self.master_key is None else _mask_master(self.master_key),
            "require_encryption": self.require_encryption,
            "blind_index_fields": sorted(self.blind_index_fields),
            "compression_min_bytes": self.compression_min_bytes,
            "source": self.source,
        }

    def __repr__(self) -> str:
        # Settings end up in logs and tracebacks: the URL's password never does.
        shown = ", ".join(f"{k}={v!r}" for k, v in self.describe().items())
        return f"Settings({shown})"


SETTING_NAMES: Final = frozenset(f.name for f in fields(Settings)) - {"source"}
"""The names a settings file, :func:`configure` or :meth:`Settings.replace` accept."""

ENVIRONMENT: Final[dict[str, str]] = {
    "SIGLO_URL": "url",
    "SIGLO_REDACT_FIELDS": "redact_fields",
    "SIGLO_ERROR_MODE": "error_mode",
    "SIGLO_NAMESPACE_FALLBACK": "namespace_fallback",
    "SIGLO_COMMAND_TIMEOUT_MS": "command_timeout_ms",
    "SIGLO_ENCRYPTION_KEYS": "encryption_keys",
    "SIGLO_ENCRYPTION_KEY_ID": "encryption_key_id",
    "SIGLO_MASTER_KEY": "master_key",
    "SIGLO_REQUIRE_ENCRYPTION": "require_encryption",
    "SIGLO_COMPRESSION_MIN_BYTES": "compression_min_bytes",
    "SIGLO_BLIND_INDEX_FIELDS": "blind_index_fields",
    "SIGLO_MAX_DOCUMENT_BYTES": "max_document_bytes",
    "SIGLO_OFFLOAD_MIN_BYTES": "offload_min_bytes",
    "SIGLO_BLOB_URL": "blob_url",
    "SIGLO_BLOB_GRACE_MS": "blob_grace_ms",
}
"""The environment variables read, and the setting each sets. ``SIGLO_REDACT_FIELDS`` is
comma-separated; ``SIGLO_NAMESPACE_FALLBACK`` is true/false; ``SIGLO_COMMAND_TIMEOUT_MS``,
``SIGLO_COMPRESSION_MIN_BYTES``, ``SIGLO_MAX_DOCUMENT_BYTES`` and
``SIGLO_OFFLOAD_MIN_BYTES`` an integer or ``none``; ``SIGLO_BLOB_GRACE_MS`` an integer;
``SIGLO_ENCRYPTION_KEYS`` is ``id=base64key,id2=base64key``; ``SIGLO_REQUIRE_ENCRYPTION``
true/false."""


def _mask_master(value: str) -> str:
    scheme = value.partition(":")[0]
    # A KMS reference (an ARN, a key name) is not secret; a key itself is.
    return f"{scheme}:***" if is_local_scheme(scheme) else value


def _secret_option(name: str) -> bool:
    """Whether ``siglo config`` shows option ``name``'s value as ``***``: every option
    whose values siglo keeps out of its errors (:func:`siglo.urls.is_secret_parameter`:
    ``passwd``, ``pass`` …), and any whose name says it may hold one (a
    ``credential_provider``, a ``key_prefix`` too: shown masked rather than risk one)."""
    lowered = name.lower()
    return is_secret_parameter(lowered) or any(
        word in lowered for word in ("password", "passwd", "secret", "token", "key", "credential")
    )


def _check_option(name: str, value: object, source: str) -> None:
    """A backend option of the settings is data, what a URL's query could say: text, a
    number, true/false (or ``None`` in code). Checked when the settings are read, before
    any connection: ``url`` under ``[options]`` (the everyday slip of a key written
    after the table's header) would reach the factory beside its own URL, a bare
    ``TypeError``, and ``clock = "…"`` would fail at the first call that reads the time.
    The value is not quoted: it may be a secret (a URL with its password)."""
    if name == "url":
        raise InvalidArgumentError(
            f"options: url is not a backend option but a setting of its own ({source}): "
            "write `url = …` above the [options] table (a key after a table's header "
            "belongs to that table), or give the URL to siglo.connect"
        )
    what = OBJECT_OPTIONS.get(name)
    if what is not None:
        raise InvalidArgumentError(
            f"options: {name} takes {what}, an object settings cannot hold ({source}): "
            f"pass it as a keyword to siglo.connect in code (siglo.connect(url, {name}=…))"
        )
    if value is not None and not isinstance(value, str | int | float | bool):
        raise InvalidArgumentError(
            f"options: {name} must be text, a number or true/false (what a URL's query "
            f"can say), got {type(value).__name__} ({source})"
        )


def _checked_redact_fields(value: object, source: str) -> frozenset[str]:
    """``value`` as the names of ``redact_fields``, or refused naming where it was read."""
    try:
        return check_redact_fields(value)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{exc} ({source})") from None


def _checked_field_names(value: Any, source: str) -> frozenset[str]:
    """``value`` as the names of ``blind_index_fields``, or refused naming where it was
    read. Taken into a tuple first: a generator would be used up by the check and leave
    no name to index."""
    names: tuple[object, ...] | None = None
    if not isinstance(value, str | bytes):
        try:
            names = tuple(value)
        except TypeError:
            names = None
    if names is None or not all(isinstance(name, str) and name for name in names):
        raise InvalidArgumentError(
            f"blind_index_fields must be a list of metadata field names (non-empty text), "
            f"got {_shown(value)} ({source})"
        )
    return frozenset(name for name in names if isinstance(name, str))


_SHOWN_MAX: Final = 80
"""The most characters of a refused value an error quotes (a list of thousands is not
worth a screenful)."""


def _shown(value: object) -> str:
    """A refused value of a setting that holds no secret, as an error quotes it."""
    text = repr(value)
    return text if len(text) <= _SHOWN_MAX else f"{text[: _SHOWN_MAX - 1]}…"


def _kind(value: object) -> str:
    """A refused value of a setting that may hold a secret (a URL with its password, a
    key id that may be a key): a number or true/false quoted, anything else only by its
    kind."""
    if value is None or isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # Text is refused only when blank (a variable that lost its value).
        return "blank text" if not value.strip() else "text"
    return f"a {type(value).__name__}"


def _check_names(values: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(values) - SETTING_NAMES)
    if unknown:
        raise InvalidArgumentError(
            f"unknown setting(s) {', '.join(map(repr, unknown))} in {where}; known: "
            f"{', '.join(sorted(SETTING_NAMES))}"
        )


def find_config_file(
    start: Path | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Path, Mapping[str, Any]] | None:
    """The settings file in effect and its siglo table, or ``None`` (see the module).

    ``$SIGLO_CONFIG`` names the file (a ``siglo.toml``-style file, or a ``pyproject.toml``
    whose ``[tool.siglo]`` is read); otherwise the nearest ``siglo.toml`` or
    ``pyproject.toml`` with ``[tool.siglo]`` from ``start`` (the current directory) up.
    A file that does not parse raises :class:`~siglo.errors.InvalidArgumentError`.
    """
    named = (os.environ if environ is None else environ).get(CONFIG_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise InvalidArgumentError(f"{CONFIG_ENV}={named!r} is not a file")
        table = _table(path, required=True)
        assert table is not None  # required: a file without its table raised
        return path, table
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        for name in FILE_NAMES:
            path = directory / name
            if path.is_file():
                table = _table(path, required=False)
                if table is not None:
                    return path, table
    return None


def _table(path: Path, *, required: bool) -> Mapping[str, Any] | None:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgumentError(f"cannot read siglo settings from {path}: {exc}") from None
    if path.name == "pyproject.toml":
        table = document.get("tool", {}).get("siglo")
        if table is None:
            if required:
                raise InvalidArgumentError(f"{path} has no [tool.siglo] table")
            return None
        if not isinstance(table, dict):
            raise InvalidArgumentError(f"[tool.siglo] in {path} is not a table")
        return table
    return document


def _from_file(path: Path, table: Mapping[str, Any]) -> dict[str, Any]:
    where = f"[tool.siglo] of {path}" if path.name == "pyproject.toml" else str(path)
    _check_names(table, where)
    values = dict(table)
    for name in (
        "command_timeout_ms",
        "compression_min_bytes",
        "max_document_bytes",
        "offload_min_bytes",
    ):
        if name in values and values[name] in ("none", "None"):
            values[name] = None
    if "redact_fields" in values and (
        isinstance(values["redact_fields"], str) or not isinstance(values["redact_fields"], list)
    ):
        raise InvalidArgumentError(f"redact_fields in {where} must be a list of key names")
    return values


OTHER_VARIABLES: Final = frozenset(
    {CONFIG_ENV, "SIGLO_UI_TOKEN", "SIGLO_DEBUG", "SIGLO_DISABLE_PLUGINS"}
)
"""The other ``SIGLO_*`` variables siglo reads (not settings): never taken for a typo."""


def _refuse_misspelt(environ: Mapping[str, str]) -> None:
    """Refuse a ``SIGLO_*`` variable (in any case) that is not one siglo reads but is one
    letter or so from one it reads: unread, ``SIGLO_ENCRYPTION_KEY`` (for ``…_KEYS``) or
    ``SIGLO_CONFG`` would leave a store unencrypted without a word, ``SIGLO_UI_TOKN`` a
    dashboard without its token. Other ``SIGLO_*`` names (an application's own, the
    test suite's) pass."""
    known = {*ENVIRONMENT, *OTHER_VARIABLES}
    suffixes = {variable.removeprefix("SIGLO_"): variable for variable in known}
    for variable in environ:
        if not variable.upper().startswith("SIGLO_") or variable in known:
            continue
        # Compared without regard to case: SIGLO_encryption_keys is not read either.
        written = variable.upper().removeprefix("SIGLO_")
        close = (
            difflib.get_close_matches(written, list(suffixes), n=1, cutoff=0.9)
            or [
                # A short name's one changed letter or two swapped ones score below the cutoff
                # (SIGLO_URI, SIGLO_CONIFG, SIGLO_UI_TOEKN passed unread: a black-box auditor).
                suffix
                for suffix in sorted(suffixes)
                if _one_letter_off(written, suffix)
            ][:1]
        )
        if close:
            meant = suffixes[close[0]]
            raise InvalidArgumentError(
                f"${variable} is not a variable siglo reads — did you mean ${meant}? (a "
                f"misspelt variable is not read: unset it, or rename it to {meant})"
            )


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    _refuse_misspelt(environ)
    values: dict[str, Any] = {}
    for variable, name in ENVIRONMENT.items():
        raw = environ.get(variable)
        if raw is None:
            continue
        if raw == "" and name == "url":
            # Set but empty is a mistake (a variable that lost its value), not "none".
            raise InvalidArgumentError(
                f"${variable} is empty: unset it, or give a backend URL such as sqlite:///siglo.db"
            )
        if raw == "" and name != "redact_fields":
            continue
        if name in ("redact_fields", "blind_index_fields"):
            values[name] = [part.strip() for part in raw.split(",") if part.strip()]
        elif name == "encryption_keys":
            pairs: dict[str, str] = {}
            for part in filter(None, (p.strip() for p in raw.split(","))):
                key_id, sep, text = part.partition("=")
                if not sep:
                    raise InvalidArgumentError(
                        f"{variable} must be id=base64key pairs separated by commas"
                    )
                if key_id.strip() in pairs:
                    # Two keys under one id: whichever won, what the other sealed would
                    # never decrypt. (The id is checked first: a refused one is not shown.)
                    check_key_id(key_id.strip(), variable)
                    raise InvalidArgumentError(f"{variable} names key id {key_id.strip()!r} twice")
                pairs[key_id.strip()] = text.strip()
            values[name] = pairs
        elif name in ("namespace_fallback", "require_encryption"):
            lowered = raw.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise InvalidArgumentError(f"{variable} must be true or false, got {raw!r}")
            values[name] = lowered in _TRUE
        elif name in (
            "command_timeout_ms",
            "compression_min_bytes",
            "max_document_bytes",
            "offload_min_bytes",
            "blob_grace_ms",
        ):
            if raw.strip().lower() in ("none", "null"):
                values[name] = None
            elif (number := read_decimal(raw)) is not None:
                values[name] = number
            else:
                raise InvalidArgumentError(f"{variable} must be an integer or none, got {raw!r}")
        else:
            values[name] = raw
    return values


def load_settings(
    *, start: Path | None = None, environ: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """The settings of the file in effect, then the environment, then ``overrides``.

    ``start`` is where the file search begins (the current directory); ``environ`` the
    environment (``os.environ``). Bad values raise
    :class:`~siglo.errors.InvalidArgumentError` naming the setting and where it was read.
    """
    environ = os.environ if environ is None else environ
    _layering.on = True
    try:
        settings, sources = _layers(start, environ, overrides)
    finally:
        _layering.on = False
    return replace(settings, source=" + ".join(sources) or "defaults")


def _layers(
    start: Path | None, environ: Mapping[str, str], overrides: Mapping[str, Any]
) -> tuple[Settings, list[str]]:
    settings = Settings()
    found = find_config_file(start, environ)
    sources: list[str] = []
    if found is not None:
        path, table = found
        settings = _layer(settings, _from_file(path, table), str(path))
        sources.append(str(path))
    env_values = _from_environment(environ)
    if env_values:
        # One variable at a time, so a bad value's error names its variable.
        variables = {name: variable for variable, name in ENVIRONMENT.items()}
        for name, value in env_values.items():
            settings = _layer(settings, {name: value}, f"${variables[name]}")
        sources.append("environment")
    if overrides:
        _check_names(overrides, "the arguments")
        settings = _layer(settings, overrides, "arguments")
        sources.append("arguments")
    return settings, sources


def _layer(settings: Settings, values: Mapping[str, Any], source: str) -> Settings:
    # No TypeError is caught here: Settings.__post_init__ checks every setting's kind,
    # naming it and ``source``; a message built from a TypeError named neither.
    return replace(settings, source=source).replace(**values)


_lock = threading.Lock()
_layering = threading.local()
"""Set while :func:`load_settings` applies its sources one by one (see
:meth:`Settings._check_combination`)."""
_configured: Settings | None = None
_loaded: tuple[tuple[str, ...], Settings] | None = None
_generation = 0


def _inputs() -> tuple[str, ...]:
    """What loaded settings depend on: the current directory and the variables read."""
    environ = os.environ
    return (os.getcwd(), environ.get(CONFIG_ENV, ""), *(environ.get(v, "\0") for v in ENVIRONMENT))


def current_settings() -> Settings:
    """The process's settings: those given to :func:`configure`, else those loaded from
    the settings file and the environment — read again when the current directory or a
    ``SIGLO_*`` variable changed since they were read."""
    configured = _configured
    if configured is not None:
        return configured
    return _file_and_environment()


def effective_settings(settings: Settings | None) -> Settings:
    """The settings a path runs with when it is given ``settings``: the process's
    (:func:`current_settings`) when ``None``; otherwise ``settings`` with the
    ``redact_fields`` of the settings file and the environment added. A settings object
    built in code (``Settings(max_document_bytes=…)``) is complete for every other
    setting, but it does not remove a key another source redacts: no layer can expose
    what another protects. :func:`siglo.connect`, :class:`siglo.StorageManager` (and so
    the synchronous facade) and :func:`configure` take what they are given through
    here."""
    if settings is None:
        return current_settings()
    if not isinstance(settings, Settings):
        # Refused here, where connect(), configure() and the manager all pass: a dict
        # of settings would otherwise fail on its first attribute, naming none.
        raise InvalidArgumentError(
            f"settings must be a siglo.Settings (siglo.Settings(...) or "
            f"siglo.load_settings(...)), got {type(settings).__name__}"
        )
    loaded = _file_and_environment()
    if loaded.redact_fields <= settings.redact_fields:
        return settings
    # Where they came from says so too (``siglo worker`` and ``siglo config`` print it).
    added = settings.replace(redact_fields=loaded.redact_fields)
    return replace(added, source=f"{settings.source} + redact_fields of {loaded.source}")


def _file_and_environment() -> Settings:
    """The settings of the file and the environment (no :func:`configure`), read again
    when the current directory or a ``SIGLO_*`` variable changed since they were read."""
    global _loaded, _generation
    inputs = _inputs()
    loaded = _loaded
    if loaded is not None and loaded[0] == inputs:
        return loaded[1]
    with _lock:
        settings = load_settings()
        _loaded = (inputs, settings)
        _generation += 1
    return settings


def settings_generation() -> int:
    """A number that changes whenever the process's settings may have: a manager that
    follows them re-reads them only then (a cheap check on its hot path)."""
    return _generation


def configure(settings: Settings | None = None, **overrides: Any) -> Settings:
    """Decide the process's settings in code, once, where the application starts.

    ``configure(redact_fields=["card"], error_mode="strict")`` loads the file and the
    environment and applies these on top; ``configure(settings)`` installs settings built
    elsewhere (with ``overrides`` applied to them, and the file's and the environment's
    ``redact_fields`` added: :func:`effective_settings`). Every manager, backend, flow and
    command that is not given settings of its own uses these from now on — a
    ``siglo worker --flows app:flows`` too, when ``app`` calls this at import. Returns
    the settings installed.
    """
    global _configured, _generation
    if settings is None:
        new = load_settings(**overrides)
    else:
        new = effective_settings(settings).replace(**overrides)
    with _lock:
        _configured = new
        _generation += 1
    return new


def reset_settings() -> None:
    """Forget the settings given to :func:`configure` and those loaded: the next use
    reads the file and the environment again."""
    global _configured, _loaded, _generation
    with _lock:
        _configured = None
        _loaded = None
        _generation += 1


def _one_letter_off(written: str, name: str) -> bool:
    """Whether ``written`` is ``name`` with one letter changed or two neighbours swapped."""
    if len(written) != len(name) or written == name:
        return False
    differ = [i for i, (a, b) in enumerate(zip(written, name, strict=True)) if a != b]
    if len(differ) == 1:
        return True
    first, second = differ[0], differ[-1]
    return (
        len(differ) == 2
        and second == first + 1
        and written[first] == name[second]
        and written[second] == name[first]
    )
