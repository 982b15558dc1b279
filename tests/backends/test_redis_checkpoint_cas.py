"""The checkpoint compare-and-set script reads the stored revision as cjson would.

The script reads a revision off the document's opening text when the text proves it, and
decodes the document otherwise. Whatever the shape of what is stored, the revision the
script compares with must be the one a full decode gives (``-1``: none, or expired).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

import siglo
from siglo import Checkpoint
from siglo_redis.adapter import RedisStorageAdapter
from siglo_redis.scripts import CHECKPOINT_CAS

pytestmark = pytest.mark.rule("checkpoint.occ.conflict")

NOW = int(time.time() * 1000)


def _siglo_doc(**kwargs: Any) -> bytes:
    return Checkpoint(stack_id="s", revision=5, timestamp=NOW, **kwargs).to_json()


DOCUMENTS: list[tuple[str, bytes]] = [
    ("siglo's own", _siglo_doc(contexts={"step": {"x": 1, "y": "two"}})),
    ("siglo's own, revision 0", Checkpoint(stack_id="s", revision=0, timestamp=NOW).to_json()),
    ("nested revision keys", _siglo_doc(contexts={"a": {"revision": 99}})),
    ("expired", _siglo_doc(expires_at=NOW - 1_000)),
    ("expires later", _siglo_doc(expires_at=NOW + 60_000)),
    ("workflow id and namespace", _siglo_doc(workflow_id="w", namespace="n")),
    ("escaped stack id", Checkpoint(stack_id='a"b\\c', revision=5, timestamp=NOW).to_json()),
    ("revision first", b'{"revision":8,"version":2,"stackId":"s","contexts":{}}'),
    ("revision last", b'{"version":2,"stackId":"s","contexts":{"a":{}},"revision":9}'),
    ("duplicate revision", b'{"version":2,"revision":1,"contexts":{},"revision":7}'),
    ("duplicate, escaped", b'{"version":2,"revision":1,"r\\u0065vision":6}'),
    ("escaped expiry", b'{"revision":4,"expires\\u0041t":1}'),
    ("expiry null", b'{"revision":4,"expiresAt":null}'),
    ("negative number before", b'{"offset":-3,"revision":12}'),
    ("float revision", b'{"version":2,"revision":3.0}'),
    ("revision before a nested object", b'{"revision":2,"contexts":{"revision":{}}}'),
]


def _expected(data: bytes) -> int:
    doc = orjson.loads(data)
    expires = doc.get("expiresAt")
    if isinstance(expires, int) and expires <= NOW:
        return -1
    return int(doc["revision"])


NEW = Checkpoint(stack_id="s", revision=1, timestamp=NOW).to_json()


async def _stored(backend: siglo.Backend, name: str, data: bytes) -> tuple[Any, str]:
    """The adapter, and the key of a checkpoint stored as ``data`` (any text at all)."""
    adapter = backend.adapter
    assert isinstance(adapter, RedisStorageAdapter)
    key = adapter.keys.checkpoint(name)
    await adapter._redis.set(key, data, px=60_000)
    return adapter, key


async def _cas(adapter: Any, key: str, revision: int, expected: int | str = "") -> list[int]:
    """The script's reply to saving ``NEW`` at ``revision`` ('' expected: a plain save)."""
    reply = int(
        await adapter._redis.script(CHECKPOINT_CAS, [key], [NEW, revision, expected, NOW, 60_000])
    )
    # The script answers with one integer: 1 stored, 2 exact path, else -2 - stored.
    return [reply] if reply in (1, 2) else [0, -2 - reply]


@pytest.mark.parametrize(("label", "data"), DOCUMENTS, ids=[label for label, _ in DOCUMENTS])
async def test_script_compares_with_the_decoded_revision(
    redis_backend: siglo.Backend,
    label: str,
    data: bytes,
) -> None:
    adapter, key = await _stored(redis_backend, f"probe-{label}", data)
    # An expected revision nothing stores: the script reports what it compared with.
    assert await _cas(adapter, key, 1, expected=123_456) == [0, _expected(data)]
    assert await adapter._redis.get(key) == data  # a conflict writes nothing


DUPLICATES = {"duplicate revision", "duplicate, escaped"}


@pytest.mark.parametrize(
    ("label", "data"),
    [d for d in DOCUMENTS if d[0] not in DUPLICATES],
    ids=[label for label, _ in DOCUMENTS if label not in DUPLICATES],
)
async def test_a_plain_save_moves_forward_from_the_decoded_revision_only(
    redis_backend: siglo.Backend,
    label: str,
    data: bytes,
) -> None:
    # A plain save may be decided by the document's opening alone (GETRANGE), and only
    # when it moves forward; every refusal reads the whole document.
    adapter, key = await _stored(redis_backend, f"plain-{label}", data)
    decoded = _expected(data)
    if decoded >= 0:
        assert await _cas(adapter, key, decoded) == [0, decoded]
        assert await adapter._redis.get(key) == data
    assert await _cas(adapter, key, decoded + 1) == [1]
    assert await adapter._redis.get(key) == NEW


async def test_a_repeated_revision_key_is_judged_by_its_first_for_a_forward_save(
    redis_backend: siglo.Backend,
) -> None:
    # No JSON encoder writes a repeated key (RFC 8259 leaves reading one to the reader).
    # A plain save moving forward from the first occurrence is decided by the opening,
    # so it replaces the document; anything else reads the whole text, where cjson (and
    # orjson on load) take the last occurrence. Documented in docs/backends/redis.md.
    data = dict(DOCUMENTS)["duplicate revision"]  # revision 1, then revision 7
    adapter, key = await _stored(redis_backend, "repeated", data)
    assert await _cas(adapter, key, 1) == [0, 7]
    assert await _cas(adapter, key, 2) == [1]
