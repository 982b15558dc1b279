"""Webhook verification (issue 11 "Also build"): HMAC-SHA256 over the timestamp and the
raw body, a tolerance in both directions, then a nonce claim — on every backend's nonce
store (memory, SQLite, PostgreSQL, Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_storage import KINDS, any_backend

from siglo import InvalidArgumentError, SigloError
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
