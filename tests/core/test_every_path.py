"""Every way data reaches storage keeps every invariant (SPEC §4 "One configuration, every
path"): the application's settings — a ``siglo.toml`` with the backend URL and a redacted
field, or ``siglo.configure`` in the application's module — reach each path that writes,
and each path keeps the namespace it was given.

:data:`PATHS` is the registry of writers: the manager (foreground and background saves,
the object-bound save, the context stream), a flow (its input, a durable wait, a delivered
event, a cached step), the idempotency store, the synchronous facade, ``siglo worker``
(a timer it fires, a crashed run it recovers), ``siglo import`` (checkpoints, a claimed
wait it saves, and one it creates to finish an interrupted import), and offloaded values
(the blob store a large value goes to, and the collector that removes blobs; a flow with
offloading on that waits durably and is delivered). Each runs
through its
real entry point — the worker and the command line as processes of their own, given only
the directory they run in — against SQLite, PostgreSQL and Redis, and the test reads the
raw stored bytes: the secret is nowhere, and what was written under a namespace is found
there and only there. And each path is bounded in time by the same settings: run against
a Redis that stops answering (a TCP proxy on loopback that freezes) with a tight
``command_timeout_ms`` in the application's ``siglo.toml``, it fails within a few seconds
with siglo's timeout (``StorageAdapterError`` / ``OutcomeUnknownError``) — it never hangs
and never reports success. So do the commands that only read or delete. The offloaded
values' own store is bounded by the same setting when it is the one that stalls
(:func:`test_the_offloaded_path_is_bounded_when_its_blob_store_stalls`; a Redis, an S3 and
a PostgreSQL blob store call by call: tests/core/test_blob_timeouts.py).

:data:`API` classifies every public method of the objects applications write through and
every ``siglo`` command: a method or command added later fails
:func:`test_every_writer_is_classified` until it is classified, and a writer must name its
path in :data:`PATHS`.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import pytest
from _tcp_proxy import TcpProxy, tcp_proxy
from ops_support import DURABLE_KINDS, shared_store
from raw_storage import raw_bytes

import siglo
from siglo import sync
from siglo.blobs import open_blob_store
from siglo.cli import cli
from siglo.config import CONFIG_ENV, ENVIRONMENT, current_settings, reset_settings
from siglo.offload import OffloadAdapter, Offloader, collect_blobs, offload_adapter
from siglo.pipeline import Pipeline, pipeline_parts
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


class CommandFailed(AssertionError):
    """A ``siglo`` command the path ran exited with a non-zero status (or hung)."""

    def __init__(self, args: tuple[str, ...], status: int | None, output: str, took: float):
        self.status = status
        self.output = output
        self.took = took
        what = "hung" if status is None else f"exited with status {status}"
        super().__init__(f"siglo {' '.join(args)} {what} after {took:.1f} s:\n{output[-3000:]}")


@dataclass
class Env:
    """One backend on private storage, and the directory an application runs in."""

    kind: str
    backend: siglo.Backend
    """The test's own connection (no pipeline) to read back what was stored."""
    home: Path
    """The application's directory: its siglo.toml and app_flows.py."""
    app_configures: bool = False
    before_command: Callable[[], None] | None = None
    """Called just before each ``siglo`` command (the timeout check freezes the server)."""
    extra_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """More arguments for a command, by its name."""
    command_limit_s: float = 120
    """A command still running after this long is killed and reported as hung."""

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def settings_url(self) -> str:
        """The URL in the application's siglo.toml."""
        return str(tomllib.loads((self.home / "siglo.toml").read_text())["url"])

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (*ENVIRONMENT, CONFIG_ENV)}
        paths = [str(self.home), str(ROOT), str(ROOT / "backends"), str(ROOT / "contract_tests")]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        if self.app_configures:
            env["APP_CONFIGURES"] = "1"
        env.update(extra)
        return env

    def siglo(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """The ``siglo`` command, run in the application's directory; :class:`CommandFailed`
        unless it succeeds."""
        if self.before_command is not None:
            self.before_command()
        argv = [sys.executable, "-m", "siglo", *args, *self.extra_args.get(args[0], ())]
        began = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                cwd=self.home,
                env=self.env(),
                input=stdin,
                capture_output=True,
                timeout=self.command_limit_s,
            )
        except subprocess.TimeoutExpired as hung:
            output = (hung.stdout or b"") + (hung.stderr or b"")
            raise CommandFailed(args, None, output.decode(), time.monotonic() - began) from None
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode()
            raise CommandFailed(args, done.returncode, output, time.monotonic() - began)
        return done


Path_ = Callable[[Env, str], Awaitable[None]]
PATHS: dict[str, Path_] = {}
BY_COMMAND: set[str] = set()
"""Paths whose writer is a ``siglo`` command (what runs before it in the test process
only prepares the data it works on)."""


def path(name: str, *, by_command: bool = False) -> Callable[[Path_], Path_]:
    def register(fn: Path_) -> Path_:
        PATHS[name] = fn
        if by_command:
            BY_COMMAND.add(name)
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


OFFLOADED = "offloaded values (blob store, collector)"


@path(OFFLOADED)
async def _offloaded(env: Env, ident: str) -> None:
    # The application's settings (its backend, its redacted field) with offloading on: a
    # value past the threshold goes to the blob store after redaction, and the collector,
    # run as if long after, keeps what the live checkpoint references.
    blobs = env.home / "blobs"
    # The application's blob store if its settings name one (the timeout check's stalled
    # store), else a directory the test reads back.
    blob_url = current_settings().blob_url or blobs.as_uri()
    settings = current_settings().replace(offload_min_bytes=1_024, blob_url=blob_url)
    large = {FIELD: SECRET, "text": "large " * 1_000}
    async with siglo.connect(settings=settings) as backend:
        manager = siglo.StorageManager(backend)
        stack = manager.create_stack(ident, namespace=NS)
        _secret_context(stack)
        stack.set("pay", "document", large)
        await manager.save_checkpoint(ident)
        # The collector on the backend's own store (bounded as the backend's calls are).
        offloading: Any = backend.adapter
        while not isinstance(offloading, OffloadAdapter):  # below the pipeline
            offloading = offloading.inner
        store = offloading.offloader.store
        later = int(time.time() * 1000) + 7_200_000
        await collect_blobs(backend.adapter, store, now_ms=later)
        loaded = await backend.adapter.get_checkpoint(ident, NS, fallback=False)
        assert loaded is not None
        # Read back as saved: redacted where the settings redact the field (the encryption
        # variant redacts nothing and encrypts instead).
        redacted = FIELD in settings.redact_fields
        assert loaded.contexts["pay"]["document"] == (
            {**large, FIELD: REDACTED} if redacted else large
        )
    stored = [p.read_bytes() for p in blobs.glob("??/*")]
    assert len(stored) == 1
    assert SECRET.encode() not in stored[0]


OFFLOADED_FLOW = "flow.run with offloaded values (durable wait, delivery)"


@path(OFFLOADED_FLOW)
async def _offloaded_flow(env: Env, ident: str) -> None:
    # Offloading on with everything else the settings say (encryption in that variant): a
    # run whose step output goes to the blob store waits durably and is delivered — the
    # wait record and its event payload pass the offloading layer as stored.
    blobs = env.home / "blobs"
    blob_url = current_settings().blob_url or blobs.as_uri()
    settings = current_settings().replace(offload_min_bytes=1_024, blob_url=blob_url)

    async def remember(order: Any) -> dict[str, Any]:
        return {FIELD: SECRET, "document": "large " * 1_000, "order": order}

    async def wait(_: Any) -> Any:
        return await siglo.wait_for_event(f"approve:{ident}")

    run = siglo.flow(
        siglo.Step.create("remember", remember),
        siglo.Step.create("wait", wait),
        name="paths-offloaded-wait",
    )
    async with siglo.connect(settings=settings) as backend:
        manager = siglo.StorageManager(backend, settings=settings)
        with pytest.raises(siglo.WorkflowSuspended):
            await run.run({FIELD: SECRET}, manager=manager, stack_id=ident, namespace=NS)
        await run.deliver(f"approve:{ident}", {FIELD: SECRET}, manager=manager, namespace=NS)
        done = await backend.adapter.get_checkpoint(ident, NS, fallback=False)
        assert done is not None and done.status == "completed", done
    stored = [p.read_bytes() for p in blobs.glob("??/*")]
    assert stored, "nothing was offloaded"
    assert all(SECRET.encode() not in blob for blob in stored)


@path("siglo.sync")
async def _sync(env: Env, ident: str) -> None:
    def write() -> None:
        with sync.connect() as backend:
            manager = sync.StorageManager(backend)
            stack = manager.create_stack(ident, namespace=NS)
            _secret_context(stack)
            stack.save()

    await asyncio.to_thread(write)


@path("siglo worker (a timer it fires)", by_command=True)
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


@path("siglo worker (a crashed run it recovers)", by_command=True)
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


@path("siglo import", by_command=True)
async def _import(env: Env, ident: str) -> None:
    # A dump written where nothing was redacted (another application, an old version).
    elsewhere = env.home / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    source = f"sqlite:///{elsewhere / 'source.db'}"
    now = siglo.SystemClock().now_ms()
    # A run waiting on a claimed wait whose event payload carries the secret: the import
    # saves it (save_wait_record) ...
    claimed = siglo.WaitRecord(
        correlation_key=f"approve:{ident}",
        stack_id=ident,
        namespace=NS,
        status="claimed",
        claimant_id="courier",
        claimed_at=now,
        lease_expires_at=now + 600_000,
        event_payload={FIELD: SECRET},
    )
    # ... and a run the target already holds at that revision (an interrupted earlier
    # import), whose wait the import creates (create_wait_record).
    resumed = siglo.WaitRecord(
        correlation_key=f"approve:{ident}-resumed",
        stack_id=f"{ident}-resumed",
        namespace=NS,
        status="claimed",
        claimant_id="courier",
        claimed_at=now,
        lease_expires_at=now + 600_000,
        event_payload={"nested": [{FIELD: SECRET}]},
    )
    there = siglo.Checkpoint(
        stack_id=resumed.stack_id,
        namespace=NS,
        status="waiting",
        revision=2,
        timestamp=now,
        metadata={"waitRecord": resumed.to_wire()},
    )
    # Written by a process without the application's settings (an empty settings file),
    # so the source holds the secret in clear.
    (elsewhere / "none.toml").write_text("")
    with _settings_file(elsewhere / "none.toml"):
        async with siglo.connect(source) as backend:
            manager = siglo.StorageManager(backend)
            stack = manager.create_stack(
                ident, namespace=NS, metadata={"waitRecord": claimed.to_wire()}
            )
            _secret_context(stack)
            await manager.save_checkpoint(ident)
            await backend.adapter.save_wait_record(claimed)
            await backend.adapter.save_checkpoint(there)
            await backend.adapter.save_wait_record(resumed)
    async with siglo.connect() as target:  # the application's settings
        await target.adapter.save_checkpoint(there)
    # Exported there too, by that process's (empty) settings: an export hides what its
    # own settings redact, and this dump comes from a store that redacts nothing.
    exported = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "siglo", "export", source],
        cwd=elsewhere,
        env=env.env(**{CONFIG_ENV: str(elsewhere / "none.toml")}),
        capture_output=True,
        timeout=120,
        check=True,
    )
    dump = exported.stdout
    assert SECRET.encode() in dump
    env.siglo("import", stdin=dump)
    async with siglo.connect() as target:
        for record in (claimed, resumed):
            wait = await target.adapter.get_wait_record(record.correlation_key, namespace=NS)
            assert wait is not None and wait.status == "claimed", record.correlation_key


@path("siglo ui (deliver an event)")
async def _ui_deliver(env: Env, ident: str) -> None:
    pytest.importorskip("starlette")
    import httpx

    from siglo.cli.ui import build_app

    async def wait(_: Any) -> Any:
        return await siglo.wait_for_event(f"approve:{ident}")

    run = siglo.flow(siglo.Step.create("wait", wait), name="paths-ui")
    async with siglo.connect() as backend:
        with pytest.raises(siglo.WorkflowSuspended):
            await run.run(None, manager=siglo.StorageManager(backend), stack_id=ident, namespace=NS)
    # The dashboard as `siglo ui` builds it: the command's URL and settings.
    app, _, _ = build_app(None, "127.0.0.1", None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            # As an operator does: the run page's link to the confirmation.
            run_page = await client.get("/run", params={"id": ident, "namespace": NS})
            link = re.search(r'id="deliver" href="(/confirm/deliver\?[^"]+)"', run_page.text)
            assert link is not None, run_page.text
            page = (await client.get(link.group(1).replace("&amp;", "&"))).text
            found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
            revision = re.search(r'name="revision" value="(\d+)"', page)
            assert found is not None and revision is not None, page
            query = {
                "id": ident,
                "namespace": NS,
                "key": f"approve:{ident}",
                "revision": revision.group(1),
            }
            payload = f'{{"{FIELD}": "{SECRET}", "nested": [{{"{FIELD}": "{SECRET}"}}]}}'
            done = await client.post(
                "/actions/deliver", data={**query, "payload": payload, "csrf": found.group(1)}
            )
            assert done.status_code == 200, done.text


# -- the checks -------------------------------------------------------------------------------


@contextmanager
def _settings_file(path: Path) -> Iterator[None]:
    """Within the block, this process reads its settings from ``path`` alone."""
    os.environ[CONFIG_ENV] = str(path)
    reset_settings()
    try:
        yield
    finally:
        del os.environ[CONFIG_ENV]
        reset_settings()


KEY = base64.b64encode(bytes(range(32))).decode()
"""The encryption variant's key (in its siglo.toml, as a development setup has it)."""


@asynccontextmanager
async def application(
    kind: str, home: Path, *, app_configures: bool, encrypt: bool = False
) -> AsyncIterator[Env]:
    """A backend of ``kind``, and the application's directory with its siglo.toml: the URL
    and (unless the application configures it in code) the redacted field — or, with
    ``encrypt``, an encryption key and nothing redacted."""
    async with shared_store(kind) as backend:
        toml = f'url = "{backend.url}"\ncommand_timeout_ms = 8000\n'
        if encrypt:
            toml += f'encryption_keys = {{ k1 = "{KEY}" }}\n'
        elif not app_configures:
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


async def _assert_encrypted(env: Env, name: str, ident: str) -> None:
    stored = await raw_bytes(env.kind, env.backend)
    assert SECRET.encode() not in stored, f"{name} stored the secret in clear on {env.kind}"
    assert b"$siglo" in stored, f"{name} stored nothing sealed on {env.kind}"
    settings = siglo.Settings(encryption_keys={"k1": KEY}, require_encryption=True)
    raw = env.backend.raw_adapter
    if name in (OFFLOADED, OFFLOADED_FLOW):
        # Its large value is a reference in the backend: read through the blob store too.
        raw = offload_adapter(raw, Offloader(open_blob_store((env.home / "blobs").as_uri()), 1))
    adapter, idempotency = pipeline_parts(raw, env.backend.idempotency, Pipeline(settings))
    if name == "idempotency.complete":
        assert idempotency is not None
        assert await idempotency.get_result(f"{NS}:{ident}") == {"receipt": {FIELD: SECRET}}
        return
    checkpoint = await adapter.get_checkpoint(ident, NS, fallback=False)
    assert checkpoint is not None, f"{name}: nothing stored under namespace {NS!r}"
    # What was encrypted reads back with the key (and nothing is left in clear:
    # require_encryption would refuse it).
    assert SECRET in orjson.dumps([checkpoint.contexts, checkpoint.metadata]).decode()


@pytest.mark.rule("pipeline.encryption")
@pytest.mark.parametrize("name", sorted(PATHS))
@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_every_path_encrypts_what_it_stores(kind: str, name: str, home: Path) -> None:
    """The encryption variant: siglo.toml holds a key and redacts nothing, and no path —
    worker, command line, import of a clear dump — leaves the secret readable in the raw
    bytes of any backend."""
    ident = "enc-" + re.sub(r"[^a-z]+", "-", name).strip("-")
    async with application(kind, home, app_configures=False, encrypt=True) as env:
        await PATHS[name](env, ident)
        await _assert_encrypted(env, name, ident)


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


# -- the timeout -----------------------------------------------------------------------------

TIGHT_MS = 300
"""``command_timeout_ms`` in the application's siglo.toml for the timeout check."""
BOUND_S = 4.0
"""How long a path in the test process may take to fail against a frozen server: a few
calls' worth of :data:`TIGHT_MS`, with room for a loaded machine. The default timeout
(10 s) is far beyond it, so a path that dropped the setting fails the check."""
COMMAND_BOUND_S = 8.0
"""The same for a ``siglo`` command, which also starts a Python process and imports the
application: still under the default timeout alone."""
HUNG_S = 30.0
"""Past this a path is reported as hung (and the check fails)."""
TIMEOUT_WORDS = ("timed out", "may or may not have taken effect")
"""What siglo's error says of a call past its time limit (StorageAdapterError's timeout,
OutcomeUnknownError)."""


@asynccontextmanager
async def frozen_redis_application(home: Path) -> AsyncIterator[tuple[Env, TcpProxy]]:
    """The application's directory with its siglo.toml naming a Redis reached through a
    loopback proxy the test freezes, and the tight timeout (from the settings only: the
    URL carries none)."""
    async with shared_store("redis") as store:
        parts = urlsplit(store.url)
        with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
            query = [(k, v) for k, v in parse_qsl(parts.query) if k != "command_timeout_ms"]
            url = urlunsplit(parts._replace(netloc=proxy.url_host, query=urlencode(query)))
            (home / "siglo.toml").write_text(
                f'url = "{url}"\ncommand_timeout_ms = {TIGHT_MS}\nredact_fields = ["{FIELD}"]\n'
            )
            (home / "app_flows.py").write_text(APP)
            env = Env(
                "redis",
                store,
                home,
                # One pass, no retry: the worker's supervised loop would otherwise ride
                # the outage out (tests/workflows/test_worker_supervision.py).
                extra_args={"worker": ("--retry-for", "0")},
                command_limit_s=HUNG_S,
            )
            yield env, proxy


def _timed_out(text: str) -> bool:
    return any(word in text for word in TIMEOUT_WORDS)


@pytest.mark.rule("manager.redaction")
@pytest.mark.parametrize("name", sorted(PATHS))
async def test_every_path_is_bounded_by_the_settings_timeout(name: str, home: Path) -> None:
    """Against a server that stops answering, each path fails within the bound with
    siglo's timeout, its timeout read from the application's siglo.toml — in this
    process, in the synchronous facade, and in ``siglo worker`` and ``siglo import``."""
    ident = "bounded-" + re.sub(r"[^a-z]+", "-", name).strip("-")
    async with frozen_redis_application(home) as (env, proxy):
        if name in BY_COMMAND:
            env.before_command = proxy.freeze  # the data it works on is in place
        else:
            proxy.freeze()
        began = time.monotonic()
        failure: BaseException | None = None
        try:
            await asyncio.wait_for(PATHS[name](env, ident), HUNG_S)
        except (CommandFailed, TimeoutError, siglo.StorageAdapterError) as exc:
            failure = exc
        finally:
            took = time.monotonic() - began
            proxy.cut()  # what still waits on the frozen server ends now
    if failure is None:
        pytest.fail(f"{name} reported success against a frozen server")
    if isinstance(failure, TimeoutError):
        pytest.fail(f"{name} hung for {HUNG_S} s against a frozen server")
    if isinstance(failure, CommandFailed):
        assert failure.status is not None, f"{name} hung: {failure}"
        assert _timed_out(failure.output), f"{name} failed, not on the timeout: {failure}"
        assert failure.took < COMMAND_BOUND_S, f"{name} took {failure.took:.1f} s: {failure}"
    else:
        assert _timed_out(str(failure)), f"{name} failed, not on the timeout: {failure!r}"
        assert took < BOUND_S, f"{name} took {took:.1f} s to fail (bound {BOUND_S} s)"


@pytest.mark.rule("manager.redaction", "blobs.bounded")
async def test_the_offloaded_path_is_bounded_when_its_blob_store_stalls(home: Path) -> None:
    """The offloaded path's own store is bounded by the same setting: a SQLite backend
    that answers, its blob store a Redis behind a proxy that freezes, and the tight
    timeout in the application's siglo.toml only (tests/core/test_blob_timeouts.py has
    the S3 and PostgreSQL stores and each call on its own)."""
    from _redis_helpers import REDIS_URL, require_redis

    require_redis()
    parts = urlsplit(REDIS_URL)
    async with shared_store("sqlite") as store:
        with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
            blob_url = f"redis://{proxy.url_host}/0?prefix=bounded-blobs-{os.getpid()}:"
            (home / "siglo.toml").write_text(
                f'url = "{store.url}"\ncommand_timeout_ms = {TIGHT_MS}\n'
                f'redact_fields = ["{FIELD}"]\nblob_url = "{blob_url}"\n'
            )
            proxy.freeze()
            began = time.monotonic()
            try:
                with pytest.raises(siglo.StorageAdapterError) as failed:
                    await asyncio.wait_for(
                        PATHS[OFFLOADED](Env("sqlite", store, home), "bounded-blobs"), HUNG_S
                    )
            finally:
                took = time.monotonic() - began
                proxy.cut()
    assert _timed_out(str(failed.value)), failed.value
    assert took < BOUND_S, f"took {took:.1f} s to fail (bound {BOUND_S} s)"


READ_AND_DELETE: dict[str, tuple[str, ...]] = {
    "ls": ("ls",),
    # One argument of `[URL] STACK_ID` is the id: the URL comes from the settings too.
    "show": ("show", "some-stack"),
    "export": ("export",),
    "rm": ("rm", "some-stack"),
    "prune": ("prune", "--older-than", "1d"),
    "clean": ("clean",),
}
"""The commands that read or delete, as they would run against the application's store."""


@pytest.mark.parametrize("command", sorted(READ_AND_DELETE))
async def test_every_command_is_bounded_by_the_settings_timeout(command: str, home: Path) -> None:
    async with frozen_redis_application(home) as (env, proxy):
        args = [a.format(url=env.settings_url) for a in READ_AND_DELETE[command]]
        proxy.freeze()
        try:
            with pytest.raises(CommandFailed) as failed:
                await asyncio.to_thread(env.siglo, *args)
        finally:
            proxy.cut()
        assert failed.value.status is not None, f"siglo {command} hung"
        assert failed.value.status == 1, failed.value
        assert _timed_out(failed.value.output), failed.value
        assert failed.value.took < COMMAND_BOUND_S, failed.value


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
    "StorageManager.redact_event": "reads",
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
    # siglo.sync.SyncFlow forwards to Flow on the portal's loop
    "sync.SyncFlow.*": "flow.run (input, durable wait, cached step)",
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
    "erase": "deletes only",
    "export": "reads",
    "import": "siglo import",
    "ls": "reads",
    "migrate": "schema only",
    "prune": "deletes only",
    "rekey": "rekey (re-saves what is stored)",
    "rm": "deletes only",
    "show": "reads",
    "ui": "siglo ui (deliver an event)",
    "worker": "siglo worker (a timer it fires)",
}
"""Every ``siglo`` command: the path of :data:`PATHS` that covers it, or why none is needed."""

_NOT_WRITERS = frozenset({"reads", "no I/O", "deletes only", "no stored data", "schema only"})
_NOT_WRITERS |= {
    # It re-saves stored checkpoints, and rewrites stand-alone wait records and cached
    # steps, through the codec chain of the command's settings (tests/core/test_rekey.py
    # reads the raw bytes after it, on every durable backend).
    "rekey (re-saves what is stored)",
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
