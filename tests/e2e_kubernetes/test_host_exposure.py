"""The host pods' exposure on a real cluster, as k8s/ ships it: metrics only on
their own headless Service (never through the MCP Service), the host NetworkPolicy accepted and
selecting exactly the host pods, the PodDisruptionBudget tracking them, the scheduling preferences
applied.

What one node cannot show: this cluster's CNI (scripts/provision-kubernetes.sh's codemode-cni)
does not implement NetworkPolicy (it isolates worker pods by construction), so the policies are
proven accepted and selecting, not enforced; the replicas on different nodes are proven on two
nodes by test_nodes.py, and the spread over zones needs zones (docs/kubernetes.md, "What was and
was not verified")."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.support.cluster import KUBECONFIG, SERVICE_NS, WORKERS, core_api, kubectl, kubectl_path

from .test_deployment import port_forward

pytestmark = pytest.mark.kubernetes

HOST_SELECTOR = "app.kubernetes.io/name=codemode"


def host_pods() -> list[Any]:
    pods = core_api().list_namespaced_pod(SERVICE_NS, label_selector=HOST_SELECTOR).items
    return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def slices(service: str) -> list[dict[str, Any]]:
    out = kubectl(
        "get", "endpointslices", "-n", SERVICE_NS, "-l", f"kubernetes.io/service-name={service}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def ready_addresses(service: str) -> set[str]:
    return {
        address
        for s in slices(service)
        for endpoint in s.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }


def wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, f"{what}: not within {timeout} s"
            return value
        time.sleep(1)


def test_metrics_are_on_their_own_service_not_the_mcp_one(deployed: None) -> None:
    pod_ips = {p.status.pod_ip for p in host_pods()}
    assert pod_ips
    mcp = json.loads(kubectl("get", "service", "codemode", "-n", SERVICE_NS, "-o", "json"))
    assert [(p["name"], p["port"]) for p in mcp["spec"]["ports"]] == [("http", 8000)]
    metrics = json.loads(kubectl("get", "service", "codemode-metrics", "-n", SERVICE_NS, "-o", "json"))
    assert metrics["spec"]["clusterIP"] == "None"
    # The endpoints the cluster computed: the MCP Service's carry port 8000 only, the metrics
    # Service's port 9090 only, both on exactly the running host pods.
    assert {(p["name"], p["port"]) for s in slices("codemode") for p in s["ports"]} == {("http", 8000)}
    assert {(p["name"], p["port"]) for s in slices("codemode-metrics") for p in s["ports"]} == {
        ("metrics", 9090)
    }
    wait_for("MCP endpoints on the host pods", lambda: ready_addresses("codemode") == pod_ips)
    wait_for("metrics endpoints on the host pods", lambda: ready_addresses("codemode-metrics") == pod_ips)


def test_metrics_cannot_be_reached_through_the_mcp_service(deployed: None) -> None:
    # Through the metrics Service: Prometheus text.
    with port_forward("service/codemode-metrics", 9090) as port:
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert scraped.status_code == 200 and "codemode_ready" in scraped.text
    # Through the MCP Service: there is no such port.
    argv = [kubectl_path(), "--kubeconfig", KUBECONFIG, "port-forward", "-n", SERVICE_NS]
    argv += ["--address", "127.0.0.1", "service/codemode", ":9090"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(
            "kubectl port-forward service/codemode :9090 is forwarding: the MCP Service has the metrics port"
        )
    assert done.returncode != 0
    assert "does not have a service port 9090" in done.stderr, done.stderr


def test_the_host_network_policy_is_accepted_and_selects_the_host_pods(deployed: None) -> None:
    policy = json.loads(kubectl("get", "networkpolicy", "codemode-host", "-n", SERVICE_NS, "-o", "json"))
    spec = policy["spec"]
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    selector = ",".join(f"{k}={v}" for k, v in spec["podSelector"]["matchLabels"].items())
    selected = core_api().list_namespaced_pod(SERVICE_NS, label_selector=selector).items
    assert {p.metadata.name for p in selected if p.metadata.deletion_timestamp is None} == {
        p.metadata.name for p in host_pods()
    }
    # As the API server stored it: metrics from the monitoring namespace only, DNS and API server out.
    (metrics,) = [r for r in spec["ingress"] if r["ports"][0]["port"] == "metrics"]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    ports = sorted((p["port"], p["protocol"]) for r in spec["egress"] for p in r["ports"])
    assert ports == [(53, "TCP"), (53, "UDP"), (443, "TCP"), (6443, "TCP")]
    # The workers' deny-all policies are still there beside it.
    assert len(kubectl("get", "networkpolicy", "-n", WORKERS, "-o", "name").split()) == 2


def test_the_disruption_budget_tracks_the_host_pods(deployed: None) -> None:
    def status() -> dict[str, Any] | None:
        pdb = json.loads(kubectl("get", "poddisruptionbudget", "codemode", "-n", SERVICE_NS, "-o", "json"))
        current: dict[str, Any] = pdb.get("status") or {}
        healthy = current.get("currentHealthy") == current.get("expectedPods") == len(host_pods())
        return (
            current
            if healthy and current.get("observedGeneration") == pdb["metadata"]["generation"]
            else None
        )

    current = wait_for("the PodDisruptionBudget observing the host pods", status)
    # maxUnavailable 1 of the suite's one replica: one may go (a two-replica deployment keeps one).
    assert current["expectedPods"] == 1 and current["disruptionsAllowed"] == 1, current


def test_the_host_pods_carry_the_scheduling_preferences(deployed: None) -> None:
    (pod, *_) = host_pods()
    anti = pod.spec.affinity.pod_anti_affinity
    (term,) = anti.preferred_during_scheduling_ignored_during_execution
    assert term.pod_affinity_term.topology_key == "kubernetes.io/hostname"
    assert anti.required_during_scheduling_ignored_during_execution is None
    (spread,) = pod.spec.topology_spread_constraints
    assert (spread.topology_key, spread.when_unsatisfiable) == (
        "topology.kubernetes.io/zone",
        "ScheduleAnyway",
    )
