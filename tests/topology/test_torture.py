"""The short part of the torture run (tests/support/torture.py) in the default test run: a few
processes contending on every shared backend, fuzzed documents, redaction on raw bytes.
The long run, with injected faults, is one command: ``python tests/support/torture.py``
(docs/reliability.md)."""

from __future__ import annotations

import pytest
from torture import anomalies, fuzz_decoders, run_backend


def test_fuzzed_documents_give_only_malformed_record_errors() -> None:
    result = fuzz_decoders(2_000)
    assert result["wrong_errors"] == 0, result["outcomes"]


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
async def test_short_torture_run(kind: str) -> None:
    if kind == "postgres":
        from sql_support import require_postgres

        require_postgres()
    if kind == "redis":
        from _redis_helpers import require_redis

        require_redis()
    result = await run_backend(kind, processes=2, ops=100, fuzz=30, with_faults=False)
    contention = result["contention"]
    assert contention["lost"] == contention["double"] == contention["overlap"] == 0, contention
    assert contention["unbounded"] == 0, contention
    assert contention["errors"] == {}, contention
    assert result["redaction"]["secrets_found"] == 0
    assert anomalies(result) == 0, result
