"""Where hypothesis keeps its caches while :func:`~siglo_contract.run_contract` runs.

Hypothesis keeps caches (its Unicode tables) in ``./.hypothesis`` by default: a run from
a script or ``siglo check`` would leave that directory in the user's working directory,
and building the tables again costs a run about a second. The suite runs with no
example database (``database=None``) and draws no constants from loaded modules
(:mod:`siglo_contract.determinism`, so Hypothesis keeps no cache of them), so all it
keeps there are the tables, and a run's programs are the same with or without them:
they go to siglo's user cache directory instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

from hypothesis import configuration

__all__ = ["cache_dir", "hypothesis_home", "in_hypothesis_home"]

P = ParamSpec("P")
R = TypeVar("R")

# Hypothesis's own record of the directory in use (``set_hypothesis_home_dir`` sets it,
# nothing reads it back publicly): what to restore after the run.
_CURRENT = "__hypothesis_home_directory"


def cache_dir() -> Path:
    """``siglo/hypothesis`` in the user's cache directory (``$XDG_CACHE_HOME``, else
    ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "siglo" / "hypothesis"


@contextlib.contextmanager
def hypothesis_home() -> Iterator[None]:
    """Point hypothesis's storage at :func:`cache_dir` meanwhile, then back where it was.

    ``$HYPOTHESIS_STORAGE_DIRECTORY``, when set, wins: nothing changes. With no usable
    cache directory, a temporary one, removed afterwards.
    """
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        yield
        return
    before = getattr(configuration, _CURRENT, None)
    with contextlib.ExitStack() as stack:
        try:
            cache_dir().mkdir(parents=True, exist_ok=True)
            directory = str(cache_dir())
        except OSError:
            directory = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="siglo-check-hypothesis-")
            )
        configuration.set_hypothesis_home_dir(directory)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(before)


def in_hypothesis_home(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, run inside :func:`hypothesis_home`."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with hypothesis_home():
            return fn(*args, **kwargs)

    return run
