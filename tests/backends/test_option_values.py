"""Options given values their consumer would take badly are refused where they are given,
naming the option: a clock without ``now_ms()`` (raised as an ``AttributeError`` by the
first expiry decision before), and PostgreSQL pool options that psycopg's pool took as a
negative wait or a one-millisecond one (every connection a pool timeout), or sizes it
refused only when it opened."""

from __future__ import annotations

from typing import Any

import pytest

import siglo
from siglo import InvalidArgumentError, StorageManager
from siglo_memory.adapter import MemoryStorageAdapter
from siglo_memory.coordination import MemoryIdempotencyStore
from siglo_postgres.blobs import open_store

PG = "postgresql://127.0.0.1:5432/test"


@pytest.mark.parametrize("url", ["memory://", "sqlite:///:memory:", PG])
@pytest.mark.parametrize("clock", ["12:00", 5, object()])
def test_a_clock_without_now_ms_is_refused_at_connect(url: str, clock: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="clock must be a siglo Clock"):
        siglo.connect(url, clock=clock)


def test_a_clock_without_now_ms_is_refused_where_siglo_takes_one() -> None:
    for make in (
        lambda: MemoryStorageAdapter(clock="12:00"),  # type: ignore[arg-type]
        lambda: MemoryIdempotencyStore(clock="12:00"),  # type: ignore[arg-type]
        lambda: StorageManager(clock="12:00"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgumentError, match="clock must be a siglo Clock"):
            make()
    assert StorageManager(clock=siglo.ManualClock(5)).clock.now_ms() == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pool_timeout_ms": -5}, "pool_timeout_ms must be at least 1, got -5"),
        ({"pool_timeout_ms": True}, "pool_timeout_ms must be an integer, got True"),
        ({"connect_timeout_ms": 0}, "connect_timeout_ms must be at least 1, got 0"),
        ({"pool_max_size": 0}, "pool_max_size must be at least 1, got 0"),
        ({"pool_min_size": -1}, "pool_min_size must be at least 0, got -1"),
        ({"prepare_threshold": -1}, "prepare_threshold must be at least 0, got -1"),
        (
            {"pool_min_size": 20},
            r"pool_min_size \(20\) must not be larger than pool_max_size \(10\)",
        ),
        (
            {"pool_min_size": 3, "pool_max_size": 2},
            r"pool_min_size \(3\) must not be larger than pool_max_size \(2\)",
        ),
    ],
)
def test_bad_postgres_pool_options_are_refused_at_connect(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        siglo.connect(PG, **options)
    if not isinstance(next(iter(options.values())), bool):
        query = "&".join(f"{k}={v}" for k, v in options.items())
        with pytest.raises(InvalidArgumentError, match=message):
            siglo.connect(f"{PG}?{query}")


@pytest.mark.parametrize("query", ["pool_timeout_ms=-3", "pool_max_size=0", "connect_timeout_ms=0"])
def test_bad_pool_options_of_a_postgres_blob_store_are_refused(query: str) -> None:
    with pytest.raises(InvalidArgumentError, match=query.split("=")[0] + " must be at least"):
        open_store(f"{PG}?{query}")


REDIS = "redis://127.0.0.1:6379/0?prefix=siglo-option-values:"


@pytest.mark.parametrize("url", ["memory://", "sqlite:///:memory:", REDIS, PG])
@pytest.mark.parametrize("lease", [2**62 + 1, 10**400])
def test_a_claim_lease_past_a_stored_time_is_refused_at_connect(url: str, lease: int) -> None:
    """As a lease given to a call is: accepted at connect, every claim then failed, each
    backend its own way (SQLite a raw OverflowError)."""
    with pytest.raises(InvalidArgumentError, match="claim_lease_ms must be at most"):
        siglo.connect(url, claim_lease_ms=lease)
    assert siglo.connect(url, claim_lease_ms=2**62).url  # the longest accepted


@pytest.mark.parametrize("value", [5, True, None, b"FULL"])
def test_sqlite_synchronous_of_another_type_is_refused(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="synchronous must be one of"):
        siglo.connect("sqlite:///:memory:", synchronous=value)


@pytest.mark.parametrize("url", ["sqlite:///:memory:", PG])
@pytest.mark.parametrize("value", [0, False, 5, ["siglo_"]])
def test_a_table_prefix_that_is_not_text_is_refused(url: str, value: Any) -> None:
    """0 and False were taken for no prefix: the un-prefixed tables (`checkpoints`,
    `locks`) of whatever else the database holds were used."""
    with pytest.raises(InvalidArgumentError, match="table_prefix must contain only"):
        siglo.connect(url, table_prefix=value)


def test_a_postgres_blob_store_refuses_a_minimum_above_its_maximum() -> None:
    """As a backend does (docs/backends/postgres.md); the minimum was lowered silently."""
    with pytest.raises(InvalidArgumentError, match=r"pool_min_size \(5\) must not be larger"):
        open_store(f"{PG}?pool_min_size=5&pool_max_size=2")
    with pytest.raises(InvalidArgumentError, match=r"pool_min_size \(20\) must not be larger"):
        open_store(f"{PG}?pool_min_size=20")
