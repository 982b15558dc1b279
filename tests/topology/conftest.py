"""Topologies of servers a test starts itself on loopback ports: Redis Sentinel and
Cluster, PgBouncer, a PostgreSQL primary with a replica, and the torture run.

A run whose losses are measured rather than asserted (no ``WAIT``, an asynchronous
replica, a killed cluster master) is marked ``measured_losses`` and runs only with
``SIGLO_TEST_TOPOLOGIES=1``; each prints a ``FAILOVER …`` or ``CLUSTER …`` line under
``-s``. So does the whole contract suite run through a topology (``siglo check`` through a
Redis Cluster, a Sentinel URL, PgBouncer: marked ``contract_sweep``, 25-40 s each on two
cores), which the default run leaves to that option to stay under ten minutes, and so do
the further pairings of a test run over several (``topology_variant``: each client and each
kind of failover runs by default, not every pairing of them); the topologies' own tests
(failover losing nothing acknowledged, routing, clean-up) run always.
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
        if any(
            item.get_closest_marker(name) is not None
            for name in ("measured_losses", "contract_sweep", "topology_variant")
        ):
            item.add_marker(skip)
