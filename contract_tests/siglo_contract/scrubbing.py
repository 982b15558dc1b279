"""Keeping a run's credentials out of what it reports.

A check's counter-example quotes what the backend raised, and a backend's error may
quote the URL it was given, password and all. Every result's text is scrubbed once, when
the run builds its report (:func:`siglo_contract.runner.run_contract`), so that every
output made from it — the table `siglo check` prints, the JUnit XML, the JSON, Markdown
and HTML reports, the certificate — holds none.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from siglo.masking import escaped_forms
from siglo.masking import scrub as scrub_remembered
from siglo.urls import mask_credentials

__all__ = ["scrubber"]


def scrubber(url: str | None) -> Callable[[str], str]:
    """A function that removes ``url``'s secrets (its password, secret query values and
    the unmasked URL itself; each as written and as ``repr`` escapes it), and every
    secret siglo was told to keep out of its texts (:mod:`siglo.masking`), from a text."""
    replacements: list[tuple[str, str]] = []
    if url:
        masked = mask_credentials(url)
        if masked != url:
            replacements.append((url, masked))
            parts = urlsplit(url)
            secrets: set[str] = set()
            if parts.password:
                secrets |= escaped_forms(parts.password) | escaped_forms(unquote(parts.password))
            for key, value in parse_qsl(parts.query):
                if value and f"{key}={value}" not in masked:
                    secrets |= escaped_forms(value)
            # Longest first: an escaped form holds the plain one's pieces.
            replacements += [(secret, "***") for secret in sorted(secrets, key=len, reverse=True)]

    def scrub(text: str) -> str:
        for secret, shown in replacements:
            text = text.replace(secret, shown)
        return scrub_remembered(text)

    return scrub
