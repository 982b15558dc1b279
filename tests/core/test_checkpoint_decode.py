"""The fast paths of ``Checkpoint`` agree with the general (field-table) paths: decoding
(``from_wire``), the check on construction, and the wire document a save encodes.

The fast path only ever accepts: for every document it either builds exactly the
checkpoint the general (field-table) path builds, or declines and the general path
decides, so errors still name the field that is wrong (tests/core/test_wire.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siglo.checkpoint import _FIELDS, Checkpoint, _from_plain_wire, _plain_fields
from siglo.errors import SigloError
from siglo.wire import check_fields, from_wire_fields, to_wire_fields


def _general(doc: Any) -> Checkpoint:
    if isinstance(doc, dict) and "version" in doc:
        from siglo.checkpoint import _check_version

        _check_version(doc["version"])
    kwargs, extra = from_wire_fields("checkpoint", _FIELDS, doc)
    return Checkpoint(**kwargs, extra=extra)


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3), st.floats(0, 1)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_good = {
    "version": st.just(2),
    "schemaVersion": st.sampled_from(["2.0.0", "2.1.0"]),
    "stackId": st.text(min_size=1, max_size=5),
    "type": st.sampled_from(["execution", "x"]),
    "status": st.sampled_from(["running", "waiting", "completed"]),
    "revision": st.integers(0, 2**60),
    "chains": st.lists(st.text(max_size=3), max_size=3),
    "contexts": st.dictionaries(
        st.text(max_size=3), st.dictionaries(st.text(max_size=3), _values, max_size=2), max_size=3
    ),
    "timestamp": st.integers(0, 2**50),
    "workflowId": st.text(max_size=4),
    "namespace": st.text(min_size=1, max_size=4),
    "expiresAt": st.integers(0, 2**50),
    "metadata": st.dictionaries(st.text(max_size=3), _values, max_size=2),
}
_bad = {
    "version": st.sampled_from([1, 3, True, "2", 2.0]),
    "schemaVersion": st.sampled_from(["1.0.0", 2, ""]),
    "status": st.sampled_from(["done", 1, None]),
    "revision": st.sampled_from([-1, True, 1.5, "3", None]),
    "chains": st.sampled_from([["a", 1], "ab", None, {}]),
    "contexts": st.sampled_from([{"a": 1}, {"a": []}, [], None]),
    "timestamp": st.sampled_from([None, "1", 1.0]),
    "workflowId": st.sampled_from([None, 3]),
    "expiresAt": st.sampled_from([None, "x", False]),
    "metadata": st.sampled_from([None, [], "m"]),
    "stackId": st.sampled_from(["", None, 5]),
}


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for name, strategy in _good.items():
        optional = name in ("workflowId", "namespace", "expiresAt", "metadata")
        if optional and draw(st.booleans()):
            continue
        if not optional and draw(st.integers(0, 30)) == 0:
            continue  # a required field missing
        if name in _bad and draw(st.integers(0, 8)) == 0:
            doc[name] = draw(_bad[name])
        else:
            doc[name] = draw(strategy)
    if draw(st.integers(0, 6)) == 0:
        doc[draw(st.sampled_from(["newField", "x", "contexts2"]))] = draw(_values)
    return doc


@settings(max_examples=600, deadline=None)
@given(documents())
def test_fast_path_builds_what_the_general_path_builds_or_declines(doc: dict[str, Any]) -> None:
    fast = _from_plain_wire(doc)
    try:
        general: Checkpoint | SigloError = _general(doc)
    except SigloError as exc:
        general = exc
    if fast is not None:
        assert isinstance(general, Checkpoint), general
        assert fast == general
        assert fast.extra == general.extra == {}
        assert type(fast.chains) is tuple
    # Whatever the path, from_wire gives the general path's result or its exact error.
    try:
        got: Checkpoint | SigloError = Checkpoint.from_wire(doc)
    except SigloError as exc:
        got = exc
    if isinstance(general, SigloError):
        assert type(got) is type(general)
        assert str(got) == str(general)
    else:
        assert got == general


def test_the_documents_siglo_writes_take_the_fast_path() -> None:
    plain = Checkpoint(stack_id="s", revision=3, timestamp=1, contexts={"c": {"k": [1]}})
    full = plain.replace(workflow_id="w", namespace="n", expires_at=9, metadata={"m": 1})
    for checkpoint in (plain, full):
        fast = _from_plain_wire(checkpoint.to_wire())
        assert fast == checkpoint
        assert Checkpoint.from_json(checkpoint.to_json()) == checkpoint


def test_a_null_optional_field_or_an_unknown_field_takes_the_general_path() -> None:
    doc = Checkpoint(stack_id="s", revision=1, timestamp=1).to_wire()
    assert _from_plain_wire({**doc, "expiresAt": None}) is None
    assert Checkpoint.from_wire({**doc, "expiresAt": None}).expires_at is None
    assert _from_plain_wire({**doc, "future": 1}) is None
    assert Checkpoint.from_wire({**doc, "future": 1}).extra == {"future": 1}


def _unchecked(doc: dict[str, Any]) -> Checkpoint:
    """A checkpoint holding ``doc``'s values as attributes, built without any check."""
    checkpoint: Checkpoint = object.__new__(Checkpoint)
    values = {f.attr: doc.get(f.wire) for f in _FIELDS}
    if isinstance(values["chains"], list):
        values["chains"] = tuple(values["chains"])  # as the construction check converts first
    for name, value in {**values, "extra": {}, "_json": None}.items():
        object.__setattr__(checkpoint, name, value)
    return checkpoint


@settings(max_examples=600, deadline=None)
@given(documents())
def test_the_construction_check_accepts_only_what_the_field_table_accepts(
    doc: dict[str, Any],
) -> None:
    checkpoint = _unchecked(doc)
    if _plain_fields(checkpoint):
        check_fields("checkpoint", _FIELDS, checkpoint)  # must not raise
        # and what a save encodes is the field table's document, key order included
        wire = checkpoint.to_wire()
        general = to_wire_fields(_FIELDS, checkpoint)
        assert list(wire.items()) == list(general.items())


def test_construction_errors_still_name_the_field() -> None:
    with pytest.raises(SigloError, match="revision"):
        Checkpoint(stack_id="s", revision=True, timestamp=1)
    with pytest.raises(SigloError, match=r"chains\[1\]"):
        Checkpoint(stack_id="s", revision=1, timestamp=1, chains=("a", 2))  # type: ignore[arg-type]
    with pytest.raises(SigloError, match=r"contexts\.c"):
        Checkpoint(stack_id="s", revision=1, timestamp=1, contexts={"c": 1})  # type: ignore[dict-item]
    # A list of chains takes the general path, which converts it.
    plain = Checkpoint(stack_id="s", revision=1, timestamp=1, chains=["a"])  # type: ignore[arg-type]
    assert plain.chains == ("a",)


def test_the_written_out_init_takes_the_fields_and_their_defaults() -> None:
    """``Checkpoint.__init__`` is written by hand (for speed): its parameters are the
    dataclass's init fields, in order, each with the field's default."""
    import dataclasses
    import inspect

    params = inspect.signature(Checkpoint.__init__).parameters
    fields = [f for f in dataclasses.fields(Checkpoint) if f.init]
    assert [name for name in params if name != "self"] == [f.name for f in fields]
    for f in fields:
        param = params[f.name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY
        if f.default is not dataclasses.MISSING:
            assert param.default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            made = Checkpoint(stack_id="s", revision=1, timestamp=1)
            assert getattr(made, f.name) == f.default_factory(), f.name
            # a new one for each checkpoint, never shared
            assert getattr(made, f.name) is not getattr(
                Checkpoint(stack_id="s", revision=1, timestamp=1), f.name
            )
        else:
            assert param.default is inspect.Parameter.empty, f.name
    assert Checkpoint(stack_id="s", revision=1, timestamp=1).to_json() is not None
    with pytest.raises(SigloError, match="contexts"):
        Checkpoint(stack_id="s", revision=1, timestamp=1, contexts=None)  # type: ignore[arg-type]


def test_an_unencodable_checkpoint_names_its_stack() -> None:
    checkpoint = Checkpoint(stack_id="s-9", revision=1, timestamp=1, contexts={"c": {"k": {1, 2}}})
    with pytest.raises(SigloError, match="checkpoint of stack 's-9' is not JSON"):
        checkpoint.to_json()
