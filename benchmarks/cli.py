"""``python -m benchmarks``: run the workloads, write JSON, markdown and a PNG chart."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import secrets
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks import machine, report
from benchmarks.interference import RETIMES, STEAL_LIMIT, timed_pass
from benchmarks.payloads import SIZES
from benchmarks.slices import round_order, slice_size
from benchmarks.stats import summarize
from benchmarks.subject import Subject
from benchmarks.workloads import Measurement, Workload, default_workloads, measure

BACKENDS = ("memory", "redis", "postgres", "sqlite")
WORKLOAD_NAMES = ("save", "load", "cas", "wait_claim", "idempotency", "lock", "cache")
DEFAULT_OUT = Path(__file__).parent / "results"


def _csv(choices: tuple[str, ...] | list[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown: {', '.join(bad)}; choose from {', '.join(choices)}"
            )
        return items

    return parse


PRESETS: dict[str, dict[str, Any]] = {
    "raw-fast": {
        "backends": ["redis", "postgres", "sqlite"],
        "sizes": ["1k", "16k"],
        "workloads": ["save", "load", "cas"],
        "raw_fast": True,
        "loop_lag": True,
        "e2e": True,
        "e2e_backends": ["sqlite", "postgres", "redis"],
        "repeat": 3,
        "ops_scale": 1.0,
        "e2e_scale": 1.0,
    },
}
"""Named sets of options (``--preset``); an option given as well overrides its preset.
``raw-fast``: issue 36's comparison (both raw baselines, loop lag, the end-to-end
comparison with the raw write limit) in 3 rounds, sized to take about 20 minutes on a
quiet 2-core machine (docs/benchmarks.md)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line (see ``python -m benchmarks --help``)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark siglo's backends against the raw drivers (and LangGraph's savers).",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a named set of options (benchmarks/cli.py PRESETS); options given too override it",
    )
    p.add_argument("--backends", type=_csv(BACKENDS), default=list(BACKENDS))
    p.add_argument("--sizes", type=_csv(list(SIZES)), default=list(SIZES))
    p.add_argument("--workloads", type=_csv(WORKLOAD_NAMES), default=list(WORKLOAD_NAMES))
    p.add_argument("--repeat", type=int, default=5, help="runs per measurement (median reported)")
    p.add_argument(
        "--slices",
        type=int,
        default=3,
        help="passes per round, each timing a part of its operations, alternating the "
        "subjects' order (benchmarks/slices.py)",
    )
    p.add_argument("--ops-scale", type=float, default=1.0, help="multiply every op count")
    p.add_argument(
        "--steal-limit",
        type=float,
        default=STEAL_LIMIT,
        help="time a pass again when more than this share of the machine's CPU time was "
        "stolen by the hypervisor during it (benchmarks/interference.py; 1 never does)",
    )
    p.add_argument(
        "--retimes",
        type=int,
        default=RETIMES,
        help="how many times a pass over --steal-limit is timed again before it is kept",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke mode: a handful of ops, one run; exits non-zero if any workload fails",
    )
    p.add_argument("--no-langgraph", action="store_true", help="skip LangGraph's savers")
    p.add_argument(
        "--raw-fast",
        action="store_true",
        help="also run the raw-fast baselines (inline sqlite3, auto-pipelined redis-py, "
        "psycopg with batched loads and pipelined saves) beside the raw ones",
    )
    p.add_argument(
        "--loop-lag",
        action="store_true",
        help="also measure the event-loop lag a 1 ms sleeper sees while each subject "
        "saves and loads at 32 callers (benchmarks/loop_lag.py)",
    )
    p.add_argument(
        "--no-statements",
        action="store_true",
        help="skip the untimed passes that count each cell's statements (Redis: commands) "
        "an operation per subject (benchmarks/statements.py)",
    )
    p.add_argument(
        "--no-e2e-limit",
        dest="e2e_limit",
        action="store_false",
        help="do not time the raw write limit beside the end-to-end comparison "
        "(benchmarks/write_limit.py)",
    )
    p.add_argument("--scale", action="store_true", help="also run the scale workloads (slow)")
    p.add_argument(
        "--scale-backends",
        type=_csv(BACKENDS),
        default=None,
        help="the backends the scale workloads run on (default: --backends)",
    )
    p.add_argument(
        "--scale-kinds",
        type=_csv(("siglo", "raw")),
        default=["siglo", "raw"],
        help="whose scale workloads run (the target is siglo's; raw is for comparison)",
    )
    p.add_argument(
        "--e2e",
        action="store_true",
        help="also run the end-to-end workflow comparison (siglo, DBOS, LangGraph)",
    )
    p.add_argument(
        "--e2e-backends",
        type=_csv(("redis", "postgres", "sqlite")),
        default=["postgres", "sqlite", "redis"],
    )
    p.add_argument("--e2e-scale", type=float, default=1.0, help="multiply the workflow run counts")
    p.add_argument("--scale-rows", type=int, default=1_000_000)
    p.add_argument("--scale-expired", type=int, default=100_000)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the results")
    p.add_argument("--no-chart", action="store_true")
    p.add_argument(
        "--update-docs",
        type=Path,
        metavar="PAGE",
        help="replace the results section of PAGE (docs/benchmarks.md) with this run's",
    )
    p.add_argument(
        "--redis-url", default=os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    p.add_argument(
        "--postgres-url",
        default=os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test"),
    )
    p.add_argument("--pg-pool", type=int, default=10, help="raw psycopg pool size")
    p.add_argument(
        "--pg-doc-type",
        choices=("jsonb", "text", "bytea"),
        default="bytea",
        help="the raw Postgres document column (default bytea, what siglo's backend stores)",
    )
    p.add_argument(
        "--pg-compression",
        choices=("lz4", "pglz"),
        default="lz4",
        help="the raw Postgres documents' compression (default lz4 where the server has it, "
        "as siglo's schema)",
    )
    p.add_argument(
        "--sqlite-synchronous",
        choices=("NORMAL", "FULL"),
        default="NORMAL",
        help="PRAGMA synchronous of every SQLite subject (siglo, raw, LangGraph), so all "
        "run at the same durability (default NORMAL, siglo's default)",
    )
    p.add_argument(
        "--siglo-opt",
        action="append",
        default=[],
        metavar="BACKEND:KEY=VALUE",
        help="an option for siglo's backend factory (repeatable; VALUE parsed as JSON "
        "if it can be), e.g. postgres:pool_size=20",
    )
    p.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="run nothing: write the report (and --update-docs) from an earlier run's results.json",
    )
    p.add_argument(
        "--load-note",
        default="",
        help="a sentence on what else ran on the machine, printed beside the load average",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds one measurement may take before it is reported as an error",
    )
    return p


def make_subjects(backend: str, args: argparse.Namespace, tmp: str) -> list[Subject | str]:
    """The subjects of ``backend``; a string is the reason one is unavailable."""
    from benchmarks.siglo_subject import SigloSubject

    out: list[Subject | str] = []
    urls = {
        "memory": "memory://",
        "redis": args.redis_url,
        "postgres": args.postgres_url,
        "sqlite": f"sqlite:///{os.path.join(tmp, 'siglo.db')}",
    }
    options = siglo_options(args, backend)
    if backend == "sqlite":
        options.setdefault("synchronous", args.sqlite_synchronous)
    out.append(_siglo_or_reason(backend, urls[backend], SigloSubject, options))
    if backend == "memory":
        from benchmarks.raw_memory import RawMemorySubject

        out.append(RawMemorySubject())
    elif backend == "redis":
        if importlib.util.find_spec("redis") is None:
            out.append("raw redis: redis-py not installed (pip install -e '.[redis]')")
        else:
            from benchmarks.raw_redis import RawRedisSubject

            out.append(RawRedisSubject(args.redis_url))
    elif backend == "postgres":
        if importlib.util.find_spec("psycopg_pool") is None:
            out.append("raw postgres: psycopg[pool] not installed")
        else:
            from benchmarks.raw_postgres import RawPostgresSubject

            out.append(
                RawPostgresSubject(
                    args.postgres_url,
                    pool_size=args.pg_pool,
                    doc_type=args.pg_doc_type,
                    compression=args.pg_compression,
                )
            )
    elif backend == "sqlite":
        if importlib.util.find_spec("aiosqlite") is None:
            out.append("raw sqlite: aiosqlite not installed")
        else:
            from benchmarks.raw_sqlite import RawSqliteSubject

            out.append(
                RawSqliteSubject(os.path.join(tmp, "raw.db"), synchronous=args.sqlite_synchronous)
            )
    if getattr(args, "raw_fast", False):
        out += _raw_fast_subjects(backend, args, tmp)
    if backend in ("sqlite", "postgres") and not args.no_langgraph:
        module = f"langgraph.checkpoint.{backend}.aio"
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(f"langgraph {backend}: langgraph-checkpoint-{backend} not installed")
        else:
            from benchmarks.langgraph_subject import LangGraphSubject

            out.append(
                LangGraphSubject(
                    backend,
                    args.postgres_url if backend == "postgres" else None,
                    sqlite_synchronous=args.sqlite_synchronous,
                )
            )
    return out


def _raw_fast_subjects(backend: str, args: argparse.Namespace, tmp: str) -> list[Subject | str]:
    """The raw-fast baseline of ``backend`` (none for memory, which has no driver)."""
    if backend == "redis":
        if importlib.util.find_spec("redis") is None:
            return ["raw-fast redis: redis-py not installed (pip install -e '.[redis]')"]
        from benchmarks.raw_fast_redis import RawFastRedisSubject

        return [RawFastRedisSubject(args.redis_url)]
    if backend == "postgres":
        if importlib.util.find_spec("psycopg_pool") is None:
            return ["raw-fast postgres: psycopg[pool] not installed"]
        from benchmarks.raw_fast_postgres import RawFastPostgresSubject

        return [
            RawFastPostgresSubject(
                args.postgres_url,
                pool_size=args.pg_pool,
                doc_type=args.pg_doc_type,
                compression=args.pg_compression,
            )
        ]
    if backend == "sqlite":
        from benchmarks.raw_fast_sqlite import RawFastSqliteSubject

        return [
            RawFastSqliteSubject(
                os.path.join(tmp, "raw-fast.db"), synchronous=args.sqlite_synchronous
            )
        ]
    return []


def _document_bytes(sizes: list[str]) -> dict[str, int]:
    """The encoded length of each size's wire document (benchmarks/payloads.py)."""
    import orjson

    from benchmarks.payloads import wire_document
    from benchmarks.workloads import contexts_of

    return {
        size: len(orjson.dumps(wire_document("stack", 1, contexts_of(size), expires_at=None)))
        for size in sizes
    }


def _incremental_default() -> int | None:
    """siglo's SQL backends' default ``incremental_min_bytes`` (``None``: not installed)."""
    try:
        from siglo_sql.parts import DEFAULT_INCREMENTAL_MIN_BYTES
    except ImportError:
        return None
    return DEFAULT_INCREMENTAL_MIN_BYTES


def siglo_options(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The ``--siglo-opt`` options given for ``backend``."""
    options: dict[str, Any] = {}
    for item in args.siglo_opt:
        target, _, assignment = item.partition(":")
        key, eq, raw = assignment.partition("=")
        if not eq or not key or target not in BACKENDS:
            raise SystemExit(f"--siglo-opt {item!r}: expected BACKEND:KEY=VALUE")
        if target != backend:
            continue
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def _siglo_or_reason(
    backend: str, url: str, cls: Callable[..., Subject], options: dict[str, Any]
) -> Subject | str:
    from siglo.errors import SigloError
    from siglo.plugins import get_registry

    try:
        spec = get_registry().for_url(url)
    except SigloError as exc:
        return f"siglo {backend}: not registered ({exc.__class__.__name__})"
    missing = spec.missing_drivers()
    if missing:
        return f"siglo {backend}: drivers missing: {', '.join(missing)}"
    return cls(backend, url, **options)


def _label(s: Subject) -> str:
    return f"{s.kind}:{s.backend}"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run everything the arguments ask for; return the results document."""
    if args.quick:
        args.repeat = 1
        args.slices = 1
        args.retimes = 0
    workloads = default_workloads(
        args.sizes, ops_scale=0.01 if args.quick else args.ops_scale, names=set(args.workloads)
    )
    if args.quick:
        workloads = [
            Workload(w.name, w.size, w.concurrency, max(w.concurrency * 2, 4)) for w in workloads
        ]
    doc: dict[str, Any] = {
        "meta": {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv[1:],
            "quick": args.quick,
            "repeat": args.repeat,
            "slices": args.slices,
            "steal_limit": args.steal_limit,
            "retimes": args.retimes,
            "machine": machine.describe(),
            "load": {"start": list(os.getloadavg())},
            "cpu_ticks": {"start": machine.cpu_times()},
            "load_note": args.load_note,
            # A CAS cell's conflicts are its timed updates' only (not the warm-up's).
            "timed_conflicts": True,
            # What ran, in the order it ran: "workloads:<backend>", "e2e", "scale:<backend>".
            "order": [],
            # Each size's document as every subject stores it (bytes encoded), and the
            # size from which siglo's SQL backends store a document in parts (a miss's
            # computed reason says when a cell's document is stored so).
            "document_bytes": _document_bytes(args.sizes),
            "siglo_incremental_min_bytes": {
                b: siglo_options(args, b).get("incremental_min_bytes", _incremental_default())
                for b in ("sqlite", "postgres")
                if b in args.backends
            },
        },
        "subjects": [],
        "results": [],
        "scale": [],
    }
    with tempfile.TemporaryDirectory(prefix="siglo-bench-") as tmp:
        for backend in args.backends:
            await _run_backend(backend, args, workloads, doc, tmp)
        if getattr(args, "loop_lag", False):
            from benchmarks.loop_lag import run_loop_lag

            doc["meta"]["order"].append("loop-lag")
            for backend in args.backends:
                await run_loop_lag(backend, args, doc, tmp, make_subjects)
        if args.e2e:
            from benchmarks.e2e import run_e2e

            doc["meta"]["order"].append("e2e")
            await run_e2e(args, doc)
        # Every backend's workloads and the end-to-end comparison before any scale
        # workload: a scale run fills a million rows, and the process it leaves (its
        # heap, the C allocator's state) slowed the large-document cells timed after it
        # (docs/benchmarks.md, Method).
        if args.scale:
            for backend in args.backends:
                if backend in (args.scale_backends or args.backends):
                    await _run_scale(backend, args, doc, tmp)
    doc["meta"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc["meta"]["load"]["end"] = list(os.getloadavg())
    doc["meta"]["cpu_ticks"]["end"] = machine.cpu_times()
    report.add_ratios_and_targets(doc)
    return doc


async def _run_backend(
    backend: str, args: argparse.Namespace, workloads: list[Workload], doc: dict[str, Any], tmp: str
) -> None:
    from benchmarks.statements import SqliteConnections

    # The SQLite connections the subjects open, for the statement counts (remembered at
    # connect; traced during the untimed counting passes only).
    conns = SqliteConnections()
    with conns.tracking() if backend == "sqlite" else contextlib.nullcontext():
        await _run_backend_tracked(backend, args, workloads, doc, tmp, conns)


async def _run_backend_tracked(
    backend: str,
    args: argparse.Namespace,
    workloads: list[Workload],
    doc: dict[str, Any],
    tmp: str,
    conns: Any,
) -> None:
    subjects: list[Subject] = []
    for s in make_subjects(backend, args, tmp):
        if isinstance(s, str):
            doc["subjects"].append({"backend": backend, "status": "skipped", "reason": s})
            print(f"[skip] {s}", flush=True)
            continue
        try:
            await s.open()
        except Exception as exc:
            reason = f"{_label(s)}: cannot open: {type(exc).__name__}: {exc}"
            doc["subjects"].append(
                {"backend": backend, "kind": s.kind, "status": "skipped", "reason": reason}
            )
            print(f"[skip] {reason}", flush=True)
            continue
        version = await s.server_version()
        if version:
            doc["meta"]["machine"]["servers"][backend] = version
        doc["subjects"].append(
            {"backend": backend, "kind": s.kind, "status": "ok", "detail": s.detail}
        )
        subjects.append(s)
    doc["meta"]["order"].append(f"workloads:{backend}")
    twins: dict[str, Subject] = {}
    try:
        if backend == "sqlite" and subjects and not getattr(args, "no_statements", False):
            twins = await _open_twins(backend, args, tmp, conns, {s.kind for s in subjects})
        if subjects:
            await _run_workloads(backend, subjects, workloads, args, doc, conns, twins)
    finally:
        await _close_all(subjects)
        await _close_all(list(twins.values()))


async def _open_twins(
    backend: str, args: argparse.Namespace, tmp: str, conns: Any, kinds: set[str]
) -> dict[str, Subject]:
    """A twin of each subject, on files of its own, whose SQLite connections are traced
    from their opening: the statement counts run on it (benchmarks/statements.py), never
    on the subject timed. A twin that cannot open is left out (no count)."""
    twin_dir = os.path.join(tmp, "statement-twins")
    os.makedirs(twin_dir, exist_ok=True)
    twins: dict[str, Subject] = {}
    conns.armed = True
    try:
        for t in make_subjects(backend, args, twin_dir):
            if isinstance(t, str) or t.kind not in kinds:
                continue
            try:
                await t.open()
            except Exception as exc:
                print(f"[warn] statement twin {_label(t)}: {exc!r}", flush=True)
                continue
            twins[t.kind] = t
    finally:
        conns.armed = False
    return twins


async def _run_scale(backend: str, args: argparse.Namespace, doc: dict[str, Any], tmp: str) -> None:
    """The scale workloads of ``backend``, on subjects of their own (opened for them)."""
    from benchmarks.scale import run_scale

    doc["meta"]["order"].append(f"scale:{backend}")
    scale_dir = os.path.join(tmp, f"scale-{backend}")
    os.makedirs(scale_dir)
    subjects: list[Subject] = []
    try:
        for s in make_subjects(backend, args, scale_dir):
            if isinstance(s, str) or s.kind not in args.scale_kinds:
                continue  # an unavailable subject was reported with the workloads
            try:
                await s.open()
            except Exception as exc:
                doc["scale"].append(_scale_error(backend, s.kind, f"cannot open: {exc}"))
                continue
            subjects.append(s)
            doc["scale"].append(await _scale_with_twin(s, backend, args, scale_dir, run_scale))
    finally:
        await _close_all(subjects)


def _scale_error(backend: str, kind: str, error: str) -> dict[str, Any]:
    return {"backend": backend, "kind": kind, "status": "error", "error": error}


async def _close_all(subjects: list[Subject]) -> None:
    for s in subjects:
        try:
            await s.close()
        except Exception as exc:  # cleanup must not hide the results
            print(f"[warn] closing {_label(s)}: {exc}", file=sys.stderr)


async def _scale_with_twin(
    subject: Subject,
    backend: str,
    args: argparse.Namespace,
    tmp: str,
    run_scale: Callable[..., Any],
) -> dict[str, Any]:
    """Run the scale workloads with a second store of the same kind for the small side."""
    twin_dir = os.path.join(tmp, f"twin-{secrets.token_hex(3)}")
    os.makedirs(twin_dir)
    twins = [t for t in make_subjects(backend, args, twin_dir) if not isinstance(t, str)]
    twin = next((t for t in twins if t.kind == subject.kind), None)
    if twin is None:
        return _scale_error(backend, subject.kind, "no twin")
    await twin.open()
    try:
        result: dict[str, Any] = await run_scale(
            subject, twin, args.scale_rows, args.scale_expired, args.quick
        )
        return result
    finally:
        await twin.close()


async def _run_workloads(
    backend: str,
    subjects: list[Subject],
    workloads: list[Workload],
    args: argparse.Namespace,
    doc: dict[str, Any],
    conns: Any = None,
    twins: dict[str, Subject] | None = None,
) -> None:
    for w in workloads:
        runs: dict[int, list[float]] = {i: [] for i in range(len(subjects))}
        extras: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(subjects))}
        status: dict[int, tuple[str, str | None]] = {i: ("ok", None) for i in range(len(subjects))}
        # The share of the machine's CPU time the hypervisor took during each subject's
        # passes of each round (machine.cpu_times): a low round can be checked against it.
        steals: dict[int, list[float | None]] = {i: [] for i in range(len(subjects))}
        # Passes timed again because of steal, and kept over the limit, per round
        # (benchmarks/interference.py).
        retimes: dict[int, list[int]] = {i: [] for i in range(len(subjects))}
        overs: dict[int, list[int]] = {i: [] for i in range(len(subjects))}
        # The client's CPU time per operation in each round, and the part of it in the
        # garbage collector, in ms (benchmarks/client_cpu.py).
        cpus: dict[int, list[float]] = {i: [] for i in range(len(subjects))}
        gcs: dict[int, list[float]] = {i: [] for i in range(len(subjects))}
        # Interleave the subjects round by round, and within a round in passes of
        # alternating order (benchmarks/slices.py), so a noisy moment hits all of them
        # alike; the order turns each round, so none always runs first (or last).
        part = Workload(
            w.name, w.size, w.concurrency, slice_size(w.ops, args.slices, w.concurrency)
        )
        for round_no in range(args.repeat):
            done = dict.fromkeys(range(len(subjects)), 0)
            took = dict.fromkeys(range(len(subjects)), 0.0)
            cpu = dict.fromkeys(range(len(subjects)), 0.0)
            in_gc = dict.fromkeys(range(len(subjects)), 0.0)
            extra: dict[int, dict[str, Any]] = {i: {} for i in range(len(subjects))}
            ticks = {i: [0, 0] for i in range(len(subjects))}  # stolen, all
            retimed = dict.fromkeys(range(len(subjects)), 0)
            over_limit = dict.fromkeys(range(len(subjects)), 0)
            for order in round_order(len(subjects), round_no, args.slices):
                for i in order:
                    s = subjects[i]
                    if status[i][0] != "ok":
                        continue
                    try:
                        kept = await timed_pass(
                            functools.partial(_measure_once, s, part, args.timeout),
                            limit=args.steal_limit,
                            retimes=args.retimes,
                        )
                    except NotImplementedError:
                        status[i] = ("unsupported", None)
                        continue
                    except TimeoutError:
                        status[i] = ("error", f"timed out after {args.timeout:.0f} s")
                        continue
                    except Exception as exc:
                        status[i] = ("error", f"{type(exc).__name__}: {exc}")
                        traceback.print_exc()
                        continue
                    m = kept.result
                    ticks[i][0] += kept.stolen
                    ticks[i][1] += kept.ticks
                    retimed[i] += kept.retimed
                    over_limit[i] += kept.over_limit
                    done[i] += m.ops
                    took[i] += m.seconds
                    cpu[i] += m.cpu_s
                    in_gc[i] += m.gc_s
                    for key, value in m.extra.items():  # counts (a CAS's conflicts)
                        extra[i][key] = extra[i].get(key, 0) + value
            for i in range(len(subjects)):
                if status[i][0] == "ok" and took[i] > 0:
                    runs[i].append(done[i] / took[i])
                    extras[i].append(extra[i])
                    steals[i].append(ticks[i][0] / ticks[i][1] if ticks[i][1] else None)
                    retimes[i].append(retimed[i])
                    overs[i].append(over_limit[i])
                    cpus[i].append(cpu[i] / done[i] * 1e3)
                    gcs[i].append(in_gc[i] / done[i] * 1e3)
        for i, s in enumerate(subjects):
            entry = {
                "backend": backend,
                "kind": s.kind,
                "workload": w.id,
                "name": w.name,
                "size": w.size,
                "concurrency": w.concurrency,
                "ops": part.ops * args.slices,
                "status": status[i][0],
                "error": status[i][1],
                "runs": runs[i],
                "steal": steals[i],
                "retimed": retimes[i],
                "over_limit": overs[i],
                "cpu_ms_per_op": cpus[i],
                "gc_ms_per_op": gcs[i],
                **summarize(runs[i]),
            }
            if extras[i] and any(extras[i]):
                entry["extra"] = extras[i]
            if status[i][0] == "ok" and not getattr(args, "no_statements", False):
                counted = s if backend != "sqlite" else (twins or {}).get(s.kind)
                entry["statements_per_op"] = (
                    None if counted is None else await _statements(counted, w, backend, args, conns)
                )
            doc["results"].append(entry)
            if status[i][0] == "ok":
                print(
                    f"{backend:8} {s.kind:9} {w.id:22} {entry['median']:>10.0f} ops/s"
                    f"  spread {entry['spread']:.0%}",
                    flush=True,
                )
            elif status[i][0] == "error":
                print(f"{backend:8} {s.kind:9} {w.id:22} ERROR {status[i][1]}", flush=True)


async def _statements(
    subject: Subject, w: Workload, backend: str, args: argparse.Namespace, conns: Any
) -> float | None:
    """The cell's statements an operation on ``subject`` (benchmarks/statements.py);
    ``None`` where they cannot be counted, or counting failed (the cell stands)."""
    from benchmarks.statements import statements_per_op

    try:
        return await asyncio.wait_for(
            statements_per_op(subject, w, backend, sqlite_conns=conns, redis_url=args.redis_url),
            args.timeout,
        )
    except NotImplementedError:
        return None
    except Exception as exc:
        print(f"[warn] counting statements of {_label(subject)} {w.id}: {exc!r}", flush=True)
        return None


async def _measure_once(subject: Subject, workload: Workload, bound_s: float) -> Measurement:
    """One pass of ``workload`` on ``subject``, on fresh keys, within ``bound_s`` seconds."""
    return await asyncio.wait_for(measure(subject, workload, f"b{secrets.token_hex(3)}"), bound_s)


async def _cancellable(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run ``coro``; SIGINT or SIGTERM cancel it, so every subject's clean-up still runs
    (a run started in the background ignores SIGINT, and SIGTERM would kill it outright,
    leaving its schema, key prefix or file behind)."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.preset is not None:
        parser.set_defaults(**PRESETS[args.preset])
        args = parser.parse_args(argv)
    if args.render is not None:
        # The report of an earlier run again (after the reasons of its misses were
        # written down, say): the figures are that run's, untouched.
        doc = json.loads(args.render.read_text())
        report.add_ratios_and_targets(doc)
    else:
        if args.update_docs is not None and (args.quick or args.repeat < 3):
            # A published ratio is the median of at least three interleaved rounds.
            raise SystemExit("--update-docs needs --repeat 3 or more (and not --quick)")
        try:
            doc = asyncio.run(_cancellable(run(args)))
        except asyncio.CancelledError:
            print("interrupted: private data removed, no results written", file=sys.stderr)
            return 130
    if doc["meta"].get("quick") and args.update_docs is not None:
        raise SystemExit("--update-docs: a quick run is not published")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "results.md").write_text(report.markdown(doc))
    if not args.no_chart:
        from benchmarks.e2e import e2e_chart

        for note in (
            report.chart(doc, args.out / "ratios.png"),
            report.ops_chart(doc, args.out / "ops.png"),
            e2e_chart(doc, args.out / "e2e.png") if doc.get("e2e") else None,
            *(
                report.backend_chart(doc, b, args.out / report.backend_chart_name(b))
                for b in report.chart_backends(doc)
            ),
        ):
            if note:
                print(f"[chart] {note}")
    chart_name = "" if args.no_chart else ", ratios.png, ops.png, backend-*.png"
    print(f"results in {args.out}/ (results.json, results.md{chart_name})")
    if args.update_docs is not None:
        chart_path = None if args.no_chart else args.out / "ratios.png"
        report.update_page(args.update_docs, doc, chart_path, args.out / "results.md")
        print(f"updated {args.update_docs}")
    errors = [r for r in doc["results"] if r["status"] == "error"]
    errors += [s for s in doc["scale"] if s.get("status") == "error"]
    errors += [e for e in doc.get("e2e", []) if e.get("status") == "error"]
    if errors:
        print(f"{len(errors)} workload(s) failed", file=sys.stderr)
        return 1
    return 0
