"""Checks of operating what is stored (SPEC §9): listing, deleting, due waits.

Every check works inside namespaces and ids of its own (``ctx.id``), so whatever other
checks left in a shared store cannot disturb it: listings are filtered by the check's
namespace, and due waits are looked for among the check's correlation keys.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from siglo.adapter import Capability, StorageAdapter
from siglo.checkpoint import Checkpoint
from siglo.errors import CheckpointConflictError
from siglo.listing import MAX_PAGE_SIZE, CheckpointSummary
from siglo.records import ContextChangeEvent, WaitRecord
from siglo.sentinel import MISSING, Missing
from siglo_contract.registry import CheckContext, check, expect, fail

C = Capability


def _cp(ctx: CheckContext, stack: str, revision: int = 1, **fields: Any) -> Checkpoint:
    fields.setdefault("timestamp", ctx.now_ms())
    return Checkpoint(stack_id=stack, revision=revision, **fields)


async def walk(
    adapter: StorageAdapter,
    rule_id: str,
    *,
    limit: int,
    namespace: str | Missing | None = MISSING,
    between_pages: Any = None,
    **filters: Any,
) -> list[CheckpointSummary]:
    """Every summary of a walk, page by page; each page checked against ``limit``."""
    out: list[CheckpointSummary] = []
    cursor = None
    for pages in range(100_000):
        page = await adapter.list_checkpoints(
            namespace=namespace, limit=limit, cursor=cursor, **filters
        )
        expect(
            len(page.items) <= limit,
            rule_id,
            f"a page of limit={limit} held {len(page.items)} summaries",
        )
        out.extend(page.items)
        if page.next_cursor is None:
            return out
        expect(
            page.items or pages < 2,
            rule_id,
            "pages keep coming back empty with a next_cursor",
        )
        cursor = page.next_cursor
        if between_pages is not None:
            await between_pages(pages)
    fail(rule_id, "the walk never ended")


@check("list.walk")
async def list_walks_every_checkpoint_once(ctx: CheckContext) -> None:
    """A walk in pages of any size returns each live checkpoint once, as summaries."""
    a = ctx.backend.adapter
    ns = ctx.id("walk")
    saved: dict[str, Checkpoint] = {}
    for i in range(23):
        cp = _cp(
            ctx,
            f"stack-{i:02}",
            revision=1 + i % 3,
            namespace=ns,
            workflow_id=f"wf-{i % 2}",
            status="completed" if i % 4 == 0 else "running",
            expires_at=None if i % 5 else ctx.now_ms() + 3_600_000,
        )
        await a.save_checkpoint(cp)
        saved[cp.stack_id] = cp
    empty = await a.list_checkpoints(namespace=ctx.id("nothing-here"))
    expect(
        not empty.items and empty.next_cursor is None,
        "list.walk",
        f"an empty namespace lists {empty!r}",
    )
    for limit in (1, 5, 23, 24, 100):
        got = await walk(a, "list.walk", limit=limit, namespace=ns)
        ids = [s.stack_id for s in got]
        expect(
            len(ids) == len(set(ids)),
            "list.walk",
            f"limit={limit}: a stack listed twice: {sorted(ids)}",
        )
        expect(
            set(ids) == set(saved),
            "list.walk",
            f"limit={limit}: listed {sorted(ids)}, saved {sorted(saved)}",
        )
        for summary in got:
            want = CheckpointSummary.of(saved[summary.stack_id])
            expect(summary == want, "list.walk", f"summary {summary!r}, want {want!r}")
    # Re-saving moves the summary; the walk still holds the stack once.
    first = saved["stack-00"]
    await a.save_checkpoint(first.replace(revision=first.revision + 1, status="failed"))
    got = await walk(a, "list.walk", limit=4, namespace=ns)
    moved = [s for s in got if s.stack_id == "stack-00"]
    expect(
        len(moved) == 1 and moved[0].revision == first.revision + 1 and moved[0].status == "failed",
        "list.walk",
        f"after a re-save the stack lists as {moved!r}",
    )
    await _walk_across_namespaces(ctx)
    everything = await walk(a, "list.walk", limit=MAX_PAGE_SIZE)
    mine = [s for s in everything if s.namespace == ns]
    expect(
        len(mine) == len(saved),
        "list.walk",
        f"a walk of every namespace holds {len(mine)} of the {len(saved)} stacks of {ns!r}",
    )


async def _walk_across_namespaces(ctx: CheckContext) -> None:
    """A walk of every namespace, filtered by a workflow id (and a status) only this
    check uses, in pages of several sizes: each stack of each namespace once. The same
    stack ids in several namespaces, and un-namespaced ones, make a cursor that forgets
    the namespace lose stacks, and a page boundary that repeats a stack shows."""
    a = ctx.backend.adapter
    workflow = ctx.id("walk-wf")
    saved: set[tuple[str | None, str]] = set()
    running: set[tuple[str | None, str]] = set()
    for n, namespace in enumerate((None, ctx.id("walk-a"), ctx.id("walk-b"), ctx.id("walk-c"))):
        for i in range(4 + n):
            stack = ctx.id(f"x{(i * 7 + n) % 10}")
            status = "running" if (i + n) % 2 else "waiting"
            cp = _cp(ctx, stack, namespace=namespace, workflow_id=workflow, status=status)
            await a.save_checkpoint(cp)
            saved.add((namespace, stack))
            if status == "running":
                running.add((namespace, stack))
    for limit in (1, 2, 3, 5, 7):
        for filters, want in (({}, saved), ({"status": "running"}, running)):
            got = await walk(a, "list.walk", limit=limit, workflow_id=workflow, **filters)
            keys = [(s.namespace, s.stack_id) for s in got]
            # A stack that does not pass the filters is the filters' fault (every stack
            # of this workflow id is this check's); one missed or repeated, the walk's.
            extra = sorted(set(keys) - want, key=str)
            expect(
                not extra,
                "list.filters",
                f"a walk of every namespace (workflow_id and {filters or 'no other filter'}, "
                f"limit={limit}) listed {extra[:8]}, which do not pass the filters",
            )
            twice = sorted({k for k in keys if keys.count(k) > 1}, key=str)
            expect(
                not twice,
                "list.walk",
                f"a walk of every namespace (workflow_id and {filters or 'no other filter'}, "
                f"limit={limit}) listed twice: {twice}",
            )
            missed = sorted(want - set(keys), key=str)
            expect(
                not missed,
                "list.walk",
                f"a walk of every namespace (workflow_id and {filters or 'no other filter'}, "
                f"limit={limit}) missed {missed}",
            )


@check("list.filters")
async def list_filters(ctx: CheckContext) -> None:
    """namespace (None: un-namespaced only), status, workflow_id, updated_after/before."""
    a = ctx.backend.adapter
    ns, other = ctx.id("filters"), ctx.id("filters-other")
    t0 = ctx.now_ms() - 10_000
    rows = [
        _cp(ctx, ctx.id("f0"), namespace=ns, workflow_id="a", status="running", timestamp=t0),
        _cp(ctx, ctx.id("f1"), namespace=ns, workflow_id="b", status="completed", timestamp=t0 + 1),
        _cp(ctx, ctx.id("f2"), namespace=ns, workflow_id="a", status="failed", timestamp=t0 + 2),
        _cp(ctx, ctx.id("f3"), namespace=ns, status="waiting", timestamp=t0 + 3),
        _cp(ctx, ctx.id("f0"), namespace=other, workflow_id="a", timestamp=t0),
        _cp(ctx, ctx.id("f4"), workflow_id="a", status="completed", timestamp=t0 + 1),
    ]
    for cp in rows:
        await a.save_checkpoint(cp)

    async def ids(rule_filters: dict[str, Any], namespace: Any = ns) -> set[str]:
        got = await walk(a, "list.filters", limit=2, namespace=namespace, **rule_filters)
        if namespace is MISSING:
            got = [s for s in got if s.namespace in (ns, other, None)]
        return {s.stack_id for s in got if s.stack_id.startswith(ctx.id(""))}

    cases: list[tuple[dict[str, Any], Any, set[str]]] = [
        ({}, ns, {ctx.id("f0"), ctx.id("f1"), ctx.id("f2"), ctx.id("f3")}),
        ({}, other, {ctx.id("f0")}),
        ({"status": "completed"}, ns, {ctx.id("f1")}),
        ({"status": ["completed", "failed"]}, ns, {ctx.id("f1"), ctx.id("f2")}),
        ({"workflow_id": "a"}, ns, {ctx.id("f0"), ctx.id("f2")}),
        ({"updated_after": t0}, ns, {ctx.id("f1"), ctx.id("f2"), ctx.id("f3")}),
        ({"updated_before": t0 + 2}, ns, {ctx.id("f0"), ctx.id("f1")}),
        ({"updated_after": t0, "updated_before": t0 + 3}, ns, {ctx.id("f1"), ctx.id("f2")}),
        ({"workflow_id": "a", "status": "running"}, ns, {ctx.id("f0")}),
        ({"status": "completed"}, MISSING, {ctx.id("f1"), ctx.id("f4")}),
    ]
    for filters, namespace, want in cases:
        got = await ids(filters, namespace)
        expect(
            got == want,
            "list.filters",
            f"list_checkpoints(namespace={namespace!r}, {filters}) gave {sorted(got)}, "
            f"want {sorted(want)}",
        )
    unnamespaced = await walk(a, "list.filters", limit=MAX_PAGE_SIZE, namespace=None)
    expect(
        all(s.namespace is None for s in unnamespaced)
        and ctx.id("f4") in {s.stack_id for s in unnamespaced},
        "list.filters",
        "namespace=None must list exactly the un-namespaced stacks",
    )


@check("list.hidden")
async def list_hides_expired_and_deleted(ctx: CheckContext) -> None:
    """Expired checkpoints (clean-up or not) and deleted ones are never listed."""
    a = ctx.backend.adapter
    ns = ctx.id("hidden")
    ttl = ctx.short_ttl_ms()
    # A workflow id of the check's own: walks of every namespace see its stacks only.
    wf = ctx.id("hidden-wf")
    await a.save_checkpoint(_cp(ctx, "kept", namespace=ns, workflow_id=wf))
    await a.save_checkpoint(
        _cp(ctx, "expiring", namespace=ns, expires_at=ctx.now_ms() + ttl, workflow_id=wf)
    )
    await a.save_checkpoint(
        _cp(ctx, "gone", namespace=ns, expires_at=ctx.now_ms() - 1, workflow_id=wf)
    )
    await a.save_checkpoint(_cp(ctx, "deleted", namespace=ns, workflow_id=wf))
    if a.supports(C.DELETION):
        await a.delete_checkpoint("deleted", ns)
        present = {"kept", "expiring"}
    else:
        present = {"kept", "expiring", "deleted"}

    async def listed(when: str) -> None:
        for where in (ns, MISSING):
            got = {
                s.stack_id
                for s in await walk(a, "list.hidden", limit=1, namespace=where, workflow_id=wf)
            }
            expect(
                got == present,
                "list.hidden",
                f"{when}a walk of {'every namespace' if where is MISSING else 'its namespace'} "
                f"listed {sorted(got)}, want {sorted(present)}",
            )

    await listed("")
    await ctx.pass_time(ttl)
    present.discard("expiring")
    await listed("after the expiry passed, ")


async def _by_index(
    a: StorageAdapter, tokens: dict[str, str], ns: str, limit: int, **filters: Any
) -> list[str]:
    """The stack ids of a walk by tokens; each page checked against ``limit``, no stack
    twice."""
    out: list[str] = []
    cursor = None
    for _ in range(10_000):
        page = await a.list_checkpoints_by_index(
            tokens, namespace=ns, limit=limit, cursor=cursor, **filters
        )
        expect(
            len(page.items) <= limit,
            "list.by-index",
            f"a page of limit={limit} held {len(page.items)} summaries",
        )
        out.extend(s.stack_id for s in page.items)
        if page.next_cursor is None:
            expect(
                len(out) == len(set(out)),
                "list.by-index",
                f"limit={limit}: a stack listed twice: {sorted(out)}",
            )
            return sorted(out)
        cursor = page.next_cursor
    fail("list.by-index", "the walk by tokens never ended")


@check("list.by-index")
async def list_by_index_follows_every_write(ctx: CheckContext) -> None:
    """``list_checkpoints_by_index`` lists the live stacks of a namespace whose stored
    ``$sigloIndex`` holds the tokens: after a value changes, a token goes, a delete, an
    expiry, a namespace emptied; with paging and the other filters."""
    a = ctx.backend.adapter
    ns, other = ctx.id("tokens"), ctx.id("tokens-other")
    ttl = ctx.short_ttl_ms()
    ctx.about("list.by-index")
    revision: dict[str, int] = {}

    async def save(stack: str, namespace: str = ns, status: str = "running", **tokens: str) -> None:
        revision[stack] = revision.get(stack, 0) + 1
        metadata: dict[str, Any] = {"note": stack}
        if tokens:
            metadata["$sigloIndex"] = tokens
        await a.save_checkpoint(
            _cp(ctx, stack, revision[stack], namespace=namespace, status=status, metadata=metadata)
        )

    async def listed(when: str, tokens: dict[str, str], want: set[str], **filters: Any) -> None:
        for limit in (1, 3, 100):
            got = await _by_index(a, tokens, ns, limit, **filters)
            expect(
                got == sorted(want),
                "list.by-index",
                f"{when}: by {tokens} {filters or ''} (limit={limit}) listed {got}, "
                f"want {sorted(want)}",
            )

    stacks = [f"s{i}" for i in range(7)]
    for i, stack in enumerate(stacks):
        await save(stack, status="completed" if i == 0 else "running", c="A" if i < 5 else "B")
    await save("plain")  # no tokens
    await save("s0", other, c="A")  # the same token in another namespace
    await listed("after the saves", {"c": "A"}, {"s0", "s1", "s2", "s3", "s4"})
    await listed("with a status", {"c": "A"}, {"s1", "s2", "s3", "s4"}, status="running")
    await listed("a value nobody has", {"c": "Z"}, set())
    await save("s1", c="B")  # the value changes
    await save("s2")  # the token goes
    await save("s3", c="A", d="X")  # a second field
    await listed("after the values changed", {"c": "A"}, {"s0", "s3", "s4"})
    await listed("after the values changed", {"c": "B"}, {"s1", "s5", "s6"})
    await listed("with two fields", {"c": "A", "d": "X"}, {"s3"})
    if a.supports(C.DELETION):
        await a.delete_checkpoint("s4", ns)
        await listed("after a delete", {"c": "A"}, {"s0", "s3"})
    else:
        await save("s4", c="gone")
    revision["s3"] += 1
    await a.save_checkpoint(
        _cp(
            ctx,
            "s3",
            revision["s3"],
            namespace=ns,
            expires_at=ctx.now_ms() + ttl,
            metadata={"$sigloIndex": {"c": "A"}},
        )
    )
    await listed("before its expiry", {"c": "A"}, {"s0", "s3"})
    await ctx.pass_time(ttl)
    await listed("after its expiry", {"c": "A"}, {"s0"})
    if a.supports(C.DELETION):
        for stack in [*stacks, "plain"]:
            await a.delete_checkpoint(stack, ns)
        await listed("after every stack of the namespace was deleted", {"c": "B"}, set())
        await a.save_checkpoint(
            _cp(ctx, "s1", 1, namespace=ns, metadata={"$sigloIndex": {"c": "B"}})
        )
        await listed("after a stack was created again", {"c": "B"}, {"s1"})


@check("list.concurrent")
async def list_under_concurrent_writes(ctx: CheckContext) -> None:
    """Saves, new stacks and deletes between and during pages: no stack twice, every
    stack that lived through the walk listed, none listed after its delete."""
    a = ctx.backend.adapter
    ns = ctx.id("busy")
    rng = random.Random(7)
    revisions: dict[str, int] = {}
    for i in range(60):
        revisions[f"s{i:03}"] = 1
        await a.save_checkpoint(_cp(ctx, f"s{i:03}", namespace=ns))
    deletable = a.supports(C.DELETION)
    doomed = set(rng.sample(sorted(revisions), 12)) if deletable else set()
    deleted: set[str] = set()
    created: list[str] = []

    async def write_a_little(page: int) -> None:
        for stack in rng.sample(sorted(revisions), 5):
            revisions[stack] += 1
            status = rng.choice(["running", "waiting", "completed"])
            await a.save_checkpoint(_cp(ctx, stack, revisions[stack], namespace=ns, status=status))
        name = f"new{page:03}"
        created.append(name)
        revisions[name] = 1
        await a.save_checkpoint(_cp(ctx, name, namespace=ns))
        for stack in sorted(doomed - deleted)[:2]:
            if stack in revisions:
                await a.delete_checkpoint(stack, ns)
                deleted.add(stack)
                del revisions[stack]

    seen: list[str] = []
    cursor = None
    while True:
        gone_before = set(deleted)
        # A writer races the page read itself; what was deleted before it began must
        # not be listed.
        page, _ = await asyncio.gather(
            a.list_checkpoints(namespace=ns, limit=4, cursor=cursor),
            write_a_little(len(seen) + 1000),
        )
        late = sorted({s.stack_id for s in page.items} & gone_before)
        expect(not late, "list.concurrent", f"listed after their delete: {late}")
        seen.extend(s.stack_id for s in page.items)
        if page.next_cursor is None:
            break
        await write_a_little(len(seen))
        cursor = page.next_cursor
    twice = sorted({s for s in seen if seen.count(s) > 1})
    expect(not twice, "list.concurrent", f"stacks listed twice in one walk: {twice}")
    throughout = {f"s{i:03}" for i in range(60)} - doomed
    missing = sorted(throughout - set(seen))
    expect(not missing, "list.concurrent", f"stacks alive all along but never listed: {missing}")


@check("delete.stack")
async def delete_removes_the_stack(ctx: CheckContext) -> None:
    """delete_checkpoint removes the checkpoint, the stack's waits and the context streams
    of its checkpoint's steps in that namespace (other namespaces and stacks keep theirs);
    True only if it was live."""
    a = ctx.backend.adapter
    caps = ctx.session.target.capabilities
    # A bystander whose id the doomed one prefixes: a delete by key pattern takes it too.
    stack, other_stack = ctx.id("doomed"), ctx.id("doomed*2")
    ns = ctx.id("del-ns")
    for namespace in (ns, None):
        for sid in (stack, other_stack):
            # As a workflow leaves it: the step's context in the checkpoint, streamed too.
            await a.save_checkpoint(_cp(ctx, sid, 2, namespace=namespace, contexts={"p": {"k": 1}}))
            if C.WAIT_RECORDS in caps:
                await a.save_wait_record(
                    WaitRecord(
                        correlation_key=f"{sid}:{namespace}:w",
                        stack_id=sid,
                        namespace=namespace,
                        step_id="p",
                    )
                )
            if C.CONTEXT_STREAM in caps:
                await a.on_context_change(
                    ContextChangeEvent(
                        stack_id=sid,
                        step_id="p",
                        key="k",
                        value=1,
                        namespace=namespace,
                        timestamp=ctx.now_ms(),
                    )
                )
    if C.WAIT_RECORDS in caps:
        # A worker holds the doomed stack's wait: the delete removes it all the same.
        claimed = await a.claim_wait_record(f"{stack}:{ns}:w", "worker", namespace=ns)
        expect(claimed is not None, "wait.claim.once", "a fresh wait record could not be claimed")
    deleted = await a.delete_checkpoint(stack, ns)
    expect(deleted is True, "delete.stack", f"deleting a live stack returned {deleted!r}")
    expect(
        await a.get_checkpoint(stack, ns, fallback=False) is None,
        "delete.stack",
        "the checkpoint is still there",
    )
    if C.WAIT_RECORDS in caps:
        record = await a.get_wait_record(f"{stack}:{ns}:w", namespace=ns)
        expect(record is None, "delete.stack", f"its wait record is still there: {record!r}")
        for sid, namespace in ((stack, None), (other_stack, ns), (other_stack, None)):
            expect(
                await a.get_wait_record(f"{sid}:{namespace}:w", namespace=namespace) is not None,
                "delete.stack",
                f"the wait record of ({namespace!r}, {sid!r}) went too",
            )
    if C.CONTEXT_STREAM in caps:
        fields = await a.get_context_changes(stack, "p", ns)
        expect(not fields, "delete.stack", f"its context stream is still there: {fields!r}")
        for sid, namespace in ((stack, None), (other_stack, ns)):
            expect(
                await a.get_context_changes(sid, "p", namespace) == {"k": 1},
                "delete.stack",
                f"the context stream of ({namespace!r}, {sid!r}) went too",
            )
    for sid, namespace in ((stack, None), (other_stack, ns), (other_stack, None)):
        expect(
            await a.get_checkpoint(sid, namespace, fallback=False) is not None,
            "delete.stack",
            f"the checkpoint of ({namespace!r}, {sid!r}) went too",
        )
    again = await a.delete_checkpoint(stack, ns)
    expect(again is False, "delete.stack", f"deleting it again returned {again!r}")
    expired = ctx.id("expired")
    await a.save_checkpoint(_cp(ctx, expired, expires_at=ctx.now_ms() - 1))
    gone = await a.delete_checkpoint(expired)
    expect(gone is False, "delete.stack", f"deleting an expired stack returned {gone!r}")
    await a.save_checkpoint(_cp(ctx, stack, 1, namespace=ns))
    back = await a.get_checkpoint(stack, ns, fallback=False)
    expect(
        back is not None and back.revision == 1,
        "delete.stack",
        f"after a delete the stack starts over at any revision; read {back!r}",
    )


@check("delete.cas")
async def delete_compare_and_set(ctx: CheckContext) -> None:
    """With expected_revision, a delete happens only at that stored revision."""
    a = ctx.backend.adapter
    caps = ctx.session.target.capabilities
    stack = ctx.id("cas")
    cp = _cp(ctx, stack, 3)
    await a.save_checkpoint(cp)
    if C.WAIT_RECORDS in caps:
        await a.save_wait_record(WaitRecord(correlation_key=ctx.id("cas-w"), stack_id=stack))
    for wrong in (2, 4):
        try:
            await a.delete_checkpoint(stack, expected_revision=wrong)
        except CheckpointConflictError as exc:
            expect(
                exc.current_revision == 3 and exc.expected_revision == wrong,
                "delete.cas",
                f"the conflict says current={exc.current_revision}, "
                f"expected={exc.expected_revision}",
            )
        else:
            fail("delete.cas", f"a delete expecting revision {wrong} of revision 3 went ahead")
        expect(
            await a.get_checkpoint(stack) == cp,
            "delete.cas",
            "a refused delete changed the checkpoint",
        )
        if C.WAIT_RECORDS in caps:
            expect(
                await a.get_wait_record(ctx.id("cas-w")) is not None,
                "delete.cas",
                "a refused delete removed a wait record",
            )
    try:
        await a.delete_checkpoint(ctx.id("never"), expected_revision=1)
    except CheckpointConflictError as exc:
        expect(
            exc.current_revision is None,
            "delete.cas",
            f"a missing stack's conflict says current={exc.current_revision}",
        )
    else:
        fail("delete.cas", "a delete expecting revision 1 of a missing stack went ahead")
    ok = await a.delete_checkpoint(stack, expected_revision=3)
    expect(ok is True, "delete.cas", f"a delete at the stored revision returned {ok!r}")
    expect(await a.get_checkpoint(stack) is None, "delete.cas", "the checkpoint is still there")
    # Inside a namespace the revision compared is the namespace's, never the
    # un-namespaced checkpoint's of the same stack.
    ns = ctx.id("cas-ns")
    await a.save_checkpoint(_cp(ctx, stack, 5))
    inside = _cp(ctx, stack, 2, namespace=ns)
    await a.save_checkpoint(inside)
    try:
        await a.delete_checkpoint(stack, ns, expected_revision=5)
    except CheckpointConflictError as exc:
        expect(
            exc.current_revision == 2,
            "delete.cas",
            f"the conflict of a delete in a namespace says current={exc.current_revision}, "
            "want the namespace's revision 2",
        )
    else:
        fail(
            "delete.cas",
            "a delete in a namespace expecting revision 5 went ahead at its revision 2 "
            "(5 is the un-namespaced checkpoint's)",
        )
    expect(
        await a.get_checkpoint(stack, ns, fallback=False) == inside,
        "delete.cas",
        "a refused delete in a namespace changed its checkpoint",
    )
    ok = await a.delete_checkpoint(stack, ns, expected_revision=2)
    expect(ok is True, "delete.cas", f"a delete in a namespace at its revision returned {ok!r}")
    expect(
        await a.get_checkpoint(stack, ns, fallback=False) is None,
        "delete.cas",
        "the namespace's checkpoint is still there after its delete",
    )
    outside = await a.get_checkpoint(stack)
    expect(
        outside is not None and outside.revision == 5,
        "delete.cas",
        f"a delete in a namespace changed the un-namespaced checkpoint: {outside!r}",
    )


@check("delete.rerun")
async def delete_spares_a_rerun(ctx: CheckContext) -> None:
    """A delete racing a re-run of the same stack id leaves the new run's checkpoint,
    wait record and context stream alone."""
    a = ctx.backend.adapter
    caps = ctx.session.target.capabilities
    rounds = 6

    async def start(stack: str, namespace: str | None, run: str) -> None:
        await a.save_checkpoint(
            _cp(ctx, stack, 1, namespace=namespace, contexts={"approve": {"k": "same"}}),
            expected_revision=0,
        )
        if C.CONTEXT_STREAM in caps:
            await a.on_context_change(
                ContextChangeEvent(
                    stack_id=stack,
                    step_id="approve",
                    key="k",
                    value="same",  # a re-run with the same input writes the same values
                    namespace=namespace,
                    timestamp=ctx.now_ms(),
                )
            )
        if C.WAIT_RECORDS in caps:
            await a.save_wait_record(
                WaitRecord(
                    correlation_key=f"{stack}:approve",
                    stack_id=stack,
                    namespace=namespace,
                    step_id="approve",
                    metadata={"run": run},
                )
            )

    async def rerun(stack: str, namespace: str | None) -> bool:
        for _ in range(5_000):
            try:
                await start(stack, namespace, "new")
                return True
            except CheckpointConflictError:
                await asyncio.sleep(0)
        return False

    for i in range(rounds):
        namespace = None if i % 2 else ctx.id("rerun-ns")
        stack = ctx.id(f"rerun-{i}")
        await start(stack, namespace, "old")
        _, started = await asyncio.gather(
            a.delete_checkpoint(stack, namespace), rerun(stack, namespace)
        )
        if not started:
            fail("delete.rerun", f"the checkpoint of {stack!r} was never deleted")
        stored = await a.get_checkpoint(stack, namespace, fallback=False)
        expect(stored is not None, "delete.rerun", f"the re-run's checkpoint of {stack!r} is gone")
        if C.WAIT_RECORDS in caps:
            wait = await a.get_wait_record(f"{stack}:approve", namespace=namespace)
            run = None if wait is None else dict(wait.metadata or {}).get("run")
            expect(
                run == "new",
                "delete.rerun",
                f"after a delete of {stack!r} raced its re-run, the new run's wait record "
                f"is {'gone' if wait is None else 'the old one'}",
            )
        if C.CONTEXT_STREAM in caps:
            changes = await a.get_context_changes(stack, "approve", namespace)
            expect(
                changes.get("k") == "same",
                "delete.rerun",
                f"after a delete of {stack!r} raced its re-run, the new run's context "
                f"stream is {changes!r}",
            )


@check("waits.due", requires=(C.WAIT_RECORDS,))
async def due_waits(ctx: CheckContext) -> None:
    """Due: deadline passed and waiting, or claimed under a lapsed lease; earliest first;
    never a future deadline, no deadline, a live claim, completed or cancelled."""
    a = ctx.backend.adapter
    now = ctx.now_ms()
    ttl = ctx.short_ttl_ms()

    def rec(name: str, deadline: int | None) -> WaitRecord:
        return WaitRecord(
            correlation_key=ctx.id(name), stack_id=ctx.id("s-" + name), expires_at=deadline
        )

    await a.save_wait_record(rec("late", now - 30))
    await a.save_wait_record(rec("later", now - 10))
    await a.save_wait_record(rec("latest", now - 20))
    await a.save_wait_record(rec("future", now + 3_600_000))
    await a.save_wait_record(rec("no-deadline", None))
    await a.save_wait_record(rec("completed", now - 40))
    await a.claim_wait_record(ctx.id("completed"), "c", allow_expired=True)
    await a.complete_wait_record(ctx.id("completed"), "c")
    await a.save_wait_record(rec("cancelled", now - 40))
    await a.cancel_wait_record(ctx.id("cancelled"))
    await a.save_wait_record(rec("held", now - 50))
    await a.claim_wait_record(ctx.id("held"), "c", allow_expired=True, lease_ms=ttl)

    async def mine() -> list[str]:
        records = await a.list_due_waits(limit=MAX_PAGE_SIZE)
        deadlines = [r.expires_at or 0 for r in records]
        expect(
            deadlines == sorted(deadlines),
            "waits.due",
            f"due waits not earliest deadline first: {deadlines}",
        )
        return [r.correlation_key for r in records if r.correlation_key.startswith(ctx.id(""))]

    got = await mine()
    want = [ctx.id("late"), ctx.id("latest"), ctx.id("later")]
    expect(got == want, "waits.due", f"due waits {got}, want {want}")
    one = await a.list_due_waits(limit=1)
    expect(len(one) <= 1, "waits.due", f"limit=1 gave {len(one)} records")
    await ctx.pass_time(ttl)
    got = await mine()
    want = [ctx.id("held"), ctx.id("late"), ctx.id("latest"), ctx.id("later")]
    expect(
        got[:1] == want[:1] and sorted(got) == sorted(want),
        "waits.due",
        f"after the claim's lease ran out: {got}, want {want}",
    )
    await _due_at_the_deadline_and_in_a_namespace(ctx)
    await _limited_lookup_returns_the_earliest(ctx)
    await _never_due(ctx)


async def _due_at_the_deadline_and_in_a_namespace(ctx: CheckContext) -> None:
    """A wait whose deadline is now is due (the deadline has been reached), and due
    waits of a namespace are found, with their namespace."""
    a = ctx.backend.adapter
    ns = ctx.id("due-ns")
    in_ns = WaitRecord(
        correlation_key=ctx.id("in-ns"),
        stack_id=ctx.id("s-in-ns"),
        namespace=ns,
        expires_at=ctx.now_ms() - 5,
    )
    await a.save_wait_record(in_ns)
    exact = WaitRecord(
        correlation_key=ctx.id("exact"), stack_id=ctx.id("s-exact"), expires_at=ctx.now_ms()
    )
    await a.save_wait_record(exact)
    records = await a.list_due_waits(limit=MAX_PAGE_SIZE)
    found = {r.correlation_key: r for r in records}
    got = found.get(in_ns.correlation_key)
    expect(
        got is not None and got.namespace == ns,
        "waits.due",
        f"a due wait in namespace {ns!r} was listed as {got!r}",
    )
    expect(
        exact.correlation_key in found,
        "waits.due",
        f"a wait whose deadline {exact.expires_at} is now was not due",
    )


async def _limited_lookup_returns_the_earliest(ctx: CheckContext) -> None:
    """``limit=n`` returns the first n of the whole earliest-first list: which records a
    limited lookup returns is fixed, not whichever the store met first."""
    a = ctx.backend.adapter
    # Saved last, due the longest: the store meets it last, the lookup must return it.
    for i, deadline in enumerate((ctx.now_ms() - 2, 1, 2)):
        await a.save_wait_record(
            WaitRecord(
                correlation_key=ctx.id(f"ancient-{i}"),
                stack_id=ctx.id(f"s-ancient-{i}"),
                expires_at=deadline,
            )
        )
    whole = await a.list_due_waits(limit=MAX_PAGE_SIZE)
    for limit in (1, 2, 3):
        some = await a.list_due_waits(limit=limit)
        expect(len(some) <= limit, "waits.due", f"limit={limit} gave {len(some)} records")
        got = [r.expires_at for r in some]
        want = [r.expires_at for r in whole[:limit]]
        expect(
            got == want,
            "waits.due",
            f"limit={limit} returned deadlines {got}; the earliest due are {want}",
        )


async def _never_due(ctx: CheckContext) -> None:
    """Never due: a record past its retention (whatever its deadline), and a claim whose
    lease lapsed before its deadline came."""
    a = ctx.backend.adapter
    ttl = ctx.short_ttl_ms()
    await a.save_wait_record(
        WaitRecord(
            correlation_key=ctx.id("retention-gone"),
            stack_id=ctx.id("s-retention-gone"),
            expires_at=ctx.now_ms() - 100,
        ),
        ttl_ms=ttl,
    )
    early = WaitRecord(
        correlation_key=ctx.id("lapsed-early"),
        stack_id=ctx.id("s-lapsed-early"),
        expires_at=ctx.now_ms() + 3_600_000,
    )
    await a.save_wait_record(early)
    await a.claim_wait_record(early.correlation_key, "c", lease_ms=ttl)
    await ctx.pass_time(ttl)
    keys = {r.correlation_key for r in await a.list_due_waits(limit=MAX_PAGE_SIZE)}
    expect(
        ctx.id("retention-gone") not in keys,
        "waits.due",
        "a wait record past its retention was listed as due",
    )
    expect(
        early.correlation_key not in keys,
        "waits.due",
        "a claim whose lease lapsed was listed as due an hour before its deadline",
    )
