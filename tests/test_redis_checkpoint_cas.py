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
from _redis_helpers import redis_backend  # noqa: F401  (fixture)

import siglo
from siglo import Checkpoint
from siglo.backends.redis.adapter import RedisStorageAdapter
from siglo.backends.redis.scripts import CHECKPOINT_CAS

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


@pytest.mark.parametrize(("label", "data"), DOCUMENTS, ids=[label for label, _ in DOCUMENTS])
async def test_script_compares_with_the_decoded_revision(
    redis_backend: siglo.Backend,
    label: str,
    data: bytes,
) -> None:
    adapter = redis_backend.adapter
    assert isinstance(adapter, RedisStorageAdapter)
    key = adapter.keys.checkpoint(f"probe-{label}")
    await adapter._redis.set(key, data, px=60_000)
    new = Checkpoint(stack_id="s", revision=1, timestamp=NOW).to_json()
    # An expected revision nothing stores: the script reports what it compared with.
    reply = await adapter._redis.script(CHECKPOINT_CAS, [key], [new, 1, 123_456, NOW, 60_000])
    assert [int(x) for x in reply] == [0, _expected(data)]
    assert await adapter._redis.get(key) == data  # a conflict writes nothing
