"""Keys per namespace: where the encryption stage of the pipeline gets its keys.

A :class:`KeyProvider` answers two questions: which key encrypts new payloads of a
namespace (:meth:`KeyProvider.current_key`), and which key a stored ciphertext names
(:meth:`KeyProvider.key`). Two are built in:

- :class:`SettingsKeyProvider` — keys given in the settings or ``$SIGLO_ENCRYPTION_KEYS``
  (for development and simple deployments). Each namespace's key is derived from the
  configured key (HKDF-SHA256 over the namespace), so tenants never share a key, but
  a tenant's key cannot be destroyed on its own.
- :class:`EnvelopeKeyProvider` — per-namespace data keys, random, wrapped by a master key
  (:class:`MasterKey`: a local key, or one a KMS plugin supplies) and stored in the
  backend itself. A namespace's data keys can be rotated and destroyed
  (``siglo rekey``, ``siglo erase``).

The envelope provider keeps each namespace's keyring as a checkpoint of a reserved
namespace (:data:`KEYRING_NAMESPACE`): the checkpoint compare-and-set is the one atomic
primitive every backend — a third party's too — has, so two processes that create a
namespace's first key at once agree on one, and a rotation or an erasure never loses a
concurrent one. An erased keyring keeps the ids of its destroyed keys (never the keys),
at a higher revision, so an old dump imported later cannot bring a key back and a
ciphertext that names one raises :class:`~siglo.errors.KeyErasedError`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from siglo.checkpoint import Checkpoint
from siglo.clock import system_clock
from siglo.errors import (
    CheckpointConflictError,
    DecryptionError,
    InvalidArgumentError,
    KeyErasedError,
)
from siglo.plugins import get_registry
from siglo.reserved import KEYRING_NAMESPACE, check_not_keyring, keyring_access
from siglo.unreadable import collecting_unreadable, stopping_at_unreadable

if TYPE_CHECKING:
    from siglo.adapter import StorageAdapter

__all__ = [
    "KEYRING_NAMESPACE",
    "EnvelopeKeyProvider",
    "KeyProvider",
    "LocalMasterKey",
    "MasterKey",
    "SettingsKeyProvider",
    "check_key_id",
    "decode_key",
    "is_local_scheme",
]

KEY_BYTES: Final = 32
"""AES-256: every key is 32 bytes."""


_NO_NAMESPACE: Final = "\x1fnone"
"""The keyring id of payloads stored without a namespace (and the name its keys are
derived under)."""

_SPELT_LIKE_NONE: Final = re.compile("\x1f+none")


def _key_name(namespace: str | None) -> str:
    """The name a namespace's keys are derived and kept under: :data:`_NO_NAMESPACE`
    for none, the namespace itself otherwise — but for a namespace that spells it (ids
    are any text: ``"\x1fnone"`` is a legal namespace), which gets one ``\x1f`` more,
    so no namespace shares the keys of the payloads without one (nor another's)."""
    if namespace is None:
        return _NO_NAMESPACE
    if _SPELT_LIKE_NONE.fullmatch(namespace):
        return "\x1f" + namespace
    return namespace


_KEY_ID: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_key_id(key_id: Any, where: str) -> str:
    """A key id: 1–64 letters, digits, ``_`` or ``-`` (it is written into each envelope).

    A refused id is not quoted: it may be a key written where its id goes (an entry of
    ``SIGLO_ENCRYPTION_KEYS`` without its ``id=``), and an error must not print a key."""
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        shown = (
            f"a {type(key_id).__name__}"
            if not isinstance(key_id, str)
            else f"{len(key_id)} characters, not shown: it may be a key in the id's place"
        )
        raise InvalidArgumentError(
            f"a key id in {where} ({shown}) must be 1-64 letters, digits, '_' or '-': "
            "write each key as id=base64key"
        )
    return key_id


_SHOWN_ID_MAX: Final = 40
"""The longest key id an error quotes: a key (32 bytes) is at least 43 characters of
base64, so a longer "id" may be a key written in the id's place."""


def shown_key_id(key_id: str) -> str:
    """A key id of the settings as an error names it: quoted when it cannot be a key,
    else its length alone (an id is not secret, a key in its place is)."""
    if len(key_id) < _SHOWN_ID_MAX:
        return repr(key_id)
    return f"({len(key_id)} characters, not shown: it may be a key in the id's place)"


def is_local_scheme(scheme: str) -> bool:
    """Whether a ``master_key`` setting's scheme names a key given inline (``base64``,
    however it is written: ``BASE64``, `` base64``), not a KMS plugin's reference."""
    return scheme.strip().lower() == "base64"


def decode_key(text: Any, where: str) -> bytes:
    """A 32-byte key from its base64 text (standard or URL-safe alphabet)."""
    if isinstance(text, bytes):
        raw = text
    else:
        if not isinstance(text, str):
            raise InvalidArgumentError(f"the key {where} must be base64 text of 32 bytes")
        cleaned = text.strip()
        try:
            raw = base64.b64decode(
                cleaned.replace("-", "+").replace("_", "/") + "=" * (-len(cleaned) % 4),
                validate=True,
            )
        except (binascii.Error, ValueError):
            raise InvalidArgumentError(
                f"the key {where} is not base64 (make one with: "
                "python -c 'import os,base64;print(base64.b64encode(os.urandom(32)).decode())')"
            ) from None
    if len(raw) != KEY_BYTES:
        raise InvalidArgumentError(
            f"the key {where} is {len(raw)} bytes; AES-256 needs {KEY_BYTES}"
        )
    return raw


@runtime_checkable
class KeyProvider(Protocol):
    """Where the pipeline's encryption stage gets keys, per namespace."""

    async def current_key(self, namespace: str | None) -> tuple[str, bytes]:
        """The id and 32 bytes of the key that encrypts new payloads of ``namespace``."""
        ...

    async def index_key(self, namespace: str | None) -> bytes:
        """The key of ``namespace``'s blind index (:mod:`siglo.blind`): the same for as
        long as the namespace's tokens must match, whichever key is current."""
        ...

    async def key(self, namespace: str | None, key_id: str) -> bytes:
        """The key ``key_id`` of ``namespace``; raises
        :class:`~siglo.errors.KeyErasedError` if it was destroyed and
        :class:`~siglo.errors.DecryptionError` if there is no such key."""
        ...


class SettingsKeyProvider:
    """Keys from the settings (``encryption_keys``, ``encryption_key_id``).

    ``keys`` maps key ids to 32-byte keys; ``active`` is the id new payloads use (the
    last one given, if not named). Each namespace gets its own key, derived from the
    configured one with HKDF-SHA256 (info: the namespace), so a ciphertext of one tenant
    never decrypts under another's key.
    """

    def __init__(self, keys: Mapping[str, bytes], active: str | None = None) -> None:
        if not keys:
            raise InvalidArgumentError("a SettingsKeyProvider needs at least one key")
        self._keys = {check_key_id(k, "encryption_keys"): v for k, v in keys.items()}
        self.active = active if active is not None else list(self._keys)[-1]
        if self.active not in self._keys:
            raise InvalidArgumentError(
                f"encryption_key_id {shown_key_id(self.active)} is not one of "
                f"encryption_keys ({', '.join(map(shown_key_id, self._keys))})"
            )
        self._derived: dict[tuple[str, str | None], bytes] = {}

    def _derive(self, key_id: str, namespace: str | None) -> bytes:
        cached = self._derived.get((key_id, namespace))
        if cached is None:
            info = b"siglo namespace key\0" + _key_name(namespace).encode()
            cached = self._derived[(key_id, namespace)] = _hkdf(self._keys[key_id], info)
        return cached

    async def current_key(self, namespace: str | None) -> tuple[str, bytes]:
        return self.active, self._derive(self.active, namespace)

    async def index_key(self, namespace: str | None) -> bytes:
        """The key of the blind index of ``namespace``: derived from the *first* key of
        ``encryption_keys``, so tokens stay the same when a new key becomes current
        (keep the first key listed while a blind index is in use)."""
        first = next(iter(self._keys))
        info = b"siglo blind index\0" + _key_name(namespace).encode()
        return _hkdf(self._keys[first], info)

    async def key(self, namespace: str | None, key_id: str) -> bytes:
        if key_id not in self._keys:
            raise DecryptionError(
                f"a payload was encrypted with key {key_id!r}, which the settings do not "
                f"hold (encryption_keys: {', '.join(self._keys)}): add it back to read it"
            )
        return self._derive(key_id, namespace)


def _hkdf(key: bytes, info: bytes) -> bytes:
    # HKDF-SHA256 (RFC 5869) with an empty salt, one block: 32 bytes.
    prk = hmac.new(b"\0" * 32, key, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


@runtime_checkable
class MasterKey(Protocol):
    """Wraps and unwraps the envelope provider's data keys (a local key, or a KMS)."""

    key_id: str

    async def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """``data_key`` encrypted, bound to ``context``."""
        ...

    async def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """The data key :meth:`wrap` wrapped with the same ``context``."""
        ...


class LocalMasterKey:
    """A master key held by the process (``master_key = "base64:…"`` in the settings)."""

    def __init__(self, key: bytes, key_id: str = "local") -> None:
        self._key = decode_key(key, "master_key")
        self.key_id = check_key_id(key_id, "master_key")

    async def wrap(self, data_key: bytes, context: bytes) -> bytes:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        return nonce + AESGCM(self._key).encrypt(nonce, data_key, context)

    async def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            return AESGCM(self._key).decrypt(wrapped[:12], wrapped[12:], context)
        except Exception:
            raise DecryptionError(
                "a data key does not unwrap with this master key: the keyring was wrapped "
                "by another master key, or altered"
            ) from None


def _keyring_id(namespace: str | None) -> str:
    return _key_name(namespace)


def _namespace_of(keyring_id: str) -> str | None:
    """The namespace whose keys the keyring ``keyring_id`` holds (:func:`_keyring_id`'s
    inverse)."""
    if keyring_id == _NO_NAMESPACE:
        return None
    if _SPELT_LIKE_NONE.fullmatch(keyring_id):
        return keyring_id[1:]
    return keyring_id


class EnvelopeKeyProvider:
    """Per-namespace data keys, wrapped by ``master`` and stored in ``adapter`` (the
    backend's own adapter, not behind the pipeline): see the module.

    Unwrapped keys are kept in this process. Which key is active is read again after
    ``refresh_s`` seconds, so a rotation made elsewhere reaches new writes here within
    that time; :meth:`erase` made here drops the keys at once, and another process drops
    them when it next reads the keyring (after ``refresh_s``, a restart, or
    :meth:`forget`).
    """

    refresh_s: float = 5.0

    def __init__(self, adapter: StorageAdapter, master: MasterKey) -> None:
        self.adapter = adapter
        self.master = master
        self._keys: dict[tuple[str | None, str], bytes] = {}
        self._active: dict[str | None, tuple[str, float]] = {}
        self._seen: dict[str | None, float] = {}
        self._index: dict[str | None, tuple[bytes, float]] = {}
        self._lock = asyncio.Lock()
        self._master_checked = False
        """Whether the master key has unwrapped a key of the store's keyrings (once)."""

    def forget(self) -> None:
        """Drop every key held in this process (the next use reads the keyrings)."""
        self._keys.clear()
        self._active.clear()
        self._seen.clear()
        self._index.clear()

    async def _ring(self, namespace: str | None) -> Checkpoint | None:
        with keyring_access():
            return await self.adapter.get_checkpoint(
                _keyring_id(namespace), KEYRING_NAMESPACE, fallback=False
            )

    def _context(self, namespace: str | None, key_id: str) -> bytes:
        return b"siglo data key\0" + _keyring_id(namespace).encode() + b"\0" + key_id.encode()

    async def _save_ring(
        self,
        namespace: str | None,
        keys: dict[str, str],
        active: str | None,
        revision: int,
        erased_keys: list[str],
        index_key: str | None = None,
    ) -> None:
        ring = Checkpoint(
            stack_id=_keyring_id(namespace),
            namespace=KEYRING_NAMESPACE,
            revision=revision + 1,
            timestamp=system_clock.now_ms(),
            type="keyring",
            # Never a terminal status: `siglo prune` must not collect a tombstone.
            status="running",
            contexts={"keys": keys},
            metadata={
                "active": active,
                # The ids of destroyed keys: a ciphertext naming one is KeyErasedError.
                "erasedKeys": erased_keys,
                # The data key whose derivation keys the blind index: fixed until erased.
                "indexKey": index_key,
                "masterKeyId": self.master.key_id,
            },
        )
        with keyring_access():
            await self.adapter.save_checkpoint(ring, expected_revision=revision)

    async def _new_key(self, namespace: str | None, ring: Checkpoint | None) -> tuple[str, bytes]:
        """Add a new data key to the keyring and make it the active one (compare-and-set
        on the keyring's revision; a concurrent change makes this read again). Refused
        (:class:`~siglo.errors.DecryptionError`, nothing written) when the keys the ring
        holds do not unwrap with this provider's master key: a key wrapped by another
        master key, made active, would make every save of the namespace fail. Never for
        the keyrings' own namespace (:mod:`siglo.reserved`): a write there is refused,
        and must not leave a key minted for it behind."""
        check_not_keyring(namespace, "making a data key")
        while True:
            keys = dict(ring.contexts.get("keys", {})) if ring is not None else {}
            if ring is not None and keys:
                await self._unwrap(namespace, ring, next(iter(keys)))
            elif not self._master_checked:
                # A namespace's first key: checked against another namespace's keyring.
                await self._check_master()
            # Random: never the id of an erased key, whose ciphertexts must find none.
            key_id = f"d{len(keys) + 1}-{secrets.token_hex(4)}"
            data_key = os.urandom(KEY_BYTES)
            wrapped = await self.master.wrap(data_key, self._context(namespace, key_id))
            keys[key_id] = base64.b64encode(wrapped).decode()
            index = (ring.metadata or {}).get("indexKey") if ring is not None else None
            if index not in keys:
                index = key_id  # the first key after creation or an erasure
            try:
                await self._save_ring(
                    namespace,
                    keys,
                    key_id,
                    0 if ring is None else ring.revision,
                    _erased_ids(ring),
                    index,
                )
            except CheckpointConflictError:
                ring = await self._ring(namespace)
                if ring is not None and ring.metadata and ring.metadata.get("active"):
                    return await self._load_active(namespace, ring)
                continue
            self._keys[(namespace, key_id)] = data_key
            self._active[namespace] = (key_id, time.monotonic())
            return key_id, data_key

    async def _check_master(self) -> None:
        """Unwrap one key of a keyring the store holds (the first that holds one): a
        master key that does not unwrap it is another store's, and the first key it
        wrapped for a new namespace would be one the application's master key cannot
        unwrap — every save of that namespace refused, for good. A store without a
        keyring holding a key has nothing to check against."""
        cursor = None
        while True:
            # A keyring that cannot be read is left out: another one serves the check.
            with collecting_unreadable(), keyring_access():
                page = await self.adapter.list_checkpoints(
                    namespace=KEYRING_NAMESPACE, limit=50, cursor=cursor
                )
            for item in page.items:
                owner = _namespace_of(item.stack_id)
                ring = await self._ring(owner)
                held = ring.contexts.get("keys", {}) if ring is not None else {}
                if ring is not None and held:
                    await self._unwrap(owner, ring, next(iter(held)))
                    self._master_checked = True
                    return
            if page.next_cursor is None:
                self._master_checked = True
                return
            cursor = page.next_cursor

    async def _load_active(self, namespace: str | None, ring: Checkpoint) -> tuple[str, bytes]:
        meta = ring.metadata or {}
        active = str(meta["active"])
        key = await self._unwrap(namespace, ring, active)
        self._active[namespace] = (active, time.monotonic())
        return active, key

    async def _unwrap(self, namespace: str | None, ring: Checkpoint, key_id: str) -> bytes:
        wrapped = ring.contexts.get("keys", {}).get(key_id)
        if wrapped is None:
            raise DecryptionError(
                f"a payload of {_describe(namespace)} names data key {key_id!r}, which its "
                "keyring does not hold"
            )
        key = await self.master.unwrap(base64.b64decode(wrapped), self._context(namespace, key_id))
        self._keys[(namespace, key_id)] = key
        return key

    async def current_key(self, namespace: str | None) -> tuple[str, bytes]:
        active = self._active.get(namespace)
        if active is not None and time.monotonic() - active[1] < self.refresh_s:
            return active[0], self._keys[(namespace, active[0])]
        async with self._lock:
            ring = await self._ring(namespace)
            if ring is None or not (ring.metadata or {}).get("active"):
                return await self._new_key(namespace, ring)
            return await self._load_active(namespace, ring)

    async def key(self, namespace: str | None, key_id: str) -> bytes:
        found = self._keys.get((namespace, key_id))
        seen = self._seen.get(namespace)
        if found is not None and seen is not None and time.monotonic() - seen < self.refresh_s:
            return found
        ring = await self._ring(namespace)
        self._seen[namespace] = time.monotonic()
        if ring is None:
            raise KeyErasedError(
                f"{_describe(namespace)} has no keyring in this store: its data key "
                f"{key_id!r} was erased, or the data comes from another store"
            )
        if key_id in _erased_ids(ring):
            self._drop(namespace)
            raise KeyErasedError(_erased_message(namespace))
        return await self._unwrap(namespace, ring, key_id)

    def _drop(self, namespace: str | None) -> None:
        self._active.pop(namespace, None)
        self._seen.pop(namespace, None)
        self._index.pop(namespace, None)
        for cached in [k for k in self._keys if k[0] == namespace]:
            del self._keys[cached]

    async def index_key(self, namespace: str | None) -> bytes:
        """The key of ``namespace``'s blind index: derived from the data key the keyring
        names for it (its first key), so rotation keeps the tokens and erasure destroys
        them."""
        cached = self._index.get(namespace)
        if cached is not None and time.monotonic() - cached[1] < self.refresh_s:
            return cached[0]
        await self.current_key(namespace)  # a namespace's first use makes its keyring
        ring = await self._ring(namespace)
        index = (ring.metadata or {}).get("indexKey") if ring is not None else None
        if ring is None or not isinstance(index, str):
            raise KeyErasedError(_erased_message(namespace))
        derived = _hkdf(await self.key(namespace, index), b"siglo blind index")
        self._index[namespace] = (derived, time.monotonic())
        return derived

    async def rotate(self, namespace: str | None) -> str:
        """Make a new data key the one new payloads of ``namespace`` use; returns its id
        (the old keys stay, to read what they encrypted until ``siglo rekey`` re-encrypts
        it)."""
        async with self._lock:
            key_id, _ = await self._new_key(namespace, await self._ring(namespace))
            return key_id

    async def erase(self, namespace: str | None) -> list[str]:
        """Destroy every data key of ``namespace``: the keyring keeps no key, only the ids
        of the destroyed ones, so a ciphertext naming one raises
        :class:`~siglo.errors.KeyErasedError` (compare-and-set: retried over a concurrent
        rotation). Payloads written to the namespace afterwards get a new key. Returns
        the ids destroyed. Refused (:class:`~siglo.errors.DecryptionError`, nothing
        changed) when the keyring's keys do not unwrap with this provider's master key:
        the one irreversible command is not run from a shell holding another store's
        key, where every other command fails."""
        async with self._lock:
            while True:
                ring = await self._ring(namespace)
                if ring is None:
                    # No key was ever made here: nothing to destroy, and nothing written
                    # (a keyring made now would only record a typo's namespace, by any
                    # master key).
                    self._drop(namespace)
                    return []
                held = ring.contexts.get("keys", {})
                if ring is not None and held:
                    await self._unwrap(namespace, ring, next(iter(held)))
                erased = sorted(set(_erased_ids(ring)) | set(held))
                try:
                    await self._save_ring(namespace, {}, None, ring.revision, erased)
                except CheckpointConflictError:
                    continue
                break
            self._drop(namespace)
            # Those destroyed now: an erase run again (to finish an interrupted one) said
            # it destroyed the keys an earlier run had (a black-box auditor).
            return sorted(held)

    async def has_keyring(self, namespace: str | None) -> bool:
        """Whether ``namespace`` has a keyring in the store (a key was made for it)."""
        return await self._ring(namespace) is not None

    async def namespaces(self) -> list[str | None]:
        """The namespaces with a keyring in the store."""
        found: list[str | None] = []
        cursor = None
        while True:
            # A keyring left out would be a namespace missed; listing them is siglo's own.
            with stopping_at_unreadable(), keyring_access():
                page = await self.adapter.list_checkpoints(
                    namespace=KEYRING_NAMESPACE, limit=500, cursor=cursor
                )
            for item in page.items:
                found.append(_namespace_of(item.stack_id))
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor


def _describe(namespace: str | None) -> str:
    return "the payloads without a namespace" if namespace is None else f"namespace {namespace!r}"


def _erased_ids(ring: Checkpoint | None) -> list[str]:
    found = (ring.metadata or {}).get("erasedKeys") if ring is not None else None
    return list(found) if isinstance(found, list) else []


def _erased_message(namespace: str | None) -> str:
    return (
        f"the data key of {_describe(namespace)} was erased (siglo erase): what it "
        "encrypted cannot be read anywhere, backups and exports included"
    )


def master_key_from(setting: str) -> MasterKey:
    """The master key the ``master_key`` setting names: ``base64:<key>`` is a
    :class:`LocalMasterKey`; any other ``<scheme>:<reference>`` is asked of the plugins'
    ``siglo_master_key`` hook (a KMS plugin)."""
    scheme, _, reference = setting.partition(":")
    if is_local_scheme(scheme):
        return LocalMasterKey(decode_key(reference, "of master_key"))
    found = get_registry().master_key(scheme, reference)
    if found is None:
        raise InvalidArgumentError(
            f"master_key names scheme {scheme!r}, which no installed plugin supplies "
            "(`siglo backends` lists the plugins; a KMS plugin implements siglo_master_key)"
        )
    if not isinstance(found, MasterKey):
        raise InvalidArgumentError(
            f"the plugin for master_key scheme {scheme!r} returned {type(found).__name__}, "
            "not a MasterKey (key_id, wrap, unwrap)"
        )
    return found
