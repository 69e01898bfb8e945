"""An in-memory GKE ``ClusterManager`` for tests and benchmarks (no cloud call).

Clusters and node pools are kept by resource path as the ``google.cloud.container_v1`` objects
the backend sends (so their fields are what GKE would receive); creating what exists raises
``AlreadyExists``, touching what does not ``NotFound``, as the real API does. Operations end at
once (``DONE``); a subclass may keep them running.
"""

from __future__ import annotations

from typing import Any

DEFAULT_VERSION = "1.35.1-gke.1396000"
"""Control plane version of the clusters it creates (supports the extended Spot shutdown period)."""


class InMemoryClusterManager:
    """Clusters and pools by resource path; ``calls`` lists every call in order."""

    def __init__(self, version: str = DEFAULT_VERSION):
        self.version = version
        self.clusters: dict[str, Any] = {}
        self.pools: dict[str, Any] = {}
        self.calls: list[str] = []

    def _op(self) -> Any:
        from google.cloud.container_v1 import types

        return types.Operation(name="op", status=types.Operation.Status.DONE, location="us-central1")

    def get_cluster(self, *, name: str) -> Any:
        from google.api_core.exceptions import NotFound

        self.calls.append("get_cluster")
        if name not in self.clusters:
            raise NotFound(name)
        return self.clusters[name]

    def create_cluster(self, *, parent: str, cluster: Any) -> Any:
        from google.api_core.exceptions import AlreadyExists

        self.calls.append("create_cluster")
        path = f"{parent}/clusters/{cluster.name}"
        if path in self.clusters:
            raise AlreadyExists(path)
        cluster.current_master_version = self.version
        self.clusters[path] = cluster
        return self._op()

    def create_node_pool(self, *, parent: str, node_pool: Any) -> Any:
        from google.api_core.exceptions import AlreadyExists

        self.calls.append("create_node_pool")
        path = f"{parent}/nodePools/{node_pool.name}"
        if path in self.pools:
            raise AlreadyExists(path)
        self.pools[path] = node_pool
        return self._op()

    def set_node_pool_size(self, *, name: str, node_count: int) -> Any:
        from google.api_core.exceptions import NotFound

        self.calls.append(f"set_node_pool_size={node_count}")
        if name not in self.pools:
            raise NotFound(name)
        self.pools[name].initial_node_count = node_count
        return self._op()

    def delete_node_pool(self, *, name: str) -> Any:
        from google.api_core.exceptions import NotFound

        self.calls.append("delete_node_pool")
        if name not in self.pools:
            raise NotFound(name)
        del self.pools[name]
        return self._op()

    def get_node_pool(self, *, name: str) -> Any:
        from google.api_core.exceptions import NotFound

        if name not in self.pools:
            raise NotFound(name)
        return self.pools[name]

    def set_node_pool_autoscaling(self, *, name: str, autoscaling: Any) -> Any:
        raise NotImplementedError("SAILOR does not change a pool's autoscaling")

    def get_operation(self, *, name: str) -> Any:
        return self._op()

    def list_operations(self, *, parent: str) -> Any:
        """The operations still running in ``parent`` (none: every operation ends at once)."""
        from google.cloud.container_v1 import types

        self.calls.append("list_operations")
        return types.ListOperationsResponse(operations=[])
