"""Blob stores: where offloaded values live, by content hash (SPEC §13).

A blob is the compact JSON of one value, stored under the hex SHA-256 of those bytes, so
the same value is stored once however many checkpoints hold it, and a blob never changes.
Each blob has a *keep-until* time: a put sets it to at least now (and, for a cached step
output, to the end of the cache entry's life); the garbage collector
(:func:`siglo.offload.collect_blobs`) removes a blob that no live checkpoint references
once its keep-until is more than the grace period old.

Built in: :class:`DirectoryBlobStore` (``file:///path``: one file per blob, for SQLite and
development, and any shared file system) and :class:`MemoryBlobStore` (``memory://``:
this process only); :mod:`siglo.s3` adds an S3-compatible store (``s3://bucket/prefix``,
the ``siglo[s3]`` extra). :func:`open_blob_store` opens one from its URL.

A store used on behalf of a backend (:func:`siglo.connect`, ``siglo collect-blobs``) is
wrapped in :class:`BoundedBlobStore`: every call is bounded by the ``command_timeout_ms``
the backend was connected with, and a call past it raises siglo's timeout errors.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hashlib
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from siglo.errors import (
    InvalidArgumentError,
    OutcomeUnknownError,
    SigloError,
    StorageAdapterError,
    past_its_bound,
)
from siglo.plugins import get_registry
from siglo.plugins.backends import import_dotted
from siglo.urls import mask_credentials, refuse_unknown
from siglo.validation import ms_as_seconds

__all__ = [
    "BlobStore",
    "BoundedBlobStore",
    "DirectoryBlobStore",
    "MemoryBlobStore",
    "blob_digest",
    "bounded",
    "check_digest",
    "open_blob_store",
]

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


def blob_digest(data: bytes) -> str:
    """The name of a blob: the hex SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """``digest`` if it names a blob (64 lower-case hex digits), else
    :class:`~siglo.errors.InvalidArgumentError`."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidArgumentError(f"a blob digest is 64 lower-case hex digits, got {digest!r}")
    return digest


class BlobStore(abc.ABC):
    """Content-addressed blobs with a keep-until time (see the module)."""

    _shown_url: str = ""

    @property
    def url(self) -> str:
        """Where the store is, as messages and logs show it: a password in the user info
        or in a secret query parameter is masked (:func:`~siglo.urls.mask_credentials`)."""
        return self._shown_url

    @url.setter
    def url(self, url: str) -> None:
        # Masked when recorded, not when printed: every store (a plugin's too) names its
        # URL in its errors, and a timeout or failure must not print the password.
        self._shown_url = mask_credentials(url)

    @abc.abstractmethod
    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        """Store ``data`` under ``digest`` (its :func:`blob_digest`), or keep the blob
        already there; its keep-until becomes at least now and ``keep_until_ms``."""

    @abc.abstractmethod
    async def get(self, digest: str) -> bytes | None:
        """The blob's bytes, or ``None`` when there is no such blob."""

    @abc.abstractmethod
    async def delete(self, digest: str) -> bool:
        """Remove the blob; whether there was one."""

    @abc.abstractmethod
    def scan(self) -> AsyncIterator[tuple[str, int]]:
        """Every blob as ``(digest, keep_until_ms)``."""

    @abc.abstractmethod
    async def delete_stale(self, digest: str, kept_before_ms: int) -> bool:
        """Remove the blob if its keep-until is still before ``kept_before_ms`` (a put
        that refreshed it meanwhile keeps it); whether it was removed."""

    async def aclose(self) -> None:  # noqa: B027  (a hook: most stores hold nothing)
        """Release what the store holds (nothing, for the built-in ones)."""

    def use_bound(self, command_timeout_ms: int) -> float:
        """Be told the bound of every call (the backend's ``command_timeout_ms``) when
        wrapped in :class:`BoundedBlobStore`, and answer how many seconds past it a call
        may take. A store whose driver does not give up at a cancellation (psycopg waits
        up to 10 s for a stalled server to acknowledge one) ends its own calls at the
        bound, raising :class:`TimeoutError`, and is cancelled only as a backstop that
        much later. ``0``, for the others: they are cancelled at the bound."""
        return 0.0

    def use_grace(self, grace_ms: int) -> None:  # noqa: B027  (a hook: most ignore it)
        """Be told the collector's grace period (the settings' ``blob_grace_ms``) when
        opened for a backend; a store whose refresh of a blob is costly (S3) spaces its
        refreshes by it. Nothing, for the others."""


class MemoryBlobStore(BlobStore):
    """Blobs in this process's memory (tests, ``memory://`` backends)."""

    _shown_url = "memory://"

    def __init__(self) -> None:
        self._blobs: dict[str, tuple[bytes, int]] = {}

    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        check_digest(digest)
        now = int(time.time() * 1000)
        old = self._blobs.get(digest)
        keep = max(now, keep_until_ms or 0, old[1] if old else 0)
        self._blobs[digest] = (old[0] if old else bytes(data), keep)

    async def get(self, digest: str) -> bytes | None:
        found = self._blobs.get(check_digest(digest))
        return None if found is None else found[0]

    async def delete(self, digest: str) -> bool:
        return self._blobs.pop(check_digest(digest), None) is not None

    async def scan(self) -> AsyncIterator[tuple[str, int]]:
        for digest, (_, keep) in list(self._blobs.items()):
            yield digest, keep

    async def delete_stale(self, digest: str, kept_before_ms: int) -> bool:
        found = self._blobs.get(check_digest(digest))
        if found is None or found[1] >= kept_before_ms:
            return False
        del self._blobs[digest]
        return True


def _write_in_place(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it. The file is
    made by ``os.open`` with mode 0666, which the umask then narrows as for any file the
    process makes (``mkstemp`` would make it 0600: readable by its owner alone)."""
    temp = path.with_name(f".put-{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        # A write that failed (the disk full, a file size limit) leaves no partial file
        # behind: nothing would ever collect it.
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class DirectoryBlobStore(BlobStore):
    """One file per blob under ``root/<first two digits>/<digest>``; the file's
    modification time is its keep-until. A put writes a temporary file and renames it
    into place, so a reader never sees half a blob, and concurrent puts of the same
    digest (the same bytes) are harmless.

    Files are made with the mode the process's umask gives any new file (not
    ``mkstemp``'s 0600), so the accounts that share the store's directory (a group, a
    shared file system) read each other's blobs; a refresh of a blob another account
    wrote, whose time only its owner may set, writes the blob again in its place."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = self.root.resolve().as_uri()

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / check_digest(digest)

    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        await asyncio.to_thread(self._put, self._path(digest), data, keep_until_ms)

    def _put(self, path: Path, data: bytes, keep_until_ms: int | None) -> None:
        now = time.time()
        keep = max(now, (keep_until_ms or 0) / 1000)
        try:
            try:
                current = path.stat().st_mtime
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                _write_in_place(path, data)
                current = 0.0
            try:
                os.utime(path, (keep, max(keep, current)))
            except FileNotFoundError:
                current = -1.0
            except PermissionError:
                # Another account's file: only its owner may set its time. The same
                # bytes written again in its place are this account's.
                _write_in_place(path, data)
                os.utime(path, (keep, max(keep, current)))
            if current < 0 or not path.exists():
                # The collector took it between the look and the refresh: write it again
                # (same digest, same bytes), so the caller's reference never dangles.
                self._put(path, data, keep_until_ms)
        except OSError as exc:
            raise StorageAdapterError(
                f"blob store {self.url}: cannot write {path.name}: {exc}"
            ) from exc

    async def get(self, digest: str) -> bytes | None:
        path = self._path(digest)

        def read() -> bytes | None:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise StorageAdapterError(
                    f"blob store {self.url}: cannot read {path.name}: {exc}"
                ) from exc

        return await asyncio.to_thread(read)

    async def delete(self, digest: str) -> bool:
        path = self._path(digest)

        def remove() -> bool:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            return True

        return await asyncio.to_thread(remove)

    async def scan(self) -> AsyncIterator[tuple[str, int]]:
        def listing() -> list[tuple[str, int]]:
            if not self.root.is_dir():
                return []
            found = []
            for path in self.root.glob("??/*"):
                if _DIGEST.fullmatch(path.name):
                    try:
                        found.append((path.name, int(path.stat().st_mtime * 1000)))
                    except FileNotFoundError:  # collected meanwhile
                        continue
            return found

        for item in await asyncio.to_thread(listing):
            yield item

    async def delete_stale(self, digest: str, kept_before_ms: int) -> bool:
        path = self._path(digest)

        def remove() -> bool:
            # Moved aside first, then looked at again: a put that refreshed the blob after
            # the collector's scan shows in the moved file's time, and it goes back.
            doomed = path.with_name(f".doomed-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
            try:
                if path.stat().st_mtime * 1000 >= kept_before_ms:
                    return False
                os.rename(path, doomed)
            except FileNotFoundError:
                return False
            if doomed.stat().st_mtime * 1000 >= kept_before_ms:
                if path.exists():
                    doomed.unlink()
                else:
                    os.rename(doomed, path)
                return False
            doomed.unlink()
            return True

        return await asyncio.to_thread(remove)


class BoundedBlobStore(BlobStore):
    """``store`` with every call bounded by ``command_timeout_ms`` (the bound of the
    backend the store serves), as every storage call is.

    A call past the bound is abandoned (cancelled; a thread a file store started runs on)
    and raises: :class:`~siglo.errors.OutcomeUnknownError` for a call that changes the
    store (``put``, ``delete``, ``delete_stale``: it may have taken effect), and
    :class:`~siglo.errors.StorageAdapterError` saying it timed out for one that only
    reads (``get``, each page of ``scan``). Anything else passes through unchanged."""

    def __init__(self, store: BlobStore, command_timeout_ms: int) -> None:
        if type(command_timeout_ms) is not int or command_timeout_ms <= 0:
            raise InvalidArgumentError(
                f"command_timeout_ms must be a positive integer of milliseconds, "
                f"got {command_timeout_ms!r}"
            )
        self.inner = store
        self.url = store.url
        self.command_timeout_ms = command_timeout_ms
        # A store that ends its own calls at the bound is cancelled only past it.
        self._timeout_s = ms_as_seconds(command_timeout_ms) + store.use_bound(command_timeout_ms)

    def __getattr__(self, name: str) -> object:
        # What a store adds (an S3 store's refresh_ms, a file store's root) shows through.
        return getattr(self.inner, name)

    def _late(self, doing: str, writes: bool) -> StorageAdapterError:
        bound = f"command_timeout_ms={self.command_timeout_ms}"
        if writes:
            return past_its_bound(
                OutcomeUnknownError(
                    f"blob store {self.url}: {doing}",
                    f"timed out: not answered within its bound ({bound}), and the store "
                    "may have done it",
                )
            )
        return past_its_bound(
            StorageAdapterError(
                f"blob store {self.url} timed out {doing}: not answered within its bound "
                f"({bound}; a stalled server, or a lock held elsewhere)"
            )
        )

    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        check_digest(digest)  # bad input is refused as such, never as a timeout
        try:
            async with asyncio.timeout(self._timeout_s):
                await self.inner.put(digest, data, keep_until_ms=keep_until_ms)
        except TimeoutError as exc:
            raise self._late(f"a put of {digest}", writes=True) from exc

    async def get(self, digest: str) -> bytes | None:
        check_digest(digest)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self.inner.get(digest)
        except TimeoutError as exc:
            raise self._late(f"a get of {digest}", writes=False) from exc

    async def delete(self, digest: str) -> bool:
        check_digest(digest)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self.inner.delete(digest)
        except TimeoutError as exc:
            raise self._late(f"a delete of {digest}", writes=True) from exc

    async def delete_stale(self, digest: str, kept_before_ms: int) -> bool:
        check_digest(digest)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self.inner.delete_stale(digest, kept_before_ms)
        except TimeoutError as exc:
            raise self._late(f"a removal of {digest}", writes=True) from exc

    async def scan(self) -> AsyncIterator[tuple[str, int]]:
        items = self.inner.scan()
        try:
            while True:
                # Each step is bounded, not the whole walk (as a listing's pages are).
                try:
                    async with asyncio.timeout(self._timeout_s):
                        item = await anext(items)
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    raise self._late("a scan", writes=False) from exc
                yield item
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

    def use_grace(self, grace_ms: int) -> None:
        """Tell the wrapped store (:meth:`BlobStore.use_grace`)."""
        self.inner.use_grace(grace_ms)

    async def aclose(self) -> None:
        """Close the wrapped store (bounded too: a stalled server does not hold a close)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self.inner.aclose()
        except TimeoutError as exc:
            raise self._late("a close", writes=False) from exc


def bounded(store: BlobStore, command_timeout_ms: int | None) -> BlobStore:
    """``store`` bounded by ``command_timeout_ms`` (:class:`BoundedBlobStore`); ``None``
    (unbounded, as the backend is) returns it as it is."""
    if command_timeout_ms is None or isinstance(store, BoundedBlobStore):
        return store
    return BoundedBlobStore(store, command_timeout_ms)


_BY_SCHEME: Final[dict[str, str]] = {"s3": "siglo.s3:open_store"}
"""Blob stores of the core by URL scheme, ``"module:callable"`` taking the URL."""


def open_blob_store(url: str) -> BlobStore:
    """The blob store at ``url``: ``file:///path`` (a directory, made when first
    written), ``memory://``, ``s3://bucket/prefix?…`` (:mod:`siglo.s3`, the ``siglo[s3]``
    extra), or the URL of a backend whose plugin declares a blob store
    (``redis://…?prefix=app:``, ``postgresql://…?schema=app``; the driver is imported
    then). Anything else raises :class:`~siglo.errors.InvalidArgumentError` naming what
    is supported."""
    parts = urlsplit(url)
    if parts.fragment or url.endswith("#"):
        raise InvalidArgumentError(
            f"blob_url {mask_credentials(url)!r} has a fragment (#…): a blob store URL "
            "takes none (a `#` in a path is written %23)"
        )
    if parts.scheme in ("file", "memory") and (parts.scheme == "memory" or parts.path):
        # Neither takes an option: a typo is refused, not dropped.
        kind = "directory blob store" if parts.scheme == "file" else "memory blob store"
        refuse_unknown(url, (), backend=kind)
        if parts.scheme == "file":
            if parts.netloc not in ("", "localhost"):
                # file://./blobs is file:// + host "." + /blobs: the directory /blobs.
                raise InvalidArgumentError(
                    f"blob_url {mask_credentials(url)!r} names host {parts.netloc!r}: a "
                    "directory blob store is file:///absolute/path (three slashes)"
                )
            return DirectoryBlobStore(unquote(parts.path))
        if not parts.netloc and parts.path in ("", "/"):
            return MemoryBlobStore()
    opener = _BY_SCHEME.get(parts.scheme)
    if opener is not None:
        # Named, not imported: the module (and its driver) loads on first use.
        return import_dotted(opener)(url)  # type: ignore[no-any-return]
    try:
        spec = get_registry().for_url(url)
    except SigloError:
        spec = None
    factory = None if spec is None else spec.load_blob_store()
    if factory is None:
        raise InvalidArgumentError(
            f"blob_url {mask_credentials(url)!r} is not a blob store siglo knows: use "
            "file:///path/to/dir (a directory), memory:// (this process only), "
            "s3://bucket/prefix (an S3-compatible store), or a redis:// or postgresql:// URL"
        )
    store: BlobStore = factory(url)
    return store
