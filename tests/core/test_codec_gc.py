"""codec.loads pauses the cyclic GC for large documents and always restores its state."""

from __future__ import annotations

import gc

import orjson
import pytest

from siglo import codec
from siglo.errors import MalformedRecordError

BIG = orjson.dumps({"items": [{"n": i, "s": "x" * 20} for i in range(5_000)]})


def test_big_document_decodes_and_gc_stays_enabled() -> None:
    assert len(BIG) >= codec.GC_PAUSE_MIN_BYTES
    assert gc.isenabled()
    assert codec.loads(BIG) == orjson.loads(BIG)
    assert gc.isenabled()


def test_gc_disabled_by_the_application_stays_disabled() -> None:
    gc.disable()
    try:
        assert codec.loads(BIG) == orjson.loads(BIG)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_malformed_big_document_raises_and_restores_gc() -> None:
    with pytest.raises(MalformedRecordError):
        codec.loads(BIG[:-1])
    assert gc.isenabled()
