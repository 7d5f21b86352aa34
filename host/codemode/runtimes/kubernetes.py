"""The Kubernetes runtime: one hardened, single-use pod per execute, through the Kubernetes API.

What the pod gets, how a spawn and a destroy go, the streams and the orphan rule are
docs/kubernetes.md ("The worker pod", "Streams", "Lifecycle and exit information", "Orphans: the
rule"); the settings are docs/reference/runtimes.md. For the code reader: the manifest and the
reading of pod status are pure and live in ``kubernetes_pod``; this module does the API I/O. Every
client call blocks, so each runs on the runtime's small thread pool with a request timeout (an
unreachable API server is ``RuntimeUnavailable``, never a hang). A reader thread per sandbox takes
the attach websocket one message at a time into bounded buffers (never ``WSClient.update()``, which
buffers without bound); small writes go out on the event loop's thread only when the socket provably
takes them (``_has_room``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import json
import logging
import math
import os
import random
import re
import select
import socket
import struct
import termios
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from kubernetes import client as k8s

from .base import CapacityExhausted, ExitInfo, RuntimeClosing, RuntimeUnavailable, SpawnFailed
from .base import SandboxClosed as SandboxClosed
from .handshake import PROBE, probe
from .kubernetes_nodes import NodeQuarantine, kubelet_unreachable
from .kubernetes_pod import CONTAINER_NAME as CONTAINER_NAME
from .kubernetes_pod import DEFAULT_IMAGE as DEFAULT_IMAGE
from .kubernetes_pod import INSTANCE_LABEL as INSTANCE_LABEL
from .kubernetes_pod import MIN_KUBERNETES as MIN_KUBERNETES
from .kubernetes_pod import OWNER_LABEL as OWNER_LABEL
from .kubernetes_pod import PROTOCOL_LABEL as PROTOCOL_LABEL
from .kubernetes_pod import ROLE_LABEL as ROLE_LABEL
from .kubernetes_pod import WORKER_UID as WORKER_UID
from .kubernetes_pod import PodSizing, acknowledged, progress, scheduled, worker_pod
from .kubernetes_pod import worker_status as _worker_status
from .kubernetes_upgrade import bounded_upgrade, upgrade_timed_out
from .streams import STDERR_TAIL as STDERR_TAIL
from .streams import STDOUT_BUFFER, BlockingRuntime, HostIdentity, LaunchHandoff, ThreadedStreamSandbox
from .streams import process_start as _process_start
from .streams import read_text as _read_text
from .supervised import PING, Supervised, supervisor_command
from .testing import TESTING_ENTRY, TESTING_ENV
from .testing import WARNING as TESTING_WARNING

__all__ = [
    "CONTAINER_NAME",
    "CREATE_CONFLICT_RETRIES",
    "DEFAULT_IMAGE",
    "DEFAULT_NAMESPACE",
    "INSTANCE_LABEL",
    "MIN_KUBERNETES",
    "OWNER_LABEL",
    "ROLE_LABEL",
    "WORKER_UID",
    "CleanupMode",
    "KubernetesRuntime",
    "KubernetesSandbox",
    "not_running_yet",
]

log = logging.getLogger("codemode.runtimes.kubernetes")

DEFAULT_NAMESPACE = "codemode-workers"
_OWNER_ANNOTATIONS = ("pod", "pod-uid", "host", "boot", "pidns", "pid", "start", "started")

_WRITE_CHUNK = 64 * 1024
#: Frames up to this size may be sent on the event loop's thread (``KubernetesSandbox._send_now``).
_DIRECT_SEND_MAX = 4096
#: Free send-buffer bytes always left over by a send on the event loop's thread.
_SEND_MARGIN = 32 * 1024
#: Linux: the TCP_NOTSENT_LOWAT socket option and the ioctl that reads a socket's unsent bytes.
_TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
_SIOCOUTQNSD = 0x894B
_STDOUT, _STDERR, _ERROR, _CLOSE = 1, 2, 3, 255
_V5 = "v5.channel.k8s.io"
_OP_TEXT, _OP_BINARY, _OP_CLOSE = 0x1, 0x2, 0x8
_RETRY_STATUSES = (409, 429, 500, 502, 503, 504)
#: Creates retried when the API server refuses one with 409 for a race on the namespace's
#: ResourceQuota usage (concurrent creates; nothing was created), after 20-80 ms each.
CREATE_CONFLICT_RETRIES = 3
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


def _under_seccomp_root(path: str) -> bool:
    """A relative path of plain segments (no ``.``, ``..`` or empty one): a file under the kubelet's
    seccomp root."""
    return all(_PATH_SEGMENT.fullmatch(part) and part not in (".", "..") for part in path.split("/"))


_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")

CleanupMode = Literal["dead", "all", "none"]
_DeleteOutcome = Literal["deleted", "gone", "failed"]
#: Pods one spawn may make when the first ones land on silent nodes (each on another node).
_NODE_ATTEMPTS = 3
#: Seconds a worker whose stream ended must still read as running before its node is checked, and
#: how long the check waits for the API server's word on the node's kubelet.
_LOST_CHECK_AFTER = 1.0
_LOST_CHECK_WAIT = 1.0
#: Seconds (at most ``api_timeout``) the node check's websocket may take to connect and upgrade.
_LOST_CHECK_UPGRADE = 5.0


class _NodeSilent(SpawnFailed):
    """The pod was bound to a node whose kubelet never acknowledged it (``node_ack_timeout``) and
    that the API server cannot reach."""

    def __init__(self, node: str, detail: str) -> None:
        super().__init__(detail)
        self.node = node


class _Unplaceable(SpawnFailed):
    """A pod kept off suspected nodes is unschedulable: no other node can take it."""


# ----------------------------------------------------------------------------------- owner identity


def _own_pod() -> tuple[str, str]:
    """("namespace/name", uid) of the pod this host runs in, ("", "") outside Kubernetes.

    From the downward API (``POD_NAMESPACE``, ``POD_NAME``, ``POD_UID``: k8s/base/deployment.yaml sets
    them); inside a pod without them, the service account namespace and the host name, with no
    uid: recorded for the operator, but the orphan rule never judges an owner pod without a uid
    (that name may be every replica's, with ``spec.hostname``, or the node's, with hostNetwork).
    """
    name = os.environ.get("POD_NAME", "")
    namespace = os.environ.get("POD_NAMESPACE", "")
    if not name and os.environ.get("KUBERNETES_SERVICE_HOST"):
        name = socket.gethostname()
    if name and not namespace:
        namespace = _read_text("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if not (name and namespace):
        return "", ""
    return f"{namespace}/{name}", os.environ.get("POD_UID", "")


class _Owner(HostIdentity):
    """Identity of this host process, recorded in every worker pod's labels and annotations."""

    def refresh(self) -> None:
        super().refresh()
        self.pod, self.pod_uid = _own_pod()
        #: Wall-clock time (UTC, whole seconds, rounded up) at or after this process started: a
        #: container of the owner pod that started later cannot be this process's (the orphan rule).
        self.started = datetime.datetime.fromtimestamp(math.ceil(time.time()), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    def annotations(self) -> dict[str, str]:
        values = (
            self.pod,
            self.pod_uid,
            self.host,
            self.boot,
            self.pidns,
            str(self.pid),
            self.start,
            self.started,
        )
        return {f"io.codemode.owner-{k}": v for k, v in zip(_OWNER_ANNOTATIONS, values, strict=True)}


_OWNER = _Owner()
# A forked child is another host process: it gets its own owner id.
os.register_at_fork(after_in_child=_OWNER.refresh)


# ----------------------------------------------------------------------------------- helpers


def _restarted_since(pod: Any, started: str) -> bool:
    """Whether no container of the live owner pod ``pod`` can still run the owner process, which
    started at or before ``started`` (its ``owner-started`` annotation). Each container (and each
    restartable init container: a sidecar; an init container that ran to completion before the
    others started is no owner) must provably have ended an instance at or after ``started``: it
    runs an instance that started later, or its current or last instance ended at or after it.
    Anything else may still be the owner: a container waiting without such an end (the kubelet
    has not reported the first start yet) or showing an end from before ``started`` (a previous
    instance's crash, not yet replaced by the running one in the status). Both times are the owner
    node's clock. No ``started`` (a pod made by an older host) or no statuses: False."""
    try:
        when = datetime.datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return False
    spec, status = getattr(pod, "spec", None), getattr(pod, "status", None)
    sidecars = {
        c.name
        for c in getattr(spec, "init_containers", None) or []
        if getattr(c, "restart_policy", None) == "Always"
    }
    statuses = [*(getattr(status, "container_statuses", None) or [])]
    statuses += [c for c in getattr(status, "init_container_statuses", None) or [] if c.name in sidecars]
    return bool(statuses) and all(_ended_since(container, when) for container in statuses)


def _ended_since(container: Any, when: datetime.datetime) -> bool:
    """Whether the container provably ran no instance from before ``when`` to now (its times are
    whole seconds, rounded down: an end in ``when``'s second counts, a start must be later)."""
    state = getattr(container, "state", None)
    running = getattr(state, "running", None)
    if running is not None:
        begun = getattr(running, "started_at", None)
        return isinstance(begun, datetime.datetime) and begun > when
    for ended in (
        getattr(state, "terminated", None),
        getattr(getattr(container, "last_state", None), "terminated", None),
    ):
        finished = getattr(ended, "finished_at", None)
        if isinstance(finished, datetime.datetime) and finished >= when:
            return True
    return False


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status", None)
    return code if isinstance(code, int) else None


def _api_error_text(exc: BaseException) -> str:
    """The API server's own message (from a Status body) when there is one."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes | str) and body:
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(body).get("message")
            if isinstance(message, str) and message:
                return f"{message} ({_status(exc)})"
    reason = getattr(exc, "reason", None)
    if isinstance(exc, k8s.ApiException):
        return f"{reason} ({exc.status})" if exc.status else str(reason)
    return f"{type(exc).__name__}: {exc}"


def _is_connection_error(exc: BaseException) -> bool:
    import urllib3.exceptions

    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def _maybe_sent(exc: BaseException) -> bool:
    """Might the request have reached the API server? (No if the connection was never made.)"""
    import urllib3.exceptions as u

    reason = exc.reason if isinstance(exc, u.MaxRetryError) else exc
    return not isinstance(reason, u.NewConnectionError | u.ConnectTimeoutError | u.SSLError)


def _status_message(text: str) -> str:
    """The ``message`` of the Status object in an API error's text (the text itself without one),
    at most 400 characters, for host logs."""
    start = text.find("{")
    if start >= 0:
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(text[start:].rstrip("'")).get("message")
            if isinstance(message, str) and message:
                text = message
    return text[:400]


def _close_reason(frame: Any) -> str:
    """A websocket close frame's status code and reason, for host logs."""
    data = getattr(frame, "data", b"") or b""
    if isinstance(data, str):
        data = data.encode()
    if len(data) < 2:
        return "no status"
    reason = data[2:200].decode("utf-8", "replace")
    return f"status {int.from_bytes(data[:2], 'big')}{': ' + reason if reason else ''}"


def _hangup(stream: Any) -> None:
    """Cut an attach stream now: wake any thread blocked on it and close its socket."""
    ws: Any = getattr(stream, "sock", None)
    _shut(ws)
    with contextlib.suppress(Exception):
        ws.shutdown()


def _shut(ws: Any) -> None:
    """Shut the websocket's socket down both ways: a thread blocked receiving or sending on it (a
    pool thread writing to a worker that stopped reading) wakes with an error. ``ws.abort()`` does
    this only while the client still counts itself connected; closing the descriptor wakes nobody."""
    with contextlib.suppress(Exception):
        ws.sock.shutdown(socket.SHUT_RDWR)


_system_notsent: tuple[float, int | None] = (-math.inf, None)


def _system_notsent_limit() -> int | None:
    """``net.ipv4.tcp_notsent_lowat`` (None: unlimited), read at most every 10 s."""
    global _system_notsent
    read_at, value = _system_notsent
    now = time.monotonic()
    if now - read_at > 10.0:
        try:
            with open("/proc/sys/net/ipv4/tcp_notsent_lowat", encoding="ascii") as fh:
                system = int(fh.read().strip())
            value = None if system >= 2**31 - 1 else system
        except (OSError, ValueError):
            value = 0  # unknown: treat as the smallest limit (no sends on the loop's thread)
        _system_notsent = (now, value)
    return value


def _notsent_limit(sock: Any) -> int | None:
    """The socket's TCP_NOTSENT_LOWAT (its own, else the system's): a send waits once this many bytes
    are not yet sent, whatever room the buffer has. None when unlimited."""
    own = sock.getsockopt(socket.IPPROTO_TCP, _TCP_NOTSENT_LOWAT)
    return int(own) if own > 0 else _system_notsent_limit()


def _outq(sock: Any, request: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0"))[0])


def _has_room(sock: Any, size: int) -> bool:
    """Whether ``sock`` takes ``size`` more bytes (with a wide margin for framing and the kernel's
    per-packet overhead) without the sender waiting: room in the send buffer, and below the
    not-sent limit when one is set."""
    need = 4 * size + _SEND_MARGIN
    try:
        capacity = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2  # the kernel doubles it
        if _outq(sock, termios.TIOCOUTQ) + need > capacity:
            return False
        limit = _notsent_limit(sock)
        return limit is None or _outq(sock, _SIOCOUTQNSD) + need <= limit
    except (OSError, ValueError, AttributeError, TypeError):
        return False


#: What an attach to a pod whose worker container does not run yet is refused with, and by whom:
#: the API server before the pod is scheduled (HTTP 400); the kubelet before it has admitted the
#: pod (404) and until the container runtime lists the container as running (the kubelet asks it
#: directly, not through the PLEG cache the pod's status comes from). Through the API server's
#: websocket translator (1.30+) the kubelet's answer arrives as a Status on the error channel
#: ("unable to upgrade connection: <the kubelet's text>"); without it, as the handshake's status
#: and body. ``{pod}``/``{namespace}`` are the pod's; nothing else is ever retried.
_NOT_RUNNING_YET = (
    "pod {pod} does not have a host assigned",
    "unable to upgrade connection: container " + CONTAINER_NAME + " not found in pod {pod}_{namespace}",
    "unable to upgrade connection: pod does not exist",
)


def not_running_yet(refusal: str, pod: str, namespace: str) -> bool:
    """Whether an attach refusal says only that the pod's worker container does not run yet.

    Args:
        refusal: the API server's message: an error-channel Status message, or the handshake
            failure's text (status line, headers and body).
        pod: the pod attached to.
        namespace: its namespace.

    Returns:
        True when the refusal is one of the exact "not running yet" answers for this pod (worth
        retrying while the pod is starting); False for anything else.
    """
    return any(form.format(pod=pod, namespace=namespace) in refusal for form in _NOT_RUNNING_YET)


class _Refused(Exception):
    """One attach attempt was refused before it reached the worker container (``text``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass
class _Attached:
    """A launched pod's attach stream, with what the worker sent before the sandbox took it over."""

    stream: Any
    early: list[bytes] = field(default_factory=list)


def _error_status(payload: bytes) -> tuple[str, str]:
    """``(status, message)`` of a Status sent on the error channel (``("", raw text)`` if it is
    not one)."""
    text = payload.decode("utf-8", "replace")
    with contextlib.suppress(ValueError, AttributeError):
        body = json.loads(text)
        status, message = body.get("status"), body.get("message")
        return (status if isinstance(status, str) else ""), (message if isinstance(message, str) else "")
    return "", text


def _default_attach() -> Callable[..., Any]:
    from kubernetes.stream import stream

    return cast("Callable[..., Any]", stream)


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


class KubernetesRuntime(BlockingRuntime[KubernetesSandbox]):
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
        #: The nodes suspected dead, which new pods avoid (``kubernetes_nodes``).
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
        """The exact pod ``spawn()`` submits (built by ``kubernetes_pod.worker_pod``).

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

    def _remove_orphans_blocking(self, proven_only: bool) -> int:
        api = self._client()
        pods: list[Any] = []
        token: str | None = None
        while True:
            try:
                page = api.list_namespaced_pod(
                    self.namespace,
                    label_selector=f"{ROLE_LABEL}=worker",
                    limit=500,
                    _continue=token,
                    _request_timeout=self.api_timeout,
                )
            except Exception as exc:
                raise self._unavailable(
                    f"cannot list worker pods in namespace {self.namespace}", exc
                ) from exc
            pods.extend(page.items or [])
            token = getattr(page.metadata, "var_continue", None)
            if not token:
                break
        owners: dict[tuple[str, str], bool | None] = {}
        removed = 0
        for pod in pods:
            meta = pod.metadata
            if not self._is_orphan(meta.labels or {}, meta.annotations or {}, owners, proven_only):
                continue
            log.warning(
                "kubernetes: deleting orphaned worker pod %s (owner %s, pod %s, pid %s on %s)",
                meta.name,
                (meta.labels or {}).get(OWNER_LABEL),
                (meta.annotations or {}).get("io.codemode.owner-pod"),
                (meta.annotations or {}).get("io.codemode.owner-pid"),
                (meta.annotations or {}).get("io.codemode.owner-host"),
            )
            if self._delete_blocking(meta.name) != "failed":
                removed += 1
        return removed

    def _is_orphan(
        self,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        owners: dict[tuple[str, str], bool | None],
        proven_only: bool = False,
    ) -> bool:
        """The orphan rule (docs/kubernetes.md): may ``start()`` delete a pod with these labels?
        ``proven_only`` (the periodic sweep): without the host-name rule, a start-time guess."""
        if labels.get(ROLE_LABEL) != "worker" or labels.get(OWNER_LABEL, "") == self.owner:
            return False
        if self.cleanup_orphans != "dead":
            return self.cleanup_orphans == "all"
        ann = {k: annotations.get(f"io.codemode.owner-{k}", "") for k in _OWNER_ANNOTATIONS}
        me = _OWNER
        if ann["boot"] and ann["boot"] == me.boot and ann["pidns"] and ann["pidns"] == me.pidns:
            # 1. Same kernel boot and pid namespace: alive iff its pid runs with the same start time.
            try:
                pid = int(ann["pid"])
            except ValueError:
                return False
            now = _process_start(pid)
            return not now or (bool(ann["start"]) and now != ann["start"])
        if ann["pod"]:
            # 2. The owner ran in a pod. Only a pod known by its uid (the downward API) can be
            # checked: a name from the host-name fallback may be shared (spec.hostname) or no pod's
            # (hostNetwork: the node's name). Our own pod in another pid namespace: our container
            # was restarted, the old process is gone. Another pod: dead iff it no longer exists.
            if not ann["pod-uid"]:
                return False
            if ann["pod"] == me.pod and ann["pod-uid"] == me.pod_uid:
                return True
            key = (ann["pod"], ann["pod-uid"])
            if key not in owners:
                owners[key] = self._owner_pod_gone(*key)
            if owners[key] is None:
                return False
            return owners[key] is True or _restarted_since(owners[key], ann["started"])
        # 3. Outside Kubernetes: the same host name in another boot or pid namespace was restarted
        # (a guess only this host's start may make: later it may be a live peer with that name).
        return not proven_only and bool(ann["host"]) and ann["host"] == me.host and not me.pod

    def _owner_pod_gone(self, ref: str, uid: str) -> bool | Any | None:
        """True: the owner pod is gone (404, another uid, ended); None: can't tell; else the live
        pod object (its containers tell whether the owner process still runs)."""
        namespace, _, name = ref.partition("/")
        try:
            pod = self._client().read_namespaced_pod(name, namespace, _request_timeout=self.api_timeout)
        except Exception as exc:
            if _status(exc) == 404:
                return True
            log.warning(
                "kubernetes: cannot tell whether owner pod %s is alive: %s", ref, _api_error_text(exc)
            )
            return None
        if uid and getattr(pod.metadata, "uid", None) != uid:
            return True  # another pod of the same name (e.g. a StatefulSet replacement)
        if getattr(pod.status, "phase", None) in ("Succeeded", "Failed"):
            return True
        return pod

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

    def _given_up(self, pod_name: str | None, handoff: LaunchHandoff) -> Exception:
        """A launch stops polling: its caller is gone (cancelled or out of time: the caller logs
        that) or the runtime is closing (``_closing``: one line here, no traceback anywhere)."""
        if handoff.abandoned:
            return SpawnFailed("spawn cancelled")
        return self._closing(pod_name)

    @staticmethod
    def _closing(pod_name: str | None) -> RuntimeClosing:
        what = f"worker pod {pod_name}: its start is given up" if pod_name else "no worker pod is started"
        log.warning("kubernetes: %s: the runtime is closing", what)
        return RuntimeClosing(f"kubernetes: {what}: the runtime is closing")

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

    def _launch_blocking(self, handoff: LaunchHandoff, supervised: bool = False) -> tuple[str, _Attached]:
        """create -> attach -> the worker's first answer, on another node when the first pod's node turns
        out silent (up to ``_NODE_ATTEMPTS`` pods, all within ``spawn_timeout``)."""
        deadline = time.monotonic() + self.spawn_timeout
        attempt = 0
        while True:
            attempt += 1
            avoided = self.quarantine.nodes()
            try:
                return self._launch_once(handoff, supervised, deadline, avoided)
            except _NodeSilent as exc:
                if self.quarantine.suspect(exc.node):
                    log.warning(
                        "kubernetes: node %s did not take on worker pod within %ss (%s): suspecting it"
                        " dead; new worker pods avoid it for %ss",
                        exc.node,
                        self.node_ack_timeout,
                        exc,
                        self.quarantine.seconds,
                    )
                if attempt >= _NODE_ATTEMPTS or time.monotonic() >= deadline:
                    raise
            except _Unplaceable as exc:
                # Only the suspected nodes could take it: a hint must never cost the spawn.
                log.warning("kubernetes: %s; trying the suspected node(s) %s again", exc, ", ".join(avoided))
                self.quarantine.forget(avoided)
                if attempt >= _NODE_ATTEMPTS or time.monotonic() >= deadline:
                    raise SpawnFailed(str(exc)) from exc

    def _launch_once(
        self, handoff: LaunchHandoff, supervised: bool, deadline: float, avoided: list[str]
    ) -> tuple[str, _Attached]:
        """One pod: create -> attach (as soon as the container runs) -> the worker's first answer;
        deletes the pod again on any failure."""
        api = self._client()
        pod_name = f"codemode-worker-{uuid.uuid4().hex[:16]}"
        t0 = time.monotonic()
        phases: dict[str, float] = {}
        created = False
        self._created_any = True
        try:
            try:
                self._create_blocking(api, self.pod_manifest(pod_name, supervised, avoided), deadline)
                created = True
                phases["created"] = time.monotonic() - t0
            except k8s.ApiException as exc:
                created = not (exc.status and 400 <= exc.status < 500)  # 4xx: certainly not created
                raise
            except Exception as exc:
                created = _maybe_sent(exc)  # a timeout or lost response: the pod may exist
                raise
            greeting = PING if supervised else PROBE
            attached = self._start_blocking(
                api, pod_name, deadline, handoff, greeting, t0, phases, bool(avoided)
            )
            self.last_phases = phases
            log.debug(
                "kubernetes: worker pod %s %s (%s, %d attach attempts)",
                pod_name,
                " ".join(f"{k} {v * 1000:.0f}ms" for k, v in phases.items()),
                getattr(attached.stream, "subprotocol", None) or "?",
                self.last_attach_attempts,
            )
        except Exception as exc:
            if created:
                self._delete_blocking(pod_name)
            raise self._launch_error(pod_name, exc) from exc
        with handoff.lock:
            if not handoff.abandoned:
                handoff.delivered = True
                return pod_name, attached
        # The spawning coroutine was cancelled meanwhile: nobody will use this pod.
        self._discard_blocking(pod_name, attached)
        raise SpawnFailed("spawn cancelled")

    def _open_attach(self, api: Any, pod_name: str, *, stdin: bool, upgrade_within: float) -> Any:
        """Attach to the worker container: stdin, stdout and stderr (the worker's channel), or its
        stderr only (``stdin=False``: the node check, which reads the error channel alone). The
        websocket's connect and upgrade take at most ``upgrade_within`` seconds each
        (``bounded_upgrade``: the client sets no bound of its own, so an API server or proxy that
        stalls the upgrade would hold this thread for ever)."""
        attach = self._attach or _default_attach()
        with bounded_upgrade(upgrade_within):
            return attach(
                self._attach_method(api),
                pod_name,
                self.namespace,
                container=CONTAINER_NAME,
                stdin=stdin,
                stdout=stdin,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )

    @staticmethod
    def _attach_method(api: Any) -> Callable[..., Any]:
        """``connect_get_namespaced_pod_attach`` on a CoreV1Api with an ApiClient of its own.

        ``kubernetes.stream.stream`` swaps ``call_api`` on the ApiClient behind the method for the
        duration of the call: on a shared client, REST calls that other threads make meanwhile
        would be sent as websocket requests. A fresh client shares only the configuration.
        """
        method: Callable[..., Any] = api.connect_get_namespaced_pod_attach
        client = getattr(getattr(method, "__self__", None), "api_client", None)
        if isinstance(client, k8s.ApiClient):
            return cast(
                "Callable[..., Any]",
                k8s.CoreV1Api(k8s.ApiClient(client.configuration)).connect_get_namespaced_pod_attach,
            )
        return method

    def _start_blocking(
        self,
        api: Any,
        pod_name: str,
        deadline: float,
        handoff: LaunchHandoff,
        greeting: bytes,
        t0: float,
        phases: dict[str, float],
        avoiding: bool = False,
    ) -> _Attached:
        """Read the pod and attach to it as soon as its container runs: 25 ms apart, growing to
        100 ms (``attach_early``: from the moment it is scheduled, else once the API reports it
        Running).

        The pod's status reaches the API only after the kubelet's next relist (up to a second
        after the container started), but the kubelet serves an attach as soon as the container
        runtime runs the container. So an attempt is made on every read of a scheduled, starting
        pod; a refusal that says exactly "not running yet" (``not_running_yet``) is retried on
        the next read, anything else ends the spawn. A refused attempt never reached the
        container (the kubelet found none to attach to), so the ``stdinOnce`` stdin is untouched
        and no byte of the greeting was delivered. Records when the pod was first seen scheduled
        and running in ``phases``. A pod the scheduler reports Unschedulable for
        ``unschedulable_grace`` seconds is given up (``CapacityExhausted``; at once,
        ``_Unplaceable``, when it is ``avoiding`` suspected nodes). A pod bound to a node whose
        kubelet has not acknowledged it within ``node_ack_timeout`` has its node checked, and again
        every ``node_ack_timeout`` (``_check_silent_node``): given up (``_NodeSilent``) only when
        the API server cannot reach that kubelet; a kubelet that answers is only slow, and the pod
        is waited for (up to ``spawn_timeout``).
        """
        delay = 0.025
        detail = "not read yet"
        unschedulable_since: float | None = None
        bound_since: float | None = None
        check_at: float | None = None  # when the unacknowledged pod's node is checked (next)
        node_answered = False  # a check found its kubelet reachable
        self.last_attach_attempts = 0
        early = self.attach_early
        while True:
            if handoff.abandoned or self._closed:
                if unschedulable_since is not None:
                    self._log_unschedulable(pod_name, detail)
                raise self._given_up(pod_name, handoff)
            try:
                pod = api.read_namespaced_pod(pod_name, self.namespace, _request_timeout=self.api_timeout)
            except Exception as exc:
                if _status(exc) == 404:
                    raise SpawnFailed(f"kubernetes: worker pod {pod_name} vanished while starting") from exc
                if not (_status(exc) in _RETRY_STATUSES or _is_connection_error(exc)):
                    raise
                detail = f"API error: {_api_error_text(exc)}"
            else:
                now = time.monotonic()
                if "scheduled" not in phases and scheduled(pod):
                    phases["scheduled"] = now - t0
                node = getattr(pod.spec, "node_name", None)
                waiting_for_node = bool(node) and not acknowledged(pod)
                if node and waiting_for_node:
                    bound_since = bound_since or now
                    check_at = check_at or bound_since + self.node_ack_timeout
                    if now >= check_at:
                        check_at = self._check_silent_node(pod_name, node) + self.node_ack_timeout
                        node_answered = True
                where, detail = progress(pod)
                if waiting_for_node and node_answered:
                    detail = (
                        f"bound to node {node}, whose kubelet (not unreachable) has not taken it on; {detail}"
                    )
                if where == "running":
                    phases.setdefault("running", now - t0)
                if where == "ended":
                    raise SpawnFailed(f"kubernetes: worker pod {pod_name} ended before attach: {detail}")
                if where == "no-image":
                    raise RuntimeUnavailable(f"kubernetes: worker image {self.image!r} unavailable: {detail}")
                if where == "unschedulable":
                    if avoiding:
                        raise _Unplaceable(
                            f"kubernetes: worker pod {pod_name} kept off the suspected nodes is"
                            f" unschedulable: {detail}"
                        )
                    unschedulable_since = unschedulable_since or now
                    if now - unschedulable_since >= self.unschedulable_grace:
                        self._log_unschedulable(pod_name, detail)
                        raise CapacityExhausted(f"kubernetes: worker pod {pod_name} unschedulable: {detail}")
                else:
                    unschedulable_since = None
                if where == "running" or (early and where == "waiting" and "scheduled" in phases):
                    try:
                        attached = self._attach_blocking(api, pod_name, greeting, handoff)
                    except _Refused as refused:
                        known = self._known_refusal(pod_name, refused.text, where == "running")
                        early = early and known
                        detail = f"attach refused: {refused.text}"
                    else:
                        phases["attached"] = time.monotonic() - t0
                        return attached
            left = deadline - time.monotonic()
            if left <= 0:
                if unschedulable_since is not None:
                    self._log_unschedulable(pod_name, detail)
                    raise CapacityExhausted(f"kubernetes: worker pod {pod_name} unschedulable: {detail}")
                raise SpawnFailed(
                    f"kubernetes: worker pod {pod_name} not running after {self.spawn_timeout}s: {detail}"
                )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.1)

    def _check_silent_node(self, pod_name: str, node: str) -> float:
        """The node check (``_kubelet_unreachable_blocking``) for a pod whose node's kubelet has
        not acknowledged it within ``node_ack_timeout``.

        A loaded node's kubelet can be slow to write ``status.startTime`` (its status writes are
        rate limited, its pod workers share the node's CPU), so the timer alone proves nothing:
        only the API server's failure to dial the kubelet does. Anything else (the kubelet's own
        refusal, such as "container worker not found", an attach that holds, or no word within the
        check's wait) suspects nothing.

        Raises:
            _NodeSilent: the API server cannot reach the node's kubelet.

        Returns:
            When the check ended (monotonic clock): the next one is due ``node_ack_timeout`` later.
        """
        unreachable = self._kubelet_unreachable_blocking(pod_name)
        if unreachable is not None:
            raise _NodeSilent(
                node,
                f"kubernetes: worker pod {pod_name} bound to node {node}, whose kubelet did not"
                f" acknowledge it within {self.node_ack_timeout}s and cannot be reached ({unreachable})",
            )
        log.debug(
            "kubernetes: node %s has not taken on worker pod %s within %ss, but the API server does not"
            " report its kubelet unreachable: waiting (the node is not suspected)",
            node,
            pod_name,
            self.node_ack_timeout,
        )
        return time.monotonic()

    def _known_refusal(self, pod_name: str, text: str, running: bool) -> bool:
        """Whether a refused attach says exactly "not running yet" (then retried). Any other
        refusal of a pod the API reports running ends the spawn; of a starting pod, it makes
        the launch attach only once the API reports it running (as without ``attach_early``)."""
        if not_running_yet(text, pod_name, self.namespace):
            return True
        if running:
            raise SpawnFailed(f"kubernetes: attaching to worker pod {pod_name} was refused: {text}")
        log.warning(
            "kubernetes: attach to starting worker pod %s refused (%s); attaching once it runs",
            pod_name,
            text,
        )
        return False

    def _attach_blocking(self, api: Any, pod_name: str, greeting: bytes, handoff: LaunchHandoff) -> _Attached:
        """One attach attempt: open the stream, send ``greeting`` and read until the worker's first
        stdout bytes (which prove the stream reaches it), for at most ``probe_timeout``.

        Raises:
            _Refused: the API server or kubelet refused the attach before it reached the container
                (the websocket handshake failed, or a Status came on the error channel first).
            SpawnFailed: the stream ended, or nothing came in time, after the attach may have
                reached the container (its stdin is then closed: ``stdinOnce``).
        """
        self.last_attach_attempts += 1
        try:
            stream = self._open_attach(api, pod_name, stdin=True, upgrade_within=self.api_timeout)
        except k8s.ApiException as exc:
            if upgrade_timed_out(exc):
                raise SpawnFailed(
                    f"kubernetes: attaching to worker pod {pod_name}: the API server did not complete"
                    f" the websocket upgrade within {self.api_timeout}s"
                ) from None
            if exc.status == 0 and "Handshake status 403" not in str(exc.reason):
                raise _Refused(str(exc.reason)) from None  # the handshake's status line and body
            raise
        handed_over = False
        try:
            ws = getattr(stream, "sock", None)
            if ws is None:
                raise SpawnFailed(f"kubernetes: attaching to worker pod {pod_name} gave no stream")
            attached = _Attached(stream)
            stream.write_stdin(greeting)
            answer_by = time.monotonic() + self.probe_timeout
            while not self._answered(ws, attached, answer_by, handoff):
                pass
            handed_over = True
            return attached
        finally:
            if not handed_over:
                _hangup(stream)

    def _answered(self, ws: Any, attached: _Attached, answer_by: float, handoff: LaunchHandoff) -> bool:
        """Read one message of a fresh attach stream (waiting at most until ``answer_by``; a
        cancelled spawn is noticed within 100 ms): True once it carried stdout bytes."""
        while True:
            if handoff.abandoned or self._closed:
                raise self._given_up(None, handoff)
            left = answer_by - time.monotonic()
            if left <= 0:
                raise SpawnFailed(f"kubernetes: worker did not answer within {self.probe_timeout}s")
            sock = ws.sock
            pending = getattr(sock, "pending", None)
            if (pending is not None and pending()) or select.select([sock], [], [], min(left, 0.1))[0]:
                break
        ws.sock.settimeout(max(left, 0.1))
        try:
            opcode, frame = ws.recv_data_frame(True)
        finally:
            with contextlib.suppress(OSError):
                ws.sock.settimeout(None)
        if opcode == _OP_CLOSE:
            raise SpawnFailed("kubernetes: the attach stream ended before the worker answered")
        if opcode not in (_OP_BINARY, _OP_TEXT):
            return False
        data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
        if len(data) < 2:
            return False  # a channel's opening message
        channel, payload = data[0], data[1:]
        if channel == _ERROR:
            status, message = _error_status(payload)
            if status == "Success":  # the attach reached the container, which has ended
                raise SpawnFailed("kubernetes: the worker ended before it answered")
            raise _Refused(message)
        if channel == _CLOSE:
            raise SpawnFailed("kubernetes: the attach stream ended before the worker answered")
        attached.early.append(data)
        return channel == _STDOUT

    def _log_unschedulable(self, pod_name: str, detail: str) -> None:
        log.error(
            "kubernetes: no node has room for worker pod %s in namespace %s (%s). Each worker reserves"
            " cpu %s and memory %s: add nodes, lower the reservation (the runtime's cpu_request;"
            " --kubernetes-memory / CODEMODE_KUBERNETES_MEMORY) or lower max_concurrent_executions"
            " + pool. Clients get 'resource limit exceeded'.",
            pod_name,
            self.namespace,
            detail,
            self.cpu_request,
            self.memory,
        )

    def _create_blocking(self, api: Any, pod: k8s.V1Pod, deadline: float) -> None:
        """Create the pod; a 409 for a race on the ResourceQuota's usage (not a name clash: the name
        is random) is retried up to ``CREATE_CONFLICT_RETRIES`` times before the deadline."""
        for attempt in range(CREATE_CONFLICT_RETRIES + 1):
            try:
                api.create_namespaced_pod(self.namespace, pod, _request_timeout=self.api_timeout)
                return
            except k8s.ApiException as exc:
                pause = random.uniform(0.02, 0.08)
                quota_race = exc.status == 409 and "resourcequotas" in _api_error_text(exc)
                if (
                    not quota_race
                    or attempt == CREATE_CONFLICT_RETRIES
                    or time.monotonic() + pause > deadline
                ):
                    raise
                time.sleep(pause)

    def _launch_error(self, pod_name: str, exc: Exception) -> Exception:
        if isinstance(exc, RuntimeUnavailable | SpawnFailed):
            return exc
        status = _status(exc)
        text = _api_error_text(exc)
        if _is_connection_error(exc) or status in (401, 404, 400, 422):
            # unreachable, credentials, no such namespace, or the cluster rejects the pod spec
            return self._unavailable(f"cannot create worker pod in namespace {self.namespace}", exc)
        if status == 403:
            if "exceeded quota" in text:
                log.error(
                    "kubernetes: the ResourceQuota of namespace %s refused worker pod %s: %s. Raise the"
                    " quota (k8s/base/resourcequota.yaml) or lower max_concurrent_executions + pool or the"
                    " per-worker resources. Clients get 'resource limit exceeded'.",
                    self.namespace,
                    pod_name,
                    text,
                )
                return CapacityExhausted(f"kubernetes: worker pod quota exhausted: {text}")
            # RBAC, Pod Security admission, RuntimeClass admission
            return self._unavailable(f"worker pod refused in namespace {self.namespace}", exc)
        if status == 0 and "403" in text:  # websocket handshake refused: no pods/attach permission
            return self._unavailable(f"cannot attach to worker pod {pod_name}", exc)
        return SpawnFailed(f"kubernetes: cannot start worker pod {pod_name}: {text}")

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
