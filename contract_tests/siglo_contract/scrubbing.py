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

from siglo.masking import scrub as scrub_remembered
from siglo.urls import mask_credentials

__all__ = ["scrubber"]


def scrubber(url: str | None) -> Callable[[str], str]:
    """A function that removes ``url``'s secrets (its password, secret query values and
    the unmasked URL itself), and every secret siglo was told to keep out of its texts
    (:mod:`siglo.masking`), from a text."""
    replacements: list[tuple[str, str]] = []
    if url:
        masked = mask_credentials(url)
        if masked != url:
            replacements.append((url, masked))
            parts = urlsplit(url)
            if parts.password:
                replacements += [(parts.password, "***"), (unquote(parts.password), "***")]
            for key, value in parse_qsl(parts.query):
                if value and f"{key}={value}" not in masked:
                    replacements.append((value, "***"))

    def scrub(text: str) -> str:
        for secret, shown in replacements:
            text = text.replace(secret, shown)
        return scrub_remembered(text)

    return scrub
