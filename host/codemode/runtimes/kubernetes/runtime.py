"""The Kubernetes runtime: one hardened, single-use pod per execute, through the Kubernetes API.

What the pod gets, how a spawn and a destroy go, the streams and the orphan rule are
docs/kubernetes.md ("The worker pod", "Streams", "Lifecycle and exit information", "Orphans: the
rule"); the settings are docs/reference/runtimes.md. For the code reader: the manifest and the
reading of pod status are pure and live in ``pod``; the launch of a pod in ``_launch``, the orphan
rule in ``_orphans``, the attach websocket's framing in ``_attach``; this module is the runtime and
its sandbox, the API calls of a pod's end and the node check.

Every client call blocks, so each runs on the runtime's small thread pool with a request timeout (an
unreachable API server is ``RuntimeUnavailable``, never a hang). A reader thread per sandbox takes
the attach websocket one message at a time into bounded buffers (never ``WSClient.update()``, which
buffers without bound); small writes go out on the event loop's thread only when the socket provably
takes them (``_has_room``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from kubernetes import client as k8s

from ..base import ExitInfo, RuntimeUnavailable, SpawnFailed
from ..handshake import probe
from ..streams import STDOUT_BUFFER, BlockingRuntime, ThreadedStreamSandbox
from ..supervised import Supervised, supervisor_command
from ..testing import TESTING_ENTRY, TESTING_ENV
from ..testing import WARNING as TESTING_WARNING
from ._api_errors import _RETRY_STATUSES, _api_error_text, _is_connection_error, _status, _status_message
from ._attach import (
    _CLOSE,
    _DIRECT_SEND_MAX,
    _ERROR,
    _OP_BINARY,
    _OP_CLOSE,
    _OP_TEXT,
    _STDERR,
    _STDOUT,
    _V5,
    _WRITE_CHUNK,
    _close_reason,
    _hangup,
    _has_room,
    _open_attach,
    _shut,
)
from ._launch import PodLaunching
from ._orphans import _OWNER, CleanupMode, OrphanRule
from .nodes import NodeQuarantine, kubelet_unreachable
from .pod import DEFAULT_IMAGE, INSTANCE_LABEL, OWNER_LABEL, PROTOCOL_LABEL, ROLE_LABEL, PodSizing, worker_pod
from .pod import worker_status as _worker_status

__all__ = ["DEFAULT_NAMESPACE", "KubernetesRuntime", "KubernetesSandbox"]

log = logging.getLogger("codemode.runtimes.kubernetes")

DEFAULT_NAMESPACE = "codemode-workers"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


def _under_seccomp_root(path: str) -> bool:
    """A relative path of plain segments (no ``.``, ``..`` or empty one): a file under the kubelet's
    seccomp root."""
    return all(_PATH_SEGMENT.fullmatch(part) and part not in (".", "..") for part in path.split("/"))


_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")

_DeleteOutcome = Literal["deleted", "gone", "failed"]
#: Seconds a worker whose stream ended must still read as running before its node is checked, and
#: how long the check waits for the API server's word on the node's kubelet.
_LOST_CHECK_AFTER = 1.0
_LOST_CHECK_WAIT = 1.0
#: Seconds (at most ``api_timeout``) the node check's websocket may take to connect and upgrade.
_LOST_CHECK_UPGRADE = 5.0


def _parse_quantity(value: str) -> Any:
    from kubernetes.utils import parse_quantity

    return parse_quantity(value)  # type: ignore[no-untyped-call]


# ----------------------------------------------------------------------------------- sandbox


class KubernetesSandbox(ThreadedStreamSandbox["KubernetesRuntime"]):
    """One worker pod reached through its attached stdin/stdout (a websocket to the API server)."""

    _log = log
    _kind = "kubernetes"

    def __init__(
        self,
        runtime: KubernetesRuntime,
        pod_name: str,
        stream: Any,
        loop: asyncio.AbstractEventLoop,
        early: Sequence[bytes] = (),
    ):
        """One started worker pod (made by :meth:`KubernetesRuntime.spawn`).

        Args:
            runtime: the runtime that owns it.
            pod_name: the pod.
            stream: the attach websocket to its stdin/stdout.
            loop: the event loop the sandbox answers on.
            early: the stream's messages the launch read already (the worker's first answer).
        """
        self.pod_name = pod_name
        self._early = list(early)
        self._stream = stream  # kubernetes.stream.ws_client.WSClient
        self._ws = stream.sock  # its websocket.WebSocket
        self._v5 = getattr(stream, "subprotocol", None) == _V5
        self._error = bytearray()
        #: The pod was deleted (by this sandbox) or found gone.
        self.deleted = False
        #: How the attach stream ended, for host logs ("" while it runs).
        self.stream_end = ""
        super().__init__(runtime, f"k8s-{pod_name}", loop, f"codemode-k8s-{pod_name}")

    # -- extras ----------------------------------------------------------------------------------

    @property
    def error_channel(self) -> bytes:
        """What the API server/kubelet reported on the error channel (a Status, for host logs)."""
        with self._cond:
            return bytes(self._error)

    # -- transport -------------------------------------------------------------------------------

    def _send_now(self, data: bytes) -> int:
        # A native call's round trip would otherwise cross to the pool and back for every result
        # frame. Sent here only when the socket takes the whole message at once (room in its send
        # buffer and under its not-sent limit): a worker that stops reading its stdin fills the path
        # back to this socket, and then every write takes the pool again (the event loop never
        # blocks on a worker).
        if len(data) > _DIRECT_SEND_MAX or threading.get_ident() != self._loop_thread:
            return 0
        sock = getattr(self._ws, "sock", None)
        if sock is None or not _has_room(sock, len(data)):
            return 0
        self._stream.write_stdin(data)  # one websocket message: all of it or nothing
        return len(data)

    def _send(self, data: bytes) -> None:
        # Several small websocket messages rather than one huge one (servers cap message size).
        for i in range(0, max(len(data), 1), _WRITE_CHUNK):
            self._stream.write_stdin(data[i : i + _WRITE_CHUNK])

    async def _half_close(self) -> None:
        if self._v5:  # v4 has no half-close: stdin closes with the stream (stdinOnce)
            with contextlib.suppress(Exception):
                await self._runtime._run_blocking(self._stream.close_channel, 0)

    def _pump(self) -> None:
        try:
            self.stream_end = self._pump_frames()
        except Exception as exc:
            self.stream_end = f"broke: {type(exc).__name__}: {str(exc)[:200]}"
            raise

    def _pump_frames(self) -> str:
        for data in self._early:  # read by the launch (small: the worker's first answer)
            self._take(data)
        self._early = []
        while True:
            with self._cond:
                # Bounded: a worker flooding stdout waits until the host reads (TCP back-pressure
                # through the API server and kubelet to the worker's pipe).
                self._wait_for_room()
            opcode, frame = self._ws.recv_data_frame(True)
            if opcode == _OP_CLOSE:
                return f"closed by the API server ({_close_reason(frame)})"
            if opcode not in (_OP_BINARY, _OP_TEXT):
                continue  # ping/pong
            data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
            if data and not self._take(data):
                return "the worker's stdout closed"

    def _take(self, data: bytes) -> bool:
        """Dispatch one channel message; False when it closes stdout."""
        channel, payload = data[0], data[1:]
        if channel == _STDOUT:
            self._push_stdout(payload)  # discarded while being destroyed
        elif channel == _CLOSE and payload[:1] == bytes([_STDOUT]):
            return False
        elif channel in (_STDERR, _ERROR):
            self._push_tail(self._stderr if channel == _STDERR else self._error, payload)
        return True

    def _close_stream(self) -> None:
        self._input_closed = True
        _shut(self._ws)  # wakes the reader blocked in recv, and a pool thread blocked in send
        self._reader.join(timeout=2.0)
        _hangup(self._stream)

    def _destroy_blocking(self) -> ExitInfo:
        """Close the stream, read how the worker ended, delete the pod. Runs once, on the pool.

        A worker whose output stream had already ended has exited (or is exiting): read its
        terminated state (bounded wait), then delete the pod. If its container still runs and the
        API server cannot reach its node's kubelet, the worker is **lost** (``ExitInfo.lost``,
        exit unknown: its node died or is cut off), said so in the log and its node suspected. A
        worker still running is being killed by the host: delete it at once (grace period 0) and
        report SIGKILL (137) without another round trip.
        """
        rt = self._runtime
        exited = self._begin_destroy()
        self._close_stream()
        exit_code: int | None = None
        sig: int | None = None
        oom = False
        found = "running"
        if exited:
            found, term = rt._terminated_blocking(self.pod_name, self.stream_end or "ended")
            if term is not None:
                exit_code = term.exit_code
                sig = term.signal
                oom = term.reason == "OOMKilled"
        outcome = rt._delete_blocking(self.pod_name)
        self.deleted = outcome != "failed"
        if found == "running" and outcome == "deleted":
            exit_code, sig = 128 + 9, 9
        return self._finish_destroy(exit_code, sig, oom, found == "lost")


# ----------------------------------------------------------------------------------- runtime


class KubernetesRuntime(PodLaunching, OrphanRule, BlockingRuntime[KubernetesSandbox]):
    """Spawns one hardened pod per execute from the worker image.

    Creating a pod costs this host nothing but an API call, so a warm pool may refill concurrently
    (``concurrent_refill``).

    Args:
        namespace: where worker pods run (label it Pod Security ``restricted``; see k8s/).
        image: worker image (default ``codemode-worker:<protocol version>``).
        memory, ephemeral_storage: requests = limits of the worker container (quantities).
        cpu: the CPU limit of the worker container (default 1 CPU).
        cpu_request: what the scheduler reserves per worker (default 100m; docs/kubernetes.md,
            "Sizing": QoS Burstable, or Guaranteed when it equals ``cpu``).
        runtime_class: a RuntimeClass name (e.g. ``"gvisor"``), or None for the cluster default.
        seccomp_profile: a ``Localhost`` seccomp profile for the pods, relative to the kubelet's
            seccomp root (e.g. ``"codemode-worker.json"``, made with ``python -m
            codemode.runtimes.seccomp_profile``; in the reuse mode the supervisor's, ``--supervisor``),
            or None for ``RuntimeDefault``. The worker installs its own filter on top either way.
        supervisor_entrypoint: the command of a reusable pod (``spawn_supervised``, the reuse mode;
            default ``python3 -I -m codemode_worker.supervisor``, ``--testing`` under
            ``testing_entry``); tests only.
        end_timeout: seconds a reusable pod's supervisor has to end an execute's worker, scrub and
            verify before the pod is recycled instead.
        owner: this host's instance id, written to the ``io.codemode.owner`` label (default: random
            per host process, renewed after fork).
        api: a ``kubernetes.client.CoreV1Api``. Without it the client is configured, first match
            wins, from: ``kubeconfig``/``context``; the default configuration a caller loaded
            (``kubernetes.config.load_kube_config(...)``); in-cluster; ``$KUBECONFIG`` or
            ``~/.kube/config`` as of the first API call.
        kubeconfig: a kubeconfig file to use (settings: ``kubernetes_kubeconfig``).
        context: a context in that kubeconfig (settings: ``kubernetes_context``).
        attach: the function that opens the attach websocket (default ``kubernetes.stream.stream``).
        cleanup_orphans: what ``start()`` deletes: ``"dead"`` (worker pods whose owner is provably
            dead), ``"all"`` (every worker pod not owned by this instance), ``"none"``.
        spawn_timeout: seconds from pod creation until its container runs and is attached.
        attach_early: attach from the moment the pod is scheduled, retrying the exact "not
            running yet" refusals, rather than once the API reports it Running (up to a second
            later: the kubelet's relist); False only to measure or to rule it out.
        unschedulable_grace: seconds a pod may stay unschedulable (no node has room) before the
            spawn fails with ``CapacityExhausted``.
        node_ack_timeout: seconds a pod bound to a node may wait for that node's kubelet to
            acknowledge it before the node is checked (and again every ``node_ack_timeout``):
            when the API server cannot reach the kubelet, the node is suspected dead, the pod
            deleted and the spawn tried again on another node; a kubelet that answers is only
            slow, and the pod is waited for (docs/kubernetes.md, "A node lost mid-execute").
        node_quarantine: seconds new pods avoid a node suspected dead (0: never avoid one).
        probe_timeout: seconds for the attached worker to answer the probe (counted from the
            attach that reached it).
        api_timeout: seconds for one API call.
        check_timeout: seconds for ``check()`` as a whole.
        exit_wait: seconds ``destroy()`` waits for an exited worker's terminated state.
        max_lifetime: ``activeDeadlineSeconds`` of every pod: a backstop for pods nobody deletes.
        image_pull_policy: of the worker container.
        stdout_buffer_bytes: how much worker stdout is buffered before the reader stops reading.
        executor_threads: size of the thread pool that runs blocking client calls.
        entrypoint: replaces the image's command (operators' diagnostics only: ``codemode quotas
            tune`` runs the image's worker through a holding wrapper); None = the image's.
        testing_entry: TEST ONLY. Runs ``codemode_worker.testing_entry`` with
            ``CODEMODE_WORKER_TESTING=1`` (use the test image, ``codemode-worker-testing``): a worker
            that executes arbitrary Python. It exists to prove the pod contains a compromised
            interpreter and to measure the attach channel without Starlark; never enable it in a
            deployment.
    """

    concurrent_refill = True

    def __init__(
        self,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        image: str = DEFAULT_IMAGE,
        memory: str = "256Mi",
        cpu: str = "1",
        cpu_request: str = "100m",
        ephemeral_storage: str = "64Mi",
        runtime_class: str | None = None,
        owner: str | None = None,
        api: Any = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        attach: Callable[..., Any] | None = None,
        cleanup_orphans: CleanupMode = "dead",
        spawn_timeout: float = 60.0,
        unschedulable_grace: float = 2.0,
        node_ack_timeout: float = 5.0,
        node_quarantine: float = 60.0,
        probe_timeout: float = 10.0,
        api_timeout: float = 30.0,
        check_timeout: float = 5.0,
        exit_wait: float = 3.0,
        max_lifetime: int = 3600,
        image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent",
        stdout_buffer_bytes: int = STDOUT_BUFFER,
        executor_threads: int = 32,
        testing_entry: bool = False,
        entrypoint: Sequence[str] | None = None,
        seccomp_profile: str | None = None,
        supervisor_entrypoint: Sequence[str] | None = None,
        end_timeout: float = 5.0,
        attach_early: bool = True,
    ) -> None:
        if not _DNS_LABEL.fullmatch(namespace):
            raise ValueError(f"namespace {namespace!r} is not a DNS label")
        if runtime_class is not None and not _DNS_LABEL.fullmatch(runtime_class):
            raise ValueError(f"runtime_class {runtime_class!r} is not a valid RuntimeClass name")
        if seccomp_profile is not None and not _under_seccomp_root(seccomp_profile):
            raise ValueError(
                f"seccomp_profile {seccomp_profile!r} is not a path relative to the kubelet's seccomp root"
            )
        if owner is not None and not (owner and _LABEL_VALUE.fullmatch(owner)):
            raise ValueError(f"owner {owner!r} is not a valid label value")
        quantities = (
            ("memory", memory),
            ("cpu", cpu),
            ("cpu_request", cpu_request),
            ("ephemeral_storage", ephemeral_storage),
        )
        for what, value in quantities:
            try:
                ok = _parse_quantity(value) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{what} {value!r} is not a positive Kubernetes quantity")
        if _parse_quantity(cpu_request) > _parse_quantity(cpu):
            raise ValueError(f"cpu_request {cpu_request!r} exceeds the cpu limit {cpu!r}")
        if unschedulable_grace < 0:
            raise ValueError("unschedulable_grace must not be negative")
        if node_ack_timeout <= 0 or node_quarantine < 0:
            raise ValueError("node_ack_timeout must be positive and node_quarantine not negative")
        if cleanup_orphans not in ("dead", "all", "none"):
            raise ValueError("cleanup_orphans must be 'dead', 'all' or 'none'")
        if max_lifetime <= 0 or spawn_timeout <= 0 or probe_timeout <= 0:
            raise ValueError("max_lifetime, spawn_timeout and probe_timeout must be positive")
        self.namespace = namespace
        self.image = image
        self.memory = memory
        self.cpu = cpu
        self.cpu_request = cpu_request
        self.ephemeral_storage = ephemeral_storage
        self.sizing = PodSizing(
            memory=memory, cpu=cpu, cpu_request=cpu_request, ephemeral_storage=ephemeral_storage
        )
        self.kubeconfig = os.fspath(kubeconfig) if kubeconfig is not None else None
        self.context = context
        self.unschedulable_grace = unschedulable_grace
        self.node_ack_timeout = node_ack_timeout
        #: The nodes suspected dead, which new pods avoid (``nodes``).
        self.quarantine = NodeQuarantine(node_quarantine)
        #: Seconds from the start of the last successful launch to each phase it reached
        #: (created, scheduled, running, attached); for benchmarks and debugging.
        self.last_phases: dict[str, float] = {}
        self.runtime_class = runtime_class
        self.seccomp_profile = seccomp_profile
        self.owner_id = owner
        self.cleanup_orphans: CleanupMode = cleanup_orphans
        self.spawn_timeout = spawn_timeout
        self.probe_timeout = probe_timeout
        self.api_timeout = api_timeout
        self.check_timeout = check_timeout
        self.exit_wait = exit_wait
        self.max_lifetime = max_lifetime
        self.image_pull_policy = image_pull_policy
        self.stdout_buffer_bytes = max(64 * 1024, stdout_buffer_bytes)
        self.testing_entry = testing_entry
        if testing_entry and entrypoint is not None:
            raise ValueError("entrypoint and testing_entry exclude each other")
        self.entrypoint = list(TESTING_ENTRY) if testing_entry else (list(entrypoint) if entrypoint else None)
        self.supervisor_entrypoint = (
            list(supervisor_entrypoint)
            if supervisor_entrypoint is not None
            else supervisor_command(testing_entry)
        )
        self.end_timeout = end_timeout
        self.attach_early = attach_early
        #: Attach attempts of the last launch (refused ones included); for benchmarks and debugging.
        self.last_attach_attempts = 0
        if testing_entry:
            log.warning(TESTING_WARNING, "kubernetes")
        #: Unique per runtime object; lets aclose() sweep this runtime's own pods.
        self.instance_id = uuid.uuid4().hex
        self._api: Any = api
        self._owns_api = api is None
        self._attach = attach
        self._api_lock = threading.Lock()
        self._init_blocking(executor_threads, "codemode-k8s")
        self._created_any = False

    # -- identity and the pod ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "kubernetes" if self.runtime_class is None else f"kubernetes:{self.runtime_class}"

    @property
    def owner(self) -> str:
        """The owner id in every worker pod's labels (this host process's, unless ``owner_id`` is set)."""
        return self.owner_id or _OWNER.id

    def labels(self) -> dict[str, str]:
        """The labels every worker pod of this runtime gets (the NetworkPolicy selects the role).

        Returns:
            Role, owner and the owner's identity.
        """
        return {
            ROLE_LABEL: "worker",
            OWNER_LABEL: self.owner,
            INSTANCE_LABEL: self.instance_id,
            PROTOCOL_LABEL: DEFAULT_IMAGE.rsplit(":", 1)[1],
        }

    def pod_manifest(
        self, pod_name: str, supervised: bool = False, avoided_nodes: list[str] | None = None
    ) -> k8s.V1Pod:
        """The exact pod ``spawn()`` submits (built by ``pod.worker_pod``).

        Args:
            pod_name: the pod's name.
            supervised: the reusable pod of ``spawn_supervised()`` instead (the supervisor as PID 1).
            avoided_nodes: nodes the pod must not run on (``spawn()`` passes the suspected ones).

        Returns:
            The pod object.
        """
        labels = self.labels()
        if supervised:
            labels["io.codemode.mode"] = "reuse"
        return worker_pod(
            pod_name,
            namespace=self.namespace,
            image=self.image,
            labels=labels,
            annotations=_OWNER.annotations(),
            sizing=self.sizing,
            runtime_class=self.runtime_class,
            seccomp_profile=self.seccomp_profile,
            max_lifetime=self.max_lifetime,
            image_pull_policy=self.image_pull_policy,
            command=self.supervisor_entrypoint if supervised else self.entrypoint,
            extra_env={TESTING_ENV: "1"} if self.testing_entry else None,
            avoided_nodes=avoided_nodes,
        )

    # -- blocking plumbing -----------------------------------------------------------------------

    def _client(self) -> Any:
        """The CoreV1Api (created on first use, in a worker thread)."""
        with self._api_lock:
            if self._api is None:
                self._api = k8s.CoreV1Api(k8s.ApiClient(self._configuration()))
            return self._api

    def _configuration(self) -> k8s.Configuration:
        from kubernetes import config

        try:
            if self.kubeconfig is not None or self.context is not None:
                configuration = k8s.Configuration()
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=self.kubeconfig, context=self.context, client_configuration=configuration
                )
                return configuration
            loaded = k8s.Configuration.get_default_copy()
            if loaded.host != k8s.Configuration().host:
                return loaded  # the caller ran config.load_kube_config()/load_incluster_config()
            configuration = k8s.Configuration()
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration
        except Exception as exc:
            where = f"kubeconfig {self.kubeconfig or '(default)'} context {self.context or '(current)'}"
            raise RuntimeUnavailable(
                f"kubernetes: no API configuration ({where}; neither in-cluster nor a kubeconfig; set"
                f" --kubernetes-kubeconfig / CODEMODE_KUBERNETES_KUBECONFIG): {exc}"
            ) from exc

    def _endpoint(self) -> str:
        host = getattr(getattr(getattr(self._api, "api_client", None), "configuration", None), "host", None)
        return host if isinstance(host, str) else "the configured API server"

    def _unavailable(self, what: str, exc: BaseException) -> RuntimeUnavailable:
        if _is_connection_error(exc):
            return RuntimeUnavailable(
                f"kubernetes: API server unreachable at {self._endpoint()} ({what}): {_api_error_text(exc)}"
            )
        hint = ""
        if _status(exc) == 401:
            hint = " (credentials rejected)"
        elif _status(exc) == 403:
            hint = (
                " (forbidden: check the host's RBAC (k8s/base/rbac.yaml), the namespace's Pod Security"
                " level and the RuntimeClass)"
            )
        return RuntimeUnavailable(f"kubernetes: {what}: {_api_error_text(exc)}{hint}")

    def _open_attach(self, api: Any, pod_name: str, *, stdin: bool, upgrade_within: float) -> Any:
        """Attach to the worker container of ``pod_name`` (``_attach._open_attach``)."""
        return _open_attach(
            self._attach, api, pod_name, self.namespace, stdin=stdin, upgrade_within=upgrade_within
        )

    def _delete_blocking(self, pod_name: str) -> _DeleteOutcome:
        """Delete one pod with grace period 0. Never raises.

        ``"deleted"`` (this call deleted it), ``"gone"`` (404: it was not there any more) or
        ``"failed"`` (logged; left to the ``aclose()`` sweep, the orphan rule and
        ``activeDeadlineSeconds``). Conflicts, throttling, server errors and connection errors are
        retried with backoff for up to ``api_timeout``.
        """
        deadline = time.monotonic() + self.api_timeout
        delay = 0.02
        while True:
            try:
                self._client().delete_namespaced_pod(
                    pod_name, self.namespace, grace_period_seconds=0, _request_timeout=self.api_timeout
                )
                return "deleted"
            except Exception as exc:
                if _status(exc) == 404:
                    return "gone"
                retry = _status(exc) in _RETRY_STATUSES or _is_connection_error(exc)
                if retry and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                log.error("kubernetes: could not delete worker pod %s: %s", pod_name, _api_error_text(exc))
                return "failed"

    def _terminated_blocking(
        self, pod_name: str, stream_end: str = "ended"
    ) -> tuple[Literal["terminated", "running", "gone", "lost"], Any]:
        """The worker container's terminated state, waiting up to ``exit_wait`` for the kubelet.

        A container that still reads as running ``_LOST_CHECK_AFTER`` seconds after its stream
        ended (``stream_end`` says how) has its node checked (``_kubelet_unreachable_blocking``):
        unreachable means ``"lost"`` at once (logged, the node suspected).
        """
        start = time.monotonic()
        deadline = start + self.exit_wait
        checked = False
        while True:
            try:
                pod = self._client().read_namespaced_pod(
                    pod_name, self.namespace, _request_timeout=self.api_timeout
                )
            except Exception as exc:
                if _status(exc) == 404:
                    return "gone", None
                log.warning("kubernetes: reading worker pod %s failed: %s", pod_name, _api_error_text(exc))
                return "running", None
            reason = getattr(pod.status, "reason", None)
            if reason in ("DeadlineExceeded", "Evicted"):
                log.warning("kubernetes: worker pod %s ended: %s", pod_name, reason)
            state = getattr(_worker_status(pod), "state", None)
            term = getattr(state, "terminated", None)
            if term is not None:
                return "terminated", term
            node = getattr(pod.spec, "node_name", None) or ""
            now = time.monotonic()
            if not checked and node and now >= min(start + _LOST_CHECK_AFTER, deadline):
                checked = True
                unreachable = self._kubelet_unreachable_blocking(pod_name)
                if unreachable is not None:
                    self._log_lost(pod_name, node, stream_end, unreachable)
                    return "lost", None
            if time.monotonic() >= deadline:
                return "running", None
            time.sleep(0.1)

    def _kubelet_unreachable_blocking(self, pod_name: str) -> str | None:
        """Whether the API server can reach the kubelet of a pod's node: one attach to its
        container's stderr (``pods/attach``, which the host has; nodes it may not read), read for
        at most ``_LOST_CHECK_WAIT`` seconds, then closed. The API server accepts the websocket
        first and reports a failure to dial the kubelet on the error channel (1.30+; older ones
        refuse the handshake). Returns that dial error, or None when the kubelet answered (the
        attach holds, or the kubelet reported an error of its own, such as a stopped container) or
        nothing could be told."""
        try:
            upgrade_within = min(self.api_timeout, _LOST_CHECK_UPGRADE)
            stream = self._open_attach(self._client(), pod_name, stdin=False, upgrade_within=upgrade_within)
        except Exception as exc:
            text = _api_error_text(exc)
            return _status_message(text) if kubelet_unreachable(text) else None
        error = bytearray()
        ws: Any = getattr(stream, "sock", None)
        deadline = time.monotonic() + _LOST_CHECK_WAIT
        try:
            while ws is not None and (left := deadline - time.monotonic()) > 0:
                ws.settimeout(left)
                opcode, frame = ws.recv_data_frame(True)
                if opcode == _OP_CLOSE:
                    break
                data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
                if data[:1] == bytes([_ERROR]):
                    error += data[1:1024]
        except Exception:
            pass  # the wait ran out with the attach holding (or the socket broke): no dial error
        finally:
            _hangup(stream)
        text = error.decode("utf-8", "replace")
        return _status_message(text) if kubelet_unreachable(text) else None

    def _log_lost(self, pod_name: str, node: str, stream_end: str, unreachable: str) -> None:
        first = self.quarantine.suspect(node)
        log.warning(
            "kubernetes: worker pod %s lost with its node %s: its attach stream %s while the API still"
            " says its container runs, and the API server cannot reach the node's kubelet (%s). How"
            " the worker ended is unknown (not killed by this host); its pod is deleted from the API,"
            " and the node's kubelet removes the container when the node is back.%s",
            pod_name,
            node,
            stream_end,
            unreachable,
            f" New worker pods avoid {node} for {self.quarantine.seconds}s." if first else "",
        )

    # -- Runtime protocol ------------------------------------------------------------------------

    async def check(self) -> None:
        try:
            await asyncio.wait_for(self._run_blocking(self._check_blocking), self.check_timeout)
        except TimeoutError:
            raise RuntimeUnavailable(
                f"kubernetes: API server at {self._endpoint()} did not answer within {self.check_timeout}s"
            ) from None

    def _check_blocking(self) -> None:
        api = self._client()
        try:
            api.list_namespaced_pod(
                self.namespace,
                label_selector=f"{ROLE_LABEL}=worker",
                limit=1,
                _request_timeout=self.check_timeout,
            )
        except Exception as exc:
            raise self._unavailable(f"cannot list pods in namespace {self.namespace}", exc) from exc

    async def spawn(self) -> KubernetesSandbox:
        if self._closed:
            raise self._closing(None)
        loop = asyncio.get_running_loop()
        # The launch bounds its own wait for the pod and the worker's answer; this also bounds a
        # hung create or attach.
        bound = self._launch_bound()
        try:
            pod_name, attached = await self._launch(bound)
        except TimeoutError:
            raise SpawnFailed(f"kubernetes: worker pod launch did not finish within {bound}s") from None
        sandbox = KubernetesSandbox(self, pod_name, attached.stream, loop, attached.early)
        await self._adopt_with(sandbox, lambda: probe(sandbox, self.probe_timeout, sent=True))
        return sandbox

    def _launch_bound(self) -> float:
        return self.spawn_timeout + self.api_timeout + self.probe_timeout

    async def spawn_supervised(self) -> Supervised:
        """A reusable pod (the reuse mode, ``codemode.runtimes.reuse``): the same pod, with
        ``codemode_worker.supervisor`` as PID 1; one attach for the pod's whole life.

        Returns:
            The started pod, its supervisor not yet greeted (``Supervised.started``).

        Raises:
            RuntimeUnavailable: the runtime is closed or the API server cannot create pods.
            SpawnFailed: this pod did not start in time.
        """
        if self._closed:
            raise self._closing(None)
        loop = asyncio.get_running_loop()
        bound = self._launch_bound()
        try:
            pod_name, attached = await self._launch(bound, True)
        except TimeoutError:
            raise SpawnFailed(f"kubernetes: worker pod launch did not finish within {bound}s") from None
        raw = KubernetesSandbox(self, pod_name, attached.stream, loop, attached.early)
        box = Supervised(raw, end_timeout=self.end_timeout)
        await self._adopt_with(raw, lambda: box.started(self.probe_timeout, sent=True))
        return box

    def _log_spawn_failure(self, sandbox: KubernetesSandbox, exc: SpawnFailed, info: ExitInfo) -> None:
        log.warning(
            "kubernetes: worker %s failed to start: %s (exit %s, oom %s, stderr %r, error %r)",
            sandbox.worker_id,
            exc,
            info.exit_code,
            info.oom_killed,
            info.stderr_tail[-512:],
            sandbox.error_channel[-512:],
        )

    def _discard_blocking(self, pod_name: str, attached: Any) -> None:
        _hangup(attached.stream)
        self._delete_blocking(pod_name)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Launches in flight see _closed and delete their own pod.
        await self._destroy_all(self.api_timeout)
        # Belt and braces: any pod of this runtime object that escaped the bookkeeping (bounded: the
        # API server may be the reason we are closing).
        if self._created_any:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._run_blocking(self._sweep_own_blocking), self.api_timeout)
        self._executor.shutdown(wait=False)
        api, self._api = self._api, None
        if api is not None and self._owns_api:
            with contextlib.suppress(Exception):
                api.api_client.close()

    def _sweep_own_blocking(self) -> None:
        if self._api is None:
            return
        found = self._api.list_namespaced_pod(
            self.namespace,
            label_selector=f"{INSTANCE_LABEL}={self.instance_id}",
            _request_timeout=self.api_timeout,
        )
        for pod in found.items or []:
            log.warning("kubernetes: deleting leftover worker pod %s at close", pod.metadata.name)
            self._delete_blocking(pod.metadata.name)
