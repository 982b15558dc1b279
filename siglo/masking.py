"""Secrets seen in backend URLs and options, kept out of every siglo error's text.

:func:`siglo.urls.mask_credentials` masks a URL's password where siglo prints the URL. A
driver's own error can carry a secret in its text too — redis-py's "no master found"
names its Sentinel clients with their ``password=…`` — and siglo puts that text in its
errors. So each secret a URL or an option gives siglo is remembered here
(:func:`remember`), and :class:`siglo.errors.SigloError` replaces every one remembered in
its text (:func:`scrub`): the CLI's ``Error:`` line, the dashboard's error page, a span's
status and exception event and the ``--debug`` traceback say ``***``; so do the log
records of siglo's loggers (:func:`logger`), their tracebacks included.
Masking too much is safe; printing a password is not.
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["MASK", "logger", "remember", "scrub"]

MASK: Final = "***"
"""What a secret is replaced by."""

_MIN_LENGTH: Final = 3
"""Shorter values are not scrubbed out of texts: one or two characters would mask half
of every message, and a password that short is no secret anyway."""

_SEEN: set[str] = set()


def remember(secret: str) -> None:
    """Keep ``secret`` out of every siglo error's text from now on."""
    if len(secret) >= _MIN_LENGTH and secret != MASK:
        _SEEN.add(secret)


def scrub(text: str) -> str:
    """``text`` with every remembered secret replaced by :data:`MASK`."""
    if not _SEEN:
        return text
    # Longest first: a secret that contains another is masked whole.
    for secret in sorted(_SEEN, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


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
                if scrub(trace) != trace:
                    record.exc_text = scrub(trace)
        return True


_FILTER: Final = _Scrubbing()


def logger(name: str) -> logging.Logger:
    """The logger ``name`` (``siglo`` or ``siglo.…``), its records scrubbed. A filter acts
    on the records of its own logger only, so each of siglo's loggers is made here."""
    found = logging.getLogger(name)
    if _FILTER not in found.filters:
        found.addFilter(_FILTER)
    return found
