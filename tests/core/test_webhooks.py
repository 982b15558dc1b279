"""Webhook verification (issue 11 "Also build"): HMAC-SHA256 over the timestamp and the
raw body, a tolerance in both directions, then a nonce claim — on every backend's nonce
store (memory, SQLite, PostgreSQL, Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
from _redis_helpers import REDIS_URL, require_redis
from _tcp_proxy import proxied_url
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_storage import KINDS, any_backend

import siglo
from siglo import InvalidArgumentError, OutcomeUnknownError, SigloError, StorageAdapterError
from siglo.coordination import NonceStore
from siglo.webhooks import (
    VerifiedWebhook,
    WebhookError,
    WebhookReplayError,
    WebhookRequestError,
    WebhookSignatureError,
    WebhookSignatureMissingError,
    WebhookTimestampError,
    sign,
    verify,
)
from siglo_memory import MemoryNonceStore
from siglo_redis import isolated as redis_isolated

SECRET = "whsec_test_5e2f"
BODY = b'{"id":"evt_1","type":"invoice.paid","amount":5000}'


def _headers(value: str, name: str = "Siglo-Signature") -> dict[str, str]:
    return {name: value, "Content-Type": "application/json"}


@pytest.mark.parametrize("kind", KINDS)
async def test_verify_accepts_once_and_refuses_each_bad_request(kind: str) -> None:
    async with any_backend(kind) as backend:
        nonces = backend.nonces
        assert nonces is not None
        now = int(time.time())
        header = sign(SECRET, BODY, timestamp=now)

        # A forged or tampered request first: it must not use up the genuine one's nonce.
        with pytest.raises(WebhookSignatureError):
            await verify(SECRET, BODY + b" ", _headers(header), nonces)
        with pytest.raises(WebhookSignatureError):
            await verify("another-secret", BODY, _headers(header), nonces)

        verified = await verify(SECRET, BODY, _headers(header), nonces)
        assert verified == VerifiedWebhook(timestamp=now, signature=header.split("v1=")[1])
        # A replay inside the window, even with the header name in another case.
        with pytest.raises(WebhookReplayError):
            await verify(SECRET, BODY, {"siglo-signature": header}, nonces)

        # The tolerance holds in both directions.
        # The error says which way: a past time is negative "from now", a future one positive.
        old = sign(SECRET, BODY, timestamp=now - 330)
        with pytest.raises(WebhookTimestampError, match=r"is -3[23]\d s from now"):
            await verify(SECRET, BODY, _headers(old), nonces, tolerance_s=300)
        future = sign(SECRET, BODY, timestamp=now + 330)
        with pytest.raises(WebhookTimestampError, match=r"is \+3[23]\d s from now"):
            await verify(SECRET, BODY, _headers(future), nonces, tolerance_s=300)
        inside = sign(SECRET, BODY, timestamp=now - 250)
        assert (await verify(SECRET, BODY, _headers(inside), nonces)).timestamp == now - 250

        # Secret rotation: several v1 entries, or several secrets.
        other = sign("old-secret", BODY, timestamp=now + 1)
        rotated = f"{other},v1={sign(SECRET, BODY, timestamp=now + 1).split('v1=')[1]}"
        await verify(SECRET, BODY, _headers(rotated), nonces)
        again = sign("old-secret", BODY, timestamp=now + 2)
        await verify(["new-secret", "old-secret"], BODY, _headers(again), nonces)

        # A Stripe-style header name.
        stripe = sign(SECRET, BODY, timestamp=now + 3)
        await verify(
            SECRET, BODY, _headers(stripe, "Stripe-Signature"), nonces, header="Stripe-Signature"
        )


async def test_missing_or_malformed_headers_and_bad_arguments() -> None:
    async with any_backend("memory") as backend:
        nonces = backend.nonces
        assert nonces is not None
        now = int(time.time())
        for value in ("", "v1=abc", f"t={now}", "t=abc,v1=00", f"t={now},t={now},v1=00"):
            with pytest.raises(WebhookSignatureMissingError):
                await verify(SECRET, BODY, _headers(value), nonces)
        with pytest.raises(WebhookSignatureMissingError):
            await verify(SECRET, BODY, {}, nonces)
        header = _headers(sign(SECRET, BODY))
        with pytest.raises(InvalidArgumentError):
            await verify(SECRET, BODY.decode(), header, nonces)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await verify("", BODY, header, nonces)
        with pytest.raises(InvalidArgumentError):
            await verify(SECRET, BODY, header, nonces, tolerance_s=0)
        with pytest.raises(InvalidArgumentError):
            await verify([], BODY, header, nonces)
        # Every refusal is a SigloError a handler can catch once.
        assert issubclass(WebhookReplayError, SigloError)


def test_sign_matches_the_documented_scheme() -> None:
    import hashlib
    import hmac

    expected = hmac.new(SECRET.encode(), b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, BODY, timestamp=1_700_000_000) == f"t=1700000000,v1={expected}"


# Issue 31, defect 11: hostile headers raised raw TypeError/ValueError (a handler catching
# WebhookError answered 500). Every malformed request is a WebhookError.
_HEADER_VALUES = st.one_of(
    st.text(),
    st.binary(),
    st.builds(lambda t, v: f"t={t},v1={v}", st.text(), st.text()),
    st.builds(
        lambda digits, v: f"t={digits},v1={v}",
        st.one_of(
            st.text(alphabet="0123456789", min_size=1, max_size=20),
            st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
        ),
        st.text(alphabet="0123456789abcdef", max_size=64),
    ),
    st.builds(lambda v: f"t={int(time.time())},v1={v}", st.text()),
    st.none(),
    st.integers(),
    st.lists(st.text()),
)
_HEADERS = st.one_of(
    st.dictionaries(st.sampled_from(["Siglo-Signature", "siglo-signature"]), _HEADER_VALUES),
    st.dictionaries(st.one_of(st.text(), st.binary(), st.integers()), _HEADER_VALUES),
    st.builds(lambda v: {b"siglo-signature": v}, _HEADER_VALUES),
    st.none(),
    st.text(),
    st.integers(),
    st.lists(st.tuples(st.text(), st.text())),
)
_BODIES = st.one_of(st.binary(), st.text(), st.none(), st.integers(), st.just(bytearray(BODY)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=_HEADERS, body=_BODIES)
def test_every_malformed_request_raises_a_webhook_error(headers: object, body: object) -> None:
    nonces = MemoryNonceStore()

    async def call() -> None:
        await verify(SECRET, body, headers, nonces)  # type: ignore[arg-type]

    # Accepted is fine (a header fuzzed into a valid one is vanishingly rare); anything
    # raised must be a WebhookError.
    with contextlib.suppress(WebhookError):
        asyncio.run(call())


@pytest.mark.parametrize(
    "value",
    [
        "t={now},v1=é" + "0" * 63,  # non-ASCII signature: TypeError before
        "t=" + "9" * 5000 + ",v1=00",  # 5,000 digits: ValueError before
        "t=" + "9" * 400 + ",v1=00",  # an int too large for a float: OverflowError before
    ],
    ids=["non-ascii-signature", "5000-digit-timestamp", "timestamp-beyond-float"],
)
async def test_hostile_header_values_are_webhook_errors(value: str) -> None:
    # The current time is put in here, not in the parameters: xdist's workers must
    # collect the same test ids.
    value = value.replace("{now}", str(int(time.time())))
    with pytest.raises(WebhookError):
        await verify(SECRET, BODY, _headers(value), MemoryNonceStore())


async def test_request_of_the_wrong_shape_is_a_webhook_request_error() -> None:
    header = _headers(sign(SECRET, BODY))
    for body in (None, BODY.decode(), 12):
        with pytest.raises(WebhookRequestError):
            await verify(SECRET, body, header, MemoryNonceStore())  # type: ignore[arg-type]
    for headers in (None, "Siglo-Signature: x", [("Siglo-Signature", "x")]):
        with pytest.raises(WebhookRequestError):
            await verify(SECRET, BODY, headers, MemoryNonceStore())  # type: ignore[arg-type]
    # Headers as undecoded bytes (as ASGI servers give them) are read as Latin-1.
    raw = {b"siglo-signature": sign(SECRET, BODY).encode()}
    assert (await verify(SECRET, BODY, raw, MemoryNonceStore())).timestamp > 0  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_replay_with_one_rotation_signature_stripped_is_refused(kind: str) -> None:
    """During a rotation the sender signs with the old and the new secret, and the
    verifier accepts both. The header is not signed: a replay that strips one ``v1=``
    entry (so the other secret matches first) is the same delivery, and refused."""
    async with any_backend(kind) as backend:
        nonces = backend.nonces
        assert nonces is not None
        now = int(time.time())
        old = sign("old-secret", BODY, timestamp=now).split("v1=")[1]
        new = sign("new-secret", BODY, timestamp=now).split("v1=")[1]
        secrets = ["old-secret", "new-secret"]
        await verify(secrets, BODY, _headers(f"t={now},v1={old},v1={new}"), nonces)
        for replay in (f"t={now},v1={new}", f"t={now},v1={old}", f"t={now},v1={new},v1={old}"):
            with pytest.raises(WebhookReplayError):
                await verify(secrets, BODY, _headers(replay), nonces)
        # Another body at the same second is another delivery.
        other = sign("new-secret", BODY + b"\n", timestamp=now)
        await verify(secrets, BODY + b"\n", _headers(other), nonces)


def test_a_synchronous_handler_verifies_through_the_sync_facade() -> None:
    """A Flask or Django view: ``siglo.sync.verify_webhook`` with the sync backend's nonce
    store accepts once and refuses the replay; the async ``verify`` given that store is
    refused before it claims anything, so the sender's retry is still accepted."""
    from siglo import sync

    with sync.connect("memory://") as backend:
        nonces = backend.require_nonces()
        header = sign(SECRET, BODY)
        with pytest.raises(InvalidArgumentError, match=r"siglo\.sync\.verify_webhook"):
            asyncio.run(verify(SECRET, BODY, _headers(header), nonces))  # type: ignore[arg-type]
        verified = sync.verify_webhook(SECRET, BODY, _headers(header), nonces)
        assert verified.signature == header.split("v1=")[1]
        with pytest.raises(WebhookReplayError):
            sync.verify_webhook(SECRET, BODY, _headers(header), nonces)
        # No store (a `None` from an unset setting), or not one: a clear error, not an
        # AttributeError after the signature check.
        fresh = sign(SECRET, BODY + b"!")
        for wrong in (None, object(), "nonces"):
            with pytest.raises(InvalidArgumentError, match="nonce_store must be a nonce store"):
                sync.verify_webhook(SECRET, BODY + b"!", _headers(fresh), wrong)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match="nonce_store must be a nonce store"):
                asyncio.run(verify(SECRET, BODY + b"!", _headers(fresh), wrong))  # type: ignore[arg-type]
        assert sync.verify_webhook(SECRET, BODY + b"!", _headers(fresh), nonces).timestamp > 0


@pytest.mark.parametrize("kind", KINDS)
async def test_two_receivers_with_their_own_scopes_share_a_nonce_store(kind: str) -> None:
    """Tenants A and B verify their own senders' webhooks on one backend's nonce store,
    each with its ``scope``: A's delivery of a body does not make B's genuine delivery
    of the same body, signed in the same second with B's secret, a replay; each one's
    replay is still refused."""
    async with any_backend(kind) as backend:
        nonces = backend.nonces
        assert nonces is not None
        now = int(time.time())
        for tenant in ("tenant-a", "tenant-b"):
            secret = f"whsec_{tenant}"
            header = sign(secret, BODY, timestamp=now)
            await verify(secret, BODY, _headers(header), nonces, scope=tenant)
            with pytest.raises(WebhookReplayError):
                await verify(secret, BODY, _headers(header), nonces, scope=tenant)
        with pytest.raises(InvalidArgumentError, match="scope"):
            await verify(SECRET, BODY, _headers(sign(SECRET, BODY)), nonces, scope="")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_replay_to_a_receiver_listing_its_secrets_otherwise_is_refused(kind: str) -> None:
    """A rotation is deployed receiver by receiver: one verifies with ``["old"]``, the
    next with ``["new", "old"]``. A delivery accepted by the first is a replay to the
    second (and to a receiver listing them the other way round): the nonce names the
    delivery, not a secret."""
    async with any_backend(kind) as backend:
        nonces = backend.nonces
        assert nonces is not None
        header = sign("old", BODY)
        await verify(["old"], BODY, _headers(header), nonces)
        for secrets in (["new", "old"], ["old", "new"]):
            with pytest.raises(WebhookReplayError):
                await verify(secrets, BODY, _headers(header), nonces)


async def _handle(body: bytes, headers: dict[str, str], nonces: NonceStore) -> int:
    """The handler docs/safety.md shows ("Webhook signatures"), as its status code."""
    try:
        await verify(SECRET, body, headers, nonces, tolerance_s=300)
    except WebhookError:
        return 400
    except StorageAdapterError:
        return 503  # the nonce store failed: not verified, and the sender retries
    return 200


async def test_a_nonce_store_that_times_out_is_a_503_and_the_retry_is_accepted(
    tmp_path: Path,
) -> None:
    """docs/safety.md, "When the nonce store fails": another process holds SQLite's write
    lock past ``command_timeout_ms``. ``verify`` raises the store's error, not a
    ``WebhookError`` (the handler answers 503, not 400, nor a 500 it never caught); the
    claim is known not to have happened, so the sender's retry of the very same request
    is accepted once the store is back, and only a replay after that is refused."""
    path = tmp_path / "nonces.db"
    async with siglo.connect(f"sqlite:///{path}", command_timeout_ms=500) as backend:
        nonces = backend.require_nonces()
        assert await nonces.claim("warm-up", 60)  # the tables are made
        headers = _headers(sign(SECRET, BODY))
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # holds the write lock until it ends
            with pytest.raises(StorageAdapterError) as failed:
                await verify(SECRET, BODY, headers, nonces, tolerance_s=300)
            assert not isinstance(failed.value, WebhookError)
            assert failed.value.timed_out
            assert not isinstance(failed.value, OutcomeUnknownError)  # known not to be stored
            assert await _handle(BODY, headers, nonces) == 503
        finally:
            other.close()
        assert await _handle(BODY, headers, nonces) == 200  # the identical retry
        assert await _handle(BODY, headers, nonces) == 400  # a replay now
        with pytest.raises(WebhookReplayError):
            await verify(SECRET, BODY, headers, nonces, tolerance_s=300)


async def test_a_nonce_claim_whose_reply_is_lost_refuses_the_identical_retry() -> None:
    """docs/safety.md, "When the nonce store fails": the nonce's ``SET … NX`` reaches Redis
    and is stored, and its reply is dropped with the connection (a proxy between them).
    ``verify`` raises ``OutcomeUnknownError`` (a 503 from the documented handler). A
    nonce store keeps no owner to give the claim back with, so the sender's retry of the
    very same signed request is refused as a replay, as documented; a retry signed anew
    (a fresh ``t=``) is another delivery, and accepted."""
    require_redis()
    set_nx = b"$3\r\nSET\r\n"  # the nonce's claim; nothing else sent meanwhile is a SET
    with proxied_url(REDIS_URL, 6379) as (url, proxy):
        async with redis_isolated(url) as backend:
            nonces = backend.require_nonces()
            now = int(time.time())
            headers = _headers(sign(SECRET, BODY, timestamp=now))
            proxy.lose_reply_to(set_nx)
            with pytest.raises(OutcomeUnknownError) as failed:
                await verify(SECRET, BODY, headers, nonces, tolerance_s=300)
            assert not isinstance(failed.value, WebhookError)
            assert proxy.replies_lost == 1
            assert await _handle(BODY, headers, nonces) == 400  # the identical retry: a replay
            anew = _headers(sign(SECRET, BODY, timestamp=now + 1))
            assert await _handle(BODY, anew, nonces) == 200  # signed anew: accepted
            # The documented handler answers such a failure 503, never a 500.
            body = BODY + b"\n"
            proxy.lose_reply_to(set_nx)
            assert await _handle(body, _headers(sign(SECRET, body, timestamp=now)), nonces) == 503
            assert proxy.replies_lost == 2
