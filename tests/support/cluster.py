"""Finding the real cluster for the Kubernetes e2e suite (tests/e2e_kubernetes/).

The cluster is the one scripts/provision-kubernetes.sh starts on this machine: its admin kubeconfig
(``CODEMODE_KUBECONFIG``, default /var/lib/codemode-k8s/admin.kubeconfig) and the kubectl built
beside it (``CODEMODE_KUBECTL``, default the provisioning cache's). Without a reachable cluster the
suite skips with the reason locally and fails under CI=true.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

K8S_VERSION = os.environ.get("CODEMODE_K8S_VERSION", "1.34.4")
_STATE = os.environ.get("CODEMODE_K8S_STATE", "/var/lib/codemode-k8s")
_LOGS = os.environ.get("CODEMODE_K8S_LOGS", "/var/log/codemode-k8s")
#: Node 1's kubelet seccomp root (``--root-dir`` of scripts/provision-kubernetes.sh + /seccomp):
#: where a ``Localhost`` profile lives. Every node of the cluster runs on this machine.
KUBELET_SECCOMP_ROOT = Path(os.environ.get("CODEMODE_KUBELET_SECCOMP_ROOT", f"{_STATE}/kubelet/root/seccomp"))
#: Node 1's pod log directory (the kubelet's default ``podLogsDir``).
POD_LOGS = Path("/var/log/pods")
KUBECONFIG = os.environ.get("CODEMODE_KUBECONFIG", "/var/lib/codemode-k8s/admin.kubeconfig")
_CACHE = os.environ.get("CODEMODE_CACHE_DIR", "/var/cache/codemode")
REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "tests" / "e2e_kubernetes" / "overlay"
WORKERS = "codemode-workers"
SERVICE_NS = "codemode"
SERVICE_ACCOUNT = f"system:serviceaccount:{SERVICE_NS}:codemode-host"
#: The overlay's test token (its sha256 is in overlay/kustomization.yaml); loopback cluster only.
TOKEN = "codemode-e2e-loopback-only"
WORKER_SELECTOR = "io.codemode.role=worker"
#: ``CODEMODE_E2E_SERVICE_IMAGE``: run the Deployment with this service image instead of the
#: overlay's ``codemode-service:e2e`` (e.g. one built from a branch and imported into every node).
SERVICE_IMAGE = os.environ.get("CODEMODE_E2E_SERVICE_IMAGE", "")


def kubectl_path() -> str:
    explicit = os.environ.get("CODEMODE_KUBECTL")
    if explicit:
        return explicit
    built = Path(_CACHE) / "kubernetes" / f"v{K8S_VERSION}" / "bin" / "kubectl"
    return str(built) if built.exists() else (shutil.which("kubectl") or "kubectl")


def kubectl(*args: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> str:
    cmd = [kubectl_path(), "--kubeconfig", KUBECONFIG, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[3:])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr if not check else proc.stdout


@functools.cache
def cluster_problem() -> str | None:
    """Why the cluster can't be used, or None."""
    if not Path(KUBECONFIG).exists():
        return f"no cluster: {KUBECONFIG} missing (run scripts/provision-kubernetes.sh; CODEMODE_KUBECONFIG)"
    try:
        api = core_api()
        api.list_namespaced_pod("default", limit=1, _request_timeout=5)
    except Exception as exc:
        return f"cluster at {KUBECONFIG} unreachable: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def require_cluster() -> None:
    problem = cluster_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Kubernetes e2e tests are required in CI: {problem}")
    pytest.skip(problem)


@functools.cache
def configuration() -> Any:
    from kubernetes import client, config

    conf = client.Configuration()
    config.load_kube_config(config_file=KUBECONFIG, client_configuration=conf)
    return conf


def core_api() -> Any:
    from kubernetes import client

    return client.CoreV1Api(client.ApiClient(configuration()))


def server_version() -> tuple[int, int]:
    from kubernetes import client

    info = client.VersionApi(client.ApiClient(configuration())).get_code()
    return int(info.major), int("".join(ch for ch in info.minor if ch.isdigit()))


def ready_nodes() -> list[str]:
    """The names of the cluster's Ready, schedulable nodes."""
    names = []
    for node in core_api().list_node().items:
        conditions = {c.type: c.status for c in node.status.conditions or []}
        if conditions.get("Ready") == "True" and not node.spec.unschedulable:
            names.append(node.metadata.name)
    return sorted(names)


def kubelet_seccomp_roots() -> list[Path]:
    """The seccomp root of every node ``scripts/provision-kubernetes.sh`` runs here: node 1's and
    those of the nodes ``up --nodes N`` / ``up-node N`` added (``$STATE/node-<i>/kubelet/root``)."""
    extra = sorted(p / "seccomp" for p in Path(_STATE).glob("node-*/kubelet/root") if p.is_dir())
    return [KUBELET_SECCOMP_ROOT, *extra]


def pod_log_dirs() -> list[Path]:
    """The pod log directory of every node here: node 1's and the added nodes' own
    (``$CODEMODE_K8S_LOGS/node-<i>/pods``, each kubelet's ``podLogsDir``)."""
    return [POD_LOGS, *sorted(p for p in Path(_LOGS).glob("node-*/pods") if p.is_dir())]


def worker_pods() -> list[Any]:
    return list(core_api().list_namespaced_pod(WORKERS, label_selector=WORKER_SELECTOR).items)
