"""One manager shared by concurrent requests (SPEC §4 "A save saves the stack it was
given"): 16 tasks and 16 threads resume one stack, change it and save with a
compare-and-set, on SQLite, PostgreSQL and Redis. Every save acknowledged is stored —
through the object-bound API (``stack.save()``) and through the seed's id-based one
(``save_checkpoint(id)``), which refuses an id two callers hold instead of saving the
other caller's stack."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest
from raw_storage import any_backend

import siglo
from siglo import sync
from siglo.errors import AmbiguousStackError, CheckpointConflictError

KINDS = ("sqlite", "postgres", "redis")
REQUESTS = 16
ROUNDS = 4
"""Each request tries this many changes (64 in all), retrying a lost compare-and-set."""
STACK = "shared-order"
NS = "tenant-a"


def _add(stack: Any, marker: str) -> None:
    done = list(stack.context("log").get("markers", []))
    stack.set("log", "markers", [*done, marker])


async def _request_async(manager: siglo.StorageManager, marker: str, acked: list[str]) -> None:
    for _ in range(50):
        stack = await manager.resume(STACK, namespace=NS)
        assert stack is not None
        _add(stack, marker)
        await asyncio.sleep(0)  # let the other requests interleave here
        try:
            await stack.save(expected_revision=stack.revision)
        except CheckpointConflictError:
            continue
        acked.append(marker)
        return


async def _request_async_by_id(
    manager: siglo.StorageManager,
    marker: str,
    winner: bool,
    outcomes: dict[str, str],
    steps: asyncio.Barrier,
) -> None:
    """As :func:`_request_thread_by_id`, a task per request."""
    stack = await manager.resume(STACK, namespace=NS)
    assert stack is not None
    _add(stack, marker)
    await steps.wait()  # every request holds a live stack of the id
    try:
        await manager.save_checkpoint(STACK, expected_revision=stack.revision)
        outcomes[marker] = "saved while others held the id"
    except AmbiguousStackError:
        outcomes[marker] = "refused"
    await steps.wait()
    if not winner:
        manager.discard_stack(stack)  # the request ends
    await steps.wait()  # only the winner holds one now
    if winner:
        await manager.save_checkpoint(STACK, expected_revision=stack.revision)
        outcomes[marker] += ", then saved"
        manager.discard_stack(stack)


def _stored_markers(checkpoint: siglo.Checkpoint | None) -> set[str]:
    assert checkpoint is not None
    return set(checkpoint.contexts.get("log", {}).get("markers", []))


@pytest.mark.parametrize("by_id", [False, True], ids=["stack.save", "save_checkpoint-by-id"])
@pytest.mark.parametrize("kind", KINDS)
async def test_sixteen_tasks_share_one_manager(kind: str, by_id: bool) -> None:
    async with any_backend(kind) as backend:
        manager = siglo.StorageManager(backend, error_mode="strict")
        first = manager.create_stack(STACK, namespace=NS)
        await first.save()
        manager.discard_stack(first)
        del first
        acked: list[str] = []
        outcomes: dict[str, str] = {}
        for round_ in range(ROUNDS):
            markers = [f"r{round_}-t{i}" for i in range(REQUESTS)]
            steps = asyncio.Barrier(REQUESTS)
            await asyncio.gather(
                *(
                    _request_async_by_id(manager, marker, i == round_, outcomes, steps)
                    if by_id
                    else _request_async(manager, marker, acked)
                    for i, marker in enumerate(markers)
                )
            )
        _check(by_id, acked, outcomes, await backend.adapter.get_checkpoint(STACK, NS))


def _request_thread(
    manager: sync.StorageManager, marker: str, acked: list[str], start: threading.Barrier
) -> None:
    start.wait()
    for _ in range(200):
        stack = manager.resume(STACK, namespace=NS)
        assert stack is not None
        _add(stack, marker)
        try:
            stack.save(expected_revision=stack.revision)
        except CheckpointConflictError:
            continue
        acked.append(marker)
        return


def _request_thread_by_id(
    manager: sync.StorageManager,
    marker: str,
    winner: bool,
    outcomes: dict[str, str],
    steps: threading.Barrier,
) -> None:
    """Every request resumes the id and tries ``save_checkpoint(id)`` while all hold
    one: each is refused. Then all but the winner end (discard their stack), and the
    winner's id-based save stores its own stack."""
    steps.wait()
    stack = manager.resume(STACK, namespace=NS)
    assert stack is not None
    _add(stack, marker)
    steps.wait()  # every request holds a live stack of the id
    try:
        manager.save_checkpoint(STACK, expected_revision=stack.revision)
        outcomes[marker] = "saved while others held the id"
    except AmbiguousStackError:
        outcomes[marker] = "refused"
    steps.wait()
    if not winner:
        manager.discard_stack(stack)  # the request ends
    steps.wait()  # only the winner holds one now
    if winner:
        manager.save_checkpoint(STACK, expected_revision=stack.revision)
        outcomes[marker] += ", then saved"
        manager.discard_stack(stack)  # the request ends


@pytest.mark.parametrize("by_id", [False, True], ids=["stack.save", "save_checkpoint-by-id"])
@pytest.mark.parametrize("kind", KINDS)
async def test_sixteen_threads_share_one_sync_manager(kind: str, by_id: bool) -> None:
    """A Flask or Django app: one module-level manager, a thread per request."""
    async with any_backend(kind) as backend:
        # The same storage, reached by URL from the synchronous facade's own loop.
        with sync.connect(backend.url) as shared:
            manager = sync.StorageManager(shared, error_mode="strict")
            first = manager.create_stack(STACK, namespace=NS)
            first.save()
            manager.discard_stack(first)
            del first
            acked: list[str] = []
            outcomes: dict[str, str] = {}

            def run_round(round_: int) -> None:
                markers = [f"r{round_}-t{i}" for i in range(REQUESTS)]
                steps = threading.Barrier(REQUESTS)
                threads = [
                    threading.Thread(
                        target=_request_thread_by_id,
                        args=(manager, marker, i == round_, outcomes, steps),
                    )
                    if by_id
                    else threading.Thread(
                        target=_request_thread,
                        args=(manager, marker, acked, steps),
                    )
                    for i, marker in enumerate(markers)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(120)

            for round_ in range(ROUNDS):
                await asyncio.to_thread(run_round, round_)
        _check(by_id, acked, outcomes, await backend.adapter.get_checkpoint(STACK, NS))


def _check(
    by_id: bool, acked: list[str], outcomes: dict[str, str], stored: siglo.Checkpoint | None
) -> None:
    markers = _stored_markers(stored)
    if by_id:
        # While every request held the id, each id-based save was refused; then each
        # round's winner, alone, saved its own stack, and no other request's.
        winners = {f"r{r}-t{r}" for r in range(ROUNDS)}
        assert outcomes == {
            f"r{r}-t{i}": "refused, then saved" if f"r{r}-t{i}" in winners else "refused"
            for r in range(ROUNDS)
            for i in range(REQUESTS)
        }
        assert markers == winners
    else:
        # Through the stack object nothing is refused but a lost compare-and-set, which
        # each request retried: every change is acknowledged and stored.
        lost = sorted(set(acked) - markers)
        assert not lost, f"{len(lost)} acknowledged saves are not stored: {lost}"
        assert len(acked) == REQUESTS * ROUNDS


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("other", ["tenant-b", None], ids=["other-tenant", "no-namespace"])
async def test_a_tenants_background_conflict_is_raised_to_that_tenant_alone(
    kind: str, other: str | None
) -> None:
    """Tenants share a manager; a stack is its namespace and its id. Tenant A's
    background save (``checkpoint()``) loses a compare-and-set to another replica: the
    conflict waits for A's next call for its stack, and tenant B's calls for its own
    stack of the same id — a resume, a save that would succeed — neither raise it nor
    consume it."""
    async with any_backend(kind) as backend:
        manager = siglo.StorageManager(backend)
        for namespace in (NS, other):
            stack = manager.create_stack(STACK, namespace=namespace)
            stack.set("x", "owner", str(namespace))
            await stack.save(expected_revision=0)
            manager.discard_stack(stack)
        mine = await manager.resume(STACK, namespace=NS)
        assert mine is not None
        replica = siglo.StorageManager(backend)  # another process moves A's stack on
        moved = await replica.resume(STACK, namespace=NS)
        assert moved is not None
        moved.set("x", "by", "replica")
        await moved.save(expected_revision=moved.revision)
        mine.set("x", "by", "A")
        manager.checkpoint(mine, expected_revision=mine.revision)
        theirs = await manager.resume(STACK, namespace=other)  # B's request
        assert theirs is not None and theirs.context("x")["owner"] == str(other)
        theirs.set("x", "by", "B")
        saved = await theirs.save(expected_revision=theirs.revision)
        assert saved.revision == 2
        with pytest.raises(CheckpointConflictError):
            await manager.load_checkpoint(STACK, namespace=NS)  # A's own next call
        await manager.flush()  # raised once, then gone


async def test_discarding_an_id_two_callers_hold_is_refused() -> None:
    """``discard_stack(id)`` while two callers hold a live stack of the id would let go of
    the other caller's stack too: refused, as every id-only call is; the stack object is
    discarded alone, and then the id means the one still held."""
    async with any_backend("memory") as backend:
        manager = siglo.StorageManager(backend)
        first = manager.create_stack(STACK, namespace=NS)
        second = manager.create_stack(STACK, namespace="tenant-b")
        with pytest.raises(AmbiguousStackError, match="discard the stack object itself"):
            manager.discard_stack(STACK)
        assert set(map(id, manager._live_of(STACK))) == {id(first), id(second)}
        manager.discard_stack(first)
        second.set("x", "y", 1)
        saved = await manager.save_checkpoint(STACK)
        assert saved.namespace == "tenant-b"
        manager.discard_stack(STACK)
        assert manager._live_of(STACK) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refused_background_save_leaves_no_revision_to_overwrite_with(kind: str) -> None:
    """Two requests of one tenant hold the same stack in a shared manager. Request A's
    background save (``checkpoint()``) loses its compare-and-set to another replica's
    acknowledged save; whichever request calls first is told (the failure belongs to the
    stack). A's stack is back at the revision it read, so A's next compare-and-set is
    refused too, instead of matching the other writer's revision and overwriting its
    acknowledged save."""
    async with any_backend(kind) as backend:
        manager = siglo.StorageManager(backend)
        first = manager.create_stack(STACK, namespace=NS)
        first.set("x", "v", 0)
        await first.save(expected_revision=0)
        manager.discard_stack(first)
        mine = await manager.resume(STACK, namespace=NS)
        assert mine is not None
        replica = siglo.StorageManager(backend)
        moved = await replica.resume(STACK, namespace=NS)
        assert moved is not None
        moved.set("x", "by", "replica")
        await moved.save(expected_revision=moved.revision)  # acknowledged, revision 2
        theirs = await manager.resume(STACK, namespace=NS)  # another request, at 2
        assert theirs is not None
        mine.set("x", "by", "A")
        manager.checkpoint(mine, expected_revision=mine.revision)  # expects 1: refused
        await asyncio.sleep(0.2)  # the background save has run
        assert mine.revision == 1  # back at what it read
        with contextlib.suppress(CheckpointConflictError):
            await theirs.save(expected_revision=theirs.revision)  # may be told of A's
        mine.set("x", "step", 2)
        with pytest.raises(CheckpointConflictError):
            await mine.save(expected_revision=mine.revision)
        stored = await replica.load_checkpoint(STACK, namespace=NS)
        assert stored is not None and stored.contexts["x"]["by"] == "replica"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retry_without_a_reload_after_a_conflict_is_refused(kind: str) -> None:
    """A save that lost its compare-and-set leaves the stack at the revision it read:
    retrying with ``expected_revision=stack.revision`` without reloading is refused
    again, rather than matching the other writer's revision and overwriting it."""
    async with any_backend(kind) as backend:
        manager = siglo.StorageManager(backend)
        mine = manager.create_stack(STACK, namespace=NS)
        mine.set("x", "v", 0)
        await mine.save(expected_revision=0)
        replica = siglo.StorageManager(backend)
        moved = await replica.resume(STACK, namespace=NS)
        assert moved is not None
        moved.set("x", "by", "replica")
        await moved.save(expected_revision=moved.revision)
        mine.set("x", "by", "me")
        for _ in range(2):
            with pytest.raises(CheckpointConflictError):
                await mine.save(expected_revision=mine.revision)
            assert mine.revision == 1
        stored = await replica.load_checkpoint(STACK, namespace=NS)
        assert stored is not None and stored.contexts["x"]["by"] == "replica"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_queued_save_built_on_a_refused_one_is_refused_too(kind: str) -> None:
    """Two background saves queued, each a compare-and-set on the one before; another
    writer's save lands first. The first queued save is refused; the second, built on
    it, expects the revision the other writer now holds — it is refused too, never
    stored over that writer's acknowledged save."""
    async with any_backend(kind) as backend:
        manager = siglo.StorageManager(backend)
        mine = manager.create_stack(STACK, namespace=NS)
        mine.set("x", "v", "mine-1")
        await mine.save(expected_revision=0)
        replica = siglo.StorageManager(backend)
        moved = await replica.resume(STACK, namespace=NS)
        assert moved is not None
        moved.set("x", "v", "replica")
        await moved.save(expected_revision=moved.revision)  # revision 2, acknowledged
        for value in ("mine-2", "mine-3"):
            mine.set("x", "v", value)
            manager.checkpoint(mine, expected_revision=mine.revision)
        with pytest.raises(CheckpointConflictError) as raised:
            await manager.flush()
        assert raised.value.expected_revision == 1
        stored = await replica.load_checkpoint(STACK, namespace=NS)
        assert stored is not None and stored.revision == 2
        assert stored.contexts["x"]["v"] == "replica"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_requests_creating_one_new_id_race_by_compare_and_set(kind: str) -> None:
    """The documented resume-or-create idiom (docs/index.md) in concurrent requests
    sharing one manager, on an id not stored yet: each request gets a stack — a live
    one of another request is no reason to refuse — and the compare-and-set decides
    whose save is stored: the others get ``CheckpointConflictError`` (retry the
    request), never another error, and a retried request resumes what was stored."""
    async with any_backend(kind) as backend:
        manager = siglo.StorageManager(backend)
        steps = asyncio.Barrier(REQUESTS)

        async def request(marker: str) -> str:
            for attempt in range(REQUESTS + 1):
                stack = await manager.resume("new-cart", namespace=NS) or manager.create_stack(
                    "new-cart", namespace=NS
                )
                try:
                    _add(stack, marker)
                    if attempt == 0:
                        await steps.wait()  # every request holds a live stack of the id
                    await stack.save(expected_revision=stack.revision)
                    return "acked" if attempt == 0 else "retried"
                except CheckpointConflictError:
                    continue
                finally:
                    manager.discard_stack(stack)
            return "gave up"

        outcomes = await asyncio.gather(*(request(f"r{i}") for i in range(REQUESTS)))
        assert outcomes.count("acked") == 1, outcomes
        assert outcomes.count("retried") == REQUESTS - 1, outcomes
        stored = await manager.load_checkpoint("new-cart", namespace=NS)
        assert stored is not None
        assert sorted(stored.contexts["log"]["markers"]) == sorted(f"r{i}" for i in range(REQUESTS))
        assert manager.stacks == {}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
async def test_a_flush_cut_off_by_its_caller_cancels_no_save(kind: str) -> None:
    """Request B's ``flush()`` under a deadline that ends at once: the background saves
    it waited for — request A's too — still run, and A's ``flush()`` acknowledges
    only what is stored (before, B's cancelled drain cancelled every queued save, and
    A's flush returned as if they were stored)."""
    async with any_backend(kind) as backend:
        manager = siglo.StorageManager(backend)
        a = manager.create_stack("order-a")
        b = manager.create_stack("order-b")
        a.set("order", "paid", True)
        b.set("order", "paid", True)
        manager.checkpoint(a)
        manager.checkpoint(b)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0):
                await manager.flush()
        await manager.flush()  # A's: returns once what it waits for is stored
        other = siglo.StorageManager(backend)
        for stack_id in ("order-a", "order-b"):
            stored = await other.load_checkpoint(stack_id)
            assert stored is not None and stored.contexts["order"] == {"paid": True}, stack_id


_T2_DONE: dict[str, asyncio.Event] = {}


async def _ask(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "event": await siglo.wait_for_event(f"go:{state['ns']}")}


async def _quote(state: dict[str, Any]) -> dict[str, Any]:
    if state["ns"] == "t1":
        # t2's delivery of the same stack id runs to its end (its stack registered in
        # the shared manager, then discarded) while t1's step is still computing.
        await _T2_DONE["t2"].wait()
    return {"password": f"SECRET-{state['ns']}", "price": 10}


_QUOTES = siglo.flow(
    siglo.Step.create("ask", _ask),
    siglo.Step.create("quote", _quote).cache(ttl_ms=600_000, key=lambda _: "quote"),
    name="quotes",
)


async def test_a_cached_output_is_redacted_by_its_own_runs_keys_in_a_shared_manager() -> None:
    """Two tenants' runs of one stack id, resumed at once by a manager without keys of
    its own (a webhook handler sharing one manager): each cached output is redacted by
    its run's own keys (its checkpoint's ``redactFields``). The redaction looked the
    run's stack up by id, and found the other tenant's, or none once that one was done:
    t1's entry was stored with the password in clear, and a later cache hit returned it
    (a black-box auditor)."""
    _T2_DONE["t2"] = asyncio.Event()
    async with any_backend("sqlite") as backend:
        app = siglo.StorageManager(backend, redact_fields={"password"})
        for ns in ("t1", "t2"):
            with contextlib.suppress(siglo.WorkflowSuspended):
                await _QUOTES.run({"ns": ns}, manager=app, stack_id="order-1", namespace=ns)
        hook = siglo.StorageManager(backend)

        async def deliver(ns: str) -> Any:
            try:
                return await _QUOTES.deliver(f"go:{ns}", {"ok": True}, manager=hook, namespace=ns)
            finally:
                if ns == "t2":
                    _T2_DONE["t2"].set()

        await asyncio.gather(deliver("t1"), deliver("t2"))
        for ns in ("t1", "t2"):
            entry = await backend.raw_adapter.get_cached_step("quote", namespace=f"{ns}")
            stored = await app.load_checkpoint("order-1", namespace=ns)
            assert stored is not None
            assert stored.contexts["quote"]["output"]["password"] == "[REDACTED]"
            assert entry == {"password": "[REDACTED]", "price": 10}, (ns, entry)
        # By id, a manager redacts by the keys of every live stack of that id.
        one = hook.create_stack("s", namespace="a", redact_fields={"card"})
        other = hook.create_stack("s", namespace="b", redact_fields={"pin"})
        assert hook.redact({"card": 1, "pin": 2, "x": 3}, "s") == {
            "card": "[REDACTED]",
            "pin": "[REDACTED]",
            "x": 3,
        }
        assert hook.redact({"card": 1, "pin": 2}, one) == {"card": "[REDACTED]", "pin": 2}
        hook.discard_stack(one)
        assert hook.redact({"card": 1, "pin": 2}, "s") == {"card": 1, "pin": "[REDACTED]"}
        assert other.namespace == "b"
