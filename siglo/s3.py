"""Offloaded values in an S3-compatible object store (``blob_url = "s3://bucket/prefix"``),
through `obstore <https://developmentseed.org/obstore/>`_ (the ``siglo[s3]`` extra; SPEC
§13, :mod:`siglo.blobs`).

One object a blob, ``<prefix>/<sha256>``. S3 cannot change an object's metadata in place,
and a conditional request (``If-Match``) compares ETags, which for a plain upload are the
MD5 of the body: a re-put of the same bytes would keep the ETag, and the collector could
not see that a put refreshed the blob. So the object's body is one header line, the
keep-until in milliseconds, then the blob's bytes, and the keep-until is also in the
object's metadata (``x-amz-meta-siglo-keep-until``), which a ``HEAD`` reads. Every
refresh then changes the body, hence the ETag, and every change is a conditional put:

- a put of a new blob is ``If-None-Match: *`` (create); of a stored one whose keep-until
  is already late enough (or, with ``refresh_ms``, less than that far behind now),
  nothing; otherwise a re-put of the body with the later keep-until, ``If-Match`` the
  ETag it looked at (S3 has no copy-in-place that could change the body; the blob's bytes
  are sent again);
- :meth:`S3BlobStore.delete_stale` replaces a stale blob by a *doomed* marker, ``If-Match``
  the ETag whose keep-until it found stale (so a put that refreshed the blob meanwhile
  makes it fail and keeps the blob), then deletes the marker. S3 deletes are
  unconditional through obstore, so a put that finds a marker does not overwrite it: it
  waits for the collector's delete and creates the blob again. A collector that died
  between the two steps leaves its marker: a put takes it over after ``takeover_ms``
  (60 s) of seeing the same marker, and a collector sends its delete only within a third
  of that after it started the marker's put. The guarantee on real S3 and on the
  emulator the tests use is in docs/large-state.md.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from siglo import urls
from siglo.blobs import BlobStore, check_digest
from siglo.errors import DriverNotInstalledError, InvalidArgumentError, StorageAdapterError

if TYPE_CHECKING:
    from obstore.store import S3Store

__all__ = ["DEFAULT_TAKEOVER_MS", "REFRESH_SHARE", "S3BlobStore", "open_store"]

_INSTALL: Final = "pip install 'siglo[s3]>=0.1,<1'"
DEFAULT_TAKEOVER_MS: Final = 60_000
"""How long a put waits on a collector's doomed marker before it takes the marker over."""

REFRESH_SHARE: Final = 4
"""An S3 store opened for a backend refreshes a blob at most every ``blob_grace_ms /
REFRESH_SHARE`` (:meth:`S3BlobStore.use_grace`)."""
_NAME: Final = re.compile(r"[0-9a-f]{64}")  # a blob's object; anything else is not ours
_KEEP: Final = "siglo-keep-until"
_DOOMED: Final = "siglo-doomed"
_POLL_S: Final = 0.05
# HEADs at a time while scanning: the keep-until is not in a listing.
_SCAN_CONCURRENCY: Final = 16

OPTIONS: Final[dict[str, urls.Converter]] = {
    "endpoint": urls.text,
    "region": urls.text,
    "access_key_id": urls.text,
    "secret_access_key": urls.text,
    "session_token": urls.text,
    "allow_http": urls.boolean,
    "takeover_ms": urls.integer,
    "refresh_ms": urls.integer,
}


@dataclass(frozen=True, slots=True)
class _Found:
    """What a ``HEAD`` of a blob's object says."""

    etag: str | None
    keep_until_ms: int
    doomed: bool
    foreign: bool = False
    """An object under a digest's name that siglo did not write (no keep-until in its
    metadata): never listed as a blob, never collected."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


class S3BlobStore(BlobStore):
    """Blobs under ``prefix`` in ``bucket`` of an S3-compatible store (see the module).

    ``store`` is an :class:`obstore.store.S3Store`; ``url`` is what the store shows of
    itself (credentials masked)."""

    def __init__(
        self,
        store: S3Store,
        url: str,
        *,
        takeover_ms: int = DEFAULT_TAKEOVER_MS,
        refresh_ms: int | None = None,
    ) -> None:
        if takeover_ms < 3:
            raise InvalidArgumentError(f"takeover_ms must be >= 3, got {takeover_ms!r}")
        if refresh_ms is not None and refresh_ms < 0:
            raise InvalidArgumentError(f"refresh_ms must be >= 0, got {refresh_ms!r}")
        self._store = store
        self.url = url
        self.takeover_ms = takeover_ms
        # A put leaves a stored blob alone while its keep-until is less than this behind
        # now (0: every put raises it to now, as every store does): a refresh uploads the
        # blob again, and the collector's grace period covers the difference. Not given,
        # it is 0 until use_grace derives it from the grace period.
        self.refresh_ms = 0 if refresh_ms is None else refresh_ms
        self._refresh_given = refresh_ms is not None
        # When this store first saw each doomed marker (its ETag, monotonic seconds), kept
        # across puts: a put bounded by command_timeout_ms (shorter than takeover_ms) that
        # gives up on a marker left behind is retried, and the retry must not start the
        # wait again, or the marker would never be taken over.
        self._markers: dict[str, tuple[str | None, float]] = {}

    def use_grace(self, grace_ms: int) -> None:
        """Unless the URL named ``refresh_ms``: a quarter of the collector's grace period
        (``blob_grace_ms``), so a blob is uploaded again at most that often and a save
        has three quarters of the grace period to store its reference (the condition in
        docs/large-state.md)."""
        if not self._refresh_given:
            self.refresh_ms = grace_ms // REFRESH_SHARE

    async def _call(self, doing: str, awaitable: Any) -> Any:
        from obstore import exceptions as errors

        try:
            return await awaitable
        except (errors.BaseError, OSError) as exc:
            # The answers a caller acts on pass through; anything else is a failure.
            passes = (
                FileNotFoundError,
                errors.NotFoundError,
                errors.AlreadyExistsError,
                errors.PreconditionError,
            )
            if isinstance(exc, passes):
                raise
            raise StorageAdapterError(f"blob store {self.url}: {doing} failed: {exc}") from exc

    async def _look(self, digest: str) -> _Found | None:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            head = await self._call(
                "a look", obstore.get_async(self._store, digest, options={"head": True})
            )
        except (FileNotFoundError, NotFoundError):
            return None
        meta, attributes = head.meta, head.attributes
        if meta["e_tag"] is None:
            # Without an ETag no put or removal here can be conditional.
            raise StorageAdapterError(
                f"blob store {self.url}: the store sent no ETag for {digest}; the S3 blob "
                "store needs a store with ETags and conditional puts (If-Match)"
            )
        doomed = attributes.get(_DOOMED)
        if doomed is not None:
            # A marker's time is when the collector wrote it (its clock, in ms).
            return _Found(meta["e_tag"], int(doomed) if doomed.isdigit() else 0, True)
        keep = attributes.get(_KEEP)
        if keep is None or not keep.isdigit():
            # An object under a digest's name that siglo did not write (the prefix shared
            # with another tool): its time is all we know of it.
            return _Found(meta["e_tag"], _ms(meta["last_modified"]), False, foreign=True)
        return _Found(meta["e_tag"], int(keep), False)

    async def _write(self, digest: str, body: bytes, attributes: dict[str, str], mode: Any) -> bool:
        """One conditional put; ``False`` when its condition does not hold."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

        try:
            await self._call(
                "a put",
                obstore.put_async(
                    self._store,
                    digest,
                    body,
                    attributes=attributes,
                    mode=mode,
                    # One request: a conditional put is not a multipart upload.
                    use_multipart=False,
                ),
            )
        except (AlreadyExistsError, PreconditionError, NotFoundError, FileNotFoundError):
            return False
        return True

    async def _remove(self, digest: str) -> None:
        import obstore

        # obstore starts a request when its coroutine is made: made here, sent here.
        await self._call("a delete", obstore.delete_async(self._store, digest))

    async def put(self, digest: str, data: bytes, *, keep_until_ms: int | None = None) -> None:
        check_digest(digest)
        now = _now_ms()
        want = max(now, keep_until_ms or 0)
        enough = max(now - self.refresh_ms, keep_until_ms or 0)
        body = b"%d\n" % want + bytes(data)
        attributes = {_KEEP: str(want)}
        while True:
            found = await self._look(digest)
            if found is None or not found.doomed:
                self._markers.pop(digest, None)
            if found is None:
                if await self._write(digest, body, attributes, "create"):
                    return
                continue
            if found.foreign:
                raise StorageAdapterError(
                    f"blob store {self.url}: object {digest} is not a blob siglo wrote (no "
                    "keep-until in its metadata), and siglo does not overwrite it: give "
                    "the blob store a prefix of its own (s3://bucket/prefix)"
                )
            if not found.doomed:
                if found.keep_until_ms >= enough:
                    return
                if await self._write(digest, body, attributes, {"e_tag": found.etag}):
                    return
                continue
            # A collector is removing it: let it finish, then write the blob again.
            seen = time.monotonic()
            marker = self._markers.get(digest)
            if marker is None or marker[0] != found.etag:
                self._markers[digest] = (found.etag, seen)
            elif (seen - marker[1]) * 1000 >= self.takeover_ms:
                # The collector stopped between its marker and its delete.
                if await self._write(digest, body, attributes, {"e_tag": found.etag}):
                    self._markers.pop(digest, None)
                    return
                continue
            await asyncio.sleep(_POLL_S)

    async def get(self, digest: str) -> bytes | None:
        import obstore
        from obstore.exceptions import NotFoundError

        check_digest(digest)
        try:
            result = await self._call("a get", obstore.get_async(self._store, digest))
            body = bytes(await self._call("a get", result.bytes_async()))
        except (FileNotFoundError, NotFoundError):
            return None
        if _DOOMED in result.attributes:
            return None
        header, newline, data = body.partition(b"\n")
        if not newline or not header.isdigit():
            raise StorageAdapterError(
                f"blob store {self.url}: object {digest} is not a blob siglo wrote "
                "(no keep-until line)"
            )
        return data

    async def delete(self, digest: str) -> bool:
        found = await self._look(check_digest(digest))
        if found is None or found.foreign:
            return False
        await self._remove(digest)
        return not found.doomed

    async def delete_stale(self, digest: str, kept_before_ms: int) -> bool:
        found = await self._look(check_digest(digest))
        if found is None or found.foreign:
            return False  # not a blob: another tool's object is not siglo's to remove
        if not found.doomed and found.keep_until_ms >= kept_before_ms:
            return False
        started = time.monotonic()
        doomed_at = str(_now_ms())
        marker = b"doomed " + doomed_at.encode() + b"\n"
        if not await self._write(digest, marker, {_DOOMED: doomed_at}, {"e_tag": found.etag}):
            return False  # a put refreshed it (or another collector took it) meanwhile
        # Compared as ``3 × elapsed > takeover_ms``: ``takeover_ms / 3`` of an int too
        # large for a float overflows.
        if (time.monotonic() - started) * 3000 > self.takeover_ms:
            # Too late to be sure no put has taken the marker over: leave it to a put or
            # to the next collection.
            return False
        await self._remove(digest)
        return not found.doomed

    async def scan(self) -> AsyncIterator[tuple[str, int]]:
        import obstore

        limit = asyncio.Semaphore(_SCAN_CONCURRENCY)

        async def look(digest: str) -> tuple[str, int] | None:
            async with limit:
                found = await self._look(digest)
            if found is None or found.foreign:
                return None
            if found.doomed:
                # A marker a collector left: stale once a put could take it over.
                abandoned = found.keep_until_ms + self.takeover_ms < _now_ms()
                return (digest, 0) if abandoned else None
            return digest, found.keep_until_ms

        stream = obstore.list(self._store, chunk_size=1_000)
        while True:
            try:
                page = await self._call("a scan", stream.__anext__())
            except StopAsyncIteration:
                return
            names = [meta["path"] for meta in page if _NAME.fullmatch(meta["path"])]
            for item in await asyncio.gather(*(look(name) for name in names)):
                if item is not None:
                    yield item


def open_store(url: str) -> S3BlobStore:
    """The store at ``s3://bucket/prefix?endpoint=…&region=…`` (see docs/large-state.md).

    Credentials come from the URL (``access_key_id``, ``secret_access_key``,
    ``session_token``) or, as for any AWS client, from the environment
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
    ``AWS_REGION``, ``AWS_ENDPOINT_URL``, and the container or instance credentials)."""
    shown = urls.mask_credentials(url)
    try:
        from obstore.store import S3Store
    except ImportError:
        raise DriverNotInstalledError(
            f"blob store {shown} needs obstore, which is not installed: {_INSTALL}"
        ) from None
    urls.refuse_unknown(url, OPTIONS, backend="s3 blob store")
    base, options = urls.split_options(url, OPTIONS)
    bucket, _, prefix = base.removeprefix("s3://").partition("/")
    if not base.startswith("s3://") or not bucket:
        raise InvalidArgumentError(f"an S3 blob_url is s3://bucket[/prefix][?options], got {shown}")
    if "@" in bucket:
        # A bucket name has no "@": this is user info, which S3 URLs do not use.
        raise InvalidArgumentError(
            f"blob store {shown}: an S3 URL carries no user info; give the credentials as "
            "the options access_key_id and secret_access_key (or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY in the environment)"
        )
    takeover_ms = options.pop("takeover_ms", DEFAULT_TAKEOVER_MS)
    refresh_ms = options.pop("refresh_ms", None)
    # A plain-http endpoint in the URL allows http (an emulator on loopback); otherwise
    # the option, else AWS_ALLOW_HTTP, else https only.
    if "allow_http" not in options and str(options.get("endpoint", "")).startswith("http:"):
        options["allow_http"] = True
    client: dict[str, Any] = {}
    if "allow_http" in options:
        client["allow_http"] = options.pop("allow_http")
    try:
        store = S3Store(
            bucket,
            prefix=prefix.strip("/") or None,
            config=options,  # type: ignore[arg-type]
            client_options=client or None,  # type: ignore[arg-type]
        )
    except Exception as exc:  # obstore's configuration errors have no common base
        raise InvalidArgumentError(f"blob store {shown}: {exc}") from None
    return S3BlobStore(store, shown, takeover_ms=takeover_ms, refresh_ms=refresh_ms)
