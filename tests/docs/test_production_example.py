"""Seed 001 §9's production example (examples/production.py) runs end to end."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from _redis_helpers import REDIS_URL, require_redis
from sql_support import POSTGRES_URL, require_postgres

import siglo
from siglo.plugins import get_registry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "production.py"


@pytest.fixture(scope="module")
def production() -> ModuleType:
    spec = importlib.util.spec_from_file_location("siglo_production_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def restore_default_adapter() -> object:
    previous = siglo.default_storage_manager.adapter
    yield
    siglo.use_storage(previous)


async def run_example(production: ModuleType, backend: siglo.Backend) -> None:
    service = production.Service(backend)
    assert siglo.default_storage_manager.adapter is backend.adapter

    settled = await service.process_daily_settlement("settlement-1")
    assert settled == {"invoiceId": "INV-2026-10", "settled": True, "amountUSD": 5400.0}
    cp = await backend.adapter.get_checkpoint("settlement-1")
    assert cp is not None and cp.status == "completed"
    assert await backend.adapter.get_cached_step("currency-rates-latest") == {
        "EUR": 1.08,
        "GBP": 1.27,
        "JPY": 154.2,
    }

    # Single flight: while one settlement holds the lock, another is refused.
    assert backend.lock is not None
    held = await backend.lock.acquire("lock:daily-settlement", 5_000)
    with pytest.raises(siglo.LockNotAcquiredError, match="lock:daily-settlement"):
        await service.process_daily_settlement("settlement-2")
    assert await backend.lock.release("lock:daily-settlement", held.token)

    # Webhooks: processed once, replays rejected, redelivery gets the stored result.
    first = await service.handle_webhook("sig-1", {"id": "evt_1", "amount": 10})
    assert first == {"processed": True, "id": "evt_1"}
    with pytest.raises(PermissionError, match="replayed"):
        await service.handle_webhook("sig-1", {"id": "evt_1", "amount": 10})
    again = await service.handle_webhook("sig-2", {"id": "evt_1", "amount": 10})
    assert again == first
    # Concurrent deliveries of one event with distinct signatures: one processes it.
    assert backend.idempotency is not None
    await backend.idempotency.claim("evt_2")
    with pytest.raises(RuntimeError, match="in progress"):
        await service.handle_webhook("sig-3", {"id": "evt_2", "amount": 1})


@pytest.mark.usefixtures("restore_default_adapter")
async def test_production_example_on_memory(production: ModuleType) -> None:
    async with siglo.connect("memory://") as backend:
        await run_example(production, backend)


@pytest.mark.usefixtures("restore_default_adapter")
@pytest.mark.parametrize("backend_name", ["redis", "postgres", "sqlite"])
async def test_production_example_on_every_server_backend(
    production: ModuleType, backend_name: str, tmp_path: Path
) -> None:
    """Seed 001 §9 is written for Redis; the same program runs on every backend."""
    if backend_name == "redis":
        require_redis()
        url = REDIS_URL
    elif backend_name == "postgres":
        require_postgres()
        url = POSTGRES_URL
    else:
        url = f"sqlite:///{tmp_path / 'production.db'}"
    isolated = get_registry().for_url(url).load_isolated()
    assert isolated is not None
    async with isolated(url) as backend:
        await run_example(production, backend)


def test_production_example_as_a_script() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "memory://"], capture_output=True, text=True, check=True
    )
    assert "'settled': True" in done.stdout


def test_the_script_runs_twice_on_one_store(tmp_path: Path) -> None:
    """SPEC §9: run again on a persistent store, the settlement run is found and its
    result returned (run-or-continue), and the replayed webhook is refused."""
    import os
    import subprocess

    root = EXAMPLE.parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "backends")]),
    }
    url = f"sqlite:///{tmp_path / 'production.db'}"
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), url], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.splitlines())
    first, second = outputs
    assert second[0] == first[0]  # the same settlement, not a second one
    assert "refused: Duplicate or replayed webhook" in second[1]
