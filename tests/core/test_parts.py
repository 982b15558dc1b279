"""siglo.parts: a checkpoint cut into a skeleton and its context bodies (SPEC §13). The
split read off the document a save encoded anyway (recognising the bodies saved last)
gives exactly what encoding every part again gives, and assembles back to the document."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siglo import Checkpoint
from siglo.errors import MalformedRecordError
from siglo.parts import BodyCache, _split_encoded, assemble, split

pytestmark = pytest.mark.rule("checkpoint.incremental")

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_contexts = st.dictionaries(
    st.text(max_size=6), st.dictionaries(st.text(max_size=4), _values, max_size=3), max_size=6
)


def _cp(revision: int, contexts: dict[str, Any], **extra: Any) -> Checkpoint:
    return Checkpoint(
        stack_id="s", revision=revision, timestamp=revision, contexts=contexts, **extra
    )


@settings(max_examples=150, deadline=None)
@given(
    first=_contexts,
    second=_contexts,
    metadata=st.none() | st.dictionaries(st.text(max_size=3), _values, max_size=2),
)
def test_the_split_read_off_the_document_is_the_encoded_split(
    first: dict[str, Any], second: dict[str, Any], metadata: dict[str, Any] | None
) -> None:
    cache = BodyCache()
    for revision, contexts in ((1, first), (2, {**first, **second}), (3, second)):
        cp = _cp(revision, contexts, metadata=metadata)
        plain = split(cp)
        found = _split_encoded(cp, b"row", cache)
        assert found == plain
        assert assemble(plain.skeleton, plain.parts, plain.bodies) == cp.to_json()


def test_a_context_that_changed_is_encoded_again() -> None:
    cache = BodyCache()
    cache.digest(b"row", "n", orjson.dumps({"a": 1}))
    cp = _cp(2, {"n": {"a": 1, "b": 2}, "m": {"a": [1]}})
    assert _split_encoded(cp, b"row", cache) == split(cp)


def test_a_document_in_another_encoding_keeps_its_bytes() -> None:
    # A checkpoint decoded from another writer's text keeps that text as its document (a
    # whole save stores it): split in parts, it assembles back to the same bytes.
    text = (
        b'{"version":2, "schemaVersion":"2.0.0","stackId":"s","type":"workflow",'
        b'"status":"running","revision":1,"chains":[],"contexts":{"a":{"x":1}},"timestamp":1}'
    )
    cp = Checkpoint.from_json(text)
    assert cp.to_json() == text
    cut = split(cp, b"row", BodyCache())
    assert assemble(cut.skeleton, cut.parts, cut.bodies) == text


def test_the_bodies_kept_are_those_of_the_digests_named() -> None:
    # A load assembles from the bodies kept only where each digest the row names is the
    # one kept for its step; evicting a row's last body forgets the row.
    cache = BodyCache(max_bytes=40)
    cp = _cp(1, {"a": {"x": "1" * 10}, "b": {"x": "2" * 10}})
    cut = split(cp, b"row", cache)
    assert cache.holds(b"row") and not cache.holds(b"other")
    found = cache.bodies(b"row", cut.parts)
    assert found == cut.bodies
    assert assemble(cut.skeleton, cut.parts, found) == cp.to_json()
    changed = split(_cp(2, {"a": {"x": "3" * 10}, "b": {"x": "2" * 10}}))
    assert cache.bodies(b"row", changed.parts) is None  # "a" is another body
    assert cache.bodies(b"other", cut.parts) is None
    split(_cp(1, {"c": {"x": "4" * 20}}), b"other", cache)  # evicts both of "row"
    assert not cache.holds(b"row") and cache.holds(b"other")


def test_the_bodies_kept_are_bounded_to_64_mib_by_default() -> None:
    # docs/large-state.md: "up to 64 MiB, the least recently used going first".
    assert BodyCache().max_bytes == 64 * 1024 * 1024


@settings(max_examples=100, deadline=None)
@given(first=_contexts, second=_contexts)
def test_a_load_assembles_what_assemble_does_and_keeps_the_bodies(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    # BodyCache.assemble (a load that read the bodies) makes the document assemble makes
    # and keeps each body for its step, as keep does; BodyCache.document (a load that
    # read the row alone) makes it from the bodies kept, or None when one is not kept.
    saved, loaded = _cp(1, first), _cp(2, {**first, **second})
    cut = split(loaded)
    cache = BodyCache()
    split(saved, b"row", cache)
    assert cache.assemble(b"row", cut.skeleton, cut.parts, cut.bodies) == loaded.to_json()
    assert cache.document(b"row", cut.skeleton, cut.parts) == loaded.to_json()
    assert cache.bodies(b"row", cut.parts) == cut.bodies
    other = BodyCache()
    other.keep(b"row", cut.parts, cut.bodies)
    assert other.document(b"row", cut.skeleton, cut.parts) == loaded.to_json()
    nothing_kept = None if loaded.contexts else loaded.to_json()
    assert BodyCache().document(b"row", cut.skeleton, cut.parts) == nothing_kept


def test_a_load_missing_a_body_assembles_nothing() -> None:
    cp = _cp(1, {"a": {"x": 1}, "b": {"x": 2}})
    cut = split(cp)
    cache = BodyCache()
    (keep,) = [d for d, b in cut.bodies.items() if b == orjson.dumps({"x": 1})]
    assert cache.assemble(b"row", cut.skeleton, cut.parts, {keep: cut.bodies[keep]}) is None
    assert cache.document(b"row", cut.skeleton, cut.parts) is None  # "b" never kept
    with pytest.raises(MalformedRecordError):
        cache.document(b"row", b'{"version":2}', cut.parts)
