"""Listing checkpoints and finding due waits on Redis (SPEC §9).

**The listing index.** Every checkpoint save adds the checkpoint's member
(``<namespace>\\0<stackId>``, ``\\0<stackId>`` without a namespace) to a sorted set with
score 0, inside the same compare-and-set script that writes the checkpoint, so the two
never disagree; a delete removes both in one script. On a Redis Cluster a script may only
touch keys of one slot, so there the index is one sorted set per slot, tagged to it
(``siglo:checkpoint-index:{<tag>}``), and ``siglo:checkpoint-shards`` records which slots
have one (written before the first save into a slot). A walk goes through the shards in
slot order and through each shard in member order (``ZRANGEBYLEX``); the cursor is the
last (shard, member) returned, so a stack is never returned twice in one walk. Members
are ids, compared bytewise: a namespace's stacks are one contiguous range.

Redis expires checkpoint keys itself, so an index member may outlive its checkpoint: a
walk drops it, with a script that removes it only if the key is still gone (a save
racing the walk keeps its member).

**Cost.** A save does one ``ZADD`` in its script (O(log N)). A page reads
``ZRANGEBYLEX`` chunks and ``MGET``\\s the documents (one slot per shard, so ``MGET`` is
cluster-safe), decoding each to apply the filters: a filtered walk reads every
checkpoint of the namespace (or of the store), as the SQL backends scan their index.

**Due waits.** ``siglo:wait-deadlines`` holds each wait with a deadline, scored by it,
added before the record is written. ``list_due_waits`` reads the earliest entries and
each record; an entry whose record is gone, finished, or has another deadline now is
dropped (only if its score is still the one read).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from siglo.blind import stored_tokens
from siglo.checkpoint import Checkpoint
from siglo.errors import InvalidArgumentError, MalformedRecordError, naming_stack
from siglo.listing import CheckpointPage, CheckpointSummary, ListQuery, decode_cursor, encode_cursor
from siglo.records import WaitRecord
from siglo.sentinel import MISSING
from siglo.unreadable import UNREADABLE, report_unreadable
from siglo_redis.commands import Commands, raw, text
from siglo_redis.keys import KeySpace, hash_slot, namespace_segment
from siglo_redis.scripts import DEADLINE_PRUNE, INDEX_PRUNE, TOKEN_PRUNE

__all__ = [
    "CheckpointIndex",
    "deadline_member",
    "deadline_member_parts",
    "member_of",
    "split_member",
]

_CHUNK = 2_000
"""The most members read per ``ZRANGEBYLEX`` while a page fills."""


def _status_patterns(query: ListQuery) -> tuple[bytes, ...]:
    """Byte strings one of which a document of a wanted status must contain (its status
    as a JSON string, however the writer spaced its keys); ``()``: no status filter."""
    if query.statuses is None:
        return ()
    return tuple(b'"' + status.encode() + b'"' for status in sorted(query.statuses))


def _holds(checkpoint: Checkpoint, tokens: dict[str, str]) -> bool:
    have = stored_tokens(checkpoint.metadata)
    return all(have.get(field) == token for field, token in tokens.items())


def member_of(stack_id: str, namespace: str | None) -> str:
    """A checkpoint's member in the listing index."""
    return f"{namespace or ''}\x00{stack_id}"


def split_member(member: str) -> tuple[str | None, str]:
    """``(namespace, stack id)`` of a member."""
    namespace, _, stack_id = member.partition("\x00")
    return namespace or None, stack_id


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (keys of a script must share a slot)."""
    return callable(getattr(client, "get_node_from_key", None))


async def scan_keys(redis: Commands, client: Any, pattern: str) -> AsyncIterator[str]:
    """Every key matching ``pattern`` (``SCAN``; on a cluster, every primary's), each
    call bounded like any other (``siglo rekey``'s walks)."""
    if is_cluster(client):
        keys = client.scan_iter(match=pattern, count=1000)
        while True:
            # The end comes back as None, not as StopAsyncIteration: the call's error
            # handling would turn that into a storage failure (a cluster's walks failed).
            key = await redis.call("SCAN", anext(keys, None))
            if key is None:
                return
            yield key.decode() if isinstance(key, bytes) else str(key)
    cursor: Any = 0
    while True:
        cursor, page = await redis.call("SCAN", client.scan(cursor, match=pattern, count=1000))
        for key in page:
            yield key.decode() if isinstance(key, bytes) else str(key)
        if int(cursor) == 0:
            return


class CheckpointIndex:
    """The listing index and the due-wait index of one adapter."""

    def __init__(self, redis: Commands, client: Any, keys: KeySpace) -> None:
        self._redis = redis
        self._client = client
        self._keys = keys
        self.cluster = is_cluster(client)
        self._registered: set[int] = set()

    def shard_of(self, checkpoint_key: str) -> int | None:
        """The shard a checkpoint's member lives in (``None``: the one index)."""
        return hash_slot(checkpoint_key) if self.cluster else None

    def key(self, shard: int | None) -> str:
        return self._keys.checkpoint_index(shard)

    async def register(self, shard: int | None) -> None:
        """Before a save into ``shard``: make sure walks know the shard (cluster only)."""
        if shard is None or shard in self._registered:
            return
        await self._redis.call(
            "ZADD", self._client.zadd(self._keys.checkpoint_shards, {str(shard): shard})
        )
        self._registered.add(shard)

    async def _shards(self) -> list[int] | list[None]:
        if not self.cluster:
            return [None]
        found = await self._redis.call(
            "ZRANGE", self._client.zrange(self._keys.checkpoint_shards, 0, -1)
        )
        return [*sorted(int(text(m) or 0) for m in found or ())]

    async def page(
        self, query: ListQuery, now: int, tokens: dict[str, str] | None = None
    ) -> CheckpointPage:
        """A page of the walk ``query`` describes; with ``tokens`` (a namespace's), of
        the stacks whose stored blind-index tokens hold them, walking the sets of the
        first field's token instead of the listing index."""
        start_shard, after = -1, None
        if query.cursor is not None:
            shard_text, after = decode_cursor(query.cursor, 2)
            try:
                start_shard = int(shard_text)
            except ValueError:
                raise InvalidArgumentError(f"cursor {query.cursor!r} is not Redis's") from None
        prefix = None if query.namespace is MISSING else f"{query.namespace or ''}\x00"
        high = "+" if prefix is None else "(" + prefix[:-1] + "\x01"
        found: list[tuple[int, str, CheckpointSummary]] = []
        for shard in await self._shards():
            number = -1 if shard is None else shard
            if number < start_shard:
                continue
            if number == start_shard and after is not None:
                low = "(" + after
            else:
                low = "-" if prefix is None else "[" + prefix
            index = self.key(shard) if tokens is None else self.token_key(query, tokens, shard)
            if index is None:
                continue  # no stack of this shard can be in the set (token_key)
            low = await self._fill(index, number, low, high, query, now, found, tokens)
            if len(found) > query.limit:
                break
        items = found[: query.limit]
        if len(found) <= query.limit:
            return CheckpointPage([s for _, _, s in items], None)
        number, member, _ = items[-1]
        return CheckpointPage([s for _, _, s in items], encode_cursor(str(number), member))

    def token_key(self, query: ListQuery, tokens: dict[str, str], shard: int | None) -> str | None:
        """The set a walk by ``tokens`` follows in ``shard``: the first field's."""
        assert query.namespace is not MISSING
        field = min(tokens)
        return self._keys.checkpoint_token(query.namespace, field, tokens[field], shard)

    def indexable(self, namespace: str | None) -> bool:
        """Whether every stack of ``namespace`` has its blind-index sets in its own slot
        (always, but on a cluster where braces in the namespace or prefix make a hash tag
        of their own: :meth:`KeySpace.checkpoint_token`)."""
        if not self.cluster:
            return True
        # The hash tag of both a checkpoint key and its sets: a whole {tag} in what they
        # share (prefix and namespace), else the sets' own {tag} of the checkpoint's slot.
        shared = self._keys.prefix + ("" if namespace is None else namespace_segment(namespace))
        opening = shared.find("{")
        return opening < 0 or shared.find("}", opening + 1) > opening + 1

    def token_keys_of(self, checkpoint: Checkpoint, checkpoint_key: str) -> list[str]:
        """The blind-index sets a save of ``checkpoint`` adds its member to."""
        tokens = stored_tokens(checkpoint.metadata)
        if not tokens or not self.indexable(checkpoint.namespace):
            return []
        shard = self.shard_of(checkpoint_key)
        keys = [
            self._keys.checkpoint_token(checkpoint.namespace, field, token, shard)
            for field, token in sorted(tokens.items())
        ]
        return [k for k in keys if k is not None]

    async def _fill(
        self,
        index: str,
        number: int,
        low: str,
        high: str,
        query: ListQuery,
        now: int,
        found: list[tuple[int, str, CheckpointSummary]],
        tokens: dict[str, str] | None = None,
    ) -> str:
        # The first read asks for just enough for the page; a filter that skips most
        # documents makes each next read twice as large.
        chunk = query.limit + 1
        wanted = _status_patterns(query)
        while len(found) <= query.limit:
            members = await self._redis.call(
                "ZRANGEBYLEX", self._client.zrangebylex(index, low, high, 0, chunk)
            )
            names = [text(m) or "" for m in members or ()]
            if not names:
                return low
            keys = [self._keys.checkpoint(sid, ns) for ns, sid in map(split_member, names)]
            docs = await self._redis.call("MGET", self._client.mget(keys))
            for member, key, doc in zip(names, keys, docs or (), strict=True):
                low = "(" + member
                data = raw(doc)
                if data is None:
                    await self._redis.script(INDEX_PRUNE, [key, index], [member])
                    continue
                if wanted and not any(pattern in data for pattern in wanted):
                    continue  # cannot have a wanted status: not worth decoding
                try:
                    checkpoint = Checkpoint.from_json(data)
                except MalformedRecordError as exc:
                    # Left out, as stored, and named to whoever lists (siglo.unreadable).
                    namespace, stack_id = split_member(member)
                    report_unreadable(naming_stack(exc, stack_id, namespace))
                    continue
                if tokens is not None and not _holds(checkpoint, tokens):
                    field = min(tokens)
                    if stored_tokens(checkpoint.metadata).get(field) != tokens[field]:
                        # Saved since with another value of the field this set is of (or
                        # by a writer that keeps no sets): the member goes, unless the
                        # document changed again meanwhile.
                        digest = hashlib.sha1(data).hexdigest()
                        await self._redis.script(TOKEN_PRUNE, [key, index], [member, digest])
                    continue
                if checkpoint.is_expired(now) or not query.matches(checkpoint):
                    continue
                found.append((number, member, CheckpointSummary.of(checkpoint)))
                if len(found) > query.limit:
                    return low
            if len(names) < chunk:
                return low
            chunk = min(chunk * 2, _CHUNK)
        return low

    async def sweep(self, read: Any) -> dict[str, int]:
        """Drop every listing-index member whose checkpoint Redis has expired, and every
        due-wait entry whose wait is gone or finished; the counts. (Walks and due-wait
        lookups drop those they meet; this reaches the rest, for a store nobody walks.)"""
        members = 0
        for shard in await self._shards():
            index = self.key(shard)
            low = "-"
            while True:
                found = await self._redis.call(
                    "ZRANGEBYLEX", self._client.zrangebylex(index, low, "+", 0, _CHUNK)
                )
                names = [text(m) or "" for m in found or ()]
                if not names:
                    break
                keys = [self._keys.checkpoint(sid, ns) for ns, sid in map(split_member, names)]
                docs = await self._redis.call("MGET", self._client.mget(keys))
                for member, key, doc in zip(names, keys, docs or (), strict=True):
                    if doc is None:
                        members += int(
                            await self._redis.script(INDEX_PRUNE, [key, index], [member]) or 0
                        )
                low = "(" + names[-1]
        deadlines = 0
        index = self._keys.wait_deadlines
        start = 0
        while True:
            entries = await self._redis.call(
                "ZRANGE", self._client.zrange(index, start, start + _CHUNK - 1, withscores=True)
            )
            if not entries:
                break
            pairs = [(text(m) or "", float(score)) for m, score in entries]
            records = await _read_each(read, [key for key, _ in pairs])
            kept = 0
            for (key, score), record in zip(pairs, records, strict=True):
                if isinstance(record, Exception):
                    kept += 1  # cannot be read: its entry stays, as the record does
                    continue
                pending = record is not None and record.status in ("waiting", "claimed")
                if record is not None and pending and record.expires_at == int(score):
                    kept += 1
                    continue
                deadlines += int(
                    await self._redis.script(DEADLINE_PRUNE, [index], [key, _score_text(score)])
                    or 0
                )
            start += kept
            if len(pairs) < _CHUNK:
                break
        return {"checkpoint_index": members, "wait_deadlines": deadlines}

    async def add_deadline(self, record: WaitRecord, *, keep_existing: bool = False) -> None:
        """Before a wait with a deadline is written: index it by its deadline.

        ``keep_existing``: leave the entry of a record already indexed under this key as
        it is (before a create that may find that record there and change nothing)."""
        if record.expires_at is None or record.status not in ("waiting", "claimed"):
            return
        await self._redis.call(
            "ZADD",
            self._client.zadd(
                self._keys.wait_deadlines,
                {deadline_member(record.namespace, record.correlation_key): record.expires_at},
                nx=keep_existing,
            ),
        )

    async def due(self, limit: int, now: int, read: Any) -> list[WaitRecord]:
        """At most ``limit`` due waits, earliest deadline first. ``read(key)`` reads a
        record (``None`` when gone)."""
        due: list[WaitRecord] = []
        offset = 0
        index = self._keys.wait_deadlines
        while len(due) < limit:
            entries = await self._redis.call(
                "ZRANGEBYSCORE",
                self._client.zrangebyscore(
                    index, "-inf", now, start=offset, num=_CHUNK, withscores=True
                ),
            )
            if not entries:
                return due
            pairs = [(text(m) or "", float(score)) for m, score in entries]
            records = await _read_each(read, [key for key, _ in pairs])
            for (key, score), record in zip(pairs, records, strict=True):
                if isinstance(record, Exception):
                    continue  # cannot be read: left out, its entry kept (counted below)
                if (
                    record is None
                    or record.status not in ("waiting", "claimed")
                    or record.expires_at != int(score)
                ):
                    removed = await self._redis.script(
                        DEADLINE_PRUNE, [index], [key, _score_text(score)]
                    )
                    offset -= int(removed or 0)
                    continue
                if record.is_expired(now) and (
                    record.status == "waiting" or record.lease_expired(now)
                ):
                    due.append(record)
                    if len(due) == limit:
                        return due
            offset += len(pairs)
            if len(pairs) < _CHUNK:
                return due
        return due


async def _read_each(read: Any, keys: list[str]) -> list[WaitRecord | Exception | None]:
    """``read(key)`` of every key at once: a record, ``None`` when gone, or the error of
    one that cannot be read — reported (siglo.unreadable) and returned in its place,
    where a storage failure is raised."""
    results = await asyncio.gather(*(read(key) for key in keys), return_exceptions=True)
    found: list[WaitRecord | Exception | None] = []
    for result in results:
        if isinstance(result, UNREADABLE):
            report_unreadable(result)
        elif isinstance(result, BaseException):
            raise result
        found.append(result)
    return found


def deadline_member(namespace: str | None, correlation_key: str) -> str:
    """A wait's member of the deadline index: its correlation key, prefixed with its
    namespace and a NUL (which no id contains) when its stack has one."""
    return correlation_key if namespace is None else f"{namespace}\x00{correlation_key}"


def deadline_member_parts(member: str) -> tuple[str | None, str]:
    """``(namespace, correlation key)`` of a deadline-index member."""
    namespace, nul, key = member.partition("\x00")
    return (namespace, key) if nul else (None, member)


def _score_text(score: float) -> str:
    # ZSCORE answers with Redis's own formatting of the double: integers without ".0".
    return str(int(score)) if score == int(score) else repr(score)
