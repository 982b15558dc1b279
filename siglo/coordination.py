"""Coordination primitives beside storage (seed 001 §6–§8), for every backend.

These are protocols: each backend provides an implementation, obtained from the same
URL as its storage adapter (:func:`siglo.connect`). The base classes
:class:`IdempotencyStoreBase`, :class:`LockBase` and :class:`NonceStoreBase` check every
argument once and call the backend's ``_do_…`` hooks, as
:class:`~siglo.adapter.StorageAdapter` does.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar, runtime_checkable

from siglo import masking
from siglo.closing import Closable
from siglo.codec import refuse_reserved_value, refuse_unopened_value
from siglo.errors import (
    CapabilityNotSupportedError,
    IdempotencyKeyMismatchError,
    IdempotencyOwnershipError,
    InvalidArgumentError,
    LockNotAcquiredError,
    OutcomeUnknownError,
    StorageAdapterError,
    read_failure,
)
from siglo.payloads import StoredPayload
from siglo.sentinel import Missing
from siglo.settings import DEFAULTS
from siglo.validation import ms_as_seconds, require_id, require_ttl_ms, seconds_as_ms

__all__ = [
    "ClaimState",
    "DEFAULT_LOCK_TTL_MS",
    "IdempotencyClaim",
    "IdempotencyStore",
    "IdempotencyStoreBase",
    "Lock",
    "LockBase",
    "LockResult",
    "LockState",
    "NonceStore",
    "NonceStoreBase",
    "acquire_undone_on_cancel",
    "fingerprint_digest",
    "holder_label",
    "new_idempotency_token",
    "new_lock_token",
    "nonce_ttl_ms",
    "pending_on",
    "undo_later",
    "undos_pending",
    "undos_settled",
]

T = TypeVar("T")

ClaimState = Literal["claimed", "completed", "in-progress"]
OwnedClaimReply = Literal["claimed", "completed", "in-progress", "mismatch"]
"""What a backend's :meth:`IdempotencyStoreBase._do_claim_owned` answers: a claim state,
or ``"mismatch"`` when the key is held under a different fingerprint."""
DEFAULT_LOCK_TTL_MS: Final = DEFAULTS.lock_ttl_ms
_MIN_POLL_S: Final = 0.002
_MAX_POLL_S: Final = 0.05
"""``with_lock(wait_ms=…)``'s back-off between attempts: from 2 ms, doubling, to 50 ms
(the waiter enters at most ~50 ms after the holder releases)."""
"""The lease of :meth:`Lock.acquire` when the caller names none (seed 001 §7: 10 s)."""


@runtime_checkable
class IdempotencyStore(Protocol):
    """Single-flight execution claims with a remembered result (seed 001 §6)."""

    async def claim(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> ClaimState:
        """``"claimed"`` for exactly one caller; then ``"in-progress"`` until completed
        or failed; ``"completed"`` once a result is stored."""
        ...

    async def claim_owned(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> IdempotencyClaim:
        """Like :meth:`claim`, and the winner gets the owner token ``complete`` and
        ``fail`` require."""
        ...

    async def complete(
        self, key: str, result: Any, ttl_ms: int | None = None, *, token: str | None = None
    ) -> None:
        """Store ``result`` (JSON data) and mark the key completed."""
        ...

    async def fail(
        self, key: str, error: BaseException | None = None, *, token: str | None = None
    ) -> None:
        """Free an in-progress key for retry; a completed result is kept."""
        ...

    async def extend(self, key: str, token: str, ttl_ms: int) -> bool:
        """Renew an owned claim's lease; ``True`` if ``token`` still held the key."""
        ...

    async def get_result(self, key: str) -> Any | Missing:
        """The completed result, or :data:`~siglo.MISSING`."""
        ...

    async def get(self, key: str) -> Any | Missing:
        """Alias of :meth:`get_result`."""
        ...


@dataclass(frozen=True, slots=True)
class IdempotencyClaim:
    """The outcome of :meth:`IdempotencyStore.claim_owned`.

    ``token`` is set only when ``state == "claimed"``: the owner passes it to ``complete``
    and ``fail``, which refuse anyone else once the key is owned.
    """

    state: ClaimState
    token: str | None = None

    @property
    def claimed(self) -> bool:
        """``True`` when this caller won the claim (and holds ``token``)."""
        return self.state == "claimed"


def new_idempotency_token() -> str:
    """A fresh owner token for an idempotency claim: ``idem_<32 hex digits>``."""
    return f"idem_{secrets.token_hex(16)}"


def fingerprint_digest(fingerprint: str) -> str:
    """What is stored for a payload fingerprint: its SHA-256 in hex (64 characters).

    Stores keep this digest, never the fingerprint itself, so a fingerprint may be the
    request body, and the stored form is fixed-size and free of separators.
    """
    return hashlib.sha256(fingerprint.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class LockResult:
    """The outcome of :meth:`Lock.acquire`.

    ``fencing_token`` goes up with every successful acquire of a key, so a resource can
    refuse writes from a holder whose lock has since passed to another. It goes up on
    one server, and across a failover only where the store replicates each grant before
    acknowledging it (Redis ``wait_replicas``, a PostgreSQL synchronous standby): on an
    asynchronously replicated store a failover can hand the same tokens out again, and
    the lock to a second holder (docs/deploying.md, "What an acknowledgement survives";
    protect the resource with compare-and-set as well).
    """

    acquired: bool
    token: str
    fencing_token: int | None = None


@dataclass(frozen=True, slots=True)
class LockState:
    """Who holds a lock and for how long, as :meth:`LockBase.inspect` reads it.

    ``holder`` names the holder without being its token (:func:`holder_label`): the
    token releases the lock, so it is never shown. ``expires_in_ms`` is how long the lease
    had left when it was read (above 0: a lapsed lease has no holder), on the store's
    clock. ``fencing_token`` is the holder's acquire's fencing token where the store keeps
    one per key (memory, SQL), ``None`` where it does not (Redis counts per cluster slot).
    """

    holder: str
    expires_in_ms: int
    fencing_token: int | None = None


_SEED_TOKEN_PREFIX: Final = re.compile(r"(lock_\d+)_[0-9a-f]{32}")


def holder_label(token: str) -> str:
    """A label of the holder of ``token`` that does not give the token away: the first 8
    hex digits of its SHA-256, after the seed format's ``lock_<epoch ms>`` (when it was
    taken) for a token in that format: ``lock_1733369000123#3fa9c21b``, ``#5d41402a``.
    Two holders' labels differ (but for a one-in-four-billion collision); the token cannot
    be derived from its label."""
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    seed = _SEED_TOKEN_PREFIX.fullmatch(token)
    return f"{seed.group(1) if seed else ''}#{digest}"


@runtime_checkable
class Lock(Protocol):
    """A distributed mutex with per-holder tokens (seed 001 §7)."""

    async def acquire(
        self, lock_key: str, ttl_ms: int = DEFAULT_LOCK_TTL_MS, custom_token: str | None = None
    ) -> LockResult:
        """Try once to take the lock for ``ttl_ms``."""
        ...

    async def release(self, lock_key: str, token: str) -> bool:
        """Release if ``token`` still holds the lock; ``True`` if released."""
        ...

    async def extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        """Reset the TTL if ``token`` still holds the lock; ``True`` if extended."""
        ...

    async def with_lock(
        self,
        lock_key: str,
        fn: Callable[[], Awaitable[T]],
        ttl_ms: int = DEFAULT_LOCK_TTL_MS,
        *,
        wait_ms: int = 0,
    ) -> T:
        """Run ``fn`` under the lock, waiting up to ``wait_ms`` for it, or raise
        :class:`~siglo.errors.LockNotAcquiredError`."""
        ...


@runtime_checkable
class NonceStore(Protocol):
    """Single-use tokens for webhook replay protection (seed 001 §8)."""

    async def claim(self, key: str, ttl_seconds: float) -> bool:
        """``True`` for the first claim within the window, ``False`` for a replay."""
        ...


def new_lock_token(now_ms: int | None = None) -> str:
    """A lock token in the seed's format: ``lock_<epoch ms>_<32 hex digits>``."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return f"lock_{ms}_{secrets.token_hex(16)}"


_UNDO_AFTER_S: Final = (0.0, 0.05, 0.25, 1.0, 3.0)
"""When a cancelled call's taking is undone (seconds after the cancellation, each an
undo with the token made before the call): a call still in flight when its caller was
cancelled (a statement not yet committed, a command whose reply was not read) may land
after the first undo, which then finds nothing."""

_UNDOING: set[asyncio.Task[None]] = set()
_FIRST_TRIES: dict[asyncio.Task[None], asyncio.Event] = {}
"""Set once each undo in progress has made its first try (:func:`undos_settled`)."""
_log = masking.logger("siglo.locking")


def undos_pending(loop: asyncio.AbstractEventLoop | None = None) -> int:
    """How many cancelled calls are still being undone in this process (on an event
    loop still open: one closed with an undo pending will never run it), or on ``loop``
    alone."""
    return sum(pending_on(task, loop) for task in _UNDOING)


def pending_on(task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop | None) -> bool:
    """Whether ``task`` is not done and its event loop (``loop``, if given) can still
    run it."""
    owner = task.get_loop()
    return not task.done() and not owner.is_closed() and (loop is None or owner is loop)


async def undos_settled(timeout_s: float) -> None:
    """Wait, at most ``timeout_s``, for the undos in progress (:func:`undo_later`): what
    :meth:`siglo.Backend.aclose` does before closing the connections they need."""
    tried = [
        asyncio.ensure_future(event.wait())
        for task, event in list(_FIRST_TRIES.items())
        if not task.done() and not event.is_set()
    ]
    if tried:
        # Its first try, not its later ones: those are for a call still on its way,
        # which a closing connection will not see land anyway.
        _, late = await asyncio.wait(tried, timeout=timeout_s)
        for waiter in late:
            waiter.cancel()


def undo_later(
    what: str,
    undo: Callable[[], Awaitable[bool | None]],
    *,
    lapses_in_ms: int,
    done: str = "released",
) -> None:
    """Undo, in the background, what a call cut off by its caller may have taken (a
    lock, an owned claim, a wait's claim): ``undo()`` — a release with the token the
    call was made with, ``True`` once it released something — at once and again a few
    times (:data:`_UNDO_AFTER_S`), until it does or what was taken lapses by itself
    (``lapses_in_ms``). An undo that finds another holder's, or nothing, changes
    nothing: each is made with the token of the call it undoes.

    A request's timeout (``asyncio.wait_for`` around a handler) can cancel a call after
    the store granted it and before the reply came back: the token would be lost with
    the reply, and the key held by nobody until its lease ended (every retry of the
    request refused until then). ``done`` is what the log says of it once undone; an
    ``undo()`` that returns ``None`` found nothing left to undo (another holder's now),
    and ends the tries without a word."""
    loop = asyncio.get_running_loop()
    first_try = asyncio.Event()
    lapses_at = loop.time() + ms_as_seconds(lapses_in_ms)
    task = loop.create_task(_undo(what, undo, lapses_at, first_try, done))
    _UNDOING.add(task)
    _FIRST_TRIES[task] = first_try
    task.add_done_callback(_UNDOING.discard)
    task.add_done_callback(_FIRST_TRIES.pop)


async def _undo(
    what: str,
    undo: Callable[[], Awaitable[bool | None]],
    lapses_at: float,
    first_try: asyncio.Event,
    done: str,
) -> None:
    loop = asyncio.get_running_loop()
    waited = 0.0
    try:
        for at in _UNDO_AFTER_S:
            if loop.time() >= lapses_at:
                return
            await asyncio.sleep(at - waited)
            waited = at
            try:
                undone = await undo()
                if undone:
                    _log.info("%s %s after the call that took it was cancelled", what, done)
                if undone is not False:
                    return
            except Exception:
                continue
            finally:
                first_try.set()
    finally:
        first_try.set()


async def acquire_undone_on_cancel(lock: Lock, lock_key: str, ttl_ms: int) -> LockResult:
    """``lock.acquire(lock_key, ttl_ms)`` with a token made here, released in the
    background (:func:`undo_later`) if the caller is cancelled during the acquire or its
    outcome is unknown. :meth:`LockBase.with_lock` and
    :func:`siglo.locking.run_with_lock` (the workflow lock) acquire through it."""
    token = new_lock_token()
    try:
        return await lock.acquire(lock_key, ttl_ms, token)
    except InvalidArgumentError:
        raise  # refused before anything was sent
    except BaseException:
        undo_later(f"lock {lock_key!r}", lambda: lock.release(lock_key, token), lapses_in_ms=ttl_ms)
        raise


def nonce_ttl_ms(ttl_seconds: float) -> int:
    """The seed's window: ``max(1, floor(ttl_seconds * 1000))`` milliseconds, capped at
    :data:`~siglo.validation.MAX_DURATION_MS` (a longer window means "never", as a TTL
    in milliseconds past it does)."""
    return seconds_as_ms("ttl_seconds", ttl_seconds)


class IdempotencyStoreBase(Closable):
    """Base class of idempotency stores: argument checks once, then the ``_do_…`` hooks.

    Subclasses implement :meth:`_do_claim_owned`, :meth:`_do_complete`,
    :meth:`_do_complete_owned`, :meth:`_do_fail`, :meth:`_do_fail_owned`,
    :meth:`_do_extend` and :meth:`_do_get_result`; each receives arguments already
    checked (a fingerprint as its :func:`fingerprint_digest`). The seed's claim,
    :meth:`_do_claim`, is :meth:`_do_claim_owned` with no owner and no fingerprint; a
    store written before owners existed implements :meth:`_do_claim` instead (and then
    has only the token-less calls). An owned hook answers ``False`` when the caller is
    not the owner, and the base class raises
    :class:`~siglo.errors.IdempotencyOwnershipError`.

    Without ``ttl_ms``, :meth:`claim_owned` holds the key in progress for the store's
    ``default_lease_ms`` (``idempotency_lease_ms``, 30 s), so a crashed owner frees it in
    seconds; its token guards against the lapse (a lapsed owner's ``complete`` is refused,
    and :meth:`extend` renews a live claim). The seed's token-less :meth:`claim` keeps the
    seed's default, ``default_ttl_ms`` (24 h): an unowned claim that lapsed while its
    caller still ran could be completed twice. ``complete`` keeps a result for
    ``default_ttl_ms``.
    """

    default_ttl_ms: int = DEFAULTS.idempotency_ttl_ms
    default_lease_ms: int = DEFAULTS.idempotency_lease_ms

    def _default_claim_ms(self, token: str | None) -> int:
        """A claim's lifetime when it names none: the lease if owned, else the seed's."""
        return self.default_lease_ms if token is not None else self.default_ttl_ms

    async def claim(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> ClaimState:
        """``"claimed"`` for exactly one caller; then ``"in-progress"`` until completed
        or failed; ``"completed"`` once a result is stored.

        This seed-compatible claim has no owner: anyone may ``complete`` or ``fail`` it.
        With ``fingerprint`` the key remembers it, and a claim with another fingerprint
        raises :class:`~siglo.errors.IdempotencyKeyMismatchError`."""
        require_id("key", key)
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        self._require_open()
        if fingerprint is None:
            return await self._do_claim(key, ttl_ms)
        digest = _digest(fingerprint)
        return _claim_state(key, await self._do_claim_owned(key, ttl_ms, None, digest))

    async def claim_owned(
        self, key: str, ttl_ms: int | None = None, *, fingerprint: str | None = None
    ) -> IdempotencyClaim:
        """Like :meth:`claim`, and the winner gets an owner token: only it can then
        ``complete`` or ``fail`` the key, and only while its lease (``ttl_ms``, default
        ``default_lease_ms``) lasts."""
        require_id("key", key)
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        digest = None if fingerprint is None else _digest(fingerprint)
        token = new_idempotency_token()
        self._require_open()
        try:
            reply = await self._do_claim_owned(key, ttl_ms, token, digest)
        except BaseException:
            # Cut off by its caller (a request's timeout), or its outcome unknown: a claim
            # the store granted would hold the key for its whole lease with a token
            # nobody has. Freed with that token (a request that did no work yet).
            undo_later(
                f"idempotency key {key!r}",
                lambda: self._fail_owned_quietly(key, token),
                lapses_in_ms=self.default_lease_ms if ttl_ms is None else ttl_ms,
            )
            raise
        state = _claim_state(key, reply)
        return IdempotencyClaim(state, token if state == "claimed" else None)

    async def _fail_owned_quietly(self, key: str, token: str) -> bool:
        """Free ``key`` if the owned claim of ``token`` holds it; ``True`` if it did."""
        return await self._do_fail_owned(key, None, token)

    async def complete(
        self, key: str, result: Any, ttl_ms: int | None = None, *, token: str | None = None
    ) -> None:
        """Store ``result`` (JSON data) and mark the key completed.

        With ``token`` (from :meth:`claim_owned`) it succeeds only while that claim still
        holds the key; without, only if no owned claim holds it. Otherwise it raises
        :class:`~siglo.errors.IdempotencyOwnershipError` and changes nothing."""
        require_id("key", key)
        require_ttl_ms("ttl_ms", ttl_ms, optional=True)
        if token is not None:
            require_id("token", token)
        if not self.opened_above:  # above it, the pipeline checked the value it sealed
            refuse_reserved_value(result, f"the result of idempotency key {key!r}")
        self._require_open()
        if not await self._do_complete_owned(key, result, ttl_ms, token):
            raise _not_owner(key, "complete", token)

    async def fail(
        self, key: str, error: BaseException | None = None, *, token: str | None = None
    ) -> None:
        """Free an in-progress key for retry; a completed result is kept.

        With ``token`` it succeeds only while that claim still holds the key; without, it
        frees only a key no owned claim holds. Otherwise it raises
        :class:`~siglo.errors.IdempotencyOwnershipError` and changes nothing."""
        require_id("key", key)
        if token is not None:
            require_id("token", token)
        self._require_open()
        if not await self._do_fail_owned(key, error, token):
            raise _not_owner(key, "fail", token)

    async def extend(self, key: str, token: str, ttl_ms: int) -> bool:
        """Renew an owned claim's lease to ``ttl_ms`` from now; ``True`` if ``token`` still
        held the key in progress (``False``, and nothing changes, otherwise)."""
        require_id("key", key)
        require_id("token", token)
        require_ttl_ms("ttl_ms", ttl_ms)
        self._require_open()
        return await self._do_extend(key, token, ttl_ms)

    opened_above: bool = False
    """Set when the settings' pipeline is in front of this store and opens what it reads
    (:class:`~siglo.pipeline.PipelineIdempotencyStore`); otherwise an encoded result read
    here has nothing to open it."""

    async def get_result(self, key: str) -> Any | Missing:
        """The completed result, or :data:`~siglo.MISSING`. A result stored encoded
        (encrypted, compressed) read by a process without the keys or codecs for it is
        :class:`~siglo.errors.DecryptionError`, never the envelope handed on as the
        result."""
        require_id("key", key)
        self._require_open()
        try:
            found = await self._do_get_result(key)
        except OutcomeUnknownError as exc:  # a read: nothing it did changed anything
            raise read_failure(exc) from (exc.__cause__ or exc)
        if not self.opened_above:
            refuse_unopened_value(found, f"idempotency result {key!r}")
        return found

    async def get(self, key: str) -> Any | Missing:
        """Alias of :meth:`get_result`."""
        return await self.get_result(key)

    def scan_results(self) -> AsyncIterator[StoredPayload]:
        """Every live completed key with its result as stored (a
        :class:`~siglo.payloads.StoredPayload` of kind ``idempotency``, field
        ``result``): what ``siglo rekey`` re-encrypts. A store of a backend declaring
        ``payload_scan`` has it; others raise
        :class:`~siglo.errors.CapabilityNotSupportedError`."""
        self._require_open()
        return self._do_scan_results()

    async def swap_result(self, item: StoredPayload, fields: Mapping[str, Any]) -> bool:
        """Replace the result of the key ``item`` was listed from with
        ``fields["result"]`` — only if the key still holds what it held when listed;
        ``False`` (nothing changed) if it was claimed, completed again, failed or expired
        meanwhile. Its expiry and fingerprint stay as they were."""
        if not isinstance(item, StoredPayload) or item.kind != "idempotency":
            raise InvalidArgumentError(
                f"item must be a StoredPayload of kind 'idempotency', got {item!r}"
            )
        if set(fields) != {"result"}:
            raise InvalidArgumentError(f"fields must be {{'result': …}}, got {sorted(fields)}")
        self._require_open()
        return await self._do_swap_result(item, fields["result"])

    def _do_scan_results(self) -> AsyncIterator[StoredPayload]:
        raise _unsupported(self, "scan_results")

    async def _do_swap_result(self, item: StoredPayload, result: Any) -> bool:
        raise _unsupported(self, "swap_result")

    async def _do_claim(self, key: str, ttl_ms: int | None) -> ClaimState:
        """The seed's claim: :meth:`_do_claim_owned` with no owner and no fingerprint
        (which has nothing to mismatch: a ``"mismatch"`` answer is the store's fault)."""
        if not _overrides(self, "_do_claim_owned"):
            raise _unsupported(self, "claim")
        reply = await self._do_claim_owned(key, ttl_ms, None, None)
        if reply == "mismatch":
            raise StorageAdapterError(
                f"idempotency key {key!r}: {type(self).__name__} answered a claim without "
                "a fingerprint with 'mismatch'"
            )
        return reply

    async def _do_claim_owned(
        self, key: str, ttl_ms: int | None, token: str | None, fingerprint: str | None
    ) -> OwnedClaimReply:
        """Claim with an owner ``token`` and a fingerprint digest (either may be ``None``).

        The default serves only the seed's claim of a store that implements
        :meth:`_do_claim` (one written before owners existed)."""
        if token is None and fingerprint is None and _overrides(self, "_do_claim"):
            return await self._do_claim(key, ttl_ms)
        raise _unsupported(self, "claim_owned")

    async def _do_complete(self, key: str, result: Any, ttl_ms: int | None) -> None:
        raise _unsupported(self, "complete")

    async def _do_complete_owned(
        self, key: str, result: Any, ttl_ms: int | None, token: str | None
    ) -> bool:
        """Complete if ``token`` owns the key (``None``: if no owned claim holds it).

        The default serves only token-less calls, through :meth:`_do_complete`."""
        if token is not None:
            raise _unsupported(self, "complete(token=…)")
        await self._do_complete(key, result, ttl_ms)
        return True

    async def _do_fail(self, key: str, error: BaseException | None) -> None:
        raise _unsupported(self, "fail")

    async def _do_fail_owned(
        self, key: str, error: BaseException | None, token: str | None
    ) -> bool:
        """Fail if ``token`` owns the key (``None``: if no owned claim holds it).

        The default serves only token-less calls, through :meth:`_do_fail`."""
        if token is not None:
            raise _unsupported(self, "fail(token=…)")
        await self._do_fail(key, error)
        return True

    async def _do_extend(self, key: str, token: str, ttl_ms: int) -> bool:
        raise _unsupported(self, "extend")

    async def _do_get_result(self, key: str) -> Any | Missing:
        raise _unsupported(self, "get_result")


def _overrides(store: IdempotencyStoreBase, hook: str) -> bool:
    """Whether ``store``'s class implements ``hook`` (the two claim hooks' defaults call
    each other: each only when the other is the store's own)."""
    return getattr(type(store), hook) is not getattr(IdempotencyStoreBase, hook)


def _digest(fingerprint: str) -> str:
    if not isinstance(fingerprint, str):
        # Its type alone: a fingerprint is made of the request (its body, passed by
        # mistake as bytes), which an error message, a span or a log must not carry.
        raise InvalidArgumentError(
            "fingerprint must be a string (a digest of what the request asks, such as its "
            f"hex SHA-256), got {type(fingerprint).__name__}"
        )
    return fingerprint_digest(fingerprint)


def _claim_state(key: str, reply: OwnedClaimReply) -> ClaimState:
    if reply == "mismatch":
        raise IdempotencyKeyMismatchError(
            f"idempotency key {key!r} is held for a request with a different fingerprint"
        )
    return reply


def _not_owner(key: str, what: str, token: str | None) -> IdempotencyOwnershipError:
    if token is None:
        return IdempotencyOwnershipError(
            f"cannot {what} idempotency key {key!r} without its owner token: "
            "an owned claim holds it"
        )
    return IdempotencyOwnershipError(
        f"cannot {what} idempotency key {key!r}: the token does not own it "
        "(its lease lapsed, or it was failed, completed or claimed by another)"
    )


class LockBase(Closable):
    """Base class of locks: argument checks once, then the ``_do_…`` hooks, and
    :meth:`with_lock` built on :meth:`acquire` and :meth:`release`.

    Subclasses implement :meth:`_do_acquire`, :meth:`_do_release`, :meth:`_do_extend`
    and (contract 1.4) :meth:`_do_inspect`; each receives arguments already checked.
    """

    failure_observer: Callable[[str, BaseException], None] | None = None
    """Told of each call that raised (``"lock.acquire"``, ``"lock.release"``,
    ``"lock.extend"``, ``"lock.inspect"``, and the exception), if set: :func:`siglo.connect`
    sets it on a backend's public lock when an OpenTelemetry SDK listens, to count a call
    that ran past its bound under ``siglo.timeouts`` (the lock's calls are not traced).
    It never raises."""

    async def acquire(
        self, lock_key: str, ttl_ms: int = DEFAULT_LOCK_TTL_MS, custom_token: str | None = None
    ) -> LockResult:
        """Try once to take the lock for ``ttl_ms``."""
        require_id("lock_key", lock_key)
        require_ttl_ms("ttl_ms", ttl_ms)
        if custom_token is not None:
            require_id("custom_token", custom_token)
        self._require_open()
        try:
            return await self._do_acquire(lock_key, ttl_ms, custom_token)
        except BaseException as exc:
            _observed(self, "lock.acquire", exc)
            raise

    async def release(self, lock_key: str, token: str) -> bool:
        """Release if ``token`` still holds the lock; ``True`` if released."""
        require_id("lock_key", lock_key)
        require_id("token", token)
        self._require_open()
        try:
            return await self._do_release(lock_key, token)
        except BaseException as exc:
            _observed(self, "lock.release", exc)
            raise

    async def extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        """Reset the TTL if ``token`` still holds the lock; ``True`` if extended."""
        require_id("lock_key", lock_key)
        require_id("token", token)
        require_ttl_ms("ttl_ms", ttl_ms)
        self._require_open()
        try:
            return await self._do_extend(lock_key, token, ttl_ms)
        except BaseException as exc:
            _observed(self, "lock.extend", exc)
            raise

    async def inspect(self, lock_key: str) -> LockState | None:
        """Who holds ``lock_key`` and until when, or ``None`` when nobody does (never
        taken, released, or its lease lapsed). Read-only: one command, script or
        statement that changes nothing, so a lapsed lease is never renewed by looking.

        A lock class that does not implement it (a third-party lock built before
        contract 1.4) raises :class:`~siglo.errors.CapabilityNotSupportedError`; ``siglo
        ui`` then tells a held lock from a free one by taking it for an instant."""
        require_id("lock_key", lock_key)
        self._require_open()
        try:
            try:
                return await self._do_inspect(lock_key)
            except OutcomeUnknownError as exc:  # a read: nothing it did changed anything
                raise read_failure(exc) from (exc.__cause__ or exc)
        except BaseException as exc:
            _observed(self, "lock.inspect", exc)
            raise

    async def _do_acquire(self, lock_key: str, ttl_ms: int, custom_token: str | None) -> LockResult:
        raise _unsupported(self, "acquire")

    async def _do_inspect(self, lock_key: str) -> LockState | None:
        raise _unsupported(self, "inspect")

    async def _do_release(self, lock_key: str, token: str) -> bool:
        raise _unsupported(self, "release")

    async def _do_extend(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        raise _unsupported(self, "extend")

    async def with_lock(
        self,
        lock_key: str,
        fn: Callable[[], Awaitable[T]],
        ttl_ms: int = DEFAULT_LOCK_TTL_MS,
        *,
        wait_ms: int = 0,
    ) -> T:
        """Run ``fn`` under the lock, or raise :class:`~siglo.errors.LockNotAcquiredError`.

        ``wait_ms`` (default 0: one attempt, the seed's behaviour) is how long to wait for
        a held lock: the acquire is retried with jittered exponential back-off (2 ms
        doubling up to 50 ms between attempts) until it succeeds or ``wait_ms`` has
        passed, so concurrent callers queue up behind the holder like a mutex's, each
        running ``fn`` in turn. The lock is released in a ``finally`` (a failed release
        is ignored: the TTL frees the key anyway), so an exception in ``fn`` does not
        leak the lock. The lease is not renewed while ``fn`` runs: a ``fn`` that may
        outlast ``ttl_ms`` belongs under :func:`siglo.locking.run_with_lock`.
        """
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0:
            raise InvalidArgumentError(
                f"wait_ms must be a non-negative integer of milliseconds, got {wait_ms!r}"
            )
        result = await self._acquire_within(lock_key, ttl_ms, wait_ms)
        if not result.acquired:
            waited = f" after waiting {wait_ms} ms" if wait_ms else ""
            raise LockNotAcquiredError(
                f"Failed to acquire lock for key: {lock_key} (in-use or concurrent "
                f"execution){waited}"
            )
        try:
            return await fn()
        finally:
            token = result.token
            try:
                await self.release(lock_key, token)
            except asyncio.CancelledError:
                # Cut off by its caller mid-release: the release may never have been
                # sent, so it is made again in the background, not left to the TTL.
                undo_later(
                    f"lock {lock_key!r}",
                    lambda: self.release(lock_key, token),
                    lapses_in_ms=ttl_ms,
                )
                raise
            except Exception:
                pass  # the seed swallows release failures: the TTL frees the key anyway

    async def _acquire_within(self, lock_key: str, ttl_ms: int, wait_ms: int) -> LockResult:
        """:meth:`acquire`, retried with back-off until acquired or ``wait_ms`` passed."""
        deadline = time.monotonic() + ms_as_seconds(wait_ms)
        delay = _MIN_POLL_S
        while True:
            # Undone if the caller is cancelled meanwhile (acquire_undone_on_cancel).
            result = await acquire_undone_on_cancel(self, lock_key, ttl_ms)
            remaining = deadline - time.monotonic()
            if result.acquired or remaining <= 0:
                return result
            # Jitter keeps waiters from waking in lock-step and racing as a herd.
            await asyncio.sleep(min(remaining, delay * (0.5 + random.random())))
            delay = min(delay * 2, _MAX_POLL_S)


class NonceStoreBase(Closable):
    """Base class of nonce stores: argument checks once, then :meth:`_do_claim`.

    The hook receives the window already converted to milliseconds (:func:`nonce_ttl_ms`).
    """

    failure_observer: Callable[[str, BaseException], None] | None = None
    """Told of each claim that raised (``"nonces.claim"`` and the exception), if set: as
    :attr:`LockBase.failure_observer`, to count a claim past its bound under
    ``siglo.timeouts``."""

    async def claim(self, key: str, ttl_seconds: float) -> bool:
        """``True`` for the first claim within the window, ``False`` for a replay."""
        require_id("key", key)
        ttl_ms = nonce_ttl_ms(ttl_seconds)
        self._require_open()
        try:
            return await self._do_claim(key, ttl_ms)
        except BaseException as exc:
            _observed(self, "nonces.claim", exc)
            raise

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        raise _unsupported(self, "claim")


def _observed(part: LockBase | NonceStoreBase, operation: str, exc: BaseException) -> None:
    """Tell ``part``'s :attr:`~LockBase.failure_observer`, if it has one, that its call
    ``operation`` raised ``exc`` (the observer never raises)."""
    observer = part.failure_observer
    if observer is not None:
        observer(operation, exc)


def _unsupported(part: object, method: str) -> CapabilityNotSupportedError:
    return CapabilityNotSupportedError(f"{type(part).__name__} does not implement {method}()")
