"""Webhook signatures: HMAC-SHA256 over the timestamp and the raw body, replay-proof.

The header scheme is the common ``t=<unix seconds>,v1=<hex HMAC-SHA256>`` (Stripe's):
the signed message is ``f"{t}.".encode() + body``. :func:`verify` checks, in order, that
the header is there and well formed, that ``t`` is within ``tolerance_s`` of now in
either direction, that a ``v1`` signature matches (compared in constant time; several
``v1`` entries, or several secrets, allow rotating a secret), and only then claims a
nonce for the delivery in a :class:`~siglo.coordination.NonceStore`, so a replay within
the window is refused while a forged request cannot use up a nonce. Each refusal is its
own :class:`WebhookError` subclass, and so is every malformed request, however hostile
(a header or body of the wrong type, a non-ASCII signature, a timestamp of thousands of
digits): a handler that catches :class:`WebhookError` answers every bad request with a
4xx. A failure of the nonce store is not a refusal: its
:class:`~siglo.errors.StorageAdapterError` is raised as it is, for the handler to answer
503 so that the sender retries (docs/safety.md, "When the nonce store fails").
:func:`sign` makes the header (for tests, or for a sender).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from siglo.clock import Clock, clock_or_system, system_clock
from siglo.coordination import NonceStore
from siglo.errors import InvalidArgumentError, SigloError
from siglo.validation import require_id, require_seconds

__all__ = [
    "DEFAULT_HEADER",
    "DEFAULT_TOLERANCE_S",
    "VerifiedWebhook",
    "WebhookError",
    "WebhookReplayError",
    "WebhookRequestError",
    "WebhookSignatureError",
    "WebhookSignatureMissingError",
    "WebhookTimestampError",
    "sign",
    "verify",
]

DEFAULT_HEADER: Final = "Siglo-Signature"
DEFAULT_TOLERANCE_S: Final = 300
"""Five minutes either way, as Stripe's libraries default to."""
_SCHEME: Final = "v1"
_NONCE_PREFIX: Final = "webhook:"
_MAX_TIMESTAMP_DIGITS: Final = 12
"""Unix seconds have 10 digits until the year 2286; a longer ``t=`` is malformed, and
refusing it before ``int()`` keeps a 5,000-digit value from reaching Python's
int-to-string limit (a raw ``ValueError``) or float arithmetic (``OverflowError``)."""

Secret = str | bytes


class WebhookError(SigloError):
    """A webhook request was refused; the subclass says why. Answer it with a 4xx.

    A nonce store that fails is not one: :func:`verify` raises its
    :class:`~siglo.errors.StorageAdapterError` (answer 503)."""


class WebhookSignatureMissingError(WebhookError):
    """The signature header is absent or not of the form ``t=…,v1=…``."""


class WebhookTimestampError(WebhookError):
    """The signed timestamp is further from now than the tolerance (past or future)."""


class WebhookSignatureError(WebhookError):
    """No ``v1`` signature matches the body and timestamp under the secret(s)."""


class WebhookReplayError(WebhookError):
    """This exact signed delivery was already accepted within its tolerance window."""


class WebhookRequestError(WebhookError, InvalidArgumentError):
    """The body is not raw bytes, or the headers are not a mapping of names to text.

    Both a :class:`WebhookError` (a handler answers it with a 4xx like any refusal) and an
    :class:`~siglo.errors.InvalidArgumentError` (usually the handler passed a re-encoded
    body, or the framework's headers in another shape).
    """


@dataclass(frozen=True, slots=True)
class VerifiedWebhook:
    """What :func:`verify` established: the signed timestamp and the matching signature."""

    timestamp: int
    signature: str


def _key(secret: Secret) -> bytes:
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes) or not secret:
        raise InvalidArgumentError("a webhook secret must be a non-empty str or bytes")
    return secret


def _raw(body: object) -> bytes:
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise WebhookRequestError(
        f"the webhook body must be the raw request bytes, got {type(body).__name__} "
        "(a re-encoded body may not be the bytes that were signed)"
    )


def _digest(key: bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: Secret, body: bytes, *, timestamp: int | None = None) -> str:
    """The header value ``t=<timestamp>,v1=<signature>`` for ``body`` (``timestamp``:
    Unix seconds, default now)."""
    if timestamp is None:
        timestamp = system_clock.now_ms() // 1000
    if type(timestamp) is not int or timestamp < 0:
        raise InvalidArgumentError(f"timestamp must be Unix seconds, got {timestamp!r}")
    return f"t={timestamp},{_SCHEME}={_digest(_key(secret), timestamp, _raw(body))}"


def _text(value: object) -> str | None:
    # HTTP header bytes are Latin-1 (ASGI servers hand them over undecoded).
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    return None


def _header(headers: Mapping[str, str], name: str) -> str:
    if not isinstance(headers, Mapping) and not callable(getattr(headers, "items", None)):
        raise WebhookRequestError(
            f"the request headers must be a mapping of names to values, got "
            f"{type(headers).__name__}"
        )
    wanted = name.lower()
    try:
        entries = iter(headers.items())
    except TypeError:
        raise WebhookRequestError(
            "the request headers must be a mapping of names to values"
        ) from None
    for entry in entries:
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise WebhookRequestError("the request headers must be a mapping of names to values")
        key = _text(entry[0])
        if key is None or key.lower() != wanted:
            continue
        value = _text(entry[1])
        if value is None:
            raise WebhookSignatureMissingError(
                f"the {name} header must be text, got {type(entry[1]).__name__}"
            )
        return value
    raise WebhookSignatureMissingError(f"the request has no {name} header")


def _parse(value: str, name: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for item in value.split(","):
        field, equals, content = item.strip().partition("=")
        if not equals:
            continue
        if field == "t":
            if (
                timestamp is not None
                or not content.isascii()
                or not content.isdigit()
                or len(content) > _MAX_TIMESTAMP_DIGITS
            ):
                raise WebhookSignatureMissingError(f"the {name} header has a malformed t=")
            timestamp = int(content)
        elif field == _SCHEME and content.isascii():
            # A hex digest is ASCII; anything else cannot match, and compare_digest
            # raises TypeError on non-ASCII text.
            signatures.append(content)
    if timestamp is None or not signatures:
        raise WebhookSignatureMissingError(
            f"the {name} header must hold t=<unix seconds> and at least one {_SCHEME}=<hex>"
        )
    return timestamp, signatures


def _is_sync_facade(store: object) -> bool:
    """Whether ``store`` is a :mod:`siglo.sync` facade (its ``claim`` blocks and returns a
    bool; the async store it wraps is its ``wrapped``), told without importing the
    facades, which sit above this module."""
    claim = getattr(store, "claim", None)
    return hasattr(store, "wrapped") and not inspect.iscoroutinefunction(claim)


async def verify(
    secret: Secret | Sequence[Secret],
    body: bytes,
    headers: Mapping[str, str],
    nonce_store: NonceStore,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    header: str = DEFAULT_HEADER,
    clock: Clock | None = None,
    scope: str | None = None,
) -> VerifiedWebhook:
    """Verify a signed webhook request and claim it once; raise a :class:`WebhookError`.

    ``secret`` may be several secrets (any one may match, for rotation); ``body`` is the
    raw request body; ``headers`` the request headers (looked up case-insensitively);
    ``tolerance_s`` how far the signed time may be from now, in either direction;
    ``scope`` names this receiver's deliveries in a nonce store it shares with receivers
    of other senders (a tenant's id): without it, two senders' deliveries of the same
    body in the same second are one delivery.

    When the nonce store fails, its :class:`~siglo.errors.StorageAdapterError` is raised
    (the request is neither accepted nor refused: answer 503, and the sender retries).
    An :class:`~siglo.errors.OutcomeUnknownError` among them may have claimed the nonce:
    a nonce store keeps no owner to give a claim back with, so a retry of the very same
    signed request is then refused as a replay (one signed anew is not); a claim known
    not to have happened claimed nothing, and the retry is accepted.
    """
    if scope is not None:
        require_id("scope", scope)
    # Capped: a tolerance past MAX_DURATION_S (10**400) accepts any signed time, and the
    # nonce's window worked out from it below stays a float.
    tolerance_s = require_seconds("tolerance_s", tolerance_s)
    keys = [_key(s) for s in ([secret] if isinstance(secret, str | bytes) else secret)]
    if not keys:
        raise InvalidArgumentError("at least one webhook secret is required")
    if not callable(getattr(nonce_store, "claim", None)):
        # Refused before anything else: found only at the claim, after the signature
        # check, it was an AttributeError on a genuine request.
        raise InvalidArgumentError(
            "nonce_store must be a nonce store (backend.require_nonces(); from synchronous "
            f"code sync_backend.require_nonces()), got {type(nonce_store).__name__}"
        )
    if _is_sync_facade(nonce_store):
        # A synchronous facade's store (siglo.sync), awaited here, would claim the nonce
        # and then fail: the sender's retry would be refused as a replay. Refused first.
        raise InvalidArgumentError(
            "nonce_store must be an async nonce store (backend.require_nonces()), got "
            f"a synchronous facade's {type(nonce_store).__name__}; from synchronous code use "
            "siglo.sync.verify_webhook(secret, body, headers, sync_backend.require_nonces())"
        )
    raw = _raw(body)
    timestamp, signatures = _parse(_header(headers, header), header)

    now_s = clock_or_system(clock).now_ms() / 1000
    if abs(now_s - timestamp) > tolerance_s:
        raise WebhookTimestampError(
            f"the signed timestamp {timestamp} is {timestamp - now_s:+.0f} s from now; "
            f"the tolerance is {tolerance_s:g} s either way (a stale or replayed request, "
            "or a clock out of sync)"
        )
    matched: str | None = None
    for key in keys:
        expected = _digest(key, timestamp, raw)
        for candidate in signatures:
            # compare_digest: the time taken does not reveal how much of it matched.
            if hmac.compare_digest(expected, candidate) and matched is None:
                matched = expected
    if matched is None:
        raise WebhookSignatureError(
            f"no {_SCHEME} signature in the {header} header matches the body "
            "(wrong secret, or the body was changed or re-encoded)"
        )
    # Only a genuine request claims its nonce, and only for as long as its timestamp can
    # pass the check above; after that the timestamp check refuses a replay by itself.
    window = max(1.0, timestamp + tolerance_s - now_s + 1)
    # The nonce names the delivery — its signed time and its body — not the signature
    # that matched, nor any secret: during a rotation a request carries one signature per
    # secret, and receivers list their secrets in any order (["old"], then ["new",
    # "old"]): a replay with one signature stripped from the (unsigned) header, or to a
    # receiver configured otherwise, must still be the same delivery. Receivers that share
    # a nonce store but not their senders (tenants) each name their ``scope``.
    delivery = hashlib.sha256(raw).hexdigest()
    where = "" if scope is None else f"{scope}:"
    if not await nonce_store.claim(f"{_NONCE_PREFIX}{where}{timestamp}:{delivery}", window):
        raise WebhookReplayError(
            f"this webhook (t={timestamp}) was already accepted: a replay is refused"
        )
    return VerifiedWebhook(timestamp=timestamp, signature=matched)
