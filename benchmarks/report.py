"""Ratios, targets, the markdown table and the PNG chart of a results document."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks import machine

START_MARK = "<!-- benchmark-results:start -->"
END_MARK = "<!-- benchmark-results:end -->"

DRIVER_BACKENDS = ("redis", "postgres", "sqlite")


def _index(doc: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["backend"], r["kind"], r["workload"]): r for r in doc["results"]}


def round_ratios(mine: list[float], other: list[float]) -> list[float]:
    """siglo / other of each round: run ``i`` of both was taken in the same round, one
    right after the other, so the machine's load of that moment is in both."""
    if len(mine) != len(other):
        return []
    return [a / b for a, b in zip(mine, other, strict=True) if b]


def round_steals(mine: dict[str, Any], other: dict[str, Any]) -> list[list[float | None]]:
    """``[siglo's, other's]`` share of CPU time stolen by the hypervisor in each round
    (empty for a run recorded before the figure was: ``steal`` in each result)."""
    a, b = mine.get("steal") or [], other.get("steal") or []
    if len(a) != len(b) or len(a) != len(mine["runs"]) or len(b) != len(other["runs"]):
        return []
    return [[x, y] for x, y in zip(a, b, strict=True)]


def _at_lowest_round(x: dict[str, Any], key: str) -> Any | None:
    """``x[key]``'s entry for the lowest of the ratio's rounds (``None`` where the run
    did not record ``key`` for every round)."""
    rounds, per_round = x.get("rounds") or [], x.get(key) or []
    if not rounds or len(per_round) != len(rounds):
        return None
    return per_round[rounds.index(min(rounds))]


def low_round_steal(x: dict[str, Any]) -> str:
    """The CPU time stolen during the lowest round of a ratio, siglo's passes / the
    baseline's, as percentages (``–`` where the run did not record it)."""
    steals = _at_lowest_round(x, "steal")
    if steals is None:
        return "–"
    return " / ".join("–" if v is None else f"{v:.0%}" for v in steals)


def round_cpus(mine: dict[str, Any], other: dict[str, Any]) -> list[list[float]]:
    """``[siglo's, other's]`` client CPU time per operation in each round, in ms, each
    followed by the part of it in the garbage collector: ``[cpu, gc, cpu, gc]`` (empty for
    a run recorded before the figure was: ``cpu_ms_per_op`` in each result)."""
    n = len(mine["runs"])
    parts = [mine.get("cpu_ms_per_op"), mine.get("gc_ms_per_op")]
    parts += [other.get("cpu_ms_per_op"), other.get("gc_ms_per_op")]
    if len(other["runs"]) != n or any(p is None or len(p) != n for p in parts):
        return []
    return [list(round_parts) for round_parts in zip(*parts, strict=True)]


def _pairs(mine: list[float] | None, other: list[float] | None) -> list[list[float]]:
    """``[siglo's, other's]`` of each round, where both recorded the figure for every
    round (else empty)."""
    if not mine or not other or len(mine) != len(other):
        return []
    return [[a, b] for a, b in zip(mine, other, strict=True)]


def _both(mine: float | None, other: float | None) -> list[float]:
    """``[siglo's, other's]`` of a figure recorded once per subject (empty unless both)."""
    return [] if mine is None or other is None else [mine, other]


def low_round_cpu(x: dict[str, Any]) -> str:
    """The client's CPU time per operation in the lowest round of a ratio, siglo's / the
    baseline's, in ms with the collector's part in brackets (``–`` where not recorded)."""
    cpus = _at_lowest_round(x, "cpu")
    if cpus is None:
        return "–"
    a, a_gc, b, b_gc = cpus
    return f"{a:.2f} ({a_gc:.2f}) / {b:.2f} ({b_gc:.2f})"


def run_steal(meta: dict[str, Any]) -> float | None:
    """The share of the machine's CPU time stolen by the hypervisor during the whole run."""
    ticks = meta.get("cpu_ticks") or {}
    return machine.steal_share(ticks.get("start"), ticks.get("end"))


def retimed_text(doc: dict[str, Any]) -> str | None:
    """How many passes were timed again because of stolen CPU time, and how many were
    kept over the limit (``None`` for a run recorded before passes were timed again)."""
    meta = doc["meta"]
    if "steal_limit" not in meta:
        return None
    slices = meta.get("slices", 1)
    rows = [r for r in doc["results"] if r.get("status") == "ok"] + [
        r for r in doc.get("e2e", []) + doc.get("e2e_limit", []) if r.get("status") == "ok"
    ]
    kept = sum(len(r.get("retimed", [])) * slices for r in rows)
    retimed = sum(sum(r.get("retimed", [])) for r in rows)
    over = sum(sum(r.get("over_limit", [])) for r in rows)
    return (
        f"Passes timed again because more than {meta['steal_limit']:.0%} of the machine's "
        f"CPU time was stolen during them (benchmarks/interference.py): {retimed:,} "
        f"attempts dropped for {kept:,} passes kept; {over:,} kept over the limit after "
        f"{meta.get('retimes', 0)} attempts more."
    )


def add_ratios_and_targets(doc: dict[str, Any]) -> None:
    """Fill ``doc["ratios"]`` (siglo / raw, siglo / langgraph) and ``doc["targets"]``.

    A ratio is the median of the per-round ratios, with their min and max; a target
    counts as met only when the whole range meets it (the lower bound of an "at least"
    target, the upper bound of an "at most" one).
    """
    idx = _index(doc)
    ratios: list[dict[str, Any]] = []
    for (backend, kind, workload), r in idx.items():
        if kind != "siglo" or r["median"] is None:
            continue
        for other in ("raw", "raw-fast", "langgraph"):
            o = idx.get((backend, other, workload))
            if o is None or not o["median"]:
                continue
            rounds = round_ratios(r["runs"], o["runs"])
            if not rounds:
                continue
            ratios.append(
                {
                    "backend": backend,
                    "workload": workload,
                    "name": r["name"],
                    "size": r["size"],
                    "concurrency": r["concurrency"],
                    "vs": other,
                    "siglo": r["median"],
                    "other": o["median"],
                    "rounds": rounds,
                    "ratio": statistics.median(rounds),
                    "ratio_min": min(rounds),
                    "ratio_max": max(rounds),
                    "steal": round_steals(r, o),
                    "cpu": round_cpus(r, o),
                    "conflicts": _pairs(conflicts_per_update(r), conflicts_per_update(o)),
                    "statements": _both(r.get("statements_per_op"), o.get("statements_per_op")),
                }
            )
    meta = doc.get("meta") or {}
    for x in ratios:
        least = (meta.get("siglo_incremental_min_bytes") or {}).get(x["backend"])
        size = (meta.get("document_bytes") or {}).get(x["size"])
        if least is not None and size is not None and size >= least:
            x["parts"] = {"document_bytes": size, "incremental_min_bytes": least}
    doc["ratios"] = ratios
    targets: list[dict[str, Any]] = []
    for x in ratios:
        if (
            x["vs"] == "raw"
            and x["backend"] in DRIVER_BACKENDS
            and x["name"] in ("save", "load", "cas")
        ):
            targets.append({**x, "target": "siglo >= 0.8x raw driver", "threshold": 0.8})
        if (
            x["vs"] == "raw-fast"
            and x["backend"] in DRIVER_BACKENDS
            and x["name"] in ("save", "load", "cas")
        ):
            targets.append({**x, "target": "siglo >= 0.8x raw-fast driver", "threshold": 0.8})
        if (
            x["vs"] == "raw"
            and x["backend"] == "redis"
            and x["name"] in ("save", "load", "cas")
            and x["size"] == "1k"
            and x["concurrency"] == 32
        ):
            targets.append(
                {**x, "target": "siglo >= 2x raw redis-py at 32 callers", "threshold": 2.0}
            )
        if (
            x["vs"] == "raw"
            and x["backend"] == "postgres"
            and x["name"] == "load"
            and x["concurrency"] == 32
        ):
            targets.append(
                {**x, "target": "siglo >= 1.5x raw psycopg loads at 32 callers", "threshold": 1.5}
            )
        if x["vs"] == "raw" and x["backend"] == "redis" and x["name"] == "lock":
            targets.append({**x, "target": "lock pairs >= 1.0x redis-py Lock", "threshold": 1.0})
        if x["vs"] == "langgraph" and x["name"] in ("save", "load") and x["concurrency"] == 32:
            targets.append(
                {**x, "target": "siglo >= 2x LangGraph saver at 32 callers", "threshold": 2.0}
            )
    for t in targets:
        t["met"] = t["ratio_min"] >= t["threshold"]
    for s in doc.get("scale", []):
        ratio = s.get("load_latency_ratio")
        if ratio is not None and s.get("kind") == "siglo":
            rounds = s.get("load_latency_rounds") or [ratio]
            targets.append(
                {
                    "backend": s["backend"],
                    "name": "scale",
                    "workload": f"load latency {s['rows_large']:,} / {s['rows_small']:,} rows",
                    "target": "load latency at 1M rows <= 1.5x at 1k, every round",
                    "threshold": 1.5,
                    "ratio": ratio,
                    "ratio_min": min(rounds),
                    "ratio_max": max(rounds),
                    "met": max(rounds) <= 1.5,
                }
            )
    if doc.get("e2e"):
        from benchmarks.e2e import add_e2e_ratios

        add_e2e_ratios(doc)  # again: a rendered run gets what its ratios carry now
    for e in doc.get("e2e_ratios", []):
        targets.append(
            {
                **e,
                "target": "workflow runs/s >= 2x DBOS / LangGraph",
                "threshold": 2.0,
                "met": e["ratio_min"] >= 2.0,
            }
        )
    targets += _workflow_goal_targets(doc)
    doc["targets"] = targets


WORKFLOW_GOAL = (
    "workflow runs/s at 32 runs >= 0.8x the raw write limit per run, or >= 10x DBOS and LangGraph"
)


def _workflow_goal_targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 36's end-to-end goal, per backend at 32 concurrent runs: siglo's runs/s at
    least 0.8 of the raw write limit per run (benchmarks/write_limit.py) in every round,
    or at least 10x every other system there in every round. The ratio shown is the
    share of the limit (a run made before the limit was measured has no such target)."""
    from benchmarks.write_limit import add_limit_ratios

    add_limit_ratios(doc)
    out: list[dict[str, Any]] = []
    for x in doc["e2e_limit_ratios"]:
        if x["system"] != "siglo" or x["concurrency"] != 32:
            continue
        others = [
            e
            for e in doc.get("e2e_ratios", [])
            if e["backend"] == x["backend"] and e["concurrency"] == 32
        ]
        tenfold = bool(others) and all(e["ratio_min"] >= 10.0 for e in others)
        out.append(
            {
                **x,
                "name": "workflow",
                "size": None,
                "workload": "workflow/c32 vs the raw write limit",
                "vs": "raw-limit",
                "target": WORKFLOW_GOAL,
                "threshold": 0.8,
                "versus": {e["vs"]: [e["ratio_min"], e["ratio_max"]] for e in others},
                "met": x["ratio_min"] >= 0.8 or tenfold,
            }
        )
    return out


def ratio_text(x: dict[str, Any]) -> str:
    """``median (min–max)`` of a ratio entry."""
    return f"{x['ratio']:.2f} ({x['ratio_min']:.2f}–{x['ratio_max']:.2f})"


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    if r["status"] == "unsupported":
        return "n/a"
    if r["status"] == "error":
        return "error"
    spread = f" ±{r['spread'] / 2:.0%}" if r.get("spread") else ""
    return f"{_fmt(r['median'])}{spread}"


def order_text(meta: dict[str, Any]) -> str:
    """What ran, in order (a run made before the order was recorded says nothing)."""
    names = {
        "workloads": "the workloads on {}",
        "e2e": "the end-to-end comparison",
        "scale": "the scale workloads on {}",
        "loop-lag": "the event-loop lag probes",
    }
    steps = [
        names[phase].format(backend)
        for phase, _, backend in (step.partition(":") for step in meta.get("order") or [])
    ]
    return f"Order: {', then '.join(steps)}." if steps else ""


def _run_lines(doc: dict[str, Any]) -> list[str]:
    """When and how the run was made, on what machine, and what the machine took."""
    meta = doc["meta"]
    m = meta["machine"]
    load = meta.get("load") or {}
    load_text = ", ".join(
        f"{when} {' / '.join(f'{x:.2f}' for x in load[when])}"
        for when in ("start", "end")
        if load.get(when)
    )
    return [
        f"Run {meta['started']} – {meta.get('finished', '?')}, "
        f"{meta['repeat']} round(s) per measurement"
        f"{_passes(meta.get('slices', 1))}"
        f"{' (quick smoke mode)' if meta['quick'] else ''}, "
        f"commit {m.get('siglo_commit') or '?'}.",
        "",
        f"Command: `python -m benchmarks {' '.join(meta.get('argv', []))}`".rstrip() + "",
        "",
        *([order, ""] if (order := order_text(meta)) else []),
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}, "
        f"Python {m['python']}, SQLite {m['sqlite']}"
        + "".join(f", {v}" for v in m.get("servers", {}).values())
        + ".",
        "",
        f"Load average (1 / 5 / 15 min): {load_text or 'unknown'}."
        + (f" {meta['load_note']}" if meta.get("load_note") else ""),
        "",
        *(
            [
                f"CPU time stolen by the hypervisor (steal, `/proc/stat`) during the run: "
                f"{steal:.1%} of the machine's.",
                "",
            ]
            if (steal := run_steal(meta)) is not None
            else []
        ),
        *([text, ""] if (text := retimed_text(doc)) else []),
    ]


def _subject_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["Subjects:", ""]
    for s in doc["subjects"]:
        if s["status"] == "ok":
            lines.append(f"- {s['kind']}:{s['backend']} — {s['detail']}")
        else:
            lines.append(f"- skipped: {s['reason']}")
    return [*lines, ""]


def _target_lines(doc: dict[str, Any]) -> list[str]:
    """How many targets the run met, and every miss with its measured reason."""
    targets = doc.get("targets", [])
    if not targets:
        return []
    from benchmarks.reasons import reason_for

    met = sum(1 for t in targets if t["met"])
    lines = [
        f"Targets met: {met} of {len(targets)} (a target is met only when every round meets it).",
        "",
    ]
    missed = [t for t in targets if not t["met"]]
    if missed:
        lines += [
            "| missed target | backend | workload | ratio, median (min–max) "
            "| CPU stolen in the lowest round, siglo / baseline "
            "| client CPU per op in that round, ms (collecting), siglo / baseline "
            "| measured reason |",
            "|---|---|---|---:|---:|---:|---|",
        ]
        lines += [
            f"| {t['target']} | {t['backend']} | {t['workload']} | {ratio_text(t)} | "
            f"{low_round_steal(t)} | {low_round_cpu(t)} | {reason_for(t)} |"
            for t in missed
        ]
        lines.append("")
    return lines


def _backends(doc: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["backend"] for r in doc["results"]))


def _kinds(doc: dict[str, Any], backend: str) -> list[str]:
    return [
        k
        for k in ("siglo", "raw", "raw-fast", "langgraph")
        if any(r["backend"] == backend and r["kind"] == k for r in doc["results"])
    ]


def _workloads(doc: dict[str, Any], backends: list[str]) -> list[str]:
    return list(dict.fromkeys(r["workload"] for r in doc["results"] if r["backend"] in backends))


def _backend_tables(doc: dict[str, Any]) -> list[str]:
    """One table per backend: every subject's ops/s and siglo's ratios."""
    idx = _index(doc)
    ratio_of = {(x["backend"], x["workload"], x["vs"]): x for x in doc.get("ratios", [])}
    lines: list[str] = []
    for backend in _backends(doc):
        kinds = _kinds(doc, backend)
        lines += [f"### {backend}", ""]
        if backend in chart_backends(doc):
            name = backend_chart_name(backend)
            lines += [f"![{backend}: siglo / raw / raw-fast / LangGraph ops/s]({name})", ""]
        header = ["workload"] + [f"{k} ops/s" for k in kinds]
        if "raw" in kinds and "siglo" in kinds:
            header.append("siglo / raw")
        if "raw-fast" in kinds and "siglo" in kinds:
            header.append("siglo / raw-fast")
        if "langgraph" in kinds and "siglo" in kinds:
            header.append("siglo / langgraph")
        lines += ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
        for w in _workloads(doc, [backend]):
            row = [w] + [_cell(idx.get((backend, k, w))) for k in kinds]
            if "raw" in kinds and "siglo" in kinds:
                x = ratio_of.get((backend, w, "raw"))
                row.append("–" if x is None else f"**{x['ratio']:.2f}** ({_range(x)})")
            if "raw-fast" in kinds and "siglo" in kinds:
                x = ratio_of.get((backend, w, "raw-fast"))
                row.append("–" if x is None else f"**{x['ratio']:.2f}** ({_range(x)})")
            if "langgraph" in kinds and "siglo" in kinds:
                x = ratio_of.get((backend, w, "langgraph"))
                row.append("–" if x is None else f"{x['ratio']:.2f} ({_range(x)})")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _ratio_table(doc: dict[str, Any]) -> list[str]:
    """siglo's ratios of every backend in one table: a column per backend and baseline."""
    ratio_of = {(x["backend"], x["workload"], x["vs"]): x for x in doc.get("ratios", [])}
    pairs = {(backend, vs) for backend, _, vs in ratio_of}
    columns = [
        (b, vs)
        for b in _backends(doc)
        for vs in ("raw", "raw-fast", "langgraph")
        if (b, vs) in pairs
    ]
    if not columns:
        return []
    lines = [
        "### siglo / baseline, per workload",
        "",
        "| workload | " + " | ".join(f"{b} / {vs}" for b, vs in columns) + " |",
        "|---" + "|---:" * len(columns) + "|",
    ]
    for w in _workloads(doc, [b for b, _ in columns]):
        cells = []
        for backend, vs in columns:
            x = ratio_of.get((backend, w, vs))
            cells.append("–" if x is None else f"{x['ratio']:.2f} ({_range(x)})")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def conflicts_per_update(r: dict[str, Any]) -> list[float]:
    """A compare-and-set cell's conflicts per successful update, one figure per round
    (empty where the run recorded no conflict counts)."""
    extras = r.get("extra") or []
    if r.get("name") != "cas" or len(extras) != len(r.get("runs") or []) or not r.get("ops"):
        return []
    return [e.get("conflicts", 0) / r["ops"] for e in extras]


def _conflict_lines(doc: dict[str, Any]) -> list[str]:
    """Conflicts per successful update of every compare-and-set cell, per subject: a
    subject whose callers never overlap has none, one whose callers interleave loses
    some and retries (a cell with no conflict in any round records none)."""
    if not doc["meta"].get("timed_conflicts"):
        return []  # recorded before the warm-up's conflicts were left out: not comparable
    cas = [
        r
        for r in doc["results"]
        if r["name"] == "cas" and r["status"] == "ok" and r["concurrency"] > 1
    ]
    if not any(r.get("extra") for r in cas):
        return []
    lines = [
        "### compare-and-set: conflicts per successful update",
        "",
        "| backend | workload | subject | conflicts per update, median (min–max of rounds) |",
        "|---|---|---|---:|",
    ]
    for r in cas:
        rounds = conflicts_per_update(r) or [0.0] * len(r["runs"])
        if not rounds:
            continue
        lines.append(
            f"| {r['backend']} | {r['workload']} | {r['kind']} | "
            f"{statistics.median(rounds):.2f} ({min(rounds):.2f}–{max(rounds):.2f}) |"
        )
    return [*lines, ""]


def _error_lines(doc: dict[str, Any]) -> list[str]:
    errors = [r for r in doc["results"] if r["status"] == "error"]
    if not errors:
        return []
    lines = ["Errors:", ""]
    lines += [f"- {r['kind']}:{r['backend']} {r['workload']}: {r['error']}" for r in errors]
    return [*lines, ""]


def _scale_lines(doc: dict[str, Any]) -> list[str]:
    if not doc.get("scale"):
        return []
    lines = [
        "### scale",
        "",
        "| subject | rows (small → large) | load p50 µs small | load p50 µs large | "
        "ratio, median (min–max of rounds) | first touch: ratio (min–max) | "
        "clean-up of expired rows | clean-up s | peak Python MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in doc["scale"]:
        if s.get("status") == "error":
            lines.append(f"| {s['kind']}:{s['backend']} | error: {s['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {s['kind']}:{s['backend']} | {s['rows_small']:,} → {s['rows_large']:,} | "
            f"{s['load_us_small']:.0f} | {s['load_us_large']:.0f} | "
            f"{s['load_latency_ratio']:.2f} ({_scale_range(s)}) | {_first_touch(s)} | "
            f"{s['expired_rows']:,} (removed "
            f"{s['cleaned']:,}) | {s['clean_seconds']:.2f} | {s['clean_peak_mb']:.1f} |"
        )
    return [*lines, ""]


_CELLS_NOTE = (
    "Cells: median ops/s of the rounds, ± half their spread (max − min). A ratio is the "
    "median of the per-round ratios (siglo and the baseline timed back to back in the same "
    "round), with their min–max."
)


def markdown(doc: dict[str, Any]) -> str:
    """The whole report (``results.md``): machine, subjects, targets, one table per
    backend with every subject's ops/s, scale, end to end."""
    from benchmarks.e2e import e2e_markdown

    lines = [
        *_run_lines(doc),
        *_subject_lines(doc),
        *_target_lines(doc),
        *_backend_tables(doc),
        *_error_lines(doc),
        *_conflict_lines(doc),
        *_loop_lag_lines(doc),
        *_scale_lines(doc),
        _CELLS_NOTE,
        "",
        *e2e_markdown(doc),
    ]
    return "\n".join(lines)


def page_markdown(doc: dict[str, Any], report_link: str) -> str:
    """The results section of the benchmarks page: the run, its targets, siglo's ratios
    of every backend in one table, scale and end to end; every subject's ops/s and the
    subjects themselves are in the whole report at ``report_link``."""
    from benchmarks.e2e import e2e_markdown

    lines = [
        *_run_lines(doc),
        *_target_lines(doc),
        *_ratio_table(doc),
        *_error_lines(doc),
        *_scale_lines(doc),
        *e2e_markdown(doc, systems=False),
        f"Every subject's ops/s, the subjects and the systems: [the whole report]({report_link}).",
    ]
    return "\n".join(lines)


def _loop_lag_lines(doc: dict[str, Any]) -> list[str]:
    """The event-loop lag table (``--loop-lag``), if the run measured it."""
    if not doc.get("loop_lag"):
        return []
    from benchmarks.loop_lag import loop_lag_markdown

    return loop_lag_markdown(doc)


def _passes(slices: int) -> str:
    """How a round was timed, for the report's first line (runs before passes: none)."""
    return f" of {slices} passes each (benchmarks/slices.py)" if slices > 1 else ""


def _range(x: dict[str, Any]) -> str:
    return f"{x['ratio_min']:.2f}–{x['ratio_max']:.2f}"


def _scale_range(s: dict[str, Any]) -> str:
    rounds = s.get("load_latency_rounds") or [s["load_latency_ratio"]]
    return f"{min(rounds):.2f}–{max(rounds):.2f}"


def _first_touch(s: dict[str, Any]) -> str:
    """The ratio of the loads right after the fill, before the warming (runs before the
    warming was added have none)."""
    rounds = s.get("first_touch_rounds")
    if not rounds:
        return "–"
    return f"{s['first_touch_ratio']:.2f} ({min(rounds):.2f}–{max(rounds):.2f})"


def chart(doc: dict[str, Any], path: Path) -> str | None:
    """Draw siglo / raw (and siglo / langgraph) ratios as a PNG; a note if impossible."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install -e '.[bench]'): no chart"
    ratios = [x for x in doc.get("ratios", [])]
    if not ratios:
        return "no ratios to chart"
    backends = list(dict.fromkeys(x["backend"] for x in ratios))
    fig, axes = plt.subplots(
        1,
        len(backends),
        figsize=(
            4.2 * len(backends),
            0.28 * max(len([x for x in ratios if x["backend"] == b]) for b in backends) + 1.8,
        ),
        squeeze=False,
    )
    for ax, backend in zip(axes[0], backends, strict=True):
        rows = [x for x in ratios if x["backend"] == backend]
        labels = [f"{x['workload']} vs {x['vs']}" for x in rows]
        values = [x["ratio"] for x in rows]
        colors = [{"raw": "#4c72b0", "raw-fast": "#8172b3"}.get(x["vs"], "#dd8452") for x in rows]
        ax.barh(range(len(rows)), values, color=colors)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linewidth=0.8)
        if backend in DRIVER_BACKENDS:
            ax.axvline(0.8, color="red", linestyle="--", linewidth=0.8)
        ax.set_title(f"{backend}: siglo / baseline")
        ax.set_xlabel("ratio of ops/s (higher is better for siglo)")
    fig.suptitle(
        f"siglo benchmarks {doc['meta']['started']} — {doc['meta']['machine']['cpu']}, "
        f"{doc['meta']['machine']['cores']} cores",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def update_page(
    page: Path, doc: dict[str, Any], chart_path: Path | None, report_path: Path
) -> None:
    """Replace the text between the result markers of ``page`` with this run's results
    (:func:`page_markdown`), linking the charts beside ``chart_path`` and the whole report
    at ``report_path``."""
    text = page.read_text()
    if START_MARK not in text or END_MARK not in text:
        raise SystemExit(f"{page} has no {START_MARK} … {END_MARK} section to update")
    body = page_markdown(doc, os.path.relpath(report_path, page.parent))
    if chart_path is not None:
        # Every chart on one line, side by side (the page keeps to its length): the
        # ratios, every subject's ops/s, end to end, then one per driver backend.
        charts = [
            (chart_path.name, "siglo / baseline ratios"),
            ("ops.png", "ops/s per subject"),
            ("e2e.png", "end to end: workflow runs/s"),
            *(
                (backend_chart_name(b), f"{b}: siglo / raw / raw-fast / LangGraph ops/s")
                for b in chart_backends(doc)
            ),
        ]
        images = " ".join(
            f"![{alt}]({os.path.relpath(image, page.parent)})"
            for name, alt in charts
            if (image := chart_path.parent / name).exists()
        )
        if images:
            body = f"{images}\n\n{body}"
    head, rest = text.split(START_MARK, 1)
    _, tail = rest.split(END_MARK, 1)
    page.write_text(f"{head}{START_MARK}\n{body}\n{END_MARK}{tail}")


_KIND_COLORS = {
    "siglo": "#4c72b0",
    "raw": "#55a868",
    "raw-fast": "#8172b3",
    "langgraph": "#dd8452",
}


def ops_chart(doc: dict[str, Any], path: Path) -> str | None:
    """Draw absolute ops/s of every subject per workload (log scale) as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install -e '.[bench]'): no chart"
    results = [r for r in doc["results"] if r["median"]]
    if not results:
        return "no results to chart"
    backends = list(dict.fromkeys(r["backend"] for r in results))
    workloads = {
        b: list(dict.fromkeys(r["workload"] for r in results if r["backend"] == b))
        for b in backends
    }
    tallest = max(len(w) for w in workloads.values())
    fig, axes = plt.subplots(
        1, len(backends), figsize=(4.2 * len(backends), 0.38 * tallest + 1.8), squeeze=False
    )
    for ax, backend in zip(axes[0], backends, strict=True):
        names = workloads[backend]
        kinds = [
            k
            for k in _KIND_COLORS
            if any(r["backend"] == backend and r["kind"] == k for r in results)
        ]
        height = 0.8 / len(kinds)
        for j, kind in enumerate(kinds):
            by_w = {
                r["workload"]: r["median"]
                for r in results
                if r["backend"] == backend and r["kind"] == kind
            }
            ys = [i + j * height for i, w in enumerate(names) if w in by_w]
            xs = [by_w[w] for w in names if w in by_w]
            ax.barh(ys, xs, height=height, color=_KIND_COLORS[kind], label=kind)
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(names))], names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_title(f"{backend}: ops/s (median)")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"siglo benchmarks {doc['meta']['started']} — {doc['meta']['machine']['cpu']}, "
        f"{doc['meta']['machine']['cores']} cores",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


SUMMARY_CELLS = ("save/1k/c32", "load/1k/c32", "cas/1k/c8", "cas/1k/c32")
"""The cells of the short raw-fast table on the benchmarks page."""


def raw_fast_summary(doc: dict[str, Any]) -> list[str]:
    """The short raw-fast section's figures (docs/benchmarks.md, "Raw-fast, loop lag,
    writes per run"): siglo / raw and siglo / raw-fast per backend for
    :data:`SUMMARY_CELLS`, the worst p99 loop lag per subject and the writes per run."""
    ratio_of = {(x["backend"], x["workload"], x["vs"]): x for x in doc.get("ratios", [])}
    backends = [b for b in DRIVER_BACKENDS if (b, SUMMARY_CELLS[0], "raw-fast") in ratio_of]
    lines = [
        "| siglo / raw · siglo / raw-fast | " + " | ".join(backends) + " |",
        "|---" + "|---:" * len(backends) + "|",
    ]
    for w in SUMMARY_CELLS:
        cells = []
        for b in backends:
            pair = [ratio_of.get((b, w, vs)) for vs in ("raw", "raw-fast")]
            cells.append(" · ".join("–" if x is None else ratio_text(x) for x in pair))
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lag: dict[tuple[str, str], float] = {}
    for e in doc.get("loop_lag", []):
        if e["status"] == "ok":
            key = (e["backend"], e["kind"])
            lag[key] = max(lag.get(key, 0.0), max(e["p99_rounds_ms"]))
    if lag:
        parts = [
            f"{b} " + ", ".join(f"{k} {v:.1f}" for (bb, k), v in lag.items() if bb == b)
            for b in dict.fromkeys(b for b, _ in lag)
        ]
        lines += ["", "Loop lag, highest p99 of any round (ms): " + "; ".join(parts) + "."]
    rows = [r for r in doc.get("e2e", []) if r.get("writes_per_run") and r["concurrency"] == 32]
    if rows:
        parts = []
        for b in dict.fromkeys(r["backend"] for r in rows):
            systems = ", ".join(
                f"{r['system']} {r['writes_per_run']:.1f}"
                + (
                    f" ({r['write_transactions_per_run']:.1f} transactions)"
                    if r.get("write_transactions_per_run") is not None
                    else ""
                )
                for r in rows
                if r["backend"] == b
            )
            parts.append(f"{b}: {systems}")
        lines.append(
            "Store writes per workflow run (32 at once): "
            + "; ".join(parts)
            + "."
            + _limit_summary(doc)
        )
    return lines


def _limit_summary(doc: dict[str, Any]) -> str:
    """siglo's runs/s at 32 runs as a share of the raw write limit per run, per backend,
    and its ratios to the other systems, for the raw-fast section's writes line (empty
    for a run made before the limit was measured)."""
    from benchmarks.write_limit import add_limit_ratios

    add_limit_ratios(doc)
    shares = [
        x for x in doc["e2e_limit_ratios"] if x["system"] == "siglo" and x["concurrency"] == 32
    ]
    if not shares:
        return ""
    parts = []
    for x in shares:
        versus = "".join(
            f", {e['ratio']:.2f} ({e['ratio_min']:.2f}–{e['ratio_max']:.2f})x {e['vs']}"
            for e in doc.get("e2e_ratios", [])
            if e["backend"] == x["backend"] and e["concurrency"] == 32
        )
        parts.append(f"{x['backend']} {ratio_text(x)}{versus}")
    return (
        " siglo's runs/s at 32 runs over the raw write limit per run (goal: 0.8, or 10x "
        "DBOS and LangGraph): " + "; ".join(parts) + "."
    )


def backend_chart_name(backend: str) -> str:
    """The file name of ``backend``'s chart (:func:`backend_chart`), beside results.md."""
    return f"backend-{backend}.png"


def backend_chart(doc: dict[str, Any], backend: str, path: Path) -> str | None:
    """One backend's chart: every subject's ops/s (siglo, raw, raw-fast, LangGraph) per
    workload cell, log scale, with siglo / raw-fast (else siglo / raw) written beside
    each cell's bars as median (lowest round); a note if there is nothing to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install -e '.[bench]'): no chart"
    results = [r for r in doc["results"] if r["backend"] == backend and r["median"]]
    if not results:
        return f"no results on {backend} to chart"
    names = list(dict.fromkeys(r["workload"] for r in results))
    kinds = [k for k in _KIND_COLORS if any(r["kind"] == k for r in results)]
    ratio_of = {
        (x["workload"], x["vs"]): x for x in doc.get("ratios", []) if x["backend"] == backend
    }
    height = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(names) * max(1, len(kinds) / 3) + 1.6))
    top = max(r["median"] for r in results)
    for j, kind in enumerate(kinds):
        by_w = {r["workload"]: r["median"] for r in results if r["kind"] == kind}
        ys = [i + j * height for i, w in enumerate(names) if w in by_w]
        xs = [by_w[w] for w in names if w in by_w]
        ax.barh(ys, xs, height=height, color=_KIND_COLORS[kind], label=kind)
    for i, w in enumerate(names):
        x = ratio_of.get((w, "raw-fast")) or ratio_of.get((w, "raw"))
        if x is not None:
            ax.text(
                top * 1.6,
                i + 0.4 - height / 2,
                f"/{x['vs']} {x['ratio']:.2f} ({x['ratio_min']:.2f})",
                va="center",
                fontsize=7,
                color="red" if x["ratio_min"] < 0.8 else "black",
            )
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(names))], names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=top * 12)
    ax.set_xlabel("ops/s, median of rounds (log); right: siglo / baseline, median (lowest)")
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)
    fig.suptitle(
        f"{backend}: siglo / raw / raw-fast / LangGraph — {doc['meta']['started']}, "
        f"{doc['meta']['machine']['cpu']}, {doc['meta']['machine']['cores']} cores",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def chart_backends(doc: dict[str, Any]) -> list[str]:
    """The backends that get a chart of their own: the drivers' with a result."""
    return [b for b in _backends(doc) if b in DRIVER_BACKENDS]
