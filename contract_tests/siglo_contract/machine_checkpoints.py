"""State machine of the checkpoint rules: OCC saves, namespaces, fallback, expiry, clean-up."""

from __future__ import annotations

from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from siglo.adapter import Capability
from siglo.checkpoint import STATUSES, Checkpoint
from siglo.errors import CheckpointConflictError, InvalidArgumentError
from siglo.listing import ListQuery
from siglo.sentinel import MISSING
from siglo_contract.machine_base import (
    HOSTILE_IDS,
    ContractMachine,
    Outcome,
    falsy_values,
)
from siglo_memory.adapter import MemoryStorageAdapter

__all__ = ["CheckpointMachine"]

# Half the draws come from a small hot set, so programs revisit the same stacks.
STACKS = st.one_of(st.sampled_from(("a", "b")), st.sampled_from(HOSTILE_IDS))
NAMESPACES = st.one_of(
    st.sampled_from((None, "n")), st.sampled_from((None, "n", "n:a", "a", "*", "{n}"))
)
WORKFLOWS = st.sampled_from(("w1", "w2"))
"""The workflow id of a save (made the example's own): a listing filtered by it walks
every namespace and sees this example's stacks only."""
EXPIRY = st.sampled_from(("none", "none", "past", "soon", "later", "far"))

MANY_KEYS = tuple(f"f{i}" for i in range(30))
MANY_VALUES = (*falsy_values, 1, "v", {"n": [None, {}]}, [0, ""])
# Whole objects drawn from fixed shapes: hypothesis draws a dictionary key by key, which
# cost more than the saves themselves; these shapes hold what the generator is for.
CONTEXT = st.one_of(
    st.sampled_from(
        (
            {},
            {"step": 1},
            {"b:c": {"d": None}},
            {"ü名🙂": [None, {}], "k 1": ""},
            {"a": {"b": {"c": None, "d": 0}}, "::": False},
            {"x" * 300: [[]], "0": {}},
            {"null": None, "a": [{"b": None}], "{h}": {"*": {"%_": []}}},
        )
    ),
    st.integers(12, 30).map(
        lambda n: {key: MANY_VALUES[i % len(MANY_VALUES)] for i, key in enumerate(MANY_KEYS[:n])}
    ),
)
"""One chain's context: empty, a few keys of any shape, or many keys."""
CONTEXTS = st.dictionaries(st.sampled_from(("main", "side:1", "ü")), CONTEXT, max_size=2)
METADATA = st.sampled_from(
    (
        None,
        None,
        {},
        {"a": 0},
        {"b:c": False, "ü名🙂": ""},
        {"n": {"m": {}}, "l": [1, None]},
        {"x" * 300: None},
        {"k 1": [0, ""], "null": {"a": None}},
    )
)
"""Absent, empty, nested, with falsy members."""
EXTRA = st.sampled_from(
    (
        {},
        {},
        {"futureField": 1},
        {"x-vendor": [1, None]},
        {"nullField": None, "ünknown": ""},
        {"futureField": False},
        {"futureField": {"a": [0]}},
        {"x-vendor": "v", "ünknown": 0},
    )
)
"""Unknown wire fields (``extra``): the wire format keeps every field it does not know."""


class CheckpointMachine(ContractMachine):
    """Saves (with and without ``expected_revision``, stale, conflicting), loads with and
    without namespaces and fallback, expiry by the clock, and clean-up."""

    RULE_IDS = (
        "checkpoint.roundtrip",
        "checkpoint.missing",
        "checkpoint.occ.expected",
        "checkpoint.occ.conflict",
        "checkpoint.occ.monotonic",
        "checkpoint.namespace.isolation",
        "checkpoint.namespace.fallback",
        "checkpoint.expiry.hidden",
        "checkpoint.expiry.clean",
        "checkpoint.incremental",
        "ids.hostile",
        "list.walk",
        "list.filters",
        "list.hidden",
        "delete.stack",
        "delete.cas",
    )

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[tuple[str | None, str]] = set()
        self.cleaned: set[tuple[str | None, str]] = set()
        """Keys whose checkpoint the reference removed in a clean-up since their save."""
        self.deleted: set[tuple[str | None, str]] = set()
        """Keys whose checkpoint a delete removed since their last save."""

    @property
    def ref_adapter(self) -> MemoryStorageAdapter:
        adapter = self.ref.adapter
        assert isinstance(adapter, MemoryStorageAdapter)
        return adapter

    def _ref_live(self, key: tuple[str | None, str]) -> Checkpoint | None:
        return self.ref_adapter.model.live_checkpoint(key, self.now())

    def _ref_stored_expired(self, key: tuple[str | None, str]) -> Checkpoint | None:
        stored = self.ref_adapter.model.checkpoint(key)
        if stored is None or stored.live(self.now()):
            return None
        return stored.value

    def _other_namespace_with_revision(self, stack: str, ns: str | None, revision: int) -> bool:
        for other_ns, other_stack in self.touched:
            if other_stack == stack and other_ns != ns:
                cp = self._ref_live((other_ns, stack))
                if cp is not None and cp.revision == revision:
                    return True
        return False

    def _expiry(self, choice: str) -> int | None:
        now = self.now()
        if choice == "past":
            return now - 600_000
        if choice == "soon" and self.clock_controlled:
            return now + 1_000
        if choice == "later" and self.clock_controlled:
            return now + 5_000
        if choice == "far":
            return now + 3_600_000
        return None

    # -- rules --------------------------------------------------------------------------

    @precondition(lambda self: self.live())
    @rule(
        stack=STACKS,
        ns=NAMESPACES,
        rev_delta=st.sampled_from((1, 1, 2, 0, -1)),
        expected=st.sampled_from(("none", "none", "right", "right", "wrong")),
        wrong_delta=st.sampled_from((-1, 1, 2)),
        expiry=EXPIRY,
        status=st.sampled_from(sorted(STATUSES)),
        extra=EXTRA,
        contexts=CONTEXTS,
        metadata=METADATA,
        workflow=WORKFLOWS,
    )
    def save(
        self,
        stack: str,
        ns: str | None,
        rev_delta: int,
        expected: str,
        wrong_delta: int,
        expiry: str,
        status: Any,
        extra: dict[str, Any],
        contexts: dict[str, dict[str, Any]],
        metadata: dict[str, Any] | None,
        workflow: str,
    ) -> None:
        key = (self.k(ns), self.kk(stack))
        ref_now = self._ref_live(key)
        current = 0 if ref_now is None else ref_now.revision
        revision = max(0, current + rev_delta)
        expected_revision: int | None = None
        if expected == "right":
            expected_revision = current
        elif expected == "wrong":
            expected_revision = max(0, current + wrong_delta)
            if expected_revision == current:
                expected_revision = current + 1
        if expected_revision is not None and revision <= expected_revision:
            revision = expected_revision + 1
        cp = Checkpoint(
            stack_id=key[1],
            namespace=key[0],
            revision=revision,
            timestamp=self.now(),
            status=status,
            chains=tuple(contexts),
            contexts=contexts,
            expires_at=self._expiry(expiry),
            metadata=metadata,
            extra=extra,
            workflow_id=self.kk(workflow),
        )
        note(f"# save rev={revision} expected={expected_revision} (reference has {current})")
        self.touched.add(key)
        # The stored state first: direct rules below reason from what the backend reads.
        pre = self.compare_get(key[1], key[0], False)
        if self.tainted:
            return
        got = self.call(
            self.backend.adapter.save_checkpoint(cp, expected_revision=expected_revision),
            "checkpoint.occ.expected",
        )
        want = self.call(
            self.ref.adapter.save_checkpoint(cp, expected_revision=expected_revision),
            "checkpoint.occ.expected",
        )
        post = self.call(
            self.backend.adapter.get_checkpoint(key[1], key[0], fallback=False),
            "checkpoint.roundtrip",
        )
        self.unexpected(post, "checkpoint.roundtrip", "get_checkpoint")
        if self.tainted:
            return
        if want.ok:
            self.cleaned.discard(key)
            self.deleted.discard(key)
        occ_rule = (
            "checkpoint.occ.conflict"
            if expected_revision is not None
            else ("checkpoint.occ.monotonic")
        )
        # Direct rules first: they hold whatever the reference says.
        before: Checkpoint | None = pre.value
        stored = 0 if before is None else before.revision
        if got.ok:
            if expected_revision is not None:
                self.direct(
                    stored == expected_revision,
                    occ_rule,
                    f"save with expected_revision={expected_revision} succeeded although "
                    f"the stored revision was {before and before.revision}",
                )
            else:
                self.direct(
                    before is None or revision > before.revision,
                    occ_rule,
                    f"save of revision {revision} succeeded although revision "
                    f"{before and before.revision} was stored",
                )
            if cp.is_expired(self.now()):
                self.direct(
                    post.value is None,
                    "checkpoint.expiry.hidden",
                    f"a checkpoint saved with expires_at in the past was returned: {post.value!r}",
                )
            else:
                self.direct(
                    post.value == cp,
                    "checkpoint.roundtrip",
                    f"saved {cp!r}, read back {post.value!r}",
                )
        elif isinstance(got.error, CheckpointConflictError):
            err = got.error
            self.direct(
                post.value == before,
                occ_rule,
                f"a refused save changed the stored checkpoint from {before!r} to {post.value!r}",
            )
            self.direct(
                err.stack_id == cp.stack_id,
                "ids.hostile",
                f"a conflict on stack {cp.stack_id!r} names stack {err.stack_id!r}",
            )
            self.direct(
                (err.stack_id, err.expected_revision) == (cp.stack_id, expected_revision),
                occ_rule,
                f"conflict carries stack_id={err.stack_id!r}, "
                f"expected_revision={err.expected_revision!r}; want {cp.stack_id!r}, "
                f"{expected_revision!r}",
            )
            self.direct(
                err.current_revision == (None if before is None else before.revision),
                occ_rule,
                f"conflict carries current_revision={err.current_revision!r} but the "
                f"stored revision is {before and before.revision!r}",
            )
        if self.tainted:
            return
        # Agreement with the reference.
        if got.kind() == want.kind():
            if isinstance(got.error, CheckpointConflictError):
                assert isinstance(want.error, CheckpointConflictError)
                mine, theirs = got.error, want.error
                if (mine.current_revision, mine.expected_revision) != (
                    theirs.current_revision,
                    theirs.expected_revision,
                ):
                    self.diverge(occ_rule, f"conflict {mine!r}, reference {theirs!r}")
            return
        if isinstance(want.error, InvalidArgumentError) or isinstance(
            got.error, InvalidArgumentError
        ):
            self.diverge("input.rejected", f"save {got!r}; reference {want!r}")
            return
        if want.ok and isinstance(got.error, CheckpointConflictError):
            seen = got.error.current_revision
            if seen is not None and self._other_namespace_with_revision(key[1], key[0], seen):
                self.diverge(
                    "checkpoint.namespace.isolation",
                    f"save conflicted with revision {seen} of another namespace",
                )
                return
            expired = self._ref_stored_expired(key)
            if expired is not None and seen == expired.revision:
                self.diverge(
                    "checkpoint.expiry.hidden", f"save conflicted with expired revision {seen}"
                )
                return
            self.diverge(
                "checkpoint.occ.expected"
                if expected_revision is not None
                else "checkpoint.occ.monotonic",
                f"save {got!r}; the reference stored it",
            )
            return
        if want.ok or got.ok:
            self.diverge(occ_rule, f"save {got!r}; reference {want!r}")
            return
        self.diverge("checkpoint.roundtrip", f"save {got!r}; reference {want!r}")

    @precondition(lambda self: self.live() and bool(self.touched))
    @rule(
        stack=STACKS,
        ns=NAMESPACES,
        change=st.sampled_from(("grow", "grow", "change", "drop", "move", "copy", "same")),
    )
    def grow(self, stack: str, ns: str | None, change: str) -> None:
        """The next save of a stack whose state grows (past 64 KiB, where the SQL backend
        saves incrementally): one context grown, changed, dropped, moved or copied under
        another step, or none; the load must be the reference's, byte for byte."""
        key = (self.k(ns), self.kk(stack))
        current = self._ref_live(key)
        if current is None:
            return
        contexts = {step: dict(ctx) for step, ctx in current.contexts.items()}
        steps = list(contexts)
        if change == "grow":
            contexts[f"big-{len(steps)}"] = {"out": "g" * 17_000, "n": len(steps)}
            if len(contexts) > 6:  # bounded: a program's documents stay under ~100 KB
                del contexts[steps[0]]
        elif change == "change" and steps:
            contexts[steps[-1]] = {**contexts[steps[-1]], "changed": current.revision}
        elif change == "drop" and steps:
            del contexts[steps[0]]
        elif change == "move" and steps:
            contexts[steps[0]] = contexts.pop(steps[0])
        elif change == "copy" and steps:
            contexts["copy"] = dict(contexts[steps[-1]])
        cp = current.replace(revision=current.revision + 1, timestamp=self.now(), contexts=contexts)
        note(f"# grow ({change}) to rev={cp.revision}, {len(cp.to_json())} bytes")
        got = self.call(
            self.backend.adapter.save_checkpoint(cp, expected_revision=current.revision),
            "checkpoint.incremental",
        )
        want = self.call(
            self.ref.adapter.save_checkpoint(cp, expected_revision=current.revision),
            "checkpoint.incremental",
        )
        if self.tainted:
            return
        if got.kind() != want.kind():
            self.judge_get_after_grow(key, f"save {got!r}; reference {want!r}")
            return
        mine = self.call(
            self.backend.adapter.get_checkpoint(key[1], key[0], fallback=False),
            "checkpoint.incremental",
        )
        self.unexpected(mine, "checkpoint.incremental", "get_checkpoint")
        theirs = self._ref_live(key)
        if self.tainted:
            return
        if (mine.value is None) != (theirs is None) or (
            mine.value is not None
            and theirs is not None
            and mine.value.to_json() != theirs.to_json()
        ):
            self.judge_get_after_grow(
                key, f"after a {change} save read back {mine.value!r}; reference {theirs!r}"
            )

    def judge_get_after_grow(self, key: tuple[str | None, str], message: str) -> None:
        """A grown stack the backend stores otherwise than the reference: an expired one
        is ``checkpoint.expiry.hidden``'s, anything else the incremental save's."""
        if self._ref_stored_expired(key) is not None:
            self.diverge("checkpoint.expiry.hidden", message)
        else:
            self.diverge("checkpoint.incremental", message)

    @precondition(lambda self: self.live())
    @rule(stack=STACKS, ns=NAMESPACES, fallback=st.booleans())
    def get(self, stack: str, ns: str | None, fallback: bool) -> None:
        self.compare_get(self.kk(stack), self.k(ns), fallback)

    def compare_get(self, stack: str, ns: str | None, fallback: bool) -> Outcome:
        got = self.call(
            self.backend.adapter.get_checkpoint(stack, ns, fallback=fallback),
            "checkpoint.roundtrip",
        )
        want = self.call(
            self.ref.adapter.get_checkpoint(stack, ns, fallback=fallback), "checkpoint.roundtrip"
        )
        self.unexpected(got, "checkpoint.roundtrip", "get_checkpoint")
        if not self.tainted:
            self.judge_get(stack, ns, fallback, got.value, want.value)
        return got

    def judge_get(
        self,
        stack: str,
        ns: str | None,
        fallback: bool,
        mine: Checkpoint | None,
        theirs: Checkpoint | None,
    ) -> None:
        """Fail the rule that explains why the backend read ``mine`` and not ``theirs``."""
        if mine == theirs:
            return
        what = (
            f"get_checkpoint({stack!r}, {ns!r}, fallback={fallback}) returned {mine!r}; "
            f"reference returned {theirs!r}"
        )
        if mine is not None and mine.namespace != ns:
            rule_id = (
                "checkpoint.namespace.isolation"
                if ns is not None and mine.namespace is not None
                else "checkpoint.namespace.fallback"
            )
            if theirs is not None and theirs.namespace == mine.namespace:
                rule_id = "checkpoint.roundtrip"
            self.diverge(rule_id, what)
        elif theirs is not None and theirs.namespace != ns:
            self.diverge("checkpoint.namespace.fallback", what)
        elif mine is not None and theirs is None:
            key = (mine.namespace, stack)
            if self._ref_stored_expired(key) is not None or key in self.cleaned:
                self.diverge("checkpoint.expiry.hidden", what)
            elif key in self.deleted:
                self.diverge("delete.stack", f"after its delete, {what}")
            elif key in self.touched:
                self.diverge("checkpoint.roundtrip", what)
            else:
                self.diverge("checkpoint.missing", what)
        elif mine is not None and theirs is not None and mine.revision == theirs.revision:
            self.diverge("checkpoint.roundtrip", what)
        elif mine is not None and theirs is not None and mine.revision != theirs.revision:
            # A different document of the same stack: one of its saves went wrong.
            self.diverge("checkpoint.roundtrip", what)
        else:
            self.diverge("checkpoint.roundtrip", what)

    @precondition(lambda self: self.live())
    @rule()
    def clean(self) -> None:
        got = self.call(self.backend.adapter.clean_expired_checkpoints(), "checkpoint.expiry.clean")
        self.unexpected(got, "checkpoint.expiry.clean", "clean_expired_checkpoints")
        if self.tainted:
            return
        self.direct(
            isinstance(got.value, int) and not isinstance(got.value, bool) and got.value >= 0,
            "checkpoint.expiry.clean",
            f"clean_expired_checkpoints returned {got.value!r}, not a count >= 0",
        )
        self.cleaned.update(self.ref_adapter.model.expired_checkpoints(self.now()))
        self.run(self.ref.adapter.clean_expired_checkpoints())
        # A live checkpoint must survive; an expired one must not be returned.
        for ns, stack in sorted(self.touched, key=repr):
            got_cp = self.call(
                self.backend.adapter.get_checkpoint(stack, ns, fallback=False),
                "checkpoint.expiry.clean",
            )
            want_cp = self._ref_live((ns, stack))
            if self.tainted:
                return
            if got_cp.value is None and want_cp is not None:
                self.diverge(
                    "checkpoint.expiry.clean", f"clean-up removed the live checkpoint {want_cp!r}"
                )
            else:
                self.judge_get(stack, ns, False, got_cp.value, want_cp)

    @precondition(lambda self: self.live() and self.clock_controlled)
    @rule(ms=st.sampled_from((1, 999, 1_000, 4_000, 60_000)))
    def advance(self, ms: int) -> None:
        assert self.session.clock is not None
        self.session.clock.advance(ms)

    # -- operating what is stored (capabilities listing, deletion) --------------------------

    @precondition(lambda self: self.live() and self.declared(Capability.LISTING))
    @rule(
        workflow=WORKFLOWS,
        where=st.sampled_from(("every", "every", "none", "n", "{n}")),
        status=st.sampled_from((None, None, "running", ("completed", "failed"))),
        limit=st.sampled_from((1, 2, 3, 50)),
    )
    def walk(self, workflow: str, where: str, status: Any, limit: int) -> None:
        """A walk of this example's stacks (filtered by its workflow id), in every
        namespace or one, compared with the reference's."""
        namespace: Any = MISSING if where == "every" else self.k(None if where == "none" else where)
        query = {"namespace": namespace, "workflow_id": self.kk(workflow), "status": status}
        got = self._walk(self.backend, query, limit)
        if got is None or self.tainted:
            return
        want = self._walk(self.ref, query, limit)
        assert want is not None
        keys = [(s.namespace, s.stack_id) for s in got]
        twice = sorted({k for k in keys if keys.count(k) > 1}, key=repr)
        self.direct(
            not twice, "list.walk", f"a walk ({query}, limit={limit}) listed twice: {twice}"
        )
        if self.tainted:
            return
        mine = {(s.namespace, s.stack_id): s for s in got}
        theirs = {(s.namespace, s.stack_id): s for s in want}
        if mine == theirs:
            return
        filters = ListQuery(
            namespace=namespace,
            statuses=None
            if status is None
            else frozenset([status] if isinstance(status, str) else status),
            workflow_id=self.kk(workflow),
        )
        for key in sorted(mine.keys() - theirs.keys(), key=repr):
            what = f"a walk ({query}, limit={limit}) listed {mine[key]!r}; the reference did not"
            if not filters.matches(mine[key]):
                self.diverge("list.filters", what)
            elif key in self.deleted or self._ref_live(key) is None:
                self.diverge("list.hidden", what)
            else:
                self.diverge("list.walk", what)
            return
        for key in sorted(theirs.keys() - mine.keys(), key=repr):
            self.diverge("list.walk", f"a walk ({query}, limit={limit}) missed {theirs[key]!r}")
            return
        for key in sorted(mine, key=repr):
            if mine[key] != theirs[key]:
                self.diverge(
                    "list.walk",
                    f"a walk ({query}, limit={limit}) listed {mine[key]!r}; reference "
                    f"{theirs[key]!r}",
                )
                return

    def _walk(self, backend: Any, query: dict[str, Any], limit: int) -> list[Any] | None:
        """Every summary of a walk, each page checked against ``limit`` (``None``: the
        walk failed, and that was reported)."""
        out: list[Any] = []
        cursor = None
        for _ in range(1_000):
            page = self.call(
                backend.adapter.list_checkpoints(limit=limit, cursor=cursor, **query),
                "list.walk",
            )
            self.unexpected(page, "list.walk", "list_checkpoints")
            if self.tainted:
                return None
            items = page.value.items
            self.direct(
                len(items) <= limit, "list.walk", f"a page of limit={limit} held {len(items)}"
            )
            out.extend(items)
            cursor = page.value.next_cursor
            if cursor is None:
                return out
        self.diverge("list.walk", "a walk never ended")
        return None

    @precondition(lambda self: self.live() and self.declared(Capability.DELETION))
    @rule(
        stack=STACKS,
        ns=NAMESPACES,
        expected=st.sampled_from(("none", "none", "right", "wrong")),
    )
    def delete(self, stack: str, ns: str | None, expected: str) -> None:
        """delete_checkpoint, plain or compare-and-set, vs the reference; then the read."""
        key = (self.k(ns), self.kk(stack))
        ref_now = self._ref_live(key)
        current = 0 if ref_now is None else ref_now.revision
        expected_revision = {"none": None, "right": current, "wrong": current + 1}[expected]
        if expected == "right" and ref_now is None:
            expected_revision = 1
        note(f"# delete expected={expected_revision} (reference has {current})")
        rule_id = "delete.stack" if expected_revision is None else "delete.cas"
        got = self.call(
            self.backend.adapter.delete_checkpoint(
                key[1], key[0], expected_revision=expected_revision
            ),
            rule_id,
        )
        want = self.call(
            self.ref.adapter.delete_checkpoint(key[1], key[0], expected_revision=expected_revision),
            rule_id,
        )
        if got.kind() != want.kind() or (got.ok and got.value != want.value):
            if isinstance(got.error, InvalidArgumentError) or isinstance(
                want.error, InvalidArgumentError
            ):
                self.diverge("input.rejected", f"delete {got!r}; reference {want!r}")
            else:
                self.diverge(rule_id, f"delete {got!r}; reference {want!r}")
            return
        if isinstance(got.error, CheckpointConflictError):
            assert isinstance(want.error, CheckpointConflictError)
            if got.error.current_revision != want.error.current_revision:
                self.diverge("delete.cas", f"delete {got!r}; reference {want!r}")
                return
        if want.ok:
            self.touched.add(key)
            self.deleted.add(key)
        self.compare_get(key[1], key[0], False)
