"""The Redis key topology of seed 001 §5, in one place.

Every key starts with one prefix (``siglo:`` by default; ``prefix=`` replaces it, which
is how tests isolate). With the default prefix the names are exactly the seed's:

=============================================  =====================================
key                                            holds
=============================================  =====================================
``siglo:checkpoint:<stackId>``                 checkpoint JSON (no namespace)
``siglo:<ns>:checkpoint:<stackId>``            checkpoint JSON (namespace ``ns``)
``siglo:[<ns>:]wait:<correlationKey>``         wait record JSON (``ns``: the namespace
                                               of its stack, if it has one)
``siglo:[<ns>:]wait:<stackId>``                copy of the stack's latest wait record
``siglo:[<ns>:]wait-index:<stackId>``          siglo only: sorted set of the stack's
                                               correlation keys, latest saved last
``siglo:cache:<key>``                          step-cache JSON
``siglo:[<ns>:]context:<stackId>:<stepId>``    hash: context field → JSON value
``siglo:[<ns>:]checkpoint-parts:{<tag>}<id>``  siglo only (``incremental_min_bytes``):
                                               hash of a checkpoint's context bodies by
                                               digest and their order, in its slot
``siglo:[<ns>:]checkpoint-token:{[<tag>]}``   siglo only (blind-index tokens in the
``<field>:<token>``                            metadata): sorted set of the stacks
                                               saved with that token (on a cluster one
                                               per slot, tagged to it)
``siglo:checkpoint-index[:{<tag>}]``          siglo only: sorted set listing the
                                               checkpoints (one per cluster slot on a
                                               cluster, tagged to that slot)
``siglo:checkpoint-shards``                    siglo only (cluster): the slots that
                                               have a listing index
``siglo:wait-deadlines``                       siglo only: sorted set of correlation
                                               keys by deadline (due waits)
``siglo:lock:<key>``                           lock token
``siglo:lock-fence:{<tag>}``                   siglo only: fencing counter of the
                                               locks of one cluster slot
``siglo:workflow-lock:<stackId>``              siglo only: ``with_workflow_lock``'s token
``siglo:workflow-lock-fence:{<tag>}``          siglo only: its fencing counters
``siglo:idempotency:<key>``                    ``in-progress`` / ``COMPLETED:<json>``
``siglo:idempotency-owner:{<tag>}<key>``       siglo only: ``<owner token>:<fingerprint
                                               digest>`` of that key, in its slot
``siglo:wh:dedup:<key>``                       nonce ``"1"``
=============================================  =====================================

Ids are data, so two different ids must never make the same key. The seed's names are
ambiguous in two places, and only there siglo escapes (``%`` → ``%25``, ``:`` → ``%3A``):
a namespace that contains ``:`` or ``%`` or is one of the words above (``wait``,
``cache`` …; its first character is escaped too), and the stack id of a context key when
it contains ``:`` or ``%``. Every other id is used verbatim, so the usual ids give
exactly the seed's key names.
"""

from __future__ import annotations

import re
import threading
from binascii import crc_hqx
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from siglo.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_PREFIX",
    "RESERVED_NAMESPACES",
    "KeySpace",
    "check_prefix",
    "escape",
    "fence_key",
    "hash_slot",
    "legacy_fence_key",
    "namespace_segment",
    "slot_tag",
]

DEFAULT_PREFIX: Final = "siglo:"
CLUSTER_SLOTS: Final = 16_384

RESERVED_NAMESPACES: Final = frozenset(
    {
        "checkpoint",
        "wait",
        "wait-index",
        "cache",
        "context",
        "lock",
        "lock-fence",
        "workflow-lock",
        "workflow-lock-fence",
        "idempotency",
        "wh",
    }
)
"""Namespaces that would read as one of siglo's own key kinds; they are escaped."""


def escape(segment: str) -> str:
    """Percent-escape ``%`` and ``:`` so a segment cannot swallow a separator."""
    return segment.replace("%", "%25").replace(":", "%3A")


def namespace_segment(namespace: str) -> str:
    """The namespace as it appears in a key: verbatim unless that would be ambiguous."""
    if ":" not in namespace and "%" not in namespace and namespace not in RESERVED_NAMESPACES:
        return namespace
    escaped = escape(namespace)
    if namespace in RESERVED_NAMESPACES:
        # An escaped form always contains "%", a verbatim one never does: injective.
        escaped = f"%{ord(escaped[0]):02X}{escaped[1:]}"
    return escaped


_ESCAPED: Final = re.compile("%([0-9A-F]{2})")


def _unescape(segment: str) -> str:
    """The id a key segment was made of: every ``%XX`` back to its character (the escape
    writes ``%`` itself as ``%25``, so no ``%XX`` is ever literal)."""
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), segment)


def _context_stack_segment(stack_id: str) -> str:
    return stack_id if ":" not in stack_id and "%" not in stack_id else escape(stack_id)


def check_prefix(name: str, prefix: object) -> str:
    """A key prefix must be a non-empty string without a partial cluster hash tag."""
    if type(prefix) is not str or not prefix:
        raise InvalidArgumentError(f"{name} must be a non-empty string, got {prefix!r}")
    if "\x00" in prefix:
        raise InvalidArgumentError(f"{name} must not contain a NUL character")
    if ("{" in prefix or "}" in prefix) and _hash_tag(prefix.encode()) is None:
        raise InvalidArgumentError(
            f"{name} {prefix!r} has a brace but no complete {{hash tag}}; "
            "it would scatter related keys over cluster slots"
        )
    return prefix


def _hash_tag(key: bytes) -> bytes | None:
    start = key.find(b"{")
    if start > -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return None


def hash_slot(key: str | bytes) -> int:
    """The Redis Cluster slot of ``key`` (CRC16 of its hash tag, or of the whole key)."""
    data = key.encode() if isinstance(key, str) else key
    tag = _hash_tag(data)
    return crc_hqx(data if tag is None else tag, 0) % CLUSTER_SLOTS


class _SlotTags:
    """The first hex number (``0``, ``1`` … ``ff`` …) hashing to each slot, found lazily.

    One scan goes forward through the numbers and remembers every slot it passes, so a
    few lock keys cost a few milliseconds and all 16,384 slots at most one full scan
    (~160,000 CRCs). The answer never depends on the order of questions: every process
    derives the same key names.
    """

    def __init__(self) -> None:
        self._tags: dict[int, str] = {}
        self._next = 0
        self._lock = threading.Lock()

    def __call__(self, slot: int) -> str:
        tag = self._tags.get(slot)
        if tag is not None:
            return tag
        if not 0 <= slot < CLUSTER_SLOTS:
            raise ValueError(f"no cluster slot {slot}")
        with self._lock:
            n, tags = self._next, self._tags
            while slot not in tags:
                candidate = b"%x" % n
                tags.setdefault(crc_hqx(candidate, 0) & (CLUSTER_SLOTS - 1), candidate.decode())
                n += 1
            self._next = n
            return tags[slot]


slot_tag: Final = _SlotTags()
"""``slot_tag(slot)``: a short tag whose ``{tag}`` pins a key to ``slot``."""


def fence_key(fence_prefix: str, full_lock_key: str) -> str:
    """The fencing counter of a lock: one counter per cluster slot, in the lock key's slot.

    Every lock key of a slot shares it, so a key's fencing tokens still only grow while
    the counters number at most 16,384 per prefix, however many lock keys come and go
    (a counter per lock key would stay forever). The seed's lock key ``siglo:lock:<key>``
    has no hash tag, so the counter carries a tag computed to hash to the lock key's
    slot: the acquire script may touch both.
    """
    return f"{fence_prefix}{{{slot_tag(hash_slot(full_lock_key))}}}"


def legacy_fence_key(fence_prefix: str, lock_key: str, full_lock_key: str) -> str:
    """Where siglo before the per-slot counters kept one counter per lock key.

    The acquire script folds such a counter into its slot's counter and deletes it, so a
    key's fencing tokens keep growing across the upgrade.
    """
    return f"{fence_key(fence_prefix, full_lock_key)}{lock_key}"


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Key names of the storage adapter under one prefix (default ``siglo:``)."""

    prefix: str = DEFAULT_PREFIX

    def checkpoint(self, stack_id: str, namespace: str | None = None) -> str:
        if namespace is None:
            return f"{self.prefix}checkpoint:{stack_id}"
        return f"{self.prefix}{namespace_segment(namespace)}:checkpoint:{stack_id}"

    def checkpoint_parts(self, stack_id: str, namespace: str | None = None) -> str | None:
        """The parts hash of a checkpoint saved incrementally (``incremental_min_bytes``):
        ``<prefix>[<ns>:]checkpoint-parts:{<tag>}<stackId>``, the tag pinning it to the
        checkpoint key's cluster slot so one script writes both. The tag is a function of
        the checkpoint key and the stack id follows it, so distinct checkpoints have
        distinct hashes.

        ``None`` when braces in the namespace make an earlier hash tag of that key than
        ``{<tag>}``, in another slot than the checkpoint's: that stack is always stored
        whole (nothing reads or writes a parts hash for it)."""
        return _checkpoint_parts(self, stack_id, namespace)

    def checkpoint_parts_of(self, key: str) -> tuple[str, str | None] | None:
        """``(stack id, namespace)`` of the checkpoint whose parts hash is named ``key``,
        or ``None`` for a key that is not a parts hash's name (``siglo clean`` finds them
        by key pattern, which other keys whose ids hold ``checkpoint-parts:`` match too).

        After the prefix comes ``checkpoint-parts:{`` or a namespace segment (which holds
        no ``:``, escaped) and ``:checkpoint-parts:{``; the stack id follows the tag's
        ``}``. A key is taken only if it is exactly the one :meth:`checkpoint_parts` makes
        of what it read, so a key of another kind never passes for a parts hash."""
        if not key.startswith(self.prefix):
            return None
        rest = key[len(self.prefix) :]
        marker = "checkpoint-parts:{"
        candidates: list[tuple[str | None, str]] = []
        if rest.startswith(marker):
            candidates.append((None, rest[len(marker) :]))
        segment, colon, after = rest.partition(":")
        if colon and after.startswith(marker):
            candidates.append((_unescape(segment), after[len(marker) :]))
        for namespace, tagged in candidates:
            stack_id = tagged.partition("}")[2]
            if stack_id and self.checkpoint_parts(stack_id, namespace) == key:
                return stack_id, namespace
        return None

    def checkpoint_token(
        self, namespace: str | None, field: str, token: str, shard: int | None
    ) -> str | None:
        """The blind-index set of ``field: token`` in ``namespace``:
        ``<prefix>[<ns>:]checkpoint-token:{}<field>:<token>``, or on a cluster one per
        slot, ``{<tag>}`` pinning it to ``shard`` (the slot of the checkpoint keys it
        lists). The brace after ``checkpoint-token:`` keeps the names apart from the keys
        of a namespace spelled ``checkpoint-token`` (theirs go on with a key kind);
        ``field`` and ``token`` are escaped, so one ``:`` separates them.

        ``None`` when braces in the namespace or prefix make an earlier hash tag, in
        another slot than ``shard``: that set cannot be written with the checkpoint."""
        ns = "" if namespace is None else f"{namespace_segment(namespace)}:"
        tag = "" if shard is None else slot_tag(shard)
        key = f"{self.prefix}{ns}checkpoint-token:{{{tag}}}{escape(field)}:{escape(token)}"
        return key if shard is None or hash_slot(key) == shard else None

    def wait(self, key: str, namespace: str | None = None) -> str:
        """A wait record (or the seed's per-stack copy): the seed's key for an
        un-namespaced stack, ``<ns>:wait:<key>`` for a namespaced one."""
        if namespace is None:
            return f"{self.prefix}wait:{key}"
        return f"{self.prefix}{namespace_segment(namespace)}:wait:{key}"

    def checkpoint_index(self, slot: int | None) -> str:
        """The listing index: one key, or on a cluster one per slot, in that slot."""
        if slot is None:
            return f"{self.prefix}checkpoint-index"
        return f"{self.prefix}checkpoint-index:{{{slot_tag(slot)}}}"

    @property
    def checkpoint_shards(self) -> str:
        return f"{self.prefix}checkpoint-shards"

    @property
    def wait_deadlines(self) -> str:
        return f"{self.prefix}wait-deadlines"

    def wait_index(self, stack_id: str, namespace: str | None = None) -> str:
        if namespace is None:
            return f"{self.prefix}wait-index:{stack_id}"
        return f"{self.prefix}{namespace_segment(namespace)}:wait-index:{stack_id}"

    def cache(self, key: str) -> str:
        return f"{self.prefix}cache:{key}"

    def context(self, stack_id: str, step_id: str, namespace: str | None = None) -> str:
        ns = "" if namespace is None else f"{namespace_segment(namespace)}:"
        return f"{self.prefix}{ns}context:{_context_stack_segment(stack_id)}:{step_id}"

    def context_of(self, key: str) -> tuple[str | None, str, str] | None:
        """``(namespace, stack id, step id)`` of a context hash's key, or ``None`` for a
        key that is not one (``siglo rekey`` walks the streams by key pattern, which also
        matches other keys whose ids hold ``context:``).

        The namespace and the stack id are the segments before and after ``context:``,
        neither holding a ``:`` (escaped); the step id is the rest. A key is taken only if
        it is exactly the one :meth:`context` makes of what it read, so a key of another
        kind never passes for a stream."""
        if not key.startswith(self.prefix):
            return None
        rest = key[len(self.prefix) :]
        namespace: str | None = None
        if not rest.startswith("context:"):
            segment, _, rest = rest.partition(":")
            namespace = _unescape(segment)
            if not rest.startswith("context:"):
                return None
        stack, colon, step = rest[len("context:") :].partition(":")
        if not colon:
            return None
        found = (namespace, _unescape(stack), step)
        return found if self.context(found[1], step, namespace) == key else None

    @property
    def lock_prefix(self) -> str:
        return f"{self.prefix}lock:"

    @property
    def workflow_lock_prefix(self) -> str:
        """Where ``with_workflow_lock`` keeps its leases: never a public lock's key."""
        return f"{self.prefix}workflow-lock:"

    @property
    def idempotency_prefix(self) -> str:
        return f"{self.prefix}idempotency:"

    @property
    def nonce_prefix(self) -> str:
        return f"{self.prefix}wh:dedup:"


@lru_cache(maxsize=4096)
def _checkpoint_parts(keys: KeySpace, stack_id: str, namespace: str | None) -> str | None:
    """:meth:`KeySpace.checkpoint_parts`, remembered for the checkpoints used lately:
    every read and every whole save names it (a whole save to delete the hash another
    writer may have left), and two CRC16s of the names took ~1.5-3 µs a call, where a
    1 KB save takes ~150 µs."""
    ns = "" if namespace is None else f"{namespace_segment(namespace)}:"
    slot = hash_slot(keys.checkpoint(stack_id, namespace))
    parts = f"{keys.prefix}{ns}checkpoint-parts:{{{slot_tag(slot)}}}{stack_id}"
    return parts if hash_slot(parts) == slot else None


def idempotency_owner_key(owner_prefix: str, full_key: str, key: str) -> str:
    """The sibling of an idempotency key holding its owner token and fingerprint digest.

    The seed's key has no hash tag, so the sibling carries a tag hashing to the key's
    cluster slot (a prefix with its own tag pins both anyway): one script touches both.
    The tag is a function of the key, so distinct keys have distinct siblings.
    """
    return f"{owner_prefix}{{{slot_tag(hash_slot(full_key))}}}{key}"


def default_owner_prefix(idempotency_prefix: str) -> str:
    """``siglo:idempotency:`` → ``siglo:idempotency-owner:``: beside the keys, never one."""
    base = idempotency_prefix[:-1] if idempotency_prefix.endswith(":") else idempotency_prefix
    return f"{base}-owner:"


def default_fence_prefix(lock_prefix: str) -> str:
    """``siglo:lock:`` → ``siglo:lock-fence:``: beside the locks, never one of them."""
    base = lock_prefix[:-1] if lock_prefix.endswith(":") else lock_prefix
    return f"{base}-fence:"
