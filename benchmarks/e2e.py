"""End to end: a 3-step durable workflow on siglo, DBOS Transact and LangGraph.

The same workflow on each: three steps, each returning a small dict (~200 bytes of JSON)
built from the one before; every step's outcome is durable before the next step starts,
and the run is recorded as finished. One step is cached in siglo (its output also goes
to the backend's step cache, a write the others do not do). How each system is driven:

* **siglo**: ``flow(a, b.cache(...), c).run(input, manager=…, stack_id=run_id)`` with a
  strict :class:`~siglo.StorageManager` (the run holds the stack's workflow lock;
  creation, each step and completion are checkpoints).
* **DBOS Transact**: an async ``@DBOS.workflow()`` calling three ``@DBOS.step()``
  functions, started under ``SetWorkflowID(run_id)``; its system database on the same
  server (Postgres: a private schema; SQLite: a private file).
* **LangGraph**: a ``StateGraph`` of three nodes compiled with the backend's saver,
  ``ainvoke(…, durability="sync")`` so each step's checkpoint is written before the
  next node runs (``AsyncPostgresSaver`` over a pool of 10, as siglo's; ``AsyncSqliteSaver``).

Durability is the same within a backend: SQLite files are WAL with
``synchronous=NORMAL`` for all three (DBOS and LangGraph's saver otherwise leave
SQLite's default rollback journal / ``FULL``); PostgreSQL uses the server's settings.

A measurement is ``runs`` workflow runs by ``c`` concurrent tasks (1 or 32): runs/s, and
the latency of each step, from the start of its function to the start of the next (the
last: to the end of the run), so it includes the step's checkpoint. Systems alternate
within each round, as in the other workloads; ratios are per round.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from benchmarks.client_cpu import ClientClock
from benchmarks.interference import RETIMES, STEAL_LIMIT, timed_pass
from benchmarks.slices import round_order, slice_size
from benchmarks.write_limit import limit_text
from benchmarks.writes import (
    RedisMonitor,
    WriteCounter,
    count_redis_monitor,
    counting_psycopg,
    counting_sqlite,
)

Recorder = Callable[[str, int], None]

_PAYLOAD = {"items": [{"sku": f"SKU-{i}", "qty": i, "price": 9.5 + i} for i in range(4)]}


def _step_output(prev: dict[str, Any], n: int) -> dict[str, Any]:
    return {"run": prev["run"], "step": n, "total": n * 10, **_PAYLOAD}


class E2ESubject:
    """One system on one backend that can run the workflow."""

    system = "?"
    backend = "?"
    detail = ""
    key_prefix: str | None = None
    """On Redis: the prefix of every key the system writes (its writes are counted)."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, run_id: str) -> None:
        raise NotImplementedError

    async def measure(self, concurrency: int, runs: int) -> dict[str, Any]:
        """One pass: ``runs`` workflow runs by ``concurrency`` tasks (:func:`measure_runs`)."""
        return await measure_runs(self, concurrency, runs)

    recorder: Recorder = staticmethod(lambda run, step: None)


# -- siglo --------------------------------------------------------------------------------


class SigloWorkflow(E2ESubject):
    system = "siglo"

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url
        self._stack = contextlib.AsyncExitStack()

    async def open(self) -> None:
        import siglo
        from siglo import Step, flow
        from siglo.plugins import get_registry

        spec = get_registry().for_url(self.url)
        isolated = spec.load_isolated()
        if isolated is not None:
            backend = await self._stack.enter_async_context(isolated(self.url))
        else:
            backend = siglo.connect(self.url)
            self._stack.push_async_callback(backend.aclose)
        self.manager = siglo.StorageManager(backend, error_mode="strict")
        keys = getattr(backend.adapter, "keys", None)
        self.key_prefix = getattr(keys, "prefix", None)
        me = self

        async def a(inp: dict[str, Any]) -> dict[str, Any]:
            me.recorder(inp["run"], 0)
            return _step_output(inp, 1)

        async def b(inp: dict[str, Any]) -> dict[str, Any]:
            me.recorder(inp["run"], 1)
            return _step_output(inp, 2)

        async def c(inp: dict[str, Any]) -> dict[str, Any]:
            me.recorder(inp["run"], 2)
            return _step_output(inp, 3)

        self.flow = flow(
            Step.create("fetch", a),
            Step.create("price", b).cache(ttl_ms=300_000, key=lambda inp: f"price-{inp['run']}"),
            Step.create("settle", c),
            name="bench-e2e",
        )
        self.detail = f"siglo {spec.name}: flow of 3 steps (one cached), strict manager"

    async def close(self) -> None:
        await self._stack.aclose()

    async def run(self, run_id: str) -> None:
        out = await self.flow.run({"run": run_id}, manager=self.manager, stack_id=run_id)
        assert out["step"] == 3


# -- DBOS ---------------------------------------------------------------------------------

_dbos_recorder: list[Recorder] = [lambda run, step: None]
_dbos_workflow: list[Callable[[str], Awaitable[dict[str, Any]]]] = []


_F = TypeVar("_F", bound=Callable[..., Any])


def _define_dbos() -> Callable[[str], Awaitable[dict[str, Any]]]:
    """The DBOS workflow, registered once per process (DBOS keeps a global registry)."""
    if _dbos_workflow:
        return _dbos_workflow[0]
    from dbos import DBOS

    # Typed through casts so mypy --strict passes with or without the bench extra (DBOS
    # untyped when it is not installed).
    step = cast(Callable[[_F], _F], DBOS.step())
    workflow = cast(Callable[[_F], _F], DBOS.workflow())

    @step
    async def fetch(inp: dict[str, Any]) -> dict[str, Any]:
        _dbos_recorder[0](inp["run"], 0)
        return _step_output(inp, 1)

    @step
    async def price(inp: dict[str, Any]) -> dict[str, Any]:
        _dbos_recorder[0](inp["run"], 1)
        return _step_output(inp, 2)

    @step
    async def settle(inp: dict[str, Any]) -> dict[str, Any]:
        _dbos_recorder[0](inp["run"], 2)
        return _step_output(inp, 3)

    @workflow
    async def bench_e2e(run_id: str) -> dict[str, Any]:
        out = await fetch({"run": run_id})
        out = await price(out)
        return await settle(out)

    _dbos_workflow.append(bench_e2e)
    return bench_e2e


class DbosWorkflow(E2ESubject):
    system = "dbos"

    def __init__(self, backend: str, postgres_url: str, tmp: str) -> None:
        self.backend = backend
        self.postgres_url = postgres_url
        self.tmp = tmp
        self.schema = f"siglo_bench_dbos_{secrets.token_hex(4)}"

    async def open(self) -> None:
        import importlib.metadata

        from dbos import DBOS

        workflow = _define_dbos()
        config: dict[str, Any] = {"name": "siglo-bench-e2e", "sys_db_pool_size": 10}
        if self.backend == "postgres":
            config["system_database_url"] = self.postgres_url.replace(
                "postgresql://", "postgresql+psycopg://", 1
            )
            config["dbos_system_schema"] = self.schema
            where = f"private schema {self.schema}"
        else:
            config["system_database_engine"] = _wal_sqlite_engine(
                os.path.join(self.tmp, f"dbos-{secrets.token_hex(3)}.sqlite")
            )
            where = (
                "WAL + synchronous=NORMAL (set by the benchmark through its own engine; "
                "DBOS's default is SQLite's rollback journal with synchronous=FULL)"
            )
        DBOS(config=cast(Any, config))  # a TypedDict in DBOS; built as a plain dict here
        DBOS.launch()
        self._workflow = workflow
        version = importlib.metadata.version("dbos")
        self.detail = f"DBOS Transact {version}: async workflow of 3 steps, {where}"

    async def close(self) -> None:
        from dbos import DBOS

        DBOS.destroy(destroy_registry=False)
        if self.backend == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(
                self.postgres_url, autocommit=True
            ) as conn:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    async def run(self, run_id: str) -> None:
        from dbos import SetWorkflowID

        _dbos_recorder[0] = self.recorder
        with SetWorkflowID(run_id):
            out = await self._workflow(run_id)
        assert out["step"] == 3


def _wal_sqlite_engine(path: str) -> Any:
    """A SQLAlchemy engine set up as DBOS sets up its own, plus WAL and NORMAL."""
    import sqlalchemy as sa
    from sqlalchemy import event

    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def configure(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"  # as DBOS does
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


# -- LangGraph ----------------------------------------------------------------------------


class LangGraphWorkflow(E2ESubject):
    system = "langgraph"

    def __init__(self, backend: str, postgres_url: str, tmp: str) -> None:
        self.backend = backend
        self.postgres_url = postgres_url
        self.tmp = tmp
        self.schema = f"siglo_bench_lgwf_{secrets.token_hex(4)}"
        self._stack = contextlib.AsyncExitStack()

    async def open(self) -> None:
        from typing import TypedDict

        from langgraph.graph import END, START, StateGraph

        class State(TypedDict, total=False):
            run: str
            fetch: dict[str, Any]
            price: dict[str, Any]
            settle: dict[str, Any]

        me = self

        async def fetch(state: State) -> dict[str, Any]:
            me.recorder(state["run"], 0)
            return {"fetch": _step_output({"run": state["run"]}, 1)}

        async def price(state: State) -> dict[str, Any]:
            me.recorder(state["run"], 1)
            return {"price": _step_output(state["fetch"], 2)}

        async def settle(state: State) -> dict[str, Any]:
            me.recorder(state["run"], 2)
            return {"settle": _step_output(state["price"], 3)}

        graph = StateGraph(State)
        graph.add_node("fetch", fetch)
        graph.add_node("price", price)
        graph.add_node("settle", settle)
        graph.add_edge(START, "fetch")
        graph.add_edge("fetch", "price")
        graph.add_edge("price", "settle")
        graph.add_edge("settle", END)
        if self.backend == "postgres":
            import psycopg
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            async with await psycopg.AsyncConnection.connect(
                self.postgres_url, autocommit=True
            ) as conn:
                await conn.execute(f'CREATE SCHEMA "{self.schema}"')
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.postgres_url,
                min_size=10,
                max_size=10,
                kwargs={
                    "autocommit": True,
                    "prepare_threshold": 0,
                    "row_factory": dict_row,
                    "options": f"-c search_path={self.schema}",
                },
                open=False,
            )
            await pool.open(wait=True)
            self._stack.push_async_callback(pool.close)
            saver: Any = AsyncPostgresSaver(pool)
            await saver.setup()
            self.detail = "LangGraph StateGraph of 3 nodes, AsyncPostgresSaver over a pool of 10"
        else:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            path = os.path.join(self.tmp, f"lgwf-{secrets.token_hex(3)}.db")
            saver = await self._stack.enter_async_context(AsyncSqliteSaver.from_conn_string(path))
            await saver.setup()
            await saver.conn.execute("PRAGMA synchronous=NORMAL")
            self.detail = (
                "LangGraph StateGraph of 3 nodes, AsyncSqliteSaver, WAL + synchronous=NORMAL "
                "(set by the benchmark; its default is FULL)"
            )
        self.graph = graph.compile(checkpointer=saver)

    async def close(self) -> None:
        await self._stack.aclose()
        if self.backend == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(
                self.postgres_url, autocommit=True
            ) as conn:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    async def run(self, run_id: str) -> None:
        out = await self.graph.ainvoke(
            {"run": run_id}, {"configurable": {"thread_id": run_id}}, durability="sync"
        )
        assert out["settle"]["step"] == 3


# -- the raw write limit ------------------------------------------------------------------


class RawWriteLimit(E2ESubject):
    """The backend's raw write rate (:mod:`benchmarks.write_limit`), timed in the same
    rounds and passes as the systems; its rows go to ``doc["e2e_limit"]``."""

    system = "raw-limit"

    def __init__(self, backend: str, writer: Any) -> None:
        self.backend = backend
        self.writer = writer

    async def open(self) -> None:
        await self.writer.open()
        self.detail = f"{self.writer.detail}; plain save of a step-sized row (~260 bytes)"

    async def close(self) -> None:
        await self.writer.close()

    async def measure(self, concurrency: int, runs: int) -> dict[str, Any]:
        from benchmarks.write_limit import WRITES_PER_RUN_TIMED, measure_writes

        return await measure_writes(self.writer, concurrency, runs * WRITES_PER_RUN_TIMED)


LANGGRAPH_REDIS_SKIP = (
    "langgraph on redis: not run; its saver (langgraph-checkpoint-redis, 0.5.2 checked) "
    "needs the RediSearch module: on plain Redis 7 its setup fails with unknown command "
    "'FT.INFO'"
)


# -- measuring ----------------------------------------------------------------------------


async def measure_runs(subject: E2ESubject, concurrency: int, runs: int) -> dict[str, Any]:
    """``runs`` workflow runs by ``concurrency`` tasks: runs/s and step latencies (µs)."""
    starts: dict[str, list[int]] = {}

    def record(run: str, step: int) -> None:
        starts.setdefault(run, [0, 0, 0])[step] = time.perf_counter_ns()

    subject.recorder = record
    per = max(1, runs // concurrency)
    tag = uuid.uuid4().hex[:8]
    latencies: list[float] = []

    async def worker(w: int, first: int, stop: int) -> None:
        for j in range(first, stop):
            run_id = f"e2e-{tag}-{w}-{j}"
            await subject.run(run_id)
            end = time.perf_counter_ns()
            if j >= 1:  # the first run of each worker is the warm-up
                s = starts[run_id]
                latencies.extend(((s[1] - s[0]) / 1e3, (s[2] - s[1]) / 1e3, (end - s[2]) / 1e3))

    await asyncio.gather(*(worker(w, 0, 1) for w in range(concurrency)))
    clock = ClientClock()
    clock.start()
    await asyncio.gather(*(worker(w, 1, 1 + per) for w in range(concurrency)))
    took = clock.stop()
    latencies.sort()
    return {
        "runs_per_s": per * concurrency / took.seconds,
        "runs": per * concurrency,
        "seconds": took.seconds,
        "cpu_s": took.cpu_s,
        "step_us": latencies,
    }


async def _runs_once(
    subject: E2ESubject, concurrency: int, runs: int, bound_s: float
) -> dict[str, Any]:
    """One pass of ``subject``'s measurement (:func:`measure_runs`), within ``bound_s``
    seconds."""
    return await asyncio.wait_for(subject.measure(concurrency, runs), bound_s)


def _joined(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One round of a system from its passes: its runs over its time, all latencies, the
    share of the CPU time stolen during them and the passes timed again for it
    (benchmarks/interference.py)."""
    runs = sum(p["runs"] for p in parts)
    seconds = sum(p["seconds"] for p in parts)
    ticks = sum(p.get("ticks", 0) for p in parts)
    return {
        "runs_per_s": runs / seconds,
        "runs": runs,
        "seconds": seconds,
        # The process's CPU time a run (all its threads: the client's side of the work).
        "cpu_ms_per_run": sum(p.get("cpu_s", 0.0) for p in parts) / runs * 1e3,
        "step_us": sorted(x for p in parts for x in p["step_us"]),
        "steal": sum(p.get("stolen", 0) for p in parts) / ticks if ticks else None,
        "retimed": sum(p.get("retimed", 0) for p in parts),
        "over_limit": sum(p.get("over_limit", 0) for p in parts),
    }


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def make_e2e_subjects(backend: str, args: Any, tmp: str) -> list[E2ESubject | str]:
    """The systems that run on ``backend``; a string is why one is unavailable."""
    import importlib.util

    urls = {
        "redis": args.redis_url,
        "postgres": args.postgres_url,
        "sqlite": f"sqlite:///{os.path.join(tmp, f'siglo-e2e-{secrets.token_hex(3)}.db')}",
        "memory": "memory://",
    }
    out: list[E2ESubject | str] = [SigloWorkflow(backend, urls[backend])]
    if backend in ("postgres", "sqlite"):
        if importlib.util.find_spec("dbos") is None:
            out.append("dbos: not installed (pip install dbos)")
        else:
            out.append(DbosWorkflow(backend, args.postgres_url, tmp))
        try:
            found = importlib.util.find_spec("langgraph.graph") is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append("langgraph: not installed (pip install langgraph)")
        else:
            out.append(LangGraphWorkflow(backend, args.postgres_url, tmp))
    if backend == "redis":
        out.append(LANGGRAPH_REDIS_SKIP)
    if getattr(args, "e2e_limit", True):
        from benchmarks.write_limit import make_raw_writer

        writer = make_raw_writer(backend, args, tmp)
        out.append(writer if isinstance(writer, str) else RawWriteLimit(backend, writer))
    return out


async def count_writes(
    subject: E2ESubject, backend: str, concurrency: int, counter: WriteCounter, redis_url: str
) -> dict[str, float]:
    """One untimed pass of ``2 × concurrency`` runs (at least 8) with the writes counted
    (:mod:`benchmarks.writes`): writes per run, and on SQLite and PostgreSQL write
    transactions per run."""
    runs = max(8, 2 * concurrency)
    if backend == "redis":
        if subject.key_prefix is None:
            return {}
        async with RedisMonitor(redis_url) as monitor:
            m = await measure_runs(subject, concurrency, runs)
        done = m["runs"] + concurrency  # the warm-up run of each task is counted too
        return {"writes_per_run": count_redis_monitor(monitor.lines, subject.key_prefix) / done}
    before = counter.snapshot()
    counter.enabled = True
    try:
        m = await measure_runs(subject, concurrency, runs)
    finally:
        counter.enabled = False
    statements, transactions = (a - b for a, b in zip(counter.snapshot(), before, strict=True))
    done = m["runs"] + concurrency  # the warm-up run of each task is counted too
    out = {"writes_per_run": statements / done}
    if backend in ("sqlite", "postgres"):
        out["write_transactions_per_run"] = transactions / done
    return out


def _counting(backend: str, counter: WriteCounter) -> contextlib.AbstractContextManager[None]:
    """The driver wrappers that count ``backend``'s writes (from before any system opens
    its connections to after they are closed)."""
    if backend == "sqlite":
        return counting_sqlite(counter)
    if backend == "postgres":
        return counting_psycopg(counter)
    return contextlib.nullcontext()


async def run_e2e(args: Any, doc: dict[str, Any]) -> None:
    """Run the end-to-end comparison on each of ``args.e2e_backends``; fill ``doc``."""
    with tempfile.TemporaryDirectory(prefix="siglo-e2e-") as tmp:
        for backend in args.e2e_backends:
            counter = WriteCounter()
            with _counting(backend, counter):
                await _run_e2e_backend(backend, args, doc, tmp, counter)
    add_e2e_ratios(doc)


async def _run_e2e_backend(
    backend: str, args: Any, doc: dict[str, Any], tmp: str, counter: WriteCounter
) -> None:
    rounds = args.repeat
    slices = getattr(args, "slices", 1)
    doc.setdefault("e2e", [])
    doc.setdefault("e2e_subjects", [])
    subjects: list[E2ESubject] = []
    for s in make_e2e_subjects(backend, args, tmp):
        if isinstance(s, str):
            doc["e2e_subjects"].append({"backend": backend, "skipped": s})
            print(f"[e2e skip] {backend}: {s}", flush=True)
            continue
        subjects.append(s)
    # DBOS is one global instance per process: one backend's at a time.
    opened: list[E2ESubject] = []
    for s in subjects:
        try:
            await s.open()
        except Exception as exc:
            reason = f"{s.system}: cannot open: {type(exc).__name__}: {exc}"
            doc["e2e_subjects"].append({"backend": backend, "skipped": reason})
            print(f"[e2e skip] {backend}: {reason}", flush=True)
            continue
        opened.append(s)
    subjects = opened
    try:
        for concurrency in (1, 32):
            runs = max(concurrency, int((60 if concurrency == 1 else 320) * args.e2e_scale))
            if args.quick:
                runs = concurrency * 2
            results: dict[str, list[dict[str, Any]]] = {s.system: [] for s in subjects}
            errors: dict[str, str] = {}
            part = max(concurrency, slice_size(runs, slices, 1))
            for round_no in range(rounds):
                # In passes of alternating order, as the workloads
                # (benchmarks/slices.py): a system's round is its runs over its
                # time summed across the passes.
                parts: dict[str, list[dict[str, Any]]] = {s.system: [] for s in subjects}
                for order in round_order(len(subjects), round_no, slices):
                    for s in (subjects[i] for i in order):
                        if s.system in errors:
                            continue
                        try:
                            kept = await timed_pass(
                                functools.partial(_runs_once, s, concurrency, part, args.timeout),
                                limit=getattr(args, "steal_limit", STEAL_LIMIT),
                                retimes=getattr(args, "retimes", RETIMES),
                            )
                        except Exception as exc:
                            errors[s.system] = f"{type(exc).__name__}: {exc}"
                            print(f"[e2e error] {s.system}:{backend}: {exc!r}", flush=True)
                            continue
                        parts[s.system].append(
                            {
                                **kept.result,
                                "stolen": kept.stolen,
                                "ticks": kept.ticks,
                                "retimed": kept.retimed,
                                "over_limit": int(kept.over_limit),
                            }
                        )
                for s in subjects:
                    if s.system in errors or not parts[s.system]:
                        continue
                    m = _joined(parts[s.system])
                    results[s.system].append(m)
                    unit = "writes/s" if s.system == RawWriteLimit.system else "runs/s"
                    print(
                        f"e2e {backend:8} {s.system:9} c{concurrency:<3} "
                        f"{m['runs_per_s']:>8.0f} {unit}  step p50 "
                        f"{_pct(m['step_us'], 0.5):.0f} µs  p99 "
                        f"{_pct(m['step_us'], 0.99):.0f} µs",
                        flush=True,
                    )
            for s in subjects:
                ms = results[s.system]
                pooled = sorted(x for m in ms for x in m["step_us"])
                if s.system == RawWriteLimit.system:
                    doc.setdefault("e2e_limit", []).append(
                        {
                            "backend": backend,
                            "concurrency": concurrency,
                            "detail": s.detail,
                            "status": "error" if s.system in errors else "ok",
                            "error": errors.get(s.system),
                            "writes_per_s_rounds": [m["runs_per_s"] for m in ms],
                            "writes_per_s": (
                                statistics.median([m["runs_per_s"] for m in ms]) if ms else None
                            ),
                            "cpu_ms_per_write": [m["cpu_ms_per_run"] for m in ms],
                            "write_p50_us": _pct(pooled, 0.5) if pooled else None,
                            "write_p99_us": _pct(pooled, 0.99) if pooled else None,
                            "steal": [m["steal"] for m in ms],
                            "retimed": [m["retimed"] for m in ms],
                            "over_limit": [m["over_limit"] for m in ms],
                        }
                    )
                    continue
                writes: dict[str, float] = {}
                if s.system not in errors:
                    try:
                        writes = await count_writes(
                            s, backend, concurrency, counter, args.redis_url
                        )
                    except Exception as exc:  # the figure is missing, not the run
                        print(f"[e2e warn] counting {s.system}: {exc!r}", flush=True)
                doc["e2e"].append(
                    {
                        "backend": backend,
                        "system": s.system,
                        "detail": s.detail,
                        "concurrency": concurrency,
                        "runs": part * slices,
                        "status": "error" if s.system in errors else "ok",
                        "error": errors.get(s.system),
                        "runs_per_s_rounds": [m["runs_per_s"] for m in ms],
                        "cpu_ms_per_run": [m["cpu_ms_per_run"] for m in ms],
                        "steal": [m["steal"] for m in ms],
                        "retimed": [m["retimed"] for m in ms],
                        "over_limit": [m["over_limit"] for m in ms],
                        "runs_per_s": (
                            statistics.median([m["runs_per_s"] for m in ms]) if ms else None
                        ),
                        "step_p50_us": _pct(pooled, 0.5) if pooled else None,
                        "step_p99_us": _pct(pooled, 0.99) if pooled else None,
                        **writes,
                    }
                )
    finally:
        for s in subjects:
            try:
                await s.close()
            except Exception as exc:  # clean-up must not hide the results
                print(f"[e2e warn] closing {s.system}:{backend}: {exc!r}", flush=True)


def add_e2e_ratios(doc: dict[str, Any]) -> None:
    """siglo / other runs/s per round, for every system siglo shares a backend with."""
    ratios: list[dict[str, Any]] = []
    rows = doc.get("e2e", [])
    for r in rows:
        if r["system"] != "siglo" or r["status"] != "ok":
            continue
        for o in rows:
            if (
                o["backend"] != r["backend"]
                or o["concurrency"] != r["concurrency"]
                or o["system"] == "siglo"
                or o["status"] != "ok"
                or len(o["runs_per_s_rounds"]) != len(r["runs_per_s_rounds"])
            ):
                continue
            rounds = [
                a / b
                for a, b in zip(r["runs_per_s_rounds"], o["runs_per_s_rounds"], strict=True)
                if b
            ]
            if not rounds:
                continue
            mine, other = r.get("steal") or [], o.get("steal") or []
            steal = (
                [[a, b] for a, b in zip(mine, other, strict=True)]
                if len(mine) == len(other) == len(rounds)
                else []
            )
            # Each round's client CPU a run, [siglo's, collecting (not recorded), the
            # other's, collecting], and both sides' writes a run: a miss's computed reason
            # (benchmarks/reasons.py) reads them as a workload cell's.
            cpus = [
                [a, 0.0, b, 0.0]
                for a, b in zip(
                    r.get("cpu_ms_per_run") or [], o.get("cpu_ms_per_run") or [], strict=False
                )
            ]
            writes = [r.get("writes_per_run"), o.get("writes_per_run")]
            ratios.append(
                {
                    "cpu": cpus if len(cpus) == len(rounds) else [],
                    "statements": writes if None not in writes else [],
                    "backend": r["backend"],
                    "workload": f"workflow/c{r['concurrency']} vs {o['system']}",
                    "name": "workflow",
                    "size": None,
                    "concurrency": r["concurrency"],
                    "vs": o["system"],
                    "rounds": rounds,
                    "ratio": statistics.median(rounds),
                    "ratio_min": min(rounds),
                    "ratio_max": max(rounds),
                    "steal": steal,
                }
            )
    doc["e2e_ratios"] = ratios


def e2e_markdown(doc: dict[str, Any], *, systems: bool = True) -> list[str]:
    """The end-to-end table as markdown lines, followed by what each system ran
    (``systems``)."""
    rows = doc.get("e2e", [])
    if not rows:
        return []
    # Runs recorded before writes were counted have no such column, nor those before the
    # raw write limit was measured (benchmarks/write_limit.py).
    counted = any(r.get("writes_per_run") is not None for r in rows)
    limited = bool(doc.get("e2e_limit"))
    lines = [
        "### end to end: a 3-step durable workflow",
        "",
        "| backend | system | concurrent runs | runs/s (median of rounds) | "
        "step p50 µs | step p99 µs | siglo / this, runs/s |"
        + (" store writes per run (SQLite, PostgreSQL: write transactions) |" if counted else "")
        + (" raw write limit, runs/s · runs/s / limit (min–max) |" if limited else ""),
        "|---|---|---:|---:|---:|---:|---:|"
        + ("---:|" if counted else "")
        + ("---:|" if limited else ""),
    ]
    ratio_of = {(x["backend"], x["concurrency"], x["vs"]): x for x in doc.get("e2e_ratios", [])}
    limit_of = {
        (x["backend"], x["concurrency"], x["system"]): x for x in doc.get("e2e_limit_ratios", [])
    }
    for r in rows:
        if r["status"] != "ok":
            lines.append(
                f"| {r['backend']} | {r['system']} | {r['concurrency']} | error: {r['error']} "
                "| | | |" + (" |" if counted else "") + (" |" if limited else "")
            )
            continue
        x = ratio_of.get((r["backend"], r["concurrency"], r["system"]))
        ratio = (
            "–"
            if x is None
            else f"**{x['ratio']:.2f}** ({x['ratio_min']:.2f}–{x['ratio_max']:.2f})"
        )
        lim = limit_of.get((r["backend"], r["concurrency"], r["system"]))
        lines.append(
            f"| {r['backend']} | {r['system']} | {r['concurrency']} | {r['runs_per_s']:,.0f} | "
            f"{r['step_p50_us']:,.0f} | {r['step_p99_us']:,.0f} | {ratio} |"
            + (f" {_writes_text(r)} |" if counted else "")
            + (f" {limit_text(lim)} |" if limited else "")
        )
    lines += _limit_lines(doc)
    if not systems:
        return [*lines, ""]
    lines += ["", "Systems:", ""]
    seen: set[tuple[str, str]] = set()
    for r in rows:
        if (r["backend"], r["system"]) not in seen and r.get("detail"):
            seen.add((r["backend"], r["system"]))
            lines.append(f"- {r['system']}:{r['backend']} — {r['detail']}")
    for r in doc.get("e2e_limit", []):
        if (r["backend"], "raw-limit") not in seen and r.get("detail"):
            seen.add((r["backend"], "raw-limit"))
            lines.append(f"- raw write limit:{r['backend']} — {r['detail']}")
    for s in doc.get("e2e_subjects", []):
        lines.append(f"- skipped on {s['backend']}: {s['skipped']}")
    lines.append("")
    return lines


def _limit_lines(doc: dict[str, Any]) -> list[str]:
    """The raw write rates the limits are made of, per backend and writers."""
    rows = doc.get("e2e_limit", [])
    if not rows:
        return []
    parts = []
    for r in rows:
        if r["status"] != "ok" or not r["writes_per_s_rounds"]:
            parts.append(f"{r['backend']} x{r['concurrency']} error: {r['error']}")
            continue
        rates = r["writes_per_s_rounds"]
        parts.append(
            f"{r['backend']} x{r['concurrency']} {r['writes_per_s']:,.0f} "
            f"({min(rates):,.0f}–{max(rates):,.0f})"
        )
    return [
        "",
        "Raw write limit (benchmarks/write_limit.py): the raw-fast driver's plain save of a "
        "step-sized row by as many writers as runs, timed in the same passes, writes/s "
        "median (min–max of rounds): " + "; ".join(parts) + ". A system's limit is that over "
        "its writes per run, per round.",
    ]


def _writes_text(r: dict[str, Any]) -> str:
    """Writes per run, with the write transactions where counted (``–``: not counted)."""
    writes = r.get("writes_per_run")
    if writes is None:
        return "–"
    tx = r.get("write_transactions_per_run")
    return f"{writes:.1f}" + ("" if tx is None else f" ({tx:.1f})")


def e2e_chart(doc: dict[str, Any], path: Any) -> str | None:
    """Runs/s of every system per backend and concurrency (log scale) as a PNG."""
    rows = [r for r in doc.get("e2e", []) if r["status"] == "ok" and r["runs_per_s"]]
    if not rows:
        return "no end-to-end results to chart"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no end-to-end chart"
    groups = list(dict.fromkeys((r["backend"], r["concurrency"]) for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    colors = {"siglo": "#4c72b0", "dbos": "#55a868", "langgraph": "#dd8452"}
    fig, ax = plt.subplots(figsize=(1.6 * len(groups) + 2, 3.6))
    width = 0.8 / len(systems)
    for j, system in enumerate(systems):
        xs, ys = [], []
        for i, g in enumerate(groups):
            for r in rows:
                if (r["backend"], r["concurrency"]) == g and r["system"] == system:
                    xs.append(i + j * width)
                    ys.append(r["runs_per_s"])
        ax.bar(xs, ys, width=width, label=system, color=colors.get(system))
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(groups))],
        [f"{b}\n{c} concurrent" for b, c in groups],
        fontsize=8,
    )
    ax.set_yscale("log")
    ax.set_ylabel("workflow runs/s (median)")
    ax.set_title("3-step durable workflow: runs/s", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
