"""What the suite runs against: a URL resolved through the plugin registry, or a factory.

A :class:`Target` opens a :class:`Session` for one run. The session hands out backends
for checks and state-machine examples. Storage is isolated **per run** (the backend's
``isolated`` factory: own key prefix, schema or temporary file) and every example gets a
fresh random prefix for all its ids, which is cheap on every backend (a Postgres schema
per example would cost ~50 ms). Backends without an ``isolated`` factory (``memory://``,
a third party's factory) get a new backend per example instead.
"""

from __future__ import annotations

import contextlib
import inspect
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final

from siglo.adapter import Capability
from siglo.backend import Backend
from siglo.clock import ManualClock
from siglo.connect import check_backend
from siglo.errors import PluginError, SigloError
from siglo.manager import StorageManager
from siglo.plugins import BackendSpec, Deviation, get_registry
from siglo.settings import DEFAULTS
from siglo.sizing import smallest_limit
from siglo.urls import mask_credentials
from siglo_contract.processes import WorkerProcesses
from siglo_memory.connect import connect as memory_connect

__all__ = [
    "DEFAULT_OPTIONS",
    "OPTION_PROFILES",
    "USER_DEFAULTS",
    "BackendFactory",
    "Session",
    "Target",
    "declared_capabilities",
]

PROCESSES: Final = 4
"""How many processes race in the cross-process concurrency checks."""

BackendFactory = Callable[..., Backend]
"""``factory(**options) -> Backend``: a third party's adapter, or a broken one in tests."""

DEFAULT_OPTIONS: Final[dict[str, Any]] = {
    "checkpoint_ttl_ms": DEFAULTS.checkpoint_ttl_ms,
    "cache_ttl_ms": DEFAULTS.cache_ttl_ms,
    "claim_lease_ms": DEFAULTS.claim_lease_ms,
}
"""Options passed to the backend under test *and* the reference, so their defaults agree."""

USER_DEFAULTS: Final[dict[str, Any]] = {"checkpoint_ttl_ms": None}
"""The override of the suite's options that takes a backend down the paths it takes only
with a user's default retention on memory, SQLite and PostgreSQL: none. Checks of those
paths (PostgreSQL's one-round-trip streamed and unlocking saves) also run a backend
opened with the suite's options and this one changed (:meth:`Session.backend_with`); the
``user-defaults`` profile (:data:`OPTION_PROFILES`) runs every rule with no option at
all."""

OPTION_PROFILES: Final[dict[str, dict[str, Any]]] = {
    "suite": dict(DEFAULT_OPTIONS),
    "user-defaults": {},
}
"""The option profiles a run covers, by name, each the options the backend's factory is
called with (and ``clock=`` besides, when the backend declares ``clock``): the suite's
(:data:`DEFAULT_OPTIONS`), and a user's defaults — what ``siglo.connect(url)`` passes a
factory when the user names no option: none. The factory's own defaults then apply, and
the checks that read an option the run did not give hold the backend to
:data:`siglo.settings.DEFAULTS` (a cache entry set without a TTL lives ``cache_ttl_ms``,
300 s; a claim without ``lease_ms`` lasts ``claim_lease_ms``, 60 s), as
docs/writing-a-backend.md asks. (Passing the suite's TTLs here let a plugin whose own
defaults were wrong pass every profile: a black-box auditor.)"""


def accepted_options(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The ``options`` that ``fn`` accepts by name (all of them if it takes ``**kwargs``),
    so a backend without, say, wait records need not declare ``claim_lease_ms``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return options
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return options
    names = {p.name for p in params}
    return {k: v for k, v in options.items() if k in names}


@contextlib.contextmanager
def plugin_code(spec: BackendSpec, what: str) -> Iterator[None]:
    """Around a call of a plugin's ``what`` (``"factory"``, ``"isolated factory"``): an
    exception that is neither siglo's (a URL refused, a store unreachable) nor the
    operating system's is the plugin's mistake, and becomes a :class:`PluginError`
    naming the backend and the plugin; ``siglo check`` said "unexpected KeyError …
    report it" as if siglo were broken (a black-box auditor)."""
    try:
        yield
    except (SigloError, OSError):
        raise
    except Exception as exc:
        raise PluginError(
            f"backend {spec.name!r} (plugin {spec.plugin!r}): its {what} raised "
            f"{type(exc).__name__}: {exc}; a backend's factories raise siglo's errors "
            "(InvalidArgumentError for a bad URL or option, StorageAdapterError for a store "
            "they cannot reach), docs/writing-a-backend.md"
        ) from exc


def plugin_backend(
    spec: BackendSpec, factory: Callable[..., Any], url: str, options: Mapping[str, Any]
) -> Backend:
    """The backend ``factory``, ``spec``'s (:meth:`~siglo.plugins.BackendSpec.load_factory`),
    makes for ``url`` with the ``options`` it accepts, refused as :func:`siglo.connect`
    refuses it (:func:`siglo.connect.check_backend`) when it is not a :class:`Backend`."""
    with plugin_code(spec, "factory"):
        made = factory(url, **accepted_options(factory, dict(options)))
    return check_backend(spec.name, spec.plugin, made)


def connect_url(url: str, **options: Any) -> Backend:
    """``siglo.connect(url, **options)``, passing only the options the factory accepts."""
    spec = get_registry().for_url(url)
    return plugin_backend(spec, spec.load_factory(), url, options)


def declared_capabilities(backend: Backend) -> frozenset[Capability]:
    """What a backend object declares: its adapter's capabilities plus its coordination parts."""
    return backend.capabilities


@dataclass
class Target:
    """A backend to check. Build with :meth:`from_url` or :meth:`from_factory`."""

    label: str
    capabilities: frozenset[Capability]
    multiprocess: bool
    url: str | None = None
    factory: BackendFactory | None = None
    isolated: Callable[..., AbstractAsyncContextManager[Backend]] | None = None
    options: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_OPTIONS))
    manager_factory: Callable[..., StorageManager] = StorageManager
    """The manager the end-to-end checks (``manager.*.stored``) drive the backend with."""
    deviations: tuple[Deviation, ...] = ()
    """Rules the backend declares it does not meet (its plugin's registration)."""
    spec: BackendSpec | None = None
    """The plugin registration of a URL target (for reports: plugin, distribution)."""

    @property
    def clock_controlled(self) -> bool:
        """Whether the suite moves this backend's time with a :class:`ManualClock`."""
        return Capability.CLOCK in self.capabilities

    @classmethod
    def from_url(cls, url: str, *, options: dict[str, Any] | None = None) -> Target:
        """The backend registered for ``url``'s scheme, with its declared capabilities."""
        spec = get_registry().for_url(url)
        factory = spec.load_factory()
        isolated = spec.load_isolated()

        def make(**opts: Any) -> Backend:
            return plugin_backend(spec, factory, url, opts)

        @contextlib.asynccontextmanager
        async def make_isolated(**opts: Any) -> AsyncIterator[Backend]:
            assert isolated is not None
            async with contextlib.AsyncExitStack() as stack:
                # Entered here, the plugin's mistakes named as the plain factory's are;
                # what the checks raise inside goes through to its exit untouched.
                with plugin_code(spec, "isolated factory"):
                    made = await stack.enter_async_context(
                        isolated(url, **accepted_options(isolated, opts))
                    )
                yield check_backend(spec.name, spec.plugin, made)

        return cls(
            label=mask_credentials(url),
            capabilities=spec.capabilities,
            multiprocess=spec.multiprocess,
            url=url,
            factory=make,
            isolated=make_isolated if isolated is not None else None,
            options=dict(DEFAULT_OPTIONS if options is None else options),
            deviations=spec.deviations,
            spec=spec,
        )

    @classmethod
    def from_factory(
        cls,
        factory: BackendFactory,
        *,
        capabilities: frozenset[Capability] | None = None,
        options: dict[str, Any] | None = None,
        label: str | None = None,
    ) -> Target:
        """A backend made by ``factory(**options)``; capabilities default to what it declares.

        The factory is called once per example, so each gets fresh storage, with the
        options it names (all of them if it takes ``**options``), as a registered
        backend's factory is (:func:`accepted_options`): a backend without wait records
        need not take ``claim_lease_ms``.
        """
        opts = dict(DEFAULT_OPTIONS if options is None else options)
        given = factory

        def make(**options: Any) -> Backend:
            return given(**accepted_options(given, options))

        factory = make
        if capabilities is None:
            probe = factory(**opts)
            capabilities = declared_capabilities(probe)
            with contextlib.suppress(Exception):
                import asyncio

                asyncio.run(probe.aclose())
        return cls(
            label=label or str(getattr(given, "__qualname__", repr(given))),
            capabilities=frozenset(capabilities),
            multiprocess=False,
            factory=factory,
            options=opts,
        )

    def session(self, profile: Mapping[str, int] | None = None) -> Session:
        """A session for one run (use as an async context manager) with the run's
        profile budgets (``runner.PROFILES``)."""
        return Session(self, profile)


class Session:
    """One run's storage: a shared isolated backend, or a factory called per example."""

    def __init__(self, target: Target, profile: Mapping[str, int] | None = None) -> None:
        self.target = target
        self.profile: Mapping[str, int] = dict(profile or {})
        """The run's profile budgets (``runner.PROFILES``)."""
        self.clock: ManualClock | None = ManualClock() if target.clock_controlled else None
        self._stack = contextlib.AsyncExitStack()
        self._shared: Backend | None = None
        self._workers: WorkerProcesses | None = None
        self.workers_warm = False
        """Whether the worker processes have answered once (imports done)."""

    def backend_options(self) -> dict[str, Any]:
        """Options for the backend under test (the clock too, when the suite controls it)."""
        opts = dict(self.target.options)
        if self.clock is not None:
            opts["clock"] = self.clock
        return opts

    def limited(self, backend: Backend) -> Backend:
        """``backend`` with the document limit its plugin's registration declares
        (``add_backend(max_document_bytes=…)``) on its adapter, as :func:`siglo.connect`
        puts it there: the ``isolated`` and plain factories bypass ``connect``, and the
        suite must keep to the limit a user's connection has."""
        declared = None if self.target.spec is None else self.target.spec.max_document_bytes
        raw = backend.raw_adapter
        limit = smallest_limit(raw.max_document_bytes, declared)
        if limit != raw.max_document_bytes:
            raw.max_document_bytes = limit  # on the instance, as connect() does
        return backend

    async def __aenter__(self) -> Session:
        if self.target.isolated is not None:
            self._shared = self.limited(
                await self._stack.enter_async_context(
                    self.target.isolated(**self.backend_options())
                )
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def shared_url(self) -> str | None:
        """The URL other connections and processes use to reach this run's storage."""
        if self._shared is not None and self._shared.url_shares_storage:
            return self._shared.url
        return None

    @contextlib.asynccontextmanager
    async def backend(self) -> AsyncIterator[Backend]:
        """A backend for one check or example; its ids must use :func:`new_prefix`."""
        if self._shared is not None:
            yield self._shared
            return
        assert self.target.factory is not None
        backend = self.limited(self.target.factory(**self.backend_options()))
        try:
            yield backend
        finally:
            await backend.aclose()

    @contextlib.asynccontextmanager
    async def backend_with(self, **overrides: Any) -> AsyncIterator[Backend]:
        """A backend of the target opened with some options changed, for a check that
        must also see it as a user configures it by default: on storage of its own (the
        target's isolation, or its factory), removed or closed afterwards."""
        options = {**self.backend_options(), **overrides}
        if self.target.isolated is not None:
            async with self.target.isolated(**options) as backend:
                yield self.limited(backend)
            return
        assert self.target.factory is not None
        backend = self.limited(self.target.factory(**options))
        try:
            yield backend
        finally:
            await backend.aclose()

    async def worker_processes(self) -> WorkerProcesses:
        """The worker processes of cross-process checks (started once per run, reused;
        stopped when the run ends)."""
        if self._workers is None:
            self._workers = WorkerProcesses(PROCESSES)
            await self._workers.start()
            self._stack.push_async_callback(self._workers.close)
        return self._workers

    def open_backend(self) -> Backend:
        """A new connection to this run's storage (the shared one when isolated)."""
        if self._shared is not None:
            return self.limited(connect_url(self._shared.url, **self.backend_options()))
        raise RuntimeError("no shared storage: this target makes a backend per example")

    def reference(self) -> Backend:
        """A fresh in-memory reference backend with the same options and clock."""
        opts = {k: v for k, v in self.target.options.items() if k in DEFAULT_OPTIONS}
        return memory_connect("memory://", clock=self.clock or ManualClock(), **opts)


def new_prefix() -> str:
    """A random id prefix that keeps one example's data apart from every other's."""
    return f"t{secrets.token_hex(4)}/"
