"""The harness drives any registered backend, through its isolation factory when it has one.

In-process and quick: a test plugin serves ``benchiso://`` with the memory backend and
an isolation factory that records its use; every workload runs a few ops against it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import siglo
from siglo.backend import Backend
from siglo.plugins import BackendRegistry, get_registry, hookimpl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """The top-level ``benchmarks`` package (not installed: loaded from the checkout)."""
    spec = importlib.util.spec_from_file_location(
        "benchmarks",
        ROOT / "benchmarks" / "__init__.py",
        submodule_search_locations=[str(ROOT / "benchmarks")],
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = module
    spec.loader.exec_module(module)
    yield module
    for name in [n for n in sys.modules if n == "benchmarks" or n.startswith("benchmarks.")]:
        del sys.modules[name]


@pytest.fixture
def isolated_plugin() -> Iterator[list[str]]:
    events: list[str] = []

    @asynccontextmanager
    async def isolated(url: str, **options: Any) -> AsyncIterator[Backend]:
        events.append(f"enter {url} {sorted(options)}")
        backend = siglo.connect("memory://")
        try:
            yield backend
        finally:
            await backend.aclose()
            events.append("exit")

    def register(registry: BackendRegistry) -> None:
        registry.add_backend(
            "benchiso",
            schemes=("benchiso",),
            factory="siglo_memory.connect:connect",
            capabilities=("checkpoints", "wait_records", "step_cache", "idempotency", "locks"),
            isolated=isolated,
        )

    plugin = SimpleNamespace(siglo_register_backends=hookimpl(register))
    plugin.siglo_register_backends.__name__ = "siglo_register_backends"
    registry = get_registry()
    registry.register(plugin, "benchiso-test")
    try:
        yield events
    finally:
        registry.unregister("benchiso-test")


async def test_siglo_subject_uses_the_isolation_factory(
    bench: ModuleType, isolated_plugin: list[str]
) -> None:
    from benchmarks.siglo_subject import SigloSubject
    from benchmarks.workloads import Workload, measure

    subject = SigloSubject("benchiso", "benchiso://", pool_size=3)
    await subject.open()
    try:
        assert "isolated" in subject.detail
        for name, size in [
            ("save", "1k"),
            ("load", "16k"),
            ("cas", "1k"),
            ("wait_claim", None),
            ("idempotency", None),
            ("lock", None),
            ("cache", None),
        ]:
            for concurrency in (1, 4):
                m = await measure(
                    subject, Workload(name, size, concurrency, 8), f"t-{name}-{concurrency}"
                )
                assert m.ops >= 8
                assert m.ops_per_s > 0
    finally:
        await subject.close()
    assert isolated_plugin == ["enter benchiso:// ['pool_size']", "exit"]
