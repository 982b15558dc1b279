"""Every way data reaches storage keeps every invariant (SPEC §4 "One configuration, every
path"): the application's settings — a ``siglo.toml`` with the backend URL and a redacted
field, or ``siglo.configure`` in the application's module — reach each path that writes,
and each path keeps the namespace it was given.

:data:`PATHS` is the registry of writers: the manager (foreground and background saves,
the object-bound save, the context stream), a flow (its input, a durable wait, a delivered
event, a cached step), the idempotency store, the synchronous facade, ``siglo worker``
(a timer it fires, a crashed run it recovers), ``siglo import``, and offloaded values
(the blob store a large value goes to, and the collector that removes blobs). Each runs through its
real entry point — the worker and the command line as processes of their own, given only
the directory they run in — against SQLite, PostgreSQL and Redis, and the test reads the
raw stored bytes: the secret is nowhere, and what was written under a namespace is found
there and only there.

:data:`API` classifies every public method of the objects applications write through and
every ``siglo`` command: a method or command added later fails
:func:`test_every_writer_is_classified` until it is classified, and a writer must name its
path in :data:`PATHS`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ops_support import DURABLE_KINDS, shared_store
from raw_storage import raw_bytes

import siglo
from siglo import sync
from siglo.blobs import open_blob_store
from siglo.cli import cli
from siglo.config import CONFIG_ENV, ENVIRONMENT, current_settings, reset_settings
from siglo.offload import collect_blobs
from siglo.redaction import REDACTED
from siglo.workflow import Flow

SECRET = "pathcheck-SECRET-7f3e9a"
FIELD = "secretField"
NS = "tenant-x"
ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    f'''
    """The application's flows, as `siglo worker --flows app_flows:flows` imports them."""

    import asyncio
    import os

    import siglo
    from siglo import Step, flow, wait_for_event
    from siglo.errors import WaitTimeoutError

    if os.environ.get("APP_CONFIGURES") == "1":
        # The application decides its settings in code, at import (no siglo.toml field).
        siglo.configure(redact_fields=["{FIELD}"])

    HANG = asyncio.Event()


    async def charge(order):
        try:
            await wait_for_event(f"pay:{{order}}", timeout_ms=150)
        except WaitTimeoutError:
            pass
        return {{"{FIELD}": "{SECRET}", "card": [{{"{FIELD}": "{SECRET}"}}]}}


    async def slow(order):
        if os.environ.get("APP_HANG") == "1":
            await HANG.wait()
        return {{"{FIELD}": "{SECRET}"}}


    timer = flow(Step.create("charge", charge), name="timer")
    crashy = flow(Step.create("slow", slow), name="crashy")
    flows = [timer, crashy]
    '''
)


@dataclass
class Env:
    """One backend on private storage, and the directory an application runs in."""

    kind: str
    backend: siglo.Backend
    """The test's own connection (no pipeline) to read back what was stored."""
    home: Path
    """The application's directory: its siglo.toml and app_flows.py."""
    app_configures: bool = False

    @property
    def url(self) -> str:
        return self.backend.url

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (*ENVIRONMENT, CONFIG_ENV)}
        paths = [str(self.home), str(ROOT), str(ROOT / "backends"), str(ROOT / "contract_tests")]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        if self.app_configures:
            env["APP_CONFIGURES"] = "1"
        env.update(extra)
        return env

    def siglo(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """The ``siglo`` command, run in the application's directory."""
        done = subprocess.run(
            [sys.executable, "-m", "siglo", *args],
            cwd=self.home,
            env=self.env(),
            input=stdin,
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, (done.stdout + done.stderr).decode()[-3000:]
        return done


Path_ = Callable[[Env, str], Awaitable[None]]
PATHS: dict[str, Path_] = {}


def path(name: str) -> Callable[[Path_], Path_]:
    def register(fn: Path_) -> Path_:
        PATHS[name] = fn
        return fn

    return register


def app_flows(env: Env) -> dict[str, Flow]:
    """The application's module, imported here as the application would."""
    namespace: dict[str, Any] = {}
    exec(compile(APP, str(env.home / "app_flows.py"), "exec"), namespace)
    return {f.name: f for f in namespace["flows"]}


# -- the writers ------------------------------------------------------------------------------


def _secret_context(stack: Any) -> None:
    stack.set("pay", FIELD, SECRET)
    stack.set("pay", "nested", {"list": [{FIELD: SECRET}], "n": 1})


@path("manager.save_checkpoint")
async def _save_by_id(env: Env, ident: str) -> None:
    async with siglo.connect() as backend:
        manager = siglo.StorageManager(backend)
        _secret_context(manager.create_stack(ident, namespace=NS, metadata={FIELD: SECRET}))
        await manager.save_checkpoint(ident)


@path("manager.checkpoint (background)")
async def _background(env: Env, ident: str) -> None:
    async with siglo.connect() as backend:
        manager = siglo.StorageManager(backend)
        _secret_context(manager.create_stack(ident, namespace=NS))
        manager.checkpoint(ident)
        await manager.flush()


@path("stack.save (and the context stream)")
async def _stack_save(env: Env, ident: str) -> None:
    async with siglo.connect() as backend:
        manager = siglo.StorageManager(backend)
        stack = manager.create_stack(ident, namespace=NS)
        await stack.save()
        _secret_context(stack)
        await asyncio.sleep(0.05)  # the stream jobs of the two sets run
        await stack.save(expected_revision=stack.revision)


@path("flow.run (input, durable wait, cached step)")
async def _flow_wait(env: Env, ident: str) -> None:
    async def remember(order: Any) -> dict[str, Any]:
        return {FIELD: SECRET, "order": order}

    async def wait(_: Any) -> Any:
        return await siglo.wait_for_event(f"approve:{ident}")

    run = siglo.flow(
        siglo.Step.create("remember", remember).cache(ttl_ms=60_000, key=lambda _: ident),
        siglo.Step.create("wait", wait),
        name="paths-wait",
    )
    async with siglo.connect() as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(siglo.WorkflowSuspended):
            await run.run({FIELD: SECRET}, manager=manager, stack_id=ident, namespace=NS)
        # The event's payload is stored with the claim, and becomes context.
        await run.deliver(f"approve:{ident}", {FIELD: SECRET}, manager=manager, namespace=NS)


@path("idempotency.complete")
async def _idempotency(env: Env, ident: str) -> None:
    async with siglo.connect() as backend:
        store = backend.require_idempotency()
        assert await store.claim(f"{NS}:{ident}") == "claimed"
        await store.complete(f"{NS}:{ident}", {"receipt": {FIELD: SECRET}})


@path("offloaded values (blob store, collector)")
async def _offloaded(env: Env, ident: str) -> None:
    # The application's settings (its backend, its redacted field) with offloading on: a
    # value past the threshold goes to the blob store after redaction, and the collector,
    # run as if long after, keeps what the live checkpoint references.
    blobs = env.home / "blobs"
    settings = current_settings().replace(offload_min_bytes=1_024, blob_url=blobs.as_uri())
    large = {FIELD: SECRET, "text": "large " * 1_000}
    async with siglo.connect(settings=settings) as backend:
        manager = siglo.StorageManager(backend)
        stack = manager.create_stack(ident, namespace=NS)
        _secret_context(stack)
        stack.set("pay", "document", large)
        await manager.save_checkpoint(ident)
        store = open_blob_store(settings.blob_url or "")
        later = int(time.time() * 1000) + 7_200_000
        await collect_blobs(backend.adapter, store, now_ms=later)
        loaded = await backend.adapter.get_checkpoint(ident, NS, fallback=False)
        assert loaded is not None
        assert loaded.contexts["pay"]["document"] == {**large, FIELD: REDACTED}
    stored = [p.read_bytes() for p in blobs.glob("??/*")]
    assert len(stored) == 1
    assert SECRET.encode() not in stored[0]


@path("siglo.sync")
async def _sync(env: Env, ident: str) -> None:
    def write() -> None:
        with sync.connect() as backend:
            manager = sync.StorageManager(backend)
            stack = manager.create_stack(ident, namespace=NS)
            _secret_context(stack)
            stack.save()

    await asyncio.to_thread(write)


@path("siglo worker (a timer it fires)")
async def _worker_timer(env: Env, ident: str) -> None:
    flows = app_flows(env)
    # The run starts in the application (its own settings), times out, and is left to the
    # worker: the step that runs again on the timer writes the secret, in the worker.
    async with siglo.connect() as backend:
        manager = siglo.StorageManager(backend)
        with pytest.raises(siglo.WorkflowSuspended):
            await flows["timer"].run(ident, manager=manager, stack_id=ident, namespace=NS)
    await asyncio.sleep(0.3)  # past the wait's deadline
    env.siglo("worker", "--flows", "app_flows:flows", "--once")


@path("siglo worker (a crashed run it recovers)")
async def _worker_recovery(env: Env, ident: str) -> None:
    flows = app_flows(env)
    os.environ["APP_HANG"] = "1"
    try:
        async with siglo.connect() as backend:
            manager = siglo.StorageManager(backend)
            run = asyncio.ensure_future(
                flows["crashy"].run(ident, manager=manager, stack_id=ident, namespace=NS)
            )
            # Polled: the run's first checkpoint is in storage, which no event announces.
            while await backend.adapter.get_checkpoint(ident, NS, fallback=False) is None:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            run.cancel()  # the process "dies" in the step: the run stays running
            with pytest.raises(asyncio.CancelledError):
                await run
    finally:
        del os.environ["APP_HANG"]
    env.siglo("worker", "--flows", "app_flows:flows", "--once")


@path("siglo import")
async def _import(env: Env, ident: str) -> None:
    # A dump written where nothing was redacted (another application, an old version).
    elsewhere = env.home / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    source = f"sqlite:///{elsewhere / 'source.db'}"
    async with siglo.connect(source, settings=siglo.Settings()) as backend:
        manager = siglo.StorageManager(backend, settings=siglo.Settings())
        _secret_context(manager.create_stack(ident, namespace=NS))
        await manager.save_checkpoint(ident)
    exported = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "siglo", "export", source],
        cwd=elsewhere,
        env=env.env(),
        capture_output=True,
        timeout=120,
        check=True,
    )
    dump = exported.stdout
    assert SECRET.encode() in dump
    env.siglo("import", stdin=dump)


# -- the checks -------------------------------------------------------------------------------


@asynccontextmanager
async def application(kind: str, home: Path, *, app_configures: bool) -> AsyncIterator[Env]:
    """A backend of ``kind``, and the application's directory with its siglo.toml: the URL
    and (unless the application configures it in code) the redacted field."""
    async with shared_store(kind) as backend:
        toml = f'url = "{backend.url}"\ncommand_timeout_ms = 8000\n'
        if not app_configures:
            toml += f'redact_fields = ["{FIELD}"]\n'
        (home / "siglo.toml").write_text(toml)
        (home / "app_flows.py").write_text(APP)
        env = Env(kind, backend, home, app_configures)
        yield env


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The application's directory, the current one; no SIGLO_* variable set."""
    for name in (*ENVIRONMENT, CONFIG_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    reset_settings()
    yield tmp_path
    reset_settings()


async def _assert_redacted_and_namespaced(env: Env, name: str, ident: str) -> None:
    stored = await raw_bytes(env.kind, env.backend)
    assert SECRET.encode() not in stored, f"{name} stored the secret in clear on {env.kind}"
    assert REDACTED.encode() in stored, f"{name} stored nothing redacted on {env.kind}"
    adapter = env.backend.adapter
    if name == "idempotency.complete":
        store = env.backend.require_idempotency()
        assert await store.get_result(f"{NS}:{ident}") == {"receipt": {FIELD: REDACTED}}
        return
    checkpoint = await adapter.get_checkpoint(ident, NS, fallback=False)
    assert checkpoint is not None, f"{name}: nothing stored under namespace {NS!r}"
    assert checkpoint.namespace == NS
    assert await adapter.get_checkpoint(ident, None, fallback=False) is None
    waits = checkpoint.metadata.get("waitRecord") if checkpoint.metadata else None
    if waits is not None:
        key = waits["correlationKey"]
        assert await adapter.get_wait_record(key, namespace=NS) is not None
        assert await adapter.get_wait_record(key) is None


@pytest.mark.rule("manager.redaction")
@pytest.mark.parametrize("name", sorted(PATHS))
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_every_path_keeps_the_settings_and_the_namespace(
    kind: str, name: str, home: Path
) -> None:
    ident = "path-" + re.sub(r"[^a-z]+", "-", name).strip("-")
    async with application(kind, home, app_configures=False) as env:
        await PATHS[name](env, ident)
        await _assert_redacted_and_namespaced(env, name, ident)


@pytest.mark.rule("manager.redaction")
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_the_worker_takes_settings_the_application_decides_in_code(
    kind: str, home: Path
) -> None:
    """No siglo.toml field: the application's module calls siglo.configure at import, and
    the worker, which imports it, redacts what it redacts."""
    async with application(kind, home, app_configures=True) as env:
        # This process runs the application's module without configuring (its writes
        # carry no secret): what is redacted, the worker redacted by its own settings.
        for name, ident in (
            ("siglo worker (a timer it fires)", "coded-timer"),
            ("siglo worker (a crashed run it recovers)", "coded-recovery"),
        ):
            await PATHS[name](env, ident)
            await _assert_redacted_and_namespaced(env, name, ident)


# -- completeness -------------------------------------------------------------------------------

API: dict[str, str] = {
    # StorageManager
    "StorageManager.save_checkpoint": "manager.save_checkpoint",
    "StorageManager.save": "stack.save (and the context stream)",
    "StorageManager.checkpoint": "manager.checkpoint (background)",
    "StorageManager.stream_context_change": "stack.save (and the context stream)",
    "StorageManager.flush": "manager.checkpoint (background)",
    "StorageManager.clean_expired_checkpoints": "deletes only",
    "StorageManager.load_checkpoint": "reads",
    "StorageManager.resume": "reads",
    "StorageManager.restore_checkpoint": "no I/O",
    "StorageManager.create_stack": "no I/O",
    "StorageManager.get_stack": "no I/O",
    "StorageManager.discard_stack": "no I/O",
    "StorageManager.redact": "no I/O",
    "StorageManager.use_storage": "no I/O",
    "StorageManager.set_error_mode": "no I/O",
    "StorageManager.set_redact_fields": "no I/O",
    # ExecutionStack
    "ExecutionStack.save": "stack.save (and the context stream)",
    "ExecutionStack.checkpoint": "manager.checkpoint (background)",
    "ExecutionStack.set": "stack.save (and the context stream)",
    "ExecutionStack.delete": "stack.save (and the context stream)",
    "ExecutionStack.context": "no I/O",
    "ExecutionStack.push_chain": "no I/O",
    "ExecutionStack.transition": "no I/O",
    # Flow
    "Flow.run": "flow.run (input, durable wait, cached step)",
    "Flow.deliver": "flow.run (input, durable wait, cached step)",
    "Flow.resume": "siglo worker (a crashed run it recovers)",
    "Flow.recover": "siglo worker (a crashed run it recovers)",
    "Flow.fire_timeout": "siglo worker (a timer it fires)",
    "Flow.with_migration": "no I/O",
    # the synchronous facade's manager forwards to StorageManager
    "sync.StorageManager.*": "siglo.sync",
}
"""Every public method applications write through: the path of :data:`PATHS` that
covers it, or why none is needed."""

COMMANDS: dict[str, str] = {
    "backends": "no stored data",
    "check": "its own isolated storage",
    "clean": "deletes only",
    "collect-blobs": "offloaded values (blob store, collector)",
    "config": "no stored data",
    "drill": "synthetic data under a namespace of its own, removed afterwards",
    "export": "reads",
    "import": "siglo import",
    "ls": "reads",
    "migrate": "schema only",
    "prune": "deletes only",
    "rm": "deletes only",
    "show": "reads",
    "worker": "siglo worker (a timer it fires)",
}
"""Every ``siglo`` command: the path of :data:`PATHS` that covers it, or why none is needed."""

_NOT_WRITERS = frozenset({"reads", "no I/O", "deletes only", "no stored data", "schema only"})
_NOT_WRITERS |= {
    "its own isolated storage",
    "synthetic data under a namespace of its own, removed afterwards",
}


def _public_methods(cls: type[Any]) -> set[str]:
    return {
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(member))
    }


def test_every_writer_is_classified() -> None:
    classes: dict[str, type[Any]] = {
        "StorageManager": siglo.StorageManager,
        "ExecutionStack": siglo.ExecutionStack,
        "Flow": Flow,
    }
    for prefix, cls in classes.items():
        for name in _public_methods(cls):
            assert f"{prefix}.{name}" in API, (
                f"{prefix}.{name} is not classified in tests/core/test_every_path.py: if it "
                "writes, register the path it writes through in PATHS"
            )
    for where in API:
        owner, _, method = where.rpartition(".")
        if owner in classes:
            assert method in _public_methods(classes[owner]), f"{where} no longer exists"
    assert set(cli.commands) == set(COMMANDS), "classify every siglo command in COMMANDS"
    for where, covered in {**API, **COMMANDS}.items():
        assert covered in PATHS or covered in _NOT_WRITERS, f"{where}: unknown path {covered!r}"
