"""Idempotency hardening (issue 11): owner tokens, leases, fingerprints, on every backend.

The failure this guards against (AWS Powertools' idempotency): a live claim was taken
over as an orphan and a payment ran twice. Here a claim's lease lapses in seconds, and
the lapsed owner's ``complete`` is refused, so only the new owner's result is stored.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from raw_storage import KINDS, any_backend
from sql_support import SHARED_KINDS, open_backend, race

from siglo.coordination import IdempotencyClaim, fingerprint_digest
from siglo.errors import (
    IdempotencyKeyMismatchError,
    IdempotencyOwnershipError,
    InvalidArgumentError,
)
from siglo.settings import DEFAULTS
from siglo_sql import SCHEMA_VERSION
from siglo_sql.keys import row_id

CLAIMERS = 16


@pytest.mark.rule("idempotency.lease", "idempotency.owner")
@pytest.mark.parametrize("kind", KINDS)
async def test_one_new_owner_after_a_lease_lapses(kind: str) -> None:
    async with any_backend(kind) as backend:
        idem: Any = backend.idempotency
        key = f"payment-{secrets.token_hex(4)}"
        first = await idem.claim_owned(key, 200)
        assert first.state == "claimed"
        await asyncio.sleep(0.35)  # the first owner "crashed" (or stalled) past its lease
        claims = await asyncio.gather(*(idem.claim_owned(key) for _ in range(CLAIMERS)))
        owners = [c for c in claims if c.state == "claimed"]
        assert len(owners) == 1, [c.state for c in claims]
        assert all(c == IdempotencyClaim("in-progress") for c in claims if c not in owners)
        assert owners[0].token not in (None, first.token)
        with pytest.raises(IdempotencyOwnershipError):
            await idem.complete(key, {"charged": "by the stale owner"}, token=first.token)
        with pytest.raises(IdempotencyOwnershipError):
            await idem.fail(key, token=first.token)
        await idem.complete(key, {"charged": "once"}, token=owners[0].token)
        assert await idem.get_result(key) == {"charged": "once"}
        assert await idem.claim(key) == "completed"


@pytest.mark.rule("idempotency.owner", "idempotency.fingerprint")
@pytest.mark.parametrize("kind", KINDS)
async def test_bad_arguments_change_nothing(kind: str) -> None:
    async with any_backend(kind) as backend:
        idem: Any = backend.idempotency
        won = await idem.claim_owned("k", 60_000, fingerprint="body")
        for call in (
            lambda: idem.complete("k", 1, token=""),
            lambda: idem.fail("k", token=7),
            lambda: idem.claim("k", fingerprint=b"body"),
            lambda: idem.extend("k", won.token, 0),
        ):
            with pytest.raises(InvalidArgumentError):
                await call()
        with pytest.raises(IdempotencyKeyMismatchError, match="different fingerprint"):
            await idem.claim_owned("k", fingerprint="other body")
        assert await idem.claim("k", fingerprint="body") == "in-progress"
        await idem.complete("k", 1, token=won.token)
        assert await idem.get_result("k") == 1


@pytest.mark.rule("idempotency.owner", "idempotency.lease")
async def test_redis_values_stay_the_seeds() -> None:
    """The key keeps the seed's values for the TypeScript side; the owner token and the
    fingerprint digest live in a sibling key of the same cluster slot."""
    from siglo_redis.keys import hash_slot

    async with any_backend("redis") as backend:
        idem: Any = backend.idempotency
        raw = idem.client
        key = "evt-owned"
        full = idem.key_prefix + key
        (sibling,) = [k for k in idem._keys(key) if k != full]
        assert sibling.startswith(idem.key_prefix[:-1] + "-owner:{")
        assert hash_slot(sibling) == hash_slot(full)
        won = await idem.claim_owned(key, fingerprint="body")
        assert await raw.get(full) in ("in-progress", b"in-progress")
        assert 0 < await raw.pttl(full) <= DEFAULTS.idempotency_lease_ms
        meta = await raw.get(sibling)
        meta = meta.decode() if isinstance(meta, bytes) else meta
        assert meta == f"{won.token}:{fingerprint_digest('body')}"
        await idem.complete(key, {"a": 1}, token=won.token)
        value = await raw.get(full)
        value = value.decode() if isinstance(value, bytes) else value
        assert value == 'COMPLETED:{"a":1}'
        assert await raw.pttl(full) > DEFAULTS.idempotency_lease_ms
        meta = await raw.get(sibling)
        assert (meta.decode() if isinstance(meta, bytes) else meta) == (
            ":" + fingerprint_digest("body")
        )
        # A value the TypeScript side wrote (no sibling) is a seed claim: no owner.
        await raw.set(idem.key_prefix + "from-ts", "in-progress", px=60_000)
        assert await idem.claim("from-ts") == "in-progress"
        await idem.complete("from-ts", 2)
        assert await idem.get_result("from-ts") == 2


@pytest.mark.rule("idempotency.owner")
@pytest.mark.parametrize("kind", SHARED_KINDS)
async def test_version_4_rows_migrate_to_owned_claims(kind: str) -> None:
    """Idempotency rows written at schema version 4 (no owner, no fingerprint columns)
    migrate to version 5 as seed claims: readable, completable without a token."""
    async with open_backend(kind, auto_migrate=False) as backend:
        adapter: Any = backend.adapter
        assert await adapter.migrate(target=4) == (0, 4)
        db = adapter.database
        table = (
            f"{adapter.schema}.siglo_idempotency_keys"
            if kind == "postgres"
            else "siglo_idempotency_keys"
        )
        insert = db.sql(
            f"INSERT INTO {table} (id, key, state, result, gone_at) "
            "VALUES (:id, :key, :state, :result, :gone_at)"
        )
        far = 4_000_000_000_000
        for key, state, result in (
            ("paid", "completed", b'{"ok":true}'),
            ("running", "in-progress", None),
        ):
            row = {"id": row_id(key), "key": key, "state": state, "result": result, "gone_at": far}
            await db.raw_fetch(insert, row)
        assert await adapter.migrate() == (4, SCHEMA_VERSION)
        idem: Any = backend.idempotency
        assert await idem.get_result("paid") == {"ok": True}
        assert await idem.claim("paid", fingerprint="any") == "completed"
        assert (await idem.claim_owned("running")).state == "in-progress"
        await idem.complete("running", 5)  # a version-4 claim has no owner
        assert await idem.get_result("running") == 5
        fresh = await idem.claim_owned("new")
        with pytest.raises(IdempotencyOwnershipError):
            await idem.complete("new", 1)
        await idem.complete("new", 1, token=fresh.token)


@pytest.mark.rule("idempotency.lease")
@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_lease_from_the_url_options(kind: str) -> None:
    """``idempotency_lease_ms`` (a URL or keyword option) sets an owned claim's lease."""
    async with any_backend(kind, idempotency_lease_ms=150) as backend:
        idem: Any = backend.idempotency
        assert idem.default_lease_ms == 150
        first = await idem.claim_owned("k")
        await asyncio.sleep(0.3)
        second = await idem.claim_owned("k")
        assert second.state == "claimed" and second.token != first.token


@pytest.mark.rule("idempotency.lease", "idempotency.owner")
@pytest.mark.parametrize("kind", SHARED_KINDS)
async def test_one_new_owner_across_processes(kind: str) -> None:
    """Worker processes race to claim keys whose first owner's lease lapsed: each key
    gets exactly one new owner, and every lapsed owner's complete is refused."""
    async with open_backend(kind) as backend:
        idem: Any = backend.idempotency
        keys = [f"order-{i}" for i in range(20)]
        stale = {k: (await idem.claim_owned(k, 100)).token for k in keys}
        await asyncio.sleep(0.2)
        won = [pair for result in await race("idempotency_owned", backend.url, keys=keys)
               for pair in result]  # fmt: skip
        assert sorted(k for k, _ in won) == sorted(keys)
        for key, token in won:
            with pytest.raises(IdempotencyOwnershipError):
                await idem.complete(key, "stale", token=stale[key])
            await idem.complete(key, "new", token=token)
            assert await idem.get_result(key) == "new"
