"""k8s/ on a real cluster: the manifests apply, the service image runs as the Deployment and serves
MCP through a loopback port-forward, each execute is one worker pod, the service account has least
privilege, and Pod Security ``restricted`` is enforced on the workers' namespace."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime
from tests.support.cluster import (
    KUBECONFIG,
    REPO,
    SERVICE_ACCOUNT,
    SERVICE_IMAGE,
    SERVICE_NS,
    TOKEN,
    WORKER_SELECTOR,
    WORKERS,
    configuration,
    core_api,
    kubectl,
    kubectl_path,
    server_version,
)
from tests.support.service import call, mcp_client

pytestmark = pytest.mark.kubernetes


def test_k8s_applies_cleanly_as_shipped(deployed: None) -> None:
    # Every object of k8s/ (not the overlay) is accepted by the API server as shipped.
    out = kubectl("apply", "-k", str(REPO / "k8s"), "--dry-run=server")
    kinds = sorted({line.split("/")[0] for line in out.splitlines() if "/" in line})
    assert kinds == sorted(
        [
            "configmap",
            "deployment.apps",
            "namespace",
            "networkpolicy.networking.k8s.io",
            "poddisruptionbudget.policy",
            "resourcequota",
            "role.rbac.authorization.k8s.io",
            "rolebinding.rbac.authorization.k8s.io",
            "service",
            "serviceaccount",
        ]
    ), out
    # The gVisor overlay too (adds the cluster-scoped RuntimeClass).
    gvisor = kubectl("apply", "-k", str(REPO / "k8s" / "overlays" / "gvisor"), "--dry-run=server")
    assert "runtimeclass.node.k8s.io/gvisor" in gvisor and "deployment.apps/codemode" in gvisor, gvisor
    objects = json.loads(
        kubectl("get", "-n", SERVICE_NS, "deployment,service,configmap,serviceaccount", "-o", "json")
    )
    names = {(o["kind"], o["metadata"]["name"]) for o in objects["items"]}
    assert {("Deployment", "codemode"), ("Service", "codemode"), ("ServiceAccount", "codemode-host")} <= names
    policies = kubectl("get", "networkpolicy", "-n", WORKERS, "-o", "name").split()
    assert sorted(policies) == [
        "networkpolicy.networking.k8s.io/codemode-workers-deny-all",
        "networkpolicy.networking.k8s.io/default-deny-all",
    ]


def test_the_deployment_runs_the_local_service_image(deployed: None) -> None:
    pods = core_api().list_namespaced_pod(SERVICE_NS, label_selector="app.kubernetes.io/name=codemode").items
    running = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    assert len(running) == 1
    pod = running[0]
    assert pod.spec.service_account_name == "codemode-host"
    (container,) = pod.spec.containers
    assert (
        container.image == (SERVICE_IMAGE or "codemode-service:e2e")
        and container.image_pull_policy == "Never"
    )
    assert all(cs.ready for cs in pod.status.container_statuses)


#: Run inside the service container: the stdio relay the upstream pack starts, exactly as it starts
#: it (the file, ``python -I``) and with the minimal environment the MCP client gives it.
RELAY_IN_THE_IMAGE = """
import subprocess, sys
from codemode_capabilities.mcp.session import Launch
launch = Launch(upstream="t", owner="host", max_message_bytes=1024, connect_timeout=10,
                command=sys.executable, args=("-I", "-c", "print(6 * 7)"), memory_bytes=1 << 30)
argv = [sys.executable, *launch.relay_argv()]
done = subprocess.run(argv, env={"HOME": "/tmp"}, capture_output=True, timeout=60)
print(done.returncode, done.stdout.decode().strip(), done.stderr.decode().strip())
"""


def test_the_service_image_runs_the_upstream_stdio_relay(deployed: None) -> None:
    out = kubectl("exec", "-n", SERVICE_NS, "deployment/codemode", "--", "python3", "-c", RELAY_IN_THE_IMAGE)
    assert out.split() == ["0", "42"], out


#: Run inside the service container: a Rego policy loads and decides (regopy needs libatomic.so.1),
#: and the worker package carries no test-only entry.
REGO_IN_THE_IMAGE = """
import importlib.util
from codemode.authz import AuthorizationInput, Subject
from codemode.authz.rego import RegoAuthorizer
policy = "package p\\ndefault allow := false\\nallow if input.subject.id == \\"alice\\"\\n"
a = RegoAuthorizer("data.p.allow", {"p.rego": policy})
print(a.decide(AuthorizationInput(Subject("alice"), "x.y", "x.get", {})),
      a.decide(AuthorizationInput(Subject("bob"), "x.y", "x.get", {})),
      importlib.util.find_spec("codemode_worker.testing_entry") is None)
"""


def test_the_service_image_loads_rego_and_has_no_test_entry(deployed: None) -> None:
    out = kubectl("exec", "-n", SERVICE_NS, "deployment/codemode", "--", "python3", "-c", REGO_IN_THE_IMAGE)
    assert out.split() == ["True", "False", "True"], out


@contextlib.contextmanager
def port_forward(target: str = "deployment/codemode", port: int = 8000) -> Iterator[int]:
    """``kubectl port-forward`` of ``target``'s ``port`` (default: the Deployment's 8000) to a free
    loopback port."""
    proc = subprocess.Popen(
        [
            kubectl_path(),
            "--kubeconfig",
            KUBECONFIG,
            "port-forward",
            "-n",
            SERVICE_NS,
            "--address",
            "127.0.0.1",
            target,
            f":{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert found, f"port-forward said: {line!r}"
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining
        yield int(found.group(1))
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


class PodEvents:
    """Worker pod ADDED/DELETED events in the workers' namespace, from a real watch."""

    def __init__(self) -> None:
        from kubernetes import watch

        self.added: set[str] = set()
        self.deleted: set[str] = set()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        api = core_api()
        rv = api.list_namespaced_pod(WORKERS, label_selector=WORKER_SELECTOR).metadata.resource_version
        self._ready.set()
        with contextlib.suppress(Exception):  # the stream is cut by stop()
            for event in self._watch.stream(
                api.list_namespaced_pod,
                WORKERS,
                label_selector=WORKER_SELECTOR,
                resource_version=rv,
                timeout_seconds=120,
            ):
                name = event["object"].metadata.name
                if event["type"] == "ADDED":
                    self.added.add(name)
                elif event["type"] == "DELETED":
                    self.deleted.add(name)

    def stop(self) -> None:
        self._watch.stop()


async def test_mcp_search_describe_execute_through_a_port_forward(deployed: None) -> None:
    events = PodEvents()
    with port_forward() as port:
        url = f"http://127.0.0.1:{port}/mcp"
        async with mcp_client(url, TOKEN) as client:
            found = await call(client, "search_api", query="create a record")
            assert "records.create" in json.dumps(found)
            described = await call(client, "describe_api", name="records.create")
            assert "records.create" in json.dumps(described)
            program = (
                "def main():\n"
                "    r = records.create(title='from a pod')\n"
                "    return records.get(id=r['id'])['title']\n"
            )
            assert await call(client, "execute", source=program) == {"result": "from a pod"}
            assert await call(client, "execute", source="def main():\n    return 6 * 7\n") == {"result": 42}
        async with httpx.AsyncClient(timeout=10) as http:
            refused = await http.post(url, json={}, headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401
    deadline = time.monotonic() + 20
    while (len(events.added) < 2 or events.deleted != events.added) and time.monotonic() < deadline:
        time.sleep(0.2)
    events.stop()
    # Each execute: one worker pod created in the workers namespace, and deleted.
    assert len(events.added) == 2, events.added
    assert events.deleted == events.added


def review(verb: str, resource: str, namespace: str, subresource: str = "") -> bool:
    from kubernetes import client

    body = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=SERVICE_ACCOUNT,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{SERVICE_NS}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, namespace=namespace, subresource=subresource or None
            ),
        )
    )
    api = client.AuthorizationV1Api(client.ApiClient(configuration()))
    return bool(api.create_subject_access_review(body).status.allowed)  # type: ignore[union-attr]


def test_the_service_account_has_least_privilege(deployed: None) -> None:
    # What the runtime needs.
    for verb in ("create", "get", "list", "delete"):
        assert review(verb, "pods", WORKERS), verb
    assert review("create", "pods", WORKERS, "attach") and review("get", "pods", WORKERS, "attach")
    assert review("get", "pods", SERVICE_NS)
    # Nothing else.
    for ns in (WORKERS, SERVICE_NS, "default", "kube-system"):
        assert not review("get", "secrets", ns), ns
        assert not review("list", "secrets", ns), ns
        assert not review("create", "pods", ns, "exec"), ns
        assert not review("get", "pods", ns, "exec"), ns
    for ns in (SERVICE_NS, "default", "kube-system"):
        assert not review("create", "pods", ns), ns
        assert not review("delete", "pods", ns), ns
    assert not review("list", "pods", "")  # no cluster-wide rights
    assert not review("watch", "pods", WORKERS)
    assert not review("update", "pods", WORKERS)
    assert not review("create", "rolebindings", WORKERS)
    # And real attempts with the account's own token (no client certificate): all refused.
    from kubernetes import client
    from kubernetes.stream import stream

    token = kubectl("create", "token", "codemode-host", "-n", SERVICE_NS, "--duration=10m").strip()
    conf = copy.copy(configuration())
    conf.cert_file = conf.key_file = None
    conf.api_key = {"authorization": f"Bearer {token}"}
    as_host = client.CoreV1Api(client.ApiClient(conf))
    as_host.list_namespaced_pod(WORKERS, limit=1)  # what it may do works
    pod = KubernetesRuntime(KubernetesOptions(namespace=SERVICE_NS), api=object()).pod_manifest(
        "codemode-e2e-elsewhere"
    )
    attempts = {
        "read secrets": lambda: as_host.list_namespaced_secret(SERVICE_NS),
        "read secrets (workers)": lambda: as_host.list_namespaced_secret(WORKERS),
        "create a pod outside the workers namespace": lambda: as_host.create_namespaced_pod(
            SERVICE_NS, pod, dry_run="All"
        ),
        "create a pod in default": lambda: as_host.create_namespaced_pod("default", pod, dry_run="All"),
        "list pods cluster-wide": lambda: as_host.list_pod_for_all_namespaces(limit=1),
    }
    for what, attempt in attempts.items():
        with pytest.raises(client.ApiException) as info:
            attempt()
        assert info.value.status == 403, what
    # exec into a pod (the service's own pod): the upgrade is refused.
    (own,) = [
        p.metadata.name
        for p in core_api()
        .list_namespaced_pod(SERVICE_NS, label_selector="app.kubernetes.io/name=codemode")
        .items
        if p.metadata.deletion_timestamp is None
    ]
    with pytest.raises(client.ApiException) as info:
        stream(
            client.CoreV1Api(client.ApiClient(conf)).connect_get_namespaced_pod_exec,
            own,
            SERVICE_NS,
            command=["true"],
            stdout=True,
            stderr=True,
            stdin=False,
            tty=False,
        )
    assert "403" in str(info.value), str(info.value)


def test_pod_security_restricted_is_enforced_on_the_workers_namespace(deployed: None) -> None:
    if server_version() < (1, 25):
        pytest.skip(f"Pod Security admission needs Kubernetes >= 1.25; the cluster is {server_version()}")
    from kubernetes import client

    api = core_api()
    # The runtime's own pod is admitted (server-side dry run: full admission, nothing created).
    pod = KubernetesRuntime(KubernetesOptions(namespace=WORKERS), api=object()).pod_manifest(
        "codemode-e2e-admitted"
    )
    api.create_namespaced_pod(WORKERS, pod, dry_run="All")
    # A root pod is rejected by Pod Security admission.
    root = client.V1Pod(
        metadata=client.V1ObjectMeta(name="codemode-e2e-root"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="c",
                    image="codemode-worker:1",
                    image_pull_policy="Never",
                    security_context=client.V1SecurityContext(run_as_user=0, run_as_non_root=False),
                )
            ]
        ),
    )
    with pytest.raises(client.ApiException) as info:
        api.create_namespaced_pod(WORKERS, root)
    assert info.value.status == 403
    body = str(info.value.body)
    assert "violates PodSecurity" in body and "restricted" in body
