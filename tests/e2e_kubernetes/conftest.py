"""Fixtures of the Kubernetes e2e suite: the cluster, the applied manifests, the leftover check."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.support.cluster import (
    OVERLAY,
    SERVICE_IMAGE,
    SERVICE_NS,
    kubectl,
    ready_nodes,
    require_cluster,
    worker_pods,
)


@pytest.fixture(scope="session")
def cluster() -> Iterator[None]:
    """The reachable cluster with k8s/ (plus the e2e overlay) applied: namespaces, RBAC, quota..."""
    require_cluster()
    kubectl("apply", "-k", str(OVERLAY))
    if SERVICE_IMAGE:  # a service image of one's own (the overlay's is the shared e2e tag)
        kubectl("set", "image", "-n", SERVICE_NS, "deployment/codemode", f"codemode={SERVICE_IMAGE}")
    yield
    # No worker pod may outlive the suite (pods being deleted are given a moment to go).
    deadline = time.monotonic() + 30
    while worker_pods() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [p.metadata.name for p in worker_pods()]
    assert not left, f"worker pods left after the suite: {left}"


@pytest.fixture(scope="session")
def deployed(cluster: None) -> Iterator[None]:
    """k8s/ as shipped plus the e2e overlay, applied, with the Deployment rolled out afresh (its
    pods read the ConfigMap at start; a cluster kept from an earlier run may hold older ones)."""
    kubectl("rollout", "restart", "-n", SERVICE_NS, "deployment/codemode")
    kubectl("rollout", "status", "-n", SERVICE_NS, "deployment/codemode", "--timeout=180s", timeout=200)
    yield


@pytest.fixture
def two_nodes() -> list[str]:
    """The Ready nodes, at least two; checked before any fixture changes the cluster. On one node
    the test skips, saying so, unless CI=true and CODEMODE_K8S_NODES=2: then it fails."""
    require_cluster()
    nodes = ready_nodes()
    if len(nodes) >= 2:
        return nodes
    reason = (
        f"needs two Ready nodes, the cluster has {len(nodes)} ({', '.join(nodes) or 'none'}): "
        "sudo bash scripts/provision-kubernetes.sh up-node 2 (or up --nodes 2; docs/kubernetes.md)"
    )
    if os.environ.get("CI", "").lower() == "true" and os.environ.get("CODEMODE_K8S_NODES") == "2":
        pytest.fail(f"CODEMODE_K8S_NODES=2 in CI: {reason}")
    pytest.skip(reason)
