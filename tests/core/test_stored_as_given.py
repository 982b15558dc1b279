"""Two things siglo stores as given, as the docs say (docs/design.md, orjson's row;
docs/writing-a-backend.md, `siglo.codec.dumps`; docs/encryption.md, "What stays in
clear"): a float NaN or infinity, which JSON cannot hold, is stored as `null`; and a
document's fields siglo does not know are kept as they come, in clear under encryption.
"""

from __future__ import annotations

import base64
import math
import os
from pathlib import Path

import siglo
from siglo import codec
from siglo.checkpoint import Checkpoint
from siglo.config import Settings


async def test_a_nan_or_an_infinity_is_stored_as_null(tmp_path: Path) -> None:
    assert codec.dumps({"a": math.nan, "b": math.inf, "c": -math.inf}) == (
        b'{"a":null,"b":null,"c":null}'
    )
    async with siglo.connect(f"sqlite:///{tmp_path / 'nan.db'}") as backend:
        manager = siglo.StorageManager(backend)
        stack = manager.create_stack("s")
        stack.set("a", "ratio", math.nan)
        stack.set("a", "limit", math.inf)
        await stack.save()
        loaded = await manager.load_checkpoint("s")
        assert loaded is not None and loaded.contexts["a"] == {"ratio": None, "limit": None}


async def test_unknown_document_fields_stay_in_clear_under_encryption(tmp_path: Path) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    settings = Settings(encryption_keys={"k1": key}, require_encryption=True)
    async with siglo.connect(f"sqlite:///{tmp_path / 'extra.db'}", settings=settings) as backend:
        await backend.adapter.save_checkpoint(
            Checkpoint(
                stack_id="s",
                revision=1,
                timestamp=1,
                contexts={"a": {"ssn": "078-05-1120"}},
                extra={"otherWriter": "078-05-1120"},
            )
        )
        stored = await backend.raw_adapter.get_checkpoint("s")
        assert stored is not None
        assert stored.extra == {"otherWriter": "078-05-1120"}  # as given, in clear
        assert "078-05-1120" not in str(stored.contexts)  # the context is sealed
        opened = await backend.adapter.get_checkpoint("s")
        assert opened is not None and opened.extra == {"otherWriter": "078-05-1120"}
