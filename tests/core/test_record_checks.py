"""The fast acceptance of a context-change event and a cache event agrees with the
field table: it only ever accepts what :func:`~siglo.wire.check_fields` accepts, and
whatever it does not accept is the table's to judge, so errors still name the field
that is wrong (tests/core/test_wire.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from siglo.errors import SigloError
from siglo.records import _CACHE_FIELDS, _CONTEXT_FIELDS, CacheEvent, ContextChangeEvent
from siglo.wire import check_fields


class _Str(str):
    """A string subclass: the table refuses it where it asks for a string."""


class _Int(int):
    """An int subclass (as ``bool`` is): the table refuses it where it asks for an int."""


_candidates = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(
        ["", "s", "set", "delete", "hit", "miss", "error", _Str("set"), _Int(3), 1.5, [], {}]
    ),
)


def _verdict(build: Any, kwargs: dict[str, Any], fields: Any, kind: str) -> None:
    """Build the record; if it was built, the field table must accept it too; if it
    was refused, the table must refuse it as well."""
    try:
        record = build(**kwargs)
    except SigloError:

        class _Plain:
            pass

        plain = _Plain()
        for name, value in kwargs.items():
            setattr(plain, name, value)
        for f in fields:
            if not hasattr(plain, f.attr):
                setattr(plain, f.attr, None)
        try:
            check_fields(kind, fields, plain)
        except SigloError:
            return
        raise AssertionError(f"refused, but the table accepts {kwargs!r}") from None
    check_fields(kind, fields, record)


@settings(max_examples=400, deadline=None)
@given(
    stack_id=_candidates,
    step_id=_candidates,
    key=_candidates,
    op=_candidates,
    namespace=_candidates,
    revision=_candidates,
    timestamp=_candidates,
)
def test_context_change_accepts_only_what_the_table_accepts(**kwargs: Any) -> None:
    _verdict(ContextChangeEvent, kwargs, _CONTEXT_FIELDS, "context change")


@settings(max_examples=400, deadline=None)
@given(
    type=_candidates,
    key=_candidates,
    timestamp=_candidates,
    stack_id=_candidates,
    step_id=_candidates,
    ttl_ms=_candidates,
)
def test_cache_event_accepts_only_what_the_table_accepts(**kwargs: Any) -> None:
    _verdict(CacheEvent, kwargs, _CACHE_FIELDS, "cache event")


def test_plain_events_are_built() -> None:
    event = ContextChangeEvent(stack_id="s", step_id="a", key="output", value={"x": 1}, timestamp=1)
    assert event.op == "set" and event.revision is None
    cache = CacheEvent(type="miss", key="k", timestamp=1, stack_id="s", ttl_ms=5)
    assert cache.step_id is None
