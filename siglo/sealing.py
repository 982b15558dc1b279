"""The codec chain: how a payload is compressed and encrypted on its way to a backend.

The chain is the pipeline's stage after redaction (:mod:`siglo.pipeline`). Each payload —
one step's context, a checkpoint's metadata, a wait record's event payload or metadata, a
context-change value, a cached step output, an idempotency result — is encoded on its own
into a *sealed value*, a JSON object with one key::

    {"$siglo": "v1.<codec>.<key id>.<nonce>.<data>"}

``codec`` is ``z`` (zstd), ``e`` (AES-256-GCM) or ``ez`` (zstd, then AES-256-GCM);
``key id`` and ``nonce`` are empty when nothing is encrypted; ``nonce`` and ``data`` are
standard base64 (RFC 4648 §4, padded), which C code encodes and decodes. A sealed value
is JSON like any other payload, so every backend
— a third party's included — stores it without knowing what it is.

The associated data of the encryption binds a ciphertext to where it belongs: the
namespace, the record's id (the stack id of a checkpoint or context change, the
correlation key of a wait record, the cache or idempotency key), the record kind and the
field, together with the envelope's own header. A ciphertext copied into another row,
field or namespace fails authentication, and the read raises
:class:`~siglo.errors.DecryptionError` instead of returning another row's data.

A step's context whose plaintext did not change since this process last sealed or opened
it at the same location, under the key that is still current, is stored as the same
ciphertext (:class:`SealCache`): a fresh nonce at every save made every context of every
save new bytes, which the incremental saves wrote again and offloading put as a new blob
(docs/large-state.md). Equal ciphertexts across saves say what the incremental layout
says anyway: which contexts of a checkpoint did not change between two saves. Nothing is
equal across locations (each has its own associated data and nonce), and a ciphertext is
never re-used for another plaintext: the new one is compared with the one kept, byte for
byte.
"""

from __future__ import annotations

import binascii
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from siglo import codec
from siglo.codec import (
    NO_BLOB_STORE,
    REF_KEY,
    SEALED_KEY,
    is_reference,
    is_sealed,
    references_in,
    refuse_unopened_value,
    sealed_without_codecs,
)
from siglo.errors import (
    DecryptionError,
    EncryptionRequiredError,
    InvalidArgumentError,
    KeyErasedError,
    MalformedRecordError,
)
from siglo.keys import KeyProvider

__all__ = [
    "ENVELOPE_VERSION",
    "SEALED_KEY",
    "Location",
    "SealCache",
    "Sealer",
    "is_sealed",
    "refuse_sealed",
    "refuse_unopened",
    "refuse_unopened_value",
    "refuse_unresolved",
    "require_packages",
]

ENVELOPE_VERSION: Final = "v1"
_NONCE_BYTES: Final = 12
_CODECS: Final = frozenset({"z", "e", "ez"})


@dataclass(frozen=True, slots=True)
class Location:
    """Where a payload belongs: what its associated data binds it to."""

    namespace: str | None
    record_id: str
    kind: str
    """``checkpoint``, ``wait``, ``context``, ``step`` or ``idempotency``."""
    field: str

    def describe(self) -> str:
        ns = "no namespace" if self.namespace is None else f"namespace {self.namespace!r}"
        return f"{self.kind} {self.record_id!r} ({ns}), field {self.field!r}"

    def associated_data(self, header: str) -> bytes:
        return orjson.dumps(
            ["siglo", header, self.namespace, self.record_id, self.kind, self.field]
        )


def refuse_unopened(checkpoint: Any) -> None:
    """Refuse a loaded checkpoint that still holds what this connection could not open:
    an offloaded value (:func:`refuse_unresolved`) or a sealed context or metadata
    (:func:`refuse_sealed`). Every path that hands a stored run's data on (a load, a
    resume, a recovery, a delivery's check) calls it, whatever layers the connection
    has: handed on, a reference or a ciphertext would be taken for the run's data."""
    refuse_unresolved(checkpoint)
    refuse_sealed(checkpoint)


def refuse_unopened_run(
    checkpoint: Any, waits: Any = (), stream: Mapping[str, Mapping[str, Any]] | None = None
) -> None:
    """:func:`refuse_unopened` for what a view of one run prints (``siglo show``, the
    dashboard's run page): its checkpoint, its wait records' event payloads and its
    context stream's values. A view from a process without the keys the run was stored
    with says so (:class:`~siglo.errors.DecryptionError`) instead of printing the
    ciphertext as the run's data."""
    refuse_unopened(checkpoint)
    for wait in waits:
        codec.refuse_unopened_value(
            wait.event_payload, f"the event payload of wait {wait.correlation_key!r}"
        )
    for step, changes in (stream or {}).items():
        for key, value in changes.items():
            codec.refuse_unopened_value(value, f"the context stream's {step}.{key}")


def refuse_unresolved(checkpoint: Any) -> None:
    """Raise :class:`~siglo.errors.InvalidArgumentError` when a loaded checkpoint holds a
    reference to an offloaded value (a context's value, or a context sealed and then
    offloaded): the offloading layer resolves every reference below, so one that reaches
    here was read by a connection without the blob store (settings without
    ``blob_url``, as a worker started without the application's may have)."""
    for step, key, reference in references_in(checkpoint.contexts):
        namespace = checkpoint.namespace
        where = "no namespace" if namespace is None else f"namespace {namespace!r}"
        what = f"{step}.{key}" if key != SEALED_KEY else f"{step} (sealed)"
        raise InvalidArgumentError(
            f"stack {checkpoint.stack_id!r} ({where}), {what} is offloaded to blob "
            f"{reference[REF_KEY]}, and this connection has no blob store to read it "
            f"from: {NO_BLOB_STORE}"
        )


def refuse_sealed(checkpoint: Any) -> None:
    """Raise :class:`~siglo.errors.DecryptionError` when a loaded checkpoint still holds a
    sealed context or metadata: a connection with keys opens them below, so one that
    reaches the caller was read by a process without the keys (or codecs) it was stored
    with — handed on, its ciphertext would be taken for the run's data (a step run on it,
    a field saved in clear beside it)."""
    sealed = [step for step, ctx in checkpoint.contexts.items() if is_sealed(ctx)]
    metadata = checkpoint.metadata
    if metadata is not None and isinstance(metadata.get(SEALED_KEY), str):
        sealed.append("metadata")
    if sealed:
        namespace = checkpoint.namespace
        where = "no namespace" if namespace is None else f"namespace {namespace!r}"
        raise sealed_without_codecs(f"stack {checkpoint.stack_id!r} ({where}: {', '.join(sealed)})")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _unb64(text: str, where: Location) -> bytes:
    try:
        return binascii.a2b_base64(text)
    except (binascii.Error, ValueError):
        raise MalformedRecordError(
            where.kind, where.field, "holds a sealed value that is not base64"
        ) from None


_REF_MARK: Final = orjson.dumps(REF_KEY)
"""How a reference's key reads in the JSON of a value that holds one."""


def _refuse_references(value: Any, where: Location) -> None:
    """Refuse to encode a reference to an offloaded value where the offloading layer
    puts them (a cached step's output or a stream's value whole, a context's top-level
    values): that layer sits below the codecs, so a reference reaches them there only
    through a connection without the blob store (settings without ``blob_url``). Sealed,
    it would be hidden from the offloading layer and from the collector, which would then
    remove its blob, and read back as the value. Deeper in a value (an event payload's
    field, a context value's), the same form is the application's data, stored as it is
    without encryption: no layer reads it as a reference."""
    if is_reference(value):
        found = [("", value)]
    elif type(value) is dict and where.kind == "checkpoint" and where.field.startswith("contexts."):
        found = [(f".{k}", v) for k, v in value.items() if is_reference(v)]
    else:
        return
    for name, reference in found:
        raise InvalidArgumentError(
            f"{where.describe()}{name} is a reference to offloaded blob "
            f"{reference[REF_KEY]}, which this connection cannot resolve (no blob store); "
            f"encoding it would hide the reference and lose the value: {NO_BLOB_STORE}"
        )


DEFAULT_SEAL_CACHE_BYTES: Final = 64 * 1024 * 1024
"""How much a :class:`SealCache` keeps by default (plaintext and envelope, each entry
counted with :data:`_ENTRY_OVERHEAD` more): as much as the incremental saves' body cache."""

_Slot = tuple[str | None, str, str, str]
"""A :class:`Location`'s fields, in order."""

_ENTRY_OVERHEAD: Final = 256
"""What an entry costs beyond its bytes (the location, the tuple, the ordered dict's
slot), counted so that many small contexts stay within the bound too."""


class SealCache:
    """The last envelope sealed or opened at each location, with the plaintext it holds
    and the key it was made with, the least recently used going first past ``max_bytes``.

    :meth:`Sealer.seal` hands back the envelope kept for a location when the plaintext is
    the same bytes and the key current for the namespace is the same id and the same
    bytes: the stored form of an unchanged context then stays the same, so the
    incremental saves skip it and offloading finds its blob (a fresh nonce made it new
    bytes at every save). Reusing an envelope for the same plaintext at the same location
    repeats a valid encryption; it never encrypts anything new under a nonce already
    used. A key rotation makes the next seal of each location a new encryption under the
    new key (the header and the key differ), and so does an erased namespace's new key.
    """

    __slots__ = ("_entries", "_size", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_SEAL_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        # By the location's fields as a tuple: a tuple of strings hashes and compares in
        # C, a dataclass through its generated methods (three times the cost, which was
        # a quarter of a 1 KB save whose contexts all changed).
        self._entries: OrderedDict[_Slot, tuple[str, bytes, bytes, str]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """The bytes counted against :attr:`max_bytes`."""
        return self._size

    def get(self, where: Location, header: str, key: bytes, plain: bytes) -> str | None:
        """The envelope kept for ``where`` if it was made with ``header`` (codecs and key
        id) and ``key`` and holds ``plain``; ``None`` otherwise."""
        slot = (where.namespace, where.record_id, where.kind, where.field)
        found = self._entries.get(slot)
        if found is None:
            return None
        # The header first: it differs after a rotation, and costs less than the bytes.
        if found[0] != header or found[1] != key or found[2] != plain:
            return None
        self._entries.move_to_end(slot)
        return found[3]

    def put(self, where: Location, header: str, key: bytes, plain: bytes, envelope: str) -> None:
        """Keep ``envelope`` (``header`` and ``key``, holding ``plain``) for ``where``,
        in place of what was kept there."""
        entries = self._entries
        slot = (where.namespace, where.record_id, where.kind, where.field)
        old = entries.pop(slot, None)
        if old is not None:
            self._size -= len(old[2]) + len(old[3]) + _ENTRY_OVERHEAD
        cost = len(plain) + len(envelope) + _ENTRY_OVERHEAD
        if cost > self.max_bytes:
            return  # too large to keep: kept, it would push every other entry out first
        entries[slot] = (header, key, plain, envelope)
        self._size += cost
        while self._size > self.max_bytes:
            _, (_, _, p, e) = entries.popitem(last=False)
            self._size -= len(p) + len(e) + _ENTRY_OVERHEAD


class Sealer:
    """Encodes payloads into sealed values and decodes them back (see the module).

    ``keys`` encrypts (``None``: nothing is encrypted, but sealed values written with
    encryption still need a provider to be read); ``compress_min_bytes`` compresses a
    payload whose JSON is at least that long (``None``: never); ``require_encryption``
    refuses a payload read in clear, or sealed without encryption. ``reused`` keeps the
    envelopes that :meth:`seal` and :meth:`open` called with ``reuse=True`` made or read
    (:class:`SealCache`; one of ``seal_cache_bytes``).
    """

    __slots__ = ("_zc", "_zd", "compress_min_bytes", "keys", "require_encryption", "reused")

    def __init__(
        self,
        keys: KeyProvider | None,
        *,
        compress_min_bytes: int | None = None,
        require_encryption: bool = False,
        seal_cache_bytes: int = DEFAULT_SEAL_CACHE_BYTES,
    ) -> None:
        self.keys = keys
        self.compress_min_bytes = compress_min_bytes
        self.require_encryption = require_encryption
        self.reused = SealCache(seal_cache_bytes)
        self._zc: Any = None
        self._zd: Any = None
        if compress_min_bytes is not None:
            self._compressor()

    @property
    def encrypts(self) -> bool:
        """Whether new payloads are encrypted."""
        return self.keys is not None

    @property
    def is_identity(self) -> bool:
        """Whether this sealer neither writes nor checks anything."""
        return self.keys is None and self.compress_min_bytes is None and not self.require_encryption

    def _compressor(self) -> Any:
        if self._zc is None:
            try:
                import zstandard
            except ImportError as exc:  # pragma: no cover - the extra is a dependency
                raise InvalidArgumentError(
                    "compression needs the zstandard package: "
                    "pip install 'siglo[encryption]>=0.1,<1'"
                ) from exc
            self._zc = zstandard.ZstdCompressor(level=3)
            self._zd = zstandard.ZstdDecompressor()
        return self._zc

    # -- toward the backend ------------------------------------------------------------

    async def seal(self, value: Any, where: Location, *, reuse: bool = False) -> Any:
        """``value`` as stored: sealed if there is anything to do, else as it is. ``None``
        is not a payload and stays ``None``.

        ``reuse``: a payload stored again at every save (a step's context) whose
        plaintext is the one last sealed or opened here at ``where``, under the key still
        current, gets that envelope back instead of a new encryption (:class:`SealCache`);
        the stored bytes of an unchanged context then stay the same."""
        if value is None or (self.keys is None and self.compress_min_bytes is None):
            return value
        try:
            plain = orjson.dumps(value)
        except TypeError:
            # The description is built only on failure: it cost a quarter of a
            # microsecond a payload, a third of what the seal cache costs a changed one.
            plain = codec.dumps(value, what=where.describe())  # raises, naming where
        if _REF_MARK in plain:
            # A reference's key is in its JSON as it is: a search of the bytes spares
            # walking every value (0.45 µs of a 1 KB context's seal).
            _refuse_references(value, where)
        compress = self.compress_min_bytes is not None and len(plain) >= self.compress_min_bytes
        if self.keys is None:
            if not compress:
                return value
            # zstd is deterministic: the same plaintext compresses to the same bytes.
            data = self._compressor().compress(plain)
            return {SEALED_KEY: f"{ENVELOPE_VERSION}.z...{_b64(data)}"}
        key_id, key = await self.keys.current_key(where.namespace)
        header = f"{ENVELOPE_VERSION}.{'ez' if compress else 'e'}.{key_id}"
        if reuse:
            # Looked up before compressing: an unchanged context costs a comparison of its
            # bytes, neither compression nor encryption.
            kept = self.reused.get(where, header, key, plain)
            if kept is not None:
                return {SEALED_KEY: kept}
        data = self._compressor().compress(plain) if compress else plain
        nonce = os.urandom(_NONCE_BYTES)
        sealed = _aesgcm(key).encrypt(nonce, data, where.associated_data(header))
        envelope = f"{header}.{_b64(nonce)}.{_b64(sealed)}"
        if reuse:
            self.reused.put(where, header, key, plain, envelope)
        return {SEALED_KEY: envelope}

    async def seal_dict(
        self, value: Mapping[str, Any] | None, where: Location, *, reuse: bool = False
    ) -> Any:
        """A dict payload (a step's context, metadata) as stored: a sealed value is itself
        a dict, so the stored field keeps its type (``reuse``: as :meth:`seal`)."""
        return await self.seal(None if value is None else dict(value), where, reuse=reuse)

    # -- from the backend ----------------------------------------------------------------

    async def open(self, value: Any, where: Location, *, reuse: bool = False) -> Any:
        """``value`` as read back: a sealed value decoded, anything else as it is (refused
        under ``require_encryption``).

        ``reuse``: keep the envelope opened for :meth:`seal` with ``reuse`` at ``where``,
        so that a process that loaded a checkpoint stores its unchanged contexts as they
        were (its first save after the load writes only what changed)."""
        if not is_sealed(value):
            if self.require_encryption and value is not None:
                raise EncryptionRequiredError(
                    f"{where.describe()} is stored in clear and require_encryption is set: "
                    "re-save it with encryption on (`siglo rekey` does, for a whole store), "
                    "or turn require_encryption off to read it"
                )
            return value
        envelope: str = value[SEALED_KEY]
        parts = envelope.split(".")
        if len(parts) != 5 or parts[0] != ENVELOPE_VERSION or parts[1] not in _CODECS:
            raise MalformedRecordError(
                where.kind, where.field, f"holds a sealed value of an unknown form ({parts[0]!r})"
            )
        version, codec_name, key_id, nonce, data = parts
        raw = _unb64(data, where)
        if codec_name.startswith("e"):
            if self.keys is None:
                raise DecryptionError(
                    f"{where.describe()} is encrypted (key {key_id!r}) and no encryption key "
                    "is configured: set encryption_keys or master_key (docs/encryption.md)"
                )
            key = await self.keys.key(where.namespace, key_id)
            header = f"{version}.{codec_name}.{key_id}"
            try:
                raw = _aesgcm(key).decrypt(_unb64(nonce, where), raw, where.associated_data(header))
            except Exception as exc:
                if isinstance(exc, KeyErasedError):
                    raise
                raise DecryptionError(
                    f"{where.describe()} does not decrypt with key {key_id!r}: the ciphertext "
                    "was written for another record, field or namespace, or was altered"
                ) from None
        elif self.require_encryption:
            raise EncryptionRequiredError(
                f"{where.describe()} is stored without encryption and require_encryption is "
                "set: re-save it with encryption on (`siglo rekey`)"
            )
        if codec_name.endswith("z"):
            self._compressor()
            raw = self._zd.decompress(raw)
        if reuse and codec_name[0] == "e":
            # The key it decrypted with: seal reuses the envelope only while that key is
            # the namespace's current one (after a rotation it encrypts anew).
            self.reused.put(where, f"{version}.{codec_name}.{key_id}", key, raw, envelope)
        return codec.loads(raw, what=where.describe())

    def key_id_of(self, value: Any) -> str | None:
        """The key id a sealed value was encrypted under (``None``: not encrypted)."""
        if not is_sealed(value):
            return None
        parts = value[SEALED_KEY].split(".")
        return parts[2] or None if len(parts) == 5 else None


def require_packages(*, encrypts: bool, compresses: bool) -> None:
    """Fail when the settings are read, not at the first save, when a codec they ask for
    lacks its package (the ``siglo[encryption]`` extra): an envelope key provider would
    otherwise first need it while wrapping a key, deep in a storage call, where a worker
    takes the failure for an outage and retries it."""
    needed = [("cryptography", "encryption")] if encrypts else []
    if compresses:
        needed.append(("zstandard", "compression"))
    for package, what in needed:
        try:
            __import__(package)
        except ImportError as exc:
            raise InvalidArgumentError(
                f"{what} needs the {package} package, which is not installed: "
                "pip install 'siglo[encryption]>=0.1,<1' (docs/encryption.md)"
            ) from exc


_CIPHERS: dict[bytes, Any] = {}
"""One AESGCM object per key: building one costs about as much as sealing 1 KB."""


def _aesgcm(key: bytes) -> Any:
    cipher = _CIPHERS.get(key)
    if cipher is not None:
        return cipher
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - the extra is a dependency
        raise InvalidArgumentError(
            "encryption needs the cryptography package: pip install 'siglo[encryption]>=0.1,<1'"
        ) from exc
    if len(_CIPHERS) > 1024:  # many namespaces: keep the cache bounded
        _CIPHERS.clear()
    cipher = _CIPHERS[key] = AESGCM(key)
    return cipher
