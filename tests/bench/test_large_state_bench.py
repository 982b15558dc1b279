"""The large-state benchmark (`benchmarks/large_state.py`) measures what its docs say:
the documents of its latency rounds, and the bytes of a run (docs/benchmarks-large-state.md)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import large_state


def test_a_grown_document_changes_its_history_alone_and_its_length_every_save() -> None:
    first, second = large_state._grown_document(262_144, 1), large_state._grown_document(262_144, 2)
    assert len(first.to_json()) >= 262_144 - 16_384
    assert len(second.to_json()) > len(first.to_json())
    changed = [name for name in first.contexts if first.contexts[name] != second.contexts[name]]
    assert changed == ["c0"]


def test_a_replaced_context_keeps_the_document_length() -> None:
    docs = [large_state._document(262_144, r, (r - 1) % 16) for r in range(1, 4)]
    assert len({len(d.to_json()) for d in docs}) == 1
    changed = [n for n in docs[0].contexts if docs[0].contexts[n] != docs[1].contexts[n]]
    assert len(changed) == 2  # the one replaced now, and the one replaced before going back


@pytest.mark.parametrize("pattern", [None, "grow"])
@pytest.mark.parametrize("options", [{}, {"incremental_min_bytes": None}, {"reader": "cold"}])
def test_a_latency_round_on_sqlite_times_saves_and_loads(
    pattern: str | None, options: dict[str, object]
) -> None:
    got = asyncio.run(
        large_state.latency_round("sqlite", 262_144, 3, {**options, "pattern": pattern})
    )
    assert got["save_ms"] > 0 and got["load_ms"] > 0


@pytest.mark.parametrize("incremental", [True, False])
def test_bytes_per_run_counts_at_least_what_changed(incremental: bool) -> None:
    got = asyncio.run(large_state.bytes_per_run("sqlite", 200_000, incremental, steps=10))
    assert got["written"] >= got["changed"] > 0
    if incremental:
        assert got["ratio"] < 2.5
    else:  # every save sends the whole document: about steps / 2 times what changed
        assert got["ratio"] > 4
