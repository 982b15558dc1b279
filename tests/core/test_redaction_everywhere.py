"""Redaction covers every way out of the process (SPEC §4, issue 11 defect 1).

A secret under a redacted key must never reach storage by any path: checkpoints, the
context-change stream, event payloads a flow stores in wait records — read back as the
raw bytes of every backend — nor the log output.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import orjson
import pytest
from raw_storage import KINDS, any_backend, raw_bytes

import siglo
from siglo import REDACTED, Step, StorageManager, flow, wait_for_event
from siglo.errors import InvalidArgumentError
from siglo.redaction import MAX_REDACTION_DEPTH, redact

SECRETS = {
    "cached": "CACHED-OUTPUT-SECRET-8d1a",
    "password": "hunter2-PASSWORD-5f1c",
    "apiKey": "sk-live-APIKEY-77aa",
    "event": "EVENT-SECRET-0b9e",
    "sticky": "STICKY-TOKEN-c3d2",
    "late": "NAMED-LATE-SECRET-91fe",
    "late-deep": "NAMED-LATE-DEEP-0c7b",
    "late-background": "NAMED-LATE-BG-5e20",
}
VISIBLE = "visible-marker-4242"


async def _fetch_credentials(_: Any) -> dict[str, Any]:
    return {"user": VISIBLE, "password": SECRETS["cached"]}


seen_passwords: list[Any] = []


async def _login(credentials: Any) -> dict[str, Any]:
    seen_passwords.append(credentials["password"])
    event = await wait_for_event("approve:redaction")
    return {"approved": event}


@pytest.mark.rule("manager.redaction")
@pytest.mark.parametrize("kind", KINDS)
async def test_no_secret_reaches_raw_storage_or_logs(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with any_backend(kind) as backend:
        manager = StorageManager(backend, error_mode="strict", redact_fields={"password", "apiKey"})

        # Checkpoints and the stream of a namespaced stack, secrets at any depth.
        stack = manager.create_stack("redaction-1", namespace="tenant-a")
        stack.set("login", "user", VISIBLE)
        stack.set("login", "password", SECRETS["password"])
        stack.set("login", "profile", {"keys": [{"apiKey": SECRETS["apiKey"]}], "n": 1})
        manager.checkpoint("redaction-1")
        await manager.save_checkpoint("redaction-1", ttl_ms=60_000)

        # A key named only on one checkpoint call stays redacted for that stack.
        other = manager.create_stack("redaction-2")
        other.set("s", "token", "not-yet-secret")
        await manager.save_checkpoint("redaction-2", redact_fields={"token"})
        other.set("s", "token", SECRETS["sticky"])
        await manager.save_checkpoint("redaction-2")

        # Keys named on the save only (the seed's checkpoint(id, {redactFields})), their
        # values set — and streamed — before: the stream is scrubbed, not just the
        # checkpoint; by an awaited save and by a background one alike.
        late = manager.create_stack("redaction-late")
        late.set("s", "apiToken", SECRETS["late"])
        late.set("s", "config", {"nested": {"apiToken": SECRETS["late-deep"]}, "n": 2})
        await manager.save_checkpoint("redaction-late", redact_fields={"apiToken"})
        late_bg = manager.create_stack("redaction-late-bg")
        late_bg.set("s", "sessionKey", SECRETS["late-background"])
        manager.checkpoint("redaction-late-bg", redact_fields=["sessionKey"])

        # An event payload a flow stores in its wait record and in the step's context.
        # A cached step's output is stored in the step cache: redacted like context.
        login = flow(
            Step.create("fetch", _fetch_credentials).cache(ttl_ms=60_000),
            Step.create("login", _login),
            name="redaction-flow",
        )
        seen_passwords.clear()
        with pytest.raises(siglo.WorkflowSuspended):
            await login.run(None, manager=manager, stack_id="redaction-3")
        result = await login.deliver(
            "approve:redaction", {"password": SECRETS["event"], "ok": True}, manager=manager
        )
        # The live run saw the real values (the resumed run reads the redacted
        # checkpoint, as any resume does); only what left the process is redacted.
        assert seen_passwords == [SECRETS["cached"], REDACTED]
        assert result == {"approved": {"password": SECRETS["event"], "ok": True}}
        await manager.flush()

        # The adapter reads the redaction back through its own API too.
        adapter = backend.adapter
        stream = await adapter.get_context_changes("redaction-1", "login", "tenant-a")
        assert stream["password"] == REDACTED
        assert stream["profile"] == {"keys": [{"apiKey": REDACTED}], "n": 1}
        assert (await adapter.get_context_changes("redaction-2", "s"))["token"] == REDACTED
        assert await adapter.get_context_changes("redaction-late", "s") == {
            "apiToken": REDACTED,
            "config": {"nested": {"apiToken": REDACTED}, "n": 2},
        }
        assert await adapter.get_context_changes("redaction-late-bg", "s") == {
            "sessionKey": REDACTED
        }
        assert await adapter.get_cached_step("fetch") == {"user": VISIBLE, "password": REDACTED}
        record = await adapter.get_wait_record("approve:redaction")
        assert record is not None and record.event_payload == {"password": REDACTED, "ok": True}

        raw = await raw_bytes(kind, backend)
        assert VISIBLE.encode() in raw, "the raw dump does not read the stored data"
        for name, secret in SECRETS.items():
            assert secret.encode() not in raw, f"{name} secret found in raw {kind} storage"
    for name, secret in SECRETS.items():
        assert secret not in caplog.text, f"{name} secret found in the log output"
    # The live stacks kept their values.
    assert stack.contexts["login"]["password"] == SECRETS["password"]


def test_redacting_a_10000_deep_context_is_a_clear_error_not_a_recursion_error() -> None:
    deep: Any = {"password": "x"}
    for _ in range(10_000):
        deep = {"child": deep}
    manager = StorageManager(redact_fields={"password"})
    stack = manager.create_stack("deep")
    stack.context("s")["value"] = deep
    with pytest.raises(InvalidArgumentError):
        manager.checkpoint("deep")
    assert stack.revision == 0  # nothing was taken


def test_redact_is_iterative_and_refuses_cycles() -> None:
    deep: Any = {"password": "x"}
    for _ in range(MAX_REDACTION_DEPTH - 2):
        deep = [deep]
    out = redact(deep, {"password"})
    for _ in range(MAX_REDACTION_DEPTH - 2):
        out = out[0]
    assert out == {"password": REDACTED}
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(InvalidArgumentError, match="cycle"):
        redact(cyclic, {"password"})


def test_redact_fields_must_be_names() -> None:
    with pytest.raises(InvalidArgumentError):
        StorageManager(redact_fields="password")
    with pytest.raises(InvalidArgumentError):
        StorageManager(redact_fields=[1])  # type: ignore[list-item]


@pytest.mark.rule("manager.redaction")
async def test_failures_logged_in_warn_mode_carry_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Log records and error messages: a backend failing while a redacted value is sent
    (a private redis-server killed mid-run) is logged and warned without the secret."""
    from _redis_helpers import RedisServer, require_redis
    from ports import free_port

    require_redis()
    server = RedisServer(free_port(30200, 30300)).start()
    try:
        # A bound far above the refused connects' retries (3, backing off from 10 ms): at
        # 500 ms a loaded CI machine once ran past it, and a write cut off by its bound is
        # an unknown outcome, raised in every error mode (manager.error-mode).
        async with siglo.connect(server.url + "?command_timeout_ms=5000") as backend:
            manager = StorageManager(backend, error_mode="warn", redact_fields={"password"})
            stack = manager.create_stack("logged")
            server.kill()
            caplog.set_level(logging.DEBUG)

            async def send_while_down() -> None:
                stack.set("s", "password", SECRETS["password"])
                stack.set("s", "nested", [{"password": SECRETS["apiKey"]}])
                manager.checkpoint("logged")
                await manager.flush()
                await manager.save_checkpoint("logged")

            with pytest.warns(siglo.StorageWarning) as warned:
                await send_while_down()
            assert "failed" in caplog.text  # the failures were logged
            shown = caplog.text + "\n".join(str(w.message) for w in warned)
            for record in caplog.records:
                if record.exc_info and record.exc_info[1] is not None:
                    shown += repr(record.exc_info[1].args)
            for secret in SECRETS.values():
                assert secret not in shown
    finally:
        server.stop()


PIN = "PIN-9876-travels"
CARD = "CARD-5555-travels"


async def _approve(value: Any) -> Any:
    return await wait_for_event("approve:travels")


async def _charge(event: Any) -> dict[str, Any]:
    payments = siglo.current_backend().require_idempotency()
    assert await payments.claim("charge:travels") == "claimed"
    result = {"card": CARD, "ok": event["ok"]}
    await payments.complete("charge:travels", result)
    return {"charged": True}


travelling = flow(Step.create("approve", _approve), Step.create("charge", _charge), name="t")


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_process_without_the_settings_keeps_the_runs_redaction(kind: str) -> None:
    """The run's redacted keys travel with its checkpoint: a process started without the
    application's settings — a webhook handler delivering the event, then running the
    rest of the run — stores neither the delivered payload's key in the wait record nor
    a step's idempotency result's key in clear."""
    from siglo.config import Settings

    async with any_backend(kind) as backend:
        app = StorageManager(backend, settings=Settings(redact_fields=frozenset({"pin", "card"})))
        with pytest.raises(siglo.WorkflowSuspended):
            await travelling.run(None, manager=app, stack_id="run-1")
        bare = StorageManager(backend, settings=Settings())
        assert await travelling.deliver("approve:travels", {"pin": PIN, "ok": 1}, manager=bare) == {
            "charged": True
        }
        record = await backend.adapter.get_wait_record("approve:travels")
        assert record is not None and record.event_payload == {"pin": REDACTED, "ok": 1}
        stored = await backend.idempotency.get_result("charge:travels")  # type: ignore[union-attr]
        assert stored == {"card": REDACTED, "ok": 1}
        raw = await raw_bytes(kind, backend)
        assert PIN.encode() not in raw and CARD.encode() not in raw


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_checkpoints_own_redacted_keys_are_redacted_on_any_write(kind: str) -> None:
    """A checkpoint names the keys redacted from it (``metadata.redactFields``), and any
    process that handles it keeps redacting them, whatever its own settings say
    (docs/configuration.md). Written around the manager — ``siglo import`` of a dump
    with such a value in clear, a save through the adapter — the pipeline redacts them
    too; before, only the settings' keys were (``siglo show`` masked it, the store kept
    it)."""
    from siglo import Checkpoint, WaitRecord
    from siglo.config import Settings
    from siglo.pipeline import Pipeline
    from siglo.transfer import export_lines, import_lines

    secret = "SSN-IMPORTED-41aa"
    others = ("SSN-META-77c1", "SSN-EXTRA-0d3e", "SSN-EVENT-9b2f")
    # A released claim keeps its event payload (rule wait.release): in the dump too.
    wait = WaitRecord(
        correlation_key="kyc:named", stack_id="named", event_payload={"ssn": others[2]}
    )
    leaked = Checkpoint(
        stack_id="named",
        status="waiting",
        revision=1,
        timestamp=1,
        contexts={"kyc": {"ssn": secret, "name": VISIBLE}},
        metadata={
            "redactFields": ["ssn"],
            "ssn": others[0],
            "waitRecord": wait.replace(event_payload=None).to_wire(),
        },
        extra={"tsExtra": {"ssn": others[1]}},
    )
    async with any_backend("memory") as source:
        await source.raw_adapter.save_checkpoint(leaked)  # around the pipeline: in clear
        await source.raw_adapter.save_wait_record(wait)
        exported = [line async for line in export_lines(source.raw_adapter)]
    # siglo's own export hides the keys the checkpoint names (as `siglo show` does) ...
    assert not any(value.encode() in line for line in exported for value in (secret, *others))
    # ... so the dump in clear is one made elsewhere (by hand, and vouched for again).
    header = orjson.dumps({"siglo": "export", "format": 2, "exportedAt": 1})
    body = [
        b'{"kind":"checkpoint","document":' + leaked.to_json() + b"}",
        b'{"kind":"wait","record":' + wait.to_json() + b"}",
    ]
    vouched = hashlib.sha256(b"".join(line + b"\n" for line in (header, *body))).hexdigest()
    trailer = {"siglo": "end", "checkpoints": 1, "waits": 1, "lines": 3, "sha256": vouched}
    dump = [header, *body, orjson.dumps(trailer)]
    # A process with settings of its own (another key redacted: a pipeline in front).
    async with any_backend(kind) as backend:
        own = backend.adapter
        backend.use_pipeline(Pipeline(Settings(redact_fields=["card"])))
        try:
            await import_lines(backend.adapter, dump)
            await backend.adapter.save_checkpoint(
                leaked.replace(stack_id="named-2"), expected_revision=0
            )
        finally:
            backend.adapter = own  # the backend's clean-up looks at its own adapter
        for stack_id in ("named", "named-2"):
            stored = await backend.raw_adapter.get_checkpoint(stack_id)
            assert stored is not None
            assert stored.contexts["kyc"] == {"ssn": REDACTED, "name": VISIBLE}
        raw = await raw_bytes(kind, backend)
        assert VISIBLE.encode() in raw
        for value in (secret, *others):
            assert value.encode() not in raw, value
    # And one with none (no pipeline at all): the import redacts them itself.
    async with any_backend(kind) as bare:
        await import_lines(bare.adapter, dump)
        stored = await bare.raw_adapter.get_checkpoint("named")
        assert stored is not None and stored.contexts["kyc"]["ssn"] == REDACTED
        raw = await raw_bytes(kind, bare)
        for value in (secret, *others):
            assert value.encode() not in raw, value
