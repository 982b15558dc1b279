"""Every siglo error — those of siglo.errors and every other module's — pickles as
itself (type, message, attributes), so it crosses a process boundary intact (a process
pool, a worker process): ``SigloError.__reduce__``."""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
from typing import Any

import pytest

import siglo
import siglo.errors as errors

# Every module of siglo that defines errors of its own is loaded, so that the walk below
# finds them (siglo.transfer's DumpError, siglo.webhooks' errors).
for _module in pkgutil.walk_packages(siglo.__path__, "siglo."):
    if not _module.name.startswith(("siglo.ui", "siglo.__main__")):
        importlib.import_module(_module.name)


def _subclasses(cls: type[errors.SigloError]) -> set[type[errors.SigloError]]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(sub) for sub in found))


_CLASSES = sorted(
    {errors.SigloError}
    | {c for c in _subclasses(errors.SigloError) if c.__module__.startswith("siglo.")},
    key=lambda cls: f"{cls.__module__}.{cls.__name__}",
)


def _example(cls: type[errors.SigloError]) -> errors.SigloError:
    """An instance built through ``cls``'s own constructor, every required argument given."""
    arguments: list[Any] = []
    for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if parameter.kind is not parameter.POSITIONAL_OR_KEYWORD:
            continue
        if parameter.default is not parameter.empty:
            continue
        annotation = str(parameter.annotation)
        arguments.append(7 if annotation.startswith("int") else f"{parameter.name}-value")
    if not arguments:
        return cls("what went wrong")
    return cls(*arguments)


def test_every_error_class_is_enumerated() -> None:
    assert {cls.__name__ for cls in _CLASSES} >= {
        "MalformedRecordError",
        "CheckpointVersionError",
        "WaitTimeoutError",
        "CheckpointConflictError",
        "OutcomeUnknownError",
        "DocumentTooLargeError",
    }
    assert {"DumpError", "WebhookSignatureError"} <= {cls.__name__ for cls in _CLASSES}


@pytest.mark.parametrize("cls", _CLASSES, ids=lambda cls: cls.__name__)
def test_an_error_pickles_as_itself(cls: type[errors.SigloError]) -> None:
    error = _example(cls)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.args == error.args
    assert vars(back) == vars(error)


def _raise_malformed() -> None:
    raise errors.MalformedRecordError("checkpoint", "contexts.step", "must be an object")


def test_an_error_raised_in_a_pool_process_arrives_whole() -> None:
    context = multiprocessing.get_context("spawn")
    with (
        concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool,
        pytest.raises(errors.MalformedRecordError) as raised,
    ):
        pool.submit(_raise_malformed).result(timeout=60)
    assert raised.value.field == "contexts.step"
    assert raised.value.kind == "checkpoint"
    assert "must be an object" in str(raised.value)
