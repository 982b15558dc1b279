"""A Redis Cluster client that can always read the topology again.

redis-py's ``RedisCluster`` reads the cluster's topology (``CLUSTER SLOTS``) from its
"startup nodes", and forgets a node there each time a command fails on it with a
connection error or a timeout. When every node fails at once with calls in flight on
each — the whole cluster restarted, a network partition, a proxy dropping its
connections — it forgets them all, and from then on every call fails with "Redis
Cluster cannot be connected. Please provide at least one reachable node: None", the
cluster healthy again, until the process restarts (redis-py issues #3693 and #3221;
``tests/topology/test_redis_cluster_changes.py`` produces it with real servers).

:class:`SeedKeepingRedisCluster` puts back, before each reading of the topology, the
nodes it was given (the URL's) and the nodes of the last topology it read, where the
startup nodes lost them: a node that is down is tried and passed over, as redis-py
does with any startup node. siglo's cluster clients (plain, auto-pipelined, waiting for
replicas) all derive from it.

This module imports redis-py at the top: it is only imported when a client is built.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.asyncio.cluster import ClusterNode
from redis.cluster import get_node_name

__all__ = ["SeedKeepingRedisCluster"]


class SeedKeepingRedisCluster(redis.asyncio.RedisCluster):
    """``redis.asyncio.RedisCluster`` that never runs out of nodes to read the topology
    from (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seeds: tuple[tuple[str, int], ...] = tuple(
            (node.host, int(node.port)) for node in self.nodes_manager.startup_nodes.values()
        )

    async def initialize(self) -> SeedKeepingRedisCluster:
        if self._initialize:
            self._restore_startup_nodes()
        await super().initialize()
        return self

    def _restore_startup_nodes(self) -> None:
        manager = self.nodes_manager
        startup = manager.startup_nodes
        # The last topology read first (its nodes are the likeliest to answer), then the
        # URL's; each only where redis-py forgot it.
        for name, node in list(manager.nodes_cache.items()):
            startup.setdefault(name, node)
        for host, port in self._seeds:
            name = get_node_name(host, port)
            if name not in startup:
                startup[name] = manager.nodes_cache.get(name) or ClusterNode(
                    host, port, **manager.connection_kwargs
                )
