"""The import graph of siglo, its built-in backends and the contract suite: no loops,
imports at the top.

Read from the source with ``ast`` (nothing is imported), counting imports inside
functions and under ``TYPE_CHECKING`` too, so a loop cannot hide behind a deferred
import. A deferred import of a first-party module is allowed only where that module
imports an optional driver at its top (the driver loads when a URL is connected).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (ROOT, ROOT / "backends", ROOT / "contract_tests")
PACKAGES = (
    "siglo",
    "siglo_memory",
    "siglo_redis",
    "siglo_sql",
    "siglo_sqlite",
    "siglo_postgres",
    "siglo_contract",
)

DEFERRED_ALLOWED = {
    # These subclass redis-py's clients, so they import the optional driver at their top.
    ("siglo_redis.client", "siglo_redis.sent_once"),
    ("siglo_redis.client", "siglo_redis.pipelining"),
    ("siglo_redis.client", "siglo_redis.replication"),
    # The Sentinel client's master watch asks redis-py's Sentinels: the driver at its top.
    ("siglo_redis.client", "siglo_redis.master_watch"),
    # The pytest11 plugin imports the siglo_contract package in every user's test run;
    # its run_contract (hypothesis, every check, the reference backend) loads on first use.
    ("siglo_contract", "siglo_contract.runner"),
    # siglo's CLI loads the suite only for `siglo check`, not for every command.
    ("siglo.cli.check", "siglo_contract.rules"),
    ("siglo.cli.check", "siglo_contract.runner"),
    ("siglo.cli.check", "siglo_contract.certificate"),
    ("siglo.cli.check", "siglo_contract.version"),
    ("siglo.cli.check", "siglo_contract.target"),
    # `siglo ui` loads its web stack (Starlette, the siglo[ui] extra) only when it runs.
    ("siglo.cli.ui", "siglo.ui.server"),
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in SOURCE_ROOTS:
        for package in PACKAGES:
            for path in (root / package).rglob("*.py"):
                parts = path.relative_to(root).with_suffix("").parts
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                found[name] = path
    return found


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The first-party modules an import statement loads (a package's ``__init__`` when a
    name imported from it is not a submodule)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in MODULES}
    if node.level:
        is_package = MODULES[module].name == "__init__.py"
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    if source not in MODULES:
        return set()
    targets = {f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in MODULES}
    if len(targets) < len(node.names):
        targets.add(source)
    return targets - {module}


def _edges(module: str, node: ast.AST, deferred: bool) -> list[tuple[str, bool]]:
    edges: list[tuple[str, bool]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            edges.extend((t, deferred) for t in _targets(module, child))
        else:
            inside = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            edges.extend(_edges(module, child, deferred or inside))
    return edges


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """module -> [(imported module, deferred?)]."""
    return {m: _edges(m, ast.parse(p.read_text()), False) for m, p in MODULES.items()}


@functools.cache
def _graph() -> dict[str, list[tuple[str, bool]]]:
    """The graph, parsed once by the worker that runs these tests (not at collection,
    where every xdist worker would parse the whole tree: 1.7 s of CPU each)."""
    return _imports()


def _cycles() -> list[list[str]]:
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w, _ in _graph()[v]:
            if w not in order:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in _graph():
        if v not in order:
            strongconnect(v)
    return cycles


def test_the_graph_covers_every_package() -> None:
    assert {m.split(".")[0] for m in MODULES} == set(PACKAGES)
    assert "siglo.plugins.registry" in MODULES and "siglo_redis.client" in MODULES
    assert "siglo_contract" in MODULES and "siglo_contract.checks" in MODULES


def test_no_import_loops() -> None:
    assert _cycles() == []


def test_first_party_imports_are_at_the_top() -> None:
    deferred = {(m, t) for m, edges in _graph().items() for t, late in edges if late}
    assert deferred <= DEFERRED_ALLOWED, sorted(deferred - DEFERRED_ALLOWED)


def test_the_checker_sees_a_loop() -> None:
    _graph()["siglo.codec"].append(("siglo.manager", True))
    try:
        assert any("siglo.codec" in cycle for cycle in _cycles())
    finally:
        _graph()["siglo.codec"].pop()


def test_the_checker_sees_a_loop_in_the_suite() -> None:
    # A loop through the package: siglo_contract -> runner -> checks -> siglo_contract.
    _graph()["siglo_contract.checks"].append(("siglo_contract", True))
    try:
        assert any("siglo_contract.runner" in cycle for cycle in _cycles())
    finally:
        _graph()["siglo_contract.checks"].pop()
