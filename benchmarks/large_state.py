"""Large state (issue 34): bytes written per run, and save/load latency by size.

``python -m benchmarks.large_state bytes`` runs a 100-step workflow whose state grows to
1 MB and 10 MB (each step adds one context of 1/100 of the final size and saves) on each
backend, with documents stored whole (``incremental_min_bytes=none``) and incrementally
(the default on SQL; on Redis, where it is opt-in, ``incremental_min_bytes=16384``), and
prints the bytes siglo sent to be stored: the bytes and text values
of the parameters of every writing SQL statement, every byte of every command sent to
Redis. The bytes that changed per run are the sum of the new contexts.

``python -m benchmarks.large_state latency --before DIR`` measures the median save and
load of a 1 KB / 256 KB / 10 MB document of 16 contexts, one context changed per save,
here and in the siglo checkout ``DIR`` (a tree without this work: its ``siglo`` and
``backends`` come first on ``sys.path`` of a child process), in interleaved rounds, and
prints the median of the round medians with their range. ``--after-options JSON``
connects this tree's side with those options (``'{"incremental_min_bytes": 16384}'``:
Redis with incremental saves on, or another SQL threshold). In the options of either
side, ``"pattern": "grow"`` makes a history context grow by one message a save (the
document's length changes every save) instead of one context replaced by another of the
same length, and ``"reader": "cold"`` or ``"follower"`` says who loads
(:func:`latency_round`).

Figures taken on a shared machine are indicative; docs/benchmarks-large-state.md records
what was run.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

KINDS = ("sqlite", "postgres", "redis")
POSTGRES_URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parents[1]
REDIS_INCREMENTAL_MIN_BYTES = 16_384
"""The threshold the Redis runs with incremental saves on use (the SQL default until it
became 64 KiB; the Redis rows of docs/benchmarks-large-state.md were measured with it)."""


@asynccontextmanager
async def open_kind(kind: str, **options: Any) -> AsyncIterator[Any]:
    """A backend of ``kind`` on private storage, removed afterwards."""
    if kind == "sqlite":
        from siglo_sqlite import isolated as sqlite_isolated

        with tempfile.TemporaryDirectory(prefix="siglo-bench-") as directory:
            async with sqlite_isolated(f"sqlite:///{directory}/b.db", **options) as backend:
                yield backend
    elif kind == "postgres":
        from siglo_postgres import isolated as pg_isolated

        async with pg_isolated(POSTGRES_URL, **options) as backend:
            yield backend
    else:
        from siglo_redis import isolated as redis_isolated

        async with redis_isolated(REDIS_URL, **options) as backend:
            yield backend


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (list, tuple)):  # an array parameter (PostgreSQL)
        return sum(_size(v) for v in value)
    return 0


class Meter:
    """Counts the bytes a backend sends to be stored (see the module)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.depth = 0
        """Calls of the wrapped methods in progress: one that calls another (a
        ``write`` that is a ``fetch``) counts once, at the outermost."""

    def count_params(self, sql: str, params: Any) -> None:
        if self.depth > 1 or sql.lstrip()[:6].upper() in ("SELECT",):
            return
        values = params.values() if isinstance(params, dict) else params
        self.bytes += sum(_size(v) for v in values)


def meter_sql(adapter: Any, meter: Meter) -> None:
    """Count every writing statement of ``adapter``'s database (instance attributes)."""
    db = adapter.database

    def wrap(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(sql: str, params: Any = ()) -> Any:
            meter.depth += 1
            try:
                meter.count_params(sql, params)
                return await method(sql, params)
            finally:
                meter.depth -= 1

        return counted

    class Tx:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def fetch(self, sql: str, params: Any = ()) -> Any:
            meter.depth += 1
            try:
                meter.count_params(sql, params)
                return await self.inner.fetch(sql, params)
            finally:
                meter.depth -= 1

    transaction = db.transaction

    @asynccontextmanager
    async def counted_transaction() -> AsyncIterator[Any]:
        meter.depth += 1  # fetch_all runs in one: its statements are counted there
        try:
            async with transaction() as tx:
                meter.depth -= 1
                try:
                    yield Tx(tx)
                finally:
                    meter.depth += 1
        finally:
            meter.depth -= 1

    fetch_all = db.fetch_all

    async def counted_all(statements: Any) -> Any:
        meter.depth += 1
        try:
            for sql, params in statements:
                meter.count_params(sql, params)
            return await fetch_all(statements)
        finally:
            meter.depth -= 1

    run_plan = db.run_plan

    def counting(plan: Any) -> Any:
        try:
            step = next(plan)
            while True:
                meter.count_params(*step)
                step = plan.send((yield step))
        except StopIteration:
            return

    async def counted_plan(plan: Any) -> None:
        meter.depth += 1  # an awaited plan runs in a transaction: counted here only
        try:
            await run_plan(counting(plan))
        finally:
            meter.depth -= 1

    db.run_plan = counted_plan
    db.write = wrap(db.write)
    db.fetch = wrap(db.fetch)
    db.fetch_all = counted_all
    db.transaction = counted_transaction


def meter_redis(meter: Meter) -> Callable[[], None]:
    """Count every byte sent to Redis (pipelined and not); returns the undo."""
    from redis.asyncio.connection import AbstractConnection

    import siglo_redis.pipelining as pipelining

    original_pack = pipelining.pack

    def counted_pack(conn: Any, entries: Any) -> Any:
        chunks, packed = original_pack(conn, entries)
        meter.bytes += sum(len(c) for c in chunks)
        return chunks, packed

    pipelining.pack = counted_pack
    original = AbstractConnection.send_packed_command

    async def counted(self: Any, command: Any, check_health: bool = True) -> None:
        if isinstance(command, (bytes, bytearray, memoryview, str)):
            meter.bytes += _size(command)
        else:
            meter.bytes += sum(_size(part) for part in command)
        await original(self, command, check_health)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]

    def undo() -> None:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
        pipelining.pack = original_pack

    return undo


def _piece(step: int, size: int) -> dict[str, Any]:
    # Text that compresses like tool output (not one repeated byte).
    line = f"step {step}: observation and tool output " * 4
    return {"out": (line * (size // len(line) + 1))[:size], "step": step}


async def bytes_per_run(
    kind: str, final: int, incremental: bool, steps: int = 100
) -> dict[str, Any]:
    from siglo import Checkpoint

    options: dict[str, Any] = {} if incremental else {"incremental_min_bytes": None}
    if kind == "redis" and incremental:
        options = {"incremental_min_bytes": REDIS_INCREMENTAL_MIN_BYTES}
    async with open_kind(kind, **options) as backend:
        meter = Meter()
        undo = meter_redis(meter) if kind == "redis" else None
        if kind != "redis":
            meter_sql(backend.raw_adapter, meter)
        contexts: dict[str, Any] = {}
        changed = 0
        started = time.perf_counter()
        try:
            for step in range(1, steps + 1):
                piece = _piece(step, final // steps)
                contexts[f"step-{step}"] = piece
                changed += len(json.dumps(piece, separators=(",", ":")))
                cp = Checkpoint(
                    stack_id="run", revision=step, timestamp=step, contexts=dict(contexts)
                )
                await backend.adapter.save_checkpoint(cp, expected_revision=step - 1)
        finally:
            if undo is not None:
                undo()
        elapsed = time.perf_counter() - started
        loaded = await backend.adapter.get_checkpoint("run")
        assert loaded is not None
        assert loaded.to_json() == cp.to_json()
        return {
            "kind": kind,
            "final_bytes": len(cp.to_json()),
            "mode": "incremental" if incremental else "whole",
            "written": meter.bytes,
            "changed": changed,
            "ratio": round(meter.bytes / changed, 2),
            "seconds": round(elapsed, 2),
        }


def _document(size: int, revision: int, changed: int) -> Any:
    from siglo import Checkpoint

    per = max(1, size // 16)
    contexts = {
        f"c{i}": _piece(i * 1000 + (revision if i == changed else 0), per) for i in range(16)
    }
    return Checkpoint(stack_id="lat", revision=revision, timestamp=revision, contexts=contexts)


def _message(n: int) -> dict[str, Any]:
    return {"role": "tool" if n % 2 else "assistant", "n": n, "text": f"turn {n}: " + "x" * 220}


def _grown_document(size: int, revision: int) -> Any:
    """A ``size`` document whose first context is a history that grows by one message of
    about 256 bytes a save; the other 15 contexts do not change."""
    from siglo import Checkpoint

    per = max(1, size // 16)
    history = {"messages": [_message(n) for n in range(per // 256 + revision)]}
    contexts = {"c0": history, **{f"c{i}": _piece(i * 1000, per) for i in range(1, 16)}}
    return Checkpoint(stack_id="lat", revision=revision, timestamp=revision, contexts=contexts)


async def latency_round(
    kind: str, size: int, ops: int, options: dict[str, Any] | None = None
) -> dict[str, float]:
    """Median save and load of a ``size`` document, ``ops`` of each (ms), on a backend
    connected with ``options``. The option ``"reader"`` (not passed on) says who loads:
    ``"cold"``, the saver with its memory of bodies and versions emptied before each
    load (a process that has not read the row yet); ``"follower"``, an adapter on the same
    connections with a memory of its own that loads and never saves (another process
    following the writer: one context changes between its loads). The option
    ``"pattern"`` (not passed on) says how the document changes from one save to the
    next: by default one context is replaced by another of the same length (and the one
    replaced at the save before goes back); ``"grow"``, a history context grows by one
    message (:func:`_grown_document`), so the document's length changes every save."""
    options = dict(options or {})
    reader = options.pop("reader", None)
    pattern = options.pop("pattern", None)
    async with open_kind(kind, **options) as backend:
        a = backend.adapter
        load = a
        if reader == "follower":
            load = _fresh_memory(copy.copy(backend.raw_adapter))
        docs = [
            _grown_document(size, r) if pattern == "grow" else _document(size, r, (r - 1) % 16)
            for r in range(1, ops + 2)
        ]
        for cp in docs:
            cp.to_json()  # encoded beforehand: both trees measure the store, not orjson
        await a.save_checkpoint(docs[0], expected_revision=0)
        saves: list[float] = []
        loads: list[float] = []
        for i, cp in enumerate(docs[1:], start=1):
            t = time.perf_counter()
            await a.save_checkpoint(cp, expected_revision=i)
            saves.append(time.perf_counter() - t)
            if reader == "cold":
                _fresh_memory(backend.raw_adapter)
            t = time.perf_counter()
            got = await load.get_checkpoint("lat")
            loads.append(time.perf_counter() - t)
            assert got is not None
            assert got.revision == cp.revision
        return {
            "save_ms": statistics.median(saves) * 1e3,
            "load_ms": statistics.median(loads) * 1e3,
        }


def _fresh_memory(adapter: Any) -> Any:
    """``adapter`` with empty memories of the bodies and versions it saved or loaded (the
    attributes this tree and the trees compared with have), as in a fresh process."""
    if hasattr(adapter, "_bodies"):
        adapter._bodies = type(adapter._bodies)()
    for name in ("_versions", "_stored"):
        if hasattr(adapter, name):
            setattr(adapter, name, type(getattr(adapter, name))())
    if hasattr(adapter, "_versions_size"):
        adapter._versions_size = 0
    return adapter


def _child(
    tree: Path | None, kind: str, size: int, ops: int, options: dict[str, Any] | None = None
) -> dict[str, float]:
    env = dict(os.environ)
    if tree is not None:
        paths = [str(tree), str(tree / "backends"), str(tree / "contract_tests")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__)),
            "_round",
            kind,
            str(size),
            str(ops),
            json.dumps(options or {}),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=str(tree or ROOT),
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _ops(size: int) -> int:
    return 200 if size <= 1_024 else (40 if size <= 262_144 else 6)


def latency(
    before: Path,
    kinds: list[str],
    sizes: list[int],
    rounds: int,
    after_options: dict[str, Any] | None = None,
    before_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for kind in kinds:
        for size in sizes:
            got: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for _ in range(rounds):  # interleaved: before, after, before, after …
                got["before"].append(_child(before, kind, size, _ops(size), before_options))
                got["after"].append(_child(None, kind, size, _ops(size), after_options))
            row: dict[str, Any] = {"kind": kind, "size": size}
            for side, results in got.items():
                for what in ("save_ms", "load_ms"):
                    values = [r[what] for r in results]
                    row[f"{side}_{what}"] = (
                        round(statistics.median(values), 3),
                        round(min(values), 3),
                        round(max(values), 3),
                    )
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bytes", help="bytes written per 100-step run")
    b.add_argument("--kinds", default=",".join(KINDS))
    b.add_argument("--sizes", default="1000000,10000000")
    lat = sub.add_parser("latency", help="save/load latency, before vs after")
    lat.add_argument("--before", type=Path, required=True, help="a siglo tree without this work")
    lat.add_argument("--kinds", default=",".join(KINDS))
    lat.add_argument("--sizes", default="1024,262144,10485760")
    lat.add_argument("--rounds", type=int, default=3)
    lat.add_argument("--after-options", default="{}", help="JSON options of this tree's side")
    lat.add_argument("--before-options", default="{}", help="JSON options of the other side")
    r = sub.add_parser("_round")
    r.add_argument("kind")
    r.add_argument("size", type=int)
    r.add_argument("ops", type=int)
    r.add_argument("options", nargs="?", default="{}")
    args = parser.parse_args(argv)
    if args.command == "bytes":
        for kind in args.kinds.split(","):
            for size in map(int, args.sizes.split(",")):
                for incremental in (False, True):
                    row = asyncio.run(bytes_per_run(kind, size, incremental))
                    print(json.dumps(row), flush=True)
    elif args.command == "latency":
        latency(
            args.before,
            args.kinds.split(","),
            list(map(int, args.sizes.split(","))),
            args.rounds,
            json.loads(args.after_options),
            json.loads(args.before_options),
        )
    else:
        round_options = json.loads(args.options)
        print(json.dumps(asyncio.run(latency_round(args.kind, args.size, args.ops, round_options))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
