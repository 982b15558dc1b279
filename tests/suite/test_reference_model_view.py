"""The suite reads the reference model through its public API only (zarr's stateful tests'
rule): never a private attribute of a ``siglo_memory`` object. What the public API cannot
say (an entry stored but expired) comes from the read-only ``model`` views
(``siglo_memory/model.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import siglo_contract
from siglo_memory.adapter import MemoryStorageAdapter
from siglo_memory.coordination import MemoryIdempotencyStore, MemoryLock, MemoryNonceStore

SUITE = Path(siglo_contract.__file__).resolve().parent
REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_names(obj: object, seen: set[int] | None = None) -> set[str]:
    """Private names a ``siglo_memory`` object has (its own, its slots', inherited ones),
    and those of the ``siglo_memory`` objects it holds in them (``_keys._items``)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return set()
    seen.add(id(obj))
    names = {name for name in dir(obj) if _private(name)}
    for name in sorted(names):
        value = getattr(obj, name, None)
        if type(value).__module__.startswith("siglo_memory"):
            names |= _private_names(value, seen)
    return names


def memory_private_names() -> frozenset[str]:
    adapter, store = MemoryStorageAdapter(), MemoryIdempotencyStore()
    lock, nonces = MemoryLock(), MemoryNonceStore()
    parts = [adapter, store, lock, nonces, adapter.model, store.model, lock.model, nonces.model]
    names: set[str] = set()
    for part in parts:
        names |= _private_names(part)
    return frozenset(names)


def _reaches(node: ast.AST, names: frozenset[str]) -> bool:
    if isinstance(node, ast.Attribute):
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        return node.attr in names and not on_self
    if isinstance(node, ast.Call):
        return (
            isinstance(node.func, ast.Name)
            and node.func.id in REFLECTION
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in names
        )
    if isinstance(node, ast.ImportFrom):
        from_memory = (node.module or "").startswith("siglo_memory")
        return from_memory and any(_private(alias.name) for alias in node.names)
    return False


def private_reaches(source: str, names: frozenset[str]) -> list[str]:
    """Where ``source`` touches one of ``names`` on anything but ``self``/``cls`` (an
    attribute, or ``getattr`` and its kin with the name as a constant), or imports a
    private name from ``siglo_memory``."""
    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.expr | ast.stmt) and _reaches(node, names)
    ]


def test_the_names_cover_the_reference_models_state() -> None:
    names = memory_private_names()
    # The stores' dicts, the expiring dict's items, the helpers, inherited hooks.
    expected = {"_checkpoints", "_waits", "_latest_wait_of_stack", "_cache", "_keys"}
    expected |= {"_holders", "_seen", "_items", "_live_wait", "_live_checkpoint", "_do_claim"}
    assert expected <= names


def test_the_suite_reaches_no_private_attribute_of_the_reference() -> None:
    names = memory_private_names()
    reaches = {
        str(path.relative_to(SUITE)): found
        for path in sorted(SUITE.rglob("*.py"))
        if (found := private_reaches(path.read_text(encoding="utf-8"), names))
    }
    assert reaches == {}, (
        "the contract suite reads the reference model through its public API and its "
        "read-only `model` views (siglo_memory/model.py); add what a machine needs there"
    )


def test_the_scan_sees_a_private_reach() -> None:
    names = memory_private_names()
    planted = (
        "from siglo_memory.adapter import _Entry\n"
        "entry = self.ref_adapter._waits.get(key)\n"
        "item = self.ref_store._keys._items.get(key)\n"
        "late = getattr(self.ref.adapter, '_latest_wait_of_stack')\n"
        "mine = self._waits\n"
    )
    assert len(private_reaches(planted, names)) == 5  # _keys and _items both count
    assert private_reaches("entry = self.ref_adapter.model.wait_record(key)\n", names) == []


def test_the_views_are_what_the_machines_read() -> None:
    """Each part of the reference offers its view under the same public name."""
    for part in (MemoryStorageAdapter, MemoryIdempotencyStore, MemoryLock, MemoryNonceStore):
        assert isinstance(vars(part).get("model"), property), part.__name__
