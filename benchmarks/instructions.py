"""Where siglo's instructions go on one save or load, against the raw-fast baseline.

``python -m benchmarks.instructions sqlite save`` runs one child Python under
``valgrind --tool=callgrind`` (instruction counts: repeatable whatever else the machine
is doing). The child opens siglo and the raw-fast subject on the backend, warms both up,
then runs each *stage* ``n`` times in a loop, calling ``os.getppid()`` before each loop:
callgrind is told to dump its counters whenever that C function is entered
(``--dump-before=os_getppid``), so each dump holds exactly one stage's loop. A stage's
figure is its dump's instruction count divided by ``n``, less an empty loop's.

The stages nest (each one runs the one before it and one layer more), so the rows of the
table are differences between stages: what building the :class:`~siglo.checkpoint.Checkpoint`
costs, encoding it, the pipeline (redaction, codecs), the adapter (its argument and size
checks, the backend's own code, the driver). Inside the complete operation, the cost of
the C functions that run the statement (``_pysqlite_query_execute`` and the cursor's
fetch, inclusive) is read from the profile with ``callgrind_annotate``, for siglo and for
raw-fast alike: the rest of an operation is Python and the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Row", "main", "measure", "render", "render_json", "table"]

_MARKER = "os_getppid"
"""The C function whose entry makes callgrind dump: :func:`os.getppid`, called nowhere
else on these paths."""

_STATEMENT_FUNCTIONS = ("_pysqlite_query_execute", "pysqlite_cursor_fetchall")
"""The sqlite3 module's C functions that run a statement and fetch its rows."""

_ADAPT_FUNCTIONS = ("pysqlite_microprotocols_adapt",)
"""Inside the statement: the sqlite3 module's search for an adapter, which it makes for
every parameter that is not exactly ``int``, ``float``, ``str`` or ``bytearray`` (so for
each ``None`` and ``bytes``)."""

BACKENDS = ("sqlite", "memory", "redis", "postgres")
"""Redis and PostgreSQL: the client's instructions only (the server's are another
process), at ``SIGLO_REDIS_URL`` / ``SIGLO_POSTGRES_URL`` (loopback by default)."""
OPS = ("save", "load")


@dataclass(frozen=True)
class Row:
    """One line of the table: instructions per operation."""

    subject: str
    """``siglo`` or ``raw-fast``."""
    stage: str
    instructions: float


# -- the child: stages under callgrind ------------------------------------------------------


Op = Callable[[int], Awaitable[Any]]


async def _stages(
    backend: str, op: str, stack: contextlib.AsyncExitStack
) -> list[tuple[str, str, Op]]:
    """(subject, stage, operation of iteration ``i``) in the order they are measured;
    the subjects stay open until ``stack`` closes."""
    import orjson

    from benchmarks.payloads import make_contexts, now_ms, wire_document
    from benchmarks.raw_fast_sqlite import RawFastSqliteSubject
    from benchmarks.raw_memory import RawMemorySubject
    from benchmarks.siglo_subject import SigloSubject
    from siglo.checkpoint import Checkpoint
    from siglo.validation import check_save_arguments

    contexts = make_contexts(1024)
    tmp = tempfile.mkdtemp(prefix="siglo-instr-")
    raw: Any
    if backend == "sqlite":
        siglo_s = SigloSubject("sqlite", f"sqlite:///{tmp}/siglo.db")
        raw = RawFastSqliteSubject(os.path.join(tmp, "raw-fast.db"))
    elif backend == "redis":
        from benchmarks.raw_fast_redis import RawFastRedisSubject

        url = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")
        siglo_s = SigloSubject("redis", url)
        raw = RawFastRedisSubject(url)
    elif backend == "postgres":
        from benchmarks.raw_fast_postgres import RawFastPostgresSubject

        url = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")
        siglo_s = SigloSubject("postgres", url)
        raw = RawFastPostgresSubject(url)
    else:
        siglo_s = SigloSubject("memory", "memory://")
        raw = RawMemorySubject()
    await siglo_s.open()
    stack.push_async_callback(siglo_s.close)
    await raw.open()
    stack.push_async_callback(raw.close)
    adapter: Any = siglo_s.b.adapter  # the SQL stages reach into the SQL adapter
    # Revisions only grow: every stage that stores goes on from the last one stored.
    state = {"revision": 0}

    def checkpoint(stack_id: str = "s") -> Checkpoint:
        state["revision"] += 1
        return Checkpoint(
            stack_id=stack_id, revision=state["revision"], timestamp=now_ms(), contexts=contexts
        )

    built = checkpoint()
    stored = built.to_json()

    async def empty(i: int) -> None:
        return None

    async def build(i: int) -> None:
        checkpoint()

    async def encode(i: int) -> None:
        checkpoint().to_json()

    async def validate(i: int) -> None:
        check_save_arguments(built, None)

    async def siglo_save(i: int) -> None:
        await adapter.save_checkpoint(checkpoint())

    async def raw_encode(i: int) -> None:
        orjson.dumps(wire_document("r", i, contexts, expires_at=None))

    async def raw_save(i: int) -> None:
        state["revision"] += 1
        await raw.save("r", state["revision"], contexts)

    async def loads(i: int) -> None:
        orjson.loads(stored)

    async def decode(i: int) -> None:
        Checkpoint.from_json(stored)

    async def siglo_load(i: int) -> None:
        await adapter.get_checkpoint("s")

    async def raw_load(i: int) -> None:
        await raw.load("r")

    database = getattr(adapter, "database", None)
    db_stages: list[tuple[str, str, Op]] = []
    if database is not None and backend == "sqlite":  # its database layer alone
        from siglo_sql.keys import row_id
        from siglo_sql.rows import checkpoint_row

        now = now_ms()
        row = checkpoint_row(built, None, now)
        row["expected"] = None
        save_sql = adapter._s.cp_save_forward
        key = row_id("", "s")
        keyed = adapter._cp_reads

        async def db_write(i: int) -> None:
            state["revision"] += 1
            row["revision"] = state["revision"]
            await database.write(save_sql, row)

        async def db_read(i: int) -> None:
            if keyed is not None:
                await keyed.get_row(key)
            else:
                await database.read(adapter._s.cp_load, {"id": key, "now": now})

        db_stages = [
            (
                "siglo",
                "database.write" if op == "save" else "database.read",
                db_write if op == "save" else db_read,
            )
        ]

    # Warm-up: statements prepared, caches filled, both documents stored.
    for i in range(20):
        await siglo_save(i)
        await raw_save(i)
        await siglo_load(i)
        await raw_load(i)
    if op == "save":
        return [
            ("-", "empty loop", empty),
            ("siglo", "Checkpoint(...)", build),
            ("siglo", "+ to_json()", encode),
            ("siglo", "check_save_arguments", validate),
            *db_stages,
            ("siglo", "save (all)", siglo_save),
            ("raw-fast", "orjson.dumps", raw_encode),
            ("raw-fast", "save (all)", raw_save),
        ]
    return [
        ("-", "empty loop", empty),
        ("siglo", "orjson.loads", loads),
        ("siglo", "Checkpoint.from_json", decode),
        *db_stages,
        ("siglo", "load (all)", siglo_load),
        ("raw-fast", "load (all)", raw_load),
    ]


async def _child(backend: str, op: str, n: int) -> None:
    names = []
    async with contextlib.AsyncExitStack() as stack:
        for subject, stage, fn in await _stages(backend, op, stack):
            names.append([subject, stage])
            os.getppid()  # callgrind dumps here: the next dump is this loop alone
            for i in range(n):
                await fn(i)
        os.getppid()
    print(json.dumps(names))


# -- the parent: run, read the dumps --------------------------------------------------------


def _total(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"no totals in {path}")


def _inclusive(path: str, functions: tuple[str, ...]) -> int:
    """The inclusive instruction counts of ``functions`` in one dump, summed."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = 0
    for line in out.splitlines():
        # A function's own line names its object file ("[…so]"); lines without one are
        # the parts of it inlined from other source files, already inside that total.
        m = re.match(r"\s*([\d,]+) \(.*?\)\s+\S*?:(\S+) \[", line)
        if m and m.group(1) and m.group(2) in functions:
            total += int(m.group(1).replace(",", ""))
    return total


def measure(backend: str, op: str, n: int) -> list[Row]:
    """Run the stages of ``op`` on ``backend`` ``n`` times each under callgrind."""
    with tempfile.TemporaryDirectory(prefix="siglo-cg-") as tmp:
        out = os.path.join(tmp, "cg.out")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--dump-before={_MARKER}",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "benchmarks.instructions",
                "--child",
                backend,
                op,
                str(n),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the callgrind run failed:\n{proc.stderr[-3000:]}")
        names = json.loads(proc.stdout.strip().splitlines()[-1])
        # Dump k (1-based) holds what ran before the k-th marker: dump 1 is the start-up,
        # dump k + 1 the k-th stage's loop.
        dumps = [f"{out}.{k + 2}" for k in range(len(names))]
        per_op = [_total(d) / n for d in dumps]
        base = per_op[0]
        rows = [
            Row(subject, stage, count - base)
            for (subject, stage), count in zip(names[1:], per_op[1:], strict=True)
        ]
        if backend == "sqlite":
            for (subject, stage), dump in zip(names, dumps, strict=True):
                if stage.endswith("(all)") or stage.startswith("database."):
                    c = _inclusive(dump, _STATEMENT_FUNCTIONS) / n
                    rows.append(Row(subject, f"{stage}: statement (C)", c))
                    c = _inclusive(dump, _ADAPT_FUNCTIONS) / n
                    rows.append(Row(subject, f"{stage}: adaptation (C)", c))
    return rows


def _by(rows: list[Row], subject: str, stage: str) -> float:
    return next(r.instructions for r in rows if r.subject == subject and r.stage == stage)


def _get(rows: list[Row], subject: str, stage: str) -> float | None:
    return next((r.instructions for r in rows if r.subject == subject and r.stage == stage), None)


def table(op: str, rows: list[Row]) -> list[tuple[str, float | None, float | None]]:
    """(what, siglo, raw-fast) per line, from the stage rows (``None``: none there)."""
    total = _by(rows, "siglo", f"{op} (all)")
    raw_total = _by(rows, "raw-fast", f"{op} (all)")
    stmt = _get(rows, "siglo", f"{op} (all): statement (C)")
    raw_stmt = _get(rows, "raw-fast", f"{op} (all): statement (C)")
    db_name = "database.write" if op == "save" else "database.read"
    db = _get(rows, "siglo", db_name)
    db_stmt = _get(rows, "siglo", f"{db_name}: statement (C)")
    lines: list[tuple[str, float | None, float | None]] = []
    if op == "save":
        build = _by(rows, "siglo", "Checkpoint(...)")
        encoded = _by(rows, "siglo", "+ to_json()")
        checks = _by(rows, "siglo", "check_save_arguments")
        raw_encode = _by(rows, "raw-fast", "orjson.dumps")
        lines += [
            ("Checkpoint construction (field checks)", build, None),
            ("encoding (to_wire + orjson.dumps)", encoded - build, raw_encode),
            ("argument checks (check_save_arguments)", checks, None),
        ]
        known = encoded + checks
        raw_known = raw_encode
    else:
        parse = _by(rows, "siglo", "orjson.loads")
        decode = _by(rows, "siglo", "Checkpoint.from_json")
        lines += [
            ("orjson.loads", parse, parse),
            ("Checkpoint from the decoded document", decode - parse, None),
        ]
        known = decode
        raw_known = parse
    if db is not None and db_stmt is not None and stmt is not None and raw_stmt is not None:
        lines += [
            ("sqlite3 statement, C (bind, step, fetch)", stmt, raw_stmt),
            (
                "  of which adapter searches (None, bytes)",
                _get(rows, "siglo", f"{op} (all): adaptation (C)"),
                _get(rows, "raw-fast", f"{op} (all): adaptation (C)"),
            ),
            (
                f"{db_name} in Python (gates, driver)",
                db - db_stmt,
                raw_total - raw_known - raw_stmt,
            ),
        ]
        known += db - db_stmt + stmt
        raw_known = raw_total
    lines.append(("the rest (adapter, backend, awaits)", total - known, raw_total - raw_known))
    lines.append((f"{op} (all)", total, raw_total))
    return lines


def render(backend: str, op: str, n: int, rows: list[Row]) -> str:
    """The table as text: instructions per operation."""
    lines = [
        f"instructions per {op}, {backend}, 1 KB document, n={n} (callgrind)",
        f"{'stage':<52}{'siglo':>12}{'raw-fast':>12}",
    ]
    for what, siglo_n, raw_n in table(op, rows):
        siglo_s = "" if siglo_n is None else f"{siglo_n:,.0f}"
        raw_s = "" if raw_n is None else f"{raw_n:,.0f}"
        lines.append(f"{what:<52}{siglo_s:>12}{raw_s:>12}")
    total = _by(rows, "siglo", f"{op} (all)")
    raw_total = _by(rows, "raw-fast", f"{op} (all)")
    lines.append(f"{'siglo / raw-fast':<52}{total / raw_total:>12.2f}")
    return "\n".join(lines)


def render_json(doc: dict[str, Any]) -> str:
    """:func:`render` of what ``--json`` printed."""
    rows = [Row(**r) for r in doc["rows"]]
    return render(doc["backend"], doc["op"], doc["n"], rows)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m benchmarks.instructions BACKEND OP [--n N] [--json]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--child":
        asyncio.run(_child(args[1], args[2], int(args[3])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    parser.add_argument("backend", choices=BACKENDS)
    parser.add_argument("op", choices=OPS)
    parser.add_argument("--n", type=int, default=200, help="operations per stage")
    parser.add_argument(
        "--json", action="store_true", help="the stage rows as JSON (render_json prints them)"
    )
    ns = parser.parse_args(args)
    rows = measure(ns.backend, ns.op, ns.n)
    if ns.json:
        doc = {"backend": ns.backend, "op": ns.op, "n": ns.n, "rows": [r.__dict__ for r in rows]}
        print(json.dumps(doc, indent=1))
    else:
        print(render(ns.backend, ns.op, ns.n, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
