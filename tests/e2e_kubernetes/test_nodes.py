"""Two nodes: worker pods and the warm pool spread over the nodes (the worker pod's
``topologySpreadConstraint`` on ``kubernetes.io/hostname``), pods on each node serve executes, and
the two replicas of the shipped Deployment run on different nodes (its preferred pod
anti-affinity), also after a rolling restart.

They need a cluster of two Ready nodes (``scripts/provision-kubernetes.sh up --nodes 2``, or
``up-node 2`` beside a running cluster). On one node they skip, saying so, unless CI=true and
CODEMODE_K8S_NODES=2 (a CI run that asked for two nodes): then they fail.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Iterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.execution.observe import ExecuteEvent, NullObserver
from codemode.ops.bench import aecho
from codemode.runtimes.kubernetes import INSTANCE_LABEL, KubernetesOptions, KubernetesRuntime
from codemode.runtimes.kubernetes.pod import SPREAD_TOPOLOGY_KEY
from tests.support.cluster import KUBECONFIG, SERVICE_NS, WORKERS, core_api, kubectl

pytestmark = pytest.mark.kubernetes

ONE_CALL = "def main():\n    return util.echo(value='on some node')['value']\n"
HOST_SELECTOR = "app.kubernetes.io/name=codemode"
#: How many workers each test starts at once: two per node on a two-node cluster.
BURST = 4


class Workers(NullObserver):
    def __init__(self) -> None:
        self.ids: list[str] = []

    def execute_outcome(self, event: ExecuteEvent) -> None:
        self.ids.append(event.worker_id)


def runtime() -> KubernetesRuntime:
    return KubernetesRuntime(KubernetesOptions(kubeconfig=KUBECONFIG, namespace=WORKERS, spawn_timeout=60.0))


def nodes_of(rt: KubernetesRuntime) -> dict[str, str]:
    """Pod name -> node, for the live (not deleting) pods of one runtime object."""
    pods = core_api().list_namespaced_pod(WORKERS, label_selector=f"{INSTANCE_LABEL}={rt.instance_id}").items
    return {p.metadata.name: p.spec.node_name for p in pods if p.metadata.deletion_timestamp is None}


def assert_spread(placed: dict[str, str], nodes: list[str]) -> None:
    counts = collections.Counter(placed.values())
    assert set(counts) == set(nodes), f"{len(placed)} workers on {dict(counts)}, nodes {nodes}"
    assert max(counts.values()) - min(counts.values()) <= 1, dict(counts)


async def test_a_burst_of_worker_pods_spreads_over_the_nodes(two_nodes: list[str], cluster: None) -> None:
    # Started at once, as the pool's refill and concurrent executes do. Without the spread rule the
    # scheduler's resource scores alone sent all of them to the emptier node.
    rt = runtime()
    (constraint, *_) = rt.pod_manifest("p").spec.topology_spread_constraints or [None]  # type: ignore[union-attr]
    assert constraint is not None and constraint.topology_key == SPREAD_TOPOLOGY_KEY
    try:
        boxes = await asyncio.gather(*(rt.spawn() for _ in range(BURST)))
        placed = nodes_of(rt)
        assert len(placed) == BURST
        assert_spread(placed, two_nodes)
        for box in boxes:
            await box.destroy()
    finally:
        await rt.aclose()


async def test_the_warm_pool_fills_every_node_and_each_node_serves_executes(
    two_nodes: list[str], cluster: None
) -> None:
    rt = runtime()
    # One subject takes every pooled pod here: no per-subject share (this test is about the nodes).
    pool = codemode.WarmPool(rt, BURST, subject_share=1.0)
    seen = Workers()
    b = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=pool,
        limits=codemode.Limits(max_execution_time=30.0, max_concurrent_executions=BURST),
        observer=seen,
    )
    b.register(codemode.Capability(name="util.echo", summary="Echo.", handler=aecho))
    srv = b.build()
    try:
        await srv.start()
        await pool.wait_warm(120)
        warm = nodes_of(rt)
        assert len(warm) == BURST
        assert_spread(warm, two_nodes)
        # The pooled pods, each attached through its own node's kubelet, run the executes.
        for _ in range(BURST):
            assert await srv.execute(ONE_CALL, subject=authz.Subject("alice")) == "on some node"
        served = collections.Counter(warm.get(w.removeprefix("k8s-"), "refilled") for w in seen.ids)
        assert set(two_nodes) <= set(served), (served, warm)
    finally:
        await srv.aclose()


def host_pods() -> list[Any]:
    pods = core_api().list_namespaced_pod(SERVICE_NS, label_selector=HOST_SELECTOR).items
    return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def rollout(*args: str) -> None:
    kubectl(*args, "-n", SERVICE_NS, "deployment/codemode")
    kubectl("rollout", "status", "-n", SERVICE_NS, "deployment/codemode", "--timeout=240s", timeout=260)


@pytest.fixture
def two_replicas(two_nodes: list[str], deployed: None) -> Iterator[list[str]]:
    """The Deployment as shipped runs it: two replicas (the e2e overlay runs one); one again after."""
    replicas = json.loads(kubectl("get", "deployment", "codemode", "-n", SERVICE_NS, "-o", "json"))["spec"][
        "replicas"
    ]
    try:
        rollout("scale", "--replicas=2")
        yield two_nodes
    finally:
        rollout("scale", f"--replicas={replicas}")


def test_the_two_service_replicas_run_on_different_nodes(two_replicas: list[str]) -> None:
    def placement() -> list[str]:
        pods = host_pods()
        assert len(pods) == 2, [p.metadata.name for p in pods]
        return sorted(p.spec.node_name for p in pods)

    assert len(set(placement())) == 2, placement()
    # A rolling update (new pods while the old ones still run) keeps them apart too.
    rollout("rollout", "restart")
    assert len(set(placement())) == 2, placement()
