"""``siglo.connect(url)``: one URL, one backend."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from siglo import urls
from siglo.adapter import Capability
from siglo.backend import Backend
from siglo.blobs import bounded, open_blob_store
from siglo.config import Settings, effective_settings
from siglo.errors import InvalidArgumentError, PluginError
from siglo.offload import Offloader, offload_adapter
from siglo.pipeline import Pipeline
from siglo.plugins import get_registry
from siglo.settings import DEFAULTS
from siglo.sizing import smallest_limit

__all__ = [
    "URL_ENV",
    "check_backend",
    "check_capabilities",
    "check_port",
    "command_timeout_ms",
    "connect",
    "is_settings_store",
    "options_for",
]


URL_ENV: Final = "SIGLO_URL"
"""The environment variable :func:`connect` (and the ``siglo`` command) read a backend
URL from when given none."""


def connect(url: str | None = None, *, settings: Settings | None = None, **options: Any) -> Backend:
    """Connect to the backend that serves ``url``'s scheme, configured by ``settings``.

    ``settings`` default to the process's (:func:`siglo.config.current_settings`: the
    settings file, ``SIGLO_*`` variables, :func:`siglo.configure`); settings given
    still redact the keys the file and the environment name
    (:func:`siglo.config.effective_settings`). Without ``url`` the
    settings' URL is used (``$SIGLO_URL``, ``url`` in ``siglo.toml``). The settings'
    backend ``options`` go with their URL, or with any URL when they name none. The
    settings' ``command_timeout_ms`` bounds every call of a backend that has such a
    bound, unless the URL or ``options`` set it. The backend
    returned stores through the settings' pipeline (:mod:`siglo.pipeline`: redaction),
    whatever path then uses it, and refuses a checkpoint document over the settings'
    ``max_document_bytes`` or the plugin's declared maximum (:mod:`siglo.sizing`). With
    the settings' ``offload_min_bytes`` and ``blob_url``, and ``url`` the settings' own
    store (:func:`is_settings_store`; or settings that name none: the blob store goes
    with their URL, as their options do) on a backend that can list its checkpoints
    (its collector walks them), large values go to that blob store below the pipeline
    (:mod:`siglo.offload`),
    every call to it bounded by the backend's ``command_timeout_ms``
    (:func:`command_timeout_ms`); closing the backend closes it.

    ``memory://``, ``sqlite:///path.db``, ``sqlite://``, ``postgresql://…`` and
    ``redis://…`` are built in; plugins add more. ``options`` go to the backend's factory
    (for example ``clock=`` or ``checkpoint_ttl_ms=``). Returns a :class:`Backend` with
    the storage adapter and the idempotency store, lock and nonce store of that backend.
    A missing driver raises :class:`~siglo.errors.DriverNotInstalledError` saying which
    extra to install.
    """
    settings = effective_settings(settings)
    if isinstance(url, str):
        url = url.strip()  # as the settings' URL and every command's is
    if url is None:
        url = settings.url
        if not url:
            raise InvalidArgumentError(
                f"siglo.connect() was given no URL, and no settings name one: pass a URL such "
                f"as 'sqlite:///siglo.db', set {URL_ENV}, or set url in siglo.toml "
                "(docs/configuration.md)"
            )
    options, from_settings = options_for(url, settings, options)
    # The URL's and the options' secrets are kept out of every error's text from here on
    # (siglo.masking): a driver's error may quote them.
    urls.mask_credentials(url)
    urls.remember_secret_options(options)
    check_port(url)
    spec = get_registry().for_url(url)
    if (
        spec.bounded
        and settings.command_timeout_ms != DEFAULTS.command_timeout_ms
        and "command_timeout_ms" not in options
        and "command_timeout_ms" not in urls.query_names(url)
    ):
        # Only a bound the settings changed: the backend's own default is the same, and
        # a backend writes an option it is given into its URL (for other processes).
        options["command_timeout_ms"] = settings.command_timeout_ms
    try:
        factory = spec.load_factory()
        refuse_unnamed_options(spec.name, factory, options)
        backend = factory(url, **options)
    except InvalidArgumentError as exc:
        # The options it names, not those it lists as known or suggests instead (a URL's
        # `?key_prefix=` "did you mean prefix?" was blamed on the file's `prefix`).
        said = re.split(r";? \(?known| — did you mean", str(exc), maxsplit=1)[0]
        named = sorted(k for k in from_settings if re.search(rf"\b{re.escape(k)}\b", said))
        if not named:
            raise
        # An option nobody typed on this command: say where it came from.
        raise InvalidArgumentError(
            f"{exc} (option {', '.join(named)} from the [options] of {settings.source})"
        ) from exc
    backend = check_backend(spec.name, spec.plugin, backend)
    check_capabilities(spec.name, spec.plugin, spec.capabilities, backend)
    adapter = backend.raw_adapter
    limit = smallest_limit(
        adapter.max_document_bytes, spec.max_document_bytes, settings.max_document_bytes
    )
    if limit != adapter.max_document_bytes:
        # On the instance: the class keeps the store's own maximum for other connections.
        adapter.max_document_bytes = limit
    min_bytes, blob_url = settings.offload_min_bytes, settings.blob_url
    offloads = min_bytes is not None and blob_url is not None
    if offloads and settings.url is not None and not is_settings_store(url, options, settings):
        # The blob store goes with the settings' store, as their [options] do: its
        # collector walks that store's checkpoints, and would take the blobs another
        # store put there for orphans (`siglo import OTHER_URL`, then collect-blobs:
        # OTHER_URL's values gone). Another store stores its values inline.
        offloads = False
    if offloads and Capability.LISTING not in backend.capabilities:
        # Its blobs could never be collected: the collector walks the backend's
        # checkpoints, and `siglo collect-blobs` refuses a backend that cannot list
        # them. Its values are stored inline, as another store's are.
        offloads = False
    if offloads and min_bytes is not None and blob_url is not None:
        # Below the pipeline: redact (and encode) -> offload -> store.
        # The blob store's calls are storage calls of this backend: the same bound.
        # (A backend without a bound of its own still has the settings'.)
        bound = command_timeout_ms(url, options) if spec.bounded else settings.command_timeout_ms
        store = open_blob_store(blob_url)
        # Its puts are spaced by the grace period the collector keeps blobs for.
        store.use_grace(settings.blob_grace_ms)
        store = bounded(store, bound)
        offloader = Offloader(store, min_bytes)
        backend.adapter = offload_adapter(backend.adapter, offloader)
        # A change of a value this large is not refused for its size (siglo.sizing).
        # Where the pipeline seals contexts whole (encryption, compression), the unit
        # offloaded is the sealed context, whose size one change does not tell: a value
        # of any size may end up in a blob, and only the checkpoint's save is judged.
        seals_contexts = settings.encrypts or settings.compression_min_bytes is not None
        adapter.offloaded_from_bytes = 0 if seals_contexts else min_bytes
    backend.use_pipeline(Pipeline(settings))
    return backend


def options_for(
    url: str, settings: Settings, options: Mapping[str, Any]
) -> tuple[dict[str, Any], frozenset[str]]:
    """The options a connection to ``url`` is made with: ``options`` over the settings'
    backend options where those go with ``url`` (it is the settings' URL, or the
    settings name none), and the names of those taken from the settings."""
    if settings.options and (url == settings.url or settings.url is None):
        # The settings' options are their URL's; settings that name no URL (a
        # siglo.toml with [options] alone) give theirs to whatever URL is connected —
        # but for what that URL's query says itself, by any of its names
        # (`?schema=appb` is not the file's `schema = "appa"`, `?prefix=` not its
        # `key_prefix`: a keyword option would win over the query). That holds for the
        # settings' own URL too: `$SIGLO_URL`'s query was overridden by the file's
        # `[options]`, a source it outranks (a black-box auditor).
        # A keyword wins over the file by any of its names too (`key_prefix=` in code
        # over the file's `prefix`: a black-box auditor found the file's taken).
        written = urls.query_names(url) | {urls.option_name(k) for k in options}
        given = {k: v for k, v in settings.options.items() if urls.option_name(k) not in written}
        return {**given, **options}, frozenset(given) - frozenset(options)
    return dict(options), frozenset()


def is_settings_store(url: str, options: Mapping[str, Any], settings: Settings) -> bool:
    """Whether a connection to ``url`` made with ``options`` (as :func:`options_for`
    gives them) opens the store the settings name: their URL's file, database or server
    with their options' ``prefix``, ``schema`` or ``table_prefix``, however either URL is
    spelt. Only that store offloads into the settings' blob store, and only its
    checkpoints are walked to collect it: a URL that names the same file or database
    without the settings' ``table_prefix`` is another store's tables."""
    if settings.url is None:
        return False
    return urls.same_store(url, settings.url, options, settings.options)


def command_timeout_ms(url: str, options: Mapping[str, Any]) -> int | None:
    """The ``command_timeout_ms`` a backend connected with ``url`` and ``options`` (after
    :func:`connect` added the settings' bound) applies: the option, else the URL's, else
    the default (``None``: unbounded)."""
    if "command_timeout_ms" in options:
        given = options["command_timeout_ms"]
        if isinstance(given, str):
            return urls.optional_integer("command_timeout_ms", given)
        return None if given is None else int(given)
    _, query = urls.split_options(url, {"command_timeout_ms": urls.optional_integer})
    if "command_timeout_ms" in query:
        found: int | None = query["command_timeout_ms"]
        return found
    return DEFAULTS.command_timeout_ms


def check_backend(name: str, plugin: str, backend: object) -> Backend:
    """``backend``, what the factory of backend ``name`` (of ``plugin``) returned, if it
    is a :class:`Backend`; otherwise the plugin is broken, and :class:`PluginError` says
    so naming it (``siglo check`` calls a plugin's factories through this too, so both
    name the mistake alike instead of failing later on a missing attribute)."""
    if not isinstance(backend, Backend):
        raise PluginError(
            f"backend {name!r} (plugin {plugin!r}) returned "
            f"{type(backend).__name__} from its factory, not a siglo.Backend"
        )
    return backend


def check_capabilities(
    name: str, plugin: str, registered: frozenset[Capability], backend: Backend
) -> None:
    """The capabilities a plugin registers (what ``siglo backends`` lists without
    importing a driver) must be those of the backend its factory builds (the adapter
    class's ``capabilities`` and the coordination parts it carries); otherwise the
    plugin is broken and says so here, at the first connect, not in a user's code."""
    actual = backend.capabilities
    if actual == registered:
        return
    backend_only = ", ".join(sorted(c.value for c in actual - registered)) or "none"
    registry_only = ", ".join(sorted(c.value for c in registered - actual)) or "none"
    raise PluginError(
        f"backend {name!r} (plugin {plugin!r}) registers capabilities its backend does not "
        f"match: only on the backend: {backend_only}; only in the registration: "
        f"{registry_only}. Declare the same set in add_backend(capabilities=...) and on "
        "the adapter class"
    )


def check_port(url: str) -> None:
    """Refuse a URL whose port is not a number from 0 to 65535, before any backend sees it.

    A host list (``postgresql://h1:5432,h2:5433/db``) is left to the backend.
    """
    if not isinstance(url, str):
        return
    urls.refuse_fragment(url)  # before a password's start can be read as a port
    try:
        parts = urlsplit(url)
        if "," not in parts.netloc:
            parts.port  # noqa: B018  (parsing it is the check)
    except ValueError as exc:
        host = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]
        raise InvalidArgumentError(
            f"bad port in the backend URL (host part {host!r}): {exc}; "
            "a port is a number from 0 to 65535"
        ) from None


def refuse_unnamed_options(
    name: str, factory: Callable[..., Any], options: Mapping[str, Any]
) -> None:
    """Raise :class:`~siglo.errors.InvalidArgumentError` naming each of ``options`` that
    the backend ``name``'s ``factory`` does not name as a parameter, when it takes no
    ``**options``: a typo (or a siglo.toml's option meant for another backend) is
    refused like a URL option, not raised as the factory's ``TypeError``. A factory
    that takes ``**options`` receives them all and refuses what it does not know itself
    (docs/writing-a-backend.md)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a callable Python cannot describe: it decides
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    named = {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    } - {"url"}
    unknown = set(options) - named
    if unknown:
        raise urls.unknown_option_error(name, unknown, named, where="keyword")
