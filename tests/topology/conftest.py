"""Topologies of servers a test starts itself on loopback ports: Redis Sentinel and
Cluster, PgBouncer, a PostgreSQL primary with a replica, and the torture run.

A run whose losses are measured rather than asserted (no ``WAIT``, an asynchronous
replica, a killed cluster master) is marked ``measured_losses`` and runs only with
``SIGLO_TEST_TOPOLOGIES=1``; each prints a ``FAILOVER …`` or ``CLUSTER …`` line under
``-s``.
"""

from __future__ import annotations

import os

import pytest

TOPOLOGIES = os.environ.get("SIGLO_TEST_TOPOLOGIES", "") not in ("", "0")
"""Whether the opt-in topology runs run (``SIGLO_TEST_TOPOLOGIES=1``)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if TOPOLOGIES:
        return
    skip = pytest.mark.skip(reason="SIGLO_TEST_TOPOLOGIES=1 runs it")
    for item in items:
        if item.get_closest_marker("measured_losses") is not None:
            item.add_marker(skip)
