"""The SQL backends against the memory reference model: the same random programs,
the same observable results, step by step.

Rules: checkpoint.roundtrip, checkpoint.missing, checkpoint.occ.expected,
checkpoint.occ.conflict, checkpoint.occ.monotonic, checkpoint.namespace.isolation,
checkpoint.namespace.fallback, checkpoint.expiry.hidden, checkpoint.expiry.clean,
wait.roundtrip, wait.by-stack, wait.checkpoint-fallback, wait.claim.once,
wait.claim.refused, wait.claim.expired, wait.claim.lease, wait.complete.claimant,
wait.cancel, wait.cancel-workflow, wait.retention, cache.roundtrip, cache.falsy-hit,
cache.miss, cache.expiry, context.stream, idempotency.claim.once, idempotency.complete,
idempotency.fail, idempotency.expiry, lock.acquire.exclusive, lock.release.token,
lock.extend.token, lock.expiry, lock.fencing, nonce.claim.once, nonce.expiry,
input.rejected, ids.hostile.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sql_support import KINDS, open_backend

import siglo
from siglo import Checkpoint, ContextChangeEvent, ManualClock, WaitRecord

STACKS = ["s1", "s2", "a:b*{c}", "ünï'%_\\", "x" * 300]
NAMESPACES = [None, None, "A", "b:*%", "ü"]
KEYS = ["k1", "k2", "s1", "s2", "k:*?[", "'quoted'"]
CLAIMANTS = ["c1", "c2", None]
STATUSES = ["running", "waiting", "completed", "failed", "cancelled"]
WAIT_STATUSES = ["waiting", "waiting", "waiting", "claimed", "completed", "cancelled"]
VALUES: list[Any] = [None, 0, False, "", [], {}, {"a": [1, 2]}, "text", 3.5, [None]]
TOKENS = ["t1", "t2", "t3"]
OPTIONS = {"checkpoint_ttl_ms": 50_000, "cache_ttl_ms": 20_000, "claim_lease_ms": 5_000}


def _norm(value: Any) -> Any:
    if isinstance(value, Checkpoint):
        return ("checkpoint", value.to_wire())
    if isinstance(value, WaitRecord):
        wire = value.to_wire()
        if wire.get("claimantId") not in (None, "c1", "c2"):
            wire["claimantId"] = "<generated>"  # random: compare that there is one
        return ("wait", wire)
    if isinstance(value, siglo.LockResult):
        return ("lock", value.acquired, value.fencing_token)
    return value


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return ("ok", _norm(await fn(*args, **kwargs)))
    except siglo.CheckpointConflictError as exc:
        return ("conflict", exc.stack_id, exc.current_revision, exc.expected_revision)
    except siglo.SigloError as exc:
        return ("error", type(exc).__name__)


class Program:
    """One random step, run the same way on every backend."""

    def __init__(self, rng: random.Random, now: int) -> None:
        self.rng = rng
        self.now = now

    def step(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        r = self.rng
        c = r.choice
        op = c(
            ["save"] * 6 + ["get"] * 4 + ["clean", "advance", "advance"]
            + ["wsave"] * 3 + ["wget"] * 2 + ["claim"] * 3
            + ["complete", "cancel", "cancel_workflow"]
            + ["cset", "cget", "ctx", "ctxget", "iclaim", "icomplete", "ifail", "iget"]
            + ["lacq", "lacq", "lrel", "lext", "nonce", "bad"]
        )  # fmt: skip
        now = self.now
        if op == "advance":
            return op, (c([1, 1_000, 4_000, 10_000, 30_000]),), {}
        if op == "save":
            rev = r.randint(1, 6)
            expected = c([None, None, 0, rev - 1, rev - 1, r.randint(0, rev - 1)])
            cp = Checkpoint(
                stack_id=c(STACKS),
                namespace=c(NAMESPACES),
                revision=rev,
                timestamp=now,
                status=c(STATUSES),
                expires_at=c([None, None, now + r.randint(1, 40_000)]),
                contexts={"step": {"v": r.randint(0, 9)}},
                metadata=c(
                    [None, {"waitRecord": {"correlationKey": "emb", "stackId": "e",
                                           "status": "waiting"}}]
                ),
            )  # fmt: skip
            return op, (cp,), {"expected_revision": expected}
        if op == "get":
            return op, (c(STACKS), c(NAMESPACES)), {"fallback": c([True, True, False])}
        if op == "clean":
            return op, (), {}
        if op == "wsave":
            status = c(WAIT_STATUSES)
            record = WaitRecord(
                correlation_key=c(KEYS),
                stack_id=c(STACKS[:3]),
                namespace=c(NAMESPACES),
                status=status,
                expires_at=c([None, now + r.randint(1, 20_000)]),
                claimant_id="c1" if status == "claimed" else None,
                lease_expires_at=now + 3_000 if status == "claimed" else None,
                event_payload=c([None, {"p": 1}]),
                extra={"custom": r.randint(0, 3)},
            )
            return op, (record,), {"ttl_ms": c([None, None, r.randint(1, 60_000)])}
        if op == "wget":
            return op, (c(KEYS + STACKS[:3] + ["emb-missing"]),), {}
        if op == "claim":
            kwargs: dict[str, Any] = {"allow_expired": c([False, False, True])}
            if r.random() < 0.5:
                kwargs["event_payload"] = c(VALUES)
            if r.random() < 0.3:
                kwargs["lease_ms"] = r.randint(1, 10_000)
            return op, (c(KEYS), c(CLAIMANTS)), kwargs
        if op == "complete":
            return op, (c(KEYS), c(["c1", "c2"])), {}
        if op == "cancel":
            return op, (c(KEYS),), {}
        if op == "cancel_workflow":
            return op, (c(STACKS[:3]), c(NAMESPACES)), {}
        if op == "cset":
            return op, (c(KEYS), c(VALUES), c([None, r.randint(1, 30_000)])), {}
        if op == "cget":
            return op, (c(KEYS),), {}
        if op == "ctx":
            event = ContextChangeEvent(
                stack_id=c(STACKS[:2]),
                step_id=c(["p", "q"]),
                key=c(["f", "g", "h"]),
                value=c(VALUES),
                op=c(["set", "set", "delete"]),
                namespace=c(NAMESPACES[:3]),
                timestamp=now,
            )
            return op, (event,), {}
        if op == "ctxget":
            return op, (c(STACKS[:2]), c(["p", "q"]), c(NAMESPACES[:3])), {}
        if op in ("iclaim", "icomplete", "ifail", "iget"):
            key = c(KEYS[:3])
            if op == "iclaim":
                return op, (key, c([None, r.randint(1, 30_000)])), {}
            if op == "icomplete":
                return op, (key, c(VALUES), c([None, r.randint(1, 30_000)])), {}
            return op, (key,), {}
        if op == "lacq":
            return op, (c(KEYS[:2]), r.randint(1, 20_000), c(TOKENS)), {}
        if op == "lrel":
            return op, (c(KEYS[:2]), c(TOKENS)), {}
        if op == "lext":
            return op, (c(KEYS[:2]), c(TOKENS), r.randint(1, 20_000)), {}
        if op == "nonce":
            return op, (c(KEYS[:3]), c([0.5, 1, 10.0, 25])), {}
        # bad input: an empty id, a NUL, a bad TTL, a revision not above expected
        return op, (c(range(6)),), {}


async def _run(backend: siglo.Backend, clock: ManualClock, op: str, args: Any, kw: Any) -> Any:
    a = backend.adapter
    assert backend.idempotency
    assert backend.lock
    assert backend.nonces
    if op == "advance":
        clock.advance(args[0])
        return None
    table: dict[str, Any] = {
        "save": a.save_checkpoint,
        "get": a.get_checkpoint,
        "clean": a.clean_expired_checkpoints,
        "wsave": a.save_wait_record,
        "wget": a.get_wait_record,
        "claim": a.claim_wait_record,
        "complete": a.complete_wait_record,
        "cancel": a.cancel_wait_record,
        "cancel_workflow": a.cancel_workflow,
        "cset": a.set_cached_step,
        "cget": a.get_cached_step,
        "ctx": a.on_context_change,
        "ctxget": a.get_context_changes,
        "iclaim": backend.idempotency.claim,
        "icomplete": backend.idempotency.complete,
        "ifail": backend.idempotency.fail,
        "iget": backend.idempotency.get_result,
        "lacq": backend.lock.acquire,
        "lrel": backend.lock.release,
        "lext": backend.lock.extend,
        "nonce": backend.nonces.claim,
    }
    if op == "bad":
        which = args[0]
        now = clock.now_ms()
        bad = [
            (a.get_checkpoint, ("",), {}),
            (a.save_checkpoint, (Checkpoint(stack_id="s1", revision=1, timestamp=now),),
             {"expected_revision": 1}),
            (a.set_cached_step, ("k1", {1, 2}), {}),
            (backend.lock.acquire, ("k1", 0), {}),
            (a.claim_wait_record, ("k\x00",), {}),
            (backend.nonces.claim, ("k1", -1), {}),
        ][which]  # fmt: skip
        return await _call(bad[0], *bad[1], **bad[2])
    return await _call(table[op], *args, **kw)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_same_results_as_memory(kind: str, seed: int) -> None:
    start = 1_700_000_000_000
    model_clock, clock = ManualClock(start), ManualClock(start)
    model = siglo.connect("memory://", clock=model_clock, **OPTIONS)
    # The memory backend's stores take the clock too (connect gives it to all of them).
    async with open_backend(kind, clock=clock, **OPTIONS) as backend:
        program = Program(random.Random(f"{seed}"), start)
        for i in range(250):
            program.now = clock.now_ms()
            op, args, kw = program.step()
            expected = await _run(model, model_clock, op, args, kw)
            got = await _run(backend, clock, op, args, kw)
            assert got == expected, f"step {i}: {op}{args}{kw}"
