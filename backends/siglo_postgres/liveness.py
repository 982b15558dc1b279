"""Telling a connection the server closed while it sat idle from one lost with a call in
flight.

To psycopg both look the same: a statement sent on either fails with
``OperationalError`` "server closed the connection unexpectedly", no SQLSTATE. But the
first statement never reached a server (a restart, or ``idle_session_timeout``, closed
the connection while it sat in the pool), and the second may have run and committed
(the server died, or the network dropped, between running it and answering). siglo
reports the second as :class:`~siglo.errors.OutcomeUnknownError` (SPEC §4: an
acknowledgement is never a guess), so the first must not happen: a connection is
looked at before a call is sent on it (:func:`closed_while_idle`, about a microsecond)
and replaced if the server has closed it, or said anything unasked. A connection that
fails with a SQLSTATE (``57P01`` "terminating connection due to administrator
command" …) was told by the server that its session ended: its statement did not
commit, and its failure is a plain :class:`~siglo.errors.StorageAdapterError`. Except
the class of connection exceptions, ``08…``: a PgBouncer whose server connection was
lost with a statement in flight says so to its client with ``08P01`` ("server conn
crashed?"), and it does not know either whether the statement committed (a black-box
auditor's save, reported as failed, was stored).
"""

from __future__ import annotations

import select
from typing import Any, Final

import psycopg

__all__ = ["closed_while_idle", "lost_in_flight"]

_ACTIVE = psycopg.pq.TransactionStatus.ACTIVE


def closed_while_idle(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn``, with nothing asked of it, has something to read: the end of its
    stream (the server closed it) or a message the server sent unasked (the
    ``FATAL`` of a shutdown). Either way it is not fit for a call. ``False`` while a
    command is in progress on it (another caller's reply is what there is to read)."""
    pgconn = conn.pgconn
    if pgconn.transaction_status == _ACTIVE:
        return False
    try:
        fd = pgconn.socket
    except psycopg.OperationalError:  # closed already
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def lost_in_flight(exc: BaseException, conn: psycopg.AsyncConnection[Any] | None) -> bool:
    """Whether ``exc`` ended a call on ``conn`` because the connection was lost with the
    call in flight — without a word from the server (no SQLSTATE), or with a connection
    exception (``08…``, what a PgBouncer says of its own lost server connection): what
    the call sent may have run."""
    if conn is None or not isinstance(exc, psycopg.OperationalError):
        return False
    if exc.sqlstate is None:
        return conn.broken
    if not exc.sqlstate.startswith("08"):
        return False
    message = (exc.diag.message_primary or "").lower()
    return not message.startswith(_NEVER_SENT)


_NEVER_SENT: Final = (
    "server login has been failing",  # server_login_retry: no server to send it to
    "pgbouncer cannot connect to server",
    "query_wait_timeout",  # waited for a server connection, never got one
    "no more connections allowed",  # max_client_conn, max_db_connections
    "client_login_timeout",
    "client_idle_timeout",
)
"""PgBouncer's ``08P01`` answers that say the statement reached no server (its own
words, which PostgreSQL never uses): a plain failure, as a connection refused is. Any
other connection exception may have come with the statement in flight (``server conn
crashed?``, ``query_timeout``): an unknown outcome, the safe side for an answer not
listed here."""
