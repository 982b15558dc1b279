"""The conditions of a ``list_checkpoints`` page on the SQL tables.

Pages are keyset pages in primary-key order: ``id > <last id of the previous page>``,
so a stack is never returned twice in one walk, whatever is written meanwhile. A walk of
one namespace follows the ``(substr(namespace, 1, ID_PREFIX), id)`` index; any other
walk follows the primary key. The other filters are checked on the rows the walk meets
(``status``, ``workflow_id`` and the ``updated_at`` bounds are columns of the row).
"""

from __future__ import annotations

from typing import Any

from siglo.errors import InvalidArgumentError
from siglo.listing import CheckpointSummary, ListQuery, decode_cursor, encode_cursor
from siglo.sentinel import MISSING
from siglo_sql.keys import MAX_MS, at_most
from siglo_sql.schema import ID_PREFIX
from siglo_sql.statements import exact_match

__all__ = ["cursor_of", "indexed_list", "page_conditions", "summary_of"]


def page_conditions(
    query: ListQuery, dialect_name: str, *, table: str = "", keyset: str = "id"
) -> tuple[str, dict[str, Any]]:
    """The ``WHERE`` conditions of a page (without liveness) and their named parameters.

    The conditions' text depends only on which filters are set (and how many statuses),
    so the caller converts each shape once. ``table``: the checkpoints' alias in a join
    (their columns are named through it); ``keyset``: the column the cursor bounds.
    """
    c = f"{table}." if table else ""
    where: list[str] = []
    params: dict[str, Any] = {}
    if query.namespace is not MISSING:
        namespace = query.namespace or ""
        where.append(f"substr({c}namespace, 1, {ID_PREFIX}) = :ns_prefix")
        params["ns_prefix"] = namespace[:ID_PREFIX]
        if len(namespace) >= ID_PREFIX:
            # Only a namespace as long as the indexed prefix can share it with another.
            # (Shorter, the prefix's equality is exact, and no second condition makes
            # the planner misjudge how many rows match.)
            where.append(f"{exact_match(dialect_name)(c + 'namespace')} = :namespace")
            params["namespace"] = namespace
    if query.cursor is not None:
        (last,) = decode_cursor(query.cursor, 1)
        try:
            after = bytes.fromhex(last)
        except ValueError:
            raise InvalidArgumentError(f"cursor {query.cursor!r} is not a SQL backend's") from None
        where.append(f"{keyset} > :after")
        params["after"] = after
    if query.statuses is not None:
        names = [f"status{i}" for i in range(len(query.statuses))]
        where.append(f"{c}status IN ({', '.join(':' + n for n in names)})")
        params.update(zip(names, sorted(query.statuses), strict=True))
    if query.workflow_id is not None:
        where.append(f"{c}workflow_id = :workflow_id")
        params["workflow_id"] = query.workflow_id
    if query.updated_before is not None:
        where.append(f"{c}updated_at < :updated_before")
        params["updated_before"] = _bigint(query.updated_before)
    if query.updated_after is not None:
        where.append(f"{c}updated_at > :updated_after")
        params["updated_after"] = _bigint(query.updated_after)
    return (" AND ".join(where) or "1 = 1"), params


def indexed_list(checkpoints: str, tokens: str, fields: int, where: str, live: str) -> str:
    """A page of the checkpoints whose tokens hold ``fields`` filter tokens (parameters
    ``field0``, ``token0`` …), with the walk's other conditions ``where`` (made with
    ``table="c", keyset="t0.id"``) and ``live`` (the liveness of ``c``).

    The walk follows the tokens' ``(token, field, id)`` index of the first field: one
    range of it in id order, the pages' keyset order, so no sort and no scan of the
    checkpoints; each row leads to its checkpoint by primary key, and each further field
    is one probe of the tokens' primary key.
    """
    joins = "".join(
        f" JOIN {tokens} AS t{i} ON t{i}.id = t0.id AND t{i}.field = :field{i} "
        f"AND t{i}.token = :token{i}"
        for i in range(1, fields)
    )
    return (
        "SELECT c.namespace, c.stack_id, c.workflow_id, c.status, c.revision, c.updated_at, "
        f"c.expires_at, c.id FROM {tokens} AS t0{joins} JOIN {checkpoints} AS c ON c.id = t0.id "
        f"WHERE t0.token = :token0 AND t0.field = :field0 AND {where} AND {live} "
        "ORDER BY t0.id LIMIT :limit"
    )


def _bigint(ms: int) -> int:
    # A bound past what a BIGINT holds means the same as the largest (or smallest) one.
    return max(-MAX_MS - 1, at_most(ms))


def summary_of(row: tuple[Any, ...]) -> CheckpointSummary:
    """A summary from a ``cp_list`` row."""
    namespace, stack_id, workflow_id, status, revision, updated_at, expires_at, _ = row
    return CheckpointSummary(
        stack_id=stack_id,
        namespace=namespace or None,
        workflow_id=workflow_id,
        status=status,
        revision=int(revision),
        timestamp=int(updated_at),
        expires_at=None if expires_at is None else int(expires_at),
    )


def cursor_of(row: tuple[Any, ...]) -> str:
    """The cursor of the page that ends with ``row``."""
    return encode_cursor(bytes(row[-1]).hex())
