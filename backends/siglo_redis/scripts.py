"""The Lua scripts behind siglo's atomic Redis operations.

Each runs inside Redis as one atomic step, so a read and the write that depends on it
can never be split by another client. They are sent once and then run by SHA
(``EVALSHA``); after a ``NOSCRIPT`` (a restarted or failed-over server, ``SCRIPT
FLUSH``) the runner sends the source again. Every script touches only the keys it is
given, all in one cluster slot, so they run on a Redis Cluster too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "CHECKPOINT_CAS",
    "CHECKPOINT_LOAD",
    "CHECKPOINT_PARTS_CAS",
    "CHECKPOINT_DELETE",
    "DEADLINE_PRUNE",
    "INDEX_PRUNE",
    "TOKEN_PRUNE",
    "COMPARE_AND_DELETE",
    "CONTEXT_COMPARE_DELETE",
    "CONTEXT_CHANGE",
    "CONTEXT_SWAP",
    "IDEMPOTENCY_CLAIM_OWNED",
    "IDEMPOTENCY_COMPLETE",
    "IDEMPOTENCY_EXTEND",
    "IDEMPOTENCY_FAIL",
    "LOCK_ACQUIRE",
    "LOCK_EXTEND",
    "LOCK_INSPECT",
    "PARTS_DROP",
    "PARTS_STEP_SAVE",
    "STEP_SAVE",
    "SWAP",
    "WAIT_CREATE",
    "WAIT_INDEX_ADD",
    "WAIT_STACK_COPY",
    "READ_ONLY_SCRIPTS",
    "Script",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its SHA-1, the name ``EVALSHA`` knows it by."""

    name: str
    source: str
    read_only: bool = False
    """Whether the script only reads: ``wait_replicas`` sends it without a ``WAIT``."""
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


_CAS_HEAD: Final = """
-- Compare-and-set of a checkpoint on its stored revision, writing the document whole.
-- KEYS[1] checkpoint key. ARGV[1] new JSON, ARGV[2] its revision, ARGV[3] expected
-- revision ('' = none: the new revision must be above the stored one), ARGV[4] now (ms),
-- ARGV[5] PX ('' = keep forever; <= 0 = already expired: delete).
-- KEYS[2], when given: the listing index (a sorted set in the checkpoint key's cluster
-- slot) and ARGV[6] the checkpoint's member in it; a write adds it, a delete removes it.
-- KEYS[3], when ARGV[7] is '1': the checkpoint's parts hash (same slot; a writer with
-- incremental_min_bytes stored the stack in parts, siglo_redis.adapter). A write or a
-- delete drops it, so that a hash holding every context body never outlives the key
-- (it kept its own TTL, or none); a DEL of a key that is not there, inside the script.
-- The keys after it (after KEYS[2] without it): the blind-index sets of the document's
-- tokens (same slot); a write adds the member to each (a set may keep members whose
-- token changed since: readers check the document and drop them).
-- Returns an integer (a table reply costs more to build and to parse): 1 when stored,
-- 2 when a revision is too large for Lua's doubles to compare exactly (the caller then
-- decides in exact integers and writes with the swap script), and on a conflict
-- -2 - stored revision (-1 for none: so -1 means "nothing stored", -2 "revision 0" …).
local exact = 9007199254740992
local new = tonumber(ARGV[2])
local expected = tonumber(ARGV[3])
local parts = nil
if ARGV[7] == '1' then parts = KEYS[3] end
local first_token = parts and 4 or 3
"""

_CAS_WRITE_WHOLE: Final = """\
local function write()
  if ARGV[5] == '' then
    redis.call('SET', KEYS[1], ARGV[1])
  elseif tonumber(ARGV[5]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[5])
  else
    redis.call('DEL', KEYS[1])
    if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[6]) end
    if parts then redis.call('DEL', parts) end
    return 1
  end
  -- Stored whole: parts another writer saved belong to no head now.
  if parts then redis.call('DEL', parts) end
  if KEYS[2] then redis.call('ZADD', KEYS[2], 0, ARGV[6]) end
  for i = first_token, last_token do redis.call('ZADD', KEYS[i], 0, ARGV[6]) end
  return 1
end
"""

_CAS_DECIDE: Final = """\
-- The first top-level "revision" of a document, read off its opening text without
-- decoding it, when the opening is members whose values are integers or strings
-- without escapes, up to an integer "revision" (the shape siglo writes). Else nil.
-- Returns the revision and where its value ends.
local function opening_revision(s)
  if string.byte(s, 1) ~= 123 then return nil end
  local pos = 2
  for _ = 1, 32 do
    local _, e, key = string.find(s, '^"([%w_]*)":', pos)
    if not key then return nil end
    pos = e + 1
    if key == 'revision' then
      local _, e2, digits = string.find(s, '^(%d+)[,}]', pos)
      if not digits or #digits > 15 then return nil end
      return tonumber(digits), e2
    end
    _, e = string.find(s, '^"[^"\\\\]*"[,}]', pos)
    if not e then _, e = string.find(s, '^%-?%d+[,}]', pos) end
    if not e or string.byte(s, e) ~= 44 then return nil end
    pos = e + 1
  end
  return nil
end
-- A plain save that moves forward from the opening's revision is decided by the
-- opening alone, read with GETRANGE: bringing a 256 KB document into Lua costs ~0.4 ms,
-- and whether the stored checkpoint is past its expiresAt does not matter when the save
-- wins either way. (A document that repeats its top-level "revision" further on, which
-- no JSON encoder writes, is judged by the first; docs/backends/redis.md.)
if not expected and new < exact then
  local opening = redis.call('GETRANGE', KEYS[1], 0, 4095)
  local first = opening ~= '' and opening_revision(opening)
  if first and new > first then
    return write()
  end
end
-- Otherwise the whole document decides. Its revision is read off the text when the text
-- proves it: an opening as above, no other "revision" key after it, no "expiresAt"
-- anywhere (so the checkpoint cannot be past its expiry) and no backslash-u escape
-- (which could spell either key). Else cjson decodes it (milliseconds at 256 KB).
local current = redis.call('GET', KEYS[1])
local stored = nil
local quick = nil
if current and not string.find(current, 'xpiresAt', 1, true)
    and not string.find(current, '\\\\u', 1, true) then
  local revision, after = opening_revision(current)
  if revision and not string.find(current, 'vision"', after, true) then
    quick = revision
  end
end
if quick then
  stored = quick
elseif current then
  local ok, doc = pcall(cjson.decode, current)
  if not ok or type(doc) ~= 'table' or type(doc['revision']) ~= 'number' then
    return redis.error_reply('SIGLO_MALFORMED stored checkpoint has no numeric revision')
  end
  local expires = doc['expiresAt']
  -- Past its expiresAt a checkpoint is gone, whatever TTL its writer gave the key.
  if not (type(expires) == 'number' and tonumber(ARGV[4]) >= expires) then
    stored = doc['revision']
  end
end
if new >= exact or (stored and stored >= exact) or (expected and expected >= exact) then
  return 2
end
local won
if expected then
  won = (stored or 0) == expected
else
  won = stored == nil or new > stored
end
if not won then
  return -2 - (stored or -1)
end
return write()
"""

CHECKPOINT_CAS: Final = Script(
    "checkpoint_cas", _CAS_HEAD + "local last_token = #KEYS\n" + _CAS_WRITE_WHOLE + _CAS_DECIDE
)

_STEP_TAIL: Final = """\
local outcome = decide()
if type(outcome) == 'table' or outcome == 3 then
  return outcome
end
local k = last_token + 1
local a = tail + 1
for _ = 1, tonumber(ARGV[tail]) do
  if ARGV[a] == 'delete' then
    redis.call('HDEL', KEYS[k], ARGV[a + 1])
  else
    redis.call('HSET', KEYS[k], ARGV[a + 1], ARGV[a + 2])
  end
  if ARGV[a + 3] == '' then
    redis.call('PERSIST', KEYS[k])
  else
    redis.call('PEXPIRE', KEYS[k], ARGV[a + 3])
  end
  k = k + 1
  a = a + 4
end
if ARGV[a] == '1' then
  redis.call('SET', KEYS[k], ARGV[a + 1], 'PX', ARGV[a + 2])
  k = k + 1
end
a = a + 3
if ARGV[a] == '1' and outcome ~= 2 and redis.call('GET', KEYS[k]) == ARGV[a + 1] then
  redis.call('DEL', KEYS[k])
end
return outcome
"""

STEP_SAVE: Final = Script(
    "step_save",
    _CAS_HEAD
    + """\
-- A step's writes in one call: CHECKPOINT_CAS on its keys (ARGV[1..7] as there; ARGV[8]
-- how many blind-index keys follow KEYS[2], or the parts hash when ARGV[7] is '1'),
-- then, whatever it decided (not after an error reply, which writes nothing): ARGV[9]
-- context changes, each four ARGV (op, field, JSON value, retention as in
-- CONTEXT_CHANGE) on the next key; a cache entry ('1', value, PX; or '0', '', '') on the
-- next key; and the release of a workflow lock ('1', token; or '0', '') on the next key,
-- if it holds that token (not when the compare-and-set answers 2: the caller saves
-- exactly, and the lock stays held).
local last_token = first_token - 1 + tonumber(ARGV[8])
local tail = 9
"""
    + _CAS_WRITE_WHOLE
    + "local function decide()\n"
    + _CAS_DECIDE
    + "end\n"
    + _STEP_TAIL,
)

_PARTS_HEAD: Final = """
-- The compare-and-set of CHECKPOINT_CAS for a store saving incrementally
-- (siglo_redis.adapter, incremental_min_bytes): the same decision on the revision, and a
-- write that also keeps the checkpoint's parts hash KEYS[3] (same cluster slot) in step.
-- ARGV[1] is the whole document, or its skeleton (contexts {}) when ARGV[7] is the parts
-- list ([[step, digest], ...] JSON; '' = stored whole: the parts hash is dropped); then
-- ARGV[8], ARGV[9] ... are each distinct digest of that list with its context body, or
-- '' for a body the caller believes the hash already holds. The hash holds each body by
-- its digest and '@order' (the parts list), '@len' and '@head' (the length and SHA-1 of
-- the skeleton these parts belong to: a reader assembles only then). Returns as
-- CHECKPOINT_CAS does, or 3 (nothing written) when a body sent as '' is not there: the
-- caller sends them all. KEYS[4] ...: the blind-index sets, as in CHECKPOINT_CAS.
-- ARGV[5] may also be 'keep': the key keeps its TTL, and the parts hash gets the same.
local exact = 9007199254740992
local new = tonumber(ARGV[2])
local expected = tonumber(ARGV[3])
"""

_PARTS_WRITE: Final = """\
local function write_parts()
  local named = {}
  for i = first_pair, last_pair, 2 do
    named[ARGV[i]] = true
    if ARGV[i + 1] == '' and redis.call('HEXISTS', KEYS[3], ARGV[i]) == 0 then
      return 3
    end
  end
  -- Bodies no longer named go (the '@' fields are rewritten below).
  for _, name in ipairs(redis.call('HKEYS', KEYS[3])) do
    if not named[name] and string.byte(name, 1) ~= 64 then
      redis.call('HDEL', KEYS[3], name)
    end
  end
  for i = first_pair, last_pair, 2 do
    if ARGV[i + 1] ~= '' then redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
  end
  redis.call('HSET', KEYS[3], '@order', ARGV[7], '@len', #ARGV[1],
    '@head', redis.sha1hex(ARGV[1]))
  return 1
end
local function write()
  if ARGV[5] ~= '' and ARGV[5] ~= 'keep' and tonumber(ARGV[5]) <= 0 then
    redis.call('DEL', KEYS[1], KEYS[3])
    redis.call('ZREM', KEYS[2], ARGV[6])
    return 1
  end
  if ARGV[7] == '' then
    redis.call('DEL', KEYS[3])
  elseif write_parts() == 3 then
    return 3
  end
  if ARGV[5] == 'keep' then
    -- cancel_workflow: the checkpoint keeps the TTL it has, as a whole write keeps it.
    local left = redis.call('PTTL', KEYS[1])
    redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
    if left > 0 then
      redis.call('PEXPIRE', KEYS[3], left)
    else
      redis.call('PERSIST', KEYS[3])
    end
  elseif ARGV[5] == '' then
    redis.call('SET', KEYS[1], ARGV[1])
    redis.call('PERSIST', KEYS[3])
  else
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[5])
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
  end
  redis.call('ZADD', KEYS[2], 0, ARGV[6])
  for i = 4, last_token do redis.call('ZADD', KEYS[i], 0, ARGV[6]) end
  return 1
end
"""

CHECKPOINT_PARTS_CAS: Final = Script(
    "checkpoint_parts_cas",
    _PARTS_HEAD
    + "local first_pair, last_pair, last_token = 8, #ARGV, #KEYS\n"
    + _PARTS_WRITE
    + _CAS_DECIDE,
)

PARTS_STEP_SAVE: Final = Script(
    "parts_step_save",
    _PARTS_HEAD
    + """\
-- A step's writes in one call, for a store saving incrementally: CHECKPOINT_PARTS_CAS
-- on its keys (ARGV[1..7] as there; ARGV[8] how many blind-index keys follow KEYS[3],
-- ARGV[9] how many digest and body pairs follow it), then, whatever it decided (not
-- after an error reply or 3, which write nothing), the context changes, the cache entry
-- and the lock's release of STEP_SAVE, from the ARGV after the pairs and the keys after
-- the blind-index sets.
local last_token = 3 + tonumber(ARGV[8])
local first_pair, last_pair = 10, 9 + 2 * tonumber(ARGV[9])
local tail = last_pair + 1
"""
    + _PARTS_WRITE
    + "local function decide()\n"
    + _CAS_DECIDE
    + "end\n"
    + _STEP_TAIL,
)

CHECKPOINT_LOAD: Final = Script(
    "checkpoint_load",
    """
-- Read a checkpoint and, when it is stored in parts, its parts, in one step (a save in
-- between cannot tear it). KEYS[1] checkpoint key, KEYS[2] its parts hash.
-- Returns {} when there is no checkpoint, {document} when it is stored whole (or the
-- hash holds parts of another head: a writer that saved it whole left them), else
-- {skeleton, parts list, digest, body, digest, body, ...}.
local head = redis.call('GET', KEYS[1])
if not head then return {} end
local meta = redis.call('HMGET', KEYS[2], '@len', '@head', '@order')
if not meta[1] or tonumber(meta[1]) ~= #head or meta[2] ~= redis.sha1hex(head) then
  return {head}
end
local reply = {head, meta[3]}
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  if string.byte(fields[i], 1) ~= 64 then
    reply[#reply + 1] = fields[i]
    reply[#reply + 1] = fields[i + 1]
  end
end
return reply
""",
    read_only=True,
)

PARTS_DROP: Final = Script(
    "parts_drop",
    """
-- Drop a checkpoint's parts hash unless it belongs to the head stored now: one whose
-- key is gone (expired, evicted, deleted past siglo) or holds another head (saved whole
-- by a writer that left the hash: siglo before every whole write dropped it, a
-- TypeScript worker). What `siglo clean` runs on each parts hash it finds.
-- KEYS[1] checkpoint key, KEYS[2] parts hash (same slot). Returns 1 when dropped; a key
-- of another type under a parts hash's name is not one, and stays.
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then return 0 end
local head = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[2], '@len', '@head')
if head and meta[1] and tonumber(meta[1]) == #head and meta[2] == redis.sha1hex(head) then
  return 0
end
return redis.call('DEL', KEYS[2])
""",
)

SWAP: Final = Script(
    "swap",
    """
-- Replace a value only if it is still the one the caller decided on.
-- KEYS[1] key. ARGV[1] SHA-1 of the value read ('' = the key must be absent),
-- ARGV[2] new value, ARGV[3] TTL: 'keep' (keep the key's TTL), '' (none), PX in ms,
-- or <= 0 (already expired: delete). KEYS[2], when given, is deleted with the write
-- (a checkpoint written whole: its parts hash, which would outlive it). Returns 1 if
-- done, 0 if the value had changed.
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if current then return 0 end
elseif not current or redis.sha1hex(current) ~= ARGV[1] then
  return 0
end
if ARGV[3] == 'keep' then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
elseif ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[2])
elseif tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
if KEYS[2] then redis.call('DEL', KEYS[2]) end
return 1
""",
)

WAIT_STACK_COPY: Final = Script(
    "wait_stack_copy",
    """
-- Seed 001 §5 also stores a wait record under siglo:wait:<stackId>; never let that copy
-- overwrite the record whose correlation key is that same string.
-- KEYS[1] siglo:wait:<stackId>. ARGV[1] record JSON, ARGV[2] stack id, ARGV[3] PX ('' none).
local current = redis.call('GET', KEYS[1])
if current then
  local ok, doc = pcall(cjson.decode, current)
  if ok and type(doc) == 'table' and doc['correlationKey'] == ARGV[2] then return 0 end
end
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
end
return 1
""",
)

WAIT_CREATE: Final = Script(
    "wait_create",
    """
-- Store a wait record only if no record of its correlation key is there (an import
-- that must not overwrite a wait the store already has, in whatever state).
-- KEYS[1] siglo:[<ns>:]wait:<key>. ARGV[1] record JSON, ARGV[2] correlation key,
-- ARGV[3] PX ('' none). A per-stack copy of seed 001 §5 that merely sits at this key
-- (another record's, for a stack whose id is this key) is not a record of the key.
-- Returns 1 when stored, 0 when the key's record exists (nothing changed).
local current = redis.call('GET', KEYS[1])
if current then
  local ok, doc = pcall(cjson.decode, current)
  if ok and type(doc) == 'table' and doc['correlationKey'] == ARGV[2] then return 0 end
end
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
end
return 1
""",
)

WAIT_INDEX_ADD: Final = Script(
    "wait_index_add",
    """
-- Record a correlation key as the latest wait of a stack.
-- KEYS[1] siglo:wait-index:<stackId> (sorted set: score = save order).
-- ARGV[1] correlation key, ARGV[2] retention of the record in ms ('' = none).
-- The index lives as long as the longest-lived record it names.
local before = redis.call('PTTL', KEYS[1])
local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local score = 1
if top[2] then score = tonumber(top[2]) + 1 end
redis.call('ZADD', KEYS[1], score, ARGV[1])
if ARGV[2] == '' then
  redis.call('PERSIST', KEYS[1])
elseif before == -2 or (before >= 0 and before < tonumber(ARGV[2])) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return score
""",
)

CONTEXT_CHANGE: Final = Script(
    "context_change",
    """
-- Seed 001 §5's HSET + PEXPIRE of a context stream, in one step (a crash between the two
-- would leave a hash that never expires). KEYS[1] context hash. ARGV[1] 'set' or
-- 'delete', ARGV[2] field, ARGV[3] JSON value, ARGV[4] retention in ms ('' = none).
if ARGV[1] == 'delete' then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
end
if ARGV[4] == '' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return 1
""",
)

CONTEXT_SWAP: Final = Script(
    "context_swap",
    """
-- siglo rekey: replace one field of a context hash only if it still holds the value read,
-- so a change streamed meanwhile is never overwritten; HSET keeps the hash's TTL.
-- KEYS[1] context hash. ARGV[1] field, ARGV[2] value read, ARGV[3] new value.
-- Returns 1 if done, 0 if the field had changed or gone (or the hash expired).
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
""",
)

_IDEMPOTENCY_META: Final = """
local value = redis.call('GET', KEYS[1])
local owner, fingerprint = '', ''
local meta = value and redis.call('GET', KEYS[2])
if meta then
  owner, fingerprint = string.match(meta, '^([^:]*):(.*)$')
  owner, fingerprint = owner or '', fingerprint or ''
end
local held = ''
if value == 'in-progress' then held = owner end
"""

IDEMPOTENCY_CLAIM_OWNED: Final = Script(
    "idempotency_claim_owned",
    """
-- A claim with an owner token and a fingerprint digest, in one step. KEYS[1] the seed's
-- key (stays 'in-progress' / 'COMPLETED:<json>'), KEYS[2] its sibling
-- '<owner token>:<fingerprint digest>' (same slot). ARGV[1] lease ms, ARGV[2] token or
-- '', ARGV[3] digest or ''. Returns 'claimed', 'completed', 'in-progress' or 'mismatch'.
if redis.call('SET', KEYS[1], 'in-progress', 'PX', ARGV[1], 'NX') then
  if ARGV[2] == '' and ARGV[3] == '' then
    redis.call('DEL', KEYS[2])
  else
    redis.call('SET', KEYS[2], ARGV[2] .. ':' .. ARGV[3], 'PX', ARGV[1])
  end
  return 'claimed'
end
"""
    + _IDEMPOTENCY_META
    + """
if ARGV[3] ~= '' and fingerprint ~= '' and fingerprint ~= ARGV[3] then return 'mismatch' end
if value and string.sub(value, 1, 10) == 'COMPLETED:' then return 'completed' end
return 'in-progress'
""",
)

IDEMPOTENCY_COMPLETE: Final = Script(
    "idempotency_complete",
    """
-- Complete only for the owner. KEYS[1] key, KEYS[2] sibling. ARGV[1] 'COMPLETED:<json>',
-- ARGV[2] PX, ARGV[3] token ('' = token-less: only if no owned claim holds the key).
-- Returns 1 when stored, 0 when refused (nothing changed).
"""
    + _IDEMPOTENCY_META
    + """
if held ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if fingerprint ~= '' then
  redis.call('SET', KEYS[2], ':' .. fingerprint, 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[2])
end
return 1
""",
)

IDEMPOTENCY_FAIL: Final = Script(
    "idempotency_fail",
    """
-- Free an in-progress key, only for its owner. KEYS[1] key, KEYS[2] sibling. ARGV[1]
-- token ('' = token-less: frees only a key no owned claim holds; nothing to free is fine).
-- Returns 1 when done, 0 when refused (nothing changed).
"""
    + _IDEMPOTENCY_META
    + """
if held ~= ARGV[1] then return 0 end
if value ~= 'in-progress' then
  if ARGV[1] == '' then return 1 end
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
""",
)

IDEMPOTENCY_EXTEND: Final = Script(
    "idempotency_extend",
    """
-- Renew an owned claim's lease. KEYS[1] key, KEYS[2] sibling. ARGV[1] token, ARGV[2] PX.
-- Returns 1 when renewed, 0 when the token does not hold the key in progress.
"""
    + _IDEMPOTENCY_META
    + """
if held == '' or held ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
""",
)

COMPARE_AND_DELETE: Final = Script(
    "compare_and_delete",
    # Seed 001 §7's release script, verbatim.
    """if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
else
    return 0
end""",
)

CONTEXT_COMPARE_DELETE: Final = Script(
    "context_compare_delete",
    """
-- Remove the fields of a context hash that still hold the values a delete read, so that
-- a run re-created under the same stack id keeps what it wrote since.
-- KEYS[1] context hash. ARGV: field, value, field, value, ...
-- Returns how many fields were removed.
local removed = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return removed
""",
)

LOCK_ACQUIRE: Final = Script(
    "lock_acquire",
    """
-- KEYS[1] lock key, KEYS[2] the fencing counter of its slot, KEYS[3] the per-key counter
-- of older siglo versions (all in one slot). ARGV[1] token, ARGV[2] TTL ms.
-- Returns the new fencing token, or 0 when the lock is held.
if not redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then
  return 0
end
local fence = redis.call('INCR', KEYS[2])
local legacy = tonumber(redis.call('GET', KEYS[3]))
if legacy then
  -- Fold the old per-key counter in, so this key's tokens keep growing, and drop it.
  redis.call('DEL', KEYS[3])
  if legacy >= fence then
    fence = legacy + 1
    redis.call('SET', KEYS[2], fence)
  end
end
return fence
""",
)

LOCK_EXTEND: Final = Script(
    "lock_extend",
    """
-- KEYS[1] lock key. ARGV[1] token, ARGV[2] TTL ms. 1 if the holder's TTL was reset.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
""",
)

LOCK_INSPECT: Final = Script(
    "lock_inspect",
    """
-- KEYS[1] lock key. Read-only. {token, ms left} of a live lease, or false when the key is
-- gone (released or expired: an expired key is never returned by GET).
local token = redis.call('GET', KEYS[1])
if not token then
  return false
end
return {token, redis.call('PTTL', KEYS[1])}
""",
    read_only=True,
)


CHECKPOINT_DELETE: Final = Script(
    "checkpoint_delete",
    """
-- Delete a checkpoint and its listing-index member, compare-and-set when asked.
-- KEYS[1] checkpoint key, KEYS[2] listing index (same cluster slot), KEYS[3] the
-- checkpoint's parts hash (same slot; siglo_redis.adapter). ARGV[1] member,
-- ARGV[2] expected revision ('' = any), ARGV[3] now (ms).
-- Returns {1, 1 if the deleted checkpoint was live else 0, its JSON or ''}, or
-- {0, stored revision or -1} when the stored revision is not the expected one. A value
-- that is not a checkpoint (written past siglo) counts as live, with no revision: it
-- is deleted when no revision is expected, and the caller is told it was.
local current = redis.call('GET', KEYS[1])
local live = 0
local revision = -1
if current then
  local ok, doc = pcall(cjson.decode, current)
  if ok and type(doc) == 'table' and type(doc['revision']) == 'number' then
    local expires = doc['expiresAt']
    if not (type(expires) == 'number' and tonumber(ARGV[3]) >= expires) then
      live = 1
      revision = doc['revision']
    end
  else
    live = 1
  end
end
if ARGV[2] ~= '' and (live == 0 or revision ~= tonumber(ARGV[2])) then
  return {0, revision}
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if KEYS[3] then redis.call('DEL', KEYS[3]) end
return {1, live, current or ''}
""",
)

INDEX_PRUNE: Final = Script(
    "index_prune",
    """
-- Drop a listing-index member whose checkpoint key is gone (expired by Redis): only if
-- it is still gone, so a save racing the prune keeps its member.
-- KEYS[1] checkpoint key, KEYS[2] listing index (same slot). ARGV[1] member.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.call('ZREM', KEYS[2], ARGV[1])
end
return 0
""",
)

TOKEN_PRUNE: Final = Script(
    "token_prune",
    """
-- Drop a blind-index member whose checkpoint no longer holds the token: only if the
-- checkpoint key still holds what the reader read (SHA-1; '' = gone), so a save racing
-- the prune, which adds the member again in its own script, keeps it.
-- KEYS[1] checkpoint key, KEYS[2] blind-index set (same slot). ARGV[1] member,
-- ARGV[2] SHA-1 of the document read, or ''.
local current = redis.call('GET', KEYS[1])
local seen = current and redis.sha1hex(current) or ''
if seen == ARGV[2] then
  return redis.call('ZREM', KEYS[2], ARGV[1])
end
return 0
""",
)

DEADLINE_PRUNE: Final = Script(
    "deadline_prune",
    """
-- Drop a correlation key from the due-wait index if its deadline there is still the
-- one the caller saw (a re-save with a new deadline keeps its entry).
-- KEYS[1] deadline index. ARGV[1] correlation key, ARGV[2] the score seen.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
""",
)


READ_ONLY_SCRIPTS: Final = frozenset(
    script.sha for script in (CHECKPOINT_LOAD, LOCK_INSPECT) if script.read_only
)
"""The SHA-1s of the scripts that only read (:mod:`siglo_redis.replication`)."""
