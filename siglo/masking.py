"""Secrets seen in backend URLs and options, kept out of every siglo error's text.

:func:`siglo.urls.mask_credentials` masks a URL's password where siglo prints the URL. A
driver's own error can carry a secret in its text too — redis-py's "no master found"
names its Sentinel clients with their ``password=…`` — and siglo puts that text in its
errors. So each secret a URL or an option gives siglo is remembered here
(:func:`remember`), and :class:`siglo.errors.SigloError` replaces every one remembered in
its text (:func:`scrub`) and in the driver's exceptions chained under it
(:func:`scrub_chain`): the CLI's ``Error:`` line, the dashboard's error page, a span's
status and exception event and the ``--debug`` traceback say ``***``; so do the log
records of siglo's loggers (:func:`logger`), their tracebacks included. A short secret
is masked only where a text sets it (:data:`_BARE_MIN_LENGTH`), so that a password such
as ``postgres`` does not blank out the words of every error.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Final

__all__ = ["MASK", "escaped_forms", "logger", "remember", "scrub", "scrub_chain", "scrub_handled"]

MASK: Final = "***"
"""What a secret is replaced by."""

_BARE_MIN_LENGTH: Final = 10
"""A secret this long is masked wherever it stands in a text; a shorter one only where a
text sets it (``password=app``, ``:app@``): a short password is often a word the text
holds for another reason (``postgres``, ``redis``, ``127``, ``app`` for user ``app``),
and masking that would hide what went wrong."""

_SEEN: set[str] = set()


def remember(secret: str) -> None:
    """Keep ``secret`` out of every siglo error's text from now on — as written, and as
    a ``repr`` of a text holding it escapes it (:func:`escaped_forms`)."""
    if secret and secret != MASK:
        _SEEN.update(escaped_forms(secret))


def escaped_forms(secret: str) -> set[str]:
    """``secret`` and the forms an error's text may hold it in: escaped as ``repr``
    escapes a string (backslashes doubled, a quote escaped, control characters spelt
    out), once and twice — an exception's ``repr`` of a message that quoted a URL with
    ``!r`` (a counter-example of ``siglo check``: ``raised StorageAdapterError("…
    'db://u:pa\\ss@…'")``)."""
    forms = {secret}
    for _ in range(2):
        for form in list(forms):
            doubled = form.replace("\\", "\\\\")
            forms |= {
                doubled,
                doubled.replace("'", "\\'"),
                doubled.replace('"', '\\"'),
                repr(form)[1:-1],
            }
    return forms


def scrub(text: str) -> str:
    """``text`` with every remembered secret replaced by :data:`MASK`: where the text
    sets it (after ``password=``, ``token:`` and the like, or between ``:`` and ``@``),
    and, for one of :data:`_BARE_MIN_LENGTH` characters or more, wherever it stands."""
    if not _SEEN:
        return text
    # Longest first: a secret that contains another is masked whole.
    for secret in sorted(_SEEN, key=len, reverse=True):
        if secret not in text:
            continue
        quoted = re.escape(secret)
        text = re.sub(
            rf"((?:pass|pwd|token|secret|auth)[\w-]*\s*[=:]\s*['\"]?){quoted}(?![\w])",
            rf"\g<1>{MASK}",
            text,
            flags=re.IGNORECASE,
        )
        # ":/" too: a URL made a path (`siglo export -o URL`) has its "//" normalised.
        text = re.sub(rf"(:/+[^:/@\s]*:){quoted}@", rf"\g<1>{MASK}@", text)
        if len(secret) >= _BARE_MIN_LENGTH:
            text = text.replace(secret, MASK)
    return text


def scrub_chain(exc: BaseException) -> None:
    """Mask the remembered secrets in the texts of the exceptions ``exc`` was raised from
    or during (its ``__cause__`` and ``__context__`` chain), in place: a driver's
    exception chained under a siglo error is printed with it by every traceback — an
    application's ``logger.exception``, an error tracker, uvicorn's log. Called by
    :meth:`siglo.errors.SigloError.__str__`, which a traceback renders before the
    exceptions below it. Only an exception whose arguments are all text is changed (its
    message is its arguments)."""
    _scrub_from(exc.__cause__ or exc.__context__)


def scrub_handled() -> None:
    """Mask the remembered secrets in the exception being handled, and the chain below
    it, in place: a siglo error made in an ``except`` block (``raise
    StorageAdapterError(…) from exc``) masks the driver's exception as it is raised,
    before anything reads ``__cause__`` — an error tracker may read it first."""
    if _SEEN:
        _scrub_from(sys.exc_info()[1])


def _scrub_from(link: BaseException | None) -> None:
    if not _SEEN:
        return
    seen: set[int] = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        args = link.args
        if args and all(type(a) is str for a in args):
            scrubbed = tuple(scrub(a) for a in args)
            if scrubbed != args:
                link.args = scrubbed
        link = link.__cause__ or link.__context__


class _Scrubbing(logging.Filter):
    """Renders a record's message and traceback with the secrets masked: a driver's
    exception logged with ``exc_info`` carries its own text, which no siglo error wraps."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _SEEN:
            # Only a record that carries a secret is changed: the rest keep their args
            # for the handlers that read them.
            message = record.getMessage()
            scrubbed = scrub(message)
            if scrubbed != message:
                record.msg, record.args = scrubbed, None
            if record.exc_info and not record.exc_text:
                trace = logging.Formatter().formatException(record.exc_info)
                scrubbed = scrub(trace)
                if scrubbed != trace:
                    record.exc_text = scrubbed
        return True


_FILTER: Final = _Scrubbing()


def logger(name: str) -> logging.Logger:
    """The logger ``name`` (``siglo`` or ``siglo.…``), its records scrubbed. A filter acts
    on the records of its own logger only, so each of siglo's loggers is made here."""
    found = logging.getLogger(name)
    if _FILTER not in found.filters:
        found.addFilter(_FILTER)
    return found
