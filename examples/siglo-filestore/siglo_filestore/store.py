"""The file store: a directory of JSON files, one per checkpoint and per cached step.

Every operation takes an exclusive ``flock`` on ``DIR/.lock`` and reads and writes
without awaiting in between, so each compare-and-set is atomic across tasks and
processes. File names are SHA-256 digests of the ids, so any id (``:``, ``*``, ``/``,
unicode, 1,000 characters) is data, never a path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from siglo import (
    MISSING,
    Backend,
    Capability,
    Checkpoint,
    CheckpointConflictError,
    Clock,
    InvalidArgumentError,
    StorageAdapter,
    StorageAdapterError,
    codec,
)
from siglo.clock import system_clock
from siglo.sentinel import Missing
from siglo.settings import DEFAULTS
from siglo.urls import mask_credentials, refuse_unknown
from siglo.validation import require_ttl_ms

__all__ = ["FileStorageAdapter", "connect", "isolated"]


def _digest(*parts: str | None) -> str:
    return hashlib.sha256(codec.dumps(list(parts))).hexdigest()


class FileStorageAdapter(StorageAdapter):
    """Checkpoints and step cache in files; expiry by the injected clock."""

    name: ClassVar[str] = "filestore"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.CHECKPOINTS, Capability.STEP_CACHE, Capability.CLOCK}
    )

    def __init__(
        self,
        root: Path,
        *,
        clock: Clock | None = None,
        checkpoint_ttl_ms: int | None = None,
        cache_ttl_ms: int = DEFAULTS.cache_ttl_ms,
    ) -> None:
        self.root = root
        self.clock = clock or system_clock
        self.checkpoint_ttl_ms = require_ttl_ms(
            "checkpoint_ttl_ms", checkpoint_ttl_ms, optional=True
        )
        self.cache_ttl_ms = require_ttl_ms("cache_ttl_ms", cache_ttl_ms)
        for sub in ("checkpoints", "cache"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    # -- files ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            with open(self.root / ".lock", "a+b") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
        except OSError as exc:
            raise StorageAdapterError(f"filestore {self.root}: {exc}") from exc

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        doc: dict[str, Any] = codec.loads(data, what=f"filestore entry {path.name}")
        return doc

    def _live(self, path: Path, now: int) -> dict[str, Any] | None:
        doc = self._read(path)
        if doc is None or (doc["goneAt"] is not None and now >= doc["goneAt"]):
            return None
        return doc

    def _write(self, path: Path, doc: dict[str, Any]) -> None:
        # Write then rename: a reader never sees half a file.
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(codec.dumps(doc))
        os.replace(tmp, path)

    def _checkpoint_path(self, namespace: str | None, stack_id: str) -> Path:
        return self.root / "checkpoints" / f"{_digest(namespace, stack_id)}.json"

    # -- checkpoints -----------------------------------------------------------------------

    async def _do_save_checkpoint(
        self, checkpoint: Checkpoint, *, expected_revision: int | None = None
    ) -> None:
        path = self._checkpoint_path(checkpoint.namespace, checkpoint.stack_id)
        with self._locked():
            now = self.clock.now_ms()
            current = self._live(path, now)
            revision = None if current is None else Checkpoint.from_wire(current["doc"]).revision
            if expected_revision is not None:
                won = (revision or 0) == expected_revision
            else:
                won = revision is None or checkpoint.revision > revision
            if not won:
                raise CheckpointConflictError(
                    checkpoint.stack_id, revision, expected_revision, checkpoint.revision
                )
            limits = [
                t
                for t in (
                    checkpoint.expires_at,
                    None if self.checkpoint_ttl_ms is None else now + self.checkpoint_ttl_ms,
                )
                if t is not None
            ]
            self._write(path, {"doc": checkpoint.to_wire(), "goneAt": min(limits, default=None)})

    async def _do_get_checkpoint(
        self, stack_id: str, namespace: str | None = None, *, fallback: bool = True
    ) -> Checkpoint | None:
        with self._locked():
            now = self.clock.now_ms()
            found = self._live(self._checkpoint_path(namespace, stack_id), now)
            if found is None and namespace is not None and fallback:
                found = self._live(self._checkpoint_path(None, stack_id), now)
        return None if found is None else Checkpoint.from_wire(found["doc"])

    async def _do_clean_expired_checkpoints(self) -> int:
        removed = 0
        with self._locked():
            now = self.clock.now_ms()
            for path in (self.root / "checkpoints").glob("*.json"):
                doc = self._read(path)
                if doc is not None and doc["goneAt"] is not None and now >= doc["goneAt"]:
                    path.unlink()
                    removed += 1
        return removed

    # -- step cache ------------------------------------------------------------------------

    async def _do_get_cached_step(self, key: str) -> Any | Missing:
        with self._locked():
            doc = self._live(self.root / "cache" / f"{_digest(key)}.json", self.clock.now_ms())
        return MISSING if doc is None else doc["value"]

    async def _do_set_cached_step(self, key: str, value: Any, ttl_ms: int | None = None) -> None:
        codec.dumps(value, what=f"cached value of {key!r}")  # reject non-JSON before writing
        with self._locked():
            gone_at = self.clock.now_ms() + (ttl_ms or self.cache_ttl_ms)
            self._write(
                self.root / "cache" / f"{_digest(key)}.json", {"value": value, "goneAt": gone_at}
            )


def _root(url: str) -> Path:
    parts = urlsplit(url)
    if parts.scheme != "filestore" or not parts.path:
        shown = mask_credentials(url)
        raise InvalidArgumentError(f"expected filestore:///path/to/dir, got {shown!r}")
    # This store reads no option from its URL: a query parameter would be ignored, so
    # it is refused, naming it (as every built-in backend does).
    refuse_unknown(url, (), backend="filestore", also="pass options as keyword arguments")
    return Path(unquote(parts.path))


_OPTIONS = frozenset({"clock", "checkpoint_ttl_ms", "cache_ttl_ms"})
"""The options :func:`connect` takes."""


def connect(
    url: str,
    *,
    clock: Clock | None = None,
    checkpoint_ttl_ms: int | None = None,
    cache_ttl_ms: int = DEFAULTS.cache_ttl_ms,
) -> Backend:
    """A backend on the directory of ``filestore:///path``.

    Its options are the ones named here: the contract suite passes only those, and
    ``siglo.connect`` refuses any other by name (a typo in a siglo.toml's
    ``[options]`` included) before calling this.
    """
    root = _usable_root(url)
    adapter = FileStorageAdapter(
        root, clock=clock, checkpoint_ttl_ms=checkpoint_ttl_ms, cache_ttl_ms=cache_ttl_ms
    )
    return Backend(name="filestore", url=url, adapter=adapter)


def _usable_root(url: str) -> Path:
    """The URL's directory, made if it is not there: a directory that cannot be made (or
    a path that is a file) is one clear error, not an ``OSError`` from deep inside."""
    root = _root(url)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(
            f"the filestore directory {str(root)!r} cannot be made: {exc.strerror or exc}"
        ) from None
    return root


@contextlib.asynccontextmanager
async def isolated(url: str, **options: Any) -> AsyncIterator[Backend]:
    """A backend on a fresh directory inside the URL's, removed afterwards (for the
    suite). The URL is read as :func:`connect` reads it, and refused where it refuses
    it: `siglo check` must not pass a URL a user cannot connect with."""
    root = tempfile.mkdtemp(prefix="siglo-filestore-", dir=_usable_root(url))
    # The suite's options this store has (it passes one set to every backend).
    backend = connect(f"filestore://{root}", **{k: options[k] for k in _OPTIONS & set(options)})
    try:
        yield backend
    finally:
        await backend.aclose()
        shutil.rmtree(root, ignore_errors=True)
