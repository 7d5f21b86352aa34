"""The manifests in k8s/: schema-valid offline, and saying what the runtime and docs rely on.

Every document is validated with kubernetes-validate (strict: unknown fields are errors) against
the OpenAPI schemas of Kubernetes 1.30 and of the newest version it ships. Then the security
properties are asserted directly: the worker NetworkPolicy denies everything, the workers'
namespace enforces Pod Security "restricted", RBAC grants exactly what the runtime calls, both
the host pod and the runtime's worker pod meet the restricted profile's rules, and the host pods'
exposure is bounded: metrics on their own headless Service only, a NetworkPolicy both ways (metrics
only from the monitoring namespace, egress to DNS and the API server, never the metadata address),
a disruption budget and a preference for different nodes and zones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client as k8s

from codemode.runtimes.kubernetes import DEFAULT_NAMESPACE, ROLE_LABEL, KubernetesOptions, KubernetesRuntime
from codemode.startup.config import Settings

K8S = Path(__file__).resolve().parents[2] / "k8s"
#: The Kubernetes objects (kustomization.yaml files are kustomize's, not the API server's).
FILES = sorted(f for f in K8S.rglob("*.yaml") if f.name != "kustomization.yaml")
VERSIONS = ["1.30", kubernetes_validate.utils.latest_version()]


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


ALL = [d for f in FILES for d in docs(f)]


def find(kind: str, name: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in ALL
        if d["kind"] == kind
        and (name is None or d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]


def one(kind: str, name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    (d,) = find(kind, name, namespace)
    return d


def test_the_expected_manifests_exist() -> None:
    names = {str(f.relative_to(K8S)) for f in FILES}
    assert names >= {
        "base/00-namespaces.yaml",
        "base/rbac.yaml",
        "base/deployment.yaml",
        "base/service.yaml",
        "base/networkpolicy.yaml",
        "base/host-networkpolicy.yaml",
        "base/metrics-service.yaml",
        "base/poddisruptionbudget.yaml",
        "base/configmap.yaml",
        "base/resourcequota.yaml",
        "overlays/gvisor/runtimeclass.yaml",
    }
    # `kubectl apply -f k8s/base/` applies files in name order: the namespaces must come first.
    first = sorted(f for f in (K8S / "base").glob("*.yaml") if f.name != "kustomization.yaml")[0]
    assert {d["kind"] for d in docs(first)} == {"Namespace"}


#: The Prometheus Operator's kinds (k8s/components/monitoring) have no schema among Kubernetes'
#: own: tests/unit/test_monitoring_rules.py checks them, and the e2e applies them against CRDs.
OPERATOR_API = "monitoring.coreos.com/"
CORE_FILES = [f for f in FILES if not any(d["apiVersion"].startswith(OPERATOR_API) for d in docs(f))]


def test_only_the_monitoring_component_uses_the_operators_kinds() -> None:
    assert {str(f.relative_to(K8S)) for f in FILES if f not in CORE_FILES} == {
        "components/monitoring/prometheusrule.yaml",
        "components/monitoring/servicemonitor.yaml",
    }


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(K8S)))
def test_every_document_validates_strictly(path: Path, version: str) -> None:
    found = docs(path)
    assert found, f"{path} holds no documents"
    for doc in found:
        # SchemaNotFoundError (an unknown kind/apiVersion) fails the test as well.
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    bad = one("Deployment")
    bad = {**bad, "spec": {**bad["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_the_kustomization_lists_every_base_manifest() -> None:
    assert yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"] == ["base"]
    base = K8S / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        f.name for f in base.glob("*.yaml") if f.name != "kustomization.yaml"
    )
    overlay = yaml.safe_load((K8S / "overlays/gvisor/kustomization.yaml").read_text())
    # Not "../..": kustomize refuses an overlay inside the directory it builds on (a cycle).
    assert overlay["resources"] == ["../../base", "runtimeclass.yaml"]
    (patch,) = overlay["patches"]
    toml = yaml.safe_load(patch["patch"])[0]["value"]
    base = one("ConfigMap", "codemode-config")["data"]["codemode.toml"]
    # The overlay's configuration is the base's with the RuntimeClass set, nothing else.
    assert [line for line in toml.splitlines() if "runtime_class" not in line] == [
        line for line in base.splitlines() if "runtime_class" not in line
    ]
    assert 'kubernetes_runtime_class = "gvisor"' in toml


def test_names_are_unique() -> None:
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in ALL]
    assert len(keys) == len(set(keys))


def test_workers_namespace_enforces_restricted_pod_security() -> None:
    labels = one("Namespace", DEFAULT_NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "latest"
    assert one("Namespace", "codemode")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "restricted"
    )


def test_worker_network_policy_denies_all_ingress_and_egress() -> None:
    policies = find("NetworkPolicy", namespace=DEFAULT_NAMESPACE)
    selecting = [p for p in policies if p["spec"]["podSelector"] == {"matchLabels": {ROLE_LABEL: "worker"}}]
    assert len(selecting) == 1
    for policy in [*selecting, *(p for p in policies if p["spec"]["podSelector"] == {})]:
        spec = policy["spec"]
        assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
        assert not spec.get("ingress") and not spec.get("egress")
    # Nothing in the namespace opens a hole again (policies are additive allow-lists).
    assert all(not p["spec"].get("ingress") and not p["spec"].get("egress") for p in policies)
    # The label it selects is the one every worker pod gets.
    pod = KubernetesRuntime(api=object()).pod_manifest("p")
    assert pod.metadata is not None and (pod.metadata.labels or {})[ROLE_LABEL] == "worker"


def test_rbac_grants_exactly_what_the_runtime_uses() -> None:
    sa = one("ServiceAccount", "codemode-host", "codemode")
    assert sa["automountServiceAccountToken"] is False
    role = one("Role", "codemode-worker-manager", DEFAULT_NAMESPACE)
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    assert grants == {
        ("pods", "create"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "delete"),
        ("pods/attach", "create"),
        ("pods/attach", "get"),
    }
    lookup = one("Role", "codemode-owner-lookup", "codemode")
    assert lookup["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    for name, namespace in (
        ("codemode-worker-manager", DEFAULT_NAMESPACE),
        ("codemode-owner-lookup", "codemode"),
    ):
        binding = one("RoleBinding", name, namespace)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "codemode-host", "namespace": "codemode"}
        ]
    assert not find("ClusterRole") and not find("ClusterRoleBinding")
    text = "\n".join(str(d) for d in ALL if d["kind"] in ("Role", "ClusterRole"))
    assert "*" not in text and "secrets" not in text and "pods/exec" not in text


def wire(pod: k8s.V1Pod) -> Any:
    """The pod as the client sends it (camelCase JSON, no nulls)."""
    return k8s.ApiClient().sanitize_for_serialization(pod)


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """The rules of the Pod Security Standards' "restricted" profile (and "baseline" beneath it)
    that apply to these pods, checked on a camelCase pod spec. Not the real admission plugin."""
    problems = []
    psc = pod_spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            problems.append(key)
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}  # fmt: skip
    for volume in pod_spec.get("volumes") or []:
        if set(volume) - {"name"} - allowed_volumes:
            problems.append(f"volume {volume['name']}")
    for c in pod_spec["containers"] + (pod_spec.get("initContainers") or []):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{name}: capabilities not dropped")
        if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities added")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            problems.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccomp")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            problems.append(f"{name}: hostPort")
    return problems


def test_host_deployment_is_hardened() -> None:
    deployment = one("Deployment", "codemode", "codemode")
    pod = deployment["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["serviceAccountName"] == "codemode-host"
    assert pod["automountServiceAccountToken"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    env = {e["name"]: e for e in c["env"]}
    assert env["CODEMODE_RUNTIME"]["value"] == "kubernetes"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    probes = (c["startupProbe"], c["livenessProbe"], c["readinessProbe"])
    assert {p["httpGet"]["path"] for p in probes} == {"/healthz", "/readyz"}
    # The probes use the health port (health_port's default), which no tenant traffic can saturate.
    health = {p["name"]: p["containerPort"] for p in c["ports"]}["health"]
    assert health == Settings.model_fields["health_port"].default
    assert {p["httpGet"]["port"] for p in probes} == {"health"}
    # The ConfigMap it mounts exists, and the Service selects its pods.
    (config,) = [v for v in pod["volumes"] if "configMap" in v]
    one("ConfigMap", config["configMap"]["name"], "codemode")
    service = one("Service", "codemode", "codemode")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert "health" not in {p["targetPort"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize("runtime_class", [None, "gvisor"])
def test_the_worker_pod_meets_the_restricted_profile(runtime_class: str | None) -> None:
    pod = KubernetesRuntime(KubernetesOptions(runtime_class=runtime_class), api=object()).pod_manifest(
        "codemode-worker-x"
    )
    spec = wire(pod)["spec"]
    assert restricted_violations(spec) == []


def test_a_localhost_seccomp_profile_replaces_runtime_default() -> None:
    plain = wire(KubernetesRuntime(api=object()).pod_manifest("p"))["spec"]
    assert plain["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    rt = KubernetesRuntime(KubernetesOptions(seccomp_profile="profiles/codemode-worker.json"), api=object())
    spec = wire(rt.pod_manifest("p"))["spec"]
    assert spec["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "profiles/codemode-worker.json",
    }
    assert restricted_violations(spec) == []  # Pod Security restricted allows Localhost


@pytest.mark.parametrize(
    "bad", ["", "/var/lib/kubelet/seccomp/x.json", "../x.json", "a/../x.json", "a//x.json"]
)
def test_a_seccomp_profile_outside_the_kubelets_root_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="seccomp_profile"):
        KubernetesRuntime(KubernetesOptions(seccomp_profile=bad), api=object())


def test_only_the_test_entry_replaces_the_worker_command(caplog: pytest.LogCaptureFixture) -> None:
    plain = wire(KubernetesRuntime(api=object()).pod_manifest("p"))["spec"]["containers"][0]
    assert "command" not in plain  # the image's entrypoint: the real worker
    # the marker, and the worker's stderr bounded once confined (a pod's stderr is its node log)
    assert {e["name"]: e["value"] for e in plain["env"]} == {
        "CODEMODE_WORKER": "1",
        "CODEMODE_WORKER_STDERR": "bounded",
    }
    with caplog.at_level("WARNING", logger="codemode.runtimes.kubernetes"):
        testing = KubernetesRuntime(KubernetesOptions(testing_entry=True), api=object())
    assert "TEST-ONLY" in caplog.text
    c = wire(testing.pod_manifest("p"))["spec"]["containers"][0]
    assert c["command"] == ["python3", "-I", "-m", "codemode_worker.testing_entry"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {
        "CODEMODE_WORKER": "1",
        "CODEMODE_WORKER_STDERR": "bounded",
        "CODEMODE_WORKER_TESTING": "1",
    }
    # Everything else about the pod (the containment) is the same.
    assert restricted_violations(wire(testing.pod_manifest("p"))["spec"]) == []


def test_the_quota_admits_worker_pods() -> None:
    hard = one("ResourceQuota", namespace=DEFAULT_NAMESPACE)["spec"]["hard"]
    # A quota on limits/requests makes the API server refuse pods that don't state them: ours do.
    spec = wire(KubernetesRuntime(api=object()).pod_manifest("p"))["spec"]
    resources = spec["containers"][0]["resources"]
    for key in hard:
        if "." in key:
            kind, resource = key.split(".", 1)
            assert resource in resources[kind], key
    assert int(hard["pods"]) > 0


def test_the_optional_runtime_class_matches_the_runtime_option() -> None:
    rc = one("RuntimeClass", "gvisor")
    assert rc["handler"] == "runsc"
    assert (
        KubernetesRuntime(KubernetesOptions(runtime_class=rc["metadata"]["name"]), api=object()).name
        == "kubernetes:gvisor"
    )
    # Not applied by `kubectl apply -k k8s/` (cluster-scoped, needs cluster-admin): only the overlay.
    assert all(f.parent.name == "gvisor" for f in FILES if any(d["kind"] == "RuntimeClass" for d in docs(f)))


# ------------------------------------------------------------------------ the host pods' exposure

HOST_NS = "codemode"
#: Where the shipped policy lets metrics come from (operators edit it to their monitoring namespace).
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


def host_pod_labels() -> dict[str, str]:
    labels: dict[str, str] = one("Deployment", "codemode", HOST_NS)["spec"]["template"]["metadata"]["labels"]
    return labels


def selects_host_pods(selector: dict[str, Any]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the shipped selectors use labels only
    return bool(selector.get("matchLabels")) and selector["matchLabels"].items() <= host_pod_labels().items()


def container_port(name: str) -> int:
    (c,) = one("Deployment", "codemode", HOST_NS)["spec"]["template"]["spec"]["containers"]
    (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == name]
    return int(port)


def names_port(entry: dict[str, Any], name: str) -> bool:
    """A NetworkPolicy port entry or a Service port that means the container port ``name``."""
    target = entry.get("targetPort", entry.get("port"))
    return target in (name, container_port(name))


def test_metrics_are_not_on_the_mcp_service() -> None:
    # The metrics port has no authentication: the Service tenants reach must not carry it.
    mcp = one("Service", "codemode", HOST_NS)
    assert [p["name"] for p in mcp["spec"]["ports"]] == ["http"]
    assert not any(names_port(p, "metrics") for p in mcp["spec"]["ports"])
    # It has a Service of its own, headless: Prometheus scrapes every pod, not one behind a VIP.
    metrics = one("Service", "codemode-metrics", HOST_NS)
    assert metrics["spec"]["clusterIP"] == "None"
    assert selects_host_pods({"matchLabels": metrics["spec"]["selector"]})
    assert [(p["name"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [("metrics", "metrics")]
    # No other Service in the namespace exposes it.
    for service in find("Service", namespace=HOST_NS):
        if service["metadata"]["name"] != "codemode-metrics":
            assert not any(names_port(p, "metrics") for p in service["spec"]["ports"]), service


def host_policy() -> dict[str, Any]:
    (policy,) = [
        p for p in find("NetworkPolicy", namespace=HOST_NS) if selects_host_pods(p["spec"]["podSelector"])
    ]
    return policy


def test_a_network_policy_covers_the_host_pods_both_ways() -> None:
    spec = host_policy()["spec"]
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    for rule in spec["ingress"] + spec["egress"]:
        # A rule without ports allows every port; one without peers allows every address.
        assert rule.get("ports"), rule
        assert rule.get("from", rule.get("to")), rule


def test_metrics_come_only_from_the_monitoring_namespace() -> None:
    spec = host_policy()["spec"]
    metrics_rules = [r for r in spec["ingress"] if any(names_port(p, "metrics") for p in r["ports"])]
    assert len(metrics_rules) == 1
    (rule,) = metrics_rules
    assert [p["port"] for p in rule["ports"]] == ["metrics"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": MONITORING}}]
    # MCP has its rule; the workers' namespace is not among its sources.
    (mcp,) = [r for r in spec["ingress"] if any(names_port(p, "http") for p in r["ports"])]
    assert [p["port"] for p in mcp["ports"]] == ["http"]
    (peer,) = mcp["from"]
    assert peer == {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [DEFAULT_NAMESPACE]}
            ]
        }
    }


def test_the_host_reaches_dns_and_the_api_server_and_never_the_metadata_address() -> None:
    import ipaddress

    egress = host_policy()["spec"]["egress"]
    dns = {(p["port"], p["protocol"]) for r in egress for p in r["ports"] if p["port"] == 53}
    assert dns == {(53, "UDP"), (53, "TCP")}
    (dns_rule,) = [r for r in egress if any(p["port"] == 53 for p in r["ports"])]
    assert dns_rule["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    api = [r for r in egress if {p["port"] for p in r["ports"]} == {443, 6443}]
    assert len(api) == 1
    # No address block reaches the cloud metadata endpoint (credentials of the node).
    metadata = ipaddress.ip_address("169.254.169.254")
    for rule in egress:
        for peer in rule["to"]:
            if "ipBlock" in peer:
                block = peer["ipBlock"]
                inside = metadata in ipaddress.ip_network(block["cidr"])
                excepted = any(metadata in ipaddress.ip_network(e) for e in block.get("except", []))
                assert not inside or excepted, block
    # The list operators edit is in the file, next to the rules (docs/kubernetes.md explains it).
    text = (K8S / "base" / "host-networkpolicy.yaml").read_text()
    for entry in ("upstream_mcp", "openapi", "jwks_url", "trace collector"):
        assert entry in text, entry


def test_a_disruption_budget_keeps_one_replica_serving() -> None:
    deployment = one("Deployment", "codemode", HOST_NS)
    (pdb,) = find("PodDisruptionBudget", namespace=HOST_NS)
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
    assert "minAvailable" not in pdb["spec"]
    # A pod that is not ready (crash-looping) does not block a node drain.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_replicas_prefer_different_nodes_and_zones() -> None:
    pod = one("Deployment", "codemode", HOST_NS)["spec"]["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]
    # Preferred, not required: on a one-node cluster both replicas still run.
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects_host_pods(term["podAffinityTerm"]["labelSelector"])
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert selects_host_pods(spread["labelSelector"])
