"""End-to-end checks of siglo's own promises over the backend under test: a
``StorageManager`` drives the backend, and the suite reads back what the adapter stored.

A backend cannot break these alone, but siglo's manager over a backend can (a redaction
that misses one way out, a conflict swallowed in one error mode): checking the path end
to end catches it on the store a user really runs. The manager class comes from
``Target.manager_factory`` (``siglo.StorageManager``; siglo's own tests put broken ones
there to prove the checks bite).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any, Final

from siglo.adapter import Capability
from siglo.backend import Backend
from siglo.error_modes import StorageWarning
from siglo.errors import CheckpointConflictError, NamespaceMismatchError, StorageAdapterError
from siglo.redaction import REDACTED
from siglo_contract.checks_lifecycle import second_backend
from siglo_contract.machine_base import canon
from siglo_contract.registry import CheckContext, check, expect, fail

SECRETS: Final = ("hunter2-secret", "t0k3n-secret", "nested-secret", "listed-secret")


def _manager(ctx: CheckContext, **options: Any) -> Any:
    factory = ctx.session.target.manager_factory
    return factory(ctx.backend.adapter, clock=ctx.session.clock, **options)


def _leaks(document: Any) -> list[str]:
    text = canon(document).decode()
    return [s for s in SECRETS if s in text]


@check("manager.redaction.stored", requires=(Capability.CHECKPOINTS,))
async def redaction_end_to_end(ctx: CheckContext) -> None:
    """Nothing a manager with redact_fields sends the backend holds a redacted value:
    checkpoints saved in the foreground and the background, and the context stream."""
    ctx.about("manager.redaction.stored")
    manager = _manager(ctx, redact_fields=("password", "token"), error_mode="strict")
    stack_id = ctx.id("redacted")
    stack = manager.create_stack(stack_id, namespace=ctx.id("ns"))
    stack.set("step", "password", SECRETS[0])
    stack.set("step", "user", {"name": "ada", "token": SECRETS[1]})
    stack.set("step", "deep", {"a": [{"b": {"password": SECRETS[2]}}, 1]})
    stack.set("other", "items", [{"token": SECRETS[3]}, {"kept": "visible"}])
    stack.set("step", "plain", "visible")
    for save in ("foreground", "background"):
        if save == "foreground":
            await manager.save_checkpoint(stack_id)
        else:
            stack.set("step", "plain", "visible-2")
            manager.checkpoint(stack_id)
        await manager.flush()
        stored = await ctx.backend.adapter.get_checkpoint(stack_id, ctx.id("ns"), fallback=False)
        expect(stored is not None, "checkpoint.roundtrip", f"the {save} save was not stored")
        assert stored is not None
        leaked = _leaks(stored.to_wire())
        expect(
            not leaked,
            "manager.redaction.stored",
            f"the checkpoint stored by a {save} save holds redacted values {leaked}",
        )
        step = stored.contexts.get("step", {})
        expect(
            step.get("password") == REDACTED and step.get("plain", "").startswith("visible"),
            "manager.redaction.stored",
            f"stored context {dict(step)!r}: password not {REDACTED!r} or a plain value lost",
        )
    expect(
        stack.context("step")["password"] == SECRETS[0],
        "manager.redaction.stored",
        "redaction changed the live context",
    )
    if Capability.CONTEXT_STREAM in ctx.session.target.capabilities:
        for step_id in ("step", "other"):
            fields = await ctx.backend.adapter.get_context_changes(stack_id, step_id, ctx.id("ns"))
            leaked = _leaks(fields)
            expect(
                not leaked,
                "manager.redaction.stored",
                f"the context stream of {step_id!r} holds redacted values {leaked}: {fields!r}",
            )
        fields = await ctx.backend.adapter.get_context_changes(stack_id, "step", ctx.id("ns"))
        expect(
            fields.get("password") == REDACTED,
            "manager.redaction.stored",
            f"the streamed password is {fields.get('password')!r}, not {REDACTED!r}",
        )


@check("manager.conflict.stored", requires=(Capability.CHECKPOINTS,))
async def conflicts_end_to_end(ctx: CheckContext) -> None:
    """A lost compare-and-set through a manager over the backend raises
    CheckpointConflictError in every error mode, foreground and background."""
    ctx.about("manager.conflict.stored")
    for mode in ("best-effort", "warn", "strict"):
        stack_id = ctx.id(f"cas-{mode}")
        await ctx.backend.adapter.save_checkpoint(ctx.checkpoint(stack_id, 5))
        manager = _manager(ctx, error_mode=mode)
        manager.create_stack(stack_id)
        try:
            await manager.save_checkpoint(stack_id, expected_revision=0)
        except CheckpointConflictError as exc:
            expect(
                exc.current_revision == 5,
                "manager.conflict.stored",
                f"{mode}: the conflict carries current_revision={exc.current_revision}",
            )
        else:
            fail("manager.conflict.stored", f"{mode}: a lost save_checkpoint raised nothing")
        manager.checkpoint(stack_id, expected_revision=0)
        try:
            await manager.flush()
        except CheckpointConflictError:
            pass
        else:
            fail("manager.conflict.stored", f"{mode}: a lost background save raised nothing")
        stored = await ctx.backend.adapter.get_checkpoint(stack_id)
        expect(
            stored is not None and stored.revision == 5,
            "manager.conflict.stored",
            f"{mode}: lost saves changed the stored checkpoint to {stored!r}",
        )


@check("manager.restore.stored", requires=(Capability.CHECKPOINTS,))
async def restore_end_to_end(ctx: CheckContext) -> None:
    """A checkpoint a manager saved, read back through the adapter, restores into a
    manager with its own namespace expected and is refused with another."""
    ctx.about("manager.restore.stored")
    writer = _manager(ctx, error_mode="strict")
    stack_id = ctx.id("restored")
    stack = writer.create_stack(stack_id, namespace=ctx.id("A"))
    stack.set("step", "v", {"n": [1, None]})
    await writer.save_checkpoint(stack_id)
    stored = await ctx.backend.adapter.get_checkpoint(stack_id, ctx.id("A"), fallback=False)
    expect(stored is not None, "checkpoint.roundtrip", "the manager's save was not stored")
    assert stored is not None
    reader = _manager(ctx, error_mode="strict")
    try:
        reader.restore_checkpoint(stored, expected_namespace=ctx.id("B"))
    except NamespaceMismatchError:
        pass
    else:
        fail("manager.restore.stored", "a checkpoint of namespace A restored where B expected")
    live = reader.restore_checkpoint(stored, expected_namespace=ctx.id("A"))
    expect(
        live.namespace == ctx.id("A")
        and live.revision == stored.revision
        and canon(live.contexts) == canon({"step": {"v": {"n": [1, None]}}}),
        "manager.restore.stored",
        f"restored stack {live!r} is not the stored checkpoint {stored!r}",
    )


async def _refuses(backend: Backend, stack_id: str) -> bool:
    """Whether the (closed) backend fails a plain read with ``StorageAdapterError``."""
    try:
        await backend.adapter.get_checkpoint(stack_id)
    except StorageAdapterError:
        return True
    return False


@check("manager.error-mode.stored", requires=(Capability.CHECKPOINTS,))
async def error_modes_end_to_end(ctx: CheckContext) -> None:
    """A manager over a backend that really fails (a second backend of the target,
    closed) follows its error mode, in the foreground and the background: ``strict``
    raises ``StorageAdapterError`` (a background failure once, from the next ``flush()``),
    ``warn`` logs one record to the ``siglo`` logger and issues one ``StorageWarning`` per
    failed save and returns, ``best-effort`` returns quietly."""
    ctx.about("manager.error-mode.stored")
    closed = second_backend(ctx)
    if closed is None:
        return
    on_close = list(closed.on_close)
    await closed.aclose()
    try:
        refuses = await _refuses(closed, ctx.id("probe"))
    finally:
        # A client that reconnected for the probe (Redis) is closed again, the same way.
        closed.on_close = on_close
        await closed.aclose()
    if not refuses:
        # Nothing to close (memory://) or a client that reconnects (Redis): this target
        # cannot produce a failure this way, so there is nothing to observe.
        return
    factory = ctx.session.target.manager_factory
    for mode in ("strict", "warn", "best-effort"):
        manager = factory(closed.adapter, clock=ctx.session.clock, error_mode=mode)
        stack_id = ctx.id(f"failing-{mode}")
        # No context change: a failed stream would be one more failure to count.
        manager.create_stack(stack_id)
        with warnings.catch_warnings(record=True) as seen, _siglo_log() as logged:
            warnings.simplefilter("always")
            foreground = await _outcome(manager.save_checkpoint(stack_id))
            manager.checkpoint(stack_id)
            background = await _outcome(manager.flush())
            again = await _outcome(manager.flush())
        warned = sum(issubclass(w.category, StorageWarning) for w in seen)
        for save, outcome in (("save_checkpoint", foreground), ("a background save", background)):
            if mode == "strict":
                expect(
                    isinstance(outcome, StorageAdapterError),
                    "manager.error-mode.stored",
                    f"strict: {save} over a failing backend gave {outcome!r}, "
                    "not StorageAdapterError",
                )
            else:
                expect(
                    outcome is None,
                    "manager.error-mode.stored",
                    f"{mode}: {save} over a failing backend raised {outcome!r}",
                )
        expect(
            again is None,
            "manager.error-mode.stored",
            f"{mode}: a background failure was raised twice (second flush: {again!r})",
        )
        expected_warnings = 2 if mode == "warn" else 0
        expect(
            warned == expected_warnings,
            "manager.error-mode.stored",
            f"{mode}: {warned} StorageWarning(s) for two failed saves, not {expected_warnings}",
        )
        expect(
            len(logged) == expected_warnings,
            "manager.error-mode.stored",
            f"{mode}: {len(logged)} record(s) on the 'siglo' logger for two failed saves, "
            f"not {expected_warnings}",
        )


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _siglo_log() -> Iterator[list[logging.LogRecord]]:
    """The ``siglo`` logger's warnings while inside, kept from the run's output (the
    failures are the check's own doing)."""
    logger = logging.getLogger("siglo")
    handler, propagate = _Records(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


async def _outcome(call: Any) -> BaseException | None:
    """What awaiting ``call`` raised (``None`` when it returned)."""
    try:
        await call
    except Exception as exc:
        return exc
    return None
