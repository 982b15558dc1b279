"""The contract's version: a number a plugin can pin, and a hash of the rule set.

The version changes when what a rule requires changes: a rule added, removed, or made
stricter (a backend that passed may fail). Each rule records the version that introduced
it and the one that last changed it (:class:`~siglo_contract.rules.Rule`), and
docs/contract.md shows both. The hash covers every rule's id, kind, capability, summary
and versions, and the text of its row on docs/contract.md (recorded here as
:data:`PAGE_DIGEST`, which a test keeps equal to the page), so two suites with the same
hash check the same rules.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Final

from siglo_contract.rules import RULES

__all__ = [
    "CONTRACT_HISTORY",
    "CONTRACT_VERSION",
    "PAGE_DIGEST",
    "ContractMismatchError",
    "page_digest",
    "require_contract",
    "rule_set_hash",
]

CONTRACT_VERSION: Final = "1.7"
"""The version of the contract this suite checks."""

CONTRACT_HISTORY: Final[dict[str, str]] = {
    "1.0": "the rules of the first published contract page (30 November 2026)",
    "1.1": "owned idempotency claims, namespaced wait records, streamed and unlocking "
    "saves, closed backends, and the manager's end-to-end rules",
    "1.2": "listing across namespaces, deletion of claimed waits and in namespaces, due "
    "waits at their deadline and in namespaces, release and extend after a lapse, "
    "Unicode-normalisation twins and long namespaces, every method of a closed backend, "
    "the unlocking save under a user's defaults (issue 37)",
    "1.3": "the workflow lock per run with its namespace, wait records created as imported, "
    "deletes that spare a re-run, with_lock's bounded wait, encoded payloads stored "
    "byte-faithfully, the document size guard, incremental saves, URL options refused, "
    "offloaded values and their collection (issues 31, 33, 34)",
    "1.4": (
        "blob stores bounded by the backend's command_timeout_ms (issue 34); "
        "listings by blind-index tokens that follow every write; cached steps per "
        "namespace; stand-alone wait records, cached steps and idempotency results listed "
        "with their payloads and rewritten under compare-and-set, the waits and steps "
        "also deleted under it (issue 33); reading who holds a lock without taking it: "
        "inspect (issue 35)"
    ),
    "1.5": "a step's checkpoint saved with its cache entry, the entry stored whatever the "
    "compare-and-set decides (issue 36)",
    "1.6": "context-change stream values listed and rewritten under compare-and-set "
    "(scan_payloads('context'), what siglo rekey re-seals them through), and refused by a "
    "backend that does not declare them in payload_kinds; the retention checkpoint_ttl_ms "
    "sets (checkpoint.retention); the size guard on the unlocking and caching saves",
    "1.7": "a plugin's backend has no capability its registration leaves out "
    "(capability.declared); the retention counted from the save, whatever the "
    "checkpoint's timestamp (checkpoint.retention)",
}
"""What each version added or changed (CHANGELOG.md, "Contract", tells the same)."""

PAGE_DIGEST: Final = "9ef8888dade012eadab070355df2e92f00dcc110ae8b8f8a34e10de5e2d0ab17"
"""SHA-256 of the rule rows of docs/contract.md (:func:`page_digest`): the text the
rules are defined by. A test fails when the page changes and this does not, so a change
of a rule's text is a deliberate one (and its version is bumped, or it is a wording
change that requires nothing new)."""

_ROW: Final = re.compile(r"^\| `([^`]+)` \| [^|]+ \| (.+) \|$", re.MULTILINE)


def page_digest(page: str) -> str:
    """SHA-256 of the rule rows (id and text, not the version column) of the contract
    page ``page``."""
    rows = [f"{rule_id}\t{text.strip()}" for rule_id, text in _ROW.findall(page)]
    return hashlib.sha256("\n".join(rows).encode("utf-8")).hexdigest()


def rule_set_hash() -> str:
    """``sha256:`` and 16 hex digits over every rule and :data:`PAGE_DIGEST`."""
    body = json.dumps(
        {
            "rules": [
                [r.id, r.kind, r.capability and r.capability.value, r.summary, r.since, r.changed]
                for r in RULES
            ],
            "page": PAGE_DIGEST,
        },
        sort_keys=True,
    )
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


class ContractMismatchError(ValueError):
    """A pinned contract version (or rule-set hash) that this suite does not check."""


def require_contract(pin: str) -> None:
    """Raise :class:`ContractMismatchError` unless ``pin`` names this suite's contract:
    its version (``"1.3"``) or its rule-set hash (``"sha256:…"``)."""
    pin = pin.strip()
    if pin.startswith("sha256:"):
        if pin != rule_set_hash():
            raise ContractMismatchError(
                f"the pinned rule set {pin} is not this suite's ({rule_set_hash()}, contract "
                f"{CONTRACT_VERSION}): the rules changed since the pin was taken; see the "
                "contract's versions on docs/contract.md and update the pin"
            )
        return
    if not re.fullmatch(r"\d+\.\d+", pin):
        raise ContractMismatchError(
            f"--contract {pin!r} is not a contract version (MAJOR.MINOR, such as "
            f"{CONTRACT_VERSION}) or a rule-set hash (sha256:…)"
        )
    if pin != CONTRACT_VERSION:
        known = ", ".join(CONTRACT_HISTORY)
        older = pin in CONTRACT_HISTORY
        raise ContractMismatchError(
            f"this suite checks contract {CONTRACT_VERSION}, not {pin}"
            + (
                f" (contract {pin} is older: rules changed since; see docs/contract.md)"
                if older
                else f" (known versions: {known})"
            )
            + f"; install the siglo release that checks {pin}, or pin {CONTRACT_VERSION}"
        )
