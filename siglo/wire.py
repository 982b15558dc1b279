"""The field tables behind siglo's wire documents.

Each document class (checkpoint, wait record, events) is a frozen dataclass with
snake_case attributes and a table of its fields: the camelCase wire name, the kind of
value, and whether it may be absent. One validator serves construction in Python and
decoding from JSON, so the rules cannot drift apart; its messages name the wire field.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from siglo.errors import MalformedRecordError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "UINT64_MAX",
    "Field",
    "check_fields",
    "from_wire_fields",
    "later_ms",
    "to_wire_fields",
]

INT64_MAX: Final = 2**63 - 1
"""The largest integer a document field holds: what SQLite and PostgreSQL store."""
INT64_MIN: Final = -(2**63)
UINT64_MAX: Final = 2**64 - 1
"""The largest integer the JSON codec writes: a time past it cannot be stored at all."""


def later_ms(now_ms: int, delay_ms: int) -> int:
    """``now_ms`` plus ``delay_ms``, a deadline or an expiry: one past what a signed
    64-bit time holds means "never", and is that (every backend stores it, and clamps it
    no further), not an integer the codec cannot write."""
    return min(now_ms + delay_ms, INT64_MAX)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a wire document."""

    attr: str
    wire: str
    kind: str  # "str", "int", "int64", "dict", "str_list", "dict_of_dicts", "any", "choice"
    optional: bool = False
    choices: frozenset[str] = frozenset()


def _bad(doc_kind: str, f: Field, problem: str) -> MalformedRecordError:
    return MalformedRecordError(doc_kind, f.wire, problem)


def _check_value(doc_kind: str, f: Field, value: Any) -> None:
    kind = f.kind
    if kind == "any":
        return
    if kind in ("str", "choice"):
        if type(value) is not str:
            raise _bad(doc_kind, f, f"must be a string, got {type(value).__name__}")
        if kind == "choice" and value not in f.choices:
            allowed = ", ".join(sorted(f.choices))
            raise _bad(doc_kind, f, f"is {value!r}; allowed: {allowed}")
    elif kind in ("int", "int64"):
        # bool is an int subclass; True is not a revision.
        if type(value) is not int:
            raise _bad(doc_kind, f, f"must be an integer, got {type(value).__name__}")
        # "int64": a field SQLite and PostgreSQL store as a signed 64-bit integer (Redis
        # would take more, and its dump then imports nowhere else). "int": a deadline or
        # expiry, which past that means "never" (clamped where it is stored), up to what
        # JSON can carry at all.
        if kind == "int64" and not INT64_MIN <= value <= INT64_MAX:
            raise _bad(doc_kind, f, f"must be a signed 64-bit integer, got {value}")
        if not INT64_MIN <= value <= UINT64_MAX:
            raise _bad(doc_kind, f, f"must be from -2**63 to 2**64 - 1, got {value}")
    elif kind == "dict":
        if not isinstance(value, dict):
            raise _bad(doc_kind, f, f"must be an object, got {type(value).__name__}")
    elif kind == "str_list":
        if not isinstance(value, list | tuple):
            raise _bad(doc_kind, f, f"must be a list of strings, got {type(value).__name__}")
        for i, item in enumerate(value):
            if type(item) is not str:
                raise MalformedRecordError(
                    doc_kind, f"{f.wire}[{i}]", f"must be a string, got {type(item).__name__}"
                )
    elif kind == "dict_of_dicts":
        if not isinstance(value, dict):
            raise _bad(doc_kind, f, f"must be an object, got {type(value).__name__}")
        for key, inner in value.items():
            if type(key) is not str:
                raise _bad(doc_kind, f, f"has a non-string key {key!r}")
            if not isinstance(inner, dict):
                raise MalformedRecordError(
                    doc_kind, f"{f.wire}.{key}", f"must be an object, got {type(inner).__name__}"
                )
    else:  # pragma: no cover - a programming error in a field table
        raise AssertionError(f"unknown field kind {kind!r}")


@dataclass(frozen=True, slots=True)
class _Plan:
    """A field table prepared once: one C-level getter for every attribute, the wire
    names this version knows. Validation runs on every checkpoint built or read, so it
    is on every save's and every load's path."""

    fields: tuple[Field, ...]
    get_all: Callable[[object], tuple[Any, ...]]
    known: frozenset[str]


_plans: dict[int, _Plan] = {}


def _plan(fields: tuple[Field, ...]) -> _Plan:
    plan = _plans.get(id(fields))
    if plan is None or plan.fields is not fields:
        getter = operator.attrgetter(*(f.attr for f in fields))
        # attrgetter of one name returns the value, not a 1-tuple.
        get_all = getter if len(fields) > 1 else (lambda obj: (getter(obj),))
        plan = _Plan(fields, get_all, frozenset(f.wire for f in fields))
        _plans[id(fields)] = plan  # the plan holds the table, so its id is not reused
    return plan


def check_fields(doc_kind: str, fields: tuple[Field, ...], obj: object) -> None:
    """Validate the attributes of a constructed document."""
    plan = _plan(fields)
    for f, value in zip(plan.fields, plan.get_all(obj), strict=True):
        if value is None:
            if not f.optional and f.kind != "any":
                raise _bad(doc_kind, f, "is required")
            continue
        # Fast acceptance of the common scalar cases; anything else (containers,
        # choices, and every failure, with its message) goes through _check_value.
        kind = f.kind
        if (kind == "str" and type(value) is str) or (
            kind == "int" and type(value) is int and INT64_MIN <= value <= UINT64_MAX
        ):
            continue
        _check_value(doc_kind, f, value)


def from_wire_fields(
    doc_kind: str, fields: tuple[Field, ...], doc: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Map a decoded wire document to constructor keywords.

    Returns ``(kwargs, extra)``: ``extra`` holds keys this version does not know, kept so
    that a re-save does not drop what a newer writer added. A ``null`` optional field
    reads as absent.
    """
    if not isinstance(doc, Mapping):
        raise MalformedRecordError(
            doc_kind, "<document>", f"must be an object, got {type(doc).__name__}"
        )
    kwargs: dict[str, Any] = {}
    for f in fields:
        if f.wire in doc:
            kwargs[f.attr] = doc[f.wire]
        elif not f.optional:
            raise _bad(doc_kind, f, "is missing")
    if len(kwargs) == len(doc):
        return kwargs, {}  # every key is a known field: nothing extra to keep
    known = _plan(fields).known
    extra = {k: v for k, v in doc.items() if k not in known}
    return kwargs, extra


def to_wire_fields(fields: tuple[Field, ...], obj: object) -> dict[str, Any]:
    """The wire document of ``obj``: camelCase keys, absent optional fields omitted."""
    doc: dict[str, Any] = {}
    plan = _plan(fields)
    for f, value in zip(plan.fields, plan.get_all(obj), strict=True):
        if value is None and f.optional:
            continue
        if f.kind == "str_list":
            value = list(value)
        doc[f.wire] = value
    return doc
