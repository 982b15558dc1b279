"""Deliberately broken real backends: SQLite, PostgreSQL and Redis with one SQL statement,
one Lua script or one hook broken the way a real bug would break it (a claim ``UPDATE``
that lost a condition, a compare-and-set script comparing the wrong operand, an expiry
filter missing from one ``SELECT``, a namespace missing from a key, a TTL given in seconds
where milliseconds are meant...). Each is a subclass of the real part (adapter,
idempotency store, lock, nonce store) that overrides one statement, script or ``_do_…``
hook; the suite must fail each and name its rule as the primary failure
(tests/suite/test_contract_mutants.py).

The parts are swapped into a backend the real ``isolated`` factory built (its own
temporary database, PostgreSQL schema or Redis key prefix), so the mutant runs on real
storage with the real SQL and scripts everywhere else. The storage is not offered to
other connections or processes (``url_shares_storage`` is off): a second connection
by URL would reach the sound backend, not the mutant.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from siglo import locking
from siglo.backend import Backend
from siglo.checkpoint import Checkpoint
from siglo.errors import StorageAdapterError
from siglo.listing import CheckpointPage, ListQuery
from siglo.locking import held
from siglo.manager import StorageManager
from siglo.plugins import get_registry
from siglo.records import ContextChangeEvent
from siglo_contract.target import Target, accepted_options, connect_url
from siglo_postgres.connect import PostgresStorageAdapter
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.coordination import RedisLock, RedisNonceStore
from siglo_redis.keys import KeySpace
from siglo_redis.scripts import (
    CHECKPOINT_CAS,
    CHECKPOINT_PARTS_CAS,
    COMPARE_AND_DELETE,
    LOCK_EXTEND,
    STEP_SAVE,
    WAIT_CREATE,
    Script,
)
from siglo_sql.coordination import SqlIdempotencyStore, SqlLock
from siglo_sqlite.connect import SqliteStorageAdapter

URLS: dict[str, str] = {
    "sqlite": "sqlite://",
    "postgres": os.environ.get("SIGLO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "redis": os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
"""The storage each kind of mutant isolates its run in."""


class _Broken:
    """A part broken after it was built: :meth:`break_in` edits the instance."""

    def break_in(self) -> None:
        """Apply the bug to this (already built) instance; by default the class's
        overridden methods are the bug."""


# -- SQL: one statement edited -----------------------------------------------------------------


class _SqlEdit(_Broken):
    """Replaces ``OLD`` with ``NEW`` (both written with ``:name`` parameters) in the
    statement ``FIELD`` of this part's statements; an ``OLD`` that is not there is an
    error, so a changed statement cannot leave the mutant silently sound."""

    FIELD: ClassVar[str]
    OLD: ClassVar[str]
    NEW: ClassVar[str] = ""
    TEMPLATE: ClassVar[bool] = False
    """``FIELD`` is a template, converted to the driver's style when completed: ``OLD``
    and ``NEW`` are replaced as written."""

    def break_in(self) -> None:
        statements: Any = getattr(self, "_s")  # noqa: B009  (set by the real part's __init__)
        database: Any = getattr(self, "database", None) or getattr(self, "_db")  # noqa: B009
        text: str = getattr(statements, self.FIELD)
        old, new = self.OLD, self.NEW
        if not self.TEMPLATE:
            old, new = database.sql(old), database.sql(new)
        if old not in text:
            raise AssertionError(f"{type(self).__name__}: {old!r} is not in {self.FIELD}: {text}")
        edited = dataclasses.replace(statements, **{self.FIELD: text.replace(old, new, 1)})
        self._s = edited


class SqliteTokensKeptOnChange(_Broken, SqliteStorageAdapter):
    """list.by-index: the trigger on a checkpoint's update adds its new blind-index
    tokens but keeps the old ones, so a stack stays listed under a value it no longer
    has. (Installed by the first filtered listing: a trigger is schema, not a statement.)"""

    async def _do_list_by_index(self, query: ListQuery, tokens: dict[str, str]) -> CheckpointPage:
        if not getattr(self, "_trigger_broken", False):
            self._trigger_broken = True
            # The triggers come with a store's first token: made now if not yet, then
            # the update trigger swapped for the broken one (never made again: they stay).
            await self._need_token_triggers()
            prefix = self.table_prefix
            marker = "X'" + b'"$sigloIndex"'.hex().upper() + "'"
            await self.database.fetch(f"DROP TRIGGER {prefix}checkpoint_tokens_changed")
            await self.database.fetch(
                f"CREATE TRIGGER {prefix}checkpoint_tokens_changed AFTER UPDATE OF document "
                f"ON {prefix}checkpoints FOR EACH ROW BEGIN INSERT OR IGNORE INTO "
                f"{prefix}checkpoint_tokens (id, field, token) SELECT NEW.id, key, value "
                f"FROM json_each(CASE WHEN instr(NEW.document, {marker}) > 0 THEN "
                "CAST(NEW.document AS TEXT) ELSE '{}' END, '$.metadata.\"$sigloIndex\"') "
                "WHERE type = 'text' AND key IS NOT NULL; END"
            )
        return await super()._do_list_by_index(query, tokens)


class SqliteClaimIgnoresDeadline(_SqlEdit, SqliteStorageAdapter):
    """wait.claim.expired: the claim ``UPDATE`` lost its deadline condition."""

    FIELD = "wait_claim"
    OLD = " AND (:allow_expired OR deadline IS NULL OR deadline > :now)"


class SqliteUpdateIgnoresExpected(_SqlEdit, SqliteStorageAdapter):
    """checkpoint.occ.conflict: the compare-and-set ``UPDATE`` lost ``revision = :expected``."""

    FIELD = "cp_update_expected"
    OLD = " AND revision = :expected"


class SqliteListsExpired(_SqlEdit, SqliteStorageAdapter):
    """list.hidden: the listing ``SELECT`` lost its expiry filter."""

    FIELD = "cp_list"
    OLD = " AND (gone_at IS NULL OR gone_at > :now)"


class SqliteCacheReadsExpired(_SqlEdit, SqliteStorageAdapter):
    """cache.expiry: the step cache's ``SELECT`` lost its expiry filter."""

    FIELD = "cache_get"
    OLD = " AND gone_at > :now"


class SqliteAnyoneCompletes(_SqlEdit, SqliteStorageAdapter):
    """wait.complete.claimant: the complete ``UPDATE`` lost ``claimant_id = :claimant_id``."""

    FIELD = "wait_complete"
    OLD = " AND claimant_id = :claimant_id"


class SqliteCreateOverwrites(_SqlEdit, SqliteStorageAdapter):
    """wait.create: the create upsert lost its condition, so it replaces a live record."""

    FIELD = "wait_create"
    OLD = " WHERE t.gone_at IS NOT NULL AND t.gone_at <= :now"


class SqliteLockNeverExpires(_SqlEdit, SqlLock):
    """lock.expiry: the acquire upsert takes over a free row only, never an expired one."""

    FIELD = "lock_acquire"
    OLD = " OR siglo_locks.gone_at <= :now"


class SqliteCleanupDeletesLocks(_SqlEdit, SqliteStorageAdapter):
    """lock.fencing: the clean-up deletes expired lock rows instead of freeing them, and
    with each row its fencing counter, so the next acquire's token starts again at 1."""

    FIELD = "lock_clean_batch"
    OLD = "UPDATE siglo_locks SET token = NULL, gone_at = NULL WHERE"
    NEW = "DELETE FROM siglo_locks WHERE"


class PostgresReleaseIgnoresToken(_SqlEdit, SqlLock):
    """lock.release.token: the release ``UPDATE`` lost ``token = :token``."""

    FIELD = "lock_release"
    OLD = " AND token = :token"


class PostgresDeleteIgnoresExpected(_SqlEdit, PostgresStorageAdapter):
    """delete.cas: the compare-and-delete lost ``revision = :expected``."""

    FIELD = "cp_delete_expected"
    OLD = " AND revision = :expected"


class PostgresPartsSaveIgnoresExpected(_SqlEdit, PostgresStorageAdapter):
    """checkpoint.incremental: the one-statement save of a row version the adapter knows
    (``cp_update_parts``) lost ``revision = :expected``: a large document's save that
    expects a revision other than the stored one is stored, the row's version being the
    one the adapter wrote."""

    FIELD = "cp_update_parts"
    OLD = " AND revision = :expected"
    TEMPLATE = True


class PostgresCompleteIgnoresOwner(_SqlEdit, SqlIdempotencyStore):
    """idempotency.owner: the owned complete ``UPDATE`` lost ``owner = :owner``."""

    FIELD = "idem_complete_owned"
    OLD = " AND owner = :owner"


class PostgresAnyoneReleases(_SqlEdit, PostgresStorageAdapter):
    """wait.release: the release ``UPDATE`` lost ``claimant_id = :claimant_id``."""

    FIELD = "wait_release"
    OLD = " AND claimant_id = :claimant_id"


class PostgresStreamedSaveIgnoresExpected(_Broken, PostgresStorageAdapter):
    """context.streamed-save: the one-statement save with a context change (``WITH ctx AS
    (INSERT …) UPDATE …``) lost ``revision = :expected``; the plain save is sound."""

    def break_in(self) -> None:
        streamed: Any = self._s.cp_streamed
        old = self.database.sql(" AND revision = :expected")
        text: str = streamed["cp_update_expected"]
        if old not in text:
            raise AssertionError(f"{old!r} is not in the streamed compare-and-set: {text}")
        edited = {**streamed, "cp_update_expected": text.replace(old, "", 1)}
        self._s = dataclasses.replace(self._s, cp_streamed=edited)


class SqliteStepSaveEntryOnlyIfWon(_Broken, SqliteStorageAdapter):
    """cache.with-checkpoint: the step's transaction writes the cache entry only when the
    compare-and-set wins (a refused one rolls it back with the changes)."""

    async def _write_all(self, writes: Sequence[tuple[str, Any]]) -> list[list[Any]]:
        results = await super()._write_all(writes)
        cache_set = self._s.cache_set
        at = next((i for i, w in enumerate(writes) if w[0] == cache_set), None)
        if at is not None and not results[0]:  # the compare-and-set goes first
            await self.database.fetch(
                self.database.sql(self._tables_cache_delete()), {"id": writes[at][1]["id"]}
            )
        return results

    def _tables_cache_delete(self) -> str:
        name = self.table_prefix + "step_cache"
        return f"DELETE FROM {name} WHERE id = :id"


class PostgresUnlockingSendsNoRelease(_Broken, PostgresStorageAdapter):
    """lock.workflow.unlocking-save: the action's last save goes out without the lock's
    release, yet marks the hold released, so nobody releases the lock until its TTL."""

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        hold = held(self.workflow_lock, checkpoint.stack_id)
        await self.save_checkpoint_streamed(
            checkpoint, changes, expected_revision=expected_revision
        )
        if hold is not None:
            hold.released = True


class PostgresUnlockingReleasesAnyHold(_Broken, PostgresStorageAdapter):
    """lock.workflow.unlocking-save: the release sent with a save is of whatever lock the
    action holds, so another stack's save frees it."""

    async def save_checkpoint_unlocking(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent] = (),
        *,
        expected_revision: int | None = None,
    ) -> None:
        hold = locking._current.get()
        await self._save_streamed(checkpoint, changes, expected_revision, hold)


class PostgresUnlockingDropsItsChange(_Broken, PostgresStorageAdapter):
    """lock.workflow.unlocking-save: the one-round-trip unlocking save (a user's default,
    no checkpoint retention, one context change) sends the checkpoint and the release but
    not the change. With the suite's 24 h retention that path is never taken."""

    async def _save_streamed(
        self,
        checkpoint: Checkpoint,
        changes: Sequence[ContextChangeEvent],
        expected_revision: int | None,
        release: Any,
    ) -> None:
        if release is not None and changes and self.writes_with_checkpoint(changes):
            changes = ()
        await super()._save_streamed(checkpoint, changes, expected_revision, release)


# -- Redis: one script, key or hook ------------------------------------------------------------


class _Scripts:
    """The part's command runner with some scripts replaced (by the original's SHA)."""

    def __init__(self, inner: Any, replaced: dict[str, Script]) -> None:
        self._inner = inner
        self._replaced = replaced

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self._inner.script(self._replaced.get(script.sha, script), keys, args)


class _ScriptEdit(_Broken):
    """Runs ``SCRIPT`` with ``OLD`` replaced by ``NEW`` in its Lua source."""

    SCRIPT: ClassVar[Script]
    OLD: ClassVar[str]
    NEW: ClassVar[str]

    def break_in(self) -> None:
        source = self.SCRIPT.source
        if self.OLD not in source:
            raise AssertionError(f"{type(self).__name__}: {self.OLD!r} not in {self.SCRIPT.name}")
        broken = Script(self.SCRIPT.name + "_broken", source.replace(self.OLD, self.NEW, 1))
        self._redis = _Scripts(getattr(self, "_redis"), {self.SCRIPT.sha: broken})  # noqa: B009


class RedisCreateOverwrites(_ScriptEdit, RedisStorageAdapter):
    """wait.create: the create script writes over the record of its key."""

    SCRIPT = WAIT_CREATE
    OLD = "doc['correlationKey'] == ARGV[2] then return 0 end"
    NEW = "doc['correlationKey'] == ARGV[2] then end"

    def break_in(self) -> None:
        super().break_in()
        # The wait records helper runs the scripts through its own reference.
        self._waits._redis = self._redis


class RedisReleaseIgnoresToken(_ScriptEdit, RedisLock):
    """lock.release.token: the release script deletes without comparing the token."""

    SCRIPT = COMPARE_AND_DELETE
    OLD = 'if redis.call("get", KEYS[1]) == ARGV[1] then'
    NEW = 'if redis.call("exists", KEYS[1]) == 1 then'


class RedisExtendIgnoresToken(_ScriptEdit, RedisLock):
    """lock.extend.token: the extend script resets any holder's TTL."""

    SCRIPT = LOCK_EXTEND
    OLD = "if redis.call('GET', KEYS[1]) == ARGV[1] then"
    NEW = "if redis.call('EXISTS', KEYS[1]) == 1 then"


class RedisCasAcceptsStaleExpected(_ScriptEdit, RedisStorageAdapter):
    """checkpoint.occ.conflict: the compare-and-set script compares the stored revision
    with ``>=`` instead of ``==``, so a save expecting an older revision wins."""

    SCRIPT = CHECKPOINT_CAS
    OLD = "won = (stored or 0) == expected"
    NEW = "won = (stored or 0) >= expected"


class RedisTokensNotIndexed(_ScriptEdit, RedisStorageAdapter):
    """list.by-index: the compare-and-set script writes the checkpoint but never adds it
    to the blind-index sets of its tokens."""

    SCRIPT = CHECKPOINT_CAS
    OLD = "  for i = first_token, last_token do redis.call('ZADD', KEYS[i], 0, ARGV[6]) end\n"
    NEW = ""


class RedisStepSaveEntryOnlyIfWon(_ScriptEdit, RedisStorageAdapter):
    """cache.with-checkpoint: the step's one script writes the cache entry only when its
    compare-and-set wins, so a refused save loses an entry valid for its input."""

    SCRIPT = STEP_SAVE
    OLD = "if ARGV[a] == '1' then\n  redis.call('SET'"
    NEW = "if ARGV[a] == '1' and outcome == 1 then\n  redis.call('SET'"


class RedisCasAllowsEqual(_ScriptEdit, RedisStorageAdapter):
    """checkpoint.occ.monotonic: a plain save wins on ``>=``, so the stored revision can
    be written again."""

    SCRIPT = CHECKPOINT_CAS
    OLD = "won = stored == nil or new > stored"
    NEW = "won = stored == nil or new >= stored"


class RedisPartsBeforeDecision(_ScriptEdit, RedisStorageAdapter):
    """checkpoint.incremental: with incremental saves on, the compare-and-set script
    writes a save's parts (its bodies and parts list) before deciding on the revision,
    so a refused save replaces the stored document's parts."""

    SCRIPT = CHECKPOINT_PARTS_CAS
    OLD = '-- The first top-level "revision"'
    NEW = "if ARGV[7] ~= '' and write_parts() == 3 then return 3 end\n" + OLD

    def break_in(self) -> None:
        super().break_in()
        self.incremental_min_bytes = 65_536  # the SQL default: small documents whole


class RedisNonceWindowInSeconds(_Broken, RedisNonceStore):
    """nonce.expiry: the window's milliseconds are given to ``SET … EX`` (seconds)."""

    async def _do_claim(self, key: str, ttl_ms: int) -> bool:
        return bool(
            await self._redis.call(
                "SET", self.client.set(self.key_prefix + key, "1", ex=ttl_ms, nx=True)
            )
        )


class RedisCacheTtlInSeconds(_Broken, RedisStorageAdapter):
    """cache.expiry: a cached step's TTL is taken as seconds (1000 times too long)."""

    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        seconds = ttl_ms or self.cache_ttl_ms
        await super()._do_set_cached_step(key, value, seconds * 1000)


class _KeysWithoutNamespace(KeySpace):
    """The checkpoint key without its namespace segment."""

    def checkpoint(self, stack_id: str, namespace: str | None = None) -> str:
        return f"{self.prefix}checkpoint:{stack_id}"


class RedisCheckpointKeyIgnoresNamespace(_Broken, RedisStorageAdapter):
    """checkpoint.namespace.isolation: the checkpoint key has no namespace segment, so
    every namespace's checkpoint of a stack is one key."""

    def break_in(self) -> None:
        keys = _KeysWithoutNamespace(self.keys.prefix)
        self.keys = keys
        self._index._keys = keys
        self._waits._keys = keys


class RedisListingIgnoresWorkflow(_Broken, RedisStorageAdapter):
    """list.filters: the listing ignores the ``workflow_id`` filter."""

    async def _do_list_checkpoints(self, query: ListQuery) -> CheckpointPage:
        return await super()._do_list_checkpoints(dataclasses.replace(query, workflow_id=None))


# -- a broken manager over a real backend ------------------------------------------------------


class StrictDropsBackgroundFailures(StorageManager):
    """manager.error-mode.stored: in strict mode a background save's failure is dropped
    (as best-effort would), so the next flush() reports nothing."""

    def _handle_failure(self, exc: Exception, doing: str, *, background: str | None = None) -> None:
        if background is not None and isinstance(exc, StorageAdapterError):
            return
        super()._handle_failure(exc, doing, background=background)


# -- the mutants -------------------------------------------------------------------------------


def _install(backend: Backend, broken: type[_Broken]) -> None:
    """Turn the backend's part that ``broken`` subclasses into ``broken``."""
    for part in (backend.adapter, backend.idempotency, backend.lock, backend.nonces):
        if part is not None and issubclass(broken, type(part)):
            part.__class__ = broken
            assert isinstance(part, _Broken)
            part.break_in()
            return
    raise AssertionError(f"{broken.__name__} breaks no part of {backend.name}")


@dataclass(frozen=True)
class BackendMutant:
    """A real backend (``kind``: sqlite, postgres, redis) with one broken part."""

    rule_id: str
    kind: str
    broken: type[_Broken] | None
    description: str
    manager: type[StorageManager] = StorageManager

    @property
    def name(self) -> str:
        """The broken class's name: a stable id for the test and worker processes."""
        return (self.manager if self.broken is None else self.broken).__name__

    def target(self) -> Target:
        """The suite's target: the real ``isolated`` storage, with the part broken."""
        url = URLS[self.kind]
        spec = get_registry().for_url(url)
        isolated = spec.load_isolated()
        assert isolated is not None
        broken = self.broken

        @asynccontextmanager
        async def make(**options: Any) -> AsyncIterator[Backend]:
            async with isolated(url, **accepted_options(isolated, options)) as backend:
                if broken is not None:
                    _install(backend, broken)
                backend.url_shares_storage = False
                yield backend

        def fresh(**options: Any) -> Backend:
            # sqlite:// is a new private database per connection: another backend of the
            # target without touching anyone's storage.
            backend = connect_url(url, **options)
            if broken is not None:
                _install(backend, broken)
            return backend

        target = Target(
            label=self.name,
            capabilities=spec.capabilities,
            multiprocess=False,
            factory=fresh if self.kind == "sqlite" else None,
            isolated=make,
        )
        target.manager_factory = self.manager
        return target


BACKENDS: tuple[BackendMutant, ...] = (
    BackendMutant(
        "context.streamed-save",
        "postgres",
        PostgresStreamedSaveIgnoresExpected,
        "the one-statement streamed save ignores the expected revision",
    ),
    BackendMutant(
        "wait.claim.expired", "sqlite", SqliteClaimIgnoresDeadline, "claims ignore the deadline"
    ),
    BackendMutant(
        "checkpoint.occ.conflict",
        "sqlite",
        SqliteUpdateIgnoresExpected,
        "the CAS UPDATE ignores the expected revision",
    ),
    BackendMutant("list.hidden", "sqlite", SqliteListsExpired, "the listing shows expired rows"),
    BackendMutant(
        "list.by-index",
        "sqlite",
        SqliteTokensKeptOnChange,
        "the update trigger keeps a checkpoint's old tokens",
    ),
    BackendMutant(
        "list.by-index",
        "redis",
        RedisTokensNotIndexed,
        "the CAS script never adds a checkpoint to its token sets",
    ),
    BackendMutant("cache.expiry", "sqlite", SqliteCacheReadsExpired, "the cache reads expired"),
    BackendMutant(
        "wait.complete.claimant", "sqlite", SqliteAnyoneCompletes, "anyone completes a claim"
    ),
    BackendMutant("lock.expiry", "sqlite", SqliteLockNeverExpires, "expired locks stay held"),
    BackendMutant(
        "lock.fencing",
        "sqlite",
        SqliteCleanupDeletesLocks,
        "the clean-up deletes expired lock rows with their fencing counters",
    ),
    BackendMutant("wait.create", "sqlite", SqliteCreateOverwrites, "a create replaces a record"),
    BackendMutant(
        "lock.release.token", "postgres", PostgresReleaseIgnoresToken, "release ignores the token"
    ),
    BackendMutant(
        "delete.cas",
        "postgres",
        PostgresDeleteIgnoresExpected,
        "delete ignores the expected revision",
    ),
    BackendMutant(
        "checkpoint.incremental",
        "postgres",
        PostgresPartsSaveIgnoresExpected,
        "the one-statement save of a known row version ignores the expected revision",
    ),
    BackendMutant(
        "idempotency.owner",
        "postgres",
        PostgresCompleteIgnoresOwner,
        "complete ignores the owner token",
    ),
    BackendMutant("wait.release", "postgres", PostgresAnyoneReleases, "anyone releases a claim"),
    BackendMutant(
        "lock.workflow.unlocking-save",
        "postgres",
        PostgresUnlockingSendsNoRelease,
        "the last save does not send the release it promises",
    ),
    BackendMutant(
        "lock.workflow.unlocking-save",
        "postgres",
        PostgresUnlockingReleasesAnyHold,
        "another stack's last save releases the held lock",
    ),
    BackendMutant(
        "lock.workflow.unlocking-save",
        "postgres",
        PostgresUnlockingDropsItsChange,
        "the one-round-trip unlocking save of a user's defaults drops its change",
    ),
    BackendMutant(
        "lock.release.token", "redis", RedisReleaseIgnoresToken, "release compares nothing"
    ),
    BackendMutant("lock.extend.token", "redis", RedisExtendIgnoresToken, "extend compares nothing"),
    BackendMutant("wait.create", "redis", RedisCreateOverwrites, "the create script overwrites"),
    BackendMutant(
        "checkpoint.occ.conflict",
        "redis",
        RedisCasAcceptsStaleExpected,
        "the CAS script accepts an older expected revision",
    ),
    BackendMutant(
        "checkpoint.occ.monotonic", "redis", RedisCasAllowsEqual, "the CAS script accepts >="
    ),
    BackendMutant(
        "cache.with-checkpoint",
        "redis",
        RedisStepSaveEntryOnlyIfWon,
        "the step's script writes the cache entry only when the compare-and-set wins",
    ),
    BackendMutant(
        "cache.with-checkpoint",
        "sqlite",
        SqliteStepSaveEntryOnlyIfWon,
        "the step's transaction keeps the cache entry only when the compare-and-set wins",
    ),
    BackendMutant("nonce.expiry", "redis", RedisNonceWindowInSeconds, "the window is EX, not PX"),
    BackendMutant("cache.expiry", "redis", RedisCacheTtlInSeconds, "cache TTLs are seconds"),
    BackendMutant(
        "checkpoint.namespace.isolation",
        "redis",
        RedisCheckpointKeyIgnoresNamespace,
        "the checkpoint key has no namespace",
    ),
    BackendMutant(
        "list.filters", "redis", RedisListingIgnoresWorkflow, "the workflow_id filter is ignored"
    ),
    BackendMutant(
        "checkpoint.incremental",
        "redis",
        RedisPartsBeforeDecision,
        "the incremental compare-and-set writes the parts before deciding",
    ),
    BackendMutant(
        "manager.error-mode.stored",
        "sqlite",
        None,
        "strict drops background failures",
        manager=StrictDropsBackgroundFailures,
    ),
)
"""Real backends with one statement, script or hook broken (7 SQLite, 8 PostgreSQL,
10 Redis), and a broken manager over SQLite, whose closed backend really fails."""
