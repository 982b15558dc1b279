"""The torture run of issue 11: contention across processes, faults, fuzzed documents,
redaction on raw bytes — on SQLite, PostgreSQL and Redis (and memory, in process).

    python tests/support/torture.py                      # the long run (8 processes x 10,000 ops)
    python tests/support/torture.py --processes 4 --ops 2000 --backends sqlite,redis
    python tests/support/torture.py --json out.json      # the figures, machine-readable

tests/topology/test_torture.py runs a short version in the default ``pytest``.

What it counts, per backend:

- **contention** — N processes each run M operations on a few shared keys, in rounds of
  five: a checkpoint compare-and-set (read the revision, save with ``expected_revision``),
  a wait-record claim, a lock section (public lock, or ``with_workflow_lock``), a nonce
  claim and an idempotency claim (the winner completes it). Afterwards: **lost** (a CAS
  acknowledged but missing from the final revision chain; a nonce/idempotency key/wait
  record nobody won; a completed result that is not the winner's), **double** (two
  winners of one CAS revision, wait record, nonce or idempotency key), **overlap** (two
  lock sections of one key that overlapped in time), **unbounded** (a call that took
  longer than ``command_timeout_ms`` + 1 s), and the errors callers saw.
- **faults** — a TCP proxy in front of the server freezes (no byte moves) and then cuts
  every connection (a restart) while tasks keep saving; SQLite gets its write lock held
  by another connection. Every call must end within its bound, and every acknowledged
  save must be in the store afterwards.
- **fuzz** — random and mutated documents through ``Checkpoint.from_json`` and
  ``WaitRecord.from_json``, and written raw into each store and read back through the
  adapter: the only error allowed is ``MalformedRecordError`` (its subclass
  ``CheckpointVersionError`` included).
- **redaction** — a manager with ``redact_fields`` saves checkpoints, streams context
  changes and delivers an event through a flow; the raw bytes of the store (every key,
  row, file) and the log output must not contain the secrets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import random
import sqlite3
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import siglo  # noqa: E402
from siglo import Checkpoint, WaitRecord  # noqa: E402
from siglo.errors import MalformedRecordError, StorageAdapterError  # noqa: E402

BOUND_MS = 5_000
"""command_timeout_ms of the contention run."""
FAULT_BOUND_MS = 1_000
"""command_timeout_ms of the fault phase."""
TOLERANCE_S = 0.5
"""Scheduling slack on a machine shared with other work, beyond each documented bound."""
CAS_KEYS = 4
LOCK_KEYS = 2
SECRET = "TORTURE-SECRET-9d41e7"
KINDS = ("sqlite", "postgres", "redis")


# -- one worker process -------------------------------------------------------------------


def allowed_s(url: str, timeout_ms: int) -> float:
    """The documented bound of one call: ``command_timeout_ms``, plus on PostgreSQL the
    second it may wait for a silent server before the connection is cut."""
    extra = 1.0 if url.startswith("postgres") else 0.0
    return timeout_ms / 1000 + extra + TOLERANCE_S


def worker(url: str, worker_id: int, ops: int, start_at: float, seed: int) -> dict[str, Any]:
    """Run ``ops`` operations against ``url``; what this worker won and saw."""
    return asyncio.run(_worker(url, worker_id, ops, start_at, seed))


async def _timed(out: dict[str, Any], what: str, call: Any, bound_s: float) -> Any:
    began = time.monotonic()
    try:
        return await call
    finally:
        took = time.monotonic() - began
        out["calls"] += 1
        if took > bound_s:
            out["unbounded"].append((what, round(took, 3)))


async def _worker(url: str, worker_id: int, ops: int, start_at: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed * 1000 + worker_id)
    backend = siglo.connect(url, command_timeout_ms=BOUND_MS)
    adapter, lock, nonces, idem = backend.adapter, backend.lock, backend.nonces, backend.idempotency
    assert lock is not None and nonces is not None and idem is not None
    bound = allowed_s(url, BOUND_MS)
    out: dict[str, Any] = {
        "cas": [],  # (key, revision won)
        "claims": [],  # wait keys won
        "sections": [],  # (lock key, start, end)
        "nonces": [],
        "idem": [],  # idempotency keys claimed
        "errors": Counter(),
        "unbounded": [],
        "calls": 0,
    }
    await asyncio.sleep(max(0.0, start_at - time.time()))
    began = time.monotonic()
    for i in range(ops):
        round_ = i // 5
        try:
            match i % 5:
                case 0:
                    key = f"cas-{rng.randrange(CAS_KEYS)}"
                    current = await _timed(out, "get", adapter.get_checkpoint(key), bound)
                    rev = 0 if current is None else current.revision
                    cp = Checkpoint(
                        stack_id=key,
                        revision=rev + 1,
                        timestamp=int(time.time() * 1000),
                        metadata={"writer": worker_id, "op": i},
                    )
                    try:
                        await _timed(
                            out, "cas", adapter.save_checkpoint(cp, expected_revision=rev), bound
                        )
                        out["cas"].append((key, rev + 1, worker_id, i))
                    except siglo.CheckpointConflictError:
                        pass
                case 1:
                    key = f"wait-{round_}"
                    claimed = await _timed(
                        out, "claim", adapter.claim_wait_record(key, f"w{worker_id}"), bound
                    )
                    if claimed is not None:
                        out["claims"].append(key)
                case 2:
                    key = f"lock-{rng.randrange(LOCK_KEYS)}"
                    if round_ % 2 == 0:
                        got = await _timed(out, "acquire", lock.acquire(key, 10_000), bound)
                        if got.acquired:
                            start = time.time()
                            await asyncio.sleep(rng.random() * 0.001)
                            out["sections"].append(("public:" + key, start, time.time()))
                            await _timed(out, "release", lock.release(key, got.token), bound)
                    else:

                        async def section(key: str = key) -> None:
                            start = time.time()
                            await asyncio.sleep(rng.random() * 0.001)
                            out["sections"].append(("workflow:" + key, start, time.time()))

                        await _timed(
                            out,
                            "with_workflow_lock",
                            adapter.with_workflow_lock(key, section, timeout_ms=20_000),
                            20 + bound,
                        )
                case 3:
                    key = f"nonce-{round_}"
                    if await _timed(out, "nonce", nonces.claim(key, 600), bound):
                        out["nonces"].append(key)
                case 4:
                    key = f"idem-{round_}"
                    state = await _timed(out, "idem", idem.claim(key), bound)
                    if state == "claimed":
                        out["idem"].append(key)
                        await _timed(
                            out, "idem-complete", idem.complete(key, {"winner": worker_id}), bound
                        )
        except Exception as exc:  # counted, and the run goes on
            out["errors"][f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
    out["seconds"] = time.monotonic() - began
    await backend.aclose()
    out["errors"] = dict(out["errors"])
    return out


# -- contention across processes ---------------------------------------------------------


async def contention(kind: str, backend: siglo.Backend, processes: int, ops: int) -> dict[str, Any]:
    adapter = backend.adapter
    rounds = (ops + 4) // 5
    for r in range(rounds):  # the wait records the workers compete for
        await adapter.save_wait_record(WaitRecord(correlation_key=f"wait-{r}", stack_id=f"ws-{r}"))
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [pool.submit(worker, backend.url, w, ops, start_at, 1) for w in range(processes)]
        results = [f.result() for f in futures]
    wall = max(r["seconds"] for r in results)
    calls = sum(r["calls"] for r in results)

    lost = double = overlap = 0
    details: dict[str, Any] = {}
    # CAS: every acknowledged revision is one link of the final chain, won once.
    wins: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for r in results:
        for key, rev, writer, op in r["cas"]:
            wins[key].append((rev, writer, op))
    for key in {f"cas-{k}" for k in range(CAS_KEYS)}:
        revs = [w[0] for w in wins[key]]
        double += len(revs) - len(set(revs))
        final = await adapter.get_checkpoint(key)
        final_rev = 0 if final is None else final.revision
        lost += len(set(range(1, final_rev + 1)) ^ set(revs))
        if final is not None and revs:
            top = max(wins[key])
            if final.metadata.get("writer") != top[1] or final.metadata.get("op") != top[2]:
                lost += 1
    # Wait records, nonces, idempotency keys: exactly one winner each.
    for name, field in (("wait", "claims"), ("nonce", "nonces"), ("idem", "idem")):
        won = Counter(k for r in results for k in r[field])
        expected = {
            f"{name}-{i}" for i in range({"wait": rounds, "nonce": rounds, "idem": rounds}[name])
        }
        attempted = {
            f"{name}-{i // 5}"
            for i in range(ops)
            if i % 5 == {"wait": 1, "nonce": 3, "idem": 4}[name]
        }
        expected &= attempted
        double += sum(n - 1 for n in won.values() if n > 1)
        missing = expected - set(won)
        lost += len(missing)
        details[f"{name}_won"] = len(won)
    idem = backend.idempotency
    assert idem is not None
    winners = {k: w for w, r in enumerate(results) for k in r["idem"]}
    for key, winner in list(winners.items())[:500]:
        if await idem.get_result(key) != {"winner": winner}:
            lost += 1
    # Lock sections: none of one key overlaps another.
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in results:
        for key, start, end in r["sections"]:
            by_key[key].append((start, end))
    for spans in by_key.values():
        spans.sort()
        latest_end = 0.0
        for start, end in spans:
            overlap += start < latest_end
            latest_end = max(latest_end, end)
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    unbounded = [u for r in results for u in r["unbounded"]]
    return {
        "processes": processes,
        "ops_per_process": ops,
        "operations": processes * ops,
        "calls": calls,
        "seconds": round(wall, 2),
        "ops_per_s": round(processes * ops / wall),
        "calls_per_s": round(calls / wall),
        "cas_won": sum(len(v) for v in wins.values()),
        "lock_sections": sum(len(v) for v in by_key.values()),
        **details,
        "lost": lost,
        "double": double,
        "overlap": overlap,
        "unbounded": len(unbounded),
        "unbounded_calls": unbounded[:10],
        "errors": dict(errors.most_common(10)),
    }


# -- faults ---------------------------------------------------------------------------------


async def _saver(url: str, stop: asyncio.Event, stats: dict[str, Any], n: int) -> None:
    options: dict[str, Any] = {"command_timeout_ms": FAULT_BOUND_MS}
    if url.startswith("postgres"):
        options["connect_timeout_ms"] = 1000
    backend = siglo.connect(url, **options)
    bound = allowed_s(url, FAULT_BOUND_MS)
    rev = 0
    try:
        while not stop.is_set():
            cp = Checkpoint(stack_id=f"fault-{n}", revision=rev + 1, timestamp=1)
            began = time.monotonic()
            try:
                await backend.adapter.save_checkpoint(cp, expected_revision=rev)
                rev += 1
                stats["acked"][f"fault-{n}"] = rev
                stats["ok"] += 1
            except StorageAdapterError:
                stats["failed"] += 1
                await asyncio.sleep(0.02)
            except siglo.CheckpointConflictError as exc:
                # A save that timed out may have been applied: continue from the store.
                rev = exc.current_revision or rev
            took = time.monotonic() - began
            stats["max_s"] = max(stats["max_s"], took)
            if took > bound:
                stats["unbounded"] += 1
    finally:
        await backend.aclose()


async def faults(kind: str, backend: siglo.Backend) -> dict[str, Any]:
    from _tcp_proxy import TcpProxy

    stats: dict[str, Any] = {"ok": 0, "failed": 0, "unbounded": 0, "max_s": 0.0, "acked": {}}
    stop = asyncio.Event()
    injected: list[str] = []
    if kind == "sqlite":
        url = backend.url
        tasks = [asyncio.create_task(_saver(url, stop, stats, n)) for n in range(4)]
        await asyncio.sleep(0.5)
        path = backend.adapter.database.path  # type: ignore[attr-defined]
        other = sqlite3.connect(path, isolation_level=None, timeout=10)
        other.execute("BEGIN IMMEDIATE")
        await asyncio.sleep(2.5)
        other.execute("ROLLBACK")
        other.close()
        injected.append("write lock held by another connection for 2.5 s")
        await asyncio.sleep(0.5)
    else:
        parts = urlsplit(backend.url)
        proxy = TcpProxy(
            (parts.hostname or "127.0.0.1", parts.port or (6379 if kind == "redis" else 5432))
        )
        url = backend.url.replace(f"{parts.hostname}:{parts.port}", proxy.url_host, 1)
        try:
            tasks = [asyncio.create_task(_saver(url, stop, stats, n)) for n in range(4)]
            await asyncio.sleep(0.5)
            proxy.freeze()
            await asyncio.sleep(2.5)
            proxy.thaw()
            injected.append("server frozen (proxy forwards nothing) for 2.5 s")
            await asyncio.sleep(0.5)
            proxy.cut()
            await asyncio.sleep(1.0)
            proxy.restore()
            injected.append("every connection cut and new ones refused for 1 s (a restart)")
            await asyncio.sleep(1.5)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            proxy.close()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    lost = 0
    for stack, rev in stats["acked"].items():
        got = await backend.adapter.get_checkpoint(stack)
        if got is None or got.revision < rev:
            lost += 1
    return {
        "injected": injected,
        "bound_ms": FAULT_BOUND_MS,
        "allowed_s": allowed_s(backend.url, FAULT_BOUND_MS),
        "saves_acknowledged": stats["ok"],
        "calls_failed": stats["failed"],
        "slowest_call_s": round(stats["max_s"], 2),
        "unbounded": stats["unbounded"],
        "lost": lost,
    }


# -- fuzzed documents ---------------------------------------------------------------------


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice([None, True, False, 0, -1, 2**63, 1.5, "", "x", "\u00e9", [], {}])
    if roll < 0.6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["stackId", "revision", "version", "timestamp", "status", "contexts", "stack",
            "correlationKey", "expiresAt", "namespace", "metadata", "x"]  # fmt: skip
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(6))}


def fuzz_documents(count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    valid = [
        Checkpoint(stack_id="s", revision=3, timestamp=5, metadata={"a": [1]}).to_json(),
        WaitRecord(correlation_key="k", stack_id="s", expires_at=9).to_json(),
    ]
    docs: list[bytes] = []
    for i in range(count):
        mode = i % 4
        if mode == 0:
            docs.append(json.dumps(_random_json(rng)).encode())
        elif mode == 1:  # a valid document with bytes flipped, cut or repeated
            data = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                at = rng.randrange(len(data))
                data[at] = rng.randrange(256)
            docs.append(bytes(data[: rng.randrange(len(data) + 1)] if rng.random() < 0.3 else data))
        elif mode == 2:  # a valid document with one field replaced by a random value
            doc = json.loads(rng.choice(valid))
            doc[rng.choice(list(doc))] = _random_json(rng)
            docs.append(json.dumps(doc).encode())
        else:
            docs.append(bytes(rng.randrange(256) for _ in range(rng.randrange(40))))
    return docs


def fuzz_decoders(count: int) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    for data in fuzz_documents(count):
        for parse in (Checkpoint.from_json, WaitRecord.from_json):
            try:
                parse(data)
                outcomes["accepted"] += 1
            except MalformedRecordError:
                outcomes["MalformedRecordError"] += 1
            except Exception as exc:
                outcomes[f"WRONG {type(exc).__name__}: {exc}"[:150]] += 1
    wrong = sum(n for k, n in outcomes.items() if k.startswith("WRONG"))
    return {
        "documents": count,
        "decodes": 2 * count,
        "wrong_errors": wrong,
        "outcomes": dict(outcomes.most_common(6)),
    }


async def fuzz_stored(kind: str, backend: siglo.Backend, count: int) -> dict[str, Any]:
    """Documents written raw where siglo keeps checkpoints, then read through the adapter."""
    adapter: Any = backend.adapter
    outcomes: Counter[str] = Counter()
    for n, data in enumerate(fuzz_documents(count, seed=11)):
        stack = f"fuzz-{n}"
        if kind == "redis":
            await adapter.client.set(adapter.keys.checkpoint(stack), data)
        else:
            await adapter.save_checkpoint(Checkpoint(stack_id=stack, revision=1, timestamp=1))
            db = adapter.database
            table = f"{adapter.table_prefix}checkpoints"
            name = f'"{adapter.schema}".{table}' if adapter.schema else table
            update = db.sql(f"UPDATE {name} SET document = :document WHERE stack_id = :stack")
            await db.fetch(update, {"document": data, "stack": stack})
        try:
            await adapter.get_checkpoint(stack)
            outcomes["accepted"] += 1
        except MalformedRecordError:
            outcomes["MalformedRecordError"] += 1
        except Exception as exc:
            outcomes[f"WRONG {type(exc).__name__}: {exc}"[:150]] += 1
    wrong = sum(n for k, n in outcomes.items() if k.startswith("WRONG"))
    return {"documents": count, "wrong_errors": wrong, "outcomes": dict(outcomes.most_common(6))}


# -- redaction on raw bytes -------------------------------------------------------------------


async def redaction(kind: str, backend: siglo.Backend) -> dict[str, Any]:
    from raw_storage import raw_bytes

    from siglo import Step, StorageManager, flow, wait_for_event

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep(logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        manager = StorageManager(backend, error_mode="strict", redact_fields={"password", "token"})
        stack = manager.create_stack("torture-redaction", namespace="tenant-t")
        stack.set("login", "password", SECRET)
        stack.set("login", "nested", [{"token": SECRET}, {"ok": "visible-torture"}])
        await manager.save_checkpoint("torture-redaction")

        async def login(_: Any) -> Any:
            return await wait_for_event("torture:approve")

        run = flow(Step.create("login", login), name="torture-flow")
        with contextlib.suppress(siglo.WorkflowSuspended):
            await run.run(None, manager=manager, stack_id="torture-flow-1")
        await run.deliver("torture:approve", {"password": SECRET}, manager=manager)
        await manager.flush()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    raw = await raw_bytes(kind, backend)
    found = raw.count(SECRET.encode()) + sum(r.count(SECRET) for r in records)
    return {
        "raw_bytes": len(raw),
        "visible_marker_found": b"visible-torture" in raw,
        "secrets_found": found,
    }


# -- the run ------------------------------------------------------------------------------------


async def run_backend(
    kind: str, processes: int, ops: int, fuzz: int, *, with_faults: bool = True
) -> dict[str, Any]:
    """Every part of the run on one backend kind; its figures."""
    from raw_storage import any_backend

    result: dict[str, Any] = {}
    async with any_backend(kind) as backend:
        if kind != "memory":
            result["contention"] = await contention(kind, backend, processes, ops)
            if with_faults:
                result["faults"] = await faults(kind, backend)
        result["fuzz_stored"] = await fuzz_stored(kind, backend, fuzz)
    async with any_backend(kind) as backend:
        result["redaction"] = await redaction(kind, backend)
    return result


def anomalies(result: dict[str, Any]) -> int:
    total = 0
    contention = result.get("contention", {})
    total += sum(contention.get(k, 0) for k in ("lost", "double", "overlap", "unbounded"))
    total += result.get("faults", {}).get("unbounded", 0) + result.get("faults", {}).get("lost", 0)
    total += result["fuzz_stored"]["wrong_errors"]
    total += result["redaction"]["secrets_found"]
    total += 0 if result["redaction"]["visible_marker_found"] else 1
    return total


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "decoders": fuzz_decoders(args.fuzz),
        "backends": {},
    }
    for kind in args.backends:
        began = time.monotonic()
        report["backends"][kind] = await run_backend(
            kind, args.processes, args.ops, args.fuzz_stored
        )
        report["backends"][kind]["seconds"] = round(time.monotonic() - began, 1)
        print(f"{kind}: {json.dumps(report['backends'][kind], default=str)}", flush=True)
    report["machine"]["load_after"] = os.getloadavg()
    report["anomalies"] = report["decoders"]["wrong_errors"] + sum(
        anomalies(r) for r in report["backends"].values()
    )
    return report


def main(argv: list[str] | None = None) -> int:
    # The pool's reconnection attempts during the injected outages are expected noise.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--ops", type=int, default=10_000, help="operations per process")
    parser.add_argument("--fuzz", type=int, default=100_000, help="documents through the decoders")
    parser.add_argument(
        "--fuzz-stored", type=int, default=1_000, help="documents written raw per backend"
    )
    parser.add_argument("--backends", type=lambda s: s.split(","), default=list(KINDS))
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    print(
        json.dumps({"anomalies": report["anomalies"], "decoders": report["decoders"]}, default=str)
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 1 if report["anomalies"] else 0


if __name__ == "__main__":
    sys.exit(main())
