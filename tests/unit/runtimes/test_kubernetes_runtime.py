"""KubernetesRuntime against the official client's interfaces, without a cluster.

The REST side is a fake CoreV1Api that behaves like the real one at the boundary: every call is
checked against the real ``CoreV1Api`` method signature, it stores and returns
``kubernetes.client.models`` objects, and it raises ``ApiException`` with real status codes and
Status bodies. The attach side is real: the runtime calls the real ``kubernetes.stream.stream`` on
a real ``CoreV1Api`` whose host is a local websocket server speaking the Kubernetes channel
protocol (``v5.channel.k8s.io``: 1-byte channel prefix, binary messages); the fake worker behind it
speaks the codemode wire protocol. What this cannot show (a real API server, kubelet, admission,
NetworkPolicy enforcement) is listed in docs/kubernetes.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import hashlib
import inspect
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from codemode.common.errors import ResourceLimit, client_text
from codemode.runtimes import kubernetes as kmod
from codemode.runtimes.base import CapacityExhausted, ExitInfo, RuntimeUnavailable, SpawnFailed
from codemode.runtimes.kubernetes import (
    INSTANCE_LABEL,
    OWNER_LABEL,
    ROLE_LABEL,
    KubernetesOptions,
    KubernetesRuntime,
    KubernetesSandbox,
)
from codemode.runtimes.kubernetes import _attach as kattach
from codemode.runtimes.kubernetes import _orphans as korphans
from codemode.service.app import _sweep as app_sweep
from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import FrameDecoder, encode_frame

NS = "codemode-workers"
HOST_NS = "codemode"

# ----------------------------------------------------------------------------------- fake worker


class WorkerConn:
    """Server side of one attach websocket: the fake worker's stdio (kubelet/API-server framing)."""

    def __init__(self, sock: socket.socket, path: str, query: dict[str, list[str]], headers: dict[str, str]):
        self.sock = sock
        self.path = path
        self.query = query
        self.headers = headers
        self.closed_channels: list[int] = []
        self._lock = threading.Lock()

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def recv_stdin(self) -> bytes | None:
        """The next stdin payload from the host; None when the stream ends."""
        try:
            while True:
                b0, b1 = self._exact(2)
                opcode, n = b0 & 0x0F, b1 & 0x7F
                if n == 126:
                    n = int.from_bytes(self._exact(2), "big")
                elif n == 127:
                    n = int.from_bytes(self._exact(8), "big")
                mask = self._exact(4) if b1 & 0x80 else b"\0\0\0\0"
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(self._exact(n)))
                if opcode == 0x8:
                    return None
                if opcode != 0x2:
                    continue
                if data[0] == 255:
                    self.closed_channels.append(data[1])
                    continue
                assert data[0] == 0, "the host writes on the stdin channel only"
                return data[1:]
        except (EOFError, OSError):
            return None

    def send(self, channel: int, payload: bytes, opcode: int = 0x2) -> None:
        data = bytes([channel]) + payload
        n = len(data)
        if n < 126:
            head = bytes([0x80 | opcode, n])
        elif n < 65536:
            head = bytes([0x80 | opcode, 126]) + n.to_bytes(2, "big")
        else:
            head = bytes([0x80 | opcode, 127]) + n.to_bytes(8, "big")
        with self._lock:
            self.sock.sendall(head + data)

    def close(self) -> None:
        if self._lock.acquire(timeout=0.2):  # a sender blocked on back-pressure holds it
            with contextlib.suppress(OSError):
                self.sock.sendall(bytes([0x88, 2]) + (1000).to_bytes(2, "big"))
            self._lock.release()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


Behavior = Callable[[WorkerConn], "tuple[int, str] | None"]


def probing_worker(after: Callable[[WorkerConn], tuple[int, str] | None] | None = None) -> Behavior:
    """Answers the probe like the real worker, then runs ``after`` (default: echo stdin on stdout)."""

    def run(conn: WorkerConn) -> tuple[int, str] | None:
        decoder = FrameDecoder(1 << 20)
        while True:
            data = conn.recv_stdin()
            if data is None:
                return None
            frames = decoder.feed(data)
            if frames:
                assert frames[0] == {"k": "probe", "v": PROTOCOL_VERSION}
                conn.send(1, encode_frame({"k": "probe_ack", "v": PROTOCOL_VERSION}))
                break
        if after is not None:
            return after(conn)
        while (data := conn.recv_stdin()) is not None:
            conn.send(1, data)
        return None

    return run


def _until_eof(sock: socket.socket) -> bool:
    """Whether the client closes its side within 5 s (everything it sends is discarded)."""
    sock.settimeout(5.0)
    try:
        while sock.recv(4096):
            pass
        return True
    except OSError:
        return False
    finally:
        sock.close()


class AttachServer:
    """A local websocket endpoint for ``.../pods/<name>/attach`` (what the API server proxies)."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[WorkerConn] = []
        self.refuse: int | None = None  # HTTP status to refuse the upgrade with
        #: (status, Status message) refusing attaches without stdin (the runtime's node check),
        #: as the API server does when it cannot dial the node's kubelet.
        self.refuse_without_stdin: tuple[int, str] | None = None
        self.refuse_in_handshake = False  # as API servers before 1.30 do
        #: Refusals for the next attaches, in order: ("handshake", body) answers the upgrade with
        #: 500 and that body (an API server proxying to the kubelet); ("channel", message) accepts
        #: it and sends a Failure Status with that message on the error channel (the API server's
        #: websocket translator, 1.30+). Each refused client must close its socket (``hung_up``).
        self.refusals: list[tuple[str, str]] = []
        self.hung_up: list[bool] = []
        self.subprotocol = "v5.channel.k8s.io"
        self.conns: dict[str, WorkerConn] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(4096)
            if not chunk:
                return
            raw += chunk
        lines = raw.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        target = lines[0].split(" ")[1]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        url = urllib.parse.urlsplit(target)
        conn = WorkerConn(sock, url.path, urllib.parse.parse_qs(url.query), headers)
        self.requests.append(conn)
        if self.refuse is not None:
            sock.sendall(f"HTTP/1.1 {self.refuse} Forbidden\r\nContent-Length: 0\r\n\r\n".encode())
            sock.close()
            return
        node_refusal = self.refuse_without_stdin
        check = conn.query.get("stdin", ["false"])[0].lower() != "true"
        if check and node_refusal is not None and self.refuse_in_handshake:
            body = json.dumps(
                {"kind": "Status", "status": "Failure", "message": node_refusal[1], "code": node_refusal[0]}
            )
            sock.sendall(
                f"HTTP/1.1 {node_refusal[0]} Internal Server Error\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            sock.close()
            return
        refusal = self.refusals.pop(0) if self.refusals and not check else None
        silent = self._node_of(url.path) in self.cluster.silent_nodes
        if refusal is None and silent:
            # A worker attach to a pod on a dead node: the API server cannot dial its kubelet.
            refusal = (
                "channel",
                f'error sending request: Post "https://node:11250/attach": dial tcp: {url.path}',
            )
        if refusal is not None and refusal[0] == "handshake":
            payload = refusal[1].encode()
            sock.sendall(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            self.hung_up.append(_until_eof(sock))
            return
        accept = base64.b64encode(
            hashlib.sha1(
                (headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()
            ).digest()
        ).decode()
        sock.sendall(
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {self.subprotocol}\r\n\r\n"
            ).encode()
        )
        if check and node_refusal is not None:
            # The API server (1.30+) takes the websocket, then reports its failure to dial the
            # node's kubelet on the error channel (measured on 1.34 with the kubelet killed).
            status = {
                "metadata": {},
                "status": "Failure",
                "message": node_refusal[1],
                "code": node_refusal[0],
            }
            conn.send(3, json.dumps(status).encode())
            conn.close()
            return
        if refusal is not None:
            for channel in (1, 2, 3):  # the channels' opening messages, then the Status
                conn.send(channel, b"")
            status = {"metadata": {}, "status": "Failure", "message": refusal[1], "code": 500}
            conn.send(3, json.dumps(status).encode())
            sock.sendall(bytes([0x88, 2]) + (1000).to_bytes(2, "big"))
            self.hung_up.append(_until_eof(sock))
            return
        pod = url.path.split("/")[-2]
        self.conns[pod] = conn
        try:
            result = self.cluster.behavior(conn)
        except Exception:
            result = None
        if result is not None:
            self.cluster.terminate(pod, *result)
        conn.close()

    def close(self) -> None:
        self.listener.close()

    def _node_of(self, path: str) -> str | None:
        """The node the pod an attach names is bound to (None: not bound, or no such pod)."""
        with self.cluster.api.lock:
            pod = self.cluster.api.pods.get((NS, path.split("/")[-2]))
            return None if pod is None or pod.spec is None else pod.spec.node_name


# ----------------------------------------------------------------------------------- fake REST API


def api_error(status: int, reason: str, message: str = "") -> k8s.ApiException:
    exc = k8s.ApiException(status=status, reason=reason)
    exc.body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message or reason,
            "code": status,
        }
    )
    return exc


class FakeCoreV1Api:
    """The CoreV1Api calls the runtime makes, with the real API's types, statuses and signatures."""

    def __init__(self, cluster: FakeCluster, attach_host: str) -> None:
        self.cluster = cluster
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.errors: dict[str, list[BaseException]] = {}
        self.pods: dict[tuple[str, str], k8s.V1Pod] = {}
        self.lock = threading.Lock()
        conf = k8s.Configuration()
        conf.host = attach_host
        self.api_client = k8s.ApiClient(conf)
        self._real = k8s.CoreV1Api(self.api_client)
        self.connect_get_namespaced_pod_attach = self._real.connect_get_namespaced_pod_attach

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        # Only parameters the real method accepts, bound the way the real method binds them.
        inspect.signature(getattr(k8s.CoreV1Api, name)).bind(self._real, *args, **kwargs)
        with self.lock:
            self.calls.append((name, args, kwargs))
            queue = self.errors.get(name)
            if queue:
                raise queue.pop(0)

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(a, k) for n, a, k in self.calls if n == name]

    def create_namespaced_pod(self, namespace: str, body: k8s.V1Pod, **kwargs: Any) -> k8s.V1Pod:
        self._call("create_namespaced_pod", namespace, body, **kwargs)
        assert isinstance(body, k8s.V1Pod)
        pod = copy.deepcopy(body)
        assert pod.metadata is not None and pod.metadata.name
        with self.lock:
            if (namespace, pod.metadata.name) in self.pods:
                raise api_error(409, "Conflict", f'pods "{pod.metadata.name}" already exists')
            pod.metadata.namespace = namespace
            pod.metadata.uid = f"uid-{pod.metadata.name}"
            pod.metadata.creation_timestamp = datetime.datetime.now(datetime.UTC)
            pod.status = k8s.V1PodStatus(phase="Pending")
            self.pods[(namespace, pod.metadata.name)] = pod
            self.cluster.created.append(copy.deepcopy(body))
        return copy.deepcopy(pod)

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> k8s.V1Pod:
        self._call("read_namespaced_pod", name, namespace, **kwargs)
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise api_error(404, "Not Found", f'pods "{name}" not found')
            self.cluster.advance(pod)
            return copy.deepcopy(pod)

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> k8s.V1PodList:
        self._call("list_namespaced_pod", namespace, **kwargs)
        wanted = dict(part.split("=", 1) for part in (kwargs.get("label_selector") or "").split(",") if part)
        with self.lock:
            items = [
                copy.deepcopy(p)
                for (ns, _), p in sorted(self.pods.items())
                if ns == namespace and all((p.metadata.labels or {}).get(k) == v for k, v in wanted.items())  # type: ignore[union-attr]
            ]
        limit = kwargs.get("limit")
        return k8s.V1PodList(items=items[:limit] if limit else items, metadata=k8s.V1ListMeta())

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> k8s.V1Pod:
        self._call("delete_namespaced_pod", name, namespace, **kwargs)
        with self.lock:
            pod = self.pods.pop((namespace, name), None)
        if pod is None:
            raise api_error(404, "Not Found", f'pods "{name}" not found')
        conn = self.cluster.server.conns.get(name)
        if conn is not None:  # the kubelet kills the container: its streams end
            conn.close()
        return pod


class FakeCluster:
    def __init__(self) -> None:
        self.created: list[k8s.V1Pod] = []
        self.behavior: Behavior = probing_worker()
        self.run_after_reads: int | None = 1  # None: the pod never runs
        self.waiting_reason = "ContainerCreating"
        self.reads: dict[str, int] = {}
        self.crash_on_read: tuple[int, str] | None = None  # the container exits before it runs
        #: The nodes pods are bound to, first one a pod's affinity allows (empty: pods get no node).
        self.nodes: list[str] = []
        #: Nodes whose kubelet is gone: pods bound there are never acknowledged (no startTime).
        self.silent_nodes: set[str] = set()
        self.node_name: str | None = None  # set: the pod is bound to this node from the first read
        self.server = AttachServer(self)
        self.api = FakeCoreV1Api(self, f"http://127.0.0.1:{self.server.port}")

    def advance(self, pod: k8s.V1Pod) -> None:
        """What the scheduler and kubelet would have done by now (called under the API lock)."""
        assert pod.metadata is not None and pod.status is not None
        name = pod.metadata.name or ""
        self.reads[name] = self.reads.get(name, 0) + 1
        if pod.status.phase != "Pending":
            return
        if self.nodes and not self._bind(pod):
            return
        if self.node_name is not None:
            assert pod.spec is not None
            pod.spec.node_name = self.node_name
            pod.status.start_time = pod.status.start_time or datetime.datetime.now()  # the kubelet has it
        if self.crash_on_read is not None:
            self._set_terminated(pod, *self.crash_on_read)
            return
        if self.run_after_reads is not None and self.reads[name] > self.run_after_reads:
            pod.status.phase = "Running"
            state = k8s.V1ContainerState(
                running=k8s.V1ContainerStateRunning(started_at=datetime.datetime.now())
            )
        else:
            state = k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason=self.waiting_reason))
        pod.status.container_statuses = [
            k8s.V1ContainerStatus(
                name="worker",
                image="codemode-worker:1",
                image_id="",
                ready=False,
                restart_count=0,
                state=state,
            )
        ]

    def _bind(self, pod: k8s.V1Pod) -> bool:
        """The scheduler and the node's kubelet: False while the pod is not taken on."""
        assert pod.spec is not None and pod.status is not None
        if pod.spec.node_name is None:
            avoided: list[str] = []
            if pod.spec.affinity is not None:
                (term,) = (
                    pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms  # type: ignore[union-attr]
                )
                ((off,),) = [term.match_fields or []]
                assert (off.key, off.operator) == ("metadata.name", "NotIn")
                avoided = off.values or []
            allowed = [n for n in self.nodes if n not in avoided]
            if not allowed:
                pod.status.conditions = [
                    k8s.V1PodCondition(
                        type="PodScheduled",
                        status="False",
                        reason="Unschedulable",
                        message="0/2 nodes are available: 2 node(s) didn't match Pod's node affinity",
                    )
                ]
                return False
            pod.spec.node_name = allowed[0]
            pod.status.conditions = None
        if pod.spec.node_name in self.silent_nodes:
            return False
        pod.status.start_time = pod.status.start_time or datetime.datetime.now(datetime.UTC)
        return True

    def terminate(self, pod_name: str, exit_code: int, reason: str) -> None:
        with self.api.lock:
            pod = self.api.pods.get((NS, pod_name))
            if pod is not None:
                self._set_terminated(pod, exit_code, reason)

    @staticmethod
    def _set_terminated(pod: k8s.V1Pod, exit_code: int, reason: str) -> None:
        assert pod.status is not None
        pod.status.phase = "Succeeded" if exit_code == 0 else "Failed"
        pod.status.container_statuses = [
            k8s.V1ContainerStatus(
                name="worker",
                image="codemode-worker:1",
                image_id="",
                ready=False,
                restart_count=0,
                state=k8s.V1ContainerState(
                    terminated=k8s.V1ContainerStateTerminated(exit_code=exit_code, reason=reason)
                ),
            )
        ]


@pytest.fixture
def cluster() -> Any:
    c = FakeCluster()
    yield c
    c.server.close()


def make_runtime(cluster: FakeCluster, **kwargs: Any) -> KubernetesRuntime:
    kwargs.setdefault("owner", "host-a")
    kwargs.setdefault("spawn_timeout", 5.0)
    kwargs.setdefault("probe_timeout", 5.0)
    kwargs.setdefault("exit_wait", 1.0)
    return KubernetesRuntime(KubernetesOptions(**kwargs), api=cluster.api)


def serialized(obj: Any) -> Any:
    """What the client puts on the wire (camelCase JSON, no nulls)."""
    return k8s.ApiClient().sanitize_for_serialization(obj)


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


# ----------------------------------------------------------------------------------- the pod


def expected_pod_spec(runtime_class: str | None = None) -> dict[str, Any]:
    limits = {"cpu": "1", "ephemeral-storage": "64Mi", "memory": "256Mi"}
    requests = {"cpu": "100m", "ephemeral-storage": "64Mi", "memory": "256Mi"}
    spec: dict[str, Any] = {
        "activeDeadlineSeconds": 3600,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "env": [
                    {"name": "CODEMODE_WORKER", "value": "1"},
                    {"name": "CODEMODE_WORKER_STDERR", "value": "bounded"},
                ],
                "image": "codemode-worker:1",
                "imagePullPolicy": "IfNotPresent",
                "name": "worker",
                "resources": {"limits": limits, "requests": requests},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "runAsGroup": 65532,
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                },
                "stdin": True,
                "stdinOnce": True,
                "tty": False,
                "volumeMounts": [
                    {"mountPath": "/tmp", "name": "empty", "readOnly": True},
                    {"mountPath": "/dev/shm", "name": "empty", "readOnly": True},
                ],
                "workingDir": "/",
            }
        ],
        "dnsConfig": {"nameservers": ["127.0.0.1"]},
        "dnsPolicy": "None",
        "enableServiceLinks": False,
        "hostIPC": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostname": "worker",
        "restartPolicy": "Never",
        "securityContext": {
            "runAsGroup": 65532,
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "shareProcessNamespace": False,
        "terminationGracePeriodSeconds": 1,
        # Spread over the nodes by count, every worker of the namespace; never a reason to wait.
        "topologySpreadConstraints": [
            {
                "labelSelector": {"matchLabels": {"io.codemode.role": "worker"}},
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
        "volumes": [{"emptyDir": {"medium": "Memory", "sizeLimit": "4Ki"}, "name": "empty"}],
    }
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
    return spec


async def test_submitted_pod_is_exactly_the_hardened_spec(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    await sandbox.destroy()
    (pod,) = cluster.created
    assert isinstance(pod, k8s.V1Pod)
    wire = serialized(pod)
    assert wire["apiVersion"] == "v1" and wire["kind"] == "Pod"
    assert wire["spec"] == expected_pod_spec()
    meta = wire["metadata"]
    assert meta["namespace"] == NS
    assert meta["name"].startswith("codemode-worker-")
    assert meta["labels"] == {
        ROLE_LABEL: "worker",
        OWNER_LABEL: "host-a",
        INSTANCE_LABEL: rt.instance_id,
        "io.codemode.protocol-version": str(PROTOCOL_VERSION),
    }
    assert meta["annotations"]["io.codemode.owner-pid"] == str(os.getpid())
    (args, kwargs) = cluster.api.called("create_namespaced_pod")[0]
    assert args[0] == NS and kwargs["_request_timeout"] == rt.options.api_timeout
    await rt.aclose()


def test_runtime_class_is_optional() -> None:
    api = object()
    assert "runtimeClassName" not in serialized(KubernetesRuntime(api=api).pod_manifest("p"))["spec"]
    rt = KubernetesRuntime(
        KubernetesOptions(
            runtime_class="gvisor", memory="512Mi", cpu="500m", ephemeral_storage="16Mi", image="w:1"
        ),
        api=api,
    )
    spec = serialized(rt.pod_manifest("p"))["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert rt.name == "kubernetes:gvisor"
    q = {"cpu": "500m", "ephemeral-storage": "16Mi", "memory": "512Mi"}
    assert spec["containers"][0]["resources"] == {"limits": q, "requests": {**q, "cpu": "100m"}}
    # cpu_request == cpu: QoS Guaranteed.
    rt = KubernetesRuntime(KubernetesOptions(cpu="500m", cpu_request="500m"), api=api)
    resources = serialized(rt.pod_manifest("p"))["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    with pytest.raises(ValueError, match="cpu_request"):
        KubernetesRuntime(KubernetesOptions(cpu="500m", cpu_request="1"), api=api)
    assert spec["containers"][0]["image"] == "w:1"


@pytest.mark.parametrize("version", ["1.30", "latest"])
def test_pod_manifest_validates_against_the_pod_schema(version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.utils.latest_version()
    pod = serialized(
        KubernetesRuntime(KubernetesOptions(runtime_class="gvisor"), api=object()).pod_manifest(
            "codemode-worker-x"
        )
    )
    kubernetes_validate.validate(pod, version, strict=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"namespace": "Bad_NS"},
        {"memory": "lots"},
        {"cpu": "0"},
        {"ephemeral_storage": "-1Mi"},
        {"runtime_class": "g visor"},
        {"owner": "not a label value"},
        {"cleanup_orphans": "some"},
        {"max_lifetime": 0},
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        KubernetesRuntime(KubernetesOptions(**kwargs), api=object())


# ----------------------------------------------------------------------------------- attach and I/O


async def test_attach_parameters_probe_and_binary_roundtrip(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    assert isinstance(sandbox, KubernetesSandbox)
    name = sandbox.pod_name
    assert sandbox.worker_id == f"k8s-{name}"
    (req,) = cluster.server.requests
    assert req.path == f"/api/v1/namespaces/{NS}/pods/{name}/attach"
    assert {k: v[0].lower() for k, v in req.query.items()} == {
        "container": "worker",
        "stdin": "true",
        "stdout": "true",
        "stderr": "true",
        "tty": "false",
    }
    assert "v5.channel.k8s.io" in req.headers["sec-websocket-protocol"]
    # The pod was running before the attach (first read Pending, second Running).
    assert cluster.reads[name] == 2
    # Bytes survive both ways: NUL, 0xff, invalid UTF-8, more than one websocket message.
    payload = bytes(range(256)) * 600 + b"\xff\xfe\x00\xc3("
    await sandbox.write(payload)
    got = b""
    while len(got) < len(payload):
        chunk = await asyncio.wait_for(sandbox.read(1 << 20), 5)
        assert chunk
        got += chunk
    assert got == payload
    assert sandbox.alive()
    info = await sandbox.destroy()
    assert info == ExitInfo(exit_code=137, signal=9, oom_killed=False, stderr_tail=b"")
    assert not sandbox.alive()
    assert await sandbox.read(10) == b""
    await rt.aclose()


async def test_small_frames_go_out_on_the_loop_thread_large_ones_on_the_pool(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    assert isinstance(sandbox, KubernetesSandbox)
    senders: list[int] = []
    original = sandbox._stream.write_stdin

    def recording(data: bytes) -> None:
        senders.append(threading.get_ident())
        original(data)

    sandbox._stream.write_stdin = recording
    loop_thread = threading.get_ident()
    for size in (1, 4096, 4097, 200_000):
        senders.clear()
        await sandbox.write(b"y" * size)
        got = b""
        while len(got) < size:
            got += await asyncio.wait_for(sandbox.read(1 << 20), 5)
        assert got == b"y" * size
        on_loop = all(ident == loop_thread for ident in senders)
        assert on_loop == (size <= 4096), (size, senders)
    await sandbox.destroy()
    await rt.aclose()


@pytest.mark.timeout(60)  # a blocked loop cannot fail the test itself: it would hang here
@pytest.mark.parametrize(
    ("notsent_lowat", "worker_ends_first"), [(None, False), (16384, False), (None, True)]
)
async def test_a_worker_that_stops_reading_never_blocks_the_loop(
    cluster: FakeCluster, notsent_lowat: int | None, worker_ends_first: bool
) -> None:
    """Small writes normally go out on the loop's thread; once a worker stops reading its stdin and
    the socket fills (or its not-sent limit is reached: TCP_NOTSENT_LOWAT, set by some tuning
    guides), they must take the pool, so the loop goes on serving everything else."""
    stop = threading.Event()

    def deaf(conn: WorkerConn) -> None:
        conn.recv_stdin()  # takes the first frame, then never reads again
        stop.wait(30)
        return None

    cluster.behavior = probing_worker(deaf)
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    assert isinstance(sandbox, KubernetesSandbox)
    if notsent_lowat is not None:
        sandbox._ws.sock.setsockopt(socket.IPPROTO_TCP, kattach._TCP_NOTSENT_LOWAT, notsent_lowat)
        assert not kattach._has_room(sandbox._ws.sock, 4096)  # unsent bytes are capped far below it
    await sandbox.write(b"go")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.ensure_future(ticker())
    frame = b"z" * 4096

    async def flood() -> None:
        while True:
            await sandbox.write(frame)

    flooding = asyncio.ensure_future(flood())
    try:
        # The socket fills (megabytes on loopback), a write then waits in the pool: the loop ticks on.
        await asyncio.sleep(3)
        before = ticks
        await asyncio.sleep(0.5)
        assert ticks - before >= 10
        assert not flooding.done()
    finally:
        flooding.cancel()
        ticking.cancel()
        if worker_ends_first:  # its side of the stream closes while a pool thread is blocked sending
            stop.set()
            await asyncio.sleep(0.5)
        await sandbox.destroy()
        # Destroy also frees the pool thread blocked sending to the deaf worker (else it would hang
        # there for good, and interpreter exit with it: seen once in CI).
        await wait_until(lambda: not _threads_in(kmod.KubernetesSandbox._send.__code__))
        stop.set()
        await rt.aclose()


def _threads_in(code: Any) -> list[int]:
    """Threads whose current stack runs ``code``."""
    found = []
    for ident, frame in sys._current_frames().items():
        f: Any = frame
        while f is not None:
            if f.f_code is code:
                found.append(ident)
                break
            f = f.f_back
    return found


async def test_close_input_sends_the_v5_close_signal(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    await sandbox.close_input()
    conn = next(iter(cluster.server.conns.values()))
    await wait_until(lambda: conn.closed_channels == [0])
    with pytest.raises(kmod.SandboxClosed):
        await sandbox.write(b"x")
    await sandbox.destroy()
    await rt.aclose()


async def test_v4_has_no_half_close_but_refuses_writes(cluster: FakeCluster) -> None:
    cluster.server.subprotocol = "v4.channel.k8s.io"
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    await sandbox.close_input()
    with pytest.raises(kmod.SandboxClosed):
        await sandbox.write(b"x")
    await sandbox.destroy()
    assert next(iter(cluster.server.conns.values())).closed_channels == []
    await rt.aclose()


async def test_stdout_is_bounded_when_the_host_does_not_read(cluster: FakeCluster) -> None:
    sent = threading.Event()

    def flood(conn: WorkerConn) -> None:
        conn.recv_stdin()
        with contextlib.suppress(OSError):
            for _ in range(400):  # 400 x 32 KiB = 12.5 MiB offered
                conn.send(1, b"x" * 32768)
        sent.set()
        return None

    cluster.behavior = probing_worker(flood)
    rt = make_runtime(cluster, stdout_buffer_bytes=64 * 1024)
    sandbox = await rt.spawn()
    await sandbox.write(b"go")
    await asyncio.sleep(0.5)
    with sandbox._cond:
        buffered = len(sandbox._out)
    assert 0 < buffered <= 64 * 1024 + 32768
    assert not sent.is_set()  # the worker is blocked on back-pressure
    info = await sandbox.destroy()
    assert info.exit_code == 137
    await rt.aclose()


async def test_stderr_is_kept_as_a_bounded_tail(cluster: FakeCluster) -> None:
    def noisy(conn: WorkerConn) -> tuple[int, str]:
        conn.send(2, b"a" * 10000 + b"Traceback: boom")
        return (1, "Error")

    cluster.behavior = probing_worker(noisy)
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    assert await asyncio.wait_for(sandbox.read(100), 5) == b""
    info = await sandbox.destroy()
    assert info.exit_code == 1 and info.signal is None and not info.oom_killed
    assert info.stderr_tail.endswith(b"Traceback: boom") and len(info.stderr_tail) == kmod.STDERR_TAIL
    await rt.aclose()


# ----------------------------------------------------------------------------------- destroy


async def test_destroy_deletes_exactly_once_with_grace_zero(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    infos = await asyncio.gather(*(sandbox.destroy() for _ in range(5)))
    assert await sandbox.destroy() is infos[0]
    assert all(i is infos[0] for i in infos)
    deletes = cluster.api.called("delete_namespaced_pod")
    assert len(deletes) == 1
    args, kwargs = deletes[0]
    assert args == (sandbox.pod_name, NS) and kwargs["grace_period_seconds"] == 0
    assert cluster.api.pods == {}
    assert rt.live_sandboxes() == []
    await rt.aclose()
    assert len(cluster.api.called("delete_namespaced_pod")) == 1


async def test_destroy_when_the_pod_is_already_gone(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    cluster.api.errors["delete_namespaced_pod"] = [api_error(404, "Not Found")]
    info = await sandbox.destroy()
    assert info.exit_code is None and info.signal is None
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    assert sandbox.deleted
    await sandbox.destroy()
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    cluster.api.pods.clear()
    await rt.aclose()


async def test_destroy_retries_a_conflict_then_deletes_once(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    cluster.api.errors["delete_namespaced_pod"] = [
        api_error(409, "Conflict", "the object has been modified"),
        api_error(503, "Service Unavailable"),
    ]
    info = await sandbox.destroy()
    assert info.exit_code == 137
    assert len(cluster.api.called("delete_namespaced_pod")) == 3  # two failed attempts, one delete
    assert cluster.api.pods == {}
    await sandbox.destroy()
    assert len(cluster.api.called("delete_namespaced_pod")) == 3
    await rt.aclose()


async def test_destroy_gives_up_on_a_permanent_error_without_raising(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    cluster.api.errors["delete_namespaced_pod"] = [api_error(403, "Forbidden")]
    info = await sandbox.destroy()
    assert info.exit_code is None
    assert not sandbox.deleted
    await rt.aclose()  # the sweep deletes the leftover of this runtime object
    assert cluster.api.pods == {}


@pytest.mark.parametrize(
    ("exit_code", "reason", "oom", "signal"),
    [(137, "OOMKilled", True, 9), (0, "Completed", False, None), (3, "Error", False, None)],
)
async def test_exit_state_is_read_when_the_worker_ended(
    cluster: FakeCluster, exit_code: int, reason: str, oom: bool, signal: int | None
) -> None:
    def ends(conn: WorkerConn) -> tuple[int, str]:
        conn.recv_stdin()
        return (exit_code, reason)

    cluster.behavior = probing_worker(ends)
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    await sandbox.write(b"go")
    assert await asyncio.wait_for(sandbox.read(10), 5) == b""
    assert not sandbox.alive()
    info = await sandbox.destroy()
    assert (info.exit_code, info.oom_killed, info.signal) == (exit_code, oom, signal)
    assert info.resource_killed is oom
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    assert cluster.api.pods == {}
    await rt.aclose()


async def test_stream_lost_but_pod_still_running_is_killed(cluster: FakeCluster) -> None:
    def drop(conn: WorkerConn) -> None:
        return None  # the connection drops; the container keeps running

    cluster.behavior = probing_worker(drop)
    rt = make_runtime(cluster, exit_wait=0.2)
    sandbox = await rt.spawn()
    assert await asyncio.wait_for(sandbox.read(10), 5) == b""
    info = await sandbox.destroy()
    assert (info.exit_code, info.signal, info.oom_killed) == (137, 9, False)
    await rt.aclose()


# ----------------------------------------------------------------------------------- spawn failures


async def test_spawn_timeout_when_the_pod_never_runs(cluster: FakeCluster) -> None:
    cluster.run_after_reads = None
    rt = make_runtime(cluster, spawn_timeout=0.4)
    start = time.monotonic()
    with pytest.raises(SpawnFailed, match=r"not running after 0\.4s: container waiting: ContainerCreating"):
        await rt.spawn()
    assert time.monotonic() - start < 2.0
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    assert cluster.api.pods == {}
    assert cluster.server.requests == []
    await rt.aclose()


async def test_unschedulable_pod_is_a_resource_limit_with_an_operator_log(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.run_after_reads = None
    rt = make_runtime(cluster, spawn_timeout=30.0, unschedulable_grace=0.2)
    orig = cluster.advance

    def unschedulable(pod: k8s.V1Pod) -> None:
        orig(pod)
        assert pod.status is not None
        pod.status.container_statuses = None
        pod.status.conditions = [
            k8s.V1PodCondition(
                type="PodScheduled", status="False", reason="Unschedulable", message="0/3 nodes"
            )
        ]

    cluster.advance = unschedulable  # type: ignore[method-assign]
    t0 = time.monotonic()
    with pytest.raises(CapacityExhausted) as info:
        await rt.spawn()
    assert time.monotonic() - t0 < 15.0  # the grace (0.2 s), not the spawn timeout (30 s)
    assert isinstance(info.value, SpawnFailed) and isinstance(info.value, ResourceLimit)
    assert str(info.value) == "resource limit exceeded"
    assert client_text(info.value) == "resource limit exceeded: concurrency"
    assert "not scheduled: Unschedulable: 0/3 nodes" in info.value.reason
    assert "no node has room for worker pod" in caplog.text and "cpu_request" in caplog.text
    assert cluster.api.pods == {}
    await rt.aclose()


async def test_image_pull_backoff_is_runtime_unavailable(cluster: FakeCluster) -> None:
    cluster.run_after_reads = None
    cluster.waiting_reason = "ImagePullBackOff"
    rt = make_runtime(cluster)
    with pytest.raises(RuntimeUnavailable, match="worker image 'codemode-worker:1' unavailable"):
        await rt.spawn()
    assert cluster.api.pods == {}
    await rt.aclose()


async def test_pod_that_ends_before_attach_fails_the_spawn(cluster: FakeCluster) -> None:
    cluster.crash_on_read = (1, "Error")
    rt = make_runtime(cluster)
    with pytest.raises(SpawnFailed, match=r"ended before attach: phase Failed, container exited 1 \(Error\)"):
        await rt.spawn()
    assert cluster.api.pods == {}
    await rt.aclose()


@pytest.mark.parametrize(
    ("error", "expected", "match"),
    [
        (
            api_error(403, "Forbidden", 'pods "x" is forbidden: violates PodSecurity "restricted:latest"'),
            RuntimeUnavailable,
            "violates PodSecurity",
        ),
        (
            api_error(
                403, "Forbidden", 'pods "x" is forbidden: pod rejected: RuntimeClass "gvisor" not found'
            ),
            RuntimeUnavailable,
            "RuntimeClass",
        ),
        (
            api_error(403, "Forbidden", 'pods "x" is forbidden: exceeded quota: workers, requested: pods=1'),
            CapacityExhausted,
            "quota exhausted",
        ),
        (
            api_error(404, "Not Found", 'namespaces "codemode-workers" not found'),
            RuntimeUnavailable,
            "not found",
        ),
        (api_error(422, "Unprocessable Entity", "Pod is invalid"), RuntimeUnavailable, "Pod is invalid"),
        (api_error(500, "Internal Server Error", "etcdserver: timeout"), SpawnFailed, "etcdserver"),
    ],
)
async def test_create_refusals_are_classified(
    cluster: FakeCluster, error: Exception, expected: type[Exception], match: str
) -> None:
    cluster.api.errors["create_namespaced_pod"] = [error]
    rt = make_runtime(cluster)
    with pytest.raises(expected) as info:
        await rt.spawn()
    assert re.search(match, getattr(info.value, "reason", None) or str(info.value))
    status = getattr(error, "status", 0)
    # A 4xx refusal created nothing: nothing to delete. A 5xx may have: delete by name (404 is fine).
    assert len(cluster.api.called("delete_namespaced_pod")) == (0 if status < 500 else 1)
    await rt.aclose()


QUOTA_CONFLICT = (
    'Operation cannot be fulfilled on resourcequotas "codemode-workers": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


async def test_a_quota_conflict_on_create_is_retried(cluster: FakeCluster) -> None:
    # Concurrent creates in a namespace with a ResourceQuota race on the quota's usage; the API
    # server refuses the loser with 409 although nothing is wrong (seen under the 20-client load).
    cluster.api.errors["create_namespaced_pod"] = [api_error(409, "Conflict", QUOTA_CONFLICT)] * 2
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    assert len(cluster.api.called("create_namespaced_pod")) == 3
    assert len(cluster.api.pods) == 1
    await sandbox.destroy()
    await rt.aclose()


async def test_a_lasting_quota_conflict_fails_the_spawn(cluster: FakeCluster) -> None:
    cluster.api.errors["create_namespaced_pod"] = [api_error(409, "Conflict", QUOTA_CONFLICT)] * 10
    rt = make_runtime(cluster)
    with pytest.raises(SpawnFailed, match="resourcequotas"):
        await rt.spawn()
    assert len(cluster.api.called("create_namespaced_pod")) == kmod.CREATE_CONFLICT_RETRIES + 1
    assert cluster.api.pods == {}
    await rt.aclose()


async def test_attach_forbidden_is_runtime_unavailable_and_the_pod_deleted(cluster: FakeCluster) -> None:
    cluster.server.refuse = 403
    rt = make_runtime(cluster)
    with pytest.raises(RuntimeUnavailable, match="cannot attach"):
        await rt.spawn()
    assert cluster.api.pods == {}
    await rt.aclose()


# ----------------------------------------------------------------------------------- early attach

POD = "codemode-worker-0123456789abcdef"
# The exact texts measured on Kubernetes 1.34.4 (docs/kubernetes.md, "Start-up phases").
NOT_FOUND = f"container worker not found in pod {POD}_{NS}"
TRANSLATED = f"Internal error occurred: unable to upgrade connection: {NOT_FOUND}"
HANDSHAKE = (
    "Handshake status 500 Internal Server Error -+-+- {'content-type': 'text/plain'} -+-+- "
    f"unable to upgrade connection: {NOT_FOUND}"
)
UNSCHEDULED = (
    "Handshake status 400 Bad Request -+-+- {} -+-+- "
    f'{{"kind":"Status","message":"pod {POD} does not have a host assigned","code":400}}'
)


@pytest.mark.parametrize(
    ("refusal", "retried"),
    [
        (TRANSLATED, True),  # the kubelet, through the API server's websocket translator
        (HANDSHAKE, True),  # the kubelet's answer as the handshake's body
        (UNSCHEDULED, True),  # the API server, before the scheduler bound the pod
        ("Internal error occurred: unable to upgrade connection: pod does not exist", True),
        # Anything else is not "not running yet":
        (f"unable to upgrade connection: container sidecar not found in pod {POD}_{NS}", False),
        (f"unable to upgrade connection: container worker not found in pod {POD}x_{NS}", False),
        (f"unable to upgrade connection: container worker not found in pod other_{NS}", False),
        (f"unable to upgrade connection: container worker not found in pod {POD}_default", False),
        ("pod codemode-worker-other does not have a host assigned", False),
        ("Handshake status 403 Forbidden", False),
        ("unable to upgrade connection: Forbidden (user=system:anonymous)", False),
        (
            "Internal error occurred: error attaching to container: container is in CONTAINER_EXITED state",
            False,
        ),
        ("", False),
    ],
)
def test_only_the_exact_not_running_yet_refusals_are_retried(refusal: str, retried: bool) -> None:
    assert kmod.not_running_yet(refusal, POD, NS) is retried


def starting(cluster: FakeCluster, reads_until_running: int | None) -> None:
    """The pod is bound to a node at once; the API reports it Running only after that many reads."""
    cluster.node_name = "node-1"
    cluster.run_after_reads = reads_until_running


def refusals(cluster: FakeCluster, form: str, n: int) -> None:
    """The next ``n`` attaches are refused with the kubelet's "not running yet" for the pod created
    (its name is known only at create)."""
    make = cluster.api.create_namespaced_pod

    def create(namespace: str, body: k8s.V1Pod, **kwargs: Any) -> k8s.V1Pod:
        pod = make(namespace, body, **kwargs)
        assert pod.metadata is not None
        text = f"unable to upgrade connection: container worker not found in pod {pod.metadata.name}_{NS}"
        if form == "channel":
            text = f"Internal error occurred: {text}"
        cluster.server.refusals = [(form, text)] * n
        return pod

    cluster.api.create_namespaced_pod = create  # type: ignore[method-assign]


@pytest.mark.parametrize("form", ["channel", "handshake"])
async def test_attach_starts_before_the_api_reports_running_and_loses_no_frame(
    cluster: FakeCluster, form: str
) -> None:
    starting(cluster, None)  # the API never reports Running: only the attach can find the container
    refusals(cluster, form, 3)
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    name = sandbox.pod_name
    assert rt.last_attach_attempts == 4  # three refusals, then the container
    assert len(cluster.server.requests) == 4
    await wait_until(lambda: len(cluster.server.hung_up) >= 3, timeout=10)  # the server sees the close
    assert cluster.server.hung_up == [True, True, True]  # every refused websocket closed
    assert list(rt.last_phases) == ["created", "scheduled", "attached"]
    assert cluster.api.pods[(NS, name)].status.phase == "Pending"  # type: ignore[union-attr]
    # The worker got the probe once (it asserts its first frame is the probe) and nothing else:
    # what the host writes next is exactly what comes back.
    await sandbox.write(b"after the probe")
    got = b""
    while len(got) < 15:
        got += await asyncio.wait_for(sandbox.read(100), 5)
    assert got == b"after the probe"
    await sandbox.destroy()
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    assert cluster.api.pods == {}
    await rt.aclose()


async def test_without_attach_early_the_attach_waits_for_running(cluster: FakeCluster) -> None:
    starting(cluster, 3)
    rt = make_runtime(cluster, attach_early=False)
    sandbox = await rt.spawn()
    assert rt.last_attach_attempts == 1
    assert cluster.reads[sandbox.pod_name] == 4
    assert list(rt.last_phases) == ["created", "scheduled", "running", "attached"]
    await sandbox.destroy()
    await rt.aclose()


async def test_refusals_that_never_end_fail_at_the_spawn_timeout(cluster: FakeCluster) -> None:
    starting(cluster, None)
    refusals(cluster, "channel", 10_000)
    rt = make_runtime(cluster, spawn_timeout=0.6)
    t0 = time.monotonic()
    with pytest.raises(SpawnFailed, match=r"not running after 0\.6s: attach refused: .*not found in pod"):
        await rt.spawn()
    assert time.monotonic() - t0 < 3.0
    assert 2 <= rt.last_attach_attempts <= 30  # one per read, 25-100 ms apart
    await wait_until(lambda: len(cluster.server.hung_up) == rt.last_attach_attempts)
    assert all(cluster.server.hung_up)
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    assert cluster.api.pods == {}
    await rt.aclose()


async def test_an_unknown_refusal_of_a_starting_pod_waits_for_running(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    starting(cluster, 3)
    cluster.server.refusals = [("channel", "Internal error occurred: something new")]
    rt = make_runtime(cluster)
    sandbox = await rt.spawn()
    assert rt.last_attach_attempts == 2  # the refused one, then one once the API said Running
    assert "running" in rt.last_phases
    assert "attaching once it runs" in caplog.text and "something new" in caplog.text
    await sandbox.destroy()
    await rt.aclose()


async def test_an_unknown_refusal_of_a_running_pod_fails_the_spawn(cluster: FakeCluster) -> None:
    starting(cluster, 0)
    cluster.server.refusals = [("channel", "Internal error occurred: something new")]
    rt = make_runtime(cluster)
    with pytest.raises(SpawnFailed, match="was refused: Internal error occurred: something new"):
        await rt.spawn()
    assert rt.last_attach_attempts == 1
    await wait_until(lambda: len(cluster.server.hung_up) >= 1, timeout=10)  # the server sees the close
    assert cluster.server.hung_up == [True]
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    assert cluster.api.pods == {}
    await rt.aclose()


async def spawn_while_refused(cluster: FakeCluster, form: str) -> tuple[KubernetesRuntime, Any]:
    """A spawn whose attaches are refused ("not running yet") for ever, after its second attempt."""
    starting(cluster, None)
    refusals(cluster, form, 10_000)
    rt = make_runtime(cluster, spawn_timeout=30)
    task = asyncio.create_task(rt.spawn())
    await wait_until(lambda: len(cluster.server.requests) >= 2)
    return rt, task


async def test_a_pod_that_ends_while_refused_fails_the_spawn(cluster: FakeCluster) -> None:
    rt, task = await spawn_while_refused(cluster, "channel")
    cluster.crash_on_read = (1, "Error")
    with pytest.raises(SpawnFailed, match=r"ended before attach: phase Failed, container exited 1"):
        await task
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    assert cluster.api.pods == {}
    await rt.aclose()


async def test_a_spawn_cancelled_while_refused_deletes_its_pod_once(cluster: FakeCluster) -> None:
    rt, task = await spawn_while_refused(cluster, "handshake")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: not cluster.api.pods)
    attempts = len(cluster.server.requests)
    await asyncio.sleep(0.3)
    assert len(cluster.server.requests) == attempts  # no attempt after the cancel was noticed
    await wait_until(lambda: len(cluster.server.hung_up) == attempts)
    assert all(cluster.server.hung_up)
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    await rt.aclose()


async def test_a_worker_that_never_answers_the_attach_fails_within_the_probe_timeout(
    cluster: FakeCluster,
) -> None:
    starting(cluster, None)

    def silent(conn: WorkerConn) -> None:
        while conn.recv_stdin() is not None:
            pass

    cluster.behavior = silent
    rt = make_runtime(cluster, probe_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(SpawnFailed, match=r"did not answer within 0\.5s"):
        await rt.spawn()
    assert time.monotonic() - t0 < 3.0
    assert rt.last_attach_attempts == 1  # the attach may have reached it: never retried
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    await rt.aclose()


@pytest.mark.parametrize("answer", [b"garbage!", None])
async def test_bad_probe_answer_fails_the_spawn_and_deletes(
    cluster: FakeCluster, answer: bytes | None
) -> None:
    def bad(conn: WorkerConn) -> tuple[int, str]:
        conn.recv_stdin()
        if answer is not None:
            conn.send(1, encode_frame({"k": "final", "value": 1}))
        return (2, "Error")

    cluster.behavior = bad
    rt = make_runtime(cluster)
    with pytest.raises(SpawnFailed):
        await rt.spawn()
    assert cluster.api.pods == {}
    assert len(cluster.api.called("delete_namespaced_pod")) == 1
    await rt.aclose()


async def test_cancelled_spawn_deletes_its_pod(cluster: FakeCluster) -> None:
    cluster.run_after_reads = None
    rt = make_runtime(cluster, spawn_timeout=30)
    task = asyncio.create_task(rt.spawn())
    await wait_until(lambda: bool(cluster.api.pods))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: not cluster.api.pods)
    await rt.aclose()


async def test_attach_uses_its_own_api_client(cluster: FakeCluster) -> None:
    # kubernetes.stream swaps call_api on the ApiClient it is given; REST calls made by other threads
    # on that client meanwhile would turn into websocket requests. The runtime never shares it.
    method = kattach._attach_method(cluster.api)
    bound: Any = method
    assert bound.__self__.api_client is not cluster.api.api_client
    assert bound.__self__.api_client.configuration is cluster.api.api_client.configuration
    rt = make_runtime(cluster)
    boxes = await asyncio.gather(*(rt.spawn() for _ in range(4)))
    assert len({b.pod_name for b in boxes}) == 4
    assert cluster.api.api_client.call_api.__func__ is k8s.ApiClient.call_api  # type: ignore[attr-defined]
    await asyncio.gather(*(b.destroy() for b in boxes))
    assert cluster.api.pods == {}
    await rt.aclose()


# ----------------------------------------------------------------------------------- check


async def test_check_lists_one_pod(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    await rt.check()
    ((args, kwargs),) = cluster.api.called("list_namespaced_pod")
    assert args == (NS,) and kwargs["limit"] == 1
    await rt.aclose()


@pytest.mark.parametrize(
    ("status", "match"),
    [
        (403, r'pods is forbidden: User "system:serviceaccount:codemode:codemode-host" cannot list.*RBAC'),
        (401, "credentials rejected"),
    ],
)
async def test_check_refused(cluster: FakeCluster, status: int, match: str) -> None:
    cluster.api.errors["list_namespaced_pod"] = [
        api_error(
            status,
            "Forbidden",
            'pods is forbidden: User "system:serviceaccount:codemode:codemode-host" cannot list pods',
        )
    ]
    rt = make_runtime(cluster)
    with pytest.raises(RuntimeUnavailable, match=match):
        await rt.check()
    await rt.aclose()


@pytest.fixture
def stalled_upgrade(cluster: FakeCluster) -> Any:
    """Attaches go to an endpoint that accepts the TCP connection and never answers the upgrade
    (an API server, proxy or load balancer that stalls it); closing it at the end frees them."""
    stall = socket.create_server(("127.0.0.1", 0))
    conf = k8s.Configuration()
    conf.host = f"http://127.0.0.1:{stall.getsockname()[1]}"
    cluster.api.connect_get_namespaced_pod_attach = k8s.CoreV1Api(
        k8s.ApiClient(conf)
    ).connect_get_namespaced_pod_attach
    yield stall
    stall.close()


def test_the_node_check_is_bounded_when_the_api_stalls_the_upgrade(
    cluster: FakeCluster, stalled_upgrade: socket.socket
) -> None:
    # Review attack: the client's websocket connect has no timeout, and _request_timeout does not
    # reach it (_preload_content=False). Before: the check's thread was still blocked after 8 s.
    rt = make_runtime(cluster, api_timeout=1.0)
    done = threading.Event()
    result: list[str | None] = []

    def check() -> None:
        result.append(rt._kubelet_unreachable_blocking("codemode-worker-x"))
        done.set()

    threading.Thread(target=check, daemon=True).start()
    assert done.wait(8.0), "the node check was still blocked"
    assert result == [None]  # no word from the API server: nothing is suspected


async def test_a_worker_attach_whose_upgrade_stalls_fails_the_spawn_after_api_timeout(
    cluster: FakeCluster, stalled_upgrade: socket.socket
) -> None:
    rt = make_runtime(cluster, api_timeout=1.0, spawn_timeout=30.0)
    try:
        with pytest.raises(SpawnFailed, match=r"did not complete the websocket upgrade within 1\.0s"):
            await asyncio.wait_for(rt.spawn(), 10.0)
        assert cluster.api.pods == {}  # the pod was deleted
    finally:
        stalled_upgrade.close()
        await rt.aclose()


async def test_an_attach_stream_reads_without_a_timeout_once_upgraded(cluster: FakeCluster) -> None:
    # The upgrade's bound is cleared after it: a worker that is quiet longer than api_timeout
    # does not break its stream.
    rt = make_runtime(cluster, api_timeout=0.5)
    sandbox = await rt.spawn()
    assert sandbox._stream.sock.gettimeout() is None
    assert sandbox._stream.sock.sock.gettimeout() is None
    await asyncio.sleep(1.0)
    await sandbox.write(b"ping")
    assert await asyncio.wait_for(sandbox.read(4), 5) == b"ping"
    await sandbox.destroy()
    await rt.aclose()


def test_the_upgrade_bound_applies_to_its_own_thread_only() -> None:
    from kubernetes.stream import ws_client

    from codemode.runtimes.kubernetes import upgrade as kubernetes_upgrade

    seen: dict[str, Any] = {}

    def other() -> None:
        seen["other"] = getattr(kubernetes_upgrade._local, "seconds", None)

    with kubernetes_upgrade.bounded_upgrade(2.0):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        seen["own"] = kubernetes_upgrade._local.seconds
    assert seen == {"other": None, "own": 2.0}
    assert getattr(kubernetes_upgrade._local, "seconds", None) is None
    assert getattr(ws_client.WebSocket, "_codemode_bounded", False)  # type: ignore[attr-defined]


def real_api(host: str) -> k8s.CoreV1Api:
    conf = k8s.Configuration()
    conf.host = host
    return k8s.CoreV1Api(k8s.ApiClient(conf))


async def test_unreachable_api_is_runtime_unavailable_fast() -> None:
    # The real client against a port nobody listens on.
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    rt = KubernetesRuntime(api=real_api(f"https://127.0.0.1:{port}"))
    start = time.monotonic()
    with pytest.raises(RuntimeUnavailable, match=rf"unreachable at https://127.0.0.1:{port}"):
        await rt.check()
    with pytest.raises(RuntimeUnavailable, match="unreachable"):
        await rt.spawn()
    with pytest.raises(RuntimeUnavailable, match="unreachable"):
        await rt.start()
    assert time.monotonic() - start < 3.0
    await rt.aclose()


async def test_hung_api_is_runtime_unavailable_within_check_timeout() -> None:
    # Accepts connections, never answers.
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        rt = KubernetesRuntime(KubernetesOptions(check_timeout=0.5), api=real_api(f"http://127.0.0.1:{port}"))
        start = time.monotonic()
        with pytest.raises(RuntimeUnavailable, match=r"did not answer within 0.5s|unreachable"):
            await rt.check()
        assert time.monotonic() - start < 2.0
        await rt.aclose()


# ----------------------------------------------------------------------------------- orphans


def worker_pod(name: str, owner: str, **annotations: str) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=NS,
            uid=f"uid-{name}",
            labels={ROLE_LABEL: "worker", OWNER_LABEL: owner},
            annotations={f"io.codemode.owner-{k.replace('_', '-')}": v for k, v in annotations.items()},
        ),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="worker", image="codemode-worker:1")]),
        status=k8s.V1PodStatus(phase="Running"),
    )


def host_pod(name: str, uid: str, phase: str = "Running") -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace=HOST_NS, uid=uid),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="host", image="codemode-service:0.1")]),
        status=k8s.V1PodStatus(phase=phase),
    )


@pytest.fixture
def me(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This host runs in pod codemode/host-1 (uid u1), in another pid namespace than any pod below."""
    owner = korphans._OWNER
    monkeypatch.setattr(owner, "pod", f"{HOST_NS}/host-1")
    monkeypatch.setattr(owner, "pod_uid", "u1")
    return owner


def seed_orphans(cluster: FakeCluster, me: Any) -> None:
    pods = cluster.api.pods
    other_ns = {"boot": me.boot, "pidns": "pid:[1]", "host": "host-x"}
    for p in [
        worker_pod("mine", "host-a", pod=f"{HOST_NS}/host-1", pod_uid="u1"),
        # another replica, alive
        worker_pod("replica-alive", "o2", pod=f"{HOST_NS}/host-2", pod_uid="u2", **other_ns),
        # owner pod deleted
        worker_pod("replica-gone", "o3", pod=f"{HOST_NS}/host-3", pod_uid="u3", **other_ns),
        # owner pod name reused by a new pod (StatefulSet)
        worker_pod("replica-replaced", "o4", pod=f"{HOST_NS}/host-4", pod_uid="u4-old", **other_ns),
        # owner pod finished
        worker_pod("replica-failed", "o5", pod=f"{HOST_NS}/host-5", pod_uid="u5", **other_ns),
        # our own pod, an earlier container (restart): another pid namespace
        worker_pod("restarted", "o6", pod=f"{HOST_NS}/host-1", pod_uid="u1", **other_ns),
        # same boot and pid namespace: a dead pid, and a live one (this process)
        worker_pod("same-ns-dead", "o7", boot=me.boot, pidns=me.pidns, pid="999999999", start="1"),
        worker_pod("same-ns-alive", "o8", boot=me.boot, pidns=me.pidns, pid=str(me.pid), start=me.start),
        # same pid namespace, pid reused by another process
        worker_pod("same-ns-reused", "o9", boot=me.boot, pidns=me.pidns, pid=str(me.pid), start="1"),
        # unknown owner (no annotations): can't judge
        worker_pod("unknown", "o10"),
        # owner pod in a namespace we may not read
        worker_pod("forbidden", "o11", pod="elsewhere/host-9", pod_uid="u9", **other_ns),
    ]:
        pods[(NS, str(p.metadata.name))] = p  # type: ignore[union-attr]
    for p in [host_pod("host-1", "u1"), host_pod("host-2", "u2"), host_pod("host-4", "u4-new")]:
        pods[(HOST_NS, str(p.metadata.name))] = p  # type: ignore[union-attr]
    pods[(HOST_NS, "host-5")] = host_pod("host-5", "u5", phase="Failed")
    not_a_worker = worker_pod("not-a-worker", "o12")
    not_a_worker.metadata.labels = {"app": "other"}  # type: ignore[union-attr]
    pods[(NS, "not-a-worker")] = not_a_worker


async def test_start_deletes_only_pods_whose_owner_is_provably_dead(cluster: FakeCluster, me: Any) -> None:
    seed_orphans(cluster, me)
    real_read = cluster.api.read_namespaced_pod

    def read(name: str, namespace: str, **kwargs: Any) -> k8s.V1Pod:
        if namespace == "elsewhere":
            raise api_error(403, "Forbidden", "cannot get pods in elsewhere")
        return real_read(name, namespace, **kwargs)

    cluster.api.read_namespaced_pod = read  # type: ignore[method-assign]
    rt = make_runtime(cluster)
    await rt.start()
    left = sorted(name for ns, name in cluster.api.pods if ns == NS)
    assert left == [
        "forbidden",
        "mine",
        "not-a-worker",
        "replica-alive",
        "same-ns-alive",
        "unknown",
    ]
    assert rt.orphans_removed == 6
    (args, kwargs) = cluster.api.called("list_namespaced_pod")[0]
    assert args == (NS,) and kwargs["label_selector"] == f"{ROLE_LABEL}=worker"
    for args, kwargs in cluster.api.called("delete_namespaced_pod"):
        assert args[1] == NS and kwargs["grace_period_seconds"] == 0
    await rt.aclose()


def at(hms: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(f"2026-12-01T{hms}+00:00")


def running(name: str, since: str) -> k8s.V1ContainerStatus:
    state = k8s.V1ContainerState(running=k8s.V1ContainerStateRunning(started_at=at(since)))
    return k8s.V1ContainerStatus(name=name, image="i", image_id="", ready=True, restart_count=0, state=state)


def waiting(name: str, reason: str = "CrashLoopBackOff", ended: str | None = None) -> k8s.V1ContainerStatus:
    """Not running; ``ended``: the previous instance's end (``lastState.terminated.finishedAt``)."""
    state = k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason=reason))
    last = None
    if ended is not None:
        done = k8s.V1ContainerStateTerminated(exit_code=137, started_at=at("09:59:00"), finished_at=at(ended))
        last = k8s.V1ContainerState(terminated=done)
    return k8s.V1ContainerStatus(
        name=name, image="i", image_id="", ready=False, restart_count=1, state=state, last_state=last
    )


def terminated(name: str, ended: str) -> k8s.V1ContainerStatus:
    done = k8s.V1ContainerStateTerminated(exit_code=137, started_at=at("09:59:00"), finished_at=at(ended))
    state = k8s.V1ContainerState(terminated=done)
    return k8s.V1ContainerStatus(name=name, image="i", image_id="", ready=False, restart_count=0, state=state)


async def test_another_replica_judges_a_restarted_host_container_dead(cluster: FakeCluster, me: Any) -> None:
    # A host container SIGKILLed and restarted by the kubelet: the same pod (same uid), but no
    # container of it can be the process that made the worker pod (it started at owner-started).
    other_ns = {"boot": me.boot, "pidns": "pid:[1]", "host": "h"}
    cases = {
        # name: (containers of the owner pod, owner-started of the worker pod, deleted?)
        "restarted": ([running("host", "10:00:05")], "2026-12-01T10:00:01Z", True),
        "same-instance": ([running("host", "10:00:01")], "2026-12-01T10:00:01Z", False),
        # Not running, and the instance that ended did so at or after owner-started: the owner.
        "crash-looping": ([waiting("host", ended="10:00:04")], "2026-12-01T10:00:01Z", True),
        "ended": ([terminated("host", "10:00:01")], "2026-12-01T10:00:01Z", True),
        "sidecar-restarted": (
            [running("host", "10:00:00"), running("proxy", "10:00:09")],
            "2026-12-01T10:00:01Z",
            False,
        ),
        "older-host": ([running("host", "10:00:05")], "", False),  # no owner-started: can't tell
        "no-status-yet": ([], "2026-12-01T10:00:01Z", False),
    }
    pods = cluster.api.pods
    for i, (name, (containers, started, _)) in enumerate(cases.items()):
        owner = host_pod(f"owner-{i}", f"ou{i}")
        owner.status.container_statuses = containers  # type: ignore[union-attr]
        pods[(HOST_NS, f"owner-{i}")] = owner
        extra = {"started": started} if started else {}
        w = worker_pod(name, f"o{i}", pod=f"{HOST_NS}/owner-{i}", pod_uid=f"ou{i}", **other_ns, **extra)
        pods[(NS, name)] = w
    rt = make_runtime(cluster)
    assert await rt.remove_orphans() == 3
    left = {name for ns, name in pods if ns == NS}
    assert left == {name for name, (_, _, deleted) in cases.items() if not deleted}
    await rt.aclose()


def owned_by_a_live_pod(
    cluster: FakeCluster, me: Any, containers: list[k8s.V1ContainerStatus], started: str
) -> k8s.V1Pod:
    """Worker pod "w", made at ``started`` by a host in the live pod codemode/owner (uid ou, in
    another pid namespace) whose containers are ``containers``; returns that owner pod."""
    owner = host_pod("owner", "ou")
    owner.status.container_statuses = containers  # type: ignore[union-attr]
    cluster.api.pods[(HOST_NS, "owner")] = owner
    other_ns = {"boot": me.boot, "pidns": "pid:[1]", "host": "h"}
    when = f"2026-12-01T{started}Z"
    w = worker_pod("w", "o1", pod=f"{HOST_NS}/owner", pod_uid="ou", started=when, **other_ns)
    cluster.api.pods[(NS, "w")] = w
    return owner


@pytest.mark.parametrize(
    "status",
    [
        # First start: the kubelet has not reported the container running yet (its relist and
        # status manager lag the container's real start by ~1 s, more on a loaded node).
        waiting("host", reason="ContainerCreating"),
        # The previous instance's crash, still what the API shows, while the new instance (the
        # owner, started after that crash) already runs and has made worker pods.
        waiting("host", ended="10:00:00"),
        terminated("host", "10:00:00"),
    ],
    ids=["first-start", "restart", "stale-terminated"],
)
async def test_a_live_owner_whose_status_lags_keeps_its_workers(
    cluster: FakeCluster, me: Any, status: k8s.V1ContainerStatus
) -> None:
    owned_by_a_live_pod(cluster, me, [status], started="10:00:03")
    rt = make_runtime(cluster)
    try:
        assert await rt.remove_orphans() == 0
        assert (NS, "w") in cluster.api.pods
    finally:
        await rt.aclose()


async def test_a_finished_init_container_does_not_keep_a_dead_owner_alive(
    cluster: FakeCluster, me: Any
) -> None:
    # Init containers that ran to completion before the host container never run again: only the
    # pod's containers and its restartable (sidecar) init containers can be the owner.
    owner = owned_by_a_live_pod(cluster, me, [running("host", "10:00:05")], started="10:00:01")
    owner.spec.init_containers = [  # type: ignore[union-attr]
        k8s.V1Container(name="setup", image="i"),
        k8s.V1Container(name="proxy", image="i", restart_policy="Always"),
    ]
    owner.status.init_container_statuses = [terminated("setup", "09:59:30"), running("proxy", "09:59:31")]  # type: ignore[union-attr]
    rt = make_runtime(cluster)
    try:
        # The sidecar still runs since before owner-started: it may be the owner (left alone).
        assert await rt.remove_orphans() == 0
        owner.status.init_container_statuses[1] = running("proxy", "10:00:06")  # type: ignore[union-attr]
        assert await rt.remove_orphans() == 1  # the finished "setup" container is no owner
        assert (NS, "w") not in cluster.api.pods
    finally:
        await rt.aclose()


async def test_replicas_without_the_downward_api_sharing_a_host_name_keep_each_others_workers(
    cluster: FakeCluster, me: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without POD_NAME/POD_UID a host knows its pod only by its host name: with spec.hostname set
    # (every replica the same name) or hostNetwork (the node's name, no such pod: 404) that name
    # proves nothing, so a worker pod recorded without an owner uid is never judged by its pod.
    monkeypatch.setattr(me, "pod", f"{HOST_NS}/codemode")  # spec.hostname: codemode
    monkeypatch.setattr(me, "pod_uid", "")
    monkeypatch.setattr(me, "host", "codemode")
    other_ns = {"boot": me.boot, "pidns": "pid:[1]", "host": "codemode"}
    live = {"started": "2026-12-01T10:00:03Z", **other_ns}
    pods = cluster.api.pods
    pods[(NS, "peer-busy")] = worker_pod("peer-busy", "o1", pod=f"{HOST_NS}/codemode", pod_uid="", **live)
    pods[(NS, "peer-hostnet")] = worker_pod("peer-hostnet", "o2", pod=f"{HOST_NS}/node-2", pod_uid="", **live)
    # The judge has no uid, the owner had one: its pod is looked up and found alive.
    pods[(HOST_NS, "codemode")] = host_pod("codemode", "u7")
    pods[(HOST_NS, "codemode")].status.container_statuses = [running("host", "10:00:00")]  # type: ignore[union-attr]
    pods[(NS, "peer-uid")] = worker_pod("peer-uid", "o3", pod=f"{HOST_NS}/codemode", pod_uid="u7", **live)
    # A provably dead owner with a uid is still removed, and the same-pid-namespace rule still works.
    pods[(NS, "dead-uid")] = worker_pod("dead-uid", "o4", pod=f"{HOST_NS}/gone", pod_uid="u8", **live)
    pods[(NS, "dead-pid")] = worker_pod(
        "dead-pid", "o5", boot=me.boot, pidns=me.pidns, pid="999999999", start="1"
    )
    rt = make_runtime(cluster)
    try:
        for sweep in (rt.start, lambda: rt.remove_orphans(proven_only=True)):
            await sweep()
            assert sorted(n for ns, n in pods if ns == NS) == ["peer-busy", "peer-hostnet", "peer-uid"]
    finally:
        await rt.aclose()


async def test_the_host_name_rule_runs_at_start_only(
    cluster: FakeCluster, me: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside Kubernetes, "the same host name in another pid namespace" means "this host was
    # restarted" only at this host's start; a live peer with the same host name (host networking)
    # would otherwise lose its worker pods to every periodic sweep (service/app.py _sweep).
    monkeypatch.setattr(me, "pod", "")
    monkeypatch.setattr(me, "pod_uid", "")
    peer = {"boot": me.boot, "pidns": "pid:[4026539999]", "host": me.host, "pid": "1", "start": "5"}
    cluster.api.pods[(NS, "peer")] = worker_pod("peer", "o1", **peer)
    rt = make_runtime(cluster)
    try:
        sweeping = asyncio.create_task(app_sweep(rt, 0.01))
        await wait_until(lambda: len(cluster.api.called("list_namespaced_pod")) >= 3)
        sweeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeping
        assert (NS, "peer") in cluster.api.pods
        await rt.start()  # the restarted host's own start-up: the documented guess applies
        assert (NS, "peer") not in cluster.api.pods
    finally:
        await rt.aclose()


def test_the_owner_started_annotation_is_at_or_after_this_process_start(me: Any) -> None:
    # The rule's soundness: a container running this process started no later than it says.
    ann = korphans._OWNER.annotations()
    started = datetime.datetime.strptime(ann["io.codemode.owner-started"], "%Y-%m-%dT%H:%M:%SZ")
    btime = next(
        int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime")
    )
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    process_start = btime + ticks / os.sysconf("SC_CLK_TCK")
    assert started.replace(tzinfo=datetime.UTC).timestamp() >= process_start - 1  # btime: whole seconds
    assert started.replace(tzinfo=datetime.UTC).timestamp() <= time.time() + 1


async def test_cleanup_all_and_none(cluster: FakeCluster, me: Any) -> None:
    seed_orphans(cluster, me)
    rt = make_runtime(cluster, cleanup_orphans="none")
    await rt.start()
    assert cluster.api.calls == []
    await rt.aclose()
    rt = make_runtime(cluster, cleanup_orphans="all")
    await rt.start()
    assert sorted(name for ns, name in cluster.api.pods if ns == NS) == ["mine", "not-a-worker"]
    assert cluster.api.called("read_namespaced_pod") == []
    await rt.aclose()


async def test_aclose_destroys_live_sandboxes(cluster: FakeCluster) -> None:
    rt = make_runtime(cluster)
    boxes = [await rt.spawn() for _ in range(2)]
    await rt.aclose()
    assert all(b.exit_info is not None for b in boxes)
    assert cluster.api.pods == {}
    with pytest.raises(RuntimeUnavailable):
        await rt.spawn()


# ----------------------------------------------------------------------------------- real client, real HTTP


class RecordingApiServer:
    """A local HTTP server answering the REST calls the way the API server would (canned)."""

    def __init__(self) -> None:
        import http.server

        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body: Any = json.loads(self.rfile.read(length)) if length else None
                outer.requests.append((self.command, url.path, urllib.parse.parse_qs(url.query), body))
                if self.command == "POST":
                    status, reply = 201, {**body, "status": {"phase": "Pending"}}
                elif self.command == "GET" and url.path.endswith("/pods"):
                    status, reply = 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}
                else:
                    message = 'pods "x" not found'
                    status, reply = (
                        404,
                        {"kind": "Status", "status": "Failure", "message": message, "code": 404},
                    )
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_requests_on_the_wire_with_the_real_client() -> None:
    """The runtime's keyword arguments pass the real client's validation and become these requests."""
    server = RecordingApiServer()
    try:
        rt = KubernetesRuntime(KubernetesOptions(owner="host-a", spawn_timeout=1.0), api=real_api(server.url))
        await rt.check()
        with pytest.raises(SpawnFailed, match="vanished while starting"):
            await rt.spawn()  # created (201), then the read says 404
        assert rt._delete_blocking("codemode-worker-x") == "gone"
        assert rt._terminated_blocking("codemode-worker-x") == ("gone", None)
        await rt.start()
        await rt.aclose()
    finally:
        server.close()
    base = f"/api/v1/namespaces/{NS}/pods"
    (method, path, query, _) = server.requests[0]
    assert (method, path, query) == ("GET", base, {"labelSelector": [f"{ROLE_LABEL}=worker"], "limit": ["1"]})
    (method, path, query, body) = server.requests[1]
    assert (method, path) == ("POST", base)
    assert body == serialized(rt.pod_manifest(body["metadata"]["name"])) | {"metadata": body["metadata"]}
    assert body["spec"] == expected_pod_spec()
    name = body["metadata"]["name"]
    assert server.requests[2][:2] == ("GET", f"{base}/{name}")
    (method, path, query, _) = server.requests[3]  # the failed spawn deletes its pod
    assert (method, path, query) == ("DELETE", f"{base}/{name}", {"gracePeriodSeconds": ["0"]})
    assert ("DELETE", f"{base}/codemode-worker-x", {"gracePeriodSeconds": ["0"]}, None) in server.requests
    assert (
        "GET",
        base,
        {"labelSelector": [f"{ROLE_LABEL}=worker"], "limit": ["500"]},
        None,
    ) in server.requests


def test_service_settings_select_the_kubernetes_runtime(tmp_path: Any) -> None:
    """The shipped ConfigMap's TOML loads and builds this runtime with its values."""
    import yaml

    from codemode.startup.bootstrap import build_runtime
    from codemode.startup.config import load_settings

    config_map = yaml.safe_load((Path(__file__).parents[3] / "k8s" / "base" / "configmap.yaml").read_text())
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    settings = load_settings(config_file=str(tmp_path / "codemode.toml"))
    runtime = build_runtime(settings)
    assert isinstance(runtime, KubernetesRuntime)
    pod = runtime.pod_manifest("w-1")
    container = pod.spec.containers[0]  # type: ignore[union-attr]
    assert pod.metadata.namespace == "codemode-workers"  # type: ignore[union-attr]
    assert container.image == "registry.example/codemode-worker:1"
    assert (container.resources.limits or {})["memory"] == "256Mi"  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------- configuration


def _write_kubeconfig(path: Path, contexts: dict[str, str]) -> None:
    clusters = "".join(
        f"  - name: {name}\n    cluster:\n      server: {server}\n" for name, server in contexts.items()
    )
    ctxs = "".join(f"  - name: {name}\n    context: {{cluster: {name}, user: u}}\n" for name in contexts)
    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n"
        + clusters
        + "users:\n  - name: u\n    user: {token: t}\ncontexts:\n"
        + ctxs
        + f"current-context: {next(iter(contexts))}\n"
    )


@pytest.fixture
def restore_default_configuration() -> Any:
    saved = k8s.Configuration._default
    yield
    k8s.Configuration.set_default(saved)


async def test_a_kubeconfig_loaded_by_the_caller_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_default_configuration: Any
) -> None:
    from kubernetes import config

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    path = tmp_path / "kubeconfig"
    _write_kubeconfig(path, {"loaded": "https://127.0.0.1:7001"})
    config.load_kube_config(str(path))
    rt = KubernetesRuntime()
    api = await rt._run_blocking(rt._client)
    assert api.api_client.configuration.host == "https://127.0.0.1:7001"
    await rt.aclose()


async def test_explicit_kubeconfig_and_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_default_configuration: Any
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    _write_kubeconfig(path, {"one": "https://127.0.0.1:7001", "two": "https://127.0.0.1:7002"})
    for context, host in ((None, "https://127.0.0.1:7001"), ("two", "https://127.0.0.1:7002")):
        rt = KubernetesRuntime(KubernetesOptions(kubeconfig=str(path), context=context))
        api = await rt._run_blocking(rt._client)
        assert api.api_client.configuration.host == host
        await rt.aclose()
    rt = KubernetesRuntime(KubernetesOptions(kubeconfig=str(path), context="three"))
    with pytest.raises(RuntimeUnavailable, match="context three"):
        await rt._run_blocking(rt._client)
    await rt.aclose()


# ----------------------------------------------------------------------------------- warm pool


class _SlowRemoteRuntime:
    """A runtime whose spawns take a while and cost the host nothing (declares concurrent refill)."""

    concurrent_refill = True
    name = "remote"

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.spawned = 0
        self.release = asyncio.Event()

    async def start(self) -> None:
        pass

    async def check(self) -> None:
        pass

    async def spawn(self) -> Any:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1
        self.spawned += 1
        return _Idle(f"w{self.spawned}")

    async def aclose(self) -> None:
        pass


class _Idle:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.destroyed = False

    def alive(self) -> bool:
        return not self.destroyed

    async def destroy(self) -> ExitInfo:
        self.destroyed = True
        return ExitInfo(0)


async def test_pool_refills_a_remote_runtime_concurrently() -> None:
    from codemode.runtimes.pool import WarmPool

    inner = _SlowRemoteRuntime()
    pool = WarmPool(inner, 3)
    await pool.start()
    await wait_until(lambda: inner.in_flight == 3)  # all three start at once
    inner.release.set()
    await pool.wait_warm(5.0)
    inner.release.clear()
    used = await pool.spawn()
    # The refill starts when the sandbox is handed out, not after it is destroyed.
    await wait_until(lambda: inner.in_flight == 1)
    assert not used.destroyed  # type: ignore[attr-defined]
    inner.release.set()
    await pool.wait_warm(5.0)
    assert inner.max_in_flight == 3
    await used.destroy()
    await pool.aclose()


# ----------------------------------------------------------------------------------- pod status


def _pod(phase: str = "Pending", node: str | None = None, **status: Any) -> k8s.V1Pod:
    return k8s.V1Pod(
        spec=k8s.V1PodSpec(containers=[], node_name=node), status=k8s.V1PodStatus(phase=phase, **status)
    )


def test_progress_and_scheduled_read_the_pod_status() -> None:
    from codemode.runtimes.kubernetes.pod import progress, scheduled

    def cond(reason: str) -> list[k8s.V1PodCondition]:
        return [k8s.V1PodCondition(type="PodScheduled", status="False", reason=reason, message="0/1 nodes")]

    assert progress(_pod(conditions=cond("Unschedulable")))[0] == "unschedulable"
    assert progress(_pod(conditions=cond("SchedulingGated")))[0] == "waiting"
    assert not scheduled(_pod(conditions=cond("Unschedulable")))
    assert scheduled(_pod(node="n1"))
    waiting = k8s.V1ContainerStatus(
        name="worker",
        image="i",
        image_id="",
        ready=False,
        restart_count=0,
        state=k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason="ErrImagePull")),
    )
    assert progress(_pod(node="n1", container_statuses=[waiting]))[0] == "no-image"
    assert progress(_pod("Failed", node="n1", reason="DeadlineExceeded"))[0] == "ended"


# ----------------------------------------------------------------------------------- node loss


def test_the_api_servers_dial_errors_mean_an_unreachable_kubelet() -> None:
    from codemode.runtimes.kubernetes.nodes import kubelet_unreachable

    assert kubelet_unreachable(
        'Handshake status 500 Internal Server Error -+-+- {} -+-+- b\'{"message":"error dialing backend:'
        " dial tcp 127.0.0.1:11250: connect: connection refused\"}'"
    )
    assert kubelet_unreachable(
        '{"metadata":{},"status":"Failure","message":"Internal error occurred: error sending request: Post'
        ' \\"https://node-2:11250/attach/codemode-workers/codemode-worker-43b5febf0a144d5f/worker?error=1\\":'
        ' dial tcp 127.0.0.1:11250: connect: connection refused","reason":"InternalError"}'
    )
    assert kubelet_unreachable("No agent available")
    # What the kubelet itself answers is no evidence against the node.
    assert not kubelet_unreachable('container "worker" in pod "p" is not running')
    assert not kubelet_unreachable("Handshake status 403 Forbidden")


def test_a_suspected_node_is_avoided_for_the_quarantine_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from codemode.runtimes.kubernetes import nodes as kubernetes_nodes

    now = [100.0]
    monkeypatch.setattr(kubernetes_nodes.time, "monotonic", lambda: now[0])  # type: ignore[attr-defined]
    q = kubernetes_nodes.NodeQuarantine(60.0)
    assert q.suspect("node-2") is True
    assert q.suspect("node-2") is False  # already suspected: no second operator log
    assert q.suspect("node-3") is True
    assert q.nodes() == ["node-2", "node-3"]
    now[0] += 59.0
    q.suspect("node-3")  # fresh evidence renews it
    now[0] += 2.0
    assert q.nodes() == ["node-3"]
    q.forget(["node-3"])
    assert q.nodes() == []
    off = kubernetes_nodes.NodeQuarantine(0.0)
    assert off.suspect("node-2") is False and off.nodes() == []


@pytest.mark.parametrize("version", ["1.30", "latest"])
def test_a_pod_that_avoids_nodes_has_a_required_node_affinity(version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.utils.latest_version()
    rt = KubernetesRuntime(api=object())
    assert serialized(rt.pod_manifest("p"))["spec"].get("affinity") is None
    pod = serialized(rt.pod_manifest("codemode-worker-x", avoided_nodes=["node-2"]))
    assert pod["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-2"]}]}
                ]
            }
        }
    }
    kubernetes_validate.validate(pod, version, strict=True)


async def test_a_spawn_bound_to_a_silent_node_goes_to_another_node_at_once(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # node-2 died but still reads Ready: the scheduler binds the pod there, its kubelet never
    # takes it on. Before: the spawn waited the whole spawn_timeout and failed.
    cluster.nodes = ["node-2", "node-1"]
    cluster.silent_nodes = {"node-2"}
    rt = make_runtime(cluster, spawn_timeout=30.0, node_ack_timeout=0.3)
    t0 = time.monotonic()
    sandbox = await rt.spawn()
    assert time.monotonic() - t0 < 5.0  # the ack timeout and a second start, not the spawn timeout
    first, second = cluster.created
    assert first.spec.affinity is None  # type: ignore[union-attr]
    assert second.spec.affinity.node_affinity is not None  # type: ignore[union-attr]
    assert cluster.api.pods[(NS, sandbox.pod_name)].spec.node_name == "node-1"  # type: ignore[union-attr]
    assert (NS, str(first.metadata.name)) not in cluster.api.pods  # type: ignore[union-attr]  # the stuck pod was deleted
    assert "node node-2 did not take on worker pod" in caplog.text and "suspecting it dead" in caplog.text
    assert "cannot be reached (error sending request" in caplog.text  # the node check's evidence
    assert node_checks(cluster) == 1
    assert rt.quarantine.nodes() == ["node-2"]
    # The next spawns avoid node-2 from the start: no wait at all.
    again = await rt.spawn()
    assert cluster.created[-1].spec.affinity is not None  # type: ignore[union-attr]
    assert cluster.api.pods[(NS, again.pod_name)].spec.node_name == "node-1"  # type: ignore[union-attr]
    await sandbox.destroy()
    await again.destroy()
    await rt.aclose()


async def test_when_only_suspected_nodes_can_take_a_pod_the_hint_is_dropped(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.nodes = ["node-1"]
    rt = make_runtime(cluster, spawn_timeout=30.0, unschedulable_grace=10.0)
    rt.quarantine.suspect("node-1")  # a false suspicion of the only node
    t0 = time.monotonic()
    sandbox = await rt.spawn()
    assert time.monotonic() - t0 < 5.0  # not the unschedulable grace
    avoiding, plain = cluster.created
    assert avoiding.spec.affinity is not None and plain.spec.affinity is None  # type: ignore[union-attr]
    assert rt.quarantine.nodes() == []
    assert "trying the suspected node(s) node-1 again" in caplog.text
    await sandbox.destroy()
    await rt.aclose()


async def test_a_silent_node_on_every_attempt_fails_the_spawn_within_the_spawn_timeout(
    cluster: FakeCluster,
) -> None:
    cluster.nodes = ["node-2", "node-3", "node-4", "node-1"]
    cluster.silent_nodes = {"node-2", "node-3", "node-4"}
    rt = make_runtime(cluster, spawn_timeout=30.0, node_ack_timeout=0.2)
    with pytest.raises(SpawnFailed, match="node-4, whose kubelet did not acknowledge it"):
        await rt.spawn()
    assert len(cluster.created) == 3
    assert cluster.api.pods == {}
    await rt.aclose()


def slow_kubelet(cluster: FakeCluster, node: str, seconds: float | None) -> None:
    """Pods bound to ``node`` are taken on (``status.startTime``) only ``seconds`` after they were
    first bound (None: never), while its kubelet answers attaches all along: a loaded node."""
    first_seen: dict[str, float] = {}
    real_bind = cluster._bind

    def bind(pod: k8s.V1Pod) -> bool:
        if not real_bind(pod):
            return False
        assert pod.spec is not None and pod.status is not None and pod.metadata is not None
        if pod.spec.node_name == node:
            since = first_seen.setdefault(pod.metadata.name or "", time.monotonic())
            if seconds is None or time.monotonic() - since < seconds:
                pod.status.start_time = None
                return False
        return True

    cluster._bind = bind  # type: ignore[method-assign]


def node_checks(cluster: FakeCluster) -> int:
    """How many attaches were the runtime's node check (stderr only, no stdin)."""
    return sum(1 for c in cluster.server.requests if c.query.get("stdin", ["false"])[0].lower() != "true")


async def test_a_slow_but_reachable_kubelet_is_waited_for_not_quarantined(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Review attack: node-2's kubelet answers attaches but writes startTime 1 s late (a burst of
    # pod creates on a loaded node). Before: suspected on the ack timer alone, its pod deleted and
    # the node quarantined for 60 s for every execute of this replica.
    cluster.nodes = ["node-2", "node-1"]
    slow_kubelet(cluster, "node-2", 1.0)
    # (attach_early off: the fake's attach reaches a pod the kubelet has not taken on.)
    rt = make_runtime(cluster, spawn_timeout=30.0, node_ack_timeout=0.3, attach_early=False)
    sandbox = await rt.spawn()
    assert cluster.api.pods[(NS, sandbox.pod_name)].spec.node_name == "node-2"  # type: ignore[union-attr]
    assert len(cluster.created) == 1  # the pod was waited for, not made again elsewhere
    assert node_checks(cluster) >= 1  # the node was checked, and its kubelet answered
    assert rt.quarantine.nodes() == []
    assert "suspecting it dead" not in caplog.text
    await sandbox.destroy()
    await rt.aclose()


async def test_a_reachable_kubelet_that_never_takes_the_pod_on_fails_at_the_spawn_timeout(
    cluster: FakeCluster,
) -> None:
    cluster.nodes = ["node-2", "node-1"]
    slow_kubelet(cluster, "node-2", None)
    rt = make_runtime(cluster, spawn_timeout=2.5, node_ack_timeout=0.3, attach_early=False)
    with pytest.raises(
        SpawnFailed, match=r"bound to node node-2, whose kubelet \(not unreachable\) has not taken it on"
    ):
        await rt.spawn()
    assert len(cluster.created) == 1 and cluster.api.pods == {}  # one pod, deleted
    assert node_checks(cluster) >= 2  # checked again while waiting
    assert rt.quarantine.nodes() == []
    await rt.aclose()


def _stream_drops(conn: WorkerConn) -> None:
    return None  # the attach connection drops; the API still says the container runs


async def _dropped_worker(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, node: str, exit_wait: float
) -> tuple[KubernetesRuntime, KubernetesSandbox]:
    """A started worker on ``node`` whose attach stream has ended while its container runs."""
    import codemode.runtimes.kubernetes.runtime as kubernetes_runtime

    monkeypatch.setattr(kubernetes_runtime, "_LOST_CHECK_AFTER", 0.05)
    cluster.nodes = [node]
    cluster.behavior = probing_worker(_stream_drops)
    rt = make_runtime(cluster, exit_wait=exit_wait)
    sandbox = await rt.spawn()
    assert await asyncio.wait_for(sandbox.read(10), 5) == b""
    return rt, sandbox


@pytest.mark.parametrize("in_handshake", [False, True])
async def test_a_worker_whose_node_is_unreachable_is_lost_not_killed(
    cluster: FakeCluster,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    in_handshake: bool,
) -> None:
    # The node died mid-execute: its kubelet took the attach stream with it. Before: destroy
    # waited exit_wait, then reported exit 137 / SIGKILL for a worker nobody killed.
    rt, sandbox = await _dropped_worker(cluster, monkeypatch, "node-2", exit_wait=30.0)
    cluster.server.refuse_in_handshake = in_handshake
    cluster.server.refuse_without_stdin = (
        500,
        'Internal error occurred: error sending request: Post "https://node-2:11250/attach/'
        f'{NS}/{sandbox.pod_name}/worker?error=1": dial tcp 127.0.0.1:11250: connect: connection refused',
    )
    t0 = time.monotonic()
    info = await sandbox.destroy()
    assert time.monotonic() - t0 < 5.0  # not exit_wait
    assert info.lost and (info.exit_code, info.signal, info.oom_killed) == (None, None, False)
    assert f"worker pod {sandbox.pod_name} lost with its node node-2" in caplog.text
    assert "dial tcp 127.0.0.1:11250" in caplog.text and "not killed by this host" in caplog.text
    assert cluster.api.pods == {}  # deleted from the API all the same
    assert rt.quarantine.nodes() == ["node-2"]
    probe = cluster.server.requests[-1]
    assert {k: v[0].lower() for k, v in probe.query.items()}["stdin"] == "false"
    await rt.aclose()


async def test_a_worker_whose_node_answers_is_not_lost(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker that ends its own stream and keeps running (a compromised interpreter) while its
    # node's kubelet answers (the check's attach is taken) is no node loss: its node is not
    # suspected, so no tenant can move every tenant's workers off a node.
    rt, sandbox = await _dropped_worker(cluster, monkeypatch, "node-1", exit_wait=0.5)
    info = await sandbox.destroy()
    assert not info.lost and (info.exit_code, info.signal) == (137, 9)
    assert len(cluster.server.requests) == 2  # the worker's attach and the node check
    assert rt.quarantine.nodes() == []
    await rt.aclose()
