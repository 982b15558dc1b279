"""Why a target can miss, as measured: the report prints the reason beside each miss.

A :class:`Reason` matches missed targets by backend, workload name, size and concurrency
(``None``: any) and says what bounds that cell, as profiles and A/B runs measured it
(docs/benchmarks-history.md has the runs). Where the run recorded the client's CPU time,
:func:`reason_for` adds the miss's lowest round as figures of this run, so the page shows
whether that round was the client working (the round's ratio is the CPU ratio) or
waiting (the round's ratio is below it). A miss no written reason matches gets one
computed from its run's own figures (:func:`computed_reason`: the clients' CPU an
operation and busy shares of its lowest round, statements an operation, conflicts per
update; for the end-to-end goal, writes per run against the raw write limit), and one
whose run recorded none of them is printed as "no measured reason", never with a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

NO_REASON: Final = "no measured reason"


@dataclass(frozen=True)
class Reason:
    """What was measured to bound the cells it matches."""

    backend: str | None
    name: str | None
    size: str | None
    concurrency: int | None
    text: str
    vs: str | None = None
    """The baseline the reason was measured against; a target against the raw-fast
    baseline matches only a reason measured against it (``vs="raw-fast"``)."""

    def matches(self, target: dict[str, Any]) -> bool:
        """Whether ``target`` (a report target entry) is one of this reason's cells."""
        if (target.get("vs") == "raw-fast") != (self.vs == "raw-fast"):
            return False
        wanted = {
            "backend": self.backend,
            "name": self.name,
            "size": self.size,
            "concurrency": self.concurrency,
        }
        return all(v is None or target.get(k) == v for k, v in wanted.items())


_CONSTRUCTION_CHECK: Final = (
    "siglo's save builds a Checkpoint, whose construction check (one type check per "
    "context entry, 1,014 in the 256 KB document) took 43-65 us of a 256 KB save timed in "
    "place in a loop of saves, 10-12 % of a 256 KB save on SQLite: a cost the raw baseline "
    "does not have; the encoding and the statement are the same"
)

REASONS: Final[tuple[Reason, ...]] = (
    Reason(
        "redis",
        None,
        "1k",
        32,
        "the kernel's socket calls, not Python: a profile of 32 callers x 100 loads on a "
        "loaded machine spent 0.19 of 0.91 s in send() (auto-pipelining wrote the 3,200 "
        "commands in 225 writes) and 0.19 s waiting in epoll; siglo's own Python took under "
        "0.1 s",
    ),
    Reason(
        "redis",
        "cas",
        "1k",
        1,
        "the hypervisor: a compare-and-set one at a time is a read and a script, so a pass "
        "is short and a burst of stolen CPU time decides its round; where this cell missed, "
        "16-43 % of the CPU time was stolen during siglo's passes and 22-24 % during raw's, "
        "and the lowest round was the one with the most stolen from siglo's (see the stolen "
        "shares beside the miss)",
    ),
    *(
        Reason("redis", name, "256k", 1, f"the checkpoint's check: {_CONSTRUCTION_CHECK}")
        for name in ("save", "cas")
    ),
    Reason("sqlite", "save", "256k", 32, f"the checkpoint's check: {_CONSTRUCTION_CHECK}"),
    Reason(
        "sqlite",
        "scale",
        None,
        None,
        "SQLite's own lookup, not siglo's: siglo's load statement run by plain sqlite3 with "
        "siglo's page settings on the same table and indexes (python -m "
        "benchmarks.experiments.sqlite_lookups, 3 rounds of 2,000 random ids) took 5.4 us at "
        "1,000 rows and 11.2-11.3 us at 1,000,000 on a connection new to the files (ratio "
        "2.08: a lookup descends the id index and the table, and the large file's pages are "
        "mapped as they are first touched), 1.36-1.39 after 20,000 lookups; a WITHOUT ROWID "
        "table (one tree) measured slower at both sizes",
    ),
    Reason(
        "postgres",
        "load",
        "1k",
        1,
        "siglo's own Python, about a tenth more than raw's: one at a time a load is "
        "CPU-bound in the client (busy 90-100 % of the wall time, siglo and raw alike), and "
        "py-spy of 18,000 loads each counted 10.7 % more samples for siglo: the shared "
        "reads' bookkeeping 2 %, the adapter's argument checks 2 %, the checkpoint's check "
        "2 %; psycopg's execute and the pool the same for both",
    ),
    Reason(
        "postgres",
        "save",
        "16k",
        1,
        "the server's commit: a sequential 16 KB save waits on it for about half its time "
        "(the client busy 50-58 % of the wall time, siglo and raw alike), so a pass meets "
        "the disk's moment and single rounds fall",
    ),
    Reason(
        "postgres",
        "load",
        "16k",
        32,
        "the server, in a round where siglo's client waited for it: at 32 callers a load is "
        "mostly decoding in the client for both subjects (py-spy: 89 % of siglo's load in "
        "Checkpoint.from_json, orjson 80 %), and siglo's callers share one statement, which "
        "saves raw's per-statement cost; siglo's client spends about the same CPU a load in "
        "every round, so a round whose ratio is below its CPU ratio is time siglo's client "
        "spent waiting for PostgreSQL, whose side the benchmark does not record",
    ),
    Reason(
        "postgres",
        "load",
        "256k",
        32,
        "decoding, in the client, for both subjects: Checkpoint.from_json is 97 % of "
        "siglo's load at 32 callers (py-spy), orjson's decode most of it; siglo pauses the "
        "garbage collector while it decodes a large document (siglo.codec) and the raw "
        "baseline does not, so siglo spends less CPU a load, and with both clients busy the "
        "whole pass a round's ratio is the ratio of their CPU a load. Tried and not kept: "
        "msgspec's decoder (1,390 us a 256 KB decode against orjson's 1,250-1,270), batches "
        "capped at 1 MiB and a young-generation collection before each large decode (each "
        "within 2 % of the loads a second without it)",
    ),
    Reason(
        "sqlite",
        "load",
        "256k",
        32,
        "the C allocator, as far as measured: a 256 KB load makes allocations above glibc's "
        "mmap threshold, and served by fresh mappings they cost about 0.5 ms more a load, "
        "siglo's and raw's alike; with LangGraph's saver in the process siglo / raw was "
        "1.61-1.74, without it 1.91-2.22, and with glibc's large allocations all from the "
        "heap (MALLOC_MMAP_THRESHOLD_=4194304 MALLOC_TRIM_THRESHOLD_=268435456) 1.99-2.02 "
        "with LangGraph's saver in the process. Not the stored format: the benchmark's "
        "256 KB document decoded in 1,151-1,336 us with orjson against 1,222-1,550 with "
        "ormsgpack, LangGraph's (python -m benchmarks.experiments.decoders)",
    ),
    Reason(
        "postgres",
        "workflow",
        None,
        1,
        "the server's latency from moment to moment: one run at a time, a 3-step run on "
        "PostgreSQL is 8 statements in round trips one after another "
        "(tests/workflows/test_flow_statements.py), so its runs/s follow the server's "
        "answer time; where this cell missed, each subject's rounds moved by 2.2 x within "
        "the run (siglo 95-213 runs/s, LangGraph's saver 41-84) with under 1 % of the CPU "
        "stolen",
    ),
)
"""Every measured reason, matched in order: the first that matches a miss is printed."""


def lowest_round_text(target: dict[str, Any]) -> str | None:
    """The client's CPU in a target's lowest round, as figures of its run (``None`` where
    the run did not record them).

    A subject's speed is its client's busy share over its CPU time an operation, so the
    round's ratio over the ratio of the two clients' CPU is how busy siglo's client was
    against the baseline's: 1.00 where both worked the whole round, below where siglo's
    waited more.
    """
    rounds, cpus = target.get("rounds") or [], target.get("cpu") or []
    if not rounds or len(cpus) != len(rounds):
        return None
    low = rounds.index(min(rounds))
    mine, mine_gc, other, other_gc = cpus[low]
    if not mine or not other:
        return None
    cpu_ratio = other / mine
    return (
        f"In this run's lowest round ({rounds[low]:.2f}) siglo's client spent {mine:.2f} ms "
        f"of CPU an operation ({mine_gc:.2f} collecting) and the baseline's {other:.2f} "
        f"({other_gc:.2f}), a CPU ratio of {cpu_ratio:.2f}: siglo's client was busy "
        f"{rounds[low] / cpu_ratio:.2f} x as much of the round as the baseline's."
    )


def reason_for(target: dict[str, Any]) -> str:
    """The measured reason for a missed ``target`` (a report target entry), with its
    lowest round's client CPU where the run recorded it: a reason of :data:`REASONS`
    that matches it, else one computed from the run's own figures
    (:func:`computed_reason`), else :data:`NO_REASON`."""
    for reason in REASONS:
        if reason.matches(target):
            figures = lowest_round_text(target)
            return reason.text + ("" if figures is None else f". {figures}")
    return computed_reason(target) or NO_REASON


def computed_reason(target: dict[str, Any]) -> str | None:
    """A miss's reason from the figures its run recorded (``None`` where it recorded
    none): for a workload cell, its lowest round split into the two factors of a ratio
    of ops/s — the clients' CPU an operation and their busy shares — with the
    statements an operation and a compare-and-set's conflicts per update where
    recorded; for the end-to-end goal, the writes per run and the client's CPU a run
    against the raw write limit."""
    if target.get("vs") == "raw-limit":
        return _workflow_reason(target)
    rounds, cpus = target.get("rounds") or [], target.get("cpu") or []
    if not rounds or len(cpus) != len(rounds):
        return None
    low = rounds.index(min(rounds))
    mine, _, other, _ = cpus[low]
    if not mine or not other:
        return None
    base = "the baseline" if target.get("vs") is None else target["vs"]
    run = target.get("name") == "workflow"  # end to end: a workflow run is the operation
    op, sent = (
        ("a run", "store writes") if run else ("an operation", "statements (Redis: commands)")
    )
    cpu_ratio = other / mine  # the ratio if both clients were busy alike
    busy = rounds[low] / cpu_ratio  # siglo's busy share over the baseline's
    if cpu_ratio <= busy:
        head = (
            f"siglo's client CPU {op}: {mine:.3f} ms against {base}'s {other:.3f} "
            f"({mine / other:.2f}x) in the lowest round ({rounds[low]:.2f}), which alone "
            f"bounds the ratio at {cpu_ratio:.2f} (siglo's client busy {busy:.2f}x as much "
            "of the round)"
        )
    else:
        head = (
            f"waiting: in the lowest round ({rounds[low]:.2f}) siglo's client was busy "
            f"{busy:.2f}x as much of the round as {base}'s (the rest waiting on the server "
            f"or the event loop), at a CPU ratio of {cpu_ratio:.2f} ({mine:.3f} ms {op} "
            f"against {other:.3f})"
        )
    parts = [head]
    statements = target.get("statements") or []
    if len(statements) == 2 and statements[0] != statements[1]:
        parts.append(
            f"siglo sent {statements[0]:.2f} {sent} {op} against {base}'s {statements[1]:.2f}"
        )
    conflicts = target.get("conflicts") or []
    if len(conflicts) == len(rounds) and conflicts[low][0] != conflicts[low][1]:
        a, b = conflicts[low]
        parts.append(
            f"siglo's writers lost {a:.2f} compare-and-sets per successful update against "
            f"{base}'s {b:.2f} (each a load and a save again)"
        )
    stored = target.get("parts")
    if stored and not run:
        parts.append(
            f"the cell's document is {stored['document_bytes']:,} bytes encoded, at least "
            f"siglo's incremental_min_bytes ({stored['incremental_min_bytes']:,}): siglo "
            f"stores it in parts, {base} whole"
        )
    return "; ".join(parts) + " (figures of this run)"


def _workflow_reason(t: dict[str, Any]) -> str:
    """The end-to-end goal's miss, from its run: where siglo's runs/s stood against the
    raw write limit, and how much of a core its client used."""
    text = (
        f"siglo issued {t['writes_per_run']:.1f} store writes per run; the raw driver's "
        f"{t['limit_writes_per_s']:,.0f} writes/s at 32 writers make {t['limit_runs_per_s']:,.0f} "
        f"runs/s the limit, and siglo ran {t['runs_per_s']:,.0f} runs/s"
    )
    cpu = t.get("cpu_ms_per_run") or []
    rounds = t.get("rounds") or []
    if cpu and len(cpu) == len(rounds):
        c = cpu[rounds.index(min(rounds))]
        text += (
            f"; its process spent {c:.2f} ms of CPU a run in the lowest round: one core "
            f"runs {1e3 / c:,.0f} of them a second, {1e3 / c / t['limit_runs_per_s']:.2f} "
            "of the limit"
        )
    versus = t.get("versus") or {}
    if versus:
        text += "; against the other way to the goal (10x): " + ", ".join(
            f"{name} {lo:.2f}-{hi:.2f}x" for name, (lo, hi) in versus.items()
        )
    return text + " (figures of this run)"
