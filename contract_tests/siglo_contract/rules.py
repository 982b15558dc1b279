"""The rules of ``docs/contract.md``, machine-readable.

Each rule has a stable id, the capability a backend must declare for the rule to apply
(``None``: every backend), whether the contract suite checks it against backends
(``adapter``) or siglo's own tests check it (``core``), and a one-line summary. A test in
``tests/`` keeps this list and the documentation page identical.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from siglo.adapter import Capability

__all__ = [
    "ADAPTER_RULES",
    "CORE_RULES",
    "RULES",
    "Rule",
    "primary_order",
    "rule",
    "select_rules",
]


@dataclass(frozen=True, slots=True)
class Rule:
    """One documented rule."""

    id: str
    capability: Capability | None
    """The capability the rule belongs to; ``None`` for rules every backend obeys."""
    kind: Literal["adapter", "core"]
    summary: str
    since: str = "1.0"
    """The contract version that introduced the rule."""
    changed: str | None = None
    """The contract version that last changed what the rule requires (``None``: never)."""


_C = Capability


def _a(rule_id: str, capability: Capability | None, summary: str) -> Rule:
    return Rule(rule_id, capability, "adapter", summary)


def _core(rule_id: str, summary: str) -> Rule:
    return Rule(rule_id, None, "core", summary)


_WRITTEN: Final[tuple[Rule, ...]] = (
    _a(
        "checkpoint.roundtrip",
        _C.CHECKPOINTS,
        "a saved checkpoint reads back equal, extra included",
    ),
    _a(
        "payload.byte-faithful",
        _C.CHECKPOINTS,
        "sealed (encoded) payloads read back exactly as saved, and decrypt",
    ),
    _a("checkpoint.missing", _C.CHECKPOINTS, "a stack never saved reads as None"),
    _a("checkpoint.occ.expected", _C.CHECKPOINTS, "a save with the right expected_revision stores"),
    _a(
        "checkpoint.occ.conflict",
        _C.CHECKPOINTS,
        "a wrong expected_revision raises a conflict, nothing changes",
    ),
    _a(
        "checkpoint.occ.monotonic",
        _C.CHECKPOINTS,
        "a save without expected_revision must move the revision forward",
    ),
    _a("checkpoint.occ.atomic", _C.CHECKPOINTS, "of N concurrent CAS saves exactly one wins"),
    _a("checkpoint.namespace.isolation", _C.CHECKPOINTS, "namespaces never leak into each other"),
    _a(
        "checkpoint.namespace.fallback",
        _C.CHECKPOINTS,
        "a namespaced read falls back to the un-namespaced checkpoint",
    ),
    _a("checkpoint.expiry.hidden", _C.CHECKPOINTS, "an expired checkpoint is never returned"),
    _a(
        "checkpoint.retention",
        _C.CHECKPOINTS,
        "a checkpoint saved without expires_at is gone after checkpoint_ttl_ms",
    ),
    _a("checkpoint.expiry.clean", _C.CHECKPOINTS, "clean-up removes expired checkpoints only"),
    _a(
        "checkpoint.size.guard",
        _C.CHECKPOINTS,
        "a document over the limit raises DocumentTooLargeError, nothing written",
    ),
    _a(
        "checkpoint.incremental",
        _C.CHECKPOINTS,
        "after saves that grow, change, move and drop contexts, a load is the last save",
    ),
    _a(
        "wait.roundtrip",
        _C.WAIT_RECORDS,
        "a saved wait record reads back equal; a re-save replaces it",
    ),
    _a("wait.by-stack", _C.WAIT_RECORDS, "a stack id finds the stack's latest wait record"),
    _a(
        "wait.checkpoint-fallback",
        _C.WAIT_RECORDS,
        "a wait record embedded in the checkpoint is found",
    ),
    _a(
        "wait.claim.once",
        _C.WAIT_RECORDS,
        "a claim moves waiting to claimed for exactly one caller",
    ),
    _a("wait.claim.refused", _C.WAIT_RECORDS, "unclaimable records give None and do not change"),
    _a("wait.claim.expired", _C.WAIT_RECORDS, "a record past its deadline needs allow_expired"),
    _a("wait.claim.lease", _C.WAIT_RECORDS, "a claim whose lease ran out can be taken over"),
    _a("wait.complete.claimant", _C.WAIT_RECORDS, "only the claimant completes a claimed record"),
    _a("wait.release", _C.WAIT_RECORDS, "only the claimant releases a claim, back to waiting"),
    _a("wait.cancel", _C.WAIT_RECORDS, "cancel moves waiting/claimed to cancelled, else False"),
    _a(
        "wait.cancel-workflow",
        _C.WAIT_RECORDS,
        "cancel_workflow cancels the stack's waits and checkpoint",
    ),
    _a("wait.retention", _C.WAIT_RECORDS, "a record past its retention is gone"),
    _a(
        "wait.create",
        _C.WAIT_RECORDS,
        "create stores a record as given only where its key has none, atomically",
    ),
    _a(
        "wait.namespace.isolation",
        _C.WAIT_RECORDS,
        "wait records of one namespace are never seen or changed from another",
    ),
    _a("cache.roundtrip", _C.STEP_CACHE, "a cached value reads back equal; a re-set replaces it"),
    _a("cache.falsy-hit", _C.STEP_CACHE, "a cached None/0/False/''/[]/{} is a hit"),
    _a("cache.miss", _C.STEP_CACHE, "a key never set is MISSING"),
    _a("cache.expiry", _C.STEP_CACHE, "a value past its TTL is MISSING"),
    _a(
        "cache.namespaced",
        _C.STEP_CACHE,
        "a key cached in one namespace is a miss in another and without a namespace",
    ),
    _a(
        "cache.with-checkpoint",
        _C.STEP_CACHE,
        "a caching save stores its entry as set_cached_step, whatever its compare-and-set",
    ),
    _a(
        "context.stream",
        _C.CONTEXT_STREAM,
        "context changes read back as the latest value per field",
    ),
    _a(
        "context.streamed-save",
        _C.CONTEXT_STREAM,
        "save_checkpoint_streamed records the changes, then saves; refused saves keep them",
    ),
    _a("cache-events.accepted", _C.CACHE_EVENTS, "cache events are accepted and change nothing"),
    # After the context stream's rules: an unlocking save is a streamed save, so a broken
    # streamed save must be blamed on context.streamed-save, the rule it breaks first.
    _a(
        "lock.workflow.exclusive",
        _C.WORKFLOW_LOCK,
        "workflow-lock actions for one stack never overlap",
    ),
    _a(
        "lock.workflow.release-on-error",
        _C.WORKFLOW_LOCK,
        "an action's exception propagates and frees the lock",
    ),
    _a(
        "lock.workflow.separate",
        _C.WORKFLOW_LOCK,
        "the workflow lock and the public lock never share keys",
    ),
    _a(
        "lock.workflow.namespaced",
        _C.WORKFLOW_LOCK,
        "runs of one stack id in different namespaces never wait for each other's lock",
    ),
    _a(
        "lock.workflow.unlocking-save",
        _C.WORKFLOW_LOCK,
        "an action's unlocking save is a save; the lock is free after the action, not before it",
    ),
    _a("idempotency.claim.once", _C.IDEMPOTENCY, "exactly one claim of a key returns 'claimed'"),
    _a("idempotency.complete", _C.IDEMPOTENCY, "a completed key returns its result, None included"),
    _a("idempotency.fail", _C.IDEMPOTENCY, "fail frees an in-progress key, never a completed one"),
    _a("idempotency.expiry", _C.IDEMPOTENCY, "a key past its TTL is gone"),
    _a(
        "idempotency.owner",
        _C.IDEMPOTENCY,
        "only the owner token of an owned claim completes or fails it",
    ),
    _a(
        "idempotency.lease",
        _C.IDEMPOTENCY,
        "a claim lasts its lease, shorter than a result's retention; then one new owner",
    ),
    _a(
        "idempotency.fingerprint",
        _C.IDEMPOTENCY,
        "a key claimed again with another fingerprint is refused",
    ),
    _a(
        "lock.acquire.exclusive",
        _C.LOCKS,
        "a held lock cannot be acquired; one of N concurrent wins",
    ),
    _a("lock.release.token", _C.LOCKS, "only the holder's token releases"),
    _a("lock.extend.token", _C.LOCKS, "only the holder's token extends"),
    _a("lock.expiry", _C.LOCKS, "a lock past its TTL can be acquired"),
    _a("lock.fencing", _C.LOCKS, "fencing tokens strictly increase per key"),
    _a("lock.token", _C.LOCKS, "tokens are the custom token or lock_<ms>_<32 hex>, unique"),
    _a(
        "lock.inspect",
        _C.LOCKS,
        "inspect reads the holder's label, lease left and fencing token; None when free",
    ),
    _a("lock.with-lock", _C.LOCKS, "with_lock runs under the lock and releases it, or refuses"),
    _a(
        "lock.with-lock.wait",
        _C.LOCKS,
        "with_lock(wait_ms=W) waits up to W ms for a held lock, then runs fn or refuses",
    ),
    _a("nonce.claim.once", _C.NONCES, "the first claim of a nonce in its window wins"),
    _a("nonce.expiry", _C.NONCES, "a nonce can be claimed again after its window"),
    _a(
        "list.walk",
        _C.LISTING,
        "a walk returns each live checkpoint once, pages of at most limit",
    ),
    _a("list.filters", _C.LISTING, "namespace, status, workflow id and time filters hold"),
    _a("list.hidden", _C.LISTING, "an expired or deleted checkpoint is never listed"),
    _a(
        "list.concurrent",
        _C.LISTING,
        "a walk under concurrent writes never returns a stack twice",
    ),
    _a(
        "list.by-index",
        _C.LISTING,
        "a walk by blind-index tokens lists exactly the live stacks holding them now",
    ),
    _a(
        "delete.stack",
        _C.DELETION,
        "delete removes the checkpoint, wait records, context streams",
    ),
    _a("delete.cas", _C.DELETION, "a delete with a wrong expected_revision changes nothing"),
    _a(
        "delete.rerun",
        _C.DELETION,
        "a delete never removes what a run re-created under the same id stored",
    ),
    _a("waits.due", _C.DUE_WAITS, "due waits: deadline passed, unheld, oldest first"),
    _a(
        "payload.scan",
        _C.PAYLOAD_SCAN,
        "scan_payloads lists every live wait record and cached step with its payloads",
    ),
    _a(
        "payload.swap",
        _C.PAYLOAD_SCAN,
        "swap_payload rewrites payloads only if the record still holds what was listed",
    ),
    _a(
        "payload.delete",
        _C.PAYLOAD_SCAN,
        "delete_payload removes a record only if it still holds what was listed",
    ),
    _a(
        "payload.context",
        _C.PAYLOAD_SCAN,
        "context-change stream values are listed and rewritten by compare-and-set, or refused",
    ),
    _a(
        "payload.results",
        _C.PAYLOAD_SCAN,
        "the idempotency store lists completed results and rewrites them by compare-and-set",
    ),
    _a("input.rejected", None, "bad input raises InvalidArgumentError, nothing changes"),
    _a("ids.hostile", None, "ids of any characters but NUL are data"),
    _a("capability.declared", None, "every method of a declared capability is implemented"),
    _a(
        "backend.closed",
        None,
        "after aclose() every call raises StorageAdapterError, stores nothing",
    ),
    _a(
        "manager.redaction.stored",
        _C.CHECKPOINTS,
        "a manager with redact_fields sends the backend no redacted value",
    ),
    _a(
        "manager.conflict.stored",
        _C.CHECKPOINTS,
        "a lost CAS through a manager raises in every error mode",
    ),
    _a(
        "manager.restore.stored",
        _C.CHECKPOINTS,
        "a stored checkpoint restores with its own namespace expected only",
    ),
    _a(
        "manager.error-mode.stored",
        _C.CHECKPOINTS,
        "a failing backend's errors follow the manager's error mode",
    ),
    _core("manager.snapshot", "checkpoint() returns an immutable snapshot"),
    _core(
        "manager.redaction",
        "redact_fields redacts at any depth in snapshots, the stream and event payloads",
    ),
    _core("pipeline.encryption", "every path stores payloads sealed; moved ciphertext fails"),
    _core("manager.background.order", "background saves reach the adapter in order"),
    _core("manager.conflict.always", "conflicts are raised in every error mode"),
    _core("manager.error-mode", "adapter failures follow the error mode"),
    _core("manager.error-mode.default", "strict by default over a durable backend"),
    _core("manager.restore.namespace", "restore refuses a namespace mismatch"),
    _core("manager.context-stream", "context mutations are streamed in order"),
    _core("manager.status", "status transitions follow the lifecycle"),
    _core("wire.checkpoint", "checkpoint JSON is seed 000 §1, camelCase"),
    _core("wire.version", "version above 2 raises CheckpointVersionError"),
    _core("wire.malformed", "malformed documents raise MalformedRecordError"),
    _core("plugins.discovery", "backends come from the siglo entry-point group"),
    _core("plugins.broken", "a broken plugin is reported and others load"),
    _core("plugins.blocked", "SIGLO_DISABLE_PLUGINS blocks a plugin"),
    _core("plugins.driver-missing", "a missing driver says which extra to install"),
    _core("plugins.capabilities-agree", "registered capabilities match the backend's"),
    _core("plugins.url-options", "an unknown URL option is refused at once, naming it"),
    _core("blobs.offload", "large values go to the blob store and read back"),
    _core("blobs.collect", "the collector leaves no orphan blob and no dangling reference"),
    _core("blobs.bounded", "blob store calls are bounded by the backend's command_timeout_ms"),
)
"""The rules as written, before their versions are filled in."""

_SINCE: Final[dict[str, str]] = {
    # Added after the first published page (contract 1.0, 30 November 2026).
    **dict.fromkeys(
        (
            "wait.namespace.isolation",
            "context.streamed-save",
            "lock.workflow.unlocking-save",
            "idempotency.owner",
            "idempotency.lease",
            "idempotency.fingerprint",
            "backend.closed",
            "manager.redaction.stored",
            "manager.conflict.stored",
            "manager.restore.stored",
            "manager.error-mode.stored",
        ),
        "1.1",
    ),
    # Issues 31, 33 and 34: the namespaced workflow lock, waits written as imported,
    # deletes that spare a re-run, a bounded with_lock, encoded payloads, the size guard,
    # incremental saves, URL options, offloaded values.
    **dict.fromkeys(
        (
            "payload.byte-faithful",
            "checkpoint.size.guard",
            "checkpoint.incremental",
            "wait.create",
            "lock.workflow.namespaced",
            "lock.with-lock.wait",
            "delete.rerun",
            "pipeline.encryption",
            "plugins.url-options",
            "blobs.offload",
            "blobs.collect",
        ),
        "1.3",
    ),
    # Issue 34's follow-up: the blob store under the one configuration.
    "blobs.bounded": "1.4",
    # Issue 33, part A: the blind index answered by the backend.
    **dict.fromkeys(("list.by-index",), "1.4"),
    # Issue 33, part B: cached steps belong to their namespace (erased with its key);
    # stand-alone wait records and cached steps listed and rewritten by siglo rekey.
    **dict.fromkeys(
        (
            "cache.namespaced",
            "payload.scan",
            "payload.swap",
            "payload.delete",
            "payload.results",
        ),
        "1.4",
    ),
    # Issue 35: who holds a lock, read without taking it (siglo ui's run page).
    "lock.inspect": "1.4",
    # Issue 36: a step's checkpoint, context changes and cache entry in one write.
    "cache.with-checkpoint": "1.5",
    # siglo rekey's walk of the context-change streams (payload_kinds "context").
    "payload.context": "1.6",
    # The retention the backend's options set (a plugin author's backend that kept
    # everything forever passed every check before).
    "checkpoint.retention": "1.6",
}
_CHANGED: Final[dict[str, str]] = dict.fromkeys(
    (
        # Issue 37: what these rules always meant, now said and checked.
        "list.walk",
        "delete.stack",
        "delete.cas",
        "waits.due",
        "wait.release",
        "lock.extend.token",
        "lock.release.token",
        "list.hidden",
        "lock.workflow.unlocking-save",
        "ids.hostile",
        "backend.closed",
    ),
    "1.2",
)
# The size guard's check covers every save path (issue 34's guard, the caching save of
# 1.5): the unlocking and the caching save write nothing of a refused document either.
_CHANGED["checkpoint.size.guard"] = "1.6"
# Black-box plugin authors' findings: a backend siglo.connect refuses was certified, and
# a retention counted from the checkpoint's timestamp passed.
_CHANGED["capability.declared"] = "1.7"
_CHANGED["checkpoint.retention"] = "1.7"
RULES: Final[tuple[Rule, ...]] = tuple(
    Rule(r.id, r.capability, r.kind, r.summary, _SINCE.get(r.id, "1.0"), _CHANGED.get(r.id))
    for r in _WRITTEN
)
"""Every rule on ``docs/contract.md``, in page order, with the contract version that
introduced it and the one that last changed it (:mod:`siglo_contract.version`)."""

ADAPTER_RULES: Final = tuple(r for r in RULES if r.kind == "adapter")
"""The rules the contract suite checks against a backend."""
CORE_RULES: Final = tuple(r for r in RULES if r.kind == "core")
"""The rules siglo's own tests check (storage manager, wire format, plugins)."""

_BY_ID: Final = {r.id: r for r in RULES}


_FIRST: Final = ("capability.declared",)
"""Rules that come before page order when naming the primary failure: a method that is
not implemented breaks every rule that calls it."""


_LAST: Final = ("cache.with-checkpoint", "payload.byte-faithful")
"""Rules that come after page order when naming the primary failure: they read back
every kind of record at once, so a broken round trip of any one kind (a wait record that
loses its metadata) fails them too, and the kind's own rule is the one broken. A caching
save is a streamed save (and, with ``unlock``, an unlocking one) with a cache entry: a
broken streamed or unlocking save is blamed on its own rule."""


def primary_order() -> dict[str, int]:
    """Rule id → rank for naming a report's primary failure among equally evidenced ones:
    :data:`_FIRST`, then page order, which goes from basic to derived rules in each area
    (a broken round trip explains a broken lookup, not the other way round), then
    :data:`_LAST`."""
    middle = (r.id for r in RULES if r.id not in _FIRST and r.id not in _LAST)
    ids = [*_FIRST, *middle, *_LAST]
    return {rule_id: i for i, rule_id in enumerate(ids)}


def rule(rule_id: str) -> Rule:
    """The rule with this id (``KeyError`` naming it if there is none)."""
    try:
        return _BY_ID[rule_id]
    except KeyError:
        raise KeyError(f"no rule {rule_id!r} on docs/contract.md") from None


def select_rules(patterns: Iterable[str] | None = None) -> tuple[Rule, ...]:
    """Adapter rules whose id matches any glob ``pattern`` (``checkpoint.*``); all if none.

    A pattern without glob characters also matches as a prefix (``wait`` → ``wait.*``).
    """
    pats = [p for p in (patterns or ()) if p]
    if not pats:
        return ADAPTER_RULES

    def matches(rule_id: str, pattern: str) -> bool:
        if any(ch in pattern for ch in "*?["):
            return fnmatch.fnmatchcase(rule_id, pattern)
        return rule_id == pattern or rule_id.startswith(pattern + ".")

    return tuple(r for r in ADAPTER_RULES if any(matches(r.id, p) for p in pats))
