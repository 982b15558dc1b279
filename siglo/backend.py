"""``Backend``: everything one URL connects to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from siglo.adapter import Capability, StorageAdapter
from siglo.closing import Closable
from siglo.coordination import IdempotencyStore, Lock, NonceStore, undos_settled
from siglo.errors import CapabilityNotSupportedError
from siglo.pipeline import Pipeline, PipelineAdapter, observe_coordination, pipeline_parts
from siglo.telemetry import db_attributes
from siglo.urls import mask_credentials

_UNDO_WAIT_S = 1.0
"""How long :meth:`Backend.aclose` waits for calls cut off by their callers to give back
what they took: the first try of each is at once, so this is its round trip."""

__all__ = ["Backend"]


@dataclass(eq=False)
class Backend:
    """A backend's storage adapter and coordination primitives, sharing its connections.

    Returned by :func:`siglo.connect`. Use it as an async context manager, or call
    :meth:`aclose`, to release its connections.
    """

    name: str
    """The registered backend name (``"memory"``, ``"redis"`` …)."""
    url: str = field(repr=False)
    """The URL it was connected with, credentials included (``repr`` masks them)."""
    adapter: StorageAdapter
    idempotency: IdempotencyStore | None = None
    lock: Lock | None = None
    nonces: NonceStore | None = None
    url_shares_storage: bool = True
    """Whether :func:`siglo.connect` of :attr:`url` reaches this same storage again (a
    server or a file does; ``memory://`` and ``sqlite://`` are private to this object)."""
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list, repr=False)

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this backend object has: its adapter's capabilities, plus ``idempotency``,
        ``locks`` and ``nonces`` for the coordination parts it carries.
        :func:`siglo.connect` checks that they are what the plugin registered."""
        caps = set(self.adapter.capabilities)
        if self.idempotency is not None:
            caps.add(Capability.IDEMPOTENCY)
        if self.lock is not None:
            caps.add(Capability.LOCKS)
        if self.nonces is not None:
            caps.add(Capability.NONCES)
        return frozenset(caps)

    def use_pipeline(self, pipeline: Pipeline) -> None:
        """Store through ``pipeline`` from now on (:func:`siglo.connect` does this with the
        settings' pipeline): the adapter and the idempotency store are put behind it, and
        the lock and nonce store count their timed-out calls when it traces."""
        attributes = None if pipeline.telemetry is None else db_attributes(self.name, self.url)
        self.adapter, self.idempotency = pipeline_parts(
            self.adapter, self.idempotency, pipeline, attributes
        )
        observe_coordination(pipeline, attributes, self.lock, self.nonces)

    @property
    def raw_adapter(self) -> StorageAdapter:
        """The backend's own adapter, without the pipeline in front of it: what is stored,
        as it is stored (for tools that copy stored bytes)."""
        adapter = self.adapter
        while isinstance(adapter, PipelineAdapter):  # the pipeline, then any offloading
            adapter = adapter.inner
        return adapter

    def require_idempotency(self) -> IdempotencyStore:
        """The idempotency store; :class:`~siglo.errors.CapabilityNotSupportedError` if
        this backend has none (a typed alternative to checking ``idempotency`` for None)."""
        if self.idempotency is None:
            raise self._missing("an idempotency store", Capability.IDEMPOTENCY)
        return self.idempotency

    def require_lock(self) -> Lock:
        """The distributed lock; :class:`~siglo.errors.CapabilityNotSupportedError` if
        this backend has none."""
        if self.lock is None:
            raise self._missing("a distributed lock", Capability.LOCKS)
        return self.lock

    def require_nonces(self) -> NonceStore:
        """The nonce store; :class:`~siglo.errors.CapabilityNotSupportedError` if this
        backend has none."""
        if self.nonces is None:
            raise self._missing("a nonce store", Capability.NONCES)
        return self.nonces

    def _missing(self, what: str, capability: Capability) -> CapabilityNotSupportedError:
        return CapabilityNotSupportedError(
            f"backend {self.name!r} has no {what[2:] if what.startswith('a ') else what} "
            f"(capability {capability.value!r} not supported); `siglo backends` lists what "
            "each backend supports"
        )

    def __repr__(self) -> str:
        # The URL may carry a password: repr() ends up in logs and tracebacks.
        return f"Backend(name={self.name!r}, url={mask_credentials(self.url)!r})"

    async def aclose(self) -> None:
        """Close the adapter and release every connection this backend opened.

        Afterwards every call of the adapter and of the coordination stores raises
        :class:`~siglo.errors.StorageAdapterError` (contract rule ``backend.closed``).
        """
        # What calls cut off by their callers took is given back first (bounded): a
        # script or a request that closes its connection right after a timeout would
        # otherwise strand it for its lease (siglo.coordination.undo_later).
        await undos_settled(_UNDO_WAIT_S)
        try:
            await self.adapter.aclose()
            callbacks, self.on_close = self.on_close, []
            for close in reversed(callbacks):
                await close()
        finally:
            # Marked here as well as by the parts' own aclose(): an adapter or store that
            # overrides it without calling the base class still refuses.
            for part in (self.adapter, self.idempotency, self.lock, self.nonces):
                if isinstance(part, Closable):
                    part.mark_closed()

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
