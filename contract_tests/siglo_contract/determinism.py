"""One seed, one set of programs, whatever else the process has loaded.

Hypothesis (6.131 and later) mixes into its draws literals it reads from the source of
every "local" module loaded in the process — not in site-packages or the standard
library, not a test file: an editable install's modules, a plugin's package in the
working directory, a benchmark harness, whatever a pytest session imported before. So
the same seed drew different programs in a process that had loaded other modules (found
when the suite's seed test took 15 s in the full test run against 2 s alone: another
counter-example, and a longer shrink), and ``--seed N`` reproduced a run only in a
process that loaded what the first one had. During a contract run the pool of local
constants is empty (in the whole process: Hypothesis keeps one pool): the programs are
a function of the seed, the rules and the budget.
Hypothesis's own constants (its boundary values) still come in, and the focused checks
cover the values siglo's rules care about explicitly.

The pool is Hypothesis's internal state (there is no setting for it):
:func:`fixed_constants` leaves it alone when the internals it knows are absent, and
``tests/suite/test_contract_determinism.py`` fails if the pin stops taking effect.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["fixed_constants"]

_lock = threading.Lock()
_depth = 0  # runs in progress (nested, or in several threads): restored by the last
_original: Callable[[], Any] | None = None


def _providers() -> Any:
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the module
        return None
    if not callable(getattr(providers, "_get_local_constants", None)):
        return None  # pragma: no cover - a Hypothesis without local constants
    return providers


def _clear_cache(providers: Any) -> None:
    # Hypothesis caches each choice type's permitted constants, local ones included: a
    # cache filled before the pin (or during it) must not outlive the switch.
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    clear = getattr(getattr(cache, "cache", None), "clear", None)
    if callable(clear):
        clear()


@contextlib.contextmanager
def fixed_constants() -> Iterator[None]:
    """Meanwhile, Hypothesis draws no constants from the process's local modules (also a
    decorator: ``@fixed_constants()``)."""
    global _depth, _original
    providers = _providers()
    if providers is None:  # pragma: no cover - nothing to pin
        yield
        return
    with _lock:
        if _depth == 0:
            _original = providers._get_local_constants
            empty = type(providers._local_constants)()
            providers._get_local_constants = lambda: empty
            _clear_cache(providers)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                providers._get_local_constants = _original
                _original = None
                _clear_cache(providers)
