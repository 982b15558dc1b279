"""The SQL backends store a checkpoint's wire document byte for byte (``wire.checkpoint``):
what a TypeScript worker wrote is what it reads back, unknown fields and key order
included. The contract suite compares decoded values; the bytes are checked here."""

from __future__ import annotations

import pytest
from sql_support import KINDS, open_backend

from siglo import Checkpoint

DOCUMENT = (
    b'{"version":2,"schemaVersion":"2.0.0","stackId":"s","type":"execution",'
    b'"status":"waiting","revision":3,"chains":["a","b"],"contexts":{"a":{"x":[1,{}]}},'
    b'"timestamp":5,"metadata":{"k":null},"futureField":{"z":1}}'
)


@pytest.mark.rule("wire.checkpoint")
@pytest.mark.parametrize("kind", KINDS)
async def test_checkpoint_document_bytes_survive_a_round_trip(kind: str) -> None:
    async with open_backend(kind) as backend:
        cp = Checkpoint.from_json(DOCUMENT)
        await backend.adapter.save_checkpoint(cp)
        got = await backend.adapter.get_checkpoint("s")
        assert got is not None
        assert got.to_json() == DOCUMENT
        assert got.extra == {"futureField": {"z": 1}}
